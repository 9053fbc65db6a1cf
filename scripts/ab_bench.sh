#!/usr/bin/env bash
# A/B of two bundles (scripts/bundle.sh) on a GPU host: each round times every shape filter with
# bundle A's example-bench, then with bundle B's, under the bench's protocol (do_bench's: warm-up,
# L2 flushed before each call); then prints, per (shape, dtype), the medians of the rounds'
# medians and the median of the per-round ratios B / A (scripts/ab_report.py). Alternating the
# builds spreads the GPU's clock and thermal drift over both.
# Usage: bash scripts/ab_bench.sh A_BUNDLE_DIR B_BUNDLE_DIR OUT_DIR ROUNDS FILTER...
#   FILTER: an example-bench --filter substring (8x16x2048x128 matches its causal form too).
#   KERNELS (default cutlass-sm90): the families timed (example-bench --kernels).
#   HANG_S (default 1): scales each run's time limit (300 s; past it, a deadlocked kernel, the
#   run fails with status 124 and the next starts).
# Results: OUT_DIR/ab_{a,b}_ROUND_FILTER.json, and the report on stdout and in OUT_DIR/ab.md.
set -uo pipefail
if [ $# -lt 5 ]; then
  sed -n 2,12p "$0"
  exit 2
fi
a="$1" b="$2" out="$3" rounds="$4"
# shellcheck source=limited.sh
source "$(dirname "$0")/limited.sh"
shift 4
mkdir -p "$out"
status=0
for r in $(seq 1 "$rounds"); do
  for side in a b; do
    dir=$a
    [ "$side" = b ] && dir=$b
    for f in "$@"; do
      limited 300 "$dir/example-bench" --filter "$f" --rows none \
        --kernels "${KERNELS:-cutlass-sm90}" \
        --json "$out/ab_${side}_${r}_$f.json" >"$out/ab_${side}_${r}_$f.txt" 2>&1 ||
        { echo "ab_bench: $side round $r $f failed (log: ab_${side}_${r}_$f.txt)"; status=1; }
    done
    echo "ab_bench: $side round $r done $(date -u +%T)"
  done
done
python3 "$(dirname "$0")/ab_report.py" "$out" | tee "$out/ab.md" || status=1
exit $status
