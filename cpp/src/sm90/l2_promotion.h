// The TMA descriptors of the Hopper kernel ask L2 for 256 bytes per request instead of CuTe's
// 128 (CU_TENSOR_MAP_L2_PROMOTION_L2_256B): a K or V tile is two boxes of 64 columns, each
// reading half of every 256-byte key row, so with 128-byte requests DRAM sees each row in two
// halves issued a box apart. Measured (docs/PERFORMANCE.md, session 41, an H100): decode 0.4-0.9%
// faster (1 x 32k keys 65.7-65.8 us against 66.3-66.4), prefill and paged caches unchanged within
// their noise. CuTe builds its descriptors through CUTLASS's driver-call macro; this header,
// included before any CuTe header of a Hopper translation unit (first in launch.cuh, which every
// instance and sweep unit includes first), points that macro at a wrapper that changes only the
// promotion. The macro's other use, CuTe's im2col descriptors, is in no Hopper unit: a unit that
// included it would fail to compile here rather than build descriptors unchanged.
#pragma once

#include "cutlass/cuda_host_adapter.hpp"

namespace flashcore::sm90::driver {

// cuTensorMapEncodeTiled as CuTe calls it (copy_traits_sm90_tma.hpp), promotion raised.
template <class Map, class Type, class Rank, class Address, class Dims, class Strides, class Box,
          class ElementStrides, class Interleave, class Swizzle, class Promotion, class Fill>
CUresult call_cuTensorMapEncodeTiled(Map map, Type type, Rank rank, Address address, Dims dims,
                                     Strides strides, Box box, ElementStrides element_strides,
                                     Interleave interleave, Swizzle swizzle, Promotion, Fill fill) {
  return cutlass::call_cuTensorMapEncodeTiled(map, type, rank, address, dims, strides, box,
                                              element_strides, interleave, swizzle,
                                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, fill);
}

}  // namespace flashcore::sm90::driver

#undef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#define CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) ::flashcore::sm90::driver::call_##func
