// flashcore's own fused attention kernel: FlashAttention-2 style online softmax with tensor cores
// through nvcuda::wmma (16x16x16, f16/bf16 inputs, f32 accumulation).
//
// One block computes BR query rows of one (batch, head) against every visible key, BC keys per
// iteration, with up to 4 warps. Each warp owns 16 x kRowTiles query rows end to end: its scores,
// probabilities and output stay in its registers, so the output needs no atomics and no
// inter-warp reduction.
//
// Per key tile, each warp:
//   1. S = Q K^T with wmma, operands filled by ldmatrix from shared memory (fragments.cuh);
//   2. masks keys past the sequence or the causal limit (only in tiles that have such keys);
//   3. online softmax on the accumulator registers (softmax.cuh), then rescales its output rows;
//   4. O += P V, with P converted to the matrix_a fragment in registers.
// K and V tiles are double-buffered with cp.async (copy.cuh), so the next tile streams in while
// the current one is computed. Shared-memory rows are padded by 16 bytes so the eight rows of
// one ldmatrix land on distinct banks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../sequences.cuh"
#include "copy.cuh"
#include "fragments.cuh"
#include "pages.cuh"
#include "softmax.cuh"

namespace flashcore::wmma_fa {

// Kernel arguments (built by launch.cuh from FmhaArgs). Strides in elements: batch, seq, head.
struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // dense [batch, heads_q, seq_q] (varlen: [heads_q, total_q]) or null
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  int32_t seq_q;          // varlen: the longest sequence's (the grid covers it)
  int32_t seq_k;          // varlen: unused (each sequence has its own)
  int32_t head_dim;       // <= D; columns past it are zero-filled and never stored
  int32_t group;          // query heads per key/value head
  int32_t causal;         // 0: no mask; 1: key j visible to row i iff j <= i + causal offset
  int32_t bottom_right;   // causal offset seq_k - seq_q (per sequence) instead of 0
  // A sliding window: the causal offset gains window_right (the band's upper side, j <= i +
  // offset + window_right, with causal = 1); window_left >= 0 also hides keys j < i + offset -
  // window_left (offset without window_right); -1: no lower side.
  int32_t window_right, window_left;
  // The softmax's factor: scale * log2(e), a positive normal float (launch.cuh), or 1 when the
  // modifier pass (modify_tile) forms the exponents itself (with a softcap, ALiBi or a bias).
  float scale_log2;
  // Logit softcapping: a score s becomes softcap_out * tanh(scale * s / cap) with softcap_out =
  // cap * log2(e), already in log2 units; softcap_in = 2 log2(e) scale / cap (tanh's ex2
  // argument); softcap_out 0: none. Without a softcap, ALiBi's pass scales s by prescale
  // (scale * log2(e)).
  float softcap_in, softcap_out, prescale;
  // ALiBi: query head h of sequence b subtracts alibi[b * alibi_batch_stride + h] * log2(e) *
  // |i + diagonal - j| from its exponents (null: none; the diagonal's offset is the causal one
  // without window_right).
  const float* alibi;
  int64_t alibi_batch_stride;
  // An additive bias (null: none): element [b, i, h, j] (bias_type 0 f16, 1 bf16, 2 f32) at
  // b * bias_stride[0] + i * bias_stride[1] + h * bias_stride[2] + j * bias_stride[3] elements
  // (0 on broadcast axes); rows clamp to bias_rows - 1 and keys to bias_keys - 1 on read, so
  // no read leaves the tensor (rows and keys past a sequence are masked or never stored).
  const void* bias;
  int32_t bias_type, bias_rows, bias_keys;
  int64_t bias_stride[4];
  // A variable-length batch: batch + 1 offsets into the token axis of q/out and k/v (null:
  // dense), clamped on read to [0, total] so that no offset leads outside the tensors.
  const int32_t* cu_q;
  const int32_t* cu_k;
  int32_t total_q, total_k;
  // A variable-length batch's token strides of q and out (sequence b's first query token is at
  // cu_q[b] tokens), and its packed one-query heads (FmhaArgs::packed_group; 0: none): then each
  // block is one kv head (group 1, q_stride[1] / o_stride[1] the head stride) whose
  // packed_rows rows are the query heads of the sequence's one query token.
  int64_t q_token_stride, o_token_stride;
  int32_t packed_rows;
  // Split-KV: blockIdx.x runs over (query block, split), split s taking keys
  // [s * split_keys, (s + 1) * split_keys); with splits > 1 each block writes its normalised f32
  // partial output and logsumexp to part_out / part_lse (split s's state of the row whose
  // logsumexp index is n at s * part_rows + n: split/combine.cuh's Partials, which combines
  // them). One split: split_keys covers every sequence.
  int32_t splits, split_keys;
  int64_t part_rows;
  float* part_out;
  float* part_lse;
  // A paged KV cache (null table: contiguous keys): k and v are pages of 2^page_shift keys, page
  // stride k_stride[0] / v_stride[0]; sequence b's keys are named by row b of the table
  // (pages_per_seq entries, each clamped to [0, last_page] on read), its key count by
  // seqlens_k[b] (clamped to what its row of pages holds).
  const int32_t* block_table;
  const int32_t* seqlens_k;
  int64_t pages_per_seq;  // 0 when the cache has no page: no key can be read
  int32_t page_shift, last_page;
};

