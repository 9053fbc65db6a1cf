#!/usr/bin/env python3
"""Merges flashcore's bench JSON and torch's into one markdown table with ratios and roofline.

Usage: merge_bench.py SHAPES_JSON OURS_JSON TORCH_JSON
wmma / cutlass = WMMA TFLOP/s over CUTLASS's (> 1: WMMA faster).
Ratio = our best backend's TFLOP/s / the best torch backend's TFLOP/s (> 1: we are faster).
Roofline = max(flops / bf16 matmul peak, bytes / copy bandwidth), both measured in the same run.
"""
import json
import sys

shapes = {s["name"]: s for s in json.load(open(sys.argv[1]))}
ours = json.load(open(sys.argv[2]))
torch = json.load(open(sys.argv[3]))
ceil = torch["ceilings"]
peak, bw = ceil["bf16_matmul_tflops"], ceil["copy_gbps"]

by = {}
for r in ours["records"] + torch["records"]:
    by.setdefault((r["shape"], r["dtype"]), {})[r["impl"]] = r

print(f"Device {torch['device']}, driver {torch['driver']}, torch {torch['torch']}, "
      f"cuDNN {torch['cudnn']}. Ceilings measured in the same run: bf16 matmul "
      f"{peak:.0f} TFLOP/s, copy {bw:.0f} GB/s.\n")
print("| shape (BxHxSxD) | dtype | cutlass-sm80 µs | TFLOP/s | wmma µs | TFLOP/s | wmma / cutlass "
      "| % roofline (best ours) | torch flash | torch efficient | torch cudnn | best ours / best torch |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def tf(r):
    return f"{r['tflops']:.1f}" if r and "tflops" in r else "n/a"


def us(r):
    return f"{r['median_us']:.1f}" if r else "n/a"


for (name, dtype), impls in by.items():
    cut, wm = impls.get("flashcore/cutlass-sm80"), impls.get("flashcore/wmma")
    ours_best = [r for r in (cut, wm) if r]
    if not ours_best:
        continue
    best_ours = max(ours_best, key=lambda r: r["tflops"])
    s = shapes[name]
    floor_us = max(s["flops"] / (peak * 1e12), s["bytes"] / (bw * 1e9)) * 1e6
    t = [impls.get(f"torch/{b}") for b in ("flash", "efficient", "cudnn")]
    best = max((x["tflops"] for x in t if x and "tflops" in x), default=None)
    ratio = f"{best_ours['tflops'] / best:.2f}" if best else "n/a"
    race = f"{wm['tflops'] / cut['tflops']:.2f}" if cut and wm else "n/a"
    print(f"| {name} | {dtype} | {us(cut)} | {tf(cut)} | {us(wm)} | {tf(wm)} | {race} | "
          f"{100 * floor_us / best_ours['median_us']:.0f}% | {tf(t[0])} | {tf(t[1])} | {tf(t[2])} | {ratio} |")
