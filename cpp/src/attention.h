// From a validated, planned request to a kernel launch (internal; used by attention.cpp's public
// entry and by the Rust bridge).
#pragma once

#include <cuda_runtime_api.h>

#include "core/validate.h"
#include "flashcore/flashcore.h"
#include "flashcore/status.h"
#include "launcher.h"
#include "prepared.h"

namespace flashcore::detail {

// The launch arguments for `p` with `plan.row`'s tile. One-query GQA/MQA problems (decoding) are
// packed: the query heads sharing a key/value head become rows of one head, so each K/V tile is
// read once per group (exact because the one query sees every key; the dense [batch, heads, 1]
// logsumexp layout is the same either way).
FmhaArgs make_args(const core::Request& r, const core::Problem& p, const core::Plan& plan);

// Enqueues the planned launch on `stream` (current device). Throws Failure.
void run(const core::Request& r, const core::Problem& p, const core::Plan& plan,
         cudaStream_t stream);

// The core's description of `args` for a call on `device` (asking CUDA where each pointer lives).
core::Request request_of(const AttentionArgs& args, int32_t device);

// Describes `args` on the current device (asking CUDA where each pointer lives), validates and
// plans it: the whole host work of attention_forward but the launch.
Status prepare(const AttentionArgs& args, Prepared* call);

// What `plan` launches, as the public API reports it.
LaunchInfo launch_info(const core::Plan& plan);

// A planned run on new tensors of the planned dims and strides: checks `r`'s addresses
// (alignment, overlapping outputs), then enqueues the launch. Throws Failure for CUDA errors.
Status run_planned(const core::Request& r, const core::Problem& p, const core::Plan& plan,
                   cudaStream_t stream);

// A run of `call` (the C++ AttentionPlan's and the Rust one's) on `data`'s tensors, whose dims,
// strides and places are the plan's (the caller's promise), on `stream` of the current device,
// which must be the plan's (else Code::DeviceMismatch): a logsumexp exactly when planned, each
// address present, then run_planned. Throws Failure for CUDA errors.
Status run_prepared(const Prepared& call, const RunArgs& data, cudaStream_t stream);
// The same where the caller knows the current device (`device`; the Rust bridge has just made
// it current), which saves asking CUDA again.
Status run_prepared(const Prepared& call, const RunArgs& data, cudaStream_t stream, int device);

// The device's compute capability and per-block shared-memory limit, read once per device.
core::DeviceCaps device_caps(int device);

// A Failure (or any exception) as a Status.
Status to_status(const std::exception& e);

}  // namespace flashcore::detail