// Block-wide constants of the score modifiers, kept in shared memory rather than registers (the
// loop's accumulators leave none): the window's lower side (row i sees no key below i + lower),
// ALiBi's diagonal and slope (log2 units; 0: none), and the block's (b, h) slice of the bias
// (null: none) with its row and key strides and extents (Params::bias).
struct BlockMods {
  int lower, diagonal;
  float slope;
  const void* bias;
  int64_t bias_row_stride, bias_key_stride;
  int bias_type, bias_rows, bias_keys;
};

// One block's sequence: element offsets of its token 0 in q, k, v and out, its lengths and
// causal offset, and where its logsumexp rows start (head 0; heads lse_head apart, rows lse_row
// apart).
struct Sequence {
  int64_t q, k, v, o;
  int32_t seq_q, seq_k, causal_offset;
  int64_t lse0, lse_head, lse_row;
};

// Batch entry (dense) or sequence (varlen) `b` of `heads` query heads.
__device__ inline Sequence sequence(const Params& p, int64_t b, int64_t heads) {
  Sequence s;
  s.lse_row = 1;
  if (p.cu_q == nullptr && p.block_table == nullptr) {
    s.q = b * p.q_stride[0];
    s.k = b * p.k_stride[0];
    s.v = b * p.v_stride[0];
    s.o = b * p.o_stride[0];
    s.seq_q = p.seq_q;
    s.seq_k = p.seq_k;
    s.lse0 = b * heads * p.seq_q;
    s.lse_head = p.seq_q;
  } else if (p.block_table != nullptr) {  // paged keys: the copies find each key's page
    s.q = b * p.q_stride[0];
    s.o = b * p.o_stride[0];
    s.k = 0;
    s.v = 0;
    s.seq_q = p.seq_q;
    s.seq_k = paged_keys(p.seqlens_k, b, p.pages_per_seq, p.page_shift);
    s.lse0 = b * heads * p.seq_q;
    s.lse_head = p.seq_q;
  } else {
    const TokenRange qs = token_range(p.cu_q, b, p.total_q);
    const TokenRange ks = token_range(p.cu_k, b, p.total_k);
    const int32_t q0 = qs.begin;
    s.seq_k = ks.end - ks.begin;
    const int64_t kt = key_base(ks);
    s.q = int64_t(q0) * p.q_token_stride;
    s.o = int64_t(q0) * p.o_token_stride;
    s.k = kt * p.k_stride[1];
    s.v = kt * p.v_stride[1];
    s.lse0 = q0;  // the logsumexp is [heads_q, total_q]
    s.seq_q = sequence_rows(qs, p.packed_rows);
    if (p.packed_rows > 0) {  // row r: query head (kv head) * packed_rows + r of token q0
      s.lse_head = int64_t(p.packed_rows) * p.total_q;
      s.lse_row = p.total_q;
    } else {
      s.lse_head = p.total_q;
    }
  }
  s.causal_offset = (p.bottom_right ? s.seq_k - s.seq_q : 0) + p.window_right;
  return s;
}

