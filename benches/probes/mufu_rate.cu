// Probe: how many exponentials and tanhs an SM computes per clock (the multi-function unit that
// a softcap's tanh shares with the softmax's exp2: docs/HOPPER.md, round 33). Each thread runs 8
// independent chains of one instruction for `kSteps` steps; the rate is the instructions' count
// over the launch's SM clocks (clock64 of each block, whole blocks resident: 8 per SM). An f16x2
// instruction computes two values.
//
//   third_party/cuda/bin/nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -cudart static \
//     benches/probes/mufu_rate.cu -o dist/mufu-rate
//   dist/mufu-rate
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "check.h"

constexpr int kChains = 8, kSteps = 4096, kThreads = 256, kBlocksPerSm = 8;

enum Op { kEx2, kTanh, kTanhF16x2, kEx2F16x2 };

template <int kOp>
__device__ __forceinline__ float step(float x) {
  float y;
  if constexpr (kOp == kEx2) {
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  } else if constexpr (kOp == kTanh) {
    asm volatile("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  } else if constexpr (kOp == kTanhF16x2) {
    unsigned in = __float_as_uint(x), out;
    asm volatile("tanh.approx.f16x2 %0, %1;" : "=r"(out) : "r"(in));
    y = __uint_as_float(out);
  } else {
    unsigned in = __float_as_uint(x), out;
    asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(out) : "r"(in));
    y = __uint_as_float(out);
  }
  return y;
}

// Keeps the chains' values bounded (a tanh's or an exponential's output fed back stays finite),
// and writes them so the compiler keeps every step.
template <int kOp>
__global__ void __launch_bounds__(kThreads) run(float* sink, long long* cycles) {
  float v[kChains];
  for (int c = 0; c < kChains; ++c) {
    v[c] = 0.001f * float(threadIdx.x + c);
  }
  __syncthreads();
  const long long start = clock64();
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      v[c] = step<kOp>(v[c]);
    }
  }
  __syncthreads();
  const long long stop = clock64();
  float sum = 0.f;
  for (int c = 0; c < kChains; ++c) {
    sum += v[c];
  }
  sink[blockIdx.x * kThreads + threadIdx.x] = sum;
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = stop - start;
  }
}

template <int kOp>
void measure(const char* name, int sms, float* sink, long long* cycles) {
  const int blocks = sms * kBlocksPerSm;
  run<kOp><<<blocks, kThreads>>>(sink, cycles);  // warm-up
  CHECK(cudaGetLastError());
  run<kOp><<<blocks, kThreads>>>(sink, cycles);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  long long* host = static_cast<long long*>(std::malloc(sizeof(long long) * blocks));
  CHECK(cudaMemcpy(host, cycles, sizeof(long long) * blocks, cudaMemcpyDeviceToHost));
  long long most = 0;
  for (int b = 0; b < blocks; ++b) {
    most = host[b] > most ? host[b] : most;
  }
  std::free(host);
  // The blocks of one SM run together, so the slowest block's clocks bound the SM's time.
  const double per_sm = double(kBlocksPerSm) * kThreads * kChains * kSteps;
  std::printf("%-18s %7.2f instructions per clock per SM (%lld clocks)\n", name,
              per_sm / double(most), most);
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* sink = nullptr;
  long long* cycles = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(float) * sms * kBlocksPerSm * kThreads));
  CHECK(cudaMalloc(&cycles, sizeof(long long) * sms * kBlocksPerSm));
  measure<kEx2>("ex2.approx.f32", sms, sink, cycles);
  measure<kTanh>("tanh.approx.f32", sms, sink, cycles);
  measure<kTanhF16x2>("tanh.approx.f16x2", sms, sink, cycles);
  measure<kEx2F16x2>("ex2.approx.f16x2", sms, sink, cycles);
  return 0;
}
