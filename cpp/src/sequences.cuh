// Where a sequence of a variable-length batch or of a paged cache lies, read from device memory
// that the host may not have checked (docs/SERVING.md, the device contract), and clamped as every
// kernel family clamps it, so that no read or write leaves the buffers.
#pragma once

#include <climits>
#include <cstdint>

namespace flashcore {

// Tokens [begin, end) of sequence `b` in a packed tensor of `total` tokens, from the batch + 1
// offsets `cu`: each offset clamped to [the previous one (0 for the first), total].
struct TokenRange {
  int32_t begin, end;
};
__device__ inline TokenRange token_range(const int32_t* cu, int64_t b, int32_t total) {
  const int32_t begin = ::min(::max(cu[b], 0), total);
  return {begin, ::min(::max(cu[b + 1], begin), total)};
}

// The query rows of a variable-length batch's sequence with query tokens `q`: its queries, or,
// with one-query GQA heads packed into rows (`packed_rows` > 0, FmhaArgs::packed_group), that
// many where it has its query token.
__device__ inline int32_t sequence_rows(TokenRange q, int32_t packed_rows) {
  return packed_rows == 0 ? q.end - q.begin : q.end > q.begin ? packed_rows : 0;
}

// The first key token of a sequence with key tokens `k`, 0 for a keyless one: an in-bounds base
// for a sequence that reads no key.
__device__ inline int32_t key_base(TokenRange k) { return k.end > k.begin ? k.begin : 0; }

// The key count of sequence `b` of a paged cache: seqlens_k[b] clamped to [0, the keys its row
// of `pages_per_seq` pages of 2^page_shift keys holds] (and to int32).
__device__ inline int32_t paged_keys(const int32_t* seqlens_k, int64_t b, int64_t pages_per_seq,
                                     int page_shift) {
  const int64_t held = ::min(pages_per_seq << page_shift, int64_t{INT32_MAX});
  return int32_t(::min(::max(int64_t{seqlens_k[b]}, int64_t{0}), held));
}

// A block table entry as read (the device's, unchecked) clamped to the cache's pages
// [0, last_page] (launcher.h's PageBounds).
__device__ inline int clamp_page(int entry, int last_page) {
  return ::min(::max(entry, 0), last_page);
}

}  // namespace flashcore