// Shared-memory plan of one tile (all sizes in elements unless named bytes), for both
// instantiations: up to 4 warps share a block's rows.
template <typename T, int BR, int BC, int D>
struct Config {
  static_assert(BR % 16 == 0 && BC % 16 == 0 && D % 16 == 0, "wmma tiles are 16x16");
  static constexpr int kMaxWarps = 4;
  static constexpr int kWarps = BR / 16 < kMaxWarps ? BR / 16 : kMaxWarps;
  static constexpr int kRowTiles = BR / (16 * kWarps);  // 16-row tiles per warp
  static_assert(BR == 16 * kWarps * kRowTiles, "BR must split evenly over the warps");
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 2;
  static constexpr int kLd = D + 8;  // Q, K, V rows (elements of T), padded by 16 bytes
  static constexpr int kQElems = BR * kLd;
  static constexpr int kKVElems = BC * kLd;  // one stage of K or of V
  static constexpr size_t kSmemBytes = size_t(kQElems + 2 * kStages * kKVElems) * sizeof(T);
  // A split's f32 partial output is staged over the whole buffer once the loop is done.
  static_assert(size_t(BR) * D * sizeof(float) <= kSmemBytes, "f32 staging of a block's rows");
  // The layout check at block start borrows 1.5 KB per warp of the K/V buffers.
  static_assert(size_t(kWarps) * 1536 <= size_t(2 * kStages * kKVElems) * sizeof(T),
                "layout-check scratch must fit");
};

// S[mt][n] = Q K^T for the warp's row tiles (Q rows at `q`, K tile at `k`, both row stride LD).
template <typename T, int WM, int NF, int D, int LD>
__device__ inline void qk_tile(FragAcc (&s)[WM][NF], const T* q, const T* k, int lane) {
#pragma unroll
  for (int mt = 0; mt < WM; ++mt) {
#pragma unroll
    for (int n = 0; n < NF; ++n) {
      wm::fill_fragment(s[mt][n], 0.0f);
    }
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    FragA<T> a[WM];
#pragma unroll
    for (int mt = 0; mt < WM; ++mt) {
      load_a(a[mt], q + mt * 16 * LD + kk * 16, LD, lane);
    }
#pragma unroll
    for (int n = 0; n < NF; ++n) {
      FragBCol<T> kb;
      load_b_col(kb, k + n * 16 * LD + kk * 16, LD, lane);
#pragma unroll
      for (int mt = 0; mt < WM; ++mt) {
        wm::mma_sync(s[mt][n], a[mt], kb, s[mt][n]);
      }
    }
  }
}

// O[mt][j] += P[mt] V, P being the probabilities left in `s` (V tile at `v`, row stride LD).
template <typename T, int WM, int NF, int D, int LD>
__device__ inline void pv_tile(FragAcc (&o)[WM][D / 16], const FragAcc (&s)[WM][NF], const T* v,
                               int lane) {
#pragma unroll
  for (int kk = 0; kk < NF; ++kk) {
    FragA<T> pa[WM];
#pragma unroll
    for (int mt = 0; mt < WM; ++mt) {
      acc_to_a(pa[mt], s[mt][kk]);
    }
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      FragBRow<T> vb;
      load_b_row(vb, v + kk * 16 * LD + j * 16, LD, lane);
#pragma unroll
      for (int mt = 0; mt < WM; ++mt) {
        wm::mma_sync(o[mt][j], pa[mt], vb, o[mt][j]);
      }
    }
  }
}

