#!/usr/bin/env python3
"""Report of scripts/ab_bench.sh: per (shape, dtype) and flashcore kernel family, the medians of
the rounds' median times of builds A and B, and the median of the per-round ratios B / A (below
1: B faster), with each round's ratio.

Usage: ab_report.py OUT_DIR (the ab_{a,b}_ROUND_FILTER.json files of ab_bench.sh)
"""
import glob
import json
import os
import statistics
import sys

times = {}  # (shape, dtype, impl) -> round -> side -> median us
for path in glob.glob(os.path.join(sys.argv[1], "ab_*_*_*.json")):
    _, side, rnd, _ = os.path.basename(path)[: -len(".json")].split("_", 3)
    for r in json.load(open(path))["records"]:
        if r["impl"].startswith("flashcore/") and r["impl"] != "flashcore/cpu" and "median_us" in r:
            key = (r["shape"], r["dtype"], r["impl"].split("/", 1)[1])
            times.setdefault(key, {}).setdefault(int(rnd), {})[side] = r["median_us"]

print("| shape | dtype | kernel | A (us) | B (us) | B / A | per round |")
print("|---|---|---|---:|---:|---:|---|")
for (shape, dtype, impl), rounds in sorted(times.items()):
    both = [rounds[r] for r in sorted(rounds) if len(rounds[r]) == 2]
    if not both:
        continue
    ratios = [t["b"] / t["a"] for t in both]
    a = statistics.median(t["a"] for t in both)
    b = statistics.median(t["b"] for t in both)
    each = " / ".join(f"{x:.3f}" for x in ratios)
    print(f"| {shape} | {dtype} | {impl} | {a:.1f} | {b:.1f} | {statistics.median(ratios):.3f} | {each} |")
