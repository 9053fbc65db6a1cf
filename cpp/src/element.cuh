// Device conversions between the element types (f16, bf16, f32) and float (internal; the merge
// and backward kernels share them).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashcore {

inline __device__ float to_float(__half x) { return __half2float(x); }
inline __device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline __device__ float to_float(float x) { return x; }

// Rounds to nearest even.
template <typename T>
inline __device__ T from_float(float x);
template <>
inline __device__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
inline __device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

}  // namespace flashcore
