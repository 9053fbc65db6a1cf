# Sourced by the GPU host scripts (run_bundle.sh, sanitize.sh, ab_bench.sh, scoreboard.sh;
# scripts/bundle.sh copies it beside them): their one time limit for a GPU program.
# limited SECONDS COMMAND...: runs COMMAND under SECONDS x HANG_S (default 1; coreutils' timeout,
# killed 10 s after it is asked to stop) and returns its status: 124 when it ran past, a
# deadlocked kernel for instance, which it also reports as TIMED OUT on stderr.
limited() {
  local seconds=$(($1 * ${HANG_S:-1}))
  shift
  timeout -k 10 "$seconds" "$@"
  local rc=$?
  [ $rc = 124 ] && echo "TIMED OUT after ${seconds} s: $*" >&2
  return $rc
}
