// The checks of a paged KV cache (Request::paged, flashcore::Pages): the page size, where the
// block table and the key lengths live, their shapes, and, when the caller gave host copies,
// every length and every page index the lengths reach. Called by validate.cpp in its order.
#pragma once

#include "core/checks.h"

namespace flashcore::core {

// K and V ([num_pages, page_size, heads_kv, head_dim]) against the pages: a power-of-two page
// size from 16 to 1024 that is K's dim 1, a table and lengths on q's device, 4-byte aligned,
// for q's batch; max_seqlen_k within what pages_per_seq pages hold; with host copies, each
// length within max_seqlen_k and each page a sequence's keys reach within [0, num_pages).
Failed check_pages(const Request& r);

// With the host lengths: the first sequence with query rows that see no key (no keys, or
// bottom-right causal with more queries than keys), as Code::NoVisibleKeys.
Failed check_paged_keys(const Request& r);

}  // namespace flashcore::core
