// Split-KV's work partition, for every kernel family that splits keys (WMMA, Hopper): how long a
// split is, how many a (sequence, head) has, and which sequence and split a work unit runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../check.h"
#include "../launcher.h"
#include "flashcore/plan.h"

namespace flashcore::split {

// The key splits of a launch `a`: `keys` keys each, a whole number of `tile_keys`-key tiles,
// and `count` splits at most per (sequence, head), the last of the longest never empty. One
// split (a.splits <= 1) holds every key.
struct KeySplits {
  int64_t keys;
  int32_t count;
};
inline KeySplits key_splits(const FmhaArgs& a, int64_t tile_keys) {
  if (a.splits <= 1) {
    return {INT32_MAX, 1};
  }
  if (a.split_keys > 0) {  // per sequence (FmhaArgs::split_first), planned in whole tiles
    if (a.split_keys % tile_keys != 0 || a.split_keys > INT32_MAX) {
      throw detail::Failure(Code::Launch, "",
                            "split-KV: " + std::to_string(a.split_keys) +
                                " keys per split is not a whole number of " +
                                std::to_string(tile_keys) + "-key tiles");
    }
    return {a.split_keys, a.splits};
  }
  const int64_t keys =
      ((a.seq_k + a.splits - 1) / a.splits + tile_keys - 1) / tile_keys * tile_keys;
  return {keys, static_cast<int32_t>((a.seq_k + keys - 1) / keys)};
}

// Per-sequence splits as a launch parameter (FmhaArgs::split_first): sequence b's splits are
// work units [first[b], first[b + 1]) of the scheduler's batch axis. `sequences` 0: every
// sequence has `KeySplits::count` splits (units b * count + split).
struct SequenceUnits {
  int32_t sequences = 0;
  uint16_t first[kMaxSplitSequences + 1] = {};

  static SequenceUnits make(const FmhaArgs& a) {
    SequenceUnits u;
    if (a.splits > 1 && a.split_first != nullptr) {
      if (a.batch > kMaxSplitSequences) {
        throw detail::Failure(Code::Launch, "",
                              "split-KV: per-sequence splits of more than " +
                                  std::to_string(kMaxSplitSequences) + " sequences");
      }
      u.sequences = static_cast<int32_t>(a.batch);
      for (int64_t b = 0; b <= a.batch; ++b) {
        u.first[b] = a.split_first[b];
      }
    }
    return u;
  }
  // The work units: every sequence's splits.
  int64_t units(int64_t batch, int32_t count) const {
    return sequences > 0 ? first[sequences] : batch * count;
  }

  // The sequence and split of work unit `unit` (< units()), and the splits the sequence has.
  struct Split {
    int sequence, split, count;
  };
  __device__ Split find(int unit) const {
    int lo = 0, hi = sequences;  // first[lo] <= unit < first[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (first[mid] <= unit) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return {lo, unit - first[lo], first[lo + 1] - first[lo]};
  }
};

}  // namespace flashcore::split
