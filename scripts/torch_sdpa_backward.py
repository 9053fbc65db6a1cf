#!/usr/bin/env python3
"""Times the backward pass of torch.nn.functional.scaled_dot_product_attention (flash,
efficient, cudnn backends) on the backward rows of examples/bench.rs (BACKWARD_ROWS), bf16,
with triton.testing.do_bench (median; L2 flushed between runs): the gradients of q, k and v for
a given output gradient, the forward pass done once outside the timing.

Usage: torch_sdpa_backward.py   (prints one line per row and backend)
"""
import os

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
# (name, batch, heads_q, heads_kv, seq, head_dim, causal), as examples/bench.rs BACKWARD_ROWS.
ROWS = [
    ("4x16x2048x128", 4, 16, 16, 2048, 128, False),
    ("4x16x2048x128 causal", 4, 16, 16, 2048, 128, True),
    ("4x32(kv8)x2048x128 causal", 4, 32, 8, 2048, 128, True),
    ("8x16x2048x64 causal", 8, 16, 16, 2048, 64, True),
    ("4x16x2048x256 causal", 4, 16, 16, 2048, 256, True),
]
WARMUP_MS = float(os.environ.get("FLASHCORE_BENCH_WARM_MS", "25"))


def main():
    for name, b, hq, hk, s, d, causal in ROWS:
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hk, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, hk, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
        flops = 2.5 * 4 * b * hq * s * s * d * (0.5 if causal else 1.0)
        for backend, which in BACKENDS.items():
            try:
                with sdpa_kernel([which]):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                         enable_gqa=hq != hk)
                    grad = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    grad()
                    us = triton.testing.do_bench(grad, warmup=WARMUP_MS, rep=100,
                                                 return_mode="median") * 1e3
                print(f"torch backward {name} bf16 {backend}: {us:.1f} us, "
                      f"{flops / (us * 1e-6) / 1e12:.1f} TFLOP/s")
            except Exception as e:  # a backend that cannot run this row says why
                print(f"torch backward {name} bf16 {backend}: unavailable ({str(e)[:120]})")


if __name__ == "__main__":
    main()
