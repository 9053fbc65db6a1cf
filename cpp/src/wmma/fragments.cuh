// The register layout of nvcuda::wmma 16x16x16 fragments on sm_80 - sm_90, and loaders built on it.
//
// wmma leaves fragment layouts unspecified. On sm_80 - sm_90 `wmma::mma_sync` on these fragments
// compiles to two `HMMA.16816` and the fragments hold exactly the operands of PTX
// `mma.m16n8k16` (measured on the H200 with index tiles, 2026-11-21). With lane = 4g + t and
// element i (0..7):
//   accumulator (f32) and matrix_a (row-major): row g + 8 * bit1(i), column 2t + bit0(i) + 8 * bit2(i)
//   matrix_b (row- or col-major):               k   2t + bit0(i) + 8 * bit1(i), n g + 8 * bit2(i)
// An f16 matrix_a / matrix_b fragment holds 16 elements: the same 8, twice.
//
// The kernel depends on this layout in three places, which is what makes it fast:
//   - the online softmax reads scores straight from the accumulator (rows g and g + 8 in a quad
//     of lanes), so scores never go through shared memory;
//   - P = exp(S - m) becomes the matrix_a fragment of P V in registers (identical positions);
//   - fragments are filled with `ldmatrix` (one instruction per 16x16 operand). The bf16
//     `wmma::load_matrix_sync` compiles to scalar shared-memory loads on sm_90 (no LDSM in the
//     SASS; f16 uses LDSM), which made the first bf16 kernel 0.55-0.64x CUTLASS.
// `layout_matches` checks the layout with documented wmma loads at the start of every block;
// the kernel traps (a launch error, never a wrong result) on a GPU where it differs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

namespace flashcore::wmma_fa {

namespace wm = nvcuda::wmma;

template <typename T>
using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major>;
template <typename T>
using FragBCol = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major>;
template <typename T>
using FragBRow = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major>;
using FragAcc = wm::fragment<wm::accumulator, 16, 16, 16, float>;

// Position of element i of lane `lane` (see the table above).
__device__ constexpr int acc_row(int lane, int i) { return lane / 4 + 8 * ((i >> 1) & 1); }
__device__ constexpr int acc_col(int lane, int i) { return 2 * (lane % 4) + (i & 1) + 8 * (i >> 2); }
__device__ constexpr int b_k(int lane, int i) { return 2 * (lane % 4) + (i & 1) + 8 * ((i >> 1) & 1); }
__device__ constexpr int b_n(int lane, int i) { return lane / 4 + 8 * (i >> 2); }

// Two floats to a packed pair of T (one cvt instruction), as a 32-bit word.
__device__ inline uint32_t pack2(__half, float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ inline uint32_t pack2(__nv_bfloat16, float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Sets a 16-bit operand fragment from its four 32-bit words (the m16n8k16 operand registers),
// repeated over the whole fragment (an f16 fragment stores the operand twice).
template <typename Frag>
__device__ inline void set_words(Frag& f, const uint32_t (&w)[4]) {
  constexpr int kWords = sizeof(f.x) / sizeof(uint32_t);
  static_assert(kWords % 4 == 0, "16-bit operand fragments hold 4 or 8 words");
  uint32_t* dst = reinterpret_cast<uint32_t*>(f.x);
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    dst[j] = w[j % 4];
  }
}

// ldmatrix .x4: four 8x8 matrices of 16-bit elements; lane l supplies the address of row l % 8 of
// matrix l / 8. With .trans each matrix arrives transposed.
__device__ inline void ldsm_x4(uint32_t (&w)[4], const void* smem) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "r"(addr));
}
__device__ inline void ldsm_x4_trans(uint32_t (&w)[4], const void* smem) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "r"(addr));
}

// The address lane `lane` gives ldmatrix for a 16x16 row-major tile read as four 8x8 matrices
// in the order (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (8-15, 8-15):
// the register order of matrix_a, and of matrix_b when transposed.
template <typename T>
__device__ inline const T* quad_row(const T* tile, int ld, int lane) {
  return tile + (lane % 16) * ld + (lane / 16) * 8;
}

