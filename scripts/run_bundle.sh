#!/usr/bin/env bash
# Runs a bundle built by scripts/bundle.sh on a GPU host: the GPU test suite, the example at the
# mission shape, the SASS listing, compute-sanitizer on the seed shapes and a throughput shape
# (unless SKIP_SANITIZER=1; bundle/sanitize.sh runs every tool over the GPU tests too), and
# (unless SKIP_BENCH=1) the benchmarks side by side with torch SDPA. Logs go to ${1:-.}/ as well
# as stdout. SKIP_TESTS=1 skips the GPU test suites (the examples still run and check).
#
# The benchmarks warm each row up for FLASHCORE_BENCH_WARM_MS of back-to-back calls on both sides
# (default here 1000, as scoreboard.sh: the clock the GPU holds under its power cap, whatever ran
# before the row; the bench CLI's and torch_sdpa.py's own default is do_bench's 25 ms, which
# timed our rows nearer the boost clock than torch's, docs/PERFORMANCE.md session 52). With the
# second of warm-up, on an H200 with 16 host cores (session 54): torch's side 2 min, ours over
# the shape list about 4 min, the fixed rows after it several more; BENCH_ROWS=none (or a list, as
# example-bench --rows takes it) leaves the fixed rows out.
#
# Every GPU program runs under a time limit (limited.sh; HANG_S scales them, default 1):
# a deadlocked kernel ends its step with status 124, reported as TIMED OUT, and the script goes
# on, instead of holding the GPU host until its own limit (docs/HOPPER.md round 67).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-.}"
mkdir -p "$out"
status=0
# shellcheck source=limited.sh
source "$here/limited.sh"
# The block below runs in a pipeline (a subshell): it reports failures through this marker file.
marker="$(mktemp)"
rm -f "$marker"
{
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  echo "== example (mission shape and a causal bf16 run)"
  limited 120 "$here/example-attention" || touch "$marker"
  limited 120 "$here/example-attention" 4 8 2048 128 --causal --bf16 || touch "$marker"
  echo "== C++ example (examples/cpp: its own buffers, the public C++ API and a plan, a float64 check)"
  limited 120 "$here/cpp-example" || touch "$marker"
  echo "== serving example (a decode step: paged caches, one plan, 32 layers, a float64 check)"
  limited 120 "$here/example-serving" || touch "$marker"
  echo "== SASS in the fatbin (cuobjdump --list-elf example-attention)"
  cuobjdump --list-elf "$here/example-attention" | sed -E 's/.*\.(sm_[0-9a-z]+)\..*/\1/' | sort | uniq -c
  echo "== WMMA kernels: registers, shared memory, stack, spills (cuobjdump --dump-resource-usage)"
  cuobjdump --dump-resource-usage "$here/example-attention" |
    awk '/^[ \t]*arch = /{arch=$3} /Function .*wmma/{fn=$2} /REG:/{ if (fn != "") { print arch, fn, $0; fn="" } }'
  echo "== Hopper kernels: wgmma instructions (HGMMA) in the sm_90a SASS, and resources"
  cuobjdump --dump-sass "$here/example-attention" |
    awk '/Function : .*fmha_sm90/{fn=$3} /HGMMA/{ if (fn != "") n[fn]++ } END { for (f in n) print n[f], "HGMMA in", f }'
  cuobjdump --dump-resource-usage "$here/example-attention" |
    awk '/Function .*fmha_sm90/{fn=$2} /REG:/{ if (fn != "") { print fn, $0; fn="" } }'
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
    echo "== compute-sanitizer racecheck: WMMA on the seed shapes"
    for shape in "1 8 512 64" "4 8 256 64" "1 8 1024 64"; do
      # shellcheck disable=SC2086
      limited 300 "$sanitizer" --tool racecheck --racecheck-report all --error-exitcode 3 \
        "$here/example-attention" $shape --backend wmma || touch "$marker"
    done
    echo "== compute-sanitizer memcheck and racecheck: Hopper kernel, seeds, a throughput shape and"
    echo "   a last wave in pieces (140 units on 132 SMs)"
    for shape in "1 8 512 64" "4 8 256 64" "1 8 1024 64" "4 8 1024 128 --causal --bf16" \
      "1 70 129 128 --kv-heads 10 --seq-k 4100 --bf16"; do
      for tool in memcheck racecheck; do
        # shellcheck disable=SC2086
        limited 300 "$sanitizer" --tool $tool --error-exitcode 3 \
          "$here/example-attention" $shape --backend cutlass-sm90 || touch "$marker"
      done
    done
    # The GPU tests' kernels (merge, variable-length, split-KV, paged, score modifiers, the
    # Hopper kernel's causal pairs and windows) under memcheck, racecheck, initcheck and
    # synccheck: bundle/sanitize.sh, which takes longer than the rest of this script.
  fi
} 2>&1 | tee "$out/example.log"
[ -e "$marker" ] && { echo "== example or racecheck FAILED"; status=1; }
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== GPU test suite"
  limited 400 "$here/test-gpu" --include-ignored --nocapture 2>&1 | tee "$out/gpu-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  echo "== cudarc interop test"
  limited 120 "$here/test-cudarc" --include-ignored --nocapture 2>&1 | tee -a "$out/gpu-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  echo "== runtime hypotheses (pool, fragmentation, leaks, device out-of-memory, four threads)"
  limited 300 "$here/test-runtime" --include-ignored --nocapture --test-threads=1 2>&1 |
    tee -a "$out/gpu-tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ -x "$here/example-bench" ] && [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== benchmarks: flashcore and torch SDPA in the same run"
  export FLASHCORE_BENCH_WARM_MS="${FLASHCORE_BENCH_WARM_MS:-1000}"
  echo "each row warmed up for $FLASHCORE_BENCH_WARM_MS ms on both sides"
  "$here/example-bench" --shapes-json "$out/shapes.json"
  python3 "$here/torch_sdpa.py" "$out/shapes.json" "$out/torch.json" || status=1
  peak=$(python3 -c "import json;print(json.load(open('$out/torch.json'))['ceilings']['bf16_matmul_tflops'])" 2>/dev/null || echo "")
  "$here/example-bench" --json "$out/ours.json" ${peak:+--peak-tflops $peak} \
    ${BENCH_ROWS:+--rows "$BENCH_ROWS"} | tee "$out/bench.txt" || status=1
  for class in ${FORCED_CLASSES-sm80}; do
    echo "-- tile rows of class $class on this GPU" | tee -a "$out/bench.txt"
    "$here/example-bench" --force-class $class --iters 30 ${peak:+--peak-tflops $peak} | tee -a "$out/bench.txt" || status=1
  done
  python3 "$here/merge_bench.py" "$out/shapes.json" "$out/ours.json" "$out/torch.json" | tee "$out/table.md" || status=1
  echo "== multi-stream speedup (H10)"
  "$here/example-streams" | tee -a "$out/bench.txt" || status=1
fi
echo "== bundle status: $status"
exit $status
