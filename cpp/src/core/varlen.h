// The checks of a variable-length batch's offsets (Request::varlen, flashcore::Sequences):
// where they live, their count and longest length, and, when the caller gave host copies, their
// contents and the keys each sequence's queries see. Called by validate.cpp in its order.
#pragma once

#include "core/checks.h"

namespace flashcore::core {

// Placement and shape of cu_q and cu_k (on q's device, 4-byte aligned, the same sequence count,
// a longest length within the token count) and, with host copies, their contents: entry 0 is 0,
// no entry below the one before it, the last one is the token count, no sequence longer than
// its max_len.
Failed check_offsets(const Request& r);

// With both host copies: the first sequence with query rows that see no key (no keys at all,
// or bottom-right causal with more queries than keys), as Code::NoVisibleKeys.
Failed check_sequence_keys(const Request& r);

}  // namespace flashcore::core