// A = the 16x16 row-major tile at `tile` (row stride `ld` elements, rows 16-byte aligned).
template <typename T>
__device__ inline void load_a(FragA<T>& f, const T* tile, int ld, int lane) {
  uint32_t w[4];
  ldsm_x4(w, quad_row(tile, ld, lane));
  set_words(f, w);
}

// The address lane `lane` gives ldmatrix for a 16x16 row-major tile read as four 8x8 matrices
// in the order (rows 0-7, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 0-7), (8-15, 8-15):
// the register order of a transposed operand (matrix_b stored by n, matrix_a stored by k).
template <typename T>
__device__ inline const T* quad_col(const T* tile, int ld, int lane) {
  return tile + (lane % 8 + 8 * (lane / 16)) * ld + 8 * ((lane / 8) % 2);
}

// B(k, n) = tile[n][k]: K stored row-major by key, read as the col-major B of Q K^T.
template <typename T>
__device__ inline void load_b_col(FragBCol<T>& f, const T* tile, int ld, int lane) {
  uint32_t w[4];
  ldsm_x4(w, quad_col(tile, ld, lane));
  set_words(f, w);
}

// B(k, n) = tile[k][n]: V stored row-major by key, the row-major B of P V.
template <typename T>
__device__ inline void load_b_row(FragBRow<T>& f, const T* tile, int ld, int lane) {
  uint32_t w[4];
  ldsm_x4_trans(w, quad_row(tile, ld, lane));
  set_words(f, w);
}

// A(m, k) = tile[k][m]: a 16x16 tile stored column-major (row k of the storage holds column k of
// A), e.g. the backward pass's dS^T read as the A of dS K.
template <typename T>
__device__ inline void load_a_col(FragA<T>& f, const T* tile, int ld, int lane) {
  uint32_t w[4];
  ldsm_x4_trans(w, quad_col(tile, ld, lane));
  set_words(f, w);
}

// A = an accumulator tile rounded to T, in registers (identical element positions).
template <typename T>
__device__ inline void acc_to_a(FragA<T>& f, const FragAcc& acc) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w[j] = pack2(T(), acc.x[2 * j], acc.x[2 * j + 1]);
  }
  set_words(f, w);
}

// Whether this GPU's fragments hold the layout above, checked with documented wmma loads of index
// tiles (entry r * 16 + c, exact in f16 and bf16). `scratch`: 1.5 KB of warp-private shared memory.
template <typename T>
__device__ inline bool layout_matches(void* scratch, int lane) {
  float* idx_f32 = static_cast<float*>(scratch);
  T* idx = reinterpret_cast<T*>(idx_f32 + 256);
  for (int i = lane; i < 256; i += 32) {
    idx_f32[i] = float(i);
    idx[i] = T(float(i));
  }
  __syncwarp();
  FragAcc acc;
  FragA<T> a;
  FragBCol<T> b_col;  // B(k, n) = idx[n * 16 + k]
  FragBRow<T> b_row;  // B(k, n) = idx[k * 16 + n]
  wm::load_matrix_sync(acc, idx_f32, 16, wm::mem_row_major);
  wm::load_matrix_sync(a, idx, 16);
  wm::load_matrix_sync(b_col, idx, 16);
  wm::load_matrix_sync(b_row, idx, 16);
  bool ok = FragAcc::num_elements == 8;
#pragma unroll
  for (int i = 0; i < FragAcc::num_elements; ++i) {
    ok = ok && acc.x[i] == float(acc_row(lane, i) * 16 + acc_col(lane, i));
  }
#pragma unroll
  for (int i = 0; i < FragA<T>::num_elements; ++i) {
    const int e = i % 8;
    ok = ok && float(a.x[i]) == float(acc_row(lane, e) * 16 + acc_col(lane, e));
    ok = ok && float(b_col.x[i]) == float(b_n(lane, e) * 16 + b_k(lane, e));
    ok = ok && float(b_row.x[i]) == float(b_k(lane, e) * 16 + b_n(lane, e));
  }
  __syncwarp();
  return __all_sync(0xffffffffu, ok);
}

}  // namespace flashcore::wmma_fa
