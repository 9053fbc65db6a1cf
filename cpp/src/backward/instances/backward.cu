// The backward kernels for f16 and bf16 at head-dim tiers 64 and 128, and their launcher (one
// translation unit): see ../kernel.cuh.
#include <algorithm>
#include <string>

#include "backward/wide.cuh"
#include "check.h"
#include "scratch.h"

namespace flashcore {
namespace {

template <typename T, int D>
void launch_tier(const BackwardLaunch& a, cudaStream_t stream) {
  using namespace backward;
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
  // picks their order), of the wide kernel or the narrow one.
  const auto key_blocks = [&](auto kernel, size_t smem, int64_t keys, int threads) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)),
               "cudaFuncSetAttribute(backward key_block)");
    const int64_t blocks = (a.seq_k + keys - 1) / keys * a.batch * a.heads_kv;
    kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(a, sums, dq_acc);
    check_cuda(cudaGetLastError(), "launch backward key_block");
  };
  if (a.wide) {
    key_blocks(wide::key_block<T, D>, wide::Smem<T, D>::kBytes, wide::kKeys, wide::kThreads);
  } else {
    key_blocks(key_block<T, D>, Smem<T, D>::kBytes, kKeys, kThreads);
  }
  if (rows > 0) {
    const int64_t work = (rows * a.head_dim + kThreads - 1) / kThreads;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(work, int64_t{1} << 20));
    convert<T, D><<<blocks, kThreads, 0, stream>>>(a, dq_acc);
    check_cuda(cudaGetLastError(), "launch backward convert");
  }
}

template <typename T>
void launch_typed(const BackwardLaunch& a, cudaStream_t stream) {
  if (core::backward_tier(a.head_dim) == 64) {
    launch_tier<T, 64>(a, stream);
  } else {
    launch_tier<T, 128>(a, stream);
  }
}

}  // namespace

void launch_backward(const BackwardLaunch& a, cudaStream_t stream) {
  if (a.batch == 0 || a.heads_kv == 0 || a.seq_k == 0) {
    return;  // no gradient element (seq_k = 0 with queries was refused by validation)
  }
  if (a.head_dim > core::kBackwardMaxHeadDim) {
    throw detail::Failure(Code::Launch, "",
                          "backward: head dim " + std::to_string(a.head_dim) + " beyond " +
                              std::to_string(core::kBackwardMaxHeadDim));
  }
  if (a.dtype == DType::F16) {
    launch_typed<__half>(a, stream);
  } else {
    launch_typed<__nv_bfloat16>(a, stream);
  }
}

}  // namespace flashcore
