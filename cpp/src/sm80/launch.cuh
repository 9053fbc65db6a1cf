// Launcher for CUTLASS example 41's AttentionKernel (the `Sm80` tag serves compute capability
// 8.0 to 9.x) with flashcore's tile and our own block placement: dense batches and
// variable-length ones (not paged caches, not key splits: the planner gives those to the other
// families).
//
// Each file in instances/ (one per dtype) instantiates `launch_sm80<T, Q, K, D>` for every tile
// of instances.inc: one parse of CUTLASS's headers serves the dtype's five kernels (a clean build
// on 2 cores compiles them in about 45 s per dtype, against about 110 s one kernel per file).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../check.h"
#include "../scratch.h"
#include "../smem.h"
#include "../launcher.h"
#include "../sequences.cuh"
#include "kernel_forward.h"  // CUTLASS examples/41_fused_multi_head_attention

namespace flashcore::sm80 {

// Where one (batch, head) block reads and writes, beyond what example 41's
// `Params::advance_to_block` can express: 64-bit batch strides, any output strides, the GQA/MQA
// mapping of query head h to key/value head h / group, and the sequences of a variable-length
// batch (read from device memory and clamped: sequences.cuh).
struct Placement {
  int64_t q_batch, k_batch, v_batch, o_batch;  // batch strides (0 for a variable-length batch)
  int64_t k_head, v_head, o_head;              // true head strides of K, V, out
  int32_t group;                               // query heads per key/value head
  // The scratch rows of a (batch, head): the logsumexp's (accum_rows rounded up to kAlignLSE)
  // and the f32 accumulator's (the longest sequence's rows, as planned).
  int32_t lse_rows, accum_rows;
  // A variable-length batch (FmhaArgs::cu_seqlens_q / _k; null for a dense one): offsets into
  // total_q and total_k tokens, Q's and out's token strides, and, for one-query GQA heads packed
  // into rows (FmhaArgs::packed_group), the rows of a sequence that has its query (0: unpacked).
  const int32_t* cu_q = nullptr;
  const int32_t* cu_k = nullptr;
  int32_t total_q = 0, total_k = 0;
  int64_t q_token = 0, o_token = 0;
  int32_t packed_rows = 0;
};

// The rows (queries, or packed heads) of sequence `b` of a variable-length batch, at most
// accum_rows (the longest sequence's, as planned: the scratch holds no more, and the rows of
// offsets that break the contract past it stay unwritten), and its first query and key tokens.
struct SequenceRows {
  int32_t rows, q0, k0, keys;
};
__device__ inline SequenceRows sequence_of(const Placement& pl, int64_t b) {
  const TokenRange q = token_range(pl.cu_q, b, pl.total_q);
  const TokenRange k = token_range(pl.cu_k, b, pl.total_k);
  return {::min(sequence_rows(q, pl.packed_rows), pl.accum_rows), q.begin, key_base(k),
          k.end - k.begin};
}

// `advance_to_block` adds `h * strideH` to K and V, `b * Sq * o_strideM + h * Dv` to the
// output, `(b * Sq) * Dv * heads` to the accumulator and `(b * heads + h) * lse_dim` (lse_dim:
// Sq rounded up to kAlignLSE) to the logsumexp, and nothing per batch for Q/K/V (their batch
// strides are passed as 0). We shift each base pointer first so that those sums land on our
// layout; a variable-length batch's block first takes its sequence's Sq and Sk and shifts the
// pointers to its first tokens. The shift is integer arithmetic on the address; the pointer the
// kernel dereferences is always inside the caller's tensor or the scratch.
template <typename AK>
__global__ void __launch_bounds__(AK::kNumThreads, AK::kMinBlocksPerSm)
    fmha_sm80_kernel(typename AK::Params p, Placement pl) {
  const int64_t b = blockIdx.z;
  const int64_t h = blockIdx.y;
  const int64_t kvh = h / pl.group;
  if (pl.cu_q != nullptr) {
    const SequenceRows s = sequence_of(pl, b);
    if (int64_t(blockIdx.x) * AK::kQueriesPerBlock >= s.rows) {
      return;
    }
    p.num_queries = s.rows;
    p.num_keys = s.keys;
    p.query_ptr += s.q0 * pl.q_token;
    p.key_ptr += s.k0 * int64_t(p.k_strideM);
    p.value_ptr += s.k0 * int64_t(p.v_strideM);
    p.output_ptr += s.q0 * pl.o_token;
  }
  const int64_t rows = p.num_queries;
  const int64_t heads = p.num_heads;
  const int64_t lse_dim = (rows + AK::kAlignLSE - 1) / AK::kAlignLSE * AK::kAlignLSE;
  p.query_ptr += b * pl.q_batch;
  p.key_ptr += b * pl.k_batch + kvh * pl.k_head - h * int64_t(p.k_strideH);
  p.value_ptr += b * pl.v_batch + kvh * pl.v_head - h * int64_t(p.v_strideH);
  p.output_ptr +=
      b * pl.o_batch + h * pl.o_head - b * rows * p.o_strideM - h * int64_t(p.head_dim_value);
  if (p.output_accum_ptr != nullptr) {
    p.output_accum_ptr += b * (pl.accum_rows - rows) * heads * p.head_dim_value;
  }
  if (p.logsumexp_ptr != nullptr) {
    p.logsumexp_ptr += (b * heads + h) * (pl.lse_rows - lse_dim);
  }
  if (!p.advance_to_block()) {
    return;
  }
  AK::attention_kernel(p);
}

// A variable-length batch's logsumexps from the scratch ([batch, heads, lse_rows], as
// fmha_sm80_kernel leaves them) to `lse` ([heads_q, total_q]): row r of (sequence b, head h) is
// lse[h * lse_head + r * lse_row + its first query token]. One block per (sequence, head).
// Internal linkage: every instance's translation unit has its own.
static __global__ void varlen_lse_kernel(const float* scratch, float* lse, Placement pl,
                                  int64_t lse_head, int64_t lse_row) {
  const int64_t b = blockIdx.x;
  const int64_t h = blockIdx.y;
  const SequenceRows s = sequence_of(pl, b);
  const float* from = scratch + (b * gridDim.y + h) * pl.lse_rows;
  for (int32_t r = threadIdx.x; r < s.rows; r += blockDim.x) {
    lse[h * lse_head + r * lse_row + s.q0] = from[r];
  }
}

template <typename T, int Q, int K, int D>
void launch_sm80(const FmhaArgs& a, cudaStream_t stream) {
  // aligned (16-byte) loads; no dropout; no bias.
  using AK = AttentionKernel<T, cutlass::arch::Sm80, true, Q, K, D, false, false>;
  // A nonzero head stride keeps advance_to_block off its one-query MQA shortcut, which
  // assumes a contiguous BSHD output; the kernel uses strideH nowhere else.
  constexpr int32_t kHeadStrideGuard = AK::kAlignmentK;
  const bool varlen = a.cu_seqlens_q != nullptr;

  // One-query GQA heads of a variable-length batch run packed: each (sequence, kv head) as
  // packed_group rows, head strides apart (a dense batch comes packed as a view).
  int64_t q_stride[3] = {a.q_stride[0], a.q_stride[1], a.q_stride[2]};
  int64_t o_stride[3] = {a.o_stride[0], a.o_stride[1], a.o_stride[2]};
  int64_t rows = a.seq_q, heads = a.heads_q, group = a.heads_q / a.heads_kv;
  if (varlen && a.packed_group > 0) {
    pack_head_rows(q_stride, a.packed_group);
    pack_head_rows(o_stride, a.packed_group);
    rows = a.packed_group;
    heads = a.heads_kv;
    group = 1;
  }

  typename AK::Params p;
  p.query_ptr = static_cast<T*>(const_cast<void*>(a.q));
  p.key_ptr = static_cast<T*>(const_cast<void*>(a.k));
  p.value_ptr = static_cast<T*>(const_cast<void*>(a.v));
  p.output_ptr = static_cast<T*>(a.out);
  p.scale = a.scale;
  p.head_dim = static_cast<int32_t>(a.head_dim);
  p.head_dim_value = static_cast<int32_t>(a.head_dim);
  p.num_queries = static_cast<int32_t>(rows);
  p.num_keys = static_cast<int32_t>(a.seq_k);
  p.num_batches = static_cast<int32_t>(a.batch);
  p.num_heads = static_cast<int32_t>(heads);
  p.custom_mask_type = static_cast<uint8_t>(a.causal == Causal::TopLeft       ? AK::CausalFromTopLeft
                                            : a.causal == Causal::BottomRight ? AK::CausalFromBottomRight
                                                                              : AK::NoCustomMask);
  p.q_strideM = static_cast<int32_t>(q_stride[1]);
  p.k_strideM = static_cast<int32_t>(a.k_stride[1]);
  p.v_strideM = static_cast<int32_t>(a.v_stride[1]);
  p.o_strideM = static_cast<int32_t>(o_stride[1]);
  p.q_strideH = static_cast<int32_t>(q_stride[2]);
  p.k_strideH = a.k_stride[2] != 0 ? static_cast<int32_t>(a.k_stride[2]) : kHeadStrideGuard;
  p.v_strideH = a.v_stride[2] != 0 ? static_cast<int32_t>(a.v_stride[2]) : kHeadStrideGuard;
  p.q_strideB = 0;
  p.k_strideB = 0;
  p.v_strideB = 0;

  // Scratch: the f32 output accumulator (d > keys per block), and the kernel's LSE, whose rows are
  // padded to a multiple of 32 (padding written with +inf) before being copied out dense.
  const int64_t lse_rows = (rows + AK::kAlignLSE - 1) / AK::kAlignLSE * AK::kAlignLSE;
  Placement pl{varlen ? 0 : q_stride[0],
               varlen ? 0 : a.k_stride[0],
               varlen ? 0 : a.v_stride[0],
               varlen ? 0 : o_stride[0],
               a.k_stride[2],
               a.v_stride[2],
               o_stride[2],
               static_cast<int32_t>(group),
               static_cast<int32_t>(lse_rows),
               static_cast<int32_t>(rows)};
  if (varlen) {
    pl.cu_q = a.cu_seqlens_q;
    pl.cu_k = a.cu_seqlens_k;
    pl.total_q = static_cast<int32_t>(a.total_q);
    pl.total_k = static_cast<int32_t>(a.total_k);
    pl.q_token = a.q_stride[1];
    pl.o_token = a.o_stride[1];
    pl.packed_rows = a.packed_group;
  }
  detail::Scratch accum(
      AK::kNeedsOutputAccumulatorBuffer ? size_t(a.batch * rows * heads * a.head_dim) * sizeof(float)
                                        : 0,
      stream);
  detail::Scratch lse(a.lse != nullptr ? size_t(a.batch * heads * lse_rows) * sizeof(float) : 0,
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
  if (a.lse == nullptr) {
    return;
  }
  if (varlen) {  // FmhaArgs::lse is [heads_q, total_q]
    const bool packed = a.packed_group > 0;
    const int64_t lse_head = packed ? a.packed_group * a.total_q : a.total_q;
    varlen_lse_kernel<<<dim3(unsigned(a.batch), unsigned(heads)), 128, 0, stream>>>(
        lse.floats(), a.lse, pl, lse_head, packed ? a.total_q : 1);
    check_cuda(cudaGetLastError(), "launch varlen_lse_kernel");
  } else {
    check_cuda(cudaMemcpy2DAsync(a.lse, size_t(a.seq_q) * sizeof(float), lse.floats(),
                                 size_t(lse_rows) * sizeof(float), size_t(a.seq_q) * sizeof(float),
                                 size_t(a.batch * a.heads_q), cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpy2DAsync(logsumexp)");
  }
}

}  // namespace flashcore::sm80

// The explicit instantiation per tile in each file of instances/: TAG is the DType, the symbol is
// fmha_sm80_<TAG>_q<Q>_k<K>_d<D> (declared by dispatch.cpp from instances.inc).
#define FLASHCORE_SM80_INSTANCE(T, TAG, Q, K, D)                                           \
  namespace flashcore::sm80 {                                                              \
  void fmha_sm80_##TAG##_q##Q##_k##K##_d##D(const FmhaArgs& args, cudaStream_t stream) {   \
    launch_sm80<T, Q, K, D>(args, stream);                                                 \
  }                                                                                        \
  }
