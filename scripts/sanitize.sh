#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck, initcheck and synccheck over every GPU kernel family, on
# the seeds' shapes, an odd shape (S = 17, d = 72), GQA and decode (split-KV on WMMA), and over
# the merge, variable-length, split-KV, paged, score-modifier, Hopper causal-pair, window and
# last-wave GPU tests, the test of calls enqueued back to back (the Hopper kernel's programmatic
# launches) and the CUDA graph tests (calls recorded once, launched twice).
# Run on the GPU host from an unpacked bundle (scripts/bundle.sh copies it to bundle/sanitize.sh):
#   bash bundle/sanitize.sh [OUT_DIR]
# Each run's log goes to OUT_DIR (default .); a line per run says clean or FAILED; the exit status
# is 1 when any run reported an error or failed. A run is limited to 300 s x HANG_S (default 1):
# past that (a deadlocked kernel) it ends as FAILED, TIMED OUT, and the next run starts.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=limited.sh
source "$here/limited.sh"
out="${1:-.}"
mkdir -p "$out"
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
tools=${TOOLS:-"memcheck racecheck initcheck synccheck"}
backends="wmma cutlass-sm80"
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
[ "$cc" = "9.0" ] && backends="$backends cutlass-sm90"
# B H S D and options (example-attention's arguments); one timed call each.
shapes=(
  "1 8 512 64"
  "4 8 256 64"
  "1 8 1024 64"
  "2 4 17 72 --causal"
  "2 32 300 128 --kv-heads 8 --causal --bf16"
  "2 32 1 128 --kv-heads 8 --seq-k 8192 --bf16"
)
status=0
n=0
check() {  # NAME COMMAND...: runs COMMAND, logs it, reports clean or FAILED
  local name="$1"
  shift
  n=$((n + 1))
  local rc=0
  limited 300 "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [ $rc = 0 ]; then
    echo "clean   $name"
  else
    echo "FAILED  $name (log: $name.log)$([ $rc = 124 ] && echo ', TIMED OUT')"
    grep -E "ERROR|Error|error|Hazard|hazard|SUMMARY" "$out/$name.log" | head -5
    status=1
  fi
}
for tool in $tools; do
  extra=()
  [ "$tool" = racecheck ] && extra=(--racecheck-report all)
  for backend in $backends; do
    for shape in "${shapes[@]}"; do
      name="$tool-$backend-$(echo "$shape" | tr -d '-' | tr ' ' '_')"
      # shellcheck disable=SC2086
      check "$name" "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 3 \
        "$here/example-attention" $shape --backend "$backend" --iters 1
    done
  done
  for tests in merge_ varlen_ split_kv paged_ score_modifiers alibi_ bias_ hopper_causal_pairs \
    hopper_window hopper_last_wave chained_calls graph; do
    check "$tool-tests-$tests" "$sanitizer" --tool "$tool" --error-exitcode 3 \
      "$here/test-gpu" --include-ignored --test-threads=1 "$tests"
  done
done
echo "== sanitize: $n runs, status $status"
exit $status
