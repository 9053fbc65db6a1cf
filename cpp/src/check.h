// Checking CUDA calls: every failure becomes a flashcore::Error carrying CUDA's name and message.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "flashcore/fmha.h"

namespace flashcore {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorKind::Cuda, cudaGetErrorName(status),
                std::string(what) + ": " + cudaGetErrorString(status));
  }
}

}  // namespace flashcore
