#include "flashcore/cpp/src/bridge.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>

#include "attention.h"
#include "bridge_convert.h"
#include "check.h"
#include "dispatch.h"
#include "flashcore/flashcore.h"

namespace flashcore::bridge {
namespace {

// Makes `ordinal` current for this thread (cudaGetDevice is a cheap thread-local read).
void use_device(int32_t ordinal) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ordinal) {
    check_cuda(cudaSetDevice(ordinal), "cudaSetDevice");
  }
}

cudaStream_t as_stream(size_t s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t as_event(size_t e) { return reinterpret_cast<cudaEvent_t>(e); }
void* as_ptr(size_t p) { return reinterpret_cast<void*>(p); }

}  // namespace

uint32_t compiled_kernels() {
  core::DeviceCaps caps;
  set_compiled(caps);
  return caps.kernels;
}

int32_t device_count() {
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  return count;
}

DeviceInfo device_info(int32_t ordinal) {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  DeviceInfo info;
  info.name = rust::String(prop.name);
  info.major = prop.major;
  info.minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  info.smem_per_sm = prop.sharedMemPerMultiprocessor;
  info.total_memory = prop.totalGlobalMem;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  return info;
}

namespace {

cudaMemPool_t default_pool(int32_t ordinal) {
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaDeviceGetDefaultMemPool(&pool, ordinal), "cudaDeviceGetDefaultMemPool");
  return pool;
}

uint64_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  uint64_t value = 0;
  check_cuda(cudaMemPoolGetAttribute(pool, attr, &value), "cudaMemPoolGetAttribute");
  return value;
}

}  // namespace

void retain_pool_memory(int32_t ordinal) {
  const cudaMemPool_t pool = default_pool(ordinal);
  uint64_t threshold = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
             "cudaMemPoolSetAttribute(ReleaseThreshold)");
}

PoolUsage pool_usage(int32_t ordinal) {
  const cudaMemPool_t pool = default_pool(ordinal);
  PoolUsage u;
  u.reserved = pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent);
  u.reserved_high = pool_attribute(pool, cudaMemPoolAttrReservedMemHigh);
  u.used = pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent);
  u.used_high = pool_attribute(pool, cudaMemPoolAttrUsedMemHigh);
  return u;
}

void trim_pool(int32_t ordinal, size_t keep) {
  check_cuda(cudaMemPoolTrimTo(default_pool(ordinal), keep), "cudaMemPoolTrimTo");
}

size_t free_memory(int32_t ordinal) {
  use_device(ordinal);
  size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

size_t stream_create(int32_t ordinal) {
  use_device(ordinal);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return reinterpret_cast<size_t>(s);
}

void stream_destroy(int32_t ordinal, size_t stream) {
  use_device(ordinal);
  check_cuda(cudaStreamDestroy(as_stream(stream)), "cudaStreamDestroy");
}

void stream_synchronize(int32_t ordinal, size_t stream) {
  use_device(ordinal);
  check_cuda(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
}

void stream_wait_event(int32_t ordinal, size_t stream, size_t event) {
  use_device(ordinal);
  check_cuda(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0), "cudaStreamWaitEvent");
}

size_t event_create(int32_t ordinal) {
  use_device(ordinal);
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  return reinterpret_cast<size_t>(e);
}

void event_destroy(int32_t ordinal, size_t event) {
  use_device(ordinal);
  check_cuda(cudaEventDestroy(as_event(event)), "cudaEventDestroy");
}

void event_record(int32_t ordinal, size_t event, size_t stream) {
  use_device(ordinal);
  check_cuda(cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord");
}

void event_synchronize(int32_t ordinal, size_t event) {
  use_device(ordinal);
  check_cuda(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize");
}

float event_elapsed_ms(int32_t ordinal, size_t start, size_t end) {
  use_device(ordinal);
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, as_event(start), as_event(end)), "cudaEventElapsedTime");
  return ms;
}

size_t malloc_async(int32_t ordinal, size_t bytes, size_t stream) {
  use_device(ordinal);
  void* p = nullptr;
  check_alloc(cudaMallocAsync(&p, bytes, as_stream(stream)), bytes, "cudaMallocAsync");
  return reinterpret_cast<size_t>(p);
}

void free_async(int32_t ordinal, size_t ptr, size_t stream) {
  use_device(ordinal);
  check_cuda(cudaFreeAsync(as_ptr(ptr), as_stream(stream)), "cudaFreeAsync");
}

void copy_to_device(int32_t ordinal, size_t dst, rust::Slice<const uint8_t> src, size_t stream) {
  use_device(ordinal);
  // From pageable memory this returns once `src` has been staged, so the borrow may end.
  check_cuda(cudaMemcpyAsync(as_ptr(dst), src.data(), src.size(), cudaMemcpyHostToDevice,
                             as_stream(stream)),
             "cudaMemcpyAsync(host to device)");
}

void copy_to_host(int32_t ordinal, rust::Slice<uint8_t> dst, size_t src, size_t stream) {
  use_device(ordinal);
  check_cuda(cudaMemcpyAsync(dst.data(), as_ptr(src), dst.size(), cudaMemcpyDeviceToHost,
                             as_stream(stream)),
             "cudaMemcpyAsync(device to host)");
  // The Rust borrow of `dst` ends when we return: wait for the copy (and surface async faults).
  check_cuda(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
}

void copy_device(int32_t ordinal, size_t dst, size_t src, size_t bytes, size_t stream) {
  use_device(ordinal);
  check_cuda(cudaMemcpyAsync(as_ptr(dst), as_ptr(src), bytes, cudaMemcpyDeviceToDevice,
                             as_stream(stream)),
             "cudaMemcpyAsync(device to device)");
}

void capture_begin(int32_t ordinal, size_t stream) {
  use_device(ordinal);
  check_cuda(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeRelaxed),
             "cudaStreamBeginCapture");
}

size_t capture_end(int32_t ordinal, size_t stream) {
  use_device(ordinal);
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamEndCapture(as_stream(stream), &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph does not need it
  check_cuda(e, "cudaGraphInstantiate");
  return reinterpret_cast<size_t>(exec);
}

void graph_launch(int32_t ordinal, size_t exec, size_t stream) {
  use_device(ordinal);
  check_cuda(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(exec), as_stream(stream)),
             "cudaGraphLaunch");
}

void graph_destroy(int32_t ordinal, size_t exec) {
  use_device(ordinal);
  check_cuda(cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(exec)),
             "cudaGraphExecDestroy");
}

