// The error of tanh.approx.f32 (fast_math.cuh's fast_tanh) against double tanh over 2^24 points
// of [-10, 10] (docs/HOPPER.md, round 10). Build here and run on the GPU host:
//   third_party/cuda/bin/nvcc -O3 -gencode=arch=compute_90,code=sm_90 -cudart static \
//     -Icpp/src benches/probes/tanh_error.cu -o dist/tanh-error
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>

#include "fast_math.cuh"

// Non-negative doubles order as their bit patterns, so atomicMax on the bits keeps the maximum.
__global__ void errors(unsigned long long* max_abs, unsigned long long* max_rel, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) {
    return;
  }
  const float x = -10.0f + 20.0f * (float(i) / float(n));
  const double want = tanh(double(x));
  const double abs_err = fabs(double(flashcore::fast_tanh(x)) - want);
  const double rel_err = want != 0.0 ? abs_err / fabs(want) : 0.0;
  atomicMax(max_abs, static_cast<unsigned long long>(__double_as_longlong(abs_err)));
  atomicMax(max_rel, static_cast<unsigned long long>(__double_as_longlong(rel_err)));
}

int main() {
  unsigned long long* d = nullptr;
  if (cudaMalloc(&d, 2 * sizeof(unsigned long long)) != cudaSuccess ||
      cudaMemset(d, 0, 2 * sizeof(unsigned long long)) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const int n = 1 << 24;
  errors<<<n / 256, 256>>>(d, d + 1, n);
  double h[2] = {0.0, 0.0};
  if (cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::fprintf(stderr, "kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  std::printf("tanh.approx.f32 on [-10, 10]: max abs error %.3e, max rel error %.3e (2^%.2f)\n",
              h[0], h[1], std::log2(h[1]));
  return 0;
}
