// An additive bias on the Hopper kernel's scores (FmhaArgs' bias): query row i and key j of
// sequence b and query head h add bias[b, i, h, j], in natural units after the scale, any softcap
// and ALiBi (mainloop.cuh's modify_scores), times a factor that takes it to the scores' units.
//
// Each consumer thread holds two rows of a key tile's scores, in pairs of adjacent keys (the
// wgmma accumulator layout: lane 4g + t holds rows g and g + 8 of its warp's 16, keys 2t and
// 2t + 1 of every 8). Its bias reads:
// - Pairs: where the bias is 16-bit, its key stride 1 and every row's offset even, a pair is one
//   aligned 32-bit load. With kAhead the thread loads the next tile's pairs into registers as
//   soon as this tile's are added, so that their memory latency passes under the next tile's
//   matrix products; without it (the 3-warpgroup tile, whose registers are spent) it loads them
//   when the tile needs them.
// - Elements: any other bias (f32, a broadcast key axis, odd offsets) and a tile that reaches past
//   the bias's keys load each element where it is added, the key clamped to the bias's last.
// Rows are clamped to the bias's last row, so no read leaves the bias whatever the unit's
// lengths. With key stride 1 each warpgroup also asks L2 for the lines of its rows two tiles
// ahead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "launcher.h"

namespace flashcore::sm90 {

// The bias as the kernel reads it (null: none).
struct BiasParams {
  const void* ptr = nullptr;
  int type = 0;                // BiasType: 0 f16, 1 bf16, 2 f32
  int64_t stride[4] = {};      // elements: (sequence, row, head, key); 0 on broadcast axes
  int rows = 0, keys = 0;      // the row and key extents (1 where broadcast)

  static BiasParams make(const FmhaArgs& a) {
    BiasParams p;
    p.ptr = a.bias;
    p.type = static_cast<int>(a.bias_type);
    for (int i = 0; i < 4; ++i) {
      p.stride[i] = a.bias_stride[i];
    }
    p.rows = static_cast<int>(a.bias_rows);
    p.keys = static_cast<int>(a.bias_keys);
    return p;
  }
};

// One thread's bias for one work unit: `kRows` x `kCols` scores per key tile of `kTileKeys` keys.
// It keeps only the unit's slice, first key and end, and the pairs loaded ahead: the rest is
// read from the kernel's parameters (constant memory) per tile, so that the consumers' loop
// keeps its registers.
template <int kRows, int kCols, int kTileKeys, bool kAhead>
struct BiasTile {
  static_assert(kCols % 2 == 0, "a row's keys come in adjacent pairs");
  static constexpr int kPairs = kCols / 2;
  static constexpr int kWarpGroupRows = 64;

  BiasParams const& p_;
  const unsigned char* slice_ = nullptr;  // the unit's (b, h) slice; null: no bias
  int key_first_ = 0;  // the unit's first key within its sequence (key_split)
  int end_ = 0;        // the unit's key tiles end here (keys counted from its first)
  bool pairs_ = false, ready_ = false;
  uint32_t words_[kRows * kPairs];

  // The bias `p` (none unless `on`) of sequence `b` and query head `h` for the unit whose scores
  // `idx` indexes (the MN view of the (row, key) of each score this thread holds, at the unit's
  // first tile), keys from `key_first` of the sequence on, its key tiles ending at key `end`;
  // starts the first tile's loads. `p` must outlive it (the kernel's parameters).
  template <class Index>
  CUTLASS_DEVICE BiasTile(BiasParams const& p, bool on, int64_t b, int64_t h, Index const& idx,
                          int key_first, int end)
      : p_(p) {
    using namespace cute;
    if (!on || p.ptr == nullptr) {
      return;
    }
    slice_ = static_cast<const unsigned char*>(p.ptr) +
             (b * p.stride[0] + h * p.stride[2]) * bytes();
    key_first_ = key_first;
    end_ = end;
    bool even = key_first % 2 == 0;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      even = even && (reinterpret_cast<uintptr_t>(row(get<0>(idx(i, 0)))) & 3) == 0;
    }
    pairs_ = p.type != 2 && p.stride[3] == 1 && __all_sync(0xffffffffu, even);
    if constexpr (kAhead) {
      fetch(idx, 0);
    }
    prefetch_lines(idx, kTileKeys);
  }

  CUTLASS_DEVICE int bytes() const { return p_.type == 2 ? 4 : 2; }
  // Query row `r` of the slice, clamped to the bias's last row.
  CUTLASS_DEVICE const unsigned char* row(int r) const {
    return slice_ + int64_t(::min(r, p_.rows - 1)) * p_.stride[1] * bytes();
  }

