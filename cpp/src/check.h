// Checking CUDA calls: every failure becomes a detail::Failure carrying CUDA's name and message.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "launcher.h"

namespace flashcore {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw detail::Failure(Code::Cuda, cudaGetErrorName(status),
                          std::string(what) + ": " + cudaGetErrorString(status));
  }
}

}  // namespace flashcore
