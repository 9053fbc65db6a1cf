// The backward kernels' launch interface (internal): the gradients of attention with respect to
// Q, K and V. Reached only through cpp/src/backward.cpp, after validate_backward and
// plan_backward (cpp/src/core/backward.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashcore/types.h"

namespace flashcore {

// One backward launch. Strides in elements over (batch, seq, head); head dims contiguous. The
// logsumexp is dense [batch, heads_q, seq_q] (natural log, as the forward call wrote it).
struct BackwardLaunch {
  DType dtype;
  int32_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  const void *q, *k, *v, *out, *dout;
  const float* lse;
  void *dq, *dk, *dv;
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3], do_stride[3];
  int64_t dq_stride[3], dk_stride[3], dv_stride[3];
  float scale;    // positive and finite
  float softcap;  // 0: none
  // The mask of each sequence, from its diagonal (0 with top-left alignment, else seq_k -
  // seq_q, also without a causal mask): key j is visible to query row i when j - i <= diagonal
  // (causal) or <= diagonal + window_right, and j - i >= diagonal - window_left (a side of -1:
  // unbounded). ALiBi's distance is |i + diagonal - j|.
  bool causal, bottom_right;
  int64_t window_left, window_right;
  // A variable-length batch (null: dense): batch + 1 offsets into the token axis of the
  // batch-1 tensors, q, out, dout, dq (cu_q, total_q tokens) and k, v, dk, dv (cu_k, total_k),
  // clamped on read; batch counts its sequences, seq_q and seq_k are the longest ones'; the
  // logsumexp is [heads_q, total_q].
  const int32_t* cu_q;
  const int32_t* cu_k;
  int32_t total_q, total_k;
  const float* alibi;      // [batch or 1, heads_q] slopes (null: none)
  int64_t alibi_batch_stride;
  const void* bias;  // element [b, i, h, j] at the strides (0 on broadcast axes); null: none
  int32_t bias_type;  // 0 f16, 1 bf16, 2 f32
  int64_t bias_stride[4];
  int32_t tile;  // the row of core::kBackwardTiles that runs (core::plan_backward's choice)
};

// Whether `a` has a gradient element (dK and dV exist); without, nothing is launched
// (seq_k = 0 with queries was refused by validation).
inline bool has_gradients(const BackwardLaunch& a) {
  return a.batch > 0 && a.heads_kv > 0 && a.seq_k > 0;
}

// Enqueues the backward pass on `stream` (of the current device): the row sums D = rowsum(dO *
// O) and a zeroed f32 dQ accumulator in stream-ordered scratch memory, the key-block kernel
// (dK and dV written, dQ accumulated), then dQ converted. Throws detail::Failure.
void launch_backward(const BackwardLaunch& args, cudaStream_t stream);

// The same on the Hopper kernel (backward/sm90/: one instance per dtype, F16 or BF16, and
// head-dim tier, 64 or 128), for a row of BackwardKernel::Hopper. Built only with the Hopper
// family (FLASHCORE_WITH_SM90).
template <DType kType, int D>
void launch_backward_sm90(const BackwardLaunch& args, cudaStream_t stream);

}  // namespace flashcore
