// The merge kernel's launch interface (internal): merging attention states computed over
// disjoint key sets of the same queries. Reached only through cpp/src/merge.cpp, after
// validate_merge (cpp/src/core/merge.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashcore/plan.h"
#include "flashcore/types.h"

namespace flashcore {

// One merge launch: `count` states of [batch, seq, heads, head_dim] rows, each an output (strides
// in elements over (batch, seq, head), head dim contiguous) and a dense BHSD logsumexp.
struct MergeLaunch {
  DType dtype;
  int64_t batch, seq, heads, head_dim, count;
  const void* outs[kMaxMergeStates];
  int64_t out_strides[kMaxMergeStates][3];
  const float* lses[kMaxMergeStates];
  void* out;
  int64_t o_stride[3];
  float* lse;  // nullptr for none
};

// Enqueues the merge on `stream` (of the current device). Throws detail::Failure.
void launch_merge(const MergeLaunch& args, cudaStream_t stream);

}  // namespace flashcore
