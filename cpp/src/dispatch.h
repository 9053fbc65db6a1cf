// From a planned launch to the kernel instantiation that runs it (dispatch.cpp), and what this
// build compiled. Host-only and kept out of launcher.h, which every kernel includes: build.rs
// hashes launcher.h into each kernel's cache key, so a change here recompiles no kernel.
#pragma once

#include <cuda_runtime_api.h>

#include "core/validate.h"
#include "launcher.h"

namespace flashcore {

// Launches `kernel`'s instantiation for `args.tile` and `args.dtype` on `stream` (of the current
// device) and returns once it is queued.
void launch(Kernel kernel, const FmhaArgs& args, cudaStream_t stream);

// Records in `caps` what this build compiled: the kernel families (DeviceCaps::kernels, one bit
// per Kernel value) and whether the Hopper kernel's bias schedules are among them
// (DeviceCaps::sm90_bias).
void set_compiled(core::DeviceCaps& caps) noexcept;

}  // namespace flashcore
