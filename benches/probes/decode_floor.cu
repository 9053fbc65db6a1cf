// Probe: the fastest a decode problem's K and V can be read in one kernel launch on this GPU,
// against which the split-KV decode rows of docs/PERFORMANCE.md are judged (issue 12).
//
// Times with CUDA events (5 warm-up calls, median of 50, inputs rotated over three copies, more
// than 3x a 60 MB L2): an empty launch; a read of `bytes` (16-byte loads, 4 in flight per
// thread, one to eight blocks per SM); the same read followed by a small launch (the combine's,
// which split-KV adds), plain or as a programmatic dependent launch; the read with the L2
// flushed before each call, as the bench times; and a device-to-device copy of the same bytes.
//
//   nvcc -O3 -arch=sm_90a -cudart static -o decode_floor benches/probes/decode_floor.cu
//   ./decode_floor [MiB]        # default: 128 MiB, the K and V of 32768 keys x 8 heads x 128 (bf16)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "check.h"
#include "timing.h"

__global__ void empty_kernel() {}

// The combine's stand-in behind programmatic dependent launch: waits for the grid before it.
__global__ void dependent_kernel(unsigned* sink) {
  cudaGridDependencySynchronize();
  if (threadIdx.x == 0) {
    sink[0] += 1;
  }
}

// Each thread reads 16-byte vectors, kInFlight loads issued before any is used; one xor per
// block is written so that the loads are not removed.
constexpr int kInFlight = 4;
__global__ void read_kernel(const uint4* __restrict__ src, size_t vectors, unsigned* sink,
                            bool trigger) {
  if (trigger) {
    cudaTriggerProgrammaticLaunchCompletion();  // dependents may start (they wait for the grid)
  }
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (kInFlight - 1) * stride < vectors; i += kInFlight * stride) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      v[u] = __ldg(src + i + u * stride);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
  }
  for (; i < vectors; i += stride) {
    const uint4 v = __ldg(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) {  // practically never: keeps the loads
    sink[blockIdx.x] = acc;
  }
}

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 128;
  const size_t bytes = mib << 20, vectors = bytes / 16;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kCopies = 3;
  std::vector<uint4*> src(kCopies);
  for (auto& p : src) {
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaMemset(p, 1, bytes));
  }
  uint4* dst = nullptr;
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMalloc(&sink, sizeof(unsigned) * 64 * sms));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  const float empty = median_us([&](int) { empty_kernel<<<sms, 128, 0, s>>>(); }, s);
  std::printf("%-44s %8.2f us\n", "empty launch", empty);
  auto report = [&](const char* what, float us) {
    std::printf("%-44s %8.2f us  %7.1f GB/s\n", what, us, bytes / (us * 1e-6) / 1e9);
  };
  for (int per_sm : {1, 2, 8}) {
    for (int threads : {512, 1024}) {
      char name[64];
      std::snprintf(name, sizeof name, "read, %d block(s)/SM x %d threads", per_sm, threads);
      report(name, median_us(
                       [&](int i) {
                         read_kernel<<<sms * per_sm, threads, 0, s>>>(src[i % kCopies], vectors,
                                                                     sink, false);
                       },
                       s));
    }
  }
  report("read (8/SM x 512) + a one-block launch",
         median_us(
             [&](int i) {
               read_kernel<<<sms * 8, 512, 0, s>>>(src[i % kCopies], vectors, sink, false);
               empty_kernel<<<1, 128, 0, s>>>();
             },
             s));
  // The same with the second launch programmatic (griddepcontrol), the read triggering at its
  // start or not at all.
  for (bool trigger : {false, true}) {
    report(trigger ? "read (8/SM x 512, trigger) + a PDL launch" : "read (8/SM x 512) + a PDL launch",
           median_us(
               [&](int i) {
                 read_kernel<<<sms * 8, 512, 0, s>>>(src[i % kCopies], vectors, sink, trigger);
                 cudaLaunchAttribute attr{};
                 attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                 attr.val.programmaticStreamSerializationAllowed = 1;
                 cudaLaunchConfig_t cfg{};
                 cfg.gridDim = dim3(8);
                 cfg.blockDim = dim3(128);
                 cfg.stream = s;
                 cfg.attrs = &attr;
                 cfg.numAttrs = 1;
                 CHECK(cudaLaunchKernelEx(&cfg, dependent_kernel, sink));
               },
               s));
  }
  // The bench's protocol: its L2 flush before each timed call (timing.h).
  const Flush flush(s);
  for (int threads : {512, 1024}) {
    char name[64];
    std::snprintf(name, sizeof name, "read, 1 block/SM x %d threads, flushed", threads);
    report(name, median_us(
                     [&](int) { read_kernel<<<sms, threads, 0, s>>>(src[0], vectors, sink, false); },
                     s, flush));
  }
  const float copy = median_us(
      [&](int i) { CHECK(cudaMemcpyAsync(dst, src[i % kCopies], bytes, cudaMemcpyDeviceToDevice, s)); },
      s);
  std::printf("%-44s %8.2f us  %7.1f GB/s (read + write)\n", "device-to-device copy", copy,
              2 * bytes / (copy * 1e-6) / 1e9);
  return 0;
}
