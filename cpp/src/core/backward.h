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

// The GPU backward pass (cpp/src/backward/): its largest head dim and its head-dim tiers (a
// kernel's D: columns past the head dim are zero).
constexpr int64_t kBackwardMaxHeadDim = 256;
constexpr int64_t backward_tier(int64_t head_dim) {
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}
// The narrow key-block kernel's (backward/kernel.cuh) warps per block (also the row-sum
// kernel's), key block and query step.
constexpr int64_t kBackwardWarps = 4, kBackwardKeys = 16 * kBackwardWarps, kBackwardRows = 32;
// What both key-block kernels hold at head-dim tier d (2-byte elements; rows padded by 8):
// `keys` rows of K and of V, and `buffers` step buffers of `rows` rows of Q and dO with the
// step's logsumexps and row sums (f32); each kernel adds its own score buffers.
constexpr int64_t key_block_smem_bytes(int64_t keys, int64_t rows, int64_t d, int64_t buffers) {
  return 2 * keys * (d + 8) * 2 + buffers * (2 * rows * (d + 8) * 2 + 2 * rows * 4);
}

// The Hopper kernel's (backward/sm90/kernel.cuh): K and V, `buffers` stages of Q and dO,
// unpadded (swizzled), two buffers of dS (rows x keys) and of the step's row statistics (two
// f32 per row), and 1 KB for its barriers (the layout's 1024-byte alignment).
constexpr int64_t hopper_key_block_smem_bytes(int64_t keys, int64_t rows, int64_t d,
                                              int64_t buffers) {
  return 2 * keys * d * 2 + buffers * 2 * rows * d * 2 + 2 * rows * keys * 2 + 2 * 2 * rows * 4 +
         1024;
}

// A row of the backward tile table (flashcore/plan.h: BackwardTileRow), its shared memory
// computed: K, V and the step buffers, plus the narrow kernel's dS^T (keys x rows) or the wide
// kernel's P and dS (rows x keys each); the Hopper kernel's layout.
constexpr BackwardTileRow backward_row(BackwardKernel kernel, int32_t tier, int32_t warps,
                                       int32_t keys, int32_t rows, int32_t buffers,
                                       const char* reason) {
  const int64_t scores = kernel == BackwardKernel::Narrow ? int64_t(keys) * (rows + 8) * 2
                                                          : 2 * int64_t(rows) * (keys + 8) * 2;
  return {kernel,  tier,
          warps,   keys,
          rows,    buffers,
          kernel == BackwardKernel::Hopper
              ? hopper_key_block_smem_bytes(keys, rows, tier, buffers)
              : key_block_smem_bytes(keys, rows, tier, buffers) + scores,
          reason};
}

// The backward tile table: one row per key-block kernel instance (the launcher instantiates
// each by its index), each tier's rows from the largest shared memory down. plan_backward runs
// the first row of the problem's tier whose shared memory fits.
inline constexpr BackwardTileRow kBackwardTiles[] = {
    backward_row(BackwardKernel::Hopper, 64, 12, 128, 64, 2,
                 "H100 / H200, the calls it covers whose grid fills the GPU (or forced): "
                 "1.08x the wide row on 8x16x2048x64 causal (H200, calls 268-269)"),
    backward_row(BackwardKernel::Wide, 64, 8, 128, 64, 2,
                 "H100 / H200, A100: 1.02x narrow on 8x16x2048x64 causal (H200, call 263)"),
    backward_row(BackwardKernel::Narrow, 64, kBackwardWarps, kBackwardKeys, kBackwardRows, 2,
                 "L4: fits its 99 KB"),
    backward_row(BackwardKernel::Hopper, 128, 12, 128, 64, 2,
                 "H100 / H200, the calls it covers whose grid fills the GPU (or forced): "
                 "1.12-1.25x the wide row at d = 128 (H200, calls 268-269)"),
    backward_row(BackwardKernel::Wide, 128, 8, 128, 64, 2,
                 "H100 / H200: 1.15-1.22x narrow at 4x16x2048x128 (H200, call 263)"),
    backward_row(BackwardKernel::Narrow, 128, kBackwardWarps, kBackwardKeys, kBackwardRows, 2,
                 "A100, L4: fits their 163 / 99 KB"),
    backward_row(BackwardKernel::Wide, 256, 8, 64, 64, 2,
                 "H100 / H200: 1.09x row 5 at 4x16x2048x256 causal (H200, call 263)"),
    backward_row(BackwardKernel::Wide, 256, 8, 64, 32, 2,
                 "A100: fits its 163 KB; 1.19x row 6 (H200, call 263)"),
    backward_row(BackwardKernel::Wide, 256, 4, 32, 32, 1,
                 "L4: fits its 99 KB (4 warps, one step buffer)"),
};
constexpr int kBackwardTileCount = int(sizeof(kBackwardTiles) / sizeof(kBackwardTiles[0]));

// Whether the Hopper key-block kernel covers the validated problem `p` of `r` (a dense batch
// without a softcap, ALiBi or bias, a head dim of at most 128 in multiples of 8, q, k, v and
// dout 16-byte aligned with strides in multiples of 8 elements) on a device with `caps`
// (compute capability 9.0, a build with the Hopper family, no forced class but Sm90); OK, or
// BackendUnavailable saying why not.
Status hopper_backward_covers(const BackwardRequest& r, const Problem& p,
                              const DeviceCaps& caps) noexcept;

// Whether the GPU backward kernels take the validated problem `p` of `r` on a device with `caps`:
// the backend (Wmma: the WMMA rows; CutlassSm90: the Hopper rows, where the kernel covers the
// call, else BackendUnavailable; Auto: the Hopper rows for the calls the kernel covers whose
// grid has a block per SM, else the WMMA rows; CutlassSm80 is
// BackendUnavailable), the device (compute
// capability 8.0 or later), shared memory (a row of the head dim's tier that takes the call and
// fits the device and r.forward.options.force_arch_class's class, when one is forced, else
// SharedMemoryExceeded with the smallest need of those rows), and the grid's limits
// (IndexOverflow). `*tile` (when not null): the row of kBackwardTiles that runs.
Status plan_backward(const BackwardRequest& r, const Problem& p, const DeviceCaps& caps,
                     int* tile = nullptr) noexcept;

}  // namespace flashcore::core
