// Global -> shared tile copies for the WMMA kernel: 16-byte cp.async, zero-filled past the
// sequence and the head dim; rows of a paged cache are found through its block table.
#pragma once

#include <cuda_pipeline.h>

#include <cstdint>

#include "../sequences.cuh"

namespace flashcore::wmma_fa {

// Copies ROWS x D tiles of a row-major global matrix into shared memory (row stride LD),
// THREADS threads at a time. Each thread owns one 16-byte column chunk and every
// (THREADS / chunks per row)-th row, fixed for the kernel, so a full tile costs an address add per
// copy. Rows past the sequence and columns past the head dim are zero-filled.
template <int ROWS, int D, int LD, int THREADS, typename T>
class TileCopy {
 public:
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static_assert(THREADS % kChunks == 0, "whole rows per pass");
  static constexpr int kRowStep = THREADS / kChunks;
  static_assert(ROWS % kRowStep == 0, "whole passes per tile");

  // `base`: element (0, 0) of the matrix; `rows` x `cols` of it are real.
  // For a paged matrix, `base` is element (0, 0) of page 0 and `row_stride` the stride between
  // the rows of a page.
  __device__ TileCopy(const T* base, int64_t row_stride, int rows, int cols)
      : origin_(base),
        stride_(row_stride),
        row_(threadIdx.x / kChunks),
        dst_(row_ * LD + (threadIdx.x % kChunks) * 8),
        rows_(rows),
        col_ok_((threadIdx.x % kChunks) * 8 < cols) {
    src_ = base + int64_t(row_) * row_stride + (threadIdx.x % kChunks) * 8;
  }

  // Starts copying rows [row0, row0 + ROWS) into `tile` (not committed).
  __device__ void start(T* tile, int row0) const {
    const T* from = src_ + int64_t(row0) * stride_;
    const int64_t step = int64_t(kRowStep) * stride_;
    if (col_ok_ && row0 + ROWS <= rows_) {  // every row real: no zero fill
#pragma unroll
      for (int j = 0; j < ROWS / kRowStep; ++j) {
        __pipeline_memcpy_async(tile + dst_ + j * kRowStep * LD, from + j * step, 16);
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < ROWS / kRowStep; ++j) {
      const bool ok = col_ok_ && row0 + row_ + j * kRowStep < rows_;
      // A zero-filled copy reads nothing; it still gets an in-bounds address.
      __pipeline_memcpy_async(tile + dst_ + j * kRowStep * LD, ok ? from + j * step : origin_, 16,
                              ok ? 0 : 16);
    }
  }

  // start() for a paged matrix: row r is row r % 2^shift of page pages[(r >> shift) -
  // (row0 >> shift)] (the tile's page indices, pages.cuh; at most PAGES of them), clamped to
  // [0, last_page] so that no table entry leads outside the pages, pages `page_stride` apart.
  // row0 is a multiple of ROWS, and pages hold at least kRowStep rows: a page boundary falls
  // between two of this thread's rows at the same j for every thread, so the page of its j-th
  // row depends on j alone, and each page's address is formed once per tile (a decode block
  // has one warp, whose issue slots the per-row address arithmetic would otherwise take).
  template <int PAGES>
  __device__ void start_paged(T* tile, int row0, const int32_t* pages, int shift,
                              int64_t page_stride, int last_page) const {
    static_assert(PAGES <= 4, "a key tile spans at most four pages of 16 keys");
    const int lead = row0 & ((1 << shift) - 1);  // the tile's first row within its page
    // Row row0 + row_ + j * kRowStep = page slot (lead + j * kRowStep) >> shift, row
    // lead + row_ + j * kRowStep - slot * 2^shift of that page.
    const T* base[PAGES];
#pragma unroll
    for (int i = 0; i < PAGES; ++i) {
      // Slots past the tile's pages are never written (nor selected below).
      const int page = (i << shift) < ROWS ? clamp_page(pages[i], last_page) : 0;
      base[i] = src_ + page * page_stride + (int64_t(lead) - (int64_t(i) << shift)) * stride_;
    }
    const int64_t step = int64_t(kRowStep) * stride_;
#pragma unroll
    for (int j = 0; j < ROWS / kRowStep; ++j) {
      const int slot = (lead + j * kRowStep) >> shift;
      const T* at = base[0];
#pragma unroll
      for (int i = 1; i < PAGES; ++i) {
        at = slot == i ? base[i] : at;
      }
      const bool ok = col_ok_ && row0 + row_ + j * kRowStep < rows_;
      // A zero-filled copy reads nothing; its address is in bounds.
      __pipeline_memcpy_async(tile + dst_ + j * kRowStep * LD, ok ? at + j * step : origin_, 16,
                              ok ? 0 : 16);
    }
  }

 private:
  const T* origin_;  // element (0, 0)
  const T* src_;     // this thread's chunk of row 0
  int64_t stride_;   // global row stride (elements)
  int row_;          // this thread's first row within a tile
  int dst_;          // this thread's first shared-memory element within a tile
  int rows_;         // rows of the matrix (the sequence length)
  bool col_ok_;      // the chunk lies within the head dim
};

}  // namespace flashcore::wmma_fa
