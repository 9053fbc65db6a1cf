// flashcore — value types of the public C++ API. Host-only: no CUDA header is needed.
#pragma once

#include <cstdint>
#include <optional>

namespace flashcore {

// Element type of Q, K, V and the output (the logsumexp output is always float).
enum class DType : int32_t { F16 = 0, BF16 = 1 };

// Which keys a query row may see. Top-left: key j is visible to query i when j <= i.
// Bottom-right: when j <= i + (seq_k - seq_q) (the last query sees every key).
enum class Causal : int32_t { None = 0, TopLeft = 1, BottomRight = 2 };

// The GPU kernel families. Each has its own folder under cpp/src/ and its own tile table
// (flashcore/plan.h); the values are dense from 0 (kKernelCount).
enum class Kernel : int32_t {
  CutlassSm80 = 0,  // CUTLASS example 41 (Sm80 tag): compute capability 8.0 and later
  Wmma = 1,         // flashcore's FlashAttention-2 style kernel on nvcuda::wmma
  CutlassSm90 = 2,  // CUTLASS example 88's Hopper mainloop (wgmma, TMA): compute capability 9.0
};
constexpr int32_t kKernelCount = 3;

// Which kernel runs a call: Auto (the planner's choice, see auto_kernel()) or one family, whose
// value is its Kernel's plus one (kernel_of).
enum class Backend : int32_t { Auto = 0, CutlassSm80 = 1, Wmma = 2, CutlassSm90 = 3 };

// The family a Backend forces, or empty for Auto.
constexpr std::optional<Kernel> kernel_of(Backend backend) {
  if (backend == Backend::Auto) {
    return std::nullopt;
  }
  return static_cast<Kernel>(static_cast<int32_t>(backend) - 1);
}

// Which shared-memory budget (and SASS) a device falls into.
enum class ArchClass : int32_t {
  Sm80 = 0,      // A100, A30: 164 KB per SM, 163 KB per block
  Sm86Sm89 = 1,  // RTX 30xx/40xx, A10, L4, L40: 100 KB per SM, 99 KB per block
  Sm90 = 2,      // H100, H200: 228 KB per SM, 227 KB per block
};

// A 4-D tensor in device memory: logical dims [batch, seq, heads, head_dim] and their strides in
// elements. BSHD and BHSD are both plain stride choices; the head-dim stride must be 1.
struct TensorRef {
  const void* data = nullptr;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
};

// The same, for tensors the call writes (the output and the logsumexp).
struct OutputRef {
  void* data = nullptr;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};
};

// Dense strides of `shape` (= [batch, seq, heads, head_dim]) in BSHD or BHSD memory order.
inline void bshd_strides(const int64_t shape[4], int64_t stride[4]) {
  stride[3] = 1;
  stride[2] = shape[3];
  stride[1] = shape[2] * shape[3];
  stride[0] = shape[1] * shape[2] * shape[3];
}
inline void bhsd_strides(const int64_t shape[4], int64_t stride[4]) {
  stride[3] = 1;
  stride[1] = shape[3];
  stride[2] = shape[1] * shape[3];
  stride[0] = shape[1] * shape[2] * shape[3];
}

// A variable-length batch: `batch` sequences packed one after another along the token axis of
// Q, K, V and the output, which then have batch 1 ([1, total_tokens, heads, head_dim]).
// Sequence b owns query tokens [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and key tokens
// [cu_seqlens_k[b], cu_seqlens_k[b + 1]), and is attended on its own: its own seq_q and seq_k,
// its own causal alignment. The offsets are int32 in device memory (batch + 1 entries each,
// starting at 0, non-decreasing, the last one the token count).
//
// With the host copies, every rule is checked before the launch (each breach is a Status).
// Without them the kernels cannot know the contents; they clamp every offset into
// [0, token count] and never touch memory outside the tensors, but a breach then gives
// unspecified (not NaN-free) rows: query tokens past max_seqlen_q rows of their sequence are
// not written, and rows that see no key get logsumexp -inf and output 0 (NaN on CUTLASS
// example 41).
struct Sequences {
  int64_t batch = 0;                      // number of sequences
  const int32_t* cu_seqlens_q = nullptr;  // device: batch + 1 offsets into the query tokens
  const int32_t* cu_seqlens_k = nullptr;  // device: batch + 1 offsets into the key tokens
  int64_t max_seqlen_q = 0;               // the longest sequence's query count
  int64_t max_seqlen_k = 0;               // the longest sequence's key count
  const int32_t* host_cu_seqlens_q = nullptr;  // optional host copies (batch + 1 entries)
  const int32_t* host_cu_seqlens_k = nullptr;
};

// A paged KV cache (AttentionArgs::pages): K and V are [num_pages, page_size, heads_kv,
// head_dim], pages of page_size consecutive keys; sequence b's key j is slot j % page_size of
// page block_table[b * pages_per_seq + j / page_size], and it has seqlens_k[b] keys. Queries
// and the output stay dense [batch, seq_q, heads_q, head_dim]; under bottom-right causal the
// queries are the sequence's last seq_q tokens (chunked prefill: the new tokens' keys are already
// in the cache; decode: seq_q = 1).
//
// page_size is a power of two from 16 to 1024. With the host copies, every length and every page
// index the lengths reach are checked before the launch (Code::InvalidPageTable); without them the
// kernel clamps what it reads (a key count to what the sequence's row of pages holds, a page index
// to [0, num_pages)), so a bad device table never leads outside the buffers.
struct Pages {
  int64_t batch = 0;                     // sequences: q's batch
  int64_t page_size = 0;                 // keys per page
  int64_t pages_per_seq = 0;             // columns of the block table
  const int32_t* block_table = nullptr;  // device: batch x pages_per_seq page indices, row-major
  const int32_t* seqlens_k = nullptr;    // device: batch key counts
  int64_t max_seqlen_k = 0;              // the longest sequence's key count
  const int32_t* host_block_table = nullptr;  // optional host copies
  const int32_t* host_seqlens_k = nullptr;
};

