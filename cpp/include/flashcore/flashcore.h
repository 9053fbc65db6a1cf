// flashcore — fused multi-head attention on NVIDIA GPUs (forward, and its gradients): the
// public C++17 API.
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

#include <memory>
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
  // ALiBi slopes (see AlibiSlopes), kept by address by an AttentionPlan like the page table.
  std::optional<AlibiSlopes> alibi;
  // An additive bias or mask (see Bias), kept by address by an AttentionPlan like the slopes.
  std::optional<Bias> bias;
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
// elements (batch, seq_q or heads_q of 0) launch nothing and succeed. On compute capability 9.0
// the Hopper kernel is a programmatic dependent launch: it sets up while the stream's previous
// kernel ends and waits for it before touching memory, and it lets the stream's next kernel
// launch early. A kernel of yours launched after it with programmatic stream serialization must
// therefore call cudaGridDependencySynchronize() before reading the output, as CUDA requires.
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

// The tensors of one AttentionPlan run: new addresses for operands of the dims, strides, dtype
// and device the plan was made for. The batch composition (a variable-length batch's offsets, a
// paged cache's block table and key lengths) is the plan's own; a paged plan's k and v are this
// run's caches (one per layer).
struct RunArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // given exactly when the plan was made with a logsumexp
};

namespace detail {
struct Prepared;
}

// An attention call validated and planned once, run many times: a serving step plans a batch
// once and runs it for each of its 32 to 80 layers. create() does all of attention_forward's
// host work (the same checks, each with its Code, and the kernel, tile and split choice for the
// current device); run() checks only what changes, the new addresses (16-byte alignment,
// overlapping outputs, no null pointer), and launches.
//
//   flashcore::AttentionPlan plan;
//   flashcore::Status s = flashcore::AttentionPlan::create(args, &plan);  // args as above
//   for (int layer = 0; s.ok() && layer < layers; ++layer) {
//     s = plan.run({q[layer], k_cache[layer], v_cache[layer], out[layer]}, stream);
//   }
//
// run() does not ask CUDA where the new pointers live (that query costs more than the launch):
// they must be device memory of the plan's device, as large as the planned dims and strides
// address (attention_forward checks the place of every pointer). The offsets or page table in
// `args` are kept by address, not copied: they must stay valid while the plan runs, and their
// contents may change only within what the plan validated (with host copies) or, without host
// copies, within the device contract of Sequences and Pages. A plan is immutable: copies share
// it, and threads may run one plan at once on their own streams and outputs.
//
// run() may be recorded into a CUDA graph (cudaStreamBeginCapture on `stream`, any capture
// mode): it then enqueues its kernels, and a split-KV call its scratch memory's stream-ordered
// allocation and free, as graph nodes, and launches nothing. Each launch of the graph runs the
// recorded calls on the buffers' contents at that time; the buffers must stay allocated while
// the graph can be launched. A status other than Ok from a run while capturing recorded nothing.
class AttentionPlan {
 public:
  // An empty plan: run() returns Code::PlanMismatch (operand None).
  AttentionPlan() noexcept;
  ~AttentionPlan();
  AttentionPlan(const AttentionPlan&) noexcept;
  AttentionPlan& operator=(const AttentionPlan&) noexcept;

  // Validates and plans `args` for the current device; on success `*plan` holds the plan (and is
  // left unchanged otherwise). Never throws.
  static Status create(const AttentionArgs& args, AttentionPlan* plan) noexcept;

  // Enqueues the planned attention on `data`'s tensors on `stream`, which must belong to the
  // plan's device (the current device, else Code::DeviceMismatch). Nothing is launched when the
  // Status is not ok. Never throws.
  Status run(const RunArgs& data, cudaStream_t stream) const noexcept;

  // What every run launches: kernel, table row and key splits (default values when empty).
  LaunchInfo info() const noexcept;
  // Whether create() filled this plan.
  explicit operator bool() const noexcept { return call_ != nullptr; }

 private:
  std::shared_ptr<const detail::Prepared> call_;
};

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

// The backward pass: the gradients of attention_forward's output with respect to Q, K and V,
// given the gradient of a loss with respect to that output.
//
//   P = exp(s(Q K^T) - lse),  D = rowsum(dO * O),  dS = P * (dO V^T - D) * s'(Q K^T),
//   dQ = dS K,  dK = dS^T Q (summed over the query heads of each kv head),  dV = P^T dO,
// where s is the forward call's score (scale, softcap, ALiBi, bias; masked keys have P = 0).
struct BackwardArgs {
  // The forward call as it ran: q, k, v, its options, a variable-length batch's sequences, ALiBi
  // slopes and bias (constants: no gradient), its output `out` (read) and its logsumexp `lse`
  // (required; read). No paged cache (Code::BackendUnavailable).
  AttentionArgs forward;
  TensorRef dout;  // the gradient of the output, like out
  // The gradients, each like its input (a variable-length batch's packed, as the forward's); a
  // sequence without queries gets zero dk and dv.
  OutputRef dq;    // like q; written
  OutputRef dk;    // like k; written
  OutputRef dv;    // like v; written
};

// Validates `args` (the forward call's rules, then each gradient's: shapes, strides, alignment,
// device, no gradient overlapping an input or another gradient; Operand::DOut, DQ, DK, DV) and
// enqueues the backward kernels on `stream` (of the current device), on the first row of
// backward_tile_table() for the head dim's tier that takes the call and whose shared memory fits
// (none: Code::SharedMemoryExceeded, below 73 KB per block at head dim 256):
// - Kernel::Wmma: the WMMA kernels, every head dim, compute capability 8.0 or later;
// - Kernel::CutlassSm90: the Hopper kernel (compute capability 9.0, a build with 90 among its
//   archs) where it covers the call: a dense batch with queries, no softcap, ALiBi or bias, a
//   head dim of at most 128, and q, k, v and dout with positive strides (TMA); not with a forced
//   arch class other than Sm90; elsewhere Code::BackendUnavailable, as is Kernel::CutlassSm80;
// - Auto: the Hopper kernel for the calls it covers whose grid (128-key blocks x batch x kv
//   heads) has a block per SM (1.08-1.25x the WMMA rows there on the H200), else the WMMA
//   kernels. It
// allocates an f32 dQ accumulator of batch x heads_q x seq_q x D floats (D: the tier, 64, 128
// or 256), stream-ordered, for the call. `row` (when not null) receives the row that runs.
// Nothing is launched when the Status is not ok; a problem without gradient elements succeeds
// without launching (`row` still says which row would run). Never throws.
Status attention_backward(const BackwardArgs& args, cudaStream_t stream,
                          BackwardTileRow* row = nullptr) noexcept;

}  // namespace flashcore
