// The page indices of a paged KV cache's key tiles, staged in shared memory ahead of the tiles'
// copies, so that a copy reads its rows' pages from shared memory instead of waiting on the
// block table in global memory.
//
// Tile t's entries (the pages its BC keys lie in: BC / page_size of them, or 1 when a page holds
// the whole tile; at most BC / 16) go to slot t % kSlots. Tiles 0 and 1 are loaded before the key
// loop; tile t + 3 is requested with cp.async in the commit group of tile t + 1's keys, which the
// key loop's wait has completed (and its barrier published) two iterations later, before tile
// t + 3's copies start. A slot is rewritten only after the barrier that follows its last read.
#pragma once

#include <cuda_pipeline.h>

#include <cstdint>

namespace flashcore::wmma_fa {

template <int BC>
struct PageRing {
  static constexpr int kSlots = 4;
  static constexpr int kPerTile = BC / 16;  // pages hold at least 16 keys
  static_assert(kPerTile >= 1, "key tiles of at least 16 keys");

  int32_t* ring;          // kSlots x kPerTile entries of shared memory
  const int32_t* row;     // the sequence's row of the block table
  int64_t pages_per_seq;  // its entries: no index past them is read
  int shift;              // log2(page size)

  // The entries of tile `t` (keys from key0), read by the copies.
  __device__ const int32_t* slot(int t) const { return ring + (t % kSlots) * kPerTile; }

  // Loads tile `t`'s entries (keys from key0): with plain loads, or with cp.async into the
  // pipeline's current group. Entries past the table row are zero-filled, never read.
  __device__ void fetch(int t, int key0, bool async) const {
    const int count = BC >> shift > 0 ? BC >> shift : 1;
    const int i = threadIdx.x;
    if (i >= count) {
      return;
    }
    const int64_t entry = int64_t(key0 >> shift) + i;
    const bool ok = entry < pages_per_seq;
    int32_t* dst = ring + (t % kSlots) * kPerTile + i;
    if (async) {
      __pipeline_memcpy_async(dst, ok ? row + entry : row, sizeof(int32_t), ok ? 0 : 4);
    } else {
      *dst = ok ? row[entry] : 0;
    }
  }
};

}  // namespace flashcore::wmma_fa
