// The probes' timing, with CUDA events: median_us waits for each call (5 warm-up calls, the
// median of 50); do_bench_us times as the bench and triton's do_bench do.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "check.h"

// The bench's L2 flush (benches/common time_fn, as triton's do_bench): a 128 MiB device-to-device
// copy before each timed call, whose written lines stay dirty, so that their write-back competes
// with the timed reads. Its buffers live as long as the program.
struct Flush {
  static constexpr size_t kBytes = size_t{128} << 20;
  void* src = nullptr;
  void* dst = nullptr;
  cudaStream_t stream;
  explicit Flush(cudaStream_t s) : stream(s) {
    CHECK(cudaMalloc(&src, kBytes));
    CHECK(cudaMalloc(&dst, kBytes));
    CHECK(cudaMemset(src, 3, kBytes));
  }
  void operator()() const {
    CHECK(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream));
  }
};

// `before` (when given) runs ahead of each timed call, outside the events (an L2 flush, say).
inline float median_us(const std::function<void(int)>& call, cudaStream_t s,
                       const std::function<void()>& before = {}) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) {
    call(i);
  }
  std::vector<float> t;
  for (int i = 0; i < 50; ++i) {
    if (before) {
      before();
    }
    CHECK(cudaEventRecord(a, s));
    call(i);
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3f);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

// The bench's protocol (benches/common time_fn, as triton's do_bench times torch): calls back to
// back for at least 25 ms, then calls filling at least 100 ms, each after `flush`, all enqueued
// before any is read.
inline float do_bench_us(const std::function<void(int)>& call, cudaStream_t s,
                         const std::function<void()>& flush) {
  std::vector<cudaEvent_t> ev(2 * 2000);
  for (auto& e : ev) {
    CHECK(cudaEventCreate(&e));
  }
  int done = 0, chunk = 1;
  float spent = 0;
  while (done < 1 || spent < 25.0f) {
    CHECK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < chunk; ++i) {
      call(done++);
    }
    CHECK(cudaEventRecord(ev[1], s));
    CHECK(cudaEventSynchronize(ev[1]));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    spent += ms;
    chunk = std::min(chunk * 2, 4096);
  }
  const int timed = std::min(2000, std::max(50, int(std::ceil(100.0f / (spent / done)))));
  for (int i = 0; i < timed; ++i) {
    flush();
    CHECK(cudaEventRecord(ev[2 * i], s));
    call(done + i);
    CHECK(cudaEventRecord(ev[2 * i + 1], s));
  }
  std::vector<float> t(timed);
  for (int i = 0; i < timed; ++i) {
    CHECK(cudaEventSynchronize(ev[2 * i + 1]));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1e3f;
  }
  CHECK(cudaGetLastError());
  for (auto& e : ev) {
    CHECK(cudaEventDestroy(e));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
