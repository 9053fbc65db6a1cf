// The score modifier of flashcore's Hopper kernel: the fusion point of CUTLASS example 88's
// mainloop (`before_softmax` on each tile of scores, and the trip counts that decide which key
// tiles a query block visits and which of them need masking).
//
// One mask serves no mask, top-left and bottom-right causal and a sliding window: key j is visible
// to query i when j < seq_k and window_offset <= j - i <= causal_offset (problem.cuh). Key tiles
// wholly outside the band are never loaded; tiles wholly inside it run unmasked; only the tiles
// that cross one of its sides or hold the last, partial key tile are masked. Without a window
// every query row sees key 0 (validation refuses rows with no visible key), so the first tile
// gives every row a finite max; with one, a row may see no key of the block's first tiles, which
// our consumer loop allows for (mainloop.cuh).
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "sm90/problem.cuh"

namespace flashcore::sm90 {

struct CausalBandMask {
  // The first query row of the block at `blk`, and its last real one (before seq_q).
  template <class BlkCoord, class TileShape>
  CUTLASS_DEVICE static int64_t first_row(BlkCoord const& blk, TileShape const& tile) {
    return int64_t(cute::get<0>(blk)) * cute::get<0>(tile);
  }
  template <class BlkCoord, class TileShape, class P>
  CUTLASS_DEVICE static int64_t last_row(BlkCoord const& blk, TileShape const& tile, P const& p) {
    return cute::min(first_row(blk, tile) + cute::get<0>(tile), int64_t(seq_q(p))) - 1;
  }

  // The first key tile the block at `blk` visits: the one with the first key its first row sees,
  // and never past the last (see get_trip_count).
  template <class BlkCoord, class TileShape, class P>
  CUTLASS_DEVICE int get_first_tile(BlkCoord const& blk, TileShape const& tile, P const& p) {
    const int64_t first_key = first_row(blk, tile) + int64_t(window_offset(p));
    const int first = int(cute::max(int64_t(0), first_key) / cute::get<1>(tile));
    return cute::min(first, get_trip_count(blk, tile, p) - 1);
  }

  // The first key tile from which on the window's left side hides no key from any row of the
  // block (0 without a window): the tile where its last real row's first key lies, or the next.
  template <class BlkCoord, class TileShape, class P>
  CUTLASS_DEVICE int get_first_full_tile(BlkCoord const& blk, TileShape const& tile,
                                         P const& p) {
    const int64_t bk = cute::get<1>(tile);
    const int64_t first_key = cute::max(int64_t(0), last_row(blk, tile, p) + window_offset(p));
    return int((first_key + bk - 1) / bk);
  }

  // The end of the key tiles the block at `blk` visits: up to the last key its last real row
  // sees. At least one: a block none of whose rows sees a key (which validation refuses, but a
  // variable-length batch's device offsets can describe) visits tile 0 wholly masked, so its
  // loads and its consumers agree and its rows come out 0.
  template <class BlkCoord, class TileShape, class P>
  CUTLASS_DEVICE int get_trip_count(BlkCoord const& blk, TileShape const& tile, P const& p) {
    const int64_t last_key =
        cute::min(int64_t(seq_k(p)) - 1, last_row(blk, tile, p) + causal_offset(p));
    return int(cute::max(int64_t(0), last_key) / cute::get<1>(tile) + 1);
  }

  // The leading tiles in which every key is visible to every row of the block.
  template <class BlkCoord, class TileShape, class P>
  CUTLASS_DEVICE int get_unmasked_trip_count(BlkCoord const& blk, TileShape const& tile,
                                             P const& p) {
    const int64_t first_hidden =
        cute::min(int64_t(seq_k(p)), first_row(blk, tile) + causal_offset(p) + 1);
    return cute::min(get_trip_count(blk, tile, p), int(first_hidden / cute::get<1>(tile)));
  }

  template <class BlkCoord, class TileShape, class P>
  CUTLASS_DEVICE int get_masked_trip_count(BlkCoord const& blk, TileShape const& tile,
                                           P const& p) {
    return get_trip_count(blk, tile, p) - get_unmasked_trip_count(blk, tile, p);
  }

  // `index(i)` is the (query row, key) of accumulator element i. Its key and its j - i differ
  // from element 0's by constants known at compile time once the loop unrolls, so the bounds are
  // taken relative to element 0 once per tile, and each test is one compare of a constant against
  // them. A tile that only the causal side crosses (no key past seq_k, no window side: every tile
  // a causal mask masks but the last) takes that one test per score; others take all three.
  template <class Acc, class Index, class P>
  CUTLASS_DEVICE void before_softmax(Acc& acc, Index const& index, P const& p) {
    using cute::get;
    const auto first = index(0);
    const int key0 = get<1>(first), diff0 = key0 - get<0>(first);
    auto key_step = [&](int i) { return get<1>(index(i)) - key0; };
    auto diff_step = [&](int i) {
      const auto pos = index(i);
      return get<1>(pos) - get<0>(pos) - diff0;
    };
    int last_key = 0, least_diff = 0;  // over the elements: constants
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < cute::size(acc); ++i) {
      last_key = cute::max(last_key, key_step(i));
      least_diff = cute::min(least_diff, diff_step(i));
    }
    // The bounds less element 0's key or j - i, clamped to +-2^30 (the steps are far smaller), so
    // that no sum overflows an int for any lengths.
    auto relative = [](int64_t bound, int64_t at) {
      return int(cute::max(int64_t(-(1 << 30)), cute::min(int64_t(1 << 30), bound - at)));
    };
    const int keys = relative(seq_k(p), key0);
    const int upper = relative(causal_offset(p), diff0), lower = relative(window_offset(p), diff0);
    auto mask = [&](auto all_sides) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(acc); ++i) {
        const int d = diff_step(i);
        const bool hidden =
            all_sides ? key_step(i) >= keys || d > upper || d < lower : d > upper;
        if (hidden) {
          acc(i) = -INFINITY;
        }
      }
    };
    if (last_key < keys && least_diff >= lower) {
      mask(cute::false_type{});
    } else {
      mask(cute::true_type{});
    }
  }
};

}  // namespace flashcore::sm90
