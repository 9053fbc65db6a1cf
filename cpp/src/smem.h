// Opting a kernel in to more than 48 KB of dynamic shared memory, once per device.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "check.h"

namespace flashcore {

// Raises the dynamic shared-memory limit of `kernel` to `smem_bytes` on the current device, the
// first time it is launched there (one bit per device ordinal, modulo 64). A template on the
// kernel itself, not its type: kernels of one signature must not share the flag.
template <auto kernel>
void ensure_smem_limit(int smem_bytes) {
  static std::atomic<uint64_t> done_devices{0};
  if (smem_bytes <= 48 * 1024) {
    return;
  }
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (done_devices.load(std::memory_order_acquire) & bit) {
    return;
  }
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  done_devices.fetch_or(bit, std::memory_order_acq_rel);
}

}  // namespace flashcore
