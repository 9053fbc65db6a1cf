// flashcore's own fused attention kernel: FlashAttention-2 style online softmax with tensor cores
// through nvcuda::wmma (16x16x16, f16/bf16 inputs, f32 accumulation).
//
// One block computes BR query rows of one (batch, head) against every visible key, BC keys per
// iteration. Each warp owns 16 query rows end to end (its output fragments never leave its
// registers until the epilogue), so the output needs no atomics and no inter-warp reduction.
//
// Per key tile, each warp:
//   1. S = Q K^T with wmma into f32 fragments, stored to the warp's own score tile in shared
//      memory (wmma's fragment layout is unspecified, so row statistics are taken there);
//   2. two lanes per row read their half of the row (interleaved 16-byte chunks), mask, take
//      the row max, exponentiate (exp2 with the scale folded into log2(e)) and write P in the
//      input type over the score tile; the running max m and sum l stay in those lanes;
//   3. rescales its output fragments by exp2(m_old - m_new): each fragment element's row is
//      learned once at start (a wmma load of a row-index tile), and the row's factor is fetched
//      from the owning lane with a shuffle;
//   4. O += P V with wmma.
// K and V tiles are double-buffered with cp.async (16-byte copies, zero-fill past the sequence
// and head dim), so the next tile streams in while the current one is computed. Shared-memory rows
// are padded by 16 bytes (8 halves) so consecutive rows start 4 banks apart.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace flashcore::wmma_fa {

namespace wm = nvcuda::wmma;

// Kernel arguments (built by launch.cuh from FmhaArgs). Strides in elements: batch, seq, head.
struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // dense [batch, heads_q, seq_q] or null
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  int32_t seq_q;
  int32_t seq_k;
  int32_t head_dim;       // <= D; columns past it are zero-filled and never stored
  int32_t group;          // query heads per key/value head
  int32_t causal;         // 0: no mask; 1: key j visible to row i iff j <= i + causal_offset
  int32_t causal_offset;  // 0 (top-left) or seq_k - seq_q (bottom-right)
  float scale_log2;       // softmax scale * log2(e)
};

// 2^x on the SFU (ex2.approx: about 2 ulp), as FlashAttention does for softmax.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats to a packed pair of T (one cvt instruction).
__device__ inline __half2 pack2(__half, float a, float b) { return __floats2half2_rn(a, b); }
__device__ inline __nv_bfloat162 pack2(__nv_bfloat16, float a, float b) {
  return __floats2bfloat162_rn(a, b);
}

// Stores four floats as four T at an 8-byte aligned address.
template <typename T>
__device__ inline void store4(T* dst, const float* x) {
  const auto lo = pack2(T(), x[0], x[1]);
  const auto hi = pack2(T(), x[2], x[3]);
  uint2 bits;
  bits.x = *reinterpret_cast<const uint32_t*>(&lo);
  bits.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = bits;
}

// Shared-memory plan of one instantiation (all sizes in elements unless named bytes).
template <typename T, int BR, int BC, int D>
struct Config {
  static_assert(BR % 16 == 0 && BC % 16 == 0 && D % 16 == 0, "wmma tiles are 16x16");
  static_assert(BC % 8 == 0, "two lanes per row read interleaved 4-float chunks");
  static constexpr int kWarps = BR / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 2;
  static constexpr int kLd = D + 8;    // Q, K, V rows (elements of T)
  static constexpr int kSLd = BC + 8;  // a warp's score rows (floats); P rows reuse it as T
  static constexpr int kOLd = D + 8;   // epilogue output rows (floats)
  static constexpr int kQElems = BR * kLd;
  static constexpr int kKVElems = BC * kLd;  // one stage of K or of V
  static constexpr int kScoreFloats = 16 * kSLd;
  static constexpr size_t kSmemBytes =
      size_t(kQElems + 2 * kStages * kKVElems) * sizeof(T) + size_t(kWarps * kScoreFloats) * 4;
  // The epilogue stages each warp's f32 output tile over the (then idle) whole buffer.
  static_assert(size_t(kWarps) * 16 * kOLd * 4 <= kSmemBytes, "epilogue tile must fit");
};

