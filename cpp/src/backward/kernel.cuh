// flashcore's backward kernels: the gradients of attention (FlashAttention-2's algorithm) on
// tensor cores through nvcuda::wmma's documented loads and stores (16x16x16, f32 accumulation).
//
//   row_sums:  D_i = dO_i . O_i per query row, and the row's f32 dQ accumulator zeroed;
//   key_block: one block per (64 keys, kv head, sequence) holds K and V in shared memory and
//              dK, dV in its warps' accumulators; for every query head of its group and every
//              32-row query tile that sees its keys it recomputes
//                S = Q K^T, P = exp(s(S) - lse), dP = dO V^T, dS = P (dP - D) s'(S),
//              then dV += P^T dO, dK += dS^T Q, and adds dS K to the rows' dQ accumulators
//              (f32 atomics: other key blocks add to the same rows);
//   convert:   dQ from its accumulator to the output type and strides.
// s(x) is the score: x * scale, or cap * tanh(x * scale / cap), minus ALiBi's slope times the
// distance from the diagonal, plus the bias; s' is its derivative in x. Masked keys and rows
// whose logsumexp is -inf (they saw no key) have P = 0. A variable-length batch's sequences each
// have their own lengths and mask (offsets clamped on read: sequences.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "backward/launch.h"
#include "element.cuh"
#include "core/backward.h"
#include "sequences.cuh"

namespace flashcore::backward {

namespace wm = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 16 * kWarps;  // keys per block: each warp owns 16 key rows of dK and dV
constexpr int kRows = 32;           // query rows per step
static_assert(kKeys == core::kBackwardKeys && kRows == core::kBackwardRows, "core/backward.h");

// Shared-memory plan of the key-block kernel for head dim tier D (elements of T unless named).
template <typename T, int D>
struct Smem {
  static constexpr int kLd = D + 8;       // K, V, Q, dO rows, padded by 16 bytes
  static constexpr int kLs = kKeys + 4;   // f32 score rows (S, dP)
  static constexpr int kLp = kKeys + 8;   // P, dS rows of T
  static constexpr int kLq = D + 4;       // f32 dQ rows of a step
  static constexpr size_t kKv = size_t(kKeys) * kLd * sizeof(T);      // K or V
  static constexpr size_t kQ = size_t(kRows) * kLd * sizeof(T);       // Q or dO
  static constexpr size_t kS = size_t(kRows) * kLs * sizeof(float);   // S or dP
  static constexpr size_t kP = size_t(kRows) * kLp * sizeof(T);       // P or dS
  static constexpr size_t kBytes = 2 * kKv + 2 * kQ + 2 * kS + 2 * kP;
  // A step's dQ (f32) reuses S and dP; dK and dV leave through K and V's space.
  static_assert(size_t(kRows) * kLq * sizeof(float) <= 2 * kS, "dQ staging fits S and dP");
  static_assert(size_t(kKeys) * kLq * sizeof(float) <= 2 * kKv, "dK staging fits K and V");
  static_assert(sizeof(T) != 2 || int64_t(kBytes) == core::backward_smem_bytes(D),
                "core/backward.h plans this layout");
};

// Copies ROWS rows of one head (`stride`: elements between rows) into `dst` (row stride LD),
// zero from row `limit` on and past `head_dim` columns (a multiple of 8).
template <typename T, int ROWS, int D, int LD>
__device__ inline void load_rows(T* dst, const T* src, int64_t stride, int64_t limit,
                                 int head_dim) {
  constexpr int kVec = 8;  // 16 bytes
  for (int e = threadIdx.x; e < ROWS * (D / kVec); e += kThreads) {
    const int r = e / (D / kVec), c = e % (D / kVec) * kVec;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r < limit && c < head_dim) {
      value = *reinterpret_cast<const uint4*>(src + r * stride + c);
    }
    *reinterpret_cast<uint4*>(dst + r * LD + c) = value;
  }
}

