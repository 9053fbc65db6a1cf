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

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "copy.cuh"
#include "fragments.cuh"
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
  float scale_log2;       // softmax scale * log2(e): a positive normal float (launch.cuh)
  // A variable-length batch: batch + 1 offsets into the token axis of q/out and k/v (null:
  // dense), clamped on read to [0, total] so that no offset leads outside the tensors.
  const int32_t* cu_q;
  const int32_t* cu_k;
  int32_t total_q, total_k;
};

// One block's sequence: element offsets of its token 0 in q, k, v and out, its lengths and
// causal offset, and where its logsumexp rows start (head 0; heads lse_head apart).
struct Sequence {
  int64_t q, k, v, o;
  int32_t seq_q, seq_k, causal_offset;
  int64_t lse0, lse_head;
};

// Batch entry (dense) or sequence (varlen) `b` of `heads` query heads.
__device__ inline Sequence sequence(const Params& p, int64_t b, int64_t heads) {
  Sequence s;
  if (p.cu_q == nullptr) {
    s.q = b * p.q_stride[0];
    s.k = b * p.k_stride[0];
    s.v = b * p.v_stride[0];
    s.o = b * p.o_stride[0];
    s.seq_q = p.seq_q;
    s.seq_k = p.seq_k;
    s.lse0 = b * heads * p.seq_q;
    s.lse_head = p.seq_q;
  } else {
    const int32_t q0 = min(max(p.cu_q[b], 0), p.total_q);
    const int32_t q1 = min(max(p.cu_q[b + 1], q0), p.total_q);
    const int32_t k0 = min(max(p.cu_k[b], 0), p.total_k);
    const int32_t k1 = min(max(p.cu_k[b + 1], k0), p.total_k);
    s.seq_q = q1 - q0;
    s.seq_k = k1 - k0;
    const int64_t kt = s.seq_k > 0 ? k0 : 0;  // a keyless sequence keeps an in-bounds base
    s.q = int64_t(q0) * p.q_stride[1];
    s.o = int64_t(q0) * p.o_stride[1];
    s.k = kt * p.k_stride[1];
    s.v = kt * p.v_stride[1];
    s.lse0 = q0;
    s.lse_head = p.total_q;
  }
  s.causal_offset = p.bottom_right ? s.seq_k - s.seq_q : 0;
  return s;
}

// Shared-memory plan of one instantiation (all sizes in elements unless named bytes).
template <typename T, int BR, int BC, int D>
struct Config {
  static_assert(BR % 16 == 0 && BC % 16 == 0 && D % 16 == 0, "wmma tiles are 16x16");
  static constexpr int kWarps = BR / 16 < 4 ? BR / 16 : 4;
  static constexpr int kRowTiles = BR / (16 * kWarps);  // 16-row tiles per warp
  static_assert(BR == 16 * kWarps * kRowTiles, "BR must split evenly over the warps");
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 2;
  static constexpr int kLd = D + 8;  // Q, K, V rows (elements of T), padded by 16 bytes
  static constexpr int kQElems = BR * kLd;
  static constexpr int kKVElems = BC * kLd;  // one stage of K or of V
  static constexpr size_t kSmemBytes = size_t(kQElems + 2 * kStages * kKVElems) * sizeof(T);
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

// Sets the scores of keys >= seq_k, or past each row's causal limit, to -inf.
// `row0`: the warp's first query row; `key0`: the tile's first key.
template <int WM, int NF>
__device__ inline void mask_tile(FragAcc (&s)[WM][NF], const Params& p, const Sequence& seq,
                                 int row0, int key0, int lane) {
#pragma unroll
  for (int mt = 0; mt < WM; ++mt) {
#pragma unroll
    for (int n = 0; n < NF; ++n) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int key = key0 + n * 16 + acc_col(lane, i);
        const int limit =
            p.causal ? row0 + mt * 16 + acc_row(lane, i) + seq.causal_offset : seq.seq_k;
        if (key >= seq.seq_k || key > limit) {
          s[mt][n].x[i] = -INFINITY;
        }
      }
    }
  }
}

