#!/usr/bin/env python3
"""Report of scripts/ab_bench.sh: per (shape, dtype) and flashcore kernel family, the medians of
the rounds' median times of builds A and B, and the median of the per-round ratios B / A (below
1: B faster), with each round's ratio. scoreboard_report.py prints its table with `table`.

Usage: ab_report.py OUT_DIR (the ab_{a,b}_ROUND_FILTER.json files of ab_bench.sh)
"""
import glob
import json
import os
import statistics
import sys


def records(out, prefix):
    """(side, round, record) of every `prefix`_SIDE_ROUND_FILTER.json file under `out`."""
    for path in glob.glob(os.path.join(out, f"{prefix}*_*_*.json")):
        side, rnd, _ = os.path.basename(path)[len(prefix): -len(".json")].split("_", 2)
        for r in json.load(open(path))["records"]:
            yield side, int(rnd), r


def ours(r):
    """The kernel family of a flashcore GPU record with a time, else None."""
    gpu = r["impl"].startswith("flashcore/") and r["impl"] != "flashcore/cpu"
    return r["impl"].split("/", 1)[1] if gpu and "median_us" in r else None


def table(times, first, second):
    """Prints, per key (shape, dtype, kernel) of `times` (key -> round -> side -> median us, the
    sides `first` and `second` being column titles too), both sides' medians, the median of the
    per-round ratios second / first and each round's; rounds missing a side are left out."""
    print(f"| shape | dtype | kernel | {first} (us) | {second} (us) | {second} / {first} (time) "
          "| per round |")
    print("|---|---|---|---:|---:|---:|---|")
    for (shape, dtype, kernel), rounds in sorted(times.items()):
        both = [rounds[r] for r in sorted(rounds) if len(rounds[r]) == 2]
        if not both:
            continue
        ratios = [t[second] / t[first] for t in both]
        a = statistics.median(t[first] for t in both)
        b = statistics.median(t[second] for t in both)
        each = " / ".join(f"{x:.3f}" for x in ratios)
        print(f"| {shape} | {dtype} | {kernel} | {a:.1f} | {b:.1f} | "
              f"{statistics.median(ratios):.3f} | {each} |")


if __name__ == "__main__":
    times = {}
    for side, rnd, r in records(sys.argv[1], "ab_"):
        kernel = ours(r)
        if kernel is not None:
            times.setdefault((r["shape"], r["dtype"], kernel), {}).setdefault(rnd, {})[side] = \
                r["median_us"]
    table(times, "a", "b")
