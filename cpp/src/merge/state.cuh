// The arithmetic of merging attention states (out_s, lse_s) computed over disjoint key sets,
// shared by the merge call (merge/kernel.cuh) and the split-KV combine (split/combine.cuh):
//
//   m = max_s lse_s (NaN wins),  w_s = exp(lse_s - m),  lse = m + log(sum_s w_s).
//
// A state without keys has lse -inf and weight 0; when every state is -inf, every weight is 0
// and the merged lse is -inf.
#pragma once

#include <cmath>

namespace flashcore::merge {

// The larger of two logsumexps, NaN winning (a NaN state makes the row NaN).
__device__ inline float lse_max(float a, float b) { return a > b || a != a ? a : b; }

// The weight of a state with logsumexp `lse` in a row whose largest is `m`.
__device__ inline float state_weight(float lse, float m) {
  return m == -INFINITY ? 0.f : ::expf(lse - m);
}

// The merged logsumexp of a row from its largest `m` and the sum of its weights.
__device__ inline float merged_lse(float m, float total) {
  return m == -INFINITY ? -INFINITY : m + ::logf(total);
}

}  // namespace flashcore::merge