  // The first key of the tile `ahead` keys after the one `idx` is at, and whether that tile lies
  // within the unit's tiles and the bias's keys (then no key needs clamping).
  template <class Index>
  CUTLASS_DEVICE static int tile_at(Index const& idx, int ahead) {
    return (cute::get<1>(idx(0, 0)) + ahead) / kTileKeys * kTileKeys;
  }
  CUTLASS_DEVICE bool inside(int tile) const {
    return tile < end_ && key_first_ + tile + kTileKeys <= p_.keys;
  }

  // Loads the pairs of the tile `ahead` keys after `idx`'s into words_ (ready_ says whether).
  template <class Index>
  CUTLASS_DEVICE void fetch(Index const& idx, int ahead) {
    using namespace cute;
    ready_ = pairs_ && inside(tile_at(idx, ahead));
    if (!ready_) {
      return;
    }
    const int col0 = get<1>(idx(0, 0));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const auto* src = reinterpret_cast<const uint32_t*>(row(get<0>(idx(i, 0))) +
                                                          int64_t(key_first_ + col0 + ahead) * 2);
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kPairs; ++k) {
        // The pair's key offset from the thread's first key is a compile-time constant.
        words_[i * kPairs + k] = __ldcs(src + (get<1>(idx(i, 2 * k)) - col0) / 2);
      }
    }
  }

  // Asks L2 for the warpgroup's rows of the tile `ahead` keys after `idx`'s: each thread one
  // row, every other 128-byte line of it.
  template <class Index>
  CUTLASS_DEVICE void prefetch_lines(Index const& idx, int ahead) const {
    const int tile = tile_at(idx, ahead);
    if (slice_ == nullptr || p_.stride[3] != 1 || !inside(tile)) {
      return;
    }
    const int wg_row0 = cute::get<0>(idx(0, 0)) / kWarpGroupRows * kWarpGroupRows;
    const unsigned char* at = row(wg_row0 + int(threadIdx.x % kWarpGroupRows)) +
                              int64_t(key_first_ + tile) * bytes();
    for (int line = int(threadIdx.x / kWarpGroupRows) % 2; line * 128 < kTileKeys * bytes();
         line += 2) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(at + line * 128));
    }
  }

  // Adds factor times the elements (keys clamped to the bias's last) to the scores `s`, each
  // element of type E read as a float by `to_float`.
  template <class E, class AccMN, class Index, class ToFloat>
  CUTLASS_DEVICE void add_elements(AccMN& s, Index const& idx, float factor,
                                   ToFloat to_float) const {
    using namespace cute;
    const int64_t key_stride = p_.stride[3];
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      const E* at = reinterpret_cast<const E*>(row(get<0>(idx(i, 0))));
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kCols; ++k) {
        const int key = ::min(key_first_ + get<1>(idx(i, k)), p_.keys - 1);
        s(i, k) = ::fmaf(to_float(__ldg(at + key * key_stride)), factor, s(i, k));
      }
    }
  }

  // Adds factor * bias to the tile of scores `s` (MN view) whose (row, key) `idx` holds; with
  // kAhead, then loads the next tile's pairs. The caller skips a unit without a bias.
  template <class AccMN, class Index>
  CUTLASS_DEVICE void add(AccMN& s, Index const& idx, float factor) {
    using namespace cute;
    if constexpr (!kAhead) {
      fetch(idx, 0);
    }
    if (ready_ && p_.type == 1) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kRows; ++i) {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kPairs; ++k) {
          const uint32_t w = words_[i * kPairs + k];
          s(i, 2 * k) = ::fmaf(__uint_as_float(w << 16), factor, s(i, 2 * k));
          s(i, 2 * k + 1) = ::fmaf(__uint_as_float(w & 0xffff0000u), factor, s(i, 2 * k + 1));
        }
      }
    } else if (ready_) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kRows; ++i) {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kPairs; ++k) {
          const uint32_t w = words_[i * kPairs + k];
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
          s(i, 2 * k) = ::fmaf(f.x, factor, s(i, 2 * k));
          s(i, 2 * k + 1) = ::fmaf(f.y, factor, s(i, 2 * k + 1));
        }
      }
    } else if (p_.type == 2) {
      add_elements<float>(s, idx, factor, [](float x) { return x; });
    } else if (p_.type == 1) {
      add_elements<unsigned short>(
          s, idx, factor, [](unsigned short x) { return __uint_as_float(uint32_t(x) << 16); });
    } else {
      add_elements<unsigned short>(
          s, idx, factor, [](unsigned short x) { return __half2float(__ushort_as_half(x)); });
    }
    if constexpr (kAhead) {
      fetch(idx, kTileKeys);
    }
    prefetch_lines(idx, 2 * kTileKeys);
  }
};

}  // namespace flashcore::sm90
