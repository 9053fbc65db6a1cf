// flashcore — fused multi-head attention forward on NVIDIA GPUs: the public C++17 API.
//
//   out = softmax(scale * Q K^T + causal mask) V, per batch and query head.
//
// Tensors are raw device pointers with logical dims [batch, seq, heads, head_dim] and strides in
// elements (TensorRef, flashcore/types.h): BSHD and BHSD are both stride choices, and query head
// h reads key/value head h / (heads_q / heads_kv) (GQA / MQA) without copying K or V. The same
// kernels, validation and tile tables serve the Rust crate, which calls this library through its
// cxx bridge; errors come back as a Status in the same categories as Rust's flashcore::Error.
//
// Example (error handling shortened):
//
//   flashcore::AttentionArgs a;
//   a.dtype = flashcore::DType::F16;
//   a.q = {q_ptr, {batch, seq_q, heads, 64}};      // then fill the strides:
//   flashcore::bshd_strides(a.q.shape, a.q.stride); // ... and likewise k, v, out
//   a.options.causal = flashcore::Causal::BottomRight;
//   flashcore::Status s = flashcore::attention_forward(a, stream);
//   if (!s.ok()) std::fprintf(stderr, "%s: %s\n", flashcore::name(s.code), s.message.c_str());
//
// See examples/cpp/ for a complete program and cpp/CMakeLists.txt for linking.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "flashcore/plan.h"
#include "flashcore/status.h"
#include "flashcore/types.h"

namespace flashcore {

struct AttentionArgs {
  DType dtype = DType::F16;
  TensorRef q;    // [batch, seq_q, heads_q, head_dim]
  TensorRef k;    // [batch, seq_k, heads_kv, head_dim]; heads_kv divides heads_q
  TensorRef v;    // like k
  OutputRef out;  // like q; written
  // Optional logsumexp (natural log) per query row: float, shape [batch, seq_q, heads_q, 1] with
  // dense BHSD strides {heads_q * seq_q, 1, seq_q, 1}; written.
  std::optional<OutputRef> lse;
  Options options;
  // A variable-length batch (see Sequences): q, k, v and out are then [1, total_tokens, heads,
  // head_dim] and lse [1, total_q, heads_q, 1] (dense: [heads_q, total_q]). Every sequence is
  // attended on its own, with its own lengths and causal alignment.
  std::optional<Sequences> sequences;
  // A paged KV cache (see Pages): k and v are then [num_pages, page_size, heads_kv, head_dim].
  // The WMMA kernel reads it (Backend::Auto picks it; forcing another family is
  // Code::BackendUnavailable).
  std::optional<Pages> pages;
};

// What a successful call ran: the kernel family, its table row, and into how many blocks per
// (batch, head) the keys were split (kv_splits; 1: none).
struct LaunchInfo {
  Kernel kernel;
  TileRow row;
  int32_t splits = 1;
};

// Validates `args`, picks the kernel and tile for the current device, and enqueues the attention
// on `stream`, which must belong to the current device (as must every pointer). Returns once the
// work is queued: faults inside the kernel surface at the caller's next synchronisation, as
// with any CUDA launch. Nothing is launched when the Status is not ok. Problems without output
// elements (batch, seq_q or heads_q of 0) launch nothing and succeed.
//
// Requirements, each reported with its own Code: matching shapes; heads_kv dividing heads_q; a
// head dim that is a multiple of 8 from 8 to 256; a head-dim stride of 1; other strides multiples
// of 8 elements; 16-byte aligned device pointers; every row seeing at least one key; a finite
// scale; sizes within the kernels' 32-bit indexing; outputs that share no address with each
// other, themselves or an input (Code::OverlappingOutput: an output's strides, ordered, must each
// exceed the span of the smaller dimensions; views of one packed buffer may interleave if they
// share no element); for a variable-length batch, offsets on the device, 4-byte aligned, and
// (with host copies) valid (Code::InvalidOffsets). Never throws.
Status attention_forward(const AttentionArgs& args, cudaStream_t stream,
                         LaunchInfo* info = nullptr) noexcept;

// One attention state: an output [batch, seq, heads, head_dim] and its logsumexp (float, dense
// BHSD [batch, seq, heads, 1]), as attention_forward writes them for one set of keys.
struct StateRef {
  TensorRef out;
  TensorRef lse;
};

// States of the same queries over disjoint key sets (the splits of split-KV decoding, the
// shared prefix and the suffix of cascade attention, the steps of ring attention), merged into
// the state over all their keys:
//
//   m = max_i lse_i,  w_i = exp(lse_i - m),  out = sum_i w_i out_i / sum_i w_i,
//   lse = m + log(sum_i w_i)     (per query row, accumulated in float).
//
// A state whose lse is -inf covers no key: weight 0, and its output is never read. If every
// state of a row is -inf the row gets out 0 and lse -inf; a NaN lse makes the row NaN.
struct MergeArgs {
  DType dtype = DType::F16;
  const StateRef* states = nullptr;  // `count` states, 1 to kMaxMergeStates
  int32_t count = 0;
  OutputRef out;                     // like each state's out; written
  std::optional<OutputRef> lse;      // like each state's lse; written
};

// Validates `args` (each state like the output: same shape, a head dim that is a multiple of 8
// from 8 to 256, contiguous head dim, strides multiples of 8 elements, 16-byte aligned outputs,
// dense float logsumexps; all on the current device) and enqueues the merge on `stream`. The
// output may be one of the states, with the same address and strides (an in-place merge), but
// must not otherwise overlap them, itself or its logsumexp (Code::OverlappingOutput). Nothing is launched when the Status is not ok; problems
// without rows succeed without launching. Never throws.
Status merge_states(const MergeArgs& args, cudaStream_t stream) noexcept;

}  // namespace flashcore
