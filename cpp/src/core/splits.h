// Decode work planning: how many blocks share the keys of a decode problem's (sequence, head),
// and, where the host knows every sequence's key count, how long each split is and in which order
// the Hopper kernel walks the sequences (called by plan.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/validate.h"

namespace flashcore::core {

// Per-sequence key splits: every sequence's keys in splits of `keys` keys (sequence b with k_b
// keys takes max(1, ceil(k_b / keys)) of them), so that a short sequence gets few splits and a
// long one many, each about as long. `slots` is the most splits of one sequence; the units of
// sequence b, numbered sequence by sequence, are [first[b], first[b + 1]).
struct SequenceSplits {
  int64_t keys = 0;  // 0: no split
  int32_t slots = 1;
  std::vector<uint16_t> first;
};

// The per-sequence key counts the host copies of `r` give (a variable-length batch's key
// offsets, a paged cache's key counts), or none.
std::vector<int64_t> host_key_counts(const Request& r);

// The splits `kernel` (WMMA or Hopper) runs for a decode problem of `query_rows` query rows per
// head (after packing) and `heads` heads per sequence (as packed) whose sequences have
// `key_counts` keys, at tile-table `row` on `multiprocessors` SMs: the shortest splits (whole key
// tiles, at least kMinKeysPerSplit keys, at most kMaxKvSplits per sequence) whose units fit in
// one wave (kv_splits's target), or none when the unsplit units fill it, when the problem is
// not a decode, or when there are more than kMaxSplitSequences sequences.
SequenceSplits sequence_splits(Kernel kernel, const TileRow& row, int64_t query_rows,
                               int64_t heads, const std::vector<int64_t>& key_counts,
                               int32_t multiprocessors);

// The order in which the Hopper kernel's persistent blocks walk a decode batch of `batch`
// sequences (Plan::sequence_order; its scheduler then takes a sequence's heads side by side):
// the sequences by key count, longest first (ties in batch order), where the host knows every
// one's (`key_counts`), else in batch order; where `kernel` is the Hopper kernel, the problem a
// decode of `query_rows` rows per head whose keys are not split (`splits` 1), its `units`
// ((sequence, head) pairs, as packed) more than the `multiprocessors` blocks, and the batch at
// most kMaxSplitSequences sequences. Else empty: the scheduler's own walk.
std::vector<uint16_t> sequence_order(Kernel kernel, int64_t query_rows, int32_t splits,
                                     int64_t units, int64_t batch,
                                     const std::vector<int64_t>& key_counts,
                                     int32_t multiprocessors);

}  // namespace flashcore::core
