#!/usr/bin/env python3
"""Report of scripts/scoreboard.sh: per (shape, dtype) and flashcore kernel family, the medians
of our and cuDNN's times (torch's cudnn backend), and the median of the per-round ratios
cuDNN's time / ours, which is our TFLOP/s over cuDNN's (above 1: ours faster), with each
round's (ab_report.py's table). Then, where the scoreboard ran them, the bench's paged decode
rows: per row Auto's median time over the rounds and its fraction of the memory roofline
(ROOFLINE_GBPS, default 4293).

Usage: scoreboard_report.py OUT_DIR (the ours_ROUND_FILTER.json, torch_ROUND_FILTER.json and
paged_ROUND.json files of scoreboard.sh)
"""
import glob
import json
import os
import statistics
import sys

from ab_report import ours, records, table

out = sys.argv[1]
times = {}  # (shape, dtype, kernel) -> round -> side -> median us
cudnn = {}  # (shape, dtype) -> round -> median us
for side, rnd, r in records(out, ""):
    kernel = ours(r) if side == "ours" else None
    if kernel is not None:
        times.setdefault((r["shape"], r["dtype"], kernel), {}).setdefault(rnd, {})["ours"] = \
            r["median_us"]
    elif side == "torch" and r["impl"] == "torch/cudnn" and "median_us" in r:
        cudnn.setdefault((r["shape"], r["dtype"]), {})[rnd] = r["median_us"]
for (shape, dtype, _), rounds in times.items():
    for rnd, sides in rounds.items():
        if rnd in cudnn.get((shape, dtype), {}):
            sides["cuDNN"] = cudnn[(shape, dtype)][rnd]
torch_files = glob.glob(os.path.join(out, "torch_*_*.json"))
if torch_files:
    doc = json.load(open(torch_files[0]))
    print(f"{doc['device']}, driver {doc['driver']}, torch {doc['torch']}, cuDNN {doc['cudnn']}\n")
table(times, "ours", "cuDNN")

# The paged decode rows (scoreboard.sh's PAGED_ROWS), per row the median over rounds of Auto's
# time and its fraction of the memory roofline: K and V read once at ROOFLINE_GBPS.
roofline = float(os.environ.get("ROOFLINE_GBPS", "4293"))
paged = {}  # (batch, keys, page size, order) -> [(us, GB/s, kernel)]
for path in sorted(glob.glob(os.path.join(out, "paged_*.json"))):
    for row in json.load(open(path)).get("paged_decode") or []:
        b, n, size, us, _, gbps, stride = row["row"][:7]
        order = "in order" if stride == 1.0 else "shuffled"
        paged.setdefault((int(b), int(n), int(size), order), []).append((us, gbps, row["kernel"]))
if paged:
    print(f"\n| paged decode (bf16, GQA 32:8, d 128) | pages | Auto (us) | kernel | "
          f"roofline at {roofline:.0f} GB/s | rounds |")
    print("|---|---:|---:|---|---:|---:|")
    for (b, n, size, order), runs in sorted(paged.items()):
        us = statistics.median(u for u, _, _ in runs)
        gbps = statistics.median(g for _, g, _ in runs)
        kernels = "/".join(sorted({k for _, _, k in runs}))
        print(f"| {b} x {n} keys | {size} ({order}) | {us:.1f} | {kernels} | "
              f"{100 * gbps / roofline:.0f}% | {len(runs)} |")