template <typename T, int BR, int BC, int D>
__global__ void __launch_bounds__(Config<T, BR, BC, D>::kThreads, 1)
    fmha_wmma_kernel(const Params p) {
  using C = Config<T, BR, BC, D>;
  constexpr int WM = C::kRowTiles;
  constexpr int NF = BC / 16;  // score fragments per row tile
  constexpr int NJ = D / 16;   // output fragments per row tile

  const int64_t b = blockIdx.z;
  const int64_t h = blockIdx.y;
  const Sequence seq = sequence(p, b, gridDim.y);
  const int row0 = blockIdx.x * BR;
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

  // Keys any row of this block may see. Validation gives every row key 0 (n_tiles >= 1); only a
  // variable-length batch whose device offsets break their contract has rows that see none
  // (n_tiles may then be 0 or less): they end with l = 0, written as 0 and lse -inf.
  const int key_end = p.causal ? min(seq.seq_k, row0 + BR + seq.causal_offset) : seq.seq_k;
  const int n_tiles = (key_end + BC - 1) / BC;
  // The last key the warp's last row may see (causal); the warp skips tiles past it.
  const int warp_key_end = p.causal ? warp_row0 + 16 * WM - 1 + seq.causal_offset : seq.seq_k;

  const TileCopy<BC, D, C::kLd, C::kThreads, T> k_copy(k, p.k_stride[1], seq.seq_k, p.head_dim);
  const TileCopy<BC, D, C::kLd, C::kThreads, T> v_copy(v, p.v_stride[1], seq.seq_k, p.head_dim);
  TileCopy<BR, D, C::kLd, C::kThreads, T>(q, p.q_stride[1], seq.seq_q, p.head_dim).start(s_q, row0);
  k_copy.start(s_k, 0);
  v_copy.start(s_v, 0);
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

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % 2;
    const int key0 = t * BC;
    if (t + 1 < n_tiles) {
      k_copy.start(s_k + (1 - stage) * C::kKVElems, key0 + BC);
      v_copy.start(s_v + (1 - stage) * C::kKVElems, key0 + BC);
    }
    __pipeline_commit();
    __pipeline_wait_prior(1);  // everything but the tile just requested has landed
    __syncthreads();

    if (key0 <= warp_key_end) {  // else no row of this warp sees a key of the tile
      FragAcc s[WM][NF];
      qk_tile<T, WM, NF, D, C::kLd>(s, s_qw, s_k + stage * C::kKVElems, lane);
      if (key0 + BC > seq.seq_k ||
          (p.causal && key0 + BC - 1 > warp_row0 + seq.causal_offset)) {
        mask_tile(s, p, seq, warp_row0, key0, lane);
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

  // Epilogue: normalise by l, stage the warp's rows as T over its own (now unused) Q rows, then
  // write 16-byte vectors; the log-sum-exp (natural log) when asked.
#pragma unroll
  for (int mt = 0; mt < WM; ++mt) {
    rows[mt].reduce_sums();
    // l = 0: a row that saw no key (see n_tiles); its output is 0, not 0 * inf.
    const float inv_l[2] = {rows[mt].l[0] > 0.0f ? 1.0f / rows[mt].l[0] : 0.0f,
                            rows[mt].l[1] > 0.0f ? 1.0f / rows[mt].l[1] : 0.0f};
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const float f = inv_l[row_half(i)];
        *reinterpret_cast<uint32_t*>(s_qw + (mt * 16 + acc_row(lane, i)) * C::kLd + j * 16 +
                                     acc_col(lane, i)) =
            pack2(T(), o[mt][j].x[i] * f, o[mt][j].x[i + 1] * f);
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
      constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int q_row = warp_row0 + mt * 16 + lane / 4 + 8 * r;
        if (q_row < seq.seq_q) {
          p.lse[seq.lse0 + h * seq.lse_head + q_row] =
              (rows[mt].m[r] + log2f(rows[mt].l[r])) * kLn2;
        }
      }
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(p.out) + seq.o + h * p.o_stride[2];
  const int chunks = p.head_dim / 8;  // 16-byte chunks per row
  for (int i = lane; i < 16 * WM * chunks; i += 32) {
    const int r = i / chunks;
    const int c = (i % chunks) * 8;
    const int q_row = warp_row0 + r;
    if (q_row < seq.seq_q) {
      *reinterpret_cast<uint4*>(out + int64_t(q_row) * p.o_stride[1] + c) =
          *reinterpret_cast<const uint4*>(s_qw + r * C::kLd + c);
    }
  }
}

}  // namespace flashcore::wmma_fa
