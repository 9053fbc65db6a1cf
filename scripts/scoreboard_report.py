#!/usr/bin/env python3
"""Report of scripts/scoreboard.sh: per (shape, dtype) and flashcore kernel family, its TFLOP/s
over torch's cudnn backend (above 1: ours faster), the median of the per-round ratios and each
round's, with the medians of both times.

Usage: scoreboard_report.py OUT_DIR (the ours_ROUND_FILTER.json and torch_ROUND_FILTER.json
files of scoreboard.sh)
"""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1]
ours = {}  # (shape, dtype, kernel) -> round -> record
cudnn = {}  # (shape, dtype) -> round -> record
device = ""
for path in glob.glob(os.path.join(out, "*_*_*.json")):
    side, rnd, _ = os.path.basename(path)[: -len(".json")].split("_", 2)
    if side not in ("ours", "torch"):
        continue
    doc = json.load(open(path))
    for r in doc["records"]:
        if "tflops" not in r:
            continue
        if side == "ours" and r["impl"].startswith("flashcore/") and r["impl"] != "flashcore/cpu":
            key = (r["shape"], r["dtype"], r["impl"].split("/", 1)[1])
            ours.setdefault(key, {})[int(rnd)] = r
        elif side == "torch" and r["impl"] == "torch/cudnn":
            cudnn.setdefault((r["shape"], r["dtype"]), {})[int(rnd)] = r
    if side == "torch":
        device = f"{doc['device']}, driver {doc['driver']}, torch {doc['torch']}, cuDNN {doc['cudnn']}"

print(device + "\n")
print("| shape | dtype | kernel | ours (us) | cuDNN (us) | ours / cuDNN | per round |")
print("|---|---|---|---:|---:|---:|---|")
for (shape, dtype, kernel), rounds in sorted(ours.items()):
    theirs = cudnn.get((shape, dtype), {})
    both = [r for r in sorted(rounds) if r in theirs]
    if not both:
        continue
    ratios = [rounds[r]["tflops"] / theirs[r]["tflops"] for r in both]
    mine = statistics.median(rounds[r]["median_us"] for r in both)
    ref = statistics.median(theirs[r]["median_us"] for r in both)
    each = " / ".join(f"{x:.3f}" for x in ratios)
    print(f"| {shape} | {dtype} | {kernel} | {mine:.1f} | {ref:.1f} | "
          f"{statistics.median(ratios):.3f} | {each} |")