// Sets the scores of keys >= key_limit (the sequence's or the split's end), past each row's
// causal limit, or before its window's lower side (row + lower), to -inf. `row0`: the warp's
// first query row; `key0`: the tile's first key.
template <bool kMods, int WM, int NF>
__device__ inline void mask_tile(FragAcc (&s)[WM][NF], const Params& p, const Sequence& seq,
                                 int key_limit, int lower, int row0, int key0, int lane) {
#pragma unroll
  for (int mt = 0; mt < WM; ++mt) {
#pragma unroll
    for (int n = 0; n < NF; ++n) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int key = key0 + n * 16 + acc_col(lane, i);
        const int row = row0 + mt * 16 + acc_row(lane, i);
        const int limit = p.causal ? row + seq.causal_offset : key_limit;
        if (key >= key_limit || key > limit || (kMods && key < row + lower)) {
          s[mt][n].x[i] = -INFINITY;
        }
      }
    }
  }
}

// Bytes of one element of a bias of `type` (0 f16, 1 bf16, 2 f32).
__device__ constexpr int bias_element_bytes(int type) { return type == 2 ? 4 : 2; }

// Bias element `offset` of a bias of `type` (0 f16, 1 bf16, 2 f32), as a float.
__device__ inline float load_bias(const void* bias, int type, int64_t offset) {
  if (type == 2) {
    return __ldg(static_cast<const float*>(bias) + offset);
  }
  const unsigned short bits = __ldg(static_cast<const unsigned short*>(bias) + offset);
  return type == 0 ? __half2float(__ushort_as_half(bits))
                   : __bfloat162float(__ushort_as_bfloat16(bits));
}

// The modifier pass of one tile's raw scores, which leaves them in log2 units (the softmax's
// factor is then 1): the softcap, out * tanh(x) with tanh(x) = 1 - 2 / (e^2x + 1) from
// ex2.approx and a fast reciprocal (absolute error about 1e-7; saturates to +-1 for large |x|,
// as tanh does), or else the scale; then ALiBi's -slope * |row + diagonal - key|; then, in the
// kBias instantiation, the bias, read from global memory (clamped to its extents; the loop
// prefetched its lines, prefetch_bias). `row0`: the warp's first query row; `key0`: the tile's
// first key. (With a runtime test for the bias inside the loop instead, softcap and ALiBi calls
// took 2.22x and 1.91x their plain time, against 1.77x and 1.41x: H200, 2026-11-24.)
//
// ALiBi's distances are formed in float from one conversion per tile (the lane's share of row -
// key; the rest are constants), so each score costs one add and one fused multiply-add (an
// int-to-float conversion per score measured 1.42x against 1.39x for this form: H200,
// 2026-11-24). Exact below 2^24; beyond, relative error 6e-8.
template <bool kBias, int WM, int NF>
__device__ inline void modify_tile(FragAcc (&s)[WM][NF], const Params& p, const BlockMods& m,
                                   int row0, int key0, int lane) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float slope = m.slope;
  const float lane_gap =
      static_cast<float>(row0 + m.diagonal - key0 + acc_row(lane, 0) - acc_col(lane, 0));
#pragma unroll
  for (int mt = 0; mt < WM; ++mt) {
#pragma unroll
    for (int n = 0; n < NF; ++n) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float& x = s[mt][n].x[i];
        if (p.softcap_out != 0.0f) {
          x = p.softcap_out * (1.0f - __fdividef(2.0f, fast_exp2(x * p.softcap_in) + 1.0f));
        } else {
          x *= p.prescale;
        }
        if (slope != 0.0f) {
          // row - key of element i: the lane's share plus constants (acc_row - acc_col is the
          // lane's share plus a function of i alone).
          const int fixed = 16 * (mt - n) + acc_row(0, i) - acc_col(0, i);
          const float gap = lane_gap + static_cast<float>(fixed);
          x = fmaf(-slope, fabsf(gap), x);
        }
        if (kBias) {
          const int row = min(row0 + mt * 16 + acc_row(lane, i), m.bias_rows - 1);
          const int key = min(key0 + n * 16 + acc_col(lane, i), m.bias_keys - 1);
          const int64_t offset = row * m.bias_row_stride + key * m.bias_key_stride;
          x = fmaf(load_bias(m.bias, m.bias_type, offset), kLog2e, x);
        }
      }
    }
  }
}

