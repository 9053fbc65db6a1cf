// The limits of the current device that launches size their grids by, read once per device
// (the hot path asks for them on every call; cudaDeviceGetAttribute is not free).
#pragma once

#include <cuda_runtime.h>

#include <mutex>

#include "check.h"

namespace flashcore {

struct DeviceLimits {
  int sms;                      // multiprocessors
  int threads_per_sm;           // resident threads per SM at most
  int smem_per_sm;              // shared memory per SM, bytes
  int smem_reserved_per_block;  // shared memory the system reserves per block, bytes
  int smem_per_block_optin;     // dynamic shared memory a block may opt in to, bytes
};

// The current device's limits (one cache slot per device ordinal, modulo 64): one
// cudaGetDevice per call once read.
inline const DeviceLimits& device_limits() {
  static std::once_flag read[64];
  static DeviceLimits limits[64];
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const int slot = device & 63;
  std::call_once(read[slot], [&] {
    const auto get = [&](cudaDeviceAttr attr) {
      int value = 0;
      check_cuda(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
      return value;
    };
    limits[slot] = {get(cudaDevAttrMultiProcessorCount),
                    get(cudaDevAttrMaxThreadsPerMultiProcessor),
                    get(cudaDevAttrMaxSharedMemoryPerMultiprocessor),
                    get(cudaDevAttrReservedSharedMemoryPerBlock),
                    get(cudaDevAttrMaxSharedMemoryPerBlockOptin)};
  });
  return limits[slot];
}

}  // namespace flashcore
