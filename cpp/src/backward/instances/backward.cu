// The backward kernels for f16 and bf16, one per row of core::kBackwardTiles, and their
// launcher (one translation unit): see ../kernel.cuh and ../wide.cuh.
#include <algorithm>
#include <string>
#include <utility>

#include "backward/wide.cuh"
#include "check.h"
#include "scratch.h"

namespace flashcore {
namespace {

// Row TILE's kernels on `a`: the row sums, the key-block kernel of the row, dQ's conversion.
template <typename T, int TILE>
void launch_tile(const BackwardLaunch& a, cudaStream_t stream) {
  using namespace backward;
  constexpr BackwardTileRow kRow = core::kBackwardTiles[TILE];
  constexpr int D = kRow.max_head_dim;
  // The logsumexp's rows ([batch, heads_q, seq_q]; a variable-length batch's [heads_q, total_q]):
  // dQ's f32 accumulator (D floats per row), and the row sums D_i after it.
  const int64_t rows = a.cu_q != nullptr ? int64_t(a.heads_q) * a.total_q
                                         : int64_t(a.batch) * a.heads_q * a.seq_q;
  detail::Scratch scratch(size_t(rows) * (D + 1) * sizeof(float), stream);
  float* dq_acc = scratch.floats();
  float* sums = dq_acc + rows * D;
  if (rows > 0) {
    const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
    row_sums<T, D><<<blocks, kThreads, 0, stream>>>(a, sums, dq_acc);
    check_cuda(cudaGetLastError(), "launch backward row_sums");
  }
  // One block per (key block, sequence, kv head) on x (plan_backward bounds the count; the kernel
  // picks their order).
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
  if (rows > 0) {
    const int64_t work = (rows * a.head_dim + kThreads - 1) / kThreads;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(work, int64_t{1} << 20));
    convert<T, D><<<blocks, kThreads, 0, stream>>>(a, dq_acc);
    check_cuda(cudaGetLastError(), "launch backward convert");
  }
}

// Row a.tile's kernels (a row index the launch checked).
template <typename T, int... TILES>
void launch_typed(const BackwardLaunch& a, cudaStream_t stream,
                  std::integer_sequence<int, TILES...>) {
  ((a.tile == TILES ? launch_tile<T, TILES>(a, stream) : void()), ...);
}

}  // namespace

void launch_backward(const BackwardLaunch& a, cudaStream_t stream) {
  if (a.batch == 0 || a.heads_kv == 0 || a.seq_k == 0) {
    return;  // no gradient element (seq_k = 0 with queries was refused by validation)
  }
  if (a.tile < 0 || a.tile >= core::kBackwardTileCount ||
      core::kBackwardTiles[a.tile].max_head_dim != core::backward_tier(a.head_dim)) {
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