// Asks L1 for the lines of the bias rows of the block's key tile [key0, key0 + BC) (one row per
// thread, both ends of its span): issued a tile ahead, they turn modify_tile's loads from
// memory latency (with 4 warps per SM, too few to hide it) into L1 hits.
template <int BR, int BC, int kThreads>
__device__ inline void prefetch_bias(const BlockMods& m, int row0, int key0) {
  const int element_bytes = bias_element_bytes(m.bias_type);
  const int first = min(key0, m.bias_keys - 1);
  const int last = min(key0 + BC - 1, m.bias_keys - 1);
  for (int r = threadIdx.x; r < BR; r += kThreads) {
    const int64_t row = int64_t(min(row0 + r, m.bias_rows - 1)) * m.bias_row_stride;
    const unsigned char* base = static_cast<const unsigned char*>(m.bias);
    for (const int key : {first, last}) {
      const unsigned char* at = base + (row + key * m.bias_key_stride) * element_bytes;
      asm volatile("prefetch.global.L1 [%0];" ::"l"(at));
    }
  }
}

// The warp's output rows normalised by their sums: `pair(row, col, a, b)` takes each pair of
// adjacent values (row within the warp's 16 * WM rows), and, where `with_lse`, `lse(row, value)`
// each row below `valid` its logsumexp, from the lane that holds it.
template <int WM, int NJ, class Pair, class Lse>
__device__ inline void normalised_rows(const FragAcc (&o)[WM][NJ], RowState (&rows)[WM], int lane,
                                       int valid, bool with_lse, Pair&& pair, Lse&& lse) {
#pragma unroll
  for (int mt = 0; mt < WM; ++mt) {
    rows[mt].reduce_sums();
    const float inv_l[2] = {rows[mt].inv_sum(0), rows[mt].inv_sum(1)};
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const float f = inv_l[row_half(i)];
        pair(mt * 16 + acc_row(lane, i), j * 16 + acc_col(lane, i), o[mt][j].x[i] * f,
             o[mt][j].x[i + 1] * f);
      }
    }
    if (with_lse && lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = mt * 16 + lane / 4 + 8 * r;
        if (row < valid) {
          lse(row, rows[mt].lse(r));
        }
      }
    }
  }
}

// Copies the warp's staged rows below `valid` (of 16 * WM; row stride `ld` elements of Elem) to
// `dst(row)` in 16-byte vectors of V, `row_elements` per row (a multiple of the vector), after
// the warp's staging stores.
template <int WM, typename V, typename Elem, class Dst>
__device__ inline void copy_staged_rows(const Elem* stage, int ld, int valid, int row_elements,
                                        int lane, Dst&& dst) {
  static_assert(sizeof(V) == 16, "16-byte vectors");
  constexpr int kPer = int(sizeof(V) / sizeof(Elem));
  __syncwarp();
  const int chunks = row_elements / kPer;
  for (int i = lane; i < 16 * WM * chunks; i += 32) {
    const int r = i / chunks;
    const int c = (i % chunks) * kPer;
    if (r < valid) {
      *reinterpret_cast<V*>(dst(r) + c) = *reinterpret_cast<const V*>(stage + r * ld + c);
    }
  }
}

