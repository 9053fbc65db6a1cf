// Launcher for flashcore's WMMA kernel (kernel.cuh): FmhaArgs -> Params, grid, shared memory;
// with key splits (FmhaArgs::splits), the workspace and the combine kernel (split/combine.cuh).
//
// Each file in instances/ (one per dtype) instantiates `launch_wmma<T, BR, BC, D>` for every
// tile of instances.inc and checks that the table's shared-memory figure matches.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "../check.h"
#include "../scratch.h"
#include "../smem.h"
#include "../launcher.h"
#include "kernel.cuh"
#include "split/combine.cuh"

namespace flashcore::wmma_fa {

// Enqueues the plain or the score-modifier instantiation of a tile (the same tile, warps and
// shared memory) and checks the launch.
template <typename T, int BR, int BC, int D, bool kMods>
void enqueue(dim3 grid, const Params& p, cudaStream_t stream, const char* what) {
  using C = Config<T, BR, BC, D>;
  constexpr auto kernel = fmha_wmma_kernel<T, BR, BC, D, kMods>;
  const int smem_bytes = static_cast<int>(C::kSmemBytes);
  ensure_smem_limit<kernel>(smem_bytes);
  kernel<<<grid, C::kThreads, smem_bytes, stream>>>(p);
  check_cuda(cudaGetLastError(), what);
}

template <typename T, int BR, int BC, int D>
void launch_wmma(const FmhaArgs& a, cudaStream_t stream) {
  using C = Config<T, BR, BC, D>;
  Params p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.out = a.out;
  p.lse = a.lse;
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = a.q_stride[i];
    p.k_stride[i] = a.k_stride[i];
    p.v_stride[i] = a.v_stride[i];
    p.o_stride[i] = a.o_stride[i];
  }
  p.q_token_stride = a.q_stride[1];
  p.o_token_stride = a.o_stride[1];
  p.seq_q = static_cast<int32_t>(a.seq_q);
  p.seq_k = static_cast<int32_t>(a.seq_k);
  p.head_dim = static_cast<int32_t>(a.head_dim);
  p.group = static_cast<int32_t>(a.heads_q / a.heads_kv);
  int64_t heads = a.heads_q;  // the grid's heads
  if (a.packed_group > 0) {  // a kv head per block, its rows the group's query heads
    p.packed_rows = a.packed_group;
    pack_head_rows(p.q_stride, a.packed_group);
    pack_head_rows(p.o_stride, a.packed_group);
    p.seq_q = a.packed_group;
    p.group = 1;
    heads = a.heads_kv;
  }
  // A window's sides are below INT32_MAX / 4 (the planner's limit). Without a causal mask its
  // band follows the bottom-right diagonal, and its upper side (if any) is the causal limit
  // moved right by window_right; a causal mask bounds the upper side at the diagonal itself.
  // ALiBi's distances follow the same diagonal.
  const bool window = windowed(a);
  const bool alibi = a.alibi_slopes != nullptr;
  const bool upper_window = a.causal == Causal::None && a.window_right >= 0;
  p.causal = a.causal != Causal::None || upper_window;
  p.bottom_right =
      a.causal == Causal::BottomRight || (a.causal == Causal::None && (window || alibi));
  p.window_right = upper_window ? static_cast<int32_t>(a.window_right) : 0;
  p.window_left = static_cast<int32_t>(a.window_left);
  // With a softcap, ALiBi or a bias the kernel's modifier pass forms the exponents in log2 units
  // (cap * log2(e) * tanh(scale s / cap), or scale * log2(e) * s, minus ALiBi's, plus the bias
  // times log2(e)), so the softmax's factor is 1. (scale / cap may underflow to 0: every score
  // is then 0, the limit; cap * log2(e) is kept finite.)
  constexpr float kLog2e = 1.4426950408889634f;
  p.softcap_in = a.softcap > 0.0f ? 2.0f * kLog2e * (a.scale / a.softcap) : 0.0f;
  p.softcap_out = a.softcap > 0.0f ? std::fmin(a.softcap * kLog2e, FLT_MAX) : 0.0f;
  p.prescale = std::fmax(a.scale * kLog2e, FLT_MIN);
  p.alibi = a.alibi_slopes;
  p.alibi_batch_stride = a.alibi_batch_stride;
  const bool biased = a.bias != nullptr;
  p.bias = a.bias;
  p.bias_type = static_cast<int32_t>(a.bias_type);
  // Extents are sequence lengths, which the planner keeps within int32.
  p.bias_rows = static_cast<int32_t>(a.bias_rows);
  p.bias_keys = static_cast<int32_t>(a.bias_keys);
  for (int i = 0; i < 4; ++i) {
    p.bias_stride[i] = a.bias_stride[i];
  }
  p.cu_q = a.cu_seqlens_q;
  p.cu_k = a.cu_seqlens_k;
  p.total_q = static_cast<int32_t>(a.total_q);  // planned: at most INT32_MAX
  p.total_k = static_cast<int32_t>(a.total_k);
  if (a.block_table != nullptr) {  // page sizes are powers of two (validated)
    p.block_table = a.block_table;
    p.seqlens_k = a.seqlens_k;
    const PageBounds bounds = page_bounds(a);
    p.page_shift = bounds.shift;
    p.pages_per_seq = bounds.pages_per_seq;
    p.last_page = bounds.last_page;
  }
  // The scale is positive (validated); a subnormal one becomes the smallest normal float, so that
  // -inf * scale stays -inf for masked keys (exp2 of |s| * 2^-126 rounds to 1 either way).
  const bool log2_scores = a.softcap > 0.0f || alibi || biased;
  p.scale_log2 = log2_scores ? 1.0f : std::fmax(a.scale * kLog2e, FLT_MIN);
  if (a.head_dim > D || a.head_dim % 8 != 0) {
    throw detail::Failure(Code::Launch, "",
                "wmma kernel: head dim " + std::to_string(a.head_dim) + " is not a multiple of 8 "
                "up to " + std::to_string(D));
  }

