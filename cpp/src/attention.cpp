// The public entry (flashcore/flashcore.h) and the step from a plan to a launch.
#include "attention.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <new>
#include <vector>

#include "check.h"
#include "describe.h"
#include "dispatch.h"
#include "flashcore/flashcore.h"

namespace flashcore::detail {

FmhaArgs make_args(const core::Request& r, const core::Problem& p, const core::Plan& plan) {
  FmhaArgs a{};
  a.dtype = r.dtype;
  a.q = reinterpret_cast<const void*>(r.q.address);
  a.k = reinterpret_cast<const void*>(r.k.address);
  a.v = reinterpret_cast<const void*>(r.v.address);
  a.out = reinterpret_cast<void*>(r.out.address);
  a.lse = r.has_lse ? reinterpret_cast<float*>(r.lse.address) : nullptr;
  a.batch = p.batch;
  a.seq_k = p.seq_k;
  a.heads_kv = p.heads_kv;
  a.head_dim = p.head_dim;
  for (int i = 0; i < 3; ++i) {
    a.q_stride[i] = r.q.stride[i];
    a.k_stride[i] = r.k.stride[i];
    a.v_stride[i] = r.v.stride[i];
    a.o_stride[i] = r.out.stride[i];
  }
  a.scale = p.scale;
  if (p.packs_heads() && p.varlen) {
    // Not a view: each sequence's query token holds its own rows (FmhaArgs::packed_group).
    a.seq_q = p.seq_q;
    a.heads_q = p.heads_q;
    a.causal = Causal::None;
    a.packed_group = static_cast<int32_t>(p.heads_q / p.heads_kv);
    a.token_rows = p.token_rows;
  } else if (p.packs_heads()) {
    const int64_t group = p.heads_q / p.heads_kv;
    pack_head_rows(a.q_stride, group);
    pack_head_rows(a.o_stride, group);
    a.seq_q = group;
    a.heads_q = p.heads_kv;
    a.causal = Causal::None;
  } else {
    a.seq_q = p.seq_q;
    a.heads_q = p.heads_q;
    a.causal = p.causal;
  }
  a.softcap = r.options.softcap.value_or(0.0f);
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  if (p.alibi) {
    a.alibi_slopes = reinterpret_cast<const float*>(r.alibi.address);
    a.alibi_batch_stride = r.alibi.batch > 1 ? r.alibi.heads : 0;
  }
  if (p.bias) {
    a.bias = reinterpret_cast<const void*>(r.bias.address);
    a.bias_type = r.bias_type;
    for (int i = 0; i < 4; ++i) {  // a dim of 1 broadcasts: its index is always 0
      a.bias_stride[i] = r.bias.shape[i] == 1 ? 0 : r.bias.stride[i];
    }
    a.bias_rows = r.bias.shape[1];
    a.bias_keys = r.bias.shape[3];
  }
  a.tile = plan.row->tile;
  a.splits = plan.splits;
  if (plan.split_keys > 0) {
    a.split_keys = plan.split_keys;
    a.split_first = plan.split_first.data();
  }
  if (!plan.sequence_order.empty()) {
    a.sequence_order = plan.sequence_order.data();
  }
  if (p.varlen) {
    a.cu_seqlens_q = reinterpret_cast<const int32_t*>(r.cu_q.address);
    a.cu_seqlens_k = reinterpret_cast<const int32_t*>(r.cu_k.address);
    a.total_q = r.q.shape[1];
    a.total_k = r.k.shape[1];
  }
  if (p.paged) {
    a.block_table = reinterpret_cast<const int32_t*>(r.pages.table);
    a.seqlens_k = reinterpret_cast<const int32_t*>(r.pages.seqlens);
    a.page_size = r.pages.page_size;
    a.pages_per_seq = r.pages.pages_per_seq;
    a.num_pages = r.k.shape[0];
  }
  return a;
}

void run(const core::Request& r, const core::Problem& p, const core::Plan& plan,
         cudaStream_t stream) {
  if (!p.empty()) {
    launch(plan.kernel, make_args(r, p, plan), stream);
  }
}

core::DeviceCaps device_caps(int device) {
  static std::mutex mutex;
  static std::vector<std::optional<core::DeviceCaps>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= 0 && static_cast<size_t>(device) < cache.size() && cache[device]) {
    return *cache[device];
  }
  core::DeviceCaps caps;
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&caps.major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  check_cuda(cudaDeviceGetAttribute(&caps.minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute(ComputeCapabilityMinor)");
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  caps.smem_per_block_optin = optin;
  set_compiled(caps);
  check_cuda(cudaDeviceGetAttribute(&caps.multiprocessors, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  if (static_cast<size_t>(device) >= cache.size()) {
    cache.resize(device + 1);
  }
  cache[device] = caps;
  return caps;
}

Status to_status(const std::exception& e) {
  Status s;
  if (const auto* f = dynamic_cast<const Failure*>(&e)) {
    s.code = f->code();
    s.values[0] = f->value();
    s.cuda_name = f->cuda_name();
    s.message = f->message();
  } else if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    s.code = Code::Launch;
    s.message = "out of host memory";
  } else {
    s.code = Code::Launch;
    s.message = e.what();
  }
  return s;
}

core::Request request_of(const AttentionArgs& args, int32_t device) {
  core::Request r;
  r.dtype = args.dtype;
  r.q = describe(args.q, 2, device);
  r.k = describe(args.k, 2, device);
  r.v = describe(args.v, 2, device);
  r.out = describe(args.out, 2, device);
  r.has_lse = args.lse.has_value();
  if (r.has_lse) {
    r.lse = describe(*args.lse, 4, device);
  }
  r.options = args.options;
  if (args.sequences) {
    const Sequences& seqs = *args.sequences;
    r.varlen = true;
    r.cu_q = describe_offsets(seqs.cu_seqlens_q, seqs.host_cu_seqlens_q, seqs, seqs.max_seqlen_q,
                              device);
    r.cu_k = describe_offsets(seqs.cu_seqlens_k, seqs.host_cu_seqlens_k, seqs, seqs.max_seqlen_k,
                              device);
  }
  if (args.pages) {
    r.paged = true;
    r.pages = describe_pages(*args.pages, device);
  }
  if (args.alibi) {
    r.has_alibi = true;
    r.alibi = describe_alibi(*args.alibi, device);
  }
  if (args.bias) {
    r.has_bias = true;
    r.bias_type = args.bias->dtype;
    r.bias = describe_bias(*args.bias, device);
  }
  return r;
}

Status prepare(const AttentionArgs& args, Prepared* call) {
  if (Status s = current_device(&call->device); !s.ok()) {
    return s;
  }
  call->request = request_of(args, call->device);
  if (Status s = core::validate(call->request, &call->problem); !s.ok()) {
    return s;
  }
  if (call->problem.location != call->device) {
    return core::fail(Code::DeviceMismatch, Operand::Q, Field::None, call->problem.location,
                      call->device, 0);
  }
  return core::plan(call->request, call->problem, device_caps(call->device), &call->plan);
}

LaunchInfo launch_info(const core::Plan& plan) {
  return LaunchInfo{plan.kernel, *plan.row, plan.splits};
}

Status run_planned(const core::Request& r, const core::Problem& p, const core::Plan& plan,
                   cudaStream_t stream) {
  if (Status s = core::check_addresses(r); !s.ok()) {
    return s;
  }
  run(r, p, plan, stream);
  return {};
}

}  // namespace flashcore::detail

namespace flashcore {

Status attention_forward(const AttentionArgs& args, cudaStream_t stream,
                         LaunchInfo* info) noexcept {
  try {
    detail::Prepared call;
    if (Status s = detail::prepare(args, &call); !s.ok()) {
      return s;
    }
    detail::run(call.request, call.problem, call.plan, stream);
    if (info != nullptr) {
      *info = detail::launch_info(call.plan);
    }
    return {};
  } catch (const std::exception& e) {
    return detail::to_status(e);
  }
}

}  // namespace flashcore
