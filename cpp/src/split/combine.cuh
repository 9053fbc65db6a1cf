// Split-KV for every kernel family that splits keys (WMMA, Hopper): the workspace of the splits'
// partial states and the kernels that combine them (combine_few_kernel for at most
// kCombineFewSplits splits, combine_kernel for more). Each split of a (batch, head) writes its
// normalised f32 output rows and their logsumexps; per query row the combine computes
//
//   m = max_s lse_s,  w_s = exp(lse_s - m),  out = sum_s w_s out_s / sum_s w_s,
//   lse = m + log(sum_s w_s),
//
// as merge_states does (a split without visible keys has lse -inf: weight 0, never read), and
// writes the output at its strides and, when asked, the logsumexp. The Hopper kernel's last
// wave in pieces (sm90/scheduler.cuh's Tail) merges its pieces the same way, its partial rows
// numbered by work unit: a family whose partial rows are not the output's logsumexp rows gives
// the combine a row map of its own (LseRows says what one is).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "../launcher.h"
#include "../merge/state.cuh"
#include "../programmatic.h"
#include "../scratch.h"
#include "units.cuh"

namespace flashcore::split {

struct CombineParams {
  const float* part_out;  // [split][row][head_dim], rows as the row map says: Partials
  const float* part_lse;  // [split][row]
  void* out;
  float* lse;             // dense [entries, heads, seq_q] or null
  int64_t o_stride[3];    // batch, seq, head (elements)
  int64_t rows;           // the partial rows: entries x heads x seq_q, or the row map's
  int32_t seq_q, heads, head_dim, splits;  // seq_q: rows per head (rows_per_head)
};

// The combine's row map where partial row n is the output row whose logsumexp index is n,
// (entry, head, row) (key splits: every family). A row map's call gives the output row's
// logsumexp index of partial row `row`, or false for a row that no split wrote (the combine
// then writes nothing for it).
struct LseRows {
  __device__ bool operator()(int64_t row, const CombineParams&, int64_t* out_row) const {
    *out_row = row;
    return true;
  }
};

constexpr int kCombineMaxThreads = 256;
constexpr int kCombineVector = 8;  // columns per thread: one 16-byte load pair, one store
constexpr int kCombineMaxSplits = 64;
static_assert(kCombineMaxSplits >= kMaxKvSplits, "the combine holds every split's weight");
static_assert(kCombineMaxSplits <= 64, "the first warp reduces two splits per lane");

// The thread groups of a row's block: one per split, as many as fit in kCombineMaxThreads
// threads of head_dim / 8 column vectors each, so that the splits' states are read in parallel,
// one DRAM read deep, rather than split after split.
inline int combine_groups(int64_t head_dim, int32_t splits) {
  const int vectors = static_cast<int>(head_dim / kCombineVector);
  return std::max(1, std::min<int>(splits, kCombineMaxThreads / vectors));
}

// One block per row, groups of head_dim / 8 threads (combine_groups; blockDim.x at least 32).
// The first warp reduces the splits' logsumexps (two per lane) to the row's max, weights and
// their sum; group g then accumulates the column vectors of splits g, g + groups, ..., and the
// first group adds the groups' sums. T is the output element (a 16-bit float type constructible
// from float); Rows maps the partial rows to the output's (LseRows).
template <typename T, class Rows>
__global__ void __launch_bounds__(kCombineMaxThreads)
    combine_kernel(const CombineParams p, const Rows map) {
  __shared__ float weights[kCombineMaxSplits];
  __shared__ float row_max, row_total;
  __shared__ float4 sums[kCombineMaxThreads][kCombineVector / 4];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The next call's Hopper kernel, a programmatic dependent of this one, may start setting up.
  cudaTriggerProgrammaticLaunchCompletion();
  // Launched as a programmatic dependent (Partials::combine): the split kernel's partial states
  // are complete and visible only after this wait. Without that launch it returns at once.
  cudaGridDependencySynchronize();
#endif
  const int64_t row = blockIdx.x;
  // The output row's logsumexp index (entry, head, row).
  int64_t out_row = 0;
  if (!map(row, p, &out_row)) {
    return;
  }
  const int t = static_cast<int>(threadIdx.x);
  if (t < 32) {
    const float l0 = t < p.splits ? p.part_lse[t * p.rows + row] : -INFINITY;
    const float l1 = t + 32 < p.splits ? p.part_lse[(t + 32) * p.rows + row] : -INFINITY;
    float m = merge::lse_max(l0, l1);
    for (int d = 16; d > 0; d /= 2) {
      m = merge::lse_max(m, __shfl_xor_sync(0xffffffffu, m, d));
    }
    // A split without visible keys (lse -inf) weighs 0; so does every split when all are -inf.
    const float w0 = merge::state_weight(l0, m), w1 = merge::state_weight(l1, m);
    float total = w0 + w1;
    for (int d = 16; d > 0; d /= 2) {
      total += __shfl_xor_sync(0xffffffffu, total, d);
    }
    weights[t] = w0;
    weights[t + 32] = w1;
    if (t == 0) {
      row_max = m;
      row_total = total;
    }
  }
  __syncthreads();

  const int vectors = p.head_dim / kCombineVector;
  const int groups = static_cast<int>(blockDim.x) / vectors;
  const int group = t / vectors, column = t % vectors * kCombineVector;
  float acc[kCombineVector] = {};
  for (int s = group; s < p.splits; s += groups) {
    const float w = weights[s];
    if (w != 0.f) {  // a weightless split's state is never read
      const float4* src = reinterpret_cast<const float4*>(
          p.part_out + (int64_t(s) * p.rows + row) * p.head_dim + column);
      const float4 a = src[0], b = src[1];
      const float x[kCombineVector] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int e = 0; e < kCombineVector; ++e) {
        acc[e] += w * x[e];
      }
    }
  }
  sums[t][0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  sums[t][1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncthreads();
  if (group != 0) {
    return;
  }
  for (int g = 1; g < groups; ++g) {
    const float4 a = sums[g * vectors + t][0], b = sums[g * vectors + t][1];
    const float x[kCombineVector] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int e = 0; e < kCombineVector; ++e) {
      acc[e] += x[e];
    }
  }
  const float m = row_max, total = row_total;
  const float inv = total > 0.f ? 1.f / total : 0.f;
  alignas(16) T packed[kCombineVector];
#pragma unroll
  for (int e = 0; e < kCombineVector; ++e) {
    packed[e] = T(acc[e] * inv);
  }
  const int64_t i = out_row % p.seq_q, bh = out_row / p.seq_q;
  const int64_t h = bh % p.heads, b = bh / p.heads;
  T* dst = static_cast<T*>(p.out) + b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2] +
           column;
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(packed);
  if (p.lse != nullptr && t == 0) {
    p.lse[out_row] = merge::merged_lse(m, total);
  }
}

