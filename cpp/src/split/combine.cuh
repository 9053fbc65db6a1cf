// Split-KV for every kernel family that splits keys (WMMA, Hopper): the workspace of the splits'
// partial states and the kernel that combines them. Each split of a (batch, head) writes its
// normalised f32 output rows and their logsumexps; per query row the combine computes
//
//   m = max_s lse_s,  w_s = exp(lse_s - m),  out = sum_s w_s out_s / sum_s w_s,
//   lse = m + log(sum_s w_s),
//
// as merge_states does (a split without visible keys has lse -inf: weight 0, never read), and
// writes the output at its strides and, when asked, the logsumexp.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "../check.h"
#include "../launcher.h"
#include "../scratch.h"
#include "units.cuh"

namespace flashcore::split {

struct CombineParams {
  const float* part_out;  // [split][row][head_dim], rows ordered (entry, head, row): Partials
  const float* part_lse;  // [split][row]
  void* out;
  float* lse;             // dense [entries, heads, seq_q] or null
  int64_t o_stride[3];    // batch, seq, head (elements)
  int64_t rows;           // entries x heads x seq_q
  int32_t seq_q, heads, head_dim, splits;  // seq_q: rows per head (rows_per_head)
};

constexpr int kCombineThreads = 128;
constexpr int kCombineVector = 8;  // columns per thread: one 16-byte store

// Rows of head_dim / 8 threads each, kCombineThreads / (head_dim / 8) rows per block. T is the
// output element (a 16-bit float type constructible from float).
template <typename T>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const CombineParams p) {
  const int vectors = p.head_dim / kCombineVector;
  const int per_block = kCombineThreads / vectors;
  const int local = static_cast<int>(threadIdx.x) / vectors;
  const int column = static_cast<int>(threadIdx.x) % vectors * kCombineVector;
  const int64_t row = int64_t(blockIdx.x) * per_block + local;
  if (local >= per_block || row >= p.rows) {
    return;
  }
  float m = -INFINITY;
  for (int s = 0; s < p.splits; ++s) {
    const float l = p.part_lse[s * p.rows + row];
    m = l > m || l != l ? l : m;  // NaN wins
  }
  float acc[kCombineVector] = {};
  float total = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < p.splits; ++s) {
      const float w = ::expf(p.part_lse[s * p.rows + row] - m);
      total += w;
      if (w != 0.f) {  // a split without keys is never read
        const float4* src =
            reinterpret_cast<const float4*>(p.part_out + (s * p.rows + row) * p.head_dim + column);
        const float4 a = src[0], b = src[1];
        const float x[kCombineVector] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < kCombineVector; ++e) {
          acc[e] += w * x[e];
        }
      }
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  alignas(16) T packed[kCombineVector];
#pragma unroll
  for (int e = 0; e < kCombineVector; ++e) {
    packed[e] = T(acc[e] * inv);
  }
  const int64_t i = row % p.seq_q, bh = row / p.seq_q;
  const int64_t h = bh % p.heads, b = bh / p.heads;
  T* dst = static_cast<T*>(p.out) + b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2] +
           column;
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(packed);
  if (p.lse != nullptr && column == 0) {
    p.lse[row] = m == -INFINITY ? -INFINITY : m + ::logf(total);
  }
}

// A launch's output rows in the order of its logsumexp, [entry][head][row]: a dense or paged
// batch's entries and query rows; a variable-length batch's packed tokens as one entry, so that
// its sequences' rows follow their tokens (a sequence's row i is token cu_seqlens_q[b] + i).
inline int64_t row_entries(const FmhaArgs& a) { return a.cu_seqlens_q != nullptr ? 1 : a.batch; }
inline int64_t rows_per_head(const FmhaArgs& a) {
  return a.cu_seqlens_q != nullptr ? a.total_q : a.seq_q;
}

// The partial states of a launch `a` split over `splits` blocks of keys, in stream-ordered
// scratch: f32 outputs [split][entry][head][row][head_dim], then logsumexps
// [split][entry][head][row] (row_entries, rows_per_head). A kernel writes split s's state of
// the row whose logsumexp is at index n of `a.lse` at row s * rows() + n.
class Partials {
 public:
  Partials(const FmhaArgs& a, int32_t splits, cudaStream_t stream)
      : splits_(splits),
        rows_(row_entries(a) * a.heads_q * rows_per_head(a)),
        scratch_(sizeof(float) * size_t(splits) * size_t(rows_) * size_t(a.head_dim + 1), stream),
        lse_(scratch_.floats() + int64_t(splits) * rows_ * a.head_dim) {}
  float* out() const { return scratch_.floats(); }
  float* lse() const { return lse_; }
  // The rows of one split's state.
  int64_t rows() const { return rows_; }

  // Enqueues the combine of the partial states into `a`'s output (and logsumexp) on `stream`.
  template <typename T>
  void combine(const FmhaArgs& a, cudaStream_t stream) const {
    CombineParams c{};
    c.part_out = out();
    c.part_lse = lse();
    c.out = a.out;
    c.lse = a.lse;
    for (int i = 0; i < 3; ++i) {
      c.o_stride[i] = a.o_stride[i];
    }
    c.rows = rows_;
    c.seq_q = static_cast<int32_t>(rows_per_head(a));
    c.heads = static_cast<int32_t>(a.heads_q);
    c.head_dim = static_cast<int32_t>(a.head_dim);
    c.splits = splits_;
    const int64_t per_block = kCombineThreads / (a.head_dim / kCombineVector);
    const auto blocks = static_cast<unsigned>((rows_ + per_block - 1) / per_block);
    combine_kernel<T><<<blocks, kCombineThreads, 0, stream>>>(c);
    check_cuda(cudaGetLastError(), "launch the split-KV combine kernel");
  }

 private:
  int32_t splits_;
  int64_t rows_;
  detail::Scratch scratch_;
  float* lse_;
};

}  // namespace flashcore::split
