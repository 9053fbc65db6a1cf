// Split-KV for every kernel family that splits keys (WMMA, Hopper): the workspace of the splits'
// partial states and the kernel that combines them. Each split of a (batch, head) writes its
// normalised f32 output rows and their logsumexps; per query row the combine computes
//
//   m = max_s lse_s,  w_s = exp(lse_s - m),  out = sum_s w_s out_s / sum_s w_s,
//   lse = m + log(sum_s w_s),
//
// as merge_states does (a split without visible keys has lse -inf: weight 0, never used), and
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
#include "../smem.h"
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

constexpr int kCombineVector = 8;  // columns per thread: one 16-byte load pair, one store
constexpr int kCombineMaxLanes = 32;
constexpr int kCombineMaxSplits = 64;
constexpr int kCombineThreads = 128;  // a block's threads at least (more: one row's)
static_assert(kCombineMaxSplits >= kMaxKvSplits && kCombineMaxSplits <= 2 * kCombineMaxLanes,
              "the combine holds every split's state, at most two per lane");
static_assert(kMaxHeadDim / kCombineVector * kCombineMaxLanes <= 1024, "a row fits in a block");

// How the combine's threads cover its rows: `lanes` adjacent threads per (row, column vector),
// each holding `slots` splits' states, and `rows` rows per block (as many as fit in
// kCombineThreads, at least one). Up to four splits take one lane (as many slots as splits,
// rounded up to 2 or 4); more take two slots per lane, and as many lanes as they need. Measured
// (ncu, H200; docs/PERFORMANCE.md, session 57): 3 splits in one lane of 4 slots took 8.6 us at
// 2x16x8192x128's 8704 rows, against 9.9 in two lanes of 2 and 10.8 in one lane of 8; 16 splits
// over 32 rows took 3.9 us in eight lanes of 2, 4.9 in four of 4 and 6.6 in two of 8.
struct CombineShape {
  int slots, lanes, rows;
  static CombineShape make(int32_t splits, int64_t head_dim) {
    const int slots = splits > 2 && splits <= 4 ? 4 : 2;
    int lanes = 1;
    while (lanes * slots < splits) {
      lanes *= 2;
    }
    const int row_threads = static_cast<int>(head_dim / kCombineVector) * lanes;
    return {slots, lanes, std::max(1, kCombineThreads / row_threads)};
  }
  int threads(int64_t head_dim) const {
    return rows * static_cast<int>(head_dim / kCombineVector) * lanes;
  }
};

