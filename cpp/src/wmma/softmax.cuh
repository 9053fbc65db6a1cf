// FlashAttention-2 online softmax on one warp's 16 query rows, held in wmma accumulator
// fragments (the layout of fragments.cuh: lane 4g + t holds rows g and g + 8, a quad of lanes
// holds a whole row, so a row reduction is two shuffles).
#pragma once

#include <cmath>

#include "fast_math.cuh"
#include "fragments.cuh"

namespace flashcore::wmma_fa {

// Which of a fragment element's two rows (g or g + 8) element i belongs to.
__device__ constexpr int row_half(int i) { return (i >> 1) & 1; }

// Running state of rows g and g + 8 for one lane: max of the scaled scores (log2 units) and this
// lane's share of the running sum (a quad's four shares are added once, in the epilogue).
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  // Scores of one key tile (NF fragments of 16 keys) -> unnormalised probabilities
  // exp2(s * scale_log2 - m_new), in place. Returns in `alpha` the factors exp2(m_old - m_new) that
  // rescale what was accumulated so far. `scale_log2` is a positive normal float (validation and
  // the launcher see to it), so a masked score (-inf) stays -inf after scaling.
  template <int NF>
  __device__ void update(FragAcc (&s)[NF], float scale_log2, float (&alpha)[2]) {
    // The scale is positive (validated), so the row max of s * scale is scale * (max of s):
    // taking it on the raw scores lets one FFMA form each exponent.
    float ext[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NF; ++n) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ext[row_half(i)] = fmaxf(ext[row_half(i)], s[n].x[i]);
      }
    }
    float neg_base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ext[r] = fmaxf(ext[r], __shfl_xor_sync(0xffffffffu, ext[r], 1));
      ext[r] = fmaxf(ext[r], __shfl_xor_sync(0xffffffffu, ext[r], 2));
      const float m_new = fmaxf(m[r], ext[r] * scale_log2);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: stay at zero
      alpha[r] = fast_exp2(m[r] - base);
      m[r] = m_new;
      neg_base[r] = -base;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NF; ++n) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float e = fast_exp2(fmaf(s[n].x[i], scale_log2, neg_base[row_half(i)]));
        s[n].x[i] = e;
        sum[row_half(i)] += e;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = l[r] * alpha[r] + sum[r];
    }
  }

  // 1 / l of row g (r = 0) or g + 8 (r = 1), after reduce_sums; 0 for a row that saw no key
  // (its output is then 0, not 0 * inf).
  __device__ float inv_sum(int r) const { return l[r] > 0.0f ? 1.0f / l[r] : 0.0f; }

  // Natural-log logsumexp of row g (r = 0) or g + 8 (r = 1), after reduce_sums: -inf for a row
  // that saw no key.
  __device__ float lse(int r) const {
    constexpr float kLn2 = 0.6931471805599453f;
    return (m[r] + log2f(l[r])) * kLn2;
  }

  // The quad's total sums (call once, after the last tile).
  __device__ void reduce_sums() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
  }
};

// Multiplies each output row by its factor; skipped when no row of the warp changed its max
// (the common case once the max has settled), which is exact.
template <int NJ>
__device__ inline void rescale(FragAcc (&o)[NJ], const float (&alpha)[2]) {
  if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
    return;
  }
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      o[j].x[i] *= alpha[row_half(i)];
    }
  }
}

}  // namespace flashcore::wmma_fa
