#!/usr/bin/env python3
"""Merges flashcore's bench JSON and torch's into one markdown table with ratios and roofline.

Usage: merge_bench.py SHAPES_JSON OURS_JSON TORCH_JSON
One µs and TFLOP/s column pair per flashcore kernel family found in OURS_JSON (in its order).
K / cudnn = that kernel's TFLOP/s over torch's cudnn backend (> 1: ours faster), for the newest
family (last in OURS_JSON). Best / torch = our best family's TFLOP/s over the best torch backend's.
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
kernels = []
for r in ours["records"] + torch["records"]:
    by.setdefault((r["shape"], r["dtype"]), {})[r["impl"]] = r
    if r["impl"].startswith("flashcore/") and r["impl"] != "flashcore/cpu" and r["impl"] not in kernels:
        kernels.append(r["impl"])
names = [k.split("/", 1)[1] for k in kernels]
newest = names[-1] if names else "n/a"

print(f"Device {torch['device']}, driver {torch['driver']}, torch {torch['torch']}, "
      f"cuDNN {torch['cudnn']}. Ceilings measured in the same run: bf16 matmul "
      f"{peak:.0f} TFLOP/s, copy {bw:.0f} GB/s.\n")
head = "".join(f" {n} µs | TFLOP/s |" for n in names)
print(f"| shape (BxHxSxD) | dtype |{head} torch flash | torch efficient | torch cudnn "
      f"| {newest} / cudnn | % roofline (best ours) | best ours / best torch |")
print("|---|---|" + "---:|---:|" * len(names) + "---:|---:|---:|---:|---:|---:|")


def tf(r):
    return f"{r['tflops']:.1f}" if r and "tflops" in r else "n/a"


def us(r):
    return f"{r['median_us']:.1f}" if r and "median_us" in r else "n/a"


for (name, dtype), impls in by.items():
    mine = [impls.get(k) for k in kernels]
    ran = [r for r in mine if r and "tflops" in r]
    if not ran or name not in shapes:  # a shape torch was not given (a subset of the list)
        continue
    best_ours = max(ran, key=lambda r: r["tflops"])
    s = shapes[name]
    floor_us = max(s["flops"] / (peak * 1e12), s["bytes"] / (bw * 1e9)) * 1e6
    t = [impls.get(f"torch/{b}") for b in ("flash", "efficient", "cudnn")]
    best = max((x["tflops"] for x in t if x and "tflops" in x), default=None)
    ratio = f"{best_ours['tflops'] / best:.2f}" if best else "n/a"
    cudnn = t[2] if t[2] and "tflops" in t[2] else None
    last = mine[-1] if mine and mine[-1] and "tflops" in mine[-1] else None
    vs_cudnn = f"{last['tflops'] / cudnn['tflops']:.2f}" if last and cudnn else "n/a"
    cols = "".join(f" {us(r)} | {tf(r)} |" for r in mine)
    print(f"| {name} | {dtype} |{cols} {tf(t[0])} | {tf(t[1])} | {tf(t[2])} | {vs_cudnn} | "
          f"{100 * floor_us / best_ours['median_us']:.0f}% | {ratio} |")
