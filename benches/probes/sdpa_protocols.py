#!/usr/bin/env python3
"""Times torch's cuDNN SDPA backend on one shape under both timing protocols of the bench
comparison: triton's do_bench (the L2 cleared by a 256 MiB write before each call, median), as
torch_sdpa.py times torch, and back-to-back calls with CUDA events around each (10 warm-up
calls, then ITERS timed, one input set), as the bench CLI and the sweep time ours. Prints the
median, p10 and p90 of each, and the back-to-back series.

Usage: sdpa_protocols.py B H HK S D CAUSAL(0/1) [ITERS]
"""
import sys

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel


def stats(us):
    s = sorted(us)
    return f"median {s[len(s) // 2]:.1f} p10 {s[len(s) // 10]:.1f} p90 {s[len(s) * 9 // 10]:.1f}"


def main():
    b, h, hk, s, d, causal = (int(x) for x in sys.argv[1:7])
    iters = int(sys.argv[7]) if len(sys.argv) > 7 else 100
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hk, s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    name = f"{b}x{h}kv{hk}x{s}x{d}{'-causal' if causal else ''} bf16 cudnn"
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        def fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                                  enable_gqa=hk != h)
        fn()
        flushed = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="all")
        print(f"{name} do_bench (flushed): {stats([t * 1e3 for t in flushed])}", flush=True)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        for _ in range(10):
            fn()
        series = []
        for _ in range(iters):
            start.record()
            fn()
            end.record()
            end.synchronize()
            series.append(start.elapsed_time(end) * 1e3)
        print(f"{name} back to back: {stats(series)}", flush=True)
        print("series us: " + " ".join(f"{t:.0f}" for t in series), flush=True)


if __name__ == "__main__":
    main()
