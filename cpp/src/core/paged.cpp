// A paged KV cache's checks: see paged.h.
#include "core/paged.h"

#include <string>

namespace flashcore::core {
namespace {

constexpr int64_t kMinPageSize = 16, kMaxPageSize = 1024;

}  // namespace

Failed check_pages(const Request& r) {
  const PagesDesc& g = r.pages;
  const int64_t ps = g.page_size;
  if (ps < kMinPageSize || ps > kMaxPageSize || (ps & (ps - 1)) != 0) {
    return fail(Code::InvalidPageTable, Operand::None, Field::PageSize, -1, ps, kMaxPageSize);
  }
  FLASHCORE_TRY(expect_dim(Operand::K, 1, r.k.shape[1], ps));
  FLASHCORE_TRY(check_word_array(Operand::BlockTable, g.table, g.table_location, r.q.location));
  FLASHCORE_TRY(check_word_array(Operand::SeqlensK, g.seqlens, g.seqlens_location, r.q.location));
  FLASHCORE_TRY(expect_dim(Operand::BlockTable, 0, g.count, r.q.shape[0]));
  if (g.pages_per_seq < 0) {
    return fail(Code::SizeOverflow, Operand::BlockTable, Field::None, g.pages_per_seq, 0, 0,
                "negative pages per sequence");
  }
  const int64_t capacity = g.pages_per_seq > (int64_t{1} << 40) / ps ? int64_t{1} << 40
                                                                      : g.pages_per_seq * ps;
  if (g.max_seqlen_k < 0 || g.max_seqlen_k > capacity) {
    return fail(Code::InvalidPageTable, Operand::SeqlensK, Field::KeysBeyondPages, -1,
                g.max_seqlen_k, capacity);
  }
  if (g.host_seqlens == nullptr) {
    return std::nullopt;
  }
  const int64_t pages = r.k.shape[0];
  for (int64_t b = 0; b < g.count; ++b) {
    const int64_t keys = g.host_seqlens[b];
    if (keys < 0 || keys > g.max_seqlen_k) {
      return fail(Code::InvalidPageTable, Operand::SeqlensK, Field::KeysBeyondPages, b, keys,
                  g.max_seqlen_k);
    }
    if (g.host_table == nullptr) {
      continue;
    }
    const int32_t* row = g.host_table + b * g.pages_per_seq;
    for (int64_t j = 0; j < (keys + ps - 1) / ps; ++j) {
      if (row[j] < 0 || row[j] >= pages) {
        return fail(Code::InvalidPageTable, Operand::BlockTable, Field::PageIndex, b, row[j],
                    pages);
      }
    }
  }
  return std::nullopt;
}

Failed check_paged_keys(const Request& r) {
  const int32_t* keys = r.pages.host_seqlens;
  const int64_t sq = r.q.shape[1];
  if (keys == nullptr || sq == 0 || r.q.shape[2] == 0) {
    return std::nullopt;
  }
  for (int64_t b = 0; b < r.pages.count; ++b) {
    const int64_t sk = keys[b];
    const int64_t blind = blind_rows(r.options, sq, sk);
    if (blind > 0) {
      return fail(Code::NoVisibleKeys, Operand::None, Field::Sequences, blind, sq, sk,
                  "sequence " + std::to_string(b));
    }
  }
  return std::nullopt;
}

}  // namespace flashcore::core
