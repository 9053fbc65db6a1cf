// The public merge entry (flashcore/flashcore.h merge_states): describe, validate, launch.
#include <cuda_runtime_api.h>

#include <vector>

#include "attention.h"
#include "core/merge.h"
#include "describe.h"
#include "flashcore/flashcore.h"
#include "merge/launch.h"

namespace flashcore {
namespace {

MergeLaunch make_launch(const core::MergeRequest& r, const core::MergeProblem& p) {
  MergeLaunch m{};
  m.dtype = r.dtype;
  m.batch = p.batch;
  m.seq = p.seq;
  m.heads = p.heads;
  m.head_dim = p.head_dim;
  m.count = p.count;
  for (int64_t i = 0; i < p.count; ++i) {
    m.outs[i] = reinterpret_cast<const void*>(r.outs[i].address);
    m.lses[i] = reinterpret_cast<const float*>(r.lses[i].address);
    for (int k = 0; k < 3; ++k) {
      m.out_strides[i][k] = r.outs[i].stride[k];
    }
  }
  m.out = reinterpret_cast<void*>(r.out.address);
  for (int k = 0; k < 3; ++k) {
    m.o_stride[k] = r.out.stride[k];
  }
  m.lse = r.has_lse ? reinterpret_cast<float*>(r.lse.address) : nullptr;
  return m;
}

}  // namespace

Status merge_states(const MergeArgs& args, cudaStream_t stream) noexcept {
  try {
    int device = 0;
    if (Status s = detail::current_device(&device); !s.ok()) {
      return s;
    }
    const int32_t count = args.states == nullptr ? 0 : args.count;
    std::vector<core::TensorDesc> outs, lses;
    if (count > 0 && count <= kMaxMergeStates) {
      outs.reserve(count);
      lses.reserve(count);
      for (int32_t i = 0; i < count; ++i) {
        outs.push_back(detail::describe(args.states[i].out, 2, device));
        lses.push_back(detail::describe(args.states[i].lse, 4, device));
      }
    }
    core::MergeRequest r;
    r.dtype = args.dtype;
    r.outs = outs.data();
    r.lses = lses.data();
    r.count = count;
    r.out = detail::describe(args.out, 2, device);
    r.has_lse = args.lse.has_value();
    if (r.has_lse) {
      r.lse = detail::describe(*args.lse, 4, device);
    }
    core::MergeProblem p{};
    Status s = core::validate_merge(r, &p);
    if (!s.ok()) {
      return s;
    }
    if (p.location != device) {
      return core::fail(Code::DeviceMismatch, Operand::Out, Field::None, p.location, device, 0);
    }
    if (!p.empty()) {
      launch_merge(make_launch(r, p), stream);
    }
    return {};
  } catch (const std::exception& e) {
    return detail::to_status(e);
  }
}

}  // namespace flashcore
