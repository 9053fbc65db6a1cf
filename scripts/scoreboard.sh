#!/usr/bin/env bash
# Issue 11's scoreboard on a GPU host: a bundle's kernels against torch's cudnn backend, both
# under do_bench's protocol with a longer warm-up (below), alternately (ours, then torch, per
# shape filter) for ROUNDS rounds; then, per (shape, dtype), our TFLOP/s over cuDNN's: the
# median of the per-round ratios, each round's, and the medians of both times
# (scripts/scoreboard_report.py). Alternating spreads the GPU's clock and thermal drift over
# both sides, whose single calls differ by up to 10%.
# Usage: bash scripts/scoreboard.sh BUNDLE_DIR OUT_DIR ROUNDS FILTER...
#   FILTER: an example-bench --filter substring (8x16x2048x128 matches its causal form too).
#   KERNELS (default cutlass-sm90): our families timed (example-bench --kernels).
#   BACKENDS (default cudnn): torch's backends timed (torch_sdpa.py --backends).
#   PAGED_ROWS (default 1; 0: none): also the bench's paged decode rows once per round (issue 12;
#   torch has no paged form, so they are reported against the memory roofline: ROOFLINE_GBPS,
#   default 4293, the H200's copy bandwidth measured in docs/PERFORMANCE.md).
#   FLASHCORE_BENCH_WARM_MS (default 1000 here; the bench CLI's and torch_sdpa.py's own default
#   is do_bench's 25): both sides' warm-up in ms before each row. A second of calls brings both to
#   the clock the GPU holds under sustained load, whatever ran before the row: ours always
#   follows seconds of host input generation, and torch's rows follow each other
#   (docs/PERFORMANCE.md, sessions 52 and 53).
#   HANG_S (default 1): scales each run's time limit (300 s; past it, a deadlocked kernel, the
#   run fails with status 124 and the next starts).
# Results: OUT_DIR/ours_ROUND_FILTER.json, torch_ROUND_FILTER.json and paged_ROUND.json, and the
# report on stdout and in OUT_DIR/scoreboard.md.
set -uo pipefail
if [ $# -lt 4 ]; then
  sed -n 2,23p "$0"
  exit 2
fi
bundle="$1" out="$2" rounds="$3"
export FLASHCORE_BENCH_WARM_MS="${FLASHCORE_BENCH_WARM_MS:-1000}"
shift 3
mkdir -p "$out"
status=0
# shellcheck source=limited.sh
source "$(dirname "$0")/limited.sh"
for f in "$@"; do
  limited 300 "$bundle/example-bench" --filter "$f" --shapes-json "$out/shapes_$f.json" \
    >/dev/null ||
    { echo "scoreboard: no shape list for $f"; status=1; }
done
for r in $(seq 1 "$rounds"); do
  for f in "$@"; do
    limited 300 "$bundle/example-bench" --filter "$f" --rows none \
      --kernels "${KERNELS:-cutlass-sm90}" \
      --json "$out/ours_${r}_$f.json" >"$out/ours_${r}_$f.txt" 2>&1 ||
      { echo "scoreboard: ours, round $r, $f failed (log: ours_${r}_$f.txt)"; status=1; }
    limited 300 python3 "$bundle/torch_sdpa.py" "$out/shapes_$f.json" "$out/torch_${r}_$f.json" \
      --backends "${BACKENDS:-cudnn}" --no-extras 2>"$out/torch_${r}_$f.log" ||
      { echo "scoreboard: torch, round $r, $f failed (log: torch_${r}_$f.log)"; status=1; }
  done
  if [ "${PAGED_ROWS:-1}" = 1 ]; then
    limited 300 "$bundle/example-bench" --filter NOSUCHSHAPE --rows paged \
      --json "$out/paged_$r.json" >"$out/paged_$r.txt" 2>&1 ||
      { echo "scoreboard: paged rows, round $r failed (log: paged_$r.txt)"; status=1; }
  fi
  echo "scoreboard: round $r done $(date -u +%T)"
done
python3 "$(dirname "$0")/scoreboard_report.py" "$out" | tee "$out/scoreboard.md" || status=1
exit $status
