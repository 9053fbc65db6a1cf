// Validation and planning, host-only: the one place where an attention call's arguments are
// checked (shapes, strides, alignment, head dim, devices, sizes, scale) and its kernel and tile
// are chosen. Both front ends call these before anything is launched: the public C++ API
// (cpp/src/attention.cpp) and the Rust crate (through its cxx bridge, src/ffi/mod.rs).
//
// Why here and not in Rust: the C++ library must validate on its own when built with CMake
// alone (no cargo, no Rust toolchain), while Rust can call C++ at almost no cost. So the rules
// live once, in host-only C++ (no CUDA headers: the CPU-only Rust build compiles them too), and
// Rust maps each Status to its typed Error (src/ffi/mod.rs).
#pragma once

#include <cstdint>
#include <vector>

#include "flashcore/plan.h"
#include "flashcore/status.h"
#include "flashcore/types.h"

namespace flashcore::core {

// An operand's location: the host, or a CUDA device ordinal.
constexpr int32_t kHost = -1;

// One operand as validation sees it: address, logical dims [batch, seq, heads, head_dim],
// strides in elements, location, and element size in bytes.
struct TensorDesc {
  uint64_t address = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
  int32_t location = kHost;
  int32_t element_bytes = 2;
};

// One offsets array of a variable-length batch (flashcore::Sequences): `count` sequences, so
// count + 1 int32 entries at `address` (device, or the host for the CPU reference), an optional
// host copy of them, and the longest sequence's length.
struct OffsetsDesc {
  uint64_t address = 0;
  int32_t location = kHost;
  int64_t count = 0;
  const int32_t* host = nullptr;
  int64_t max_len = 0;
};

// A paged KV cache (flashcore::Pages): the block table (`count` x pages_per_seq int32 page
// indices) and the key lengths (`count` int32) at their addresses (device, or the host for the
// CPU reference), their optional host copies, and the longest sequence's key count.
struct PagesDesc {
  uint64_t table = 0, seqlens = 0;
  int32_t table_location = kHost, seqlens_location = kHost;
  int64_t count = 0, page_size = 0, pages_per_seq = 0, max_seqlen_k = 0;
  const int32_t* host_table = nullptr;
  const int32_t* host_seqlens = nullptr;
};

// ALiBi slopes (flashcore::AlibiSlopes): batch x heads floats at `address` (device, or the host
// for the CPU reference) and an optional host copy.
struct AlibiDesc {
  uint64_t address = 0;
  int32_t location = kHost;
  int64_t batch = 1, heads = 0;
  const float* host = nullptr;
};

// One attention call: Q, K, V, the output and the optional logsumexp (f32). A variable-length
// batch (`varlen`) packs its sequences along the token axis of batch-1 tensors, at the offsets
// cu_q (queries) and cu_k (keys). A paged call (`paged`) reads K and V, [num_pages, page_size,
// heads_kv, head_dim], through `pages`.
struct Request {
  DType dtype = DType::F16;
  TensorDesc q, k, v, out, lse;
  bool has_lse = false;
  Options options;
  bool varlen = false;
  OffsetsDesc cu_q, cu_k;
  bool paged = false;
  PagesDesc pages;
  bool has_alibi = false;
  AlibiDesc alibi;
  // An additive bias (flashcore::Bias): dims [batch, seq_q, heads_q, seq_k], each the call's
  // or 1; element_bytes from bias_type.
  bool has_bias = false;
  BiasType bias_type = BiasType::F32;
  TensorDesc bias;
};

// A checked problem. For a variable-length batch, `batch` counts its sequences and seq_q / seq_k
// are the longest sequence's lengths (the grid's extent); each sequence has its own. A paged
// problem's seq_k is the longest sequence's key count.
struct Problem {
  int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
  float scale;
  Causal causal;
  int32_t location;
  bool varlen = false;
  bool paged = false;
  // A sliding window (Options::window_left / _right), each side -1 when unbounded (also when
  // it is at least seq_q + seq_k, which no band can exceed).
  int64_t window_left = -1, window_right = -1;
  // ALiBi slopes are given (Request::alibi).
  bool alibi = false;
  // An additive bias is given (Request::bias).
  bool bias = false;
  // A variable-length batch's query token stride in head strides, where Q's and the output's
  // token strides are the same whole multiple of their head strides and the rows of its
  // one-query heads, packed (packs_heads), span at most INT32_MAX head strides; 0 otherwise.
  int64_t token_rows = 0;

