// The merge kernel for f16 and bf16 and its launcher (one small translation unit): see
// ../kernel.cuh.
#include <string>

#include "check.h"
#include "merge/kernel.cuh"

namespace flashcore {

void launch_merge(const MergeLaunch& args, cudaStream_t stream) {
  const int64_t rows = args.batch * args.seq * args.heads;
  if (rows == 0) {
    return;
  }
  const int vectors = static_cast<int>(args.head_dim / merge::kVector);
  const int rows_per_block = vectors >= 256 ? 1 : 256 / vectors;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > 0x7fffffff) {
    throw detail::Failure(Code::Launch, "",
                          "merge: " + std::to_string(rows) + " rows exceed the grid");
  }
  const dim3 grid(static_cast<unsigned>(blocks)), block(rows_per_block * vectors);
  if (args.dtype == DType::F16) {
    merge::merge_kernel<__half><<<grid, block, 0, stream>>>(args, rows_per_block);
  } else {
    merge::merge_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(args, rows_per_block);
  }
  check_cuda(cudaGetLastError(), "launch merge_kernel");
}

}  // namespace flashcore