// The bias element [b, i, h, j] (launch.h: BackwardLaunch::bias).
__device__ inline float bias_at(const BackwardLaunch& p, int64_t b, int64_t i, int64_t h,
                                int64_t j) {
  const int64_t at =
      b * p.bias_stride[0] + i * p.bias_stride[1] + h * p.bias_stride[2] + j * p.bias_stride[3];
  switch (p.bias_type) {
    case 0: return to_float(static_cast<const __half*>(p.bias)[at]);
    case 1: return to_float(static_cast<const __nv_bfloat16*>(p.bias)[at]);
    default: return static_cast<const float*>(p.bias)[at];
  }
}

// The logsumexp's rows per head and its batch entries: [entries, heads_q, head_rows] (a
// variable-length batch's: [1, heads_q, total_q]), the order of the row sums and of dQ's
// accumulator rows.
__device__ inline int64_t head_rows(const BackwardLaunch& p) {
  return p.cu_q != nullptr ? p.total_q : p.seq_q;
}
__device__ inline int64_t entries(const BackwardLaunch& p) {
  return p.cu_q != nullptr ? 1 : p.batch;
}

// D_i = dO_i . O_i (one warp per logsumexp row), and the row's dQ accumulator (D columns)
// zeroed.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) row_sums(__grid_constant__ const BackwardLaunch p, float* sums,
                                                     float* dq_acc) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t rows = entries(p) * p.heads_q * head_rows(p);
  if (row >= rows) {
    return;
  }
  const int64_t i = row % head_rows(p), bh = row / head_rows(p);
  const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
  const T* o = static_cast<const T*>(p.out) + b * p.o_stride[0] + i * p.o_stride[1] +
               h * p.o_stride[2];
  const T* g = static_cast<const T*>(p.dout) + b * p.do_stride[0] + i * p.do_stride[1] +
               h * p.do_stride[2];
  float sum = 0.f;
  for (int c = lane; c < p.head_dim; c += 32) {
    sum += to_float(o[c]) * to_float(g[c]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  if (lane == 0) {
    sums[row] = sum;
  }
  for (int c = lane; c < D; c += 32) {
    dq_acc[row * D + c] = 0.f;
  }
}

// Adds `rows` rows of f32 `src` (row stride LD) to the dQ accumulator rows at `dst` (row stride
// D), columns below `head_dim` (a multiple of 8): f32 atomics, four at once from compute
// capability 9.0 on.
template <int D>
__device__ inline void add_rows(float* dst, const float* src, int ld, int64_t rows, int head_dim) {
#if __CUDA_ARCH__ >= 900
  for (int e = threadIdx.x; e < kRows * (D / 4); e += kThreads) {
    const int r = e / (D / 4), c = e % (D / 4) * 4;
    if (r < rows && c < head_dim) {
      const float* x = src + r * ld + c;
      atomicAdd(reinterpret_cast<float4*>(dst + r * D + c), make_float4(x[0], x[1], x[2], x[3]));
    }
  }
#else
  for (int e = threadIdx.x; e < kRows * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (r < rows && c < head_dim) {
      atomicAdd(dst + r * D + c, src[r * ld + c]);
    }
  }
#endif
}

// Sequence b of a launch (batch entry b of a dense one): its batch entry and first query and
// key tokens in the tensors, its lengths, its first logsumexp row (head 0) and rows per head,
// and its mask: key j is visible to row i when lo <= j - i <= hi (a side without has_*:
// unbounded); ALiBi's distance is |i + diagonal - j|.
struct Seq {
  int64_t entry, q0, k0, seq_q, seq_k, row0, rows;
  int64_t diagonal, lo, hi;
  bool has_lo, has_hi;
};
__device__ inline Seq sequence_of(const BackwardLaunch& p, int64_t b) {
  Seq s;
  if (p.cu_q == nullptr) {
    s.entry = b, s.q0 = 0, s.k0 = 0, s.seq_q = p.seq_q, s.seq_k = p.seq_k;
    s.row0 = b * p.heads_q * p.seq_q, s.rows = p.seq_q;
  } else {
    const TokenRange q = token_range(p.cu_q, b, p.total_q);
    const TokenRange k = token_range(p.cu_k, b, p.total_k);
    s.entry = 0, s.q0 = q.begin, s.k0 = key_base(k);
    s.seq_q = q.end - q.begin, s.seq_k = k.end - k.begin;
    s.row0 = q.begin, s.rows = p.total_q;
  }
  s.diagonal = p.bottom_right ? s.seq_k - s.seq_q : 0;
  s.has_hi = p.causal || p.window_right >= 0;
  s.hi = s.diagonal + (p.causal ? 0 : p.window_right);
  s.has_lo = p.window_left >= 0;
  s.lo = s.diagonal - p.window_left;
  return s;
}

// The query rows [first, end) of sequence `s` that see any of the keys [j0, j0 + kKeys)
// (clamped to its keys; j0 below its key count).
struct RowRange {
  int64_t first, end;
};
__device__ inline RowRange rows_seeing(const Seq& s, int64_t j0) {
  const int64_t j1 = min(j0 + kKeys, s.seq_k) - 1;  // the block's last key
  // Visible: lo <= j - i <= hi, so i >= j0 - hi and i <= j1 - lo.
  const int64_t first = s.has_hi ? max(int64_t(0), j0 - s.hi) : 0;
  const int64_t end = s.has_lo ? min(s.seq_q, j1 - s.lo + 1) : s.seq_q;
  return {first, max(first, end)};
}

// Writes `keys` key rows of a gradient (the warps' accumulators `acc`) to `out` (the block's
// first key row of its kv head; rows `stride` elements apart), through `stage` (f32 rows of
// Smem::kLq).
template <typename T, int D>
__device__ inline void store_rows(const wm::fragment<wm::accumulator, 16, 16, 16, float> (&acc)[D / 16],
                                  float* stage, T* out, int64_t stride, int64_t keys,
                                  int head_dim) {
  using S = Smem<T, D>;
  const int warp = threadIdx.x / 32;
  __syncthreads();  // the stage is free (K, V, or the previous gradient, are read)
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wm::store_matrix_sync(stage + warp * 16 * S::kLq + n * 16, acc[n], S::kLq, wm::mem_row_major);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kKeys * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (r < keys && c < head_dim) {
      out[r * stride + c] = from_float<T>(stage[r * S::kLq + c]);
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) key_block(__grid_constant__ const BackwardLaunch p, const float* sums,
                                                      float* dq_acc) {
  using S = Smem<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kKeys * S::kLd;
  T* qs = vs + kKeys * S::kLd;
  T* dos = qs + kRows * S::kLd;
  float* ss = reinterpret_cast<float*>(dos + kRows * S::kLd);
  float* dps = ss + kRows * S::kLs;
  T* ps = reinterpret_cast<T*>(dps + kRows * S::kLs);
  T* dss = ps + kRows * S::kLp;
  float* dqs = ss;  // a step's dQ, after S and dP are consumed

  const int warp = threadIdx.x / 32;
  const int64_t j0 = int64_t(blockIdx.x) * kKeys;
  const int64_t kvh = blockIdx.y, b = blockIdx.z;
  const int group = p.heads_q / p.heads_kv;
  const Seq seq = sequence_of(p, b);
  if (j0 >= seq.seq_k) {
    return;  // past this sequence's keys (a variable-length batch's shorter ones)
  }
  const int64_t kt = seq.k0 + j0;  // the block's first key token
  const T* k = static_cast<const T*>(p.k) + seq.entry * p.k_stride[0] + kt * p.k_stride[1] +
               kvh * p.k_stride[2];
  const T* v = static_cast<const T*>(p.v) + seq.entry * p.v_stride[0] + kt * p.v_stride[1] +
               kvh * p.v_stride[2];
  load_rows<T, kKeys, D, S::kLd>(ks, k, p.k_stride[1], seq.seq_k - j0, p.head_dim);
  load_rows<T, kKeys, D, S::kLd>(vs, v, p.v_stride[1], seq.seq_k - j0, p.head_dim);

  constexpr int kCols = D / 16;
  wm::fragment<wm::accumulator, 16, 16, 16, float> dk[kCols], dv[kCols];
#pragma unroll
  for (int n = 0; n < kCols; ++n) {
    wm::fill_fragment(dk[n], 0.f);
    wm::fill_fragment(dv[n], 0.f);
  }

  const RowRange range = rows_seeing(seq, j0);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const float slope = p.alibi != nullptr ? p.alibi[b * p.alibi_batch_stride + h] : 0.f;
    const int64_t lse0 = seq.row0 + h * seq.rows;  // row sums, logsumexps, dQ accumulators
    for (int64_t i0 = range.first / kRows * kRows; i0 < range.end; i0 += kRows) {
      __syncthreads();  // the previous step is done with Q, dO, P, dS and dQ
      const int64_t qt = seq.q0 + i0;  // the step's first query token
      const T* q = static_cast<const T*>(p.q) + seq.entry * p.q_stride[0] + qt * p.q_stride[1] +
                   h * p.q_stride[2];
      const T* dout = static_cast<const T*>(p.dout) + seq.entry * p.do_stride[0] +
                      qt * p.do_stride[1] + h * p.do_stride[2];
      load_rows<T, kRows, D, S::kLd>(qs, q, p.q_stride[1], seq.seq_q - i0, p.head_dim);
      load_rows<T, kRows, D, S::kLd>(dos, dout, p.do_stride[1], seq.seq_q - i0, p.head_dim);
      __syncthreads();

      // S = Q K^T and dP = dO V^T: warp w computes key columns [16w, 16w + 16) of both.
#pragma unroll
      for (int mt = 0; mt < kRows / 16; ++mt) {
        wm::fragment<wm::accumulator, 16, 16, 16, float> s, dp;
        wm::fill_fragment(s, 0.f);
        wm::fill_fragment(dp, 0.f);
#pragma unroll
        for (int kk = 0; kk < kCols; ++kk) {
          wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> a;
          wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major> bt;
          wm::load_matrix_sync(a, qs + mt * 16 * S::kLd + kk * 16, S::kLd);
          wm::load_matrix_sync(bt, ks + warp * 16 * S::kLd + kk * 16, S::kLd);
          wm::mma_sync(s, a, bt, s);
          wm::load_matrix_sync(a, dos + mt * 16 * S::kLd + kk * 16, S::kLd);
          wm::load_matrix_sync(bt, vs + warp * 16 * S::kLd + kk * 16, S::kLd);
          wm::mma_sync(dp, a, bt, dp);
        }
        wm::store_matrix_sync(ss + mt * 16 * S::kLs + warp * 16, s, S::kLs, wm::mem_row_major);
        wm::store_matrix_sync(dps + mt * 16 * S::kLs + warp * 16, dp, S::kLs, wm::mem_row_major);
      }
      __syncthreads();

      // P and dS, element by element, with the mask and the score modifiers.
      for (int e = threadIdx.x; e < kRows * kKeys; e += kThreads) {
        const int r = e / kKeys, c = e % kKeys;
        const int64_t i = i0 + r, j = j0 + c;
        float prob = 0.f, ds = 0.f;
        const int64_t gap = j - i;
        const bool visible = i < seq.seq_q && j < seq.seq_k && (!seq.has_lo || gap >= seq.lo) &&
                             (!seq.has_hi || gap <= seq.hi);
        const float lse = visible ? p.lse[lse0 + i] : -INFINITY;
        if (lse != -INFINITY) {
          const float x = ss[r * S::kLs + c];
          float score = x * p.scale, derivative = p.scale;
          if (p.softcap > 0.f) {
            const float t = tanhf(score / p.softcap);
            score = p.softcap * t;
            derivative = p.scale * (1.f - t * t);
          }
          if (p.alibi != nullptr) {
            score -= slope * float(llabs(i + seq.diagonal - j));
          }
          if (p.bias != nullptr) {
            score += bias_at(p, b, i, h, j);
          }
          prob = __expf(score - lse);
          ds = prob * (dps[r * S::kLs + c] - sums[lse0 + i]) * derivative;
        }
        ps[r * S::kLp + c] = from_float<T>(prob);
        dss[r * S::kLp + c] = from_float<T>(ds);
      }
      __syncthreads();

      // dV += P^T dO and dK += dS^T Q for the warp's 16 keys.
#pragma unroll
      for (int kk = 0; kk < kRows / 16; ++kk) {
        wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::col_major> pt, dst;
        wm::load_matrix_sync(pt, ps + kk * 16 * S::kLp + warp * 16, S::kLp);
        wm::load_matrix_sync(dst, dss + kk * 16 * S::kLp + warp * 16, S::kLp);
#pragma unroll
        for (int n = 0; n < kCols; ++n) {
          wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major> x;
          wm::load_matrix_sync(x, dos + kk * 16 * S::kLd + n * 16, S::kLd);
          wm::mma_sync(dv[n], pt, x, dv[n]);
          wm::load_matrix_sync(x, qs + kk * 16 * S::kLd + n * 16, S::kLd);
          wm::mma_sync(dk[n], dst, x, dk[n]);
        }
      }

      // dQ of the step = dS K, staged in f32 over S and dP (both consumed above).
      for (int t = warp; t < (kRows / 16) * kCols; t += kWarps) {
        const int mt = t / kCols, n = t % kCols;
        wm::fragment<wm::accumulator, 16, 16, 16, float> dq;
        wm::fill_fragment(dq, 0.f);
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> a;
          wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major> x;
          wm::load_matrix_sync(a, dss + mt * 16 * S::kLp + kk * 16, S::kLp);
          wm::load_matrix_sync(x, ks + kk * 16 * S::kLd + n * 16, S::kLd);
          wm::mma_sync(dq, a, x, dq);
        }
        wm::store_matrix_sync(dqs + mt * 16 * S::kLq + n * 16, dq, S::kLq, wm::mem_row_major);
      }
      __syncthreads();
      add_rows<D>(dq_acc + (lse0 + i0) * D, dqs, S::kLq, min(int64_t(kRows), seq.seq_q - i0),
                  p.head_dim);
    }
  }

  // dK and dV leave through K and V's space (f32 rows of kLq), one after the other.
  float* stage = reinterpret_cast<float*>(smem);
  const auto at = [&](void* t, const int64_t (&stride)[3]) {
    return static_cast<T*>(t) + seq.entry * stride[0] + kt * stride[1] + kvh * stride[2];
  };
  store_rows<T, D>(dk, stage, at(p.dk, p.dk_stride), p.dk_stride[1], seq.seq_k - j0, p.head_dim);
  store_rows<T, D>(dv, stage, at(p.dv, p.dv_stride), p.dv_stride[1], seq.seq_k - j0, p.head_dim);
}

// dQ from its f32 accumulator (logsumexp rows of D floats) to T at dq's strides.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) convert(__grid_constant__ const BackwardLaunch p, const float* dq_acc) {
  const int64_t rows = entries(p) * p.heads_q * head_rows(p);
  for (int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x; e < rows * p.head_dim;
       e += int64_t(gridDim.x) * kThreads) {
    const int64_t row = e / p.head_dim, c = e % p.head_dim;
    const int64_t i = row % head_rows(p), bh = row / head_rows(p);
    const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
    static_cast<T*>(p.dq)[b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2] + c] =
        from_float<T>(dq_acc[row * D + c]);
  }
}

}  // namespace flashcore::backward
