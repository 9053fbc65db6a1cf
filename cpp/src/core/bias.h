// The checks of an additive bias (Request::bias, flashcore::Bias): its element type and extent
// (with the other operands' sizes), then its place, dims and alignment (after the visible keys);
// its overlap with the outputs is check_addresses'. Called by validate.cpp in that order.
#pragma once

#include "core/checks.h"

namespace flashcore::core {

// The bias's element type (UnsupportedBiasType) and extent (check_extent; its element_bytes
// must be bias_element_bytes(bias_type)).
Failed check_bias_extent(const Request& r);

// The bias of a call of `sequences` sequences of (at most) seq_q queries and seq_k keys, q's
// location and heads: on q's location (DeviceMismatch), dims
// [sequences, seq_q, heads_q, seq_k] each the call's or 1 (ShapeMismatch, Field::Batch / SeqQ /
// Heads / SeqK), and on a device aligned to its element size (MisalignedPointer).
Failed check_bias(const Request& r, int64_t sequences, int64_t seq_q, int64_t seq_k);

// The bytes of one element of `type` (0 for a value that is no BiasType).
int32_t bias_element_bytes(BiasType type);

}  // namespace flashcore::core