// `shape.rows` rows per block, `shape.lanes` adjacent threads per (row, column vector); lane l
// reads splits l, l + lanes, ... (kSlots of them at most), every split's logsumexp and state at
// once: one memory round trip. The lanes reduce the row's max, then the weights' sum and the
// weighted states, by shuffles within the group (it lies in one warp: lanes divides 32), and
// the first lane stores the column vector and, at column 0, the row's logsumexp. A weightless
// split's state is read with the others (it lies in the workspace, written or not) but never
// used. T is the output element (a 16-bit float type constructible from float); Rows maps the
// partial rows to the output's (LseRows).
template <typename T, int kSlots, class Rows>
__global__ void combine_kernel(const CombineParams p, const CombineShape shape, const Rows map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The next call's Hopper kernel, a programmatic dependent of this one, may start setting up.
  cudaTriggerProgrammaticLaunchCompletion();
  // Launched as a programmatic dependent (Partials::combine): the split kernel's partial states
  // are complete and visible only after this wait. Without that launch it returns at once.
  cudaGridDependencySynchronize();
#endif
  const int lanes = shape.lanes;
  const int vectors = p.head_dim / kCombineVector;
  const int t = static_cast<int>(threadIdx.x);
  const int lane = t % lanes, vector = t / lanes % vectors;
  const int64_t row = int64_t(blockIdx.x) * shape.rows + t / lanes / vectors;
  int64_t out_row = 0;
  if (row >= p.rows || !map(row, p, &out_row)) {  // the group's lanes alike: one row
    return;
  }
  const int column = vector * kCombineVector;
  const unsigned group = lanes == 32 ? ~0u : ((1u << lanes) - 1u) << (t % 32 / lanes * lanes);
  float lse[kSlots];
  float4 lo[kSlots], hi[kSlots];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int s = lane + k * lanes;
    if (s < p.splits) {
      lse[k] = p.part_lse[s * p.rows + row];
      const float4* src = reinterpret_cast<const float4*>(
          p.part_out + (int64_t(s) * p.rows + row) * p.head_dim + column);
      lo[k] = src[0];
      hi[k] = src[1];
      m = merge::lse_max(m, lse[k]);
    }
  }
  for (int d = lanes / 2; d > 0; d /= 2) {
    m = merge::lse_max(m, __shfl_xor_sync(group, m, d));
  }
  float total = 0.f;
  float acc[kCombineVector] = {};
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    if (lane + k * lanes < p.splits) {
      const float w = merge::state_weight(lse[k], m);
      total += w;
      if (w != 0.f) {  // a weightless split's state is never used
        const float x[kCombineVector] = {lo[k].x, lo[k].y, lo[k].z, lo[k].w,
                                         hi[k].x, hi[k].y, hi[k].z, hi[k].w};
#pragma unroll
        for (int e = 0; e < kCombineVector; ++e) {
          acc[e] += w * x[e];
        }
      }
    }
  }
  for (int d = lanes / 2; d > 0; d /= 2) {
    total += __shfl_xor_sync(group, total, d);
#pragma unroll
    for (int e = 0; e < kCombineVector; ++e) {
      acc[e] += __shfl_xor_sync(group, acc[e], d);
    }
  }
  if (lane != 0) {
    return;
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
        shape_(CombineShape::make(splits, a.head_dim)),
        scratch_(sizeof(float) * size_t(splits) * size_t(rows_) * size_t(a.head_dim + 1), stream),
        lse_(scratch_.floats() + int64_t(splits) * rows_ * a.head_dim) {
    // Checked before the split kernel's launch: the planner never exceeds these.
    if (splits > kCombineMaxSplits || a.head_dim % kCombineVector != 0 ||
        a.head_dim > kMaxHeadDim || (rows_ + shape_.rows - 1) / shape_.rows > INT32_MAX) {
      throw detail::Failure(Code::Launch, "",
                            "split-KV combine: " + std::to_string(splits) + " splits of " +
                                std::to_string(rows_) + " rows of head dim " +
                                std::to_string(a.head_dim) + " (at most " +
                                std::to_string(kCombineMaxSplits) + " splits, head dim a multiple "
                                "of 8 up to " + std::to_string(kMaxHeadDim) + ")");
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
    if (shape_.slots == 4) {
      launch<combine_kernel<T, 4, Rows>>(c, shape_, stream, programmatic, map);
    } else {
      launch<combine_kernel<T, 2, Rows>>(c, shape_, stream, programmatic, map);
    }
  }

 private:
  // A programmatic launch asks for the shared memory that spreads its blocks over the SMs
  // (programmatic.h's spread_smem_bytes), the kernel opted in to a block's largest.
  template <auto kernel, class Rows>
  static void launch(const CombineParams& c, const CombineShape& shape, cudaStream_t stream,
                     bool programmatic, const Rows& map) {
    const int64_t blocks = (c.rows + shape.rows - 1) / shape.rows;
    const int threads = shape.threads(c.head_dim);
    int smem = 0;
    if (programmatic) {
      const DeviceLimits& device = device_limits();
      smem = spread_smem_bytes(blocks, threads, device);
      if (smem > 0) {
        ensure_smem_limit<kernel>(device.smem_per_block_optin);
      }
    }
    launch_programmatic(kernel, dim3(static_cast<unsigned>(blocks)),
                        dim3(static_cast<unsigned>(threads)), size_t(smem), stream, programmatic,
                        "launch the split-KV combine kernel", c, shape, map);
  }

  int32_t splits_;
  int64_t rows_;
  CombineShape shape_;  // how the combine's threads cover the rows
  detail::Scratch scratch_;
  float* lse_;
};

}  // namespace flashcore::split
