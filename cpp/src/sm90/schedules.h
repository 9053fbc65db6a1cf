// The schedules of each tile of the sm90 table by role, read from instances.inc (their one
// source): the instance files name a role, never a flag number, so the table and the kernels
// cannot disagree. kernel.cuh's ScheduleFlags give the numbers their meaning; launch.cuh checks
// which roles may carry the modifier and bias flags.
#pragma once

namespace flashcore::sm90 {

// What a tile's kernel serves: calls without a mask, causal ones, a softcap or ALiBi, a bias.
struct TileSchedules {
  int q, k, d;
  int plain, causal, modifiers, bias;
};

constexpr TileSchedules kTileSchedules[] = {
#define FLASHCORE_TILE(Q, K, D, FLAGS, CAUSAL_FLAGS, MODIFIER_FLAGS, BIAS_FLAGS) \
  {Q, K, D, FLAGS, CAUSAL_FLAGS, MODIFIER_FLAGS, BIAS_FLAGS},
#include "sm90/instances.inc"
#undef FLASHCORE_TILE
};

// The schedules of tile q x k x d; a tile missing from instances.inc fails the build where its
// kernel asks for them: evaluating this function then reaches the `throw`, which a constant
// expression cannot evaluate.
constexpr TileSchedules schedules_of(int q, int k, int d) {
  for (const TileSchedules& s : kTileSchedules) {
    if (s.q == q && s.k == k && s.d == d) {
      return s;
    }
  }
  throw "tile missing from sm90/instances.inc";
}

}  // namespace flashcore::sm90
