#include "flashcore/cpp/src/bridge.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <string>

#include "check.h"
#include "flashcore/fmha.h"
#include "flashcore/src/cuda/ffi.rs.h"

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

void retain_pool_memory(int32_t ordinal) {
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaDeviceGetDefaultMemPool(&pool, ordinal), "cudaDeviceGetDefaultMemPool");
  uint64_t threshold = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
             "cudaMemPoolSetAttribute(ReleaseThreshold)");
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
  check_cuda(cudaMallocAsync(&p, bytes, as_stream(stream)), "cudaMallocAsync");
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

namespace {

FmhaArgs to_args(const FmhaCall& c) {
  FmhaArgs a{};
  a.dtype = c.dtype == 0 ? DType::F16 : DType::BF16;
  a.q = as_ptr(c.q);
  a.k = as_ptr(c.k);
  a.v = as_ptr(c.v);
  a.out = as_ptr(c.out);
  a.lse = static_cast<float*>(as_ptr(c.lse));
  a.batch = c.batch;
  a.seq_q = c.seq_q;
  a.seq_k = c.seq_k;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim = c.head_dim;
  for (int i = 0; i < 3; ++i) {
    a.q_stride[i] = c.q_stride[i];
    a.k_stride[i] = c.k_stride[i];
    a.v_stride[i] = c.v_stride[i];
    a.o_stride[i] = c.o_stride[i];
  }
  a.scale = c.scale;
  a.causal = static_cast<Causal>(c.causal);
  a.tile = Tile{c.tile_q, c.tile_k, c.tile_d};
  return a;
}

using Launcher = void (*)(const FmhaArgs&, cudaStream_t);

Launcher launcher(int32_t kernel) {
  switch (kernel) {
    case 0:
      return fmha_forward_sm80;
    case 1:
      return fmha_forward_wmma;
    default:
      throw Error(ErrorKind::NoKernel, "", "unknown kernel id " + std::to_string(kernel));
  }
}

}  // namespace

void fmha(const FmhaCall& c) {
  use_device(c.ordinal);
  launcher(c.kernel)(to_args(c), as_stream(c.stream));
}

double fmha_host_ns(const FmhaCall& c, int32_t iters) {
  use_device(c.ordinal);
  const FmhaArgs args = to_args(c);
  const Launcher launch = launcher(c.kernel);
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < iters; ++i) {
    launch(args, as_stream(c.stream));
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (iters > 0 ? iters : 1);
}

}  // namespace flashcore::bridge
