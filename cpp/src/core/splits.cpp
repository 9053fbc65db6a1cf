// Decode work planning (splits.h): kv_splits (one split length for every sequence, from the
// longest), sequence_splits (a split length from every sequence's key count) and sequence_order
// (the Hopper kernel's walk over a wide batch of unequal sequences).
#include "core/splits.h"

#include <algorithm>
#include <cstdint>

namespace flashcore {
namespace {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Blocks the splits of `kernel` at `row` aim at: kSplitBlocksPerSm per SM for WMMA (within one
// wave of resident blocks, so no split waits for another to finish), one for the Hopper kernel
// (one block per SM, persistent); 0 for a kernel that does not split. Measured on the H200
// (2026-11-23, GQA 32:8, d = 128, the 16-row decode tile): two WMMA blocks per SM beat five
// (filling every slot) at one sequence of 32k keys (56 vs 68 us: 33 vs 64 splits), 16 x 8k keys
// (144 vs 150 us: 2 vs 5) and 32 x 4k keys (138 vs 147 us: 1 vs 2); each split's start and the
// combine cost more than the extra loads in flight gain.
int64_t split_target(Kernel kernel, const TileRow& row, int32_t multiprocessors) {
  constexpr int64_t kSplitBlocksPerSm = 2;
  if (kernel == Kernel::Wmma) {
    return std::min(kSplitBlocksPerSm, wmma_blocks_per_sm(row)) * multiprocessors;
  }
  return kernel == Kernel::CutlassSm90 ? multiprocessors : 0;
}

bool splits_decode(Kernel kernel, int64_t query_rows, int32_t multiprocessors) {
  return (kernel == Kernel::Wmma || kernel == Kernel::CutlassSm90) && query_rows > 0 &&
         query_rows <= kDecodeMaxQueryRows && multiprocessors > 0;
}

}  // namespace

int32_t kv_splits(Kernel kernel, const TileRow& row, int64_t query_rows, int64_t batch_heads,
                  int64_t seq_k, int32_t multiprocessors) noexcept {
  if (!splits_decode(kernel, query_rows, multiprocessors) || batch_heads <= 0) {
    return 1;
  }
  const int64_t blocks = ceil_div(query_rows, row.tile.queries_per_block);
  const int64_t target = split_target(kernel, row, multiprocessors);
  const int64_t fill = batch_heads > target / blocks ? 1 : target / (blocks * batch_heads);
  const int64_t most = std::min<int64_t>(kMaxKvSplits, seq_k / kMinKeysPerSplit);
  return static_cast<int32_t>(std::max<int64_t>(1, std::min(fill, most)));
}

namespace core {

std::vector<int64_t> host_key_counts(const Request& r) {
  std::vector<int64_t> counts;
  if (r.varlen && r.cu_k.host != nullptr) {
    counts.reserve(static_cast<size_t>(r.cu_k.count));
    for (int64_t b = 0; b < r.cu_k.count; ++b) {
      counts.push_back(int64_t{r.cu_k.host[b + 1]} - r.cu_k.host[b]);
    }
  } else if (r.paged && r.pages.host_seqlens != nullptr) {
    counts.assign(r.pages.host_seqlens, r.pages.host_seqlens + r.pages.count);
  }
  return counts;
}

SequenceSplits sequence_splits(Kernel kernel, const TileRow& row, int64_t query_rows,
                               int64_t heads, const std::vector<int64_t>& key_counts,
                               int32_t multiprocessors) {
  const int64_t batch = static_cast<int64_t>(key_counts.size());
  if (!splits_decode(kernel, query_rows, multiprocessors) || heads <= 0 || batch == 0 ||
      batch > kMaxSplitSequences) {
    return {};
  }
  const int64_t longest = std::max<int64_t>(0, *std::max_element(key_counts.begin(),
                                                                 key_counts.end()));
  const int64_t tile = row.tile.keys_per_block;
  // Units per split of a sequence, and the units of splits of `keys` keys.
  const int64_t per_split = heads * ceil_div(query_rows, row.tile.queries_per_block);
  const int64_t target = split_target(kernel, row, multiprocessors);
  // A sequence of k keys takes max(1, ceil(k / keys)) splits.
  auto splits_of = [](int64_t k, int64_t keys) {
    return std::max<int64_t>(1, ceil_div(std::max<int64_t>(k, 0), keys));
  };
  auto units = [&](int64_t keys) {
    int64_t n = 0;
    for (int64_t k : key_counts) {
      n += splits_of(k, keys);
    }
    return n * per_split;
  };
  // Split lengths in whole tiles, from the shortest allowed (kMinKeysPerSplit, and at most
  // kMaxKvSplits splits of the longest sequence) to one split of the longest; units(keys) only
  // falls as keys grow, so the shortest that fits the target is found by bisection.
  int64_t lo = std::max(ceil_div(kMinKeysPerSplit, tile), ceil_div(longest, kMaxKvSplits * tile));
  int64_t hi = ceil_div(longest, tile);
  if (longest < 2 * kMinKeysPerSplit || lo >= hi || units(hi * tile) * 2 > target) {
    return {};  // no two splits of kMinKeysPerSplit keys, or the unsplit units (nearly) fill
  }
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (units(mid * tile) <= target) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  SequenceSplits s;
  s.keys = lo * tile;
  s.slots = static_cast<int32_t>(std::max<int64_t>(1, ceil_div(longest, s.keys)));
  if (s.slots < 2) {
    return {};
  }
  s.first.reserve(static_cast<size_t>(batch + 1));
  int64_t next = 0;
  s.first.push_back(0);
  for (int64_t k : key_counts) {
    next += splits_of(k, s.keys);
    s.first.push_back(static_cast<uint16_t>(next));
  }
  return s;
}

std::vector<uint16_t> sequence_order(Kernel kernel, int64_t query_rows, int32_t splits,
                                     int64_t units, int64_t batch,
                                     const std::vector<int64_t>& key_counts,
                                     int32_t multiprocessors) {
  if (kernel != Kernel::CutlassSm90 || !splits_decode(kernel, query_rows, multiprocessors) ||
      splits > 1 || units <= multiprocessors || batch < 1 || batch > kMaxSplitSequences) {
    return {};
  }
  std::vector<uint16_t> order(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    order[static_cast<size_t>(b)] = static_cast<uint16_t>(b);
  }
  if (static_cast<int64_t>(key_counts.size()) == batch) {
    std::stable_sort(order.begin(), order.end(), [&](uint16_t x, uint16_t y) {
      return key_counts[x] > key_counts[y];
    });
  }
  return order;
}

}  // namespace core
}  // namespace flashcore
