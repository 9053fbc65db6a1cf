// The Hopper backward pass's launcher (one instance per dtype and head-dim tier in
// instances/): the row sums, the key-block kernel of kernel.cuh, dQ's conversion
// (../passes.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "backward/passes.cuh"
#include "backward/sm90/kernel.cuh"
#include "check.h"

namespace flashcore {

// Enqueues the backward pass of `a` (whose dtype is kType) on the Hopper kernel at head-dim tier
// D. core::plan_backward chose the kernel, so `a` is a dense batch with queries, without score
// modifiers, whose operands meet TMA's alignment.
template <DType kType, int D>
void launch_backward_sm90(const BackwardLaunch& a, cudaStream_t stream) {
  using namespace backward::sm90;
  constexpr bool kF16 = kType == DType::F16;
  using T = std::conditional_t<kF16, cutlass::half_t, cutlass::bfloat16_t>;
  using Cuda = std::conditional_t<kF16, __half, __nv_bfloat16>;
  using C = Config<T, D>;
  backward::run_passes<Cuda, D>(a, stream, [&](const float* sums, float* dq_acc) {
    using cute::_;
    const auto view = [&](const void* base, const int64_t(&stride)[3], int tokens, int heads) {
      return tma_view<T>(base, stride, tokens, a.head_dim, a.batch, heads);
    };
    const auto rows = typename C::LayoutQ{}(_, _, cute::_0{});
    const auto keys = typename C::LayoutKV{}(_, _, cute::_0{});
    const Params<T, D> params{
        a,
        sums,
        dq_acc,
        cute::make_tma_copy(cute::SM90_TMA_LOAD{}, view(a.q, a.q_stride, a.seq_q, a.heads_q),
                            rows),
        cute::make_tma_copy(cute::SM90_TMA_LOAD{},
                            view(a.dout, a.do_stride, a.seq_q, a.heads_q), rows),
        cute::make_tma_copy(cute::SM90_TMA_LOAD{}, view(a.k, a.k_stride, a.seq_k, a.heads_kv),
                            keys),
        cute::make_tma_copy(cute::SM90_TMA_LOAD{}, view(a.v, a.v_stride, a.seq_k, a.heads_kv),
                            keys),
    };
    const auto kernel = key_block<T, D>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    C::kSmemBytes),
               "cudaFuncSetAttribute(backward sm90 key_block)");
    const int64_t blocks =
        (int64_t(a.seq_k) + C::kKeys - 1) / C::kKeys * a.batch * a.heads_kv;
    kernel<<<static_cast<unsigned>(blocks), C::kThreads, C::kSmemBytes, stream>>>(params);
    check_cuda(cudaGetLastError(), "launch backward sm90 key_block");
  });
}

}  // namespace flashcore