  // Keys per split, whole key tiles. Every sequence gets the longest's count of splits (grid
  // x); with per-sequence splits a shorter one's later splits hold no key: they write the
  // weightless state (output 0, logsumexp -inf) and free their SM at once.
  const split::KeySplits splits = split::key_splits(a, BC);
  p.split_keys = static_cast<int32_t>(splits.keys);
  p.splits = splits.count;

  const int64_t m_blocks = (p.seq_q + BR - 1) / BR;
  const dim3 grid(static_cast<unsigned>(m_blocks * p.splits), static_cast<unsigned>(heads),
                  static_cast<unsigned>(a.batch));
  // Problems with a score modifier run the instantiation that applies them.
  const bool mods = a.softcap > 0.0f || window || alibi || biased;
  const auto enqueue_attention = [&](const char* what) {
    if (mods) {
      enqueue<T, BR, BC, D, true>(grid, p, stream, what);
    } else {
      enqueue<T, BR, BC, D, false>(grid, p, stream, what);
    }
  };
  if (p.splits == 1) {
    enqueue_attention("launch fmha_wmma_kernel");
    return;
  }
  const split::Partials parts(a, p.splits, stream);
  p.part_out = parts.out();
  p.part_lse = parts.lse();
  p.part_rows = parts.rows();
  enqueue_attention("launch fmha_wmma_kernel (split keys)");
  parts.combine<T>(a, stream);
}

}  // namespace flashcore::wmma_fa

// The explicit instantiation per tile in each file of instances/: TAG is the DType, the symbol is
// fmha_wmma_<TAG>_q<BR>_k<BC>_d<D> (declared by dispatch.cpp from instances.inc). The tables'
// shared-memory figure (wmma_smem_bytes) must be what the kernel's layout takes.
#define FLASHCORE_WMMA_INSTANCE(T, TAG, BR, BC, D)                                              \
  static_assert(flashcore::wmma_fa::Config<T, BR, BC, D>::kSmemBytes ==                          \
                    flashcore::wmma_smem_bytes(flashcore::Tile{BR, BC, D}),                      \
                "flashcore/plan.h wmma_smem_bytes disagrees with cpp/src/wmma/kernel.cuh");     \
  namespace flashcore::wmma_fa {                                                                \
  void fmha_wmma_##TAG##_q##BR##_k##BC##_d##D(const FmhaArgs& args, cudaStream_t stream) {      \
    launch_wmma<T, BR, BC, D>(args, stream);                                                    \
  }                                                                                             \
  }