namespace {

LaunchedFfi launched(const Status& s, Kernel kernel, const TileRow* row, int32_t splits) {
  LaunchedFfi out;
  out.status = to_ffi(s);
  out.kernel = static_cast<int32_t>(kernel);
  out.row = row_ref(kernel, s.ok() ? row : nullptr);
  out.splits = splits;
  return out;
}

}  // namespace

// Validates and plans `r` once (ok: `*p` and `*plan` are set).
static Status prepare(const core::Request& r, const CapsFfi& caps, core::Problem* p,
                      core::Plan* plan) {
  Status s = core::validate(r, p);
  if (!s.ok()) {
    return s;
  }
  core::DeviceCaps device = from_ffi(caps);
  set_compiled(device);
  return core::plan(r, *p, device, plan);
}

LaunchedFfi attention(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                      rust::Slice<const int32_t> host_k, const CapsFfi& caps, int32_t ordinal,
                      size_t stream) {
  const core::Request r = from_ffi(request, host_q, host_k);
  core::Problem p{};
  core::Plan plan{Kernel::CutlassSm80, nullptr};
  Status s = prepare(r, caps, &p, &plan);
  if (s.ok()) {
    try {
      use_device(ordinal);
      detail::run(r, p, plan, as_stream(stream));
    } catch (const std::exception& e) {
      s = detail::to_status(e);
    }
  }
  return launched(s, plan.kernel, plan.row, plan.splits);
}

std::shared_ptr<detail::Prepared> prepare_plan(const RequestFfi& request,
                                               rust::Slice<const int32_t> host_q,
                                               rust::Slice<const int32_t> host_k,
                                               const CapsFfi& caps, int32_t ordinal,
                                               LaunchedFfi& out) noexcept {
  try {
    auto call = std::make_shared<detail::Prepared>();
    call->device = ordinal;
    Status s = prepare(from_ffi(request, host_q, host_k), caps, &call->problem, &call->plan);
    out = launched(s, call->plan.kernel, call->plan.row, call->plan.splits);
    if (!s.ok()) {
      return nullptr;
    }
    call->request = from_ffi(request);  // no host copies: a run never reads them
    return call;
  } catch (...) {
    out = launched(core::out_of_host_memory(), Kernel::CutlassSm80, nullptr, 1);
    return nullptr;
  }
}

StatusFfi run_plan(const detail::Prepared& call, const RunAddressesFfi& a, int32_t ordinal,
                   size_t stream) {
  Status s;
  try {
    use_device(ordinal);
    const RunArgs data{as_ptr(a.q), as_ptr(a.k), as_ptr(a.v), as_ptr(a.out),
                       static_cast<float*>(as_ptr(a.lse))};
    s = detail::run_prepared(call, data, as_stream(stream), ordinal);
  } catch (const std::exception& e) {
    s = detail::to_status(e);
  }
  return to_ffi(s);
}

