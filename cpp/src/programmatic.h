// Launching a kernel as a programmatic dependent of the stream's previous kernel (compute
// capability 9.0 and later): the grid may start while that kernel's last blocks run, so it sets
// up early; it must wait in cudaGridDependencySynchronize() before it touches global memory
// that kernel writes. The split-KV combine and the Hopper kernel launch this way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "check.h"
#include "device_limits.h"

namespace flashcore {

// The dynamic shared memory per block that spreads a programmatic dependent of `blocks` blocks
// of `threads` threads over the SMs of `device` (the current device's device_limits()): 0 where
// the threads already do. Launched while the kernel before it runs, such a grid's blocks can
// become resident at once on the SMs that kernel leaves free, as many per SM as fit, and then
// run there. That is our reading of the split-KV combine of 1 x 32k keys (32 blocks of 128
// threads beside a 128-block kernel on 132 SMs), 2.7 us a call slower than when held to one
// block per SM (docs/PERFORMANCE.md, session 57). Asking each block for just over 1 / (cap + 1)
// of an SM's shared memory holds it to cap = ceil(blocks / SMs) blocks per SM. A kernel asking
// for more than 48 KB opts in (smem.h's ensure_smem_limit).
inline int spread_smem_bytes(int64_t blocks, int threads, const DeviceLimits& device) {
  const int64_t cap = (blocks + device.sms - 1) / device.sms;
  if (cap >= device.threads_per_sm / threads) {
    return 0;
  }
  // (cap + 1) blocks of it exceed the SM's shared memory, cap blocks fit.
  return static_cast<int>(device.smem_per_sm / (cap + 1)) + 1 - device.smem_reserved_per_block;
}

// Launches `kernel(args...)` on `stream` (a programmatic dependent where `programmatic`, else an
// ordinary launch), throwing detail::Failure when the launch fails (`what` names it).
template <typename... Params, typename... Args>
void launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                         cudaStream_t stream, bool programmatic, const char* what,
                         Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = programmatic ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

}  // namespace flashcore