// A split's partial state: the warp's output rows normalised by l, in f32, and their logsumexps,
// at rows `part` + query row * `part_row` (the logsumexp's row step) of p.part_out (rows of
// head_dim) and p.part_lse. The rows are staged in `stage` (the warp's ROWS x D floats of shared
// memory, free once the loop is done) and leave as 16-byte vectors, as the dense epilogue does
// (computing global addresses per fragment element instead needs registers the loop's
// accumulators leave none of).
template <int WM, int NJ, int D>
__device__ inline void store_partial(const FragAcc (&o)[WM][NJ], RowState (&rows)[WM],
                                     float* stage, const Params& p, int seq_q, int warp_row0,
                                     int64_t part, int64_t part_row, int lane) {
  const int valid = seq_q - warp_row0;
  normalised_rows<WM, NJ>(
      o, rows, lane, valid, true,
      [&](int r, int c, float a, float b) {
        *reinterpret_cast<float2*>(stage + r * D + c) = make_float2(a, b);
      },
      [&](int r, float lse) { p.part_lse[part + (warp_row0 + r) * part_row] = lse; });
  copy_staged_rows<WM, float4>(stage, D, valid, p.head_dim, lane, [&](int r) {
    return p.part_out + (part + (warp_row0 + r) * part_row) * p.head_dim;
  });
}