namespace {

// What the modes of attention_host_ns time per iteration (src/ffi/mod.rs mirrors them).
constexpr int32_t kHostLaunch = 0;      // the launcher alone, validated and planned once
constexpr int32_t kHostPublicCall = 1;  // flashcore::attention_forward: validate, plan, launch
constexpr int32_t kHostPlannedRun = 2;  // flashcore::AttentionPlan::run of the call's plan

template <typename Ref>
Ref to_ref(const DescFfi& d) {
  Ref t;
  t.data = reinterpret_cast<decltype(t.data)>(d.address);
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = d.shape[i];
    t.stride[i] = d.stride[i];
  }
  return t;
}

// The public C++ API's arguments for `request`, as a C++ program would fill them; a
// variable-length batch's offsets or a paged cache's table with their host copies `host_q` and
// `host_k` when both are given.
AttentionArgs public_args(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                          rust::Slice<const int32_t> host_k) {
  AttentionArgs a;
  a.dtype = static_cast<DType>(request.dtype);
  a.q = to_ref<TensorRef>(request.q);
  a.k = to_ref<TensorRef>(request.k);
  a.v = to_ref<TensorRef>(request.v);
  a.out = to_ref<OutputRef>(request.out);
  if (request.has_lse) {
    a.lse = to_ref<OutputRef>(request.lse);
  }
  a.options = from_ffi(request).options;
  if (request.varlen) {
    Sequences seqs;
    seqs.batch = request.cu_q.count;
    seqs.cu_seqlens_q = reinterpret_cast<const int32_t*>(request.cu_q.address);
    seqs.cu_seqlens_k = reinterpret_cast<const int32_t*>(request.cu_k.address);
    seqs.max_seqlen_q = request.cu_q.max_len;
    seqs.max_seqlen_k = request.cu_k.max_len;
    const bool hosts = host_q.size() == static_cast<size_t>(seqs.batch) + 1 &&
                       host_k.size() == host_q.size();
    seqs.host_cu_seqlens_q = hosts ? host_q.data() : nullptr;
    seqs.host_cu_seqlens_k = hosts ? host_k.data() : nullptr;
    a.sequences = seqs;
  }
  if (request.paged) {
    const PagesFfi& g = request.pages;
    Pages pages;
    pages.batch = g.count;
    pages.page_size = g.page_size;
    pages.pages_per_seq = g.pages_per_seq;
    pages.block_table = reinterpret_cast<const int32_t*>(g.table);
    pages.seqlens_k = reinterpret_cast<const int32_t*>(g.seqlens);
    pages.max_seqlen_k = g.max_seqlen_k;
    const bool hosts = !host_k.empty() && host_k.size() == static_cast<size_t>(g.count);
    pages.host_block_table = hosts ? host_q.data() : nullptr;
    pages.host_seqlens_k = hosts ? host_k.data() : nullptr;
    a.pages = pages;
  }
  if (request.has_alibi) {
    AlibiSlopes slopes;
    slopes.data = reinterpret_cast<const float*>(request.alibi.address);
    slopes.batch = request.alibi.batch;
    slopes.heads = request.alibi.heads;
    a.alibi = slopes;
  }
  if (request.has_bias) {
    a.bias = Bias{static_cast<BiasType>(request.bias_dtype), to_ref<TensorRef>(request.bias)};
  }
  return a;
}

}  // namespace