// ALiBi (BLOOM, MPT) slopes (AttentionArgs::alibi): query head h of sequence b adds
//   -slopes[b * heads + h] * |i + offset - j|     (batch > 1), or -slopes[h] (batch 1),
// to the score of its query i and key j, after the scale and any softcap; offset is the
// diagonal's, as for the sliding window (seq_k - seq_q under Causal::BottomRight and None, 0
// under TopLeft). float, row-major [batch, heads], on the call's device and 4-byte aligned;
// batch is 1 (one slope per head for every sequence) or the call's batch (sequences of a
// variable-length batch); heads is heads_q. The slopes must be finite: with the host copy every
// one is checked (Code::InvalidAlibiSlope); without it a non-finite slope gives NaN rows, never
// a read outside the array. On the GPU the WMMA kernel applies them, and the Hopper kernel too
// (Backend::Auto picks the Hopper kernel where it picks it for the call without ALiBi, else
// WMMA; forcing CUTLASS example 41 is Code::BackendUnavailable).
struct AlibiSlopes {
  const float* data = nullptr;  // device: batch x heads slopes
  int64_t batch = 1;
  int64_t heads = 0;
  const float* host = nullptr;  // optional host copy of the batch x heads slopes
};

// Element type of an additive bias (Bias::dtype).
enum class BiasType : int32_t { F16 = 0, BF16 = 1, F32 = 2 };

// An additive bias or mask on the scores (AttentionArgs::bias): query i and key j of sequence b
// and query head h add
//   tensor[b, i, h, j]   (element b * stride[0] + i * stride[1] + h * stride[2] + j * stride[3])
// to their score after the scale, any softcap and ALiBi. The tensor's dims are [batch, seq_q,
// heads_q, seq_k], each either the call's or 1 (broadcast: index 0 on that axis); a stride of 0
// broadcasts as well (PyTorch's [B, H, Sq, Sk] attn_mask has strides {H Sq Sk, Sk, Sq Sk, 1}).
// For a variable-length batch the dims are [sequences, max_seqlen_q, heads_q, max_seqlen_k] and
// i, j count from the sequence's first query and key; for a paged cache seq_k is max_seqlen_k.
// On the call's device, aligned to its element size, strides not negative; any values: -inf
// masks a key, and a row whose every key is masked gets output 0 and logsumexp -inf (NaN or
// +inf values give NaN rows). The WMMA kernel and the Hopper kernel apply it (Backend::Auto
// picks the Hopper kernel where it picks it for the call without the bias, else WMMA; forcing
// CUTLASS example 41 is Code::BackendUnavailable). The Hopper kernel reads a 16-bit bias with
// contiguous keys and even row offsets two keys per load, ahead of the tile that needs them, and
// any other bias key by key.
struct Bias {
  BiasType dtype = BiasType::F32;
  TensorRef tensor;
};

struct Options {
  // Softmax scale; 1/sqrt(head_dim) when empty. Must be finite.
  std::optional<float> scale;
  // Logit softcapping (Gemma 2, Grok): scores = softcap * tanh(scale * q.k / softcap) before the
  // softmax. Positive and finite (Code::InvalidSoftcap). On the GPU the WMMA kernel applies it,
  // and the Hopper kernel too (Backend::Auto picks the Hopper kernel where it picks it for the
  // call without the softcap, else WMMA; forcing CUTLASS example 41 is
  // Code::BackendUnavailable). The Hopper kernel computes tanh with tanh.approx.f32
  // (absolute error below 1e-5, measured: docs/HOPPER.md, round 10).
  std::optional<float> softcap;
  Causal causal = Causal::None;
  // Sliding-window (local) attention, in keys from the diagonal: query i sees key j only when
  //   i + offset - window_left <= j <= i + offset + window_right,
  // offset = seq_k - seq_q (the bottom-right diagonal, FlashAttention's definition) under
  // Causal::BottomRight and Causal::None, 0 under Causal::TopLeft. An empty side is unbounded, as
  // is a side of at least seq_q + seq_k, which bounds nothing (a window of such sides is no score
  // modifier: CUTLASS example 41 runs the call too); a causal mask also bounds the right side at
  // 0. Not negative (Code::InvalidWindow). Rows the window leaves without keys are
  // Code::NoVisibleKeys. On the GPU the WMMA kernel runs it, and the Hopper kernel too
  // (Backend::Auto picks the Hopper kernel where it picks it for the call without the window, else
  // WMMA; forcing CUTLASS example 41 is Code::BackendUnavailable); both visit only the key tiles
  // inside the band.
  std::optional<int64_t> window_left;
  std::optional<int64_t> window_right;
  Backend backend = Backend::Auto;
  // Take the tile-table rows of this class instead of the device's own (testing the sm_89 rows
  // on another GPU). The rows must still fit the device's shared memory. The backward pass takes
  // this class's choice of its key-block kernel.
  std::optional<ArchClass> force_arch_class;
};

}  // namespace flashcore
