// Validation of merge_states (host-only): attention states (an output and its logsumexp)
// computed over disjoint key sets of the same queries, combined into one. Both front ends call it
// before anything is launched: the public C++ API (cpp/src/merge.cpp) and the Rust crate.
#pragma once

#include <cstdint>

#include "core/validate.h"

namespace flashcore::core {

// One merge call: `count` states (outs[i] with lses[i]) into `out` and, optionally, `lse`.
struct MergeRequest {
  DType dtype = DType::F16;
  const TensorDesc* outs = nullptr;
  const TensorDesc* lses = nullptr;
  int64_t count = 0;
  TensorDesc out, lse;
  bool has_lse = false;
};

// A checked merge: [batch, seq, heads, head_dim] rows of `count` states.
struct MergeProblem {
  int64_t batch, seq, heads, head_dim, count;
  int32_t location;

  bool empty() const { return batch == 0 || seq == 0 || heads == 0; }
};

// Checks `r` (in this order: the state count, extents, locations, shapes and logsumexp layouts,
// head dim, strides and alignment) and describes the merge in `*problem`.
Status validate_merge(const MergeRequest& r, MergeProblem* problem) noexcept;

}  // namespace flashcore::core
