// A TMA descriptor's strides (host-only), for the Hopper backward launcher (sm90/launch.cuh has
// the forward kernel's copy of this rule; merging them would rebuild every forward kernel).
#pragma once

#include <cstdint>

namespace flashcore {

// A dimension of extent 1 is never stepped over, so validation leaves its stride free; a TMA
// descriptor still needs every stride to be a multiple of 16 bytes. Give such dimensions one.
inline int64_t tma_stride(int64_t stride, int64_t extent) { return extent == 1 ? 8 : stride; }

}  // namespace flashcore
