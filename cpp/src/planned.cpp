// The public plan-once, run-many call (flashcore::AttentionPlan in flashcore/flashcore.h).
#include <cuda_runtime_api.h>

#include "attention.h"
#include "core/validate.h"
#include "describe.h"
#include "flashcore/flashcore.h"

namespace flashcore {

namespace {

// `d` at a run's address `address`. A null address is refused where the operand has elements
// (attention_forward would place it on the host): DeviceMismatch, like that call.
Status readdress(Operand op, core::TensorDesc& d, const void* address, int32_t device) {
  d.address = reinterpret_cast<uint64_t>(address);
  if (address == nullptr && !detail::no_elements(d.shape)) {
    return core::fail(Code::DeviceMismatch, op, Field::None, core::kHost, device, 0);
  }
  return {};
}

}  // namespace

namespace detail {

Status run_prepared(const Prepared& call, const RunArgs& data, cudaStream_t stream) {
  int device = 0;
  if (Status s = current_device(&device); !s.ok()) {
    return s;
  }
  return run_prepared(call, data, stream, device);
}

Status run_prepared(const Prepared& call, const RunArgs& data, cudaStream_t stream, int device) {
  if (device != call.device) {
    return core::fail(Code::DeviceMismatch, Operand::Q, Field::None, call.device, device, 0);
  }
  if ((data.lse != nullptr) != call.request.has_lse) {
    return core::fail(Code::PlanMismatch, Operand::Lse, Field::None, 0, 0, 0);
  }
  core::Request r = call.request;
  struct Slot {
    Operand op;
    core::TensorDesc* desc;
    const void* address;
  };
  const Slot operands[] = {{Operand::Q, &r.q, data.q},
                           {Operand::K, &r.k, data.k},
                           {Operand::V, &r.v, data.v},
                           {Operand::Out, &r.out, data.out},
                           {Operand::Lse, &r.lse, data.lse}};
  for (const Slot& o : operands) {
    if (o.op == Operand::Lse && !r.has_lse) {
      continue;
    }
    if (Status s = readdress(o.op, *o.desc, o.address, device); !s.ok()) {
      return s;
    }
  }
  return run_planned(r, call.problem, call.plan, stream);
}

}  // namespace detail

AttentionPlan::AttentionPlan() noexcept = default;
AttentionPlan::~AttentionPlan() = default;
AttentionPlan::AttentionPlan(const AttentionPlan&) noexcept = default;
AttentionPlan& AttentionPlan::operator=(const AttentionPlan&) noexcept = default;

Status AttentionPlan::create(const AttentionArgs& args, AttentionPlan* plan) noexcept {
  try {
    auto call = std::make_shared<detail::Prepared>();
    if (Status s = detail::prepare(args, call.get()); !s.ok()) {
      return s;
    }
    // Host copies are read by validation only; a run never looks at them.
    call->request.cu_q.host = call->request.cu_k.host = nullptr;
    call->request.pages.host_table = call->request.pages.host_seqlens = nullptr;
    call->request.alibi.host = nullptr;
    if (plan != nullptr) {
      plan->call_ = std::move(call);
    }
    return {};
  } catch (const std::exception& e) {
    return detail::to_status(e);
  }
}

Status AttentionPlan::run(const RunArgs& data, cudaStream_t stream) const noexcept {
  try {
    if (call_ == nullptr) {
      return core::fail(Code::PlanMismatch, Operand::None, Field::None, 0, 0, 0);
    }
    return detail::run_prepared(*call_, data, stream);
  } catch (const std::exception& e) {
    return detail::to_status(e);
  }
}

LaunchInfo AttentionPlan::info() const noexcept {
  return call_ == nullptr ? LaunchInfo{} : detail::launch_info(call_->plan);
}

}  // namespace flashcore
