// The public backward entry (flashcore/flashcore.h attention_backward): describe, validate,
// plan, launch (cpp/src/backward/).
#include <cuda_runtime_api.h>

#include "attention.h"
#include "backward/launch.h"
#include "check.h"
#include "core/backward.h"
#include "describe.h"
#include "flashcore/flashcore.h"

namespace flashcore {
namespace {

// The launch of the validated backward call `r` (problem `p`).
BackwardLaunch make_launch(const core::BackwardRequest& r, const core::Problem& p) {
  const core::Request& f = r.forward;
  BackwardLaunch a{};
  a.dtype = f.dtype;
  a.batch = static_cast<int32_t>(p.batch);
  a.seq_q = static_cast<int32_t>(p.seq_q);
  a.seq_k = static_cast<int32_t>(p.seq_k);
  a.heads_q = static_cast<int32_t>(p.heads_q);
  a.heads_kv = static_cast<int32_t>(p.heads_kv);
  a.head_dim = static_cast<int32_t>(p.head_dim);
  const auto at = [](const core::TensorDesc& t) { return reinterpret_cast<void*>(t.address); };
  a.q = at(f.q), a.k = at(f.k), a.v = at(f.v), a.out = at(f.out), a.dout = at(r.dout);
  a.lse = static_cast<const float*>(at(f.lse));
  a.dq = at(r.dq), a.dk = at(r.dk), a.dv = at(r.dv);
  const std::pair<int64_t*, const core::TensorDesc*> strides[] = {
      {a.q_stride, &f.q},   {a.k_stride, &f.k},   {a.v_stride, &f.v},
      {a.o_stride, &f.out}, {a.do_stride, &r.dout}, {a.dq_stride, &r.dq},
      {a.dk_stride, &r.dk}, {a.dv_stride, &r.dv}};
  for (const auto& [to, t] : strides) {
    for (int i = 0; i < 3; ++i) {
      to[i] = t->stride[i];
    }
  }
  a.scale = p.scale;
  a.softcap = f.options.softcap.value_or(0.0f);
  a.causal = p.causal != Causal::None;
  a.bottom_right = p.causal != Causal::TopLeft;  // validate.h: blind_rows
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  if (p.varlen) {
    a.cu_q = reinterpret_cast<const int32_t*>(f.cu_q.address);
    a.cu_k = reinterpret_cast<const int32_t*>(f.cu_k.address);
    a.total_q = static_cast<int32_t>(f.q.shape[1]);
    a.total_k = static_cast<int32_t>(f.k.shape[1]);
  }
  if (f.has_alibi) {
    a.alibi = reinterpret_cast<const float*>(f.alibi.address);
    a.alibi_batch_stride = f.alibi.batch == 1 ? 0 : f.alibi.heads;
  }
  if (f.has_bias) {
    a.bias = at(f.bias);
    a.bias_type = static_cast<int32_t>(f.bias_type);
    for (int i = 0; i < 4; ++i) {
      a.bias_stride[i] = f.bias.shape[i] == 1 ? 0 : f.bias.stride[i];
    }
  }
  return a;
}

// The Hopper kernel's passes for `a` (a row that plan_backward picks only in a build with it).
void launch_backward_hopper(const BackwardLaunch& a, cudaStream_t stream) {
  if (!has_gradients(a)) {
    return;
  }
#ifdef FLASHCORE_WITH_SM90
  const bool f16 = a.dtype == DType::F16;
  if (core::backward_tier(a.head_dim) == 64) {
    f16 ? launch_backward_sm90<DType::F16, 64>(a, stream)
        : launch_backward_sm90<DType::BF16, 64>(a, stream);
  } else {
    f16 ? launch_backward_sm90<DType::F16, 128>(a, stream)
        : launch_backward_sm90<DType::BF16, 128>(a, stream);
  }
#else
  throw detail::Failure(Code::Launch, "", "backward: the Hopper kernel is not in this build");
#endif
}

}  // namespace

Status attention_backward(const BackwardArgs& args, cudaStream_t stream,
                          BackwardTileRow* row) noexcept {
  try {
    int device = 0;
    if (Status s = detail::current_device(&device); !s.ok()) {
      return s;
    }
    core::BackwardRequest r;
    r.forward = detail::request_of(args.forward, device);  // its lse: required (validation)
    r.dout = detail::describe(args.dout, 2, device);
    r.dq = detail::describe(args.dq, 2, device);
    r.dk = detail::describe(args.dk, 2, device);
    r.dv = detail::describe(args.dv, 2, device);
    core::Problem p{};
    if (Status s = core::validate_backward(r, &p); !s.ok()) {
      return s;
    }
    if (p.location != device) {
      return core::fail(Code::DeviceMismatch, Operand::Q, Field::None, p.location, device, 0);
    }
    int tile = -1;
    if (Status s = core::plan_backward(r, p, detail::device_caps(device), &tile);
        !s.ok()) {
      return s;
    }
    BackwardLaunch launch = make_launch(r, p);
    launch.tile = tile;
    if (core::kBackwardTiles[tile].kernel == BackwardKernel::Hopper) {
      launch_backward_hopper(launch, stream);
    } else {
      launch_backward(launch, stream);
    }
    if (row != nullptr) {
      *row = core::kBackwardTiles[tile];
    }
    return {};
  } catch (const std::exception& e) {
    return detail::to_status(e);
  }
}

}  // namespace flashcore
