// Attributes of the current device, read once per device and cached (the hot path asks for them
// on every call; cudaDeviceGetAttribute is not free).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "check.h"

namespace flashcore {

// `kAttr` of the current device (one cache slot per device ordinal, modulo 64).
template <cudaDeviceAttr kAttr>
int device_attribute() {
  static std::atomic<int> cached[64] = {};  // the value plus one; 0: not read yet
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  std::atomic<int>& slot = cached[device & 63];
  const int held = slot.load(std::memory_order_relaxed);
  if (held != 0) {
    return held - 1;
  }
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, kAttr, device), "cudaDeviceGetAttribute");
  slot.store(value + 1, std::memory_order_relaxed);
  return value;
}

}  // namespace flashcore
