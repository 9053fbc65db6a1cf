// A call validated and planned once (host-only, so that the Rust bridge can hold one in every
// build): the public C++ AttentionPlan and the Rust AttentionPlan keep one, and each run only
// readdresses its operands and launches (detail::run_prepared, attention.h).
#pragma once

#include <cstdint>

#include "core/validate.h"

namespace flashcore::detail {

// The request (with the addresses of its first operands, and no host copies), its problem and
// plan, for device `device`.
struct Prepared {
  int32_t device = 0;
  core::Request request;
  core::Problem problem{};
  core::Plan plan{};
};

}  // namespace flashcore::detail
