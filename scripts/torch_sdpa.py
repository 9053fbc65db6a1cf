#!/usr/bin/env python3
"""Times torch.nn.functional.scaled_dot_product_attention (flash, efficient, cudnn backends) on
the shapes written by `bench --shapes-json`, with triton.testing.do_bench (median; L2 flushed
between runs), the additive-bias rows with attn_mask, and measures the ceilings: bf16 matmul
TFLOP/s and device copy bandwidth.

Usage: torch_sdpa.py SHAPES_JSON OUT_JSON [--backends flash,efficient,cudnn] [--no-extras]
--backends: time only those backends; --no-extras: skip the ceilings and the bias rows (for
scripts/scoreboard.sh, which repeats the shape list and reads the cudnn records alone).
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


# do_bench's warm-up (ms): 25, or FLASHCORE_BENCH_WARM_MS, as the bench CLI reads it
# (benches/common/mod.rs, warm_ms).
WARMUP_MS = float(os.environ.get("FLASHCORE_BENCH_WARM_MS", "25"))


def bench(fn):
    return triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=100, return_mode="median") * 1e3  # us


def ceilings():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_us = bench(lambda: a @ b)
    src = torch.randn(1 << 30, device="cuda", dtype=torch.float32)  # 4 GiB
    dst = torch.empty_like(src)
    cp_us = bench(lambda: dst.copy_(src))
    return {
        "bf16_matmul_tflops": 2 * 8192**3 / (mm_us * 1e-6) / 1e12,
        "copy_gbps": 2 * src.numel() * 4 / (cp_us * 1e-6) / 1e9,
    }


def bias_rows():
    """The additive-bias rows of examples/bench.rs (bias_rows): 4x16x2048x128 bf16 with a full
    bf16 attn_mask [4, 16, 2048, 2048] and one broadcast over the batch [1, 16, 2048, 2048]."""
    b, h, s, d = 4, 16, 2048, 128
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    records = []
    for name, batch in [("full", b), ("broadcast", 1)]:
        mask = torch.randn(batch, h, s, s, device="cuda", dtype=torch.bfloat16)
        for bname, backend in BACKENDS.items():
            rec = {"impl": f"torch/{bname}", "bias": name}
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
                    fn()
                    rec["median_us"] = bench(fn)
            except Exception as e:  # a backend that takes no attn_mask
                rec["error"] = str(e).splitlines()[0][:120]
            records.append(rec)
            print(f"torch bias {name} {bname}: {rec}", file=sys.stderr, flush=True)
        del mask
    return records


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes_json")
    ap.add_argument("out_json")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--no-extras", action="store_true")
    args = ap.parse_args()
    backends = {}
    for name in args.backends.split(","):
        if name not in BACKENDS:
            ap.error(f"--backends: no backend {name!r} (flash, efficient, cudnn)")
        backends[name] = BACKENDS[name]
    shapes = json.load(open(args.shapes_json))
    records = []
    for i, s in enumerate(shapes):
        print(f"[{i + 1}/{len(shapes)}] torch {s['name']}", file=sys.stderr, flush=True)
        for dname, dtype in DTYPES.items():
            torch.manual_seed(i)
            q = torch.randn(s["b"], s["h"], s["sq"], s["d"], device="cuda", dtype=dtype)
            k = torch.randn(s["b"], s["hk"], s["sk"], s["d"], device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            gqa = s["hk"] != s["h"]
            # torch's is_causal is top-left; every causal shape here has sq == sk, where the two
            # alignments coincide.
            for bname, backend in backends.items():
                rec = {"impl": f"torch/{bname}", "dtype": dname, "shape": s["name"]}
                try:
                    with sdpa_kernel(backend):
                        fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
                            q, k, v, is_causal=s["causal"], enable_gqa=gqa)
                        fn()
                        us = bench(fn)
                    rec.update(median_us=us, tflops=s["flops"] / (us * 1e-6) / 1e12)
                except Exception as e:  # a backend that does not support the shape
                    rec["error"] = str(e).splitlines()[0][:120]
                records.append(rec)
            del q, k, v
            torch.cuda.empty_cache()
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    doc = {
        "device": torch.cuda.get_device_name(),
        "driver": driver,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "records": records,
    }
    if not args.no_extras:
        doc["ceilings"] = ceilings()
        doc["bias"] = bias_rows()
        print(json.dumps(doc["ceilings"]), file=sys.stderr)
    json.dump(doc, open(args.out_json, "w"), indent=1)


if __name__ == "__main__":
    main()