// The combine of at most kCombineFewSplits splits: a thread per (row, column vector), which
// reads every split's logsumexp and state at once (one memory round trip, no barrier), many rows
// per block. Where the splits are few and the rows many (the Hopper kernel's last wave in pieces:
// 8704 rows of up to three pieces at 8x16x2048x128), combine_kernel's block per row, which reads
// the logsumexps before the states, took 13.5-14.2 us (docs/HOPPER.md, round 54). A weightless
// split's state is read with the others (it lies in the workspace) but never used.
constexpr int kCombineFewSplits = 8;
constexpr int kCombineFewThreads = 256;

template <typename T, class Rows>
__global__ void __launch_bounds__(kCombineFewThreads)
    combine_few_kernel(const CombineParams p, const Rows map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // as combine_kernel
  cudaGridDependencySynchronize();
#endif
  const int vectors = p.head_dim / kCombineVector;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = thread / vectors;
  const int column = static_cast<int>(thread % vectors) * kCombineVector;
  int64_t out_row = 0;
  if (row >= p.rows || !map(row, p, &out_row)) {
    return;
  }
  float lse[kCombineFewSplits];
  float4 lo[kCombineFewSplits], hi[kCombineFewSplits];
  float m = -INFINITY;
#pragma unroll
  for (int s = 0; s < kCombineFewSplits; ++s) {
    if (s < p.splits) {
      lse[s] = p.part_lse[s * p.rows + row];
      const float4* src = reinterpret_cast<const float4*>(
          p.part_out + (int64_t(s) * p.rows + row) * p.head_dim + column);
      lo[s] = src[0];
      hi[s] = src[1];
      m = merge::lse_max(m, lse[s]);
    }
  }
  float total = 0.f;
  float acc[kCombineVector] = {};
#pragma unroll
  for (int s = 0; s < kCombineFewSplits; ++s) {
    if (s < p.splits) {
      const float w = merge::state_weight(lse[s], m);
      total += w;
      if (w != 0.f) {  // a weightless split's state is never used
        const float x[kCombineVector] = {lo[s].x, lo[s].y, lo[s].z, lo[s].w,
                                         hi[s].x, hi[s].y, hi[s].z, hi[s].w};
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
  const int64_t i = out_row % p.seq_q, bh = out_row / p.seq_q;
  const int64_t h = bh % p.heads, b = bh / p.heads;
  T* dst = static_cast<T*>(p.out) + b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2] +
           column;
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(packed);
  if (p.lse != nullptr && column == 0) {
    p.lse[out_row] = merge::merged_lse(m, total);
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
// the row whose logsumexp is at index n of `a.lse` at row s * rows() + n. With `rows` > 0, each
// split has that many rows instead, which combine()'s row map maps to the output's.
class Partials {
 public:
  Partials(const FmhaArgs& a, int32_t splits, cudaStream_t stream, int64_t rows = 0)
      : splits_(splits),
        rows_(rows > 0 ? rows : row_entries(a) * a.heads_q * rows_per_head(a)),
        scratch_(sizeof(float) * size_t(splits) * size_t(rows_) * size_t(a.head_dim + 1), stream),
        lse_(scratch_.floats() + int64_t(splits) * rows_ * a.head_dim) {
    // Checked before the split kernel's launch: the planner never exceeds these.
    if (splits > kCombineMaxSplits || a.head_dim % kCombineVector != 0 ||
        a.head_dim > kCombineMaxThreads * kCombineVector || rows_ > INT32_MAX) {
      throw detail::Failure(Code::Launch, "",
                            "split-KV combine: " + std::to_string(splits) + " splits of " +
                                std::to_string(rows_) + " rows of head dim " +
                                std::to_string(a.head_dim) + " (at most " +
                                std::to_string(kCombineMaxSplits) + " splits, head dim a multiple "
                                "of 8 up to 2048)");
    }
  }
  float* out() const { return scratch_.floats(); }
  float* lse() const { return lse_; }
  // The rows of one split's state.
  int64_t rows() const { return rows_; }

  // Enqueues the combine of the partial states into `a`'s output (and logsumexp) on `stream`,
  // partial rows mapped to the output's by `map` (LseRows, or a family's own: see LseRows).
  // `programmatic` (compute capability 9.0 and later only): a programmatic dependent launch, so
  // that the GPU sets the combine up while the split kernel's last blocks run; the kernel waits
  // for the split kernel's grid before it reads a state.
  template <typename T, class Rows = LseRows>
  void combine(const FmhaArgs& a, cudaStream_t stream, bool programmatic = false,
               const Rows& map = {}) const {
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
    const int64_t vectors = a.head_dim / kCombineVector;
    const int64_t few_blocks = (rows_ * vectors + kCombineFewThreads - 1) / kCombineFewThreads;
    if (splits_ <= kCombineFewSplits && few_blocks <= INT32_MAX) {
      launch_programmatic(combine_few_kernel<T, Rows>, dim3(static_cast<unsigned>(few_blocks)),
                          dim3(kCombineFewThreads), 0, stream, programmatic,
                          "launch the split-KV combine kernel", c, map);
      return;
    }
    // At least a warp: the first one reduces the logsumexps (threads past the last group have
    // no split to read and add zeros).
    const int threads = std::max(32, combine_groups(a.head_dim, splits_) *
                                         static_cast<int>(vectors));
    launch_programmatic(combine_kernel<T, Rows>, dim3(static_cast<unsigned>(rows_)),
                        dim3(static_cast<unsigned>(threads)), 0, stream, programmatic,
                        "launch the split-KV combine kernel", c, map);
  }

 private:
  int32_t splits_;
  int64_t rows_;
  detail::Scratch scratch_;
  float* lse_;
};

}  // namespace flashcore::split