  // No output element: nothing to compute or launch.
  bool empty() const { return batch == 0 || seq_q == 0 || heads_q == 0; }
  // One-query GQA/MQA: the query heads sharing a key/value head run as rows of one head (exact
  // because the one query sees every key, with the same scores: no window, no per-head slope
  // or bias). A variable-length batch packs them when its longest sequence has one query and
  // its token strides allow it (token_rows).
  bool packs_heads() const {
    return (!varlen || token_rows > 0) && seq_q == 1 && heads_kv > 0 && heads_q > heads_kv &&
           (causal == Causal::None || causal == Causal::BottomRight) && !windowed() && !alibi &&
           !bias;
  }
  // Whether a sliding window bounds a side.
  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  // Query rows per (batch, head) the kernel sees, after packing.
  int64_t query_rows() const { return packs_heads() ? heads_q / heads_kv : seq_q; }
  // The (batch, head) pairs the kernel sees, after packing.
  int64_t batch_heads() const { return batch * (packs_heads() ? heads_kv : heads_q); }
};

// Rows of a sequence of seq_q queries and seq_k keys that see no key under `o`'s causal mask and
// sliding window. Row i sees keys i + offset - left <= j <= i + offset + right, clamped to
// [0, seq_k): offset = 0 for top-left alignment, seq_k - seq_q otherwise; an unbounded side is
// empty; a causal mask bounds the right side at 0.
int64_t blind_rows(const Options& o, int64_t seq_q, int64_t seq_k);

// Checks `r` and describes the problem in `*problem`.
Status validate(const Request& r, Problem* problem) noexcept;
// The checks of validate() that depend on the operands' addresses (16-byte alignment of device
// operands, outputs that overlap an input): what a planned call (plan once, run many) checks
// again for each run's new tensors, whose dims and strides match the plan's.
Status check_addresses(const Request& r) noexcept;

// What the device offers (read once per device by the front ends), and which kernel families
// this build compiled (one bit per Kernel value; see set_compiled() in cpp/src/dispatch.h).
struct DeviceCaps {
  int32_t major = 0, minor = 0;
  int64_t smem_per_block_optin = 0;
  uint32_t kernels = ~0u;
  int32_t multiprocessors = 0;  // 0: unknown (Auto then takes the Hopper kernel where it may)
  // Whether this build compiled the Hopper kernel's bias schedules (the `sm90-bias` feature;
  // CMake: FLASHCORE_SM90_BIAS): without them a bias call does not run on the Hopper kernel.
  bool sm90_bias = true;
};

// The kernel and tile that will run a validated problem, and its key splits: `splits` per
// (sequence, head) at most (kv_splits); with split_keys > 0, the per-sequence splits of
// core/splits.h (split_first: the first unit of each sequence, and the unit count). A wide
// decode batch on the Hopper kernel: sequence_order (core/splits.h), the order its blocks walk
// the sequences in; empty: the scheduler's own walk.
struct Plan {
  Kernel kernel;
  const TileRow* row;
  int32_t splits = 1;
  int64_t split_keys = 0;
  std::vector<uint16_t> split_first{};
  std::vector<uint16_t> sequence_order{};
};

// `kernel`'s row for `head_dim` and `query_rows` query rows per head on a device with `caps`,
// taking the rows of class `forced` when set.
Status choose_row(Kernel kernel, int64_t head_dim, int64_t query_rows, const DeviceCaps& caps,
                  std::optional<ArchClass> forced, const TileRow** row) noexcept;

// Resolves r.options.backend, checks the kernel's index limits, and picks its tile for a device
// with `caps` (or for r.options.force_arch_class).
Status plan(const Request& r, const Problem& p, const DeviceCaps& caps, Plan* out) noexcept;

// The status for a std::bad_alloc caught while composing a message (Code::Launch).
Status out_of_host_memory() noexcept;

// Status constructors (messages are composed here, in one place).
Status fail(Code code, Operand operand = Operand::None, Field field = Field::None, int64_t a = 0,
            int64_t b = 0, int64_t c = 0, std::string detail = {});

}  // namespace flashcore::core
