// The checks of ALiBi slopes (Request::alibi, flashcore::AlibiSlopes): where they live, their
// alignment and shape, and, with a host copy, that every slope is finite. Called by validate.cpp
// in its order (after the window), and by the Rust crate when it builds its slopes.
#pragma once

#include "core/checks.h"

namespace flashcore::core {

// The slopes of a call with `sequences` sequences and q's location `location`: on that location
// (DeviceMismatch), 4-byte aligned on a device (MisalignedPointer), [1 or sequences, heads_q]
// (ShapeMismatch, Field::Batch / Heads), and with the host copy, finite.
Failed check_alibi(const Request& r, int64_t sequences);

// `count` host slopes are finite (Code::InvalidAlibiSlope names the first that is not).
Failed check_alibi_values(const float* host, int64_t count);

}  // namespace flashcore::core
