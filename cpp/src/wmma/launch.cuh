// Launcher for flashcore's WMMA kernel (kernel.cuh): FmhaArgs -> Params, grid, shared memory.
//
// Each file in instances/ (one per dtype x tile of instances.inc) instantiates
// `launch_wmma<T, BR, BC, D>` once and checks that the table's shared-memory figure matches.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <string>

#include "../check.h"
#include "../smem.h"
#include "../launcher.h"
#include "kernel.cuh"

namespace flashcore::wmma_fa {

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
  p.seq_q = static_cast<int32_t>(a.seq_q);
  p.seq_k = static_cast<int32_t>(a.seq_k);
  p.head_dim = static_cast<int32_t>(a.head_dim);
  p.group = static_cast<int32_t>(a.heads_q / a.heads_kv);
  p.causal = a.causal != Causal::None;
  p.bottom_right = a.causal == Causal::BottomRight;
  p.cu_q = a.cu_seqlens_q;
  p.cu_k = a.cu_seqlens_k;
  p.total_q = static_cast<int32_t>(a.total_q);  // planned: at most INT32_MAX
  p.total_k = static_cast<int32_t>(a.total_k);
  // The scale is positive (validated); a subnormal one becomes the smallest normal float, so that
  // -inf * scale stays -inf for masked keys (exp2 of |s| * 2^-126 rounds to 1 either way).
  p.scale_log2 = std::fmax(a.scale * 1.4426950408889634f, FLT_MIN);
  if (a.head_dim > D || a.head_dim % 8 != 0) {
    throw detail::Failure(Code::Launch, "",
                "wmma kernel: head dim " + std::to_string(a.head_dim) + " is not a multiple of 8 "
                "up to " + std::to_string(D));
  }

  const dim3 grid(static_cast<unsigned>((a.seq_q + BR - 1) / BR), static_cast<unsigned>(a.heads_q),
                  static_cast<unsigned>(a.batch));
  constexpr auto kernel = fmha_wmma_kernel<T, BR, BC, D>;
  const int smem_bytes = static_cast<int>(C::kSmemBytes);
  ensure_smem_limit<kernel>(smem_bytes);
  kernel<<<grid, C::kThreads, smem_bytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "launch fmha_wmma_kernel");
}

}  // namespace flashcore::wmma_fa

// The explicit instantiation in each file of instances/: TAG is the DType, the symbol is
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
