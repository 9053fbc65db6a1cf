// Launching a kernel as a programmatic dependent of the stream's previous kernel (compute
// capability 9.0 and later): the grid may start while that kernel's last blocks run, so it sets
// up early; it must wait in cudaGridDependencySynchronize() before it touches global memory
// that kernel writes. The split-KV combine and the Hopper kernel launch this way.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "check.h"

namespace flashcore {

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
