// The kernel launchers' interface (internal): one params struct per launch, one launcher per
// kernel family. Reached only through attention.cpp, after validation and planning; the
// launchers re-check only what the kernels themselves need (CUTLASS's `check_supported`) and
// every CUDA call, and throw flashcore::detail::Failure, which attention.cpp turns into a Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "flashcore/plan.h"
#include "flashcore/status.h"
#include "flashcore/types.h"

namespace flashcore {
namespace detail {

// A CUDA or launch failure inside the C++ layer (Code::Cuda, Code::OutOfDeviceMemory or
// Code::Launch), with one status value (the bytes asked for, for OutOfDeviceMemory). what() is
// "code|cuda_name|value|message" so that the cxx bridge's own CUDA wrappers can hand it to Rust.
class Failure : public std::runtime_error {
 public:
  Failure(Code code, const std::string& cuda_name, const std::string& message, int64_t value = 0)
      : std::runtime_error(std::to_string(static_cast<int>(code)) + "|" + cuda_name + "|" +
                           std::to_string(value) + "|" + message),
        code_(code),
        value_(value),
        cuda_name_(cuda_name),
        message_(message) {}
  Code code() const noexcept { return code_; }
  int64_t value() const noexcept { return value_; }
  const std::string& cuda_name() const noexcept { return cuda_name_; }
  const std::string& message() const noexcept { return message_; }

 private:
  Code code_;
  int64_t value_;
  std::string cuda_name_, message_;
};

}  // namespace detail

// One attention forward launch, after validation, planning and one-query head packing. All
// strides are in elements; q/out strides are (batch, seq, head), the rest likewise.
struct FmhaArgs {
  DType dtype;
  const void* q;  // [batch, seq_q, heads_q, head_dim]
  const void* k;  // [batch, seq_k, heads_kv, head_dim]
  const void* v;  // [batch, seq_k, heads_kv, head_dim]
  void* out;      // [batch, seq_q, heads_q, head_dim]
  float* lse;     // optional [batch, heads_q, seq_q], dense, natural log; nullptr for none
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  float scale;
  Causal causal;
  // Score modifiers: a softcap (0: none) and a sliding window (the WMMA and Hopper kernels),
  // each side -1 when unbounded (core::Problem's; the band is
  // core::blind_rows's, with the causal alignment).
  float softcap = 0.0f;
  int64_t window_left = -1, window_right = -1;
  // ALiBi slopes (the WMMA and Hopper kernels): float [batch or 1, heads_q], row stride
  // alibi_batch_stride (0: one row for every sequence); null for none.
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;
  // An additive bias (the WMMA and Hopper kernels): element [b, i, h, j] at b * bias_stride[0]
  // + ... (strides in elements, 0 on broadcast axes), bias_rows x bias_keys per (b, h); null for
  // none.
  const void* bias = nullptr;
  BiasType bias_type = BiasType::F32;
  int64_t bias_stride[4] = {0, 0, 0, 0};
  int64_t bias_rows = 0, bias_keys = 0;
  Tile tile;
  // A variable-length batch (the WMMA and Hopper kernels): batch + 1 int32 offsets each into
  // the token axis of q/out and of k/v, whose batch stride is then unused; seq_q and seq_k are
  // the longest sequence's lengths, total_q and total_k the token counts the kernel clamps the
  // offsets to. Null for a dense batch.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0, total_k = 0;
  // One-query GQA heads packed into rows in a variable-length batch whose longest sequence has
  // one query (core::Problem::packs_heads; a dense batch packs them as a view instead, through
  // seq_q, heads_q and the strides): 0 for none, else the query heads per key/value head. The
  // arguments above stay the call's (causal None: the one query sees every key); a launcher runs
  // each (sequence, kv head) as packed_group rows, head strides apart, row r being query head
  // kv_head * packed_group + r of the sequence's first query token (a sequence without queries
  // has no rows). Q's and the output's token strides are token_rows head strides.
  int32_t packed_group = 0;
  int64_t token_rows = 1;
  // Split-KV (the WMMA and Hopper kernels): the keys of each (batch entry or sequence, head) are
  // split over up to this many blocks, whose partial states the launcher combines (1: none).
  // With split_keys 0 (kv_splits) every sequence's keys make `splits` splits of the same length,
  // a whole number of key tiles covering the longest. Otherwise (core::Plan's per-sequence
  // splits) each split has split_keys keys, a whole number of the tile's, and sequence b's
  // splits are work units [split_first[b], split_first[b + 1]) (host memory, batch + 1 entries,
  // read by the launcher): max(1, ceil(its keys / split_keys)) of them, at most `splits`.
  int32_t splits = 1;
  int64_t split_keys = 0;
  const uint16_t* split_first = nullptr;
  // A wide decode batch on the Hopper kernel (core::Plan::sequence_order): the order in which its
  // persistent blocks walk the sequences, longest first where the host knew the key counts
  // (host memory, batch entries, read by the launcher; sm90/scheduler.cuh). Null: the
  // scheduler's own walk.
  const uint16_t* sequence_order = nullptr;
  // A paged KV cache (the WMMA and Hopper kernels): k and v are [num_pages, page_size, heads_kv,
  // head_dim] (k_stride[0] / v_stride[0]: the page stride). Sequence b has seqlens_k[b] keys,
  // clamped to [0, pages_per_seq * page_size]; its key j is slot j % page_size of page
  // block_table[b * pages_per_seq + j / page_size], clamped to [0, num_pages). seq_k is the
  // longest sequence's key count. Null for contiguous keys.
  const int32_t* block_table = nullptr;
  const int32_t* seqlens_k = nullptr;
  int64_t page_size = 0, pages_per_seq = 0, num_pages = 0;
};

// Whether the call has a sliding window (either side; core::Problem::windowed's rule).
inline bool windowed(const FmhaArgs& a) { return a.window_left >= 0 || a.window_right >= 0; }

// One-query GQA heads packed into rows (core::Problem::packs_heads): Q's or the output's
// (batch, seq, head) strides become those of rows that step by the head stride, in "heads" (one
// per kv head) that step by `group` heads. A dense batch's arguments are packed so (a view); a
// variable-length batch's launchers pack their own (FmhaArgs::packed_group).
inline void pack_head_rows(int64_t stride[3], int64_t group) {
  stride[1] = stride[2];
  stride[2] *= group;
}

// A paged cache's bounds as both kernel families read them: log2 of the page size (a power of
// two: validated); the table entries per sequence, 0 when the cache has no page (then no key is
// read); the last page a table entry is clamped to (page indices are int32: pages past INT32_MAX
// cannot be named; 0 without pages).
struct PageBounds {
  int shift = 0;
  int64_t pages_per_seq = 0;
  int32_t last_page = 0;
};
inline PageBounds page_bounds(const FmhaArgs& a) {
  PageBounds b;
  while ((int64_t{1} << b.shift) < a.page_size) {
    ++b.shift;
  }
  b.pages_per_seq = a.num_pages > 0 ? a.pages_per_seq : 0;
  b.last_page = static_cast<int32_t>(
      a.num_pages > 0 ? (a.num_pages > INT32_MAX ? INT32_MAX : a.num_pages) - 1 : 0);
  return b;
}

}  // namespace flashcore
