// Launcher for CUTLASS example 41's AttentionKernel (the `Sm80` tag serves compute capability
// 8.0 to 9.x) with flashcore's tile and our own block placement.
//
// Each file in instances/ (one per dtype x tile of instances.inc) instantiates
// `launch_sm80<T, Q, K, D>` once, so nvcc's cost stays one kernel per TU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../check.h"
#include "../scratch.h"
#include "../smem.h"
#include "../launcher.h"
#include "kernel_forward.h"  // CUTLASS examples/41_fused_multi_head_attention

namespace flashcore::sm80 {

// Where one (batch, head) block reads and writes, beyond what example 41's
// `Params::advance_to_block` can express: 64-bit batch strides, any output strides, and the
// GQA/MQA mapping of query head h to key/value head h / group.
struct Placement {
  int64_t q_batch, k_batch, v_batch, o_batch;  // batch strides
  int64_t k_head, v_head, o_head;              // true head strides of K, V, out
  int32_t group;                               // query heads per key/value head
};

// `advance_to_block` adds `h * strideH` to K and V and `b * Sq * o_strideM + h * Dv` to the
// output, and nothing per batch for Q/K/V (their batch strides are passed as 0). We shift each
// base pointer first so that those sums land on our layout. The shift is integer arithmetic on
// the address; the pointer the kernel dereferences is always inside the caller's tensor.
template <typename AK>
__global__ void __launch_bounds__(AK::kNumThreads, AK::kMinBlocksPerSm)
    fmha_sm80_kernel(typename AK::Params p, Placement pl) {
  const int64_t b = blockIdx.z;
  const int64_t h = blockIdx.y;
  const int64_t kvh = h / pl.group;
  p.query_ptr += b * pl.q_batch;
  p.key_ptr += b * pl.k_batch + kvh * pl.k_head - h * int64_t(p.k_strideH);
  p.value_ptr += b * pl.v_batch + kvh * pl.v_head - h * int64_t(p.v_strideH);
  p.output_ptr += b * pl.o_batch + h * pl.o_head - b * int64_t(p.num_queries) * p.o_strideM -
                  h * int64_t(p.head_dim_value);
  if (!p.advance_to_block()) {
    return;
  }
  AK::attention_kernel(p);
}

template <typename T, int Q, int K, int D>
void launch_sm80(const FmhaArgs& a, cudaStream_t stream) {
  // aligned (16-byte) loads; no dropout; no bias.
  using AK = AttentionKernel<T, cutlass::arch::Sm80, true, Q, K, D, false, false>;
  // A nonzero head stride keeps advance_to_block off its one-query MQA shortcut, which
  // assumes a contiguous BSHD output; the kernel uses strideH nowhere else.
  constexpr int32_t kHeadStrideGuard = AK::kAlignmentK;

  typename AK::Params p;
  p.query_ptr = static_cast<T*>(const_cast<void*>(a.q));
  p.key_ptr = static_cast<T*>(const_cast<void*>(a.k));
  p.value_ptr = static_cast<T*>(const_cast<void*>(a.v));
  p.output_ptr = static_cast<T*>(a.out);
  p.scale = a.scale;
  p.head_dim = static_cast<int32_t>(a.head_dim);
  p.head_dim_value = static_cast<int32_t>(a.head_dim);
  p.num_queries = static_cast<int32_t>(a.seq_q);
  p.num_keys = static_cast<int32_t>(a.seq_k);
  p.num_batches = static_cast<int32_t>(a.batch);
  p.num_heads = static_cast<int32_t>(a.heads_q);
  p.custom_mask_type = static_cast<uint8_t>(a.causal == Causal::TopLeft       ? AK::CausalFromTopLeft
                                            : a.causal == Causal::BottomRight ? AK::CausalFromBottomRight
                                                                              : AK::NoCustomMask);
  p.q_strideM = static_cast<int32_t>(a.q_stride[1]);
  p.k_strideM = static_cast<int32_t>(a.k_stride[1]);
  p.v_strideM = static_cast<int32_t>(a.v_stride[1]);
  p.o_strideM = static_cast<int32_t>(a.o_stride[1]);
  p.q_strideH = static_cast<int32_t>(a.q_stride[2]);
  p.k_strideH = a.k_stride[2] != 0 ? static_cast<int32_t>(a.k_stride[2]) : kHeadStrideGuard;
  p.v_strideH = a.v_stride[2] != 0 ? static_cast<int32_t>(a.v_stride[2]) : kHeadStrideGuard;
  p.q_strideB = 0;
  p.k_strideB = 0;
  p.v_strideB = 0;

  const Placement pl{a.q_stride[0], a.k_stride[0], a.v_stride[0], a.o_stride[0],
                     a.k_stride[2], a.v_stride[2], a.o_stride[2],
                     static_cast<int32_t>(a.heads_q / a.heads_kv)};

  // Scratch: the f32 output accumulator (d > keys per block), and the kernel's LSE, whose rows are
  // padded to a multiple of 32 (padding written with +inf) before being copied out dense.
  const int64_t rows = a.batch * a.seq_q * a.heads_q;
  detail::Scratch accum(AK::kNeedsOutputAccumulatorBuffer ? size_t(rows * a.head_dim) * sizeof(float) : 0,
                      stream);
  const int64_t lse_dim = (a.seq_q + AK::kAlignLSE - 1) / AK::kAlignLSE * AK::kAlignLSE;
  detail::Scratch lse(a.lse != nullptr ? size_t(a.batch * a.heads_q * lse_dim) * sizeof(float) : 0,
                    stream);
  p.output_accum_ptr = accum.floats();
  p.logsumexp_ptr = lse.floats();

  if (!AK::check_supported(p)) {
    throw detail::Failure(Code::Launch, "",
                          "CUTLASS AttentionKernel::check_supported rejected the arguments");
  }
  constexpr auto kernel = fmha_sm80_kernel<AK>;
  const int smem_bytes = int(sizeof(typename AK::SharedStorage));
  ensure_smem_limit<kernel>(smem_bytes);
  kernel<<<p.getBlocksGrid(), p.getThreadsGrid(), smem_bytes, stream>>>(p, pl);
  check_cuda(cudaGetLastError(), "launch fmha_sm80_kernel");
  if (a.lse != nullptr) {
    check_cuda(cudaMemcpy2DAsync(a.lse, size_t(a.seq_q) * sizeof(float), lse.floats(),
                                 size_t(lse_dim) * sizeof(float), size_t(a.seq_q) * sizeof(float),
                                 size_t(a.batch * a.heads_q), cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpy2DAsync(logsumexp)");
  }
}

}  // namespace flashcore::sm80

// The explicit instantiation in each file of instances/: TAG is the DType, the symbol is
// fmha_sm80_<TAG>_q<Q>_k<K>_d<D> (declared by dispatch.cpp from instances.inc).
#define FLASHCORE_SM80_INSTANCE(T, TAG, Q, K, D)                                           \
  namespace flashcore::sm80 {                                                              \
  void fmha_sm80_##TAG##_q##Q##_k##K##_d##D(const FmhaArgs& args, cudaStream_t stream) {   \
    launch_sm80<T, Q, K, D>(args, stream);                                                 \
  }                                                                                        \
  }
