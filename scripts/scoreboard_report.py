#!/usr/bin/env python3
"""Report of scripts/scoreboard.sh: per (shape, dtype) and flashcore kernel family, the medians
of our and cuDNN's times (torch's cudnn backend), and the median of the per-round ratios
cuDNN's time / ours, which is our TFLOP/s over cuDNN's (above 1: ours faster), with each
round's (ab_report.py's table).

Usage: scoreboard_report.py OUT_DIR (the ours_ROUND_FILTER.json and torch_ROUND_FILTER.json
files of scoreboard.sh)
"""
import glob
import json
import os
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
