// Checking CUDA calls: every failure becomes a detail::Failure carrying CUDA's name and message.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "launcher.h"

namespace flashcore {

// Throws for a failed CUDA call. The runtime's per-thread last error is cleared first, so a
// recoverable failure (an allocation) does not resurface at the next launch check.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw detail::Failure(Code::Cuda, cudaGetErrorName(status),
                          std::string(what) + ": " + cudaGetErrorString(status));
  }
}

// check_cuda for an allocation of `bytes`: running out of device memory is its own code.
inline void check_alloc(cudaError_t status, size_t bytes, const char* what) {
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw detail::Failure(Code::OutOfDeviceMemory, cudaGetErrorName(status),
                          std::string(what) + " of " + std::to_string(bytes) +
                              " bytes: " + cudaGetErrorString(status),
                          static_cast<int64_t>(bytes));
  }
  check_cuda(status, what);
}

}  // namespace flashcore
