// The passes of one backward call, around whichever key-block kernel runs it (instances/ for
// the WMMA rows, sm90/ for the Hopper one): the row sums D_i = dO_i . O_i with dQ's f32
// accumulator zeroed, the key blocks, then dQ converted to its type and strides.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "backward/kernel.cuh"
#include "check.h"
#include "scratch.h"

namespace flashcore::backward {

// Runs the passes of `a` on `stream` for element type T at head-dim tier D: `key_blocks(sums,
// dq_acc)` enqueues the key-block kernel.
template <typename T, int D, typename KeyBlocks>
void run_passes(const BackwardLaunch& a, cudaStream_t stream, KeyBlocks&& key_blocks) {
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
  key_blocks(static_cast<const float*>(sums), dq_acc);
  if (rows > 0) {
    const int64_t work = (rows * a.head_dim + kThreads - 1) / kThreads;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(work, int64_t{1} << 20));
    convert<T, D><<<blocks, kThreads, 0, stream>>>(a, dq_acc);
    check_cuda(cudaGetLastError(), "launch backward convert");
  }
}

}  // namespace flashcore::backward