// Copies rows [row0, row0 + ROWS) x [0, D) of a row-major global tile into shared memory with
// 16-byte cp.async; rows past `rows_valid` and columns past `cols_valid` are zero-filled.
template <int ROWS, int D, int LD, int THREADS, typename T>
__device__ inline void load_tile(T* dst, const T* src, int64_t row_stride, int row0,
                                 int rows_valid, int cols_valid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < ROWS * kChunks; i += THREADS) {
    const int r = i / kChunks;
    const int c = (i % kChunks) * 8;
    const bool ok = row0 + r < rows_valid && c < cols_valid;
    const T* from = ok ? src + int64_t(row0 + r) * row_stride + c : src;
    __pipeline_memcpy_async(dst + r * LD + c, from, 16, ok ? 0 : 16);
  }
}

template <typename T, int BR, int BC, int D>
__global__ void __launch_bounds__(Config<T, BR, BC, D>::kThreads, 1)
    fmha_wmma_kernel(const Params p) {
  using C = Config<T, BR, BC, D>;
  using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major>;
  using FragBCol = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major>;
  using FragBRow = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major>;
  using FragAcc = wm::fragment<wm::accumulator, 16, 16, 16, float>;
  static_assert(FragAcc::num_elements <= 8, "the row map packs 8 rows of 4 bits");
  const float kNegInf = -INFINITY;

  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  T* s_q = reinterpret_cast<T*>(smem);
  T* s_k = s_q + C::kQElems;
  T* s_v = s_k + C::kStages * C::kKVElems;
  float* s_s = reinterpret_cast<float*>(s_v + C::kStages * C::kKVElems) + warp * C::kScoreFloats;
  T* s_p = reinterpret_cast<T*>(s_s);  // P overwrites the scores it was computed from

  const int64_t b = blockIdx.z;
  const int64_t h = blockIdx.y;
  const int64_t kvh = h / p.group;
  const int row0 = blockIdx.x * BR;
  const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[2];
  const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + kvh * p.k_stride[2];
  const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + kvh * p.v_stride[2];

  // Keys any row of this block may see; every row sees key 0 (validated), so n_tiles >= 1.
  const int key_end = p.causal ? min(p.seq_k, row0 + BR + p.causal_offset) : p.seq_k;
  const int n_tiles = (key_end + BC - 1) / BC;

  load_tile<BR, D, C::kLd, C::kThreads>(s_q, q, p.q_stride[1], row0, p.seq_q, p.head_dim);
  load_tile<BC, D, C::kLd, C::kThreads>(s_k, k, p.k_stride[1], 0, p.seq_k, p.head_dim);
  load_tile<BC, D, C::kLd, C::kThreads>(s_v, v, p.v_stride[1], 0, p.seq_k, p.head_dim);
  __pipeline_commit();

  // Learn which tile row each accumulator element holds: load a tile whose entries are their row.
  uint32_t row_map = 0;
  {
    for (int i = lane; i < 256; i += 32) {
      s_s[(i / 16) * C::kSLd + i % 16] = float(i / 16);
    }
    __syncwarp();
    FragAcc rows;
    wm::load_matrix_sync(rows, s_s, C::kSLd, wm::mem_row_major);
#pragma unroll
    for (int i = 0; i < FragAcc::num_elements; ++i) {
      row_map |= uint32_t(rows.x[i]) << (4 * i);
    }
    __syncwarp();
  }

  FragAcc o[D / 16];
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    wm::fill_fragment(o[j], 0.0f);
  }
  // Lanes 2r and 2r+1 own row r of the warp's 16: identical copies of its running max and sum.
  const int r = lane / 2;
  const int half = lane % 2;
  const int q_row = row0 + warp * 16 + r;
  float m = kNegInf;
  float l = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % 2;
    if (t + 1 < n_tiles) {
      const int next = (t + 1) * BC;
      load_tile<BC, D, C::kLd, C::kThreads>(s_k + (1 - stage) * C::kKVElems, k, p.k_stride[1],
                                            next, p.seq_k, p.head_dim);
      load_tile<BC, D, C::kLd, C::kThreads>(s_v + (1 - stage) * C::kKVElems, v, p.v_stride[1],
                                            next, p.seq_k, p.head_dim);
    }
    __pipeline_commit();
    __pipeline_wait_prior(1);  // everything but the tile just requested has landed
    __syncthreads();
    const T* s_kt = s_k + stage * C::kKVElems;
    const T* s_vt = s_v + stage * C::kKVElems;

    // 1. S = Q K^T for the warp's 16 rows.
    {
      FragAcc s[BC / 16];
#pragma unroll
      for (int n = 0; n < BC / 16; ++n) {
        wm::fill_fragment(s[n], 0.0f);
      }
      // Not unrolled: hoisting every K fragment of the loop raises bf16 register use past 255.
#pragma unroll 1
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA a;
        wm::load_matrix_sync(a, s_q + warp * 16 * C::kLd + kk * 16, C::kLd);
#pragma unroll
        for (int n = 0; n < BC / 16; ++n) {
          FragBCol bk;
          wm::load_matrix_sync(bk, s_kt + n * 16 * C::kLd + kk * 16, C::kLd);
          wm::mma_sync(s[n], a, bk, s[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < BC / 16; ++n) {
        wm::store_matrix_sync(s_s + n * 16, s[n], C::kSLd, wm::mem_row_major);
      }
    }
    __syncwarp();

    // 2. Online softmax of row r, columns in 4-float chunks 2c + half.
    const int key0 = t * BC;
    const bool masked = key0 + BC > p.seq_k ||
                        (p.causal && key0 + BC - 1 > row0 + warp * 16 + p.causal_offset);
    float x[BC / 2];
    float tile_max = kNegInf;
#pragma unroll
    for (int c = 0; c < BC / 8; ++c) {
      const int col = (2 * c + half) * 4;
      const float4 s4 = *reinterpret_cast<const float4*>(s_s + r * C::kSLd + col);
      const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float val = sv[e] * p.scale_log2;
        if (masked) {
          const int key = key0 + col + e;
          if (key >= p.seq_k || (p.causal && key > q_row + p.causal_offset)) {
            val = kNegInf;
          }
        }
        x[4 * c + e] = val;
        tile_max = fmaxf(tile_max, val);
      }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float base = m_new == kNegInf ? 0.0f : m_new;  // a row with no key yet stays at zero
    const float alpha = fast_exp2(m - base);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) {
      x[i] = fast_exp2(x[i] - base);
      sum += x[i];
    }
    __syncwarp();  // every lane has read its scores before P overwrites them
#pragma unroll
    for (int c = 0; c < BC / 8; ++c) {
      const int col = (2 * c + half) * 4;
      store4(s_p + r * C::kSLd + col, x + 4 * c);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();

    // 3. Rescale the output rows by their alpha (held by lane 2 * row).
    float row_alpha[FragAcc::num_elements];
#pragma unroll
    for (int i = 0; i < FragAcc::num_elements; ++i) {
      row_alpha[i] = __shfl_sync(0xffffffffu, alpha, 2 * int((row_map >> (4 * i)) & 15u));
    }
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
#pragma unroll
      for (int i = 0; i < FragAcc::num_elements; ++i) {
        o[j].x[i] *= row_alpha[i];
      }
    }

    // 4. O += P V.
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      FragA pa;
      wm::load_matrix_sync(pa, s_p + kk * 16, C::kSLd);
#pragma unroll
      for (int j = 0; j < D / 16; ++j) {
        FragBRow bv;
        wm::load_matrix_sync(bv, s_vt + kk * 16 * C::kLd + j * 16, C::kLd);
        wm::mma_sync(o[j], pa, bv, o[j]);
      }
    }
    __syncthreads();  // the stage just read is refilled by the next iteration
  }
  __pipeline_wait_prior(0);

  // Epilogue: stage the f32 tile in shared memory, normalise by l, write 16-byte vectors.
  float* s_o = reinterpret_cast<float*>(smem) + warp * 16 * C::kOLd;
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    wm::store_matrix_sync(s_o + j * 16, o[j], C::kOLd, wm::mem_row_major);
  }
  __syncwarp();
  if (q_row < p.seq_q) {
    const float inv_l = 1.0f / l;
    T* out = static_cast<T*>(p.out) + b * p.o_stride[0] + h * p.o_stride[2] +
             int64_t(q_row) * p.o_stride[1];
    for (int c = half * 8; c < p.head_dim; c += 16) {
      const float* src = s_o + r * C::kOLd + c;
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        y[e] = src[e] * inv_l;
      }
      store4(out + c, y);
      store4(out + c + 4, y + 4);
    }
    if (p.lse != nullptr && half == 0) {
      constexpr float kLn2 = 0.6931471805599453f;
      p.lse[(b * gridDim.y + h) * int64_t(p.seq_q) + q_row] = (m + log2f(l)) * kLn2;
    }
  }
}

}  // namespace flashcore::wmma_fa
