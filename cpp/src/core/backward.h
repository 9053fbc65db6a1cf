// Validation of the backward pass (host-only): the gradients of attention's output with respect
// to Q, K and V, from the forward call's operands, its output and logsumexp, and the incoming
// gradient of the output. The Rust crate calls it before anything runs (src/backward.rs).
#pragma once

#include "core/validate.h"

namespace flashcore::core {

// One backward call. `forward` describes the forward call as it ran: Q, K, V, its output `out`
// and its logsumexp `lse` (required: has_lse is ignored), its options. `dout` is the gradient
// of the output (shaped like out); dq, dk and dv receive the gradients of Q, K and V (shaped
// like them).
struct BackwardRequest {
  Request forward;
  TensorDesc dout, dq, dk, dv;
};

// Checks `r` and describes its problem in `*problem`: first every rule of validate() on the
// forward call with its logsumexp; then the gradients' extents, locations, shapes, strides and
// alignment (dout, dq, dk, dv in this order); then that no gradient output overlaps itself,
// another gradient output or any input (q, k, v, out, lse, dout, bias). A paged cache is
// BackendUnavailable: the backward pass takes dense and variable-length batches.
Status validate_backward(const BackwardRequest& r, Problem* problem) noexcept;

// The GPU backward pass (cpp/src/backward/): its largest head dim, its head-dim tier (the
// kernels' D: columns past the head dim are zero), its warps per block, key block and query
// step, and the shared memory of its key-block kernel (2-byte elements; rows padded by 8).
constexpr int64_t kBackwardMaxHeadDim = 128;
constexpr int64_t kBackwardWarps = 4, kBackwardKeys = 16 * kBackwardWarps, kBackwardRows = 32;
constexpr int64_t backward_tier(int64_t head_dim) { return head_dim <= 64 ? 64 : 128; }
// What both key-block kernels hold at head-dim tier d (2-byte elements; rows padded by 8):
// `keys` rows of K and of V, and two step buffers of `rows` rows of Q and dO with the step's
// logsumexps and row sums (f32); each kernel adds its own score buffers.
constexpr int64_t key_block_smem_bytes(int64_t keys, int64_t rows, int64_t d) {
  return 2 * keys * (d + 8) * 2 + 2 * (2 * rows * (d + 8) * 2 + 2 * rows * 4);
}
// The narrow kernel's: plus dS^T (backward/kernel.cuh: Smem).
constexpr int64_t backward_smem_bytes(int64_t head_dim) {
  return key_block_smem_bytes(kBackwardKeys, kBackwardRows, backward_tier(head_dim)) +
         kBackwardKeys * (kBackwardRows + 8) * 2;
}

// The wide key-block kernel (backward/wide.cuh: FlashAttention-2's tiling): its warps per
// block, key block and query step, and its shared memory: plus P and dS (backward/wide.cuh:
// Smem).
constexpr int64_t kWideWarps = 8, kWideKeys = 128, kWideRows = 64;
constexpr int64_t wide_smem_bytes(int64_t head_dim) {
  return key_block_smem_bytes(kWideKeys, kWideRows, backward_tier(head_dim)) +
         2 * kWideRows * (kWideKeys + 8) * 2;
}

// Whether the GPU backward kernels take the validated problem `p` of `r` on a device with `caps`:
// the backend (Auto or Wmma; another forced family is BackendUnavailable), the device (compute
// capability 8.0 or later), the head dim (at most kBackwardMaxHeadDim: BackendUnavailable),
// shared memory, and the grid's limits (IndexOverflow). `*wide` (when not null): whether the
// wide kernel runs (its shared memory fits the device and r.options.force_arch_class's class,
// when one is forced), else the narrow one.
Status plan_backward(const Request& r, const Problem& p, const DeviceCaps& caps,
                     bool* wide = nullptr) noexcept;

}  // namespace flashcore::core
