#!/usr/bin/env bash
# Runs a bundle built by scripts/bundle.sh on a GPU host: the GPU test suite, the example at the
# mission shape, and the SASS listing. Logs go to ${1:-.}/ as well as stdout.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-.}"
mkdir -p "$out"
status=0
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$out/gpu.txt"
echo "== GPU test suite"
"$here/test-gpu" --include-ignored --test-threads=1 2>&1 | tee "$out/gpu-tests.log" || status=1
echo "== example (mission shape and a causal bf16 run)"
"$here/example-attention" 2>&1 | tee "$out/example.log" || status=1
"$here/example-attention" 4 8 2048 128 --causal --bf16 2>&1 | tee -a "$out/example.log" || status=1
echo "== SASS in the fatbin"
cuobjdump --list-elf "$here/example-attention" | sed -E 's/.*\.(sm_[0-9a-z]+)\..*/\1/' | sort | uniq -c | tee "$out/sass.txt"
echo "== bundle status: $status"
exit $status