StatusFfi attention_host_ns(const RequestFfi& request, const CapsFfi& caps, int32_t ordinal,
                            size_t stream, int32_t iters, int32_t mode, double& ns) {
  const core::Request r = from_ffi(request);
  core::Problem p{};
  core::Plan plan{};
  Status s = prepare(r, caps, &p, &plan);
  if (!s.ok()) {
    return to_ffi(s);
  }
  const AttentionArgs args = public_args(request, {}, {});
  const RunArgs data{args.q.data, args.k.data, args.v.data, args.out.data,
                     args.lse ? static_cast<float*>(args.lse->data) : nullptr};
  try {
    use_device(ordinal);
    AttentionPlan planned;
    if (mode == kHostPlannedRun) {
      s = AttentionPlan::create(args, &planned);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < iters && s.ok(); ++i) {
      if (mode == kHostPublicCall) {
        s = attention_forward(args, as_stream(stream));
      } else if (mode == kHostPlannedRun) {
        s = planned.run(data, as_stream(stream));
      } else {
        detail::run(r, p, plan, as_stream(stream));
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / (iters > 0 ? iters : 1);
  } catch (const std::exception& e) {
    s = detail::to_status(e);
  }
  return to_ffi(s);
}

namespace {

// The table entry equal to `copy` (LaunchInfo holds the row by value).
const TileRow* find_row(Kernel kernel, const TileRow& copy) {
  for (const Table t : {tile_table(kernel), decode_table(kernel)}) {
    for (const TileRow& r : t) {
      if (r.arch == copy.arch && r.max_head_dim == copy.max_head_dim && r.tile == copy.tile &&
          r.reason == copy.reason) {
        return &r;
      }
    }
  }
  return nullptr;
}

}  // namespace

// What a C++ program does: raw pointers and a raw stream into the public API.
LaunchedFfi cpp_attention_forward(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                                  rust::Slice<const int32_t> host_k, int32_t ordinal,
                                  size_t stream) {
  const AttentionArgs a = public_args(request, host_q, host_k);
  Status s;
  LaunchInfo info{};
  try {
    use_device(ordinal);
    s = attention_forward(a, as_stream(stream), &info);
  } catch (const std::exception& e) {
    s = detail::to_status(e);
  }
  return launched(s, info.kernel, s.ok() ? find_row(info.kernel, info.row) : nullptr,
                  info.splits);
}

StatusFfi merge_states(int32_t dtype, rust::Slice<const DescFfi> outs,
                       rust::Slice<const DescFfi> lses, const DescFfi& out, const DescFfi& lse,
                       bool has_lse, int32_t ordinal, size_t stream) {
  std::array<StateRef, kMaxMergeStates> states;
  const size_t count = std::min(outs.size(), states.size());
  for (size_t i = 0; i < count && i < lses.size(); ++i) {
    states[i].out = to_ref<TensorRef>(outs[i]);
    states[i].lse = to_ref<TensorRef>(lses[i]);
  }
  MergeArgs a;
  a.dtype = static_cast<DType>(dtype);
  a.states = states.data();
  // Rust validated the count before the call; refuse a mismatch again rather than read past.
  a.count = outs.size() == lses.size() && outs.size() <= states.size()
                ? static_cast<int32_t>(outs.size())
                : -1;
  a.out = to_ref<OutputRef>(out);
  if (has_lse) {
    a.lse = to_ref<OutputRef>(lse);
  }
  Status s;
  try {
    use_device(ordinal);
    s = flashcore::merge_states(a, as_stream(stream));
  } catch (const std::exception& e) {
    s = detail::to_status(e);
  }
  return to_ffi(s);
}

BackwardRanFfi attention_backward(const RequestFfi& request, rust::Slice<const int32_t> host_q,
                                  rust::Slice<const int32_t> host_k, const DescFfi& dout,
                                  const DescFfi& dq, const DescFfi& dk, const DescFfi& dv,
                                  int32_t ordinal, size_t stream) {
  BackwardArgs a;
  a.forward = public_args(request, host_q, host_k);
  a.dout = to_ref<TensorRef>(dout);
  a.dq = to_ref<OutputRef>(dq);
  a.dk = to_ref<OutputRef>(dk);
  a.dv = to_ref<OutputRef>(dv);
  Status s;
  BackwardTileRow row{};
  try {
    use_device(ordinal);
    s = flashcore::attention_backward(a, as_stream(stream), &row);
  } catch (const std::exception& e) {
    s = detail::to_status(e);
  }
  const BackwardTable table = backward_tile_table();
  int32_t index = -1;
  for (size_t i = 0; s.ok() && i < table.count; ++i) {
    const BackwardTileRow& t = table.rows[i];  // rows differ in kernel, tier, keys or step
    if (t.kernel == row.kernel && t.max_head_dim == row.max_head_dim &&
        t.keys_per_block == row.keys_per_block && t.rows_per_step == row.rows_per_step) {
      index = static_cast<int32_t>(i);
    }
  }
  return BackwardRanFfi{to_ffi(s), index};
}

size_t cpp_malloc(int32_t ordinal, size_t bytes) {
  use_device(ordinal);
  void* p = nullptr;
  check_alloc(cudaMalloc(&p, bytes), bytes, "cudaMalloc");
  return reinterpret_cast<size_t>(p);
}

void cpp_free(int32_t ordinal, size_t ptr) {
  use_device(ordinal);
  check_cuda(cudaFree(as_ptr(ptr)), "cudaFree");
}

void cpp_upload(int32_t ordinal, size_t dst, rust::Slice<const uint8_t> src) {
  use_device(ordinal);
  check_cuda(cudaMemcpy(as_ptr(dst), src.data(), src.size(), cudaMemcpyHostToDevice),
             "cudaMemcpy(host to device)");
}

}  // namespace flashcore::bridge
