// Stream-ordered scratch memory for a launch (split-KV partial states, CUTLASS's accumulators).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "check.h"

namespace flashcore::detail {

// `bytes` from the device's default pool (cudaMallocAsync on the launch's stream), freed on
// that stream, after the work enqueued there, when it leaves scope. Zero bytes allocate nothing.
// Running out of memory throws Code::OutOfDeviceMemory.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) {
      check_alloc(cudaMallocAsync(&ptr_, bytes, stream), bytes, "cudaMallocAsync (scratch)");
    }
  }
  ~Scratch() {
    if (ptr_ != nullptr) {
      (void)cudaFreeAsync(ptr_, stream_);  // cannot throw here; a fault shows at the next check
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace flashcore::detail
