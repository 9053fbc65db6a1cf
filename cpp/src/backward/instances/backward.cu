// The backward kernels for f16 and bf16, one per row of core::kBackwardTiles, and their
// launcher (one translation unit): see ../kernel.cuh and ../wide.cuh.
#include <algorithm>
#include <string>
#include <utility>

#include "backward/passes.cuh"
#include "backward/wide.cuh"
#include "check.h"

namespace flashcore {
namespace {

// Row TILE's passes on `a`, with the row's key-block kernel.
template <typename T, int TILE>
void launch_tile(const BackwardLaunch& a, cudaStream_t stream) {
  using namespace backward;
  constexpr int D = core::kBackwardTiles[TILE].max_head_dim;
  run_passes<T, D>(a, stream, [&](const float* sums, float* dq_acc) {
    constexpr const BackwardTileRow& kRow = core::kBackwardTiles[TILE];
    // One block per (key block, sequence, kv head) on x (plan_backward bounds the count; the
    // kernel picks their order).
    const auto key_blocks = [&](auto kernel, size_t smem, int threads) {
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)),
                 "cudaFuncSetAttribute(backward key_block)");
      const int64_t keys = kRow.keys_per_block;
      const int64_t blocks = (a.seq_k + keys - 1) / keys * a.batch * a.heads_kv;
      kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(a, sums, dq_acc);
      check_cuda(cudaGetLastError(), "launch backward key_block");
    };
    if constexpr (kRow.kernel == BackwardKernel::Wide) {
      key_blocks(wide::key_block<T, TILE>, wide::Smem<T, TILE>::kBytes,
                 wide::Tiling<TILE>::kThreads);
    } else {
      static_assert(kRow.warps == kWarps && kRow.keys_per_block == kKeys &&
                        kRow.rows_per_step == kRows,
                    "the narrow kernel's row");
      key_blocks(key_block<T, D>, Smem<T, D>::kBytes, kThreads);
    }
  });
}

// Row TILE's passes where it is a WMMA row (launch_backward refuses the Hopper rows, which
// backward.cpp runs: ../sm90/launch.cuh).
template <typename T, int TILE>
void launch_wmma_tile(const BackwardLaunch& a, cudaStream_t stream) {
  if constexpr (core::kBackwardTiles[TILE].kernel != BackwardKernel::Hopper) {
    launch_tile<T, TILE>(a, stream);
  }
}

// Row a.tile's kernels (a row index the launch checked).
template <typename T, int... TILES>
void launch_typed(const BackwardLaunch& a, cudaStream_t stream,
                  std::integer_sequence<int, TILES...>) {
  ((a.tile == TILES ? launch_wmma_tile<T, TILES>(a, stream) : void()), ...);
}

}  // namespace

void launch_backward(const BackwardLaunch& a, cudaStream_t stream) {
  if (!has_gradients(a)) {
    return;
  }
  if (a.tile < 0 || a.tile >= core::kBackwardTileCount ||
      core::kBackwardTiles[a.tile].max_head_dim != core::backward_tier(a.head_dim) ||
      core::kBackwardTiles[a.tile].kernel == BackwardKernel::Hopper) {
    throw detail::Failure(Code::Launch, "",
                          "backward: tile row " + std::to_string(a.tile) + " for head dim " +
                              std::to_string(a.head_dim));
  }
  constexpr auto kRows = std::make_integer_sequence<int, core::kBackwardTileCount>();
  if (a.dtype == DType::F16) {
    launch_typed<__half>(a, stream, kRows);
  } else {
    launch_typed<__nv_bfloat16>(a, stream, kRows);
  }
}

}  // namespace flashcore