// kMods: the instantiation that applies score modifiers (a softcap, a sliding window, ALiBi); the
// plain one compiles them out, as their registers would make its largest tiles spill.
template <typename T, int BR, int BC, int D, bool kMods>
__global__ void __launch_bounds__(Config<T, BR, BC, D>::kThreads, 1)
    fmha_wmma_kernel(const Params p) {
  using C = Config<T, BR, BC, D>;
  constexpr int WM = C::kRowTiles;
  constexpr int NF = BC / 16;  // score fragments per row tile
  constexpr int NJ = D / 16;   // output fragments per row tile

  const int64_t b = blockIdx.z;
  const int64_t h = blockIdx.y;
  const Sequence seq = sequence(p, b, gridDim.y);
  const int m_blocks = gridDim.x / p.splits;
  const int split = blockIdx.x / m_blocks;
  const int row0 = (blockIdx.x % m_blocks) * BR;
  if (row0 >= seq.seq_q) {
    return;  // a sequence shorter than the batch's longest: the whole block is idle
  }

  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  T* s_q = reinterpret_cast<T*>(smem);
  T* s_k = s_q + C::kQElems;
  T* s_v = s_k + C::kStages * C::kKVElems;

  if (!layout_matches<T>(reinterpret_cast<unsigned char*>(s_k) + warp * 1536, lane)) {
    __trap();  // this GPU's wmma fragments differ from fragments.cuh: refuse, never compute wrong
  }
  __syncthreads();  // the scratch is K/V space, about to be filled

  const int64_t kvh = h / p.group;
  const int warp_row0 = row0 + warp * 16 * WM;  // the warp's first query row
  const T* q = static_cast<const T*>(p.q) + seq.q + h * p.q_stride[2];
  const T* k = static_cast<const T*>(p.k) + seq.k + kvh * p.k_stride[2];
  const T* v = static_cast<const T*>(p.v) + seq.v + kvh * p.v_stride[2];

  // Keys any row of this block may see: its split's, up to the causal limit, from its window's
  // lower side. Validation gives every row a key, so without splits the loop runs at least
  // once; a later split may hold no visible key, and a variable-length batch whose device
  // offsets break their contract may have rows that see none (key_end <= key_begin): they end
  // with l = 0, written as 0 and lse -inf. (The loop holds only key_limit: keys past it are
  // zero-filled by the copies and masked.) A window's lower side: row i sees no key below
  // i + lower (a large negative number without one); the block starts at the key tile holding
  // its first row's first key.
  const int lower = !kMods || p.window_left < 0
                        ? INT_MIN / 2
                        : seq.causal_offset - p.window_right - p.window_left;
  const int split_begin = split * p.split_keys;
  const int key_limit = min(seq.seq_k, split_begin + p.split_keys);
  const int key_begin = kMods ? max(split_begin, max(row0 + lower, 0) / BC * BC) : split_begin;
  const int key_end = p.causal ? min(key_limit, row0 + BR + seq.causal_offset) : key_limit;
  __shared__ BlockMods s_mods;
  if (kMods && threadIdx.x == 0) {
    constexpr float kLog2e = 1.4426950408889634f;
    s_mods.lower = lower;
    s_mods.diagonal = seq.causal_offset - p.window_right;
    s_mods.slope = p.alibi == nullptr ? 0.0f : p.alibi[b * p.alibi_batch_stride + h] * kLog2e;
    const int64_t bias_slice = b * p.bias_stride[0] + h * p.bias_stride[2];
    s_mods.bias = p.bias == nullptr ? nullptr
                                    : static_cast<const unsigned char*>(p.bias) +
                                          bias_slice * bias_element_bytes(p.bias_type);
    s_mods.bias_row_stride = p.bias_stride[1];
    s_mods.bias_key_stride = p.bias_stride[3];
    s_mods.bias_type = p.bias_type;
    s_mods.bias_rows = p.bias_rows;
    s_mods.bias_keys = p.bias_keys;
  }
  // The last key the warp's last row may see (causal); with a window, the first key its first row
  // may see is warp_key_begin (in the loop): the warp skips tiles outside them, and every tile
  // when it has no query row (decode fills few of a block's rows).
  const int warp_key_end = warp_row0 >= seq.seq_q ? -1
                           : p.causal             ? warp_row0 + 16 * WM - 1 + seq.causal_offset
                                                  : key_limit;

  const TileCopy<BC, D, C::kLd, C::kThreads, T> k_copy(k, p.k_stride[1], key_limit, p.head_dim);
  const TileCopy<BC, D, C::kLd, C::kThreads, T> v_copy(v, p.v_stride[1], key_limit, p.head_dim);
  // A paged cache's page indices, staged ahead of the copies (pages.cuh).
  __shared__ int32_t s_pages[PageRing<BC>::kSlots * PageRing<BC>::kPerTile];
  const PageRing<BC> pages{s_pages, p.block_table + blockIdx.z * p.pages_per_seq, p.pages_per_seq,
                           p.page_shift};
  // Starts the K and V tiles of keys [key0, key0 + BC) (the block's key tile t) into stage
  // buffer `buf`; with a paged cache, requests the page indices of tile t + 2 as well.
  const auto start_kv = [&](int buf, int t, int key0) {
    T* const k_tile = s_k + buf * C::kKVElems;
    T* const v_tile = s_v + buf * C::kKVElems;
    if (p.block_table == nullptr) {
      k_copy.start(k_tile, key0);
      v_copy.start(v_tile, key0);
    } else {
      const int32_t* tile_pages = pages.slot(t);
      constexpr int kPages = PageRing<BC>::kPerTile;
      k_copy.template start_paged<kPages>(k_tile, key0, tile_pages, p.page_shift, p.k_stride[0],
                                          p.last_page);
      v_copy.template start_paged<kPages>(v_tile, key0, tile_pages, p.page_shift, p.v_stride[0],
                                          p.last_page);
      if (key0 + 2 * BC < key_end) {
        pages.fetch(t + 2, key0 + 2 * BC, true);
      }
    }
  };
  if (p.block_table != nullptr) {  // tiles 0 and 1's pages, before any copy reads them
    pages.fetch(0, key_begin, false);
    pages.fetch(1, key_begin + BC, false);
    __syncthreads();
  }
  TileCopy<BR, D, C::kLd, C::kThreads, T>(q, p.q_stride[1], seq.seq_q, p.head_dim).start(s_q, row0);
  start_kv(0, 0, key_begin);
  __pipeline_commit();

  FragAcc o[WM][NJ];
#pragma unroll
  for (int mt = 0; mt < WM; ++mt) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      wm::fill_fragment(o[mt][j], 0.0f);
    }
  }
  RowState rows[WM];
  T* s_qw = s_q + (warp * 16 * WM) * C::kLd;  // the warp's Q rows, its output rows at the end

  for (int key0 = key_begin, stage = 0, t = 0; key0 < key_end; key0 += BC, stage ^= 1, ++t) {
    if (key0 + BC < key_end) {
      start_kv(1 - stage, t + 1, key0 + BC);
    }
    __pipeline_commit();
    __pipeline_wait_prior(1);  // everything but the tile just requested has landed
    __syncthreads();
    if (kMods && p.bias != nullptr && key0 + BC < key_end) {
      prefetch_bias<BR, BC, C::kThreads>(s_mods, row0, key0 + BC);
    }

    // Else no row of this warp sees a key of the tile (past its causal limit or before its
    // window).
    const int warp_key_begin = kMods ? warp_row0 + s_mods.lower : 0;
    if (key0 <= warp_key_end && (!kMods || key0 + BC > warp_key_begin)) {
      FragAcc s[WM][NF];
      qk_tile<T, WM, NF, D, C::kLd>(s, s_qw, s_k + stage * C::kKVElems, lane);
      if (kMods && p.bias != nullptr) {
        modify_tile<true>(s, p, s_mods, warp_row0, key0, lane);
      } else if (kMods && (p.softcap_out != 0.0f || p.alibi != nullptr)) {
        modify_tile<false>(s, p, s_mods, warp_row0, key0, lane);
      }
      if (key0 + BC > key_limit || (p.causal && key0 + BC - 1 > warp_row0 + seq.causal_offset) ||
          (kMods && key0 < warp_key_begin + 16 * WM - 1)) {
        mask_tile<kMods>(s, p, seq, key_limit, warp_key_begin - warp_row0, warp_row0, key0, lane);
      }
#pragma unroll
      for (int mt = 0; mt < WM; ++mt) {
        float alpha[2];
        rows[mt].update(s[mt], p.scale_log2, alpha);
        rescale(o[mt], alpha);
      }
      pv_tile<T, WM, NF, D, C::kLd>(o, s, s_v + stage * C::kKVElems, lane);
    }
    __syncthreads();  // the stage just read is refilled by the next iteration
  }
  __pipeline_wait_prior(0);
  // Every thread's copies have landed before a warp stages its output over its Q rows (without
  // a key tile the loop's barriers never ran, and other threads' Q copies may be in flight).
  __syncthreads();

  // The sequence's output offsets are read again rather than held through the loop, whose
  // accumulators take every register.
  const Sequence out_seq = sequence(p, blockIdx.z, gridDim.y);
  if (p.splits > 1) {  // one split of the keys: its f32 partial state (split/combine.cuh)
    // The split and head from blockIdx again (held as `split` and `h`, ptxas spilled 4 bytes
    // in the 128x32x128 tile).
    const int64_t part = out_seq.lse0 + int64_t(blockIdx.y) * out_seq.lse_head +
                         int64_t(blockIdx.x / (gridDim.x / p.splits)) * p.part_rows;
    float* stage = reinterpret_cast<float*>(smem) + warp * 16 * WM * D;
    store_partial<WM, NJ, D>(o, rows, stage, p, out_seq.seq_q, warp_row0, part, out_seq.lse_row,
                             lane);
    return;
  }

  // Epilogue: normalise by l, stage the warp's rows as T over its own (now unused) Q rows, then
  // write 16-byte vectors; the log-sum-exp (natural log) when asked.
  const int valid = out_seq.seq_q - warp_row0;
  normalised_rows<WM, NJ>(
      o, rows, lane, valid, p.lse != nullptr,
      [&](int r, int c, float a, float b) {
        *reinterpret_cast<uint32_t*>(s_qw + r * C::kLd + c) = pack2(T(), a, b);
      },
      [&](int r, float lse) {
        p.lse[out_seq.lse0 + int64_t(blockIdx.y) * out_seq.lse_head +
              (warp_row0 + r) * out_seq.lse_row] = lse;
      });
  T* out = static_cast<T*>(p.out) + out_seq.o + int64_t(blockIdx.y) * p.o_stride[2];
  copy_staged_rows<WM, uint4>(s_qw, C::kLd, valid, p.head_dim, lane, [&](int r) {
    return out + int64_t(warp_row0 + r) * p.o_stride[1];
  });
}

}  // namespace flashcore::wmma_fa
