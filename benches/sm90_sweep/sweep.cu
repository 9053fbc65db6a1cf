// The Hopper tile sweep: times every candidate of candidates.inc (built by scripts/sweep_sm90.sh,
// one translation unit each) on the bench list's shapes of its head-dim tier, bf16, BHSD, with
// CUDA events around each call (25 ms of back-to-back calls, or FLASHCORE_BENCH_WARM_MS as the
// bench CLI reads it, then the median of at least ITERS calls filling 100 ms, as triton's do_bench
// and the bench CLI take them: the SM clock falls under the power cap after some tens of ms),
// inputs rotated over enough copies to exceed 3x the L2, random normal data. Each candidate's
// output is compared with the first candidate's on the same inputs (a wrong candidate must not
// win on speed). Prints one table.
//
// Usage: sm90-sweep [ITERS [SHAPE [flush] [trace]]]: SHAPE times only the shape of that name
// (e.g. 2x16x8192x128-causal); `flush` clears the L2 before each timed call by writing a 256 MiB
// buffer, as triton's do_bench does; `trace` prints every call's time and the SM clock (MHz, from
// the clock counter over the global timer) after each row. The timed calls (and their flushes)
// are enqueued back to back, each between its own two events, and read once all have run, as
// do_bench enqueues them: under the power cap, a protocol that waits for each call lets the GPU
// idle between calls and can favour another kernel (docs/HOPPER.md, round 37). Only `trace`
// waits for each call, to read the clock after it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cutlass/bfloat16.h"
#include "launcher.h"

using flashcore::FmhaArgs;
using Launch = void (*)(const FmhaArgs&, cudaStream_t);

#define CANDIDATE(Q, K, D, P) \
  void sweep_q##Q##_k##K##_d##D##_##P(const FmhaArgs&, cudaStream_t);
#include "candidates.inc"
#undef CANDIDATE

namespace {

struct Candidate {
  int q, k, d, flags;
  Launch run;
};

// kernel.cuh's ScheduleFlags in words.
std::string schedule(int flags) {
  std::string s = flags & 1 ? "persistent" : "one unit per block";
  if (flags & 4) s += ", free epilogue";
  s += flags & 8 ? ", overlapped" : ", serial";
  if (flags & 32) s += ", lazy rescale";
  if (flags & 64) s += ", issue turns";
  if (flags & 2048) s += ", last wave in pieces";
  return s;
}

const Candidate kCandidates[] = {
#define CANDIDATE(Q, K, D, P) {Q, K, D, P, sweep_q##Q##_k##K##_d##D##_##P},
#include "candidates.inc"
#undef CANDIDATE
};

struct Shape {
  int b, h, hk, s, d;
  bool causal;
};

// The bench list's throughput, GQA and seed shapes (benches/common/mod.rs).
const Shape kShapes[] = {
    {1, 8, 8, 512, 64, false},     {4, 8, 8, 256, 64, false},     {1, 8, 8, 1024, 64, false},
    {8, 32, 32, 2048, 64, false},  {8, 32, 32, 2048, 64, true},   {2, 32, 32, 8192, 64, false},
    {2, 32, 32, 8192, 64, true},   {8, 16, 16, 2048, 128, false}, {8, 16, 16, 2048, 128, true},
    {2, 16, 16, 8192, 128, false}, {2, 16, 16, 8192, 128, true},  {4, 32, 8, 4096, 128, true},
    {4, 8, 8, 4096, 256, false},   {4, 8, 8, 4096, 256, true},
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Standard normal values from a per-element hash (Box-Muller), never zeros.
__global__ void fill_normal(cutlass::bfloat16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed, y = uint32_t(i >> 32) + seed * 40503u + 1u;
    x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
    y ^= y >> 16, y *= 0x7feb352du, y ^= y >> 15, y *= 0x846ca68bu, y ^= y >> 16;
    const float u1 = (x >> 8) * (1.0f / 16777216.0f) + 1e-7f, u2 = (y >> 8) * (1.0f / 16777216.0f);
    p[i] = cutlass::bfloat16_t(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

__global__ void max_abs_diff(const cutlass::bfloat16_t* a, const cutlass::bfloat16_t* b, size_t n,
                             float* out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float d = fabsf(float(a[i]) - float(b[i]));
    m = d != d ? INFINITY : fmaxf(m, d);
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));  // non-negative floats order as ints
}

struct Buffers {
  std::vector<cutlass::bfloat16_t*> q, k, v;
  cutlass::bfloat16_t *out = nullptr, *first = nullptr;
};

}  // namespace

// The timing protocol of benches/common/mod.rs (warm_ms(), TIMED_MS, MAX_TIMED): do_bench's.
constexpr float kTimedMs = 100.f;
constexpr int kMaxTimed = 2000;

// The warm-up before each row's timed calls (ms): 25, do_bench's, unless FLASHCORE_BENCH_WARM_MS
// gives another, as for the bench CLI and torch_sdpa.py (scoreboard.sh and run.sh set 1000: the
// clock the GPU holds under its power cap). Exits on a value that is not a number of milliseconds.
float bench_warm_ms() {
  const char* v = std::getenv("FLASHCORE_BENCH_WARM_MS");
  if (v == nullptr) {
    return 25.f;
  }
  char* end = nullptr;
  const float ms = std::strtof(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(ms) || ms < 0.f) {
    std::fprintf(stderr, "FLASHCORE_BENCH_WARM_MS=%s: not milliseconds\n", v);
    std::exit(2);
  }
  return ms;
}

// The SM clock in kHz over one launch: clock cycles of a spin of about 20 us over global-timer
// nanoseconds.
__global__ void sm_clock(unsigned long long* khz) {
  unsigned long long t0 = 0, t1 = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < 20000);
  const long long c1 = clock64();
  *khz = (unsigned long long)(c1 - c0) * 1000000ull / (t1 - t0);
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 30;
  const std::string only = argc > 2 ? argv[2] : "";
  const float warm_ms = bench_warm_ms();
  bool flush = false, trace = false;
  for (int i = 3; i < argc; ++i) {
    flush = flush || std::string(argv[i]) == "flush";
    trace = trace || std::string(argv[i]) == "trace";
  }
  void* scrub = nullptr;  // `flush`: the L2-clearing buffer
  constexpr size_t kScrubBytes = size_t(256) << 20;
  if (flush) {
    check(cudaMalloc(&scrub, kScrubBytes), "malloc");
  }
  unsigned long long* khz = nullptr;
  check(cudaMalloc(&khz, sizeof *khz), "malloc");
  int l2 = 0;
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), "L2 size");
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "stream");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  std::vector<cudaEvent_t> starts(kMaxTimed), ends(kMaxTimed);  // one pair per timed call
  for (int i = 0; i < kMaxTimed; ++i) {
    check(cudaEventCreate(&starts[size_t(i)]), "event");
    check(cudaEventCreate(&ends[size_t(i)]), "event");
  }
  float* diff = nullptr;
  check(cudaMalloc(&diff, sizeof(float)), "malloc");
  float* slopes = nullptr;  // ALiBi: the paper's slopes for each shape's heads
  check(cudaMalloc(&slopes, 64 * sizeof(float)), "malloc");

  std::printf("| shape (BxHxSxD) | candidate (q x k x d, schedule) | median us | TFLOP/s | max |diff| vs first |\n");
  std::printf("|---|---|---:|---:|---:|\n");
  for (const Shape& sh : kShapes) {
    char name[64];
    std::snprintf(name, sizeof name, "%dx%s%dx%dx%d%s", sh.b,
                  sh.hk == sh.h ? "" : (std::to_string(sh.h) + "kv").c_str(),
                  sh.hk == sh.h ? sh.h : sh.hk, sh.s, sh.d, sh.causal ? "-causal" : "");
    if (!only.empty() && only != name) {
      continue;
    }
    const size_t nq = size_t(sh.b) * sh.h * sh.s * sh.d, nk = size_t(sh.b) * sh.hk * sh.s * sh.d;
    const size_t bytes = 2 * (2 * nq + 2 * nk);
    const int sets = int(std::clamp<size_t>((3 * size_t(l2) + bytes - 1) / bytes, 1, 16));
    Buffers buf;
    uint32_t seed = 1;
    for (int i = 0; i < sets; ++i) {
      for (auto* list : {&buf.q, &buf.k, &buf.v}) {
        const size_t n = list == &buf.q ? nq : nk;
        cutlass::bfloat16_t* p = nullptr;
        check(cudaMalloc(&p, n * 2), "malloc");
        fill_normal<<<1024, 256, 0, stream>>>(p, n, seed++);
        list->push_back(p);
      }
    }
    check(cudaMalloc(&buf.out, nq * 2), "malloc");
    check(cudaMalloc(&buf.first, nq * 2), "malloc");
    const double flops = 4.0 * sh.b * sh.h * double(sh.s) * sh.s * sh.d * (sh.causal ? 0.5 : 1.0);
    const int tier = sh.d <= 64 ? 64 : sh.d <= 128 ? 128 : 256;
    std::vector<float> host_slopes(size_t(sh.h));
    for (int h = 0; h < sh.h; ++h) {
      host_slopes[size_t(h)] = std::exp2(-8.0f * float(h + 1) / float(sh.h));
    }
    check(cudaMemcpy(slopes, host_slopes.data(), host_slopes.size() * sizeof(float),
                     cudaMemcpyHostToDevice),
          "slopes");
    bool have_first = false;
    // A candidate with the modifier flag (256) runs three times: without a modifier, with a
    // softcap of 30, with ALiBi.
    for (const Candidate& c : kCandidates) {
      for (int mode = 0; mode < (c.flags & 256 ? 3 : 1); ++mode) {
        const bool softcap = (c.flags & 256) && mode == 1, alibi = (c.flags & 256) && mode == 2;
        const std::string sched =
            schedule(c.flags) + (softcap ? ", softcap 30" : alibi ? ", ALiBi" : "");
        if (c.d != tier) {
          continue;
        }
        auto args_for = [&](int set) {
          FmhaArgs a{};
          a.dtype = flashcore::DType::BF16;
          a.q = buf.q[set], a.k = buf.k[set], a.v = buf.v[set], a.out = buf.out, a.lse = nullptr;
          a.batch = sh.b, a.seq_q = sh.s, a.seq_k = sh.s, a.heads_q = sh.h, a.heads_kv = sh.hk;
          a.head_dim = sh.d;
          const int64_t qs[3] = {int64_t(sh.h) * sh.s * sh.d, sh.d, int64_t(sh.s) * sh.d};
          const int64_t ks[3] = {int64_t(sh.hk) * sh.s * sh.d, sh.d, int64_t(sh.s) * sh.d};
          for (int i = 0; i < 3; ++i) {
            a.q_stride[i] = a.o_stride[i] = qs[i];
            a.k_stride[i] = a.v_stride[i] = ks[i];
          }
          a.scale = 1.0f / std::sqrt(float(sh.d));
          a.causal = sh.causal ? flashcore::Causal::BottomRight : flashcore::Causal::None;
          a.softcap = softcap ? 30.0f : 0.0f;
          a.alibi_slopes = alibi ? slopes : nullptr;
          a.tile = flashcore::Tile{c.q, c.k, c.d};
          return a;
        };
        std::vector<float> ms;
        std::vector<unsigned long long> clocks;
        try {
          // Warm-up and timed stretch as triton's do_bench and the bench CLI take them: warm_ms
          // of back-to-back calls, then at least ITERS timed calls and enough to fill kTimedMs.
          float warm = 0;
          int done = 0;
          for (int chunk = 5; warm < warm_ms; chunk = std::min(2 * chunk, 4096)) {
            check(cudaEventRecord(e0, stream), "record");
            for (int i = 0; i < chunk; ++i, ++done) {
              c.run(args_for(done % sets), stream);
            }
            check(cudaEventRecord(e1, stream), "record");
            check(cudaEventSynchronize(e1), "sync");
            float t = 0;
            check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
            warm += t;
          }
          const int timed = std::min(
              kMaxTimed,
              std::max(iters, int(std::ceil(kTimedMs / (warm / float(done))))));
          for (int i = 0; i < timed; ++i) {
            if (flush) {
              check(cudaMemsetAsync(scrub, 0, kScrubBytes, stream), "flush");
            }
            check(cudaEventRecord(starts[size_t(i)], stream), "record");
            c.run(args_for(i % sets), stream);
            check(cudaEventRecord(ends[size_t(i)], stream), "record");
            if (trace) {
              sm_clock<<<1, 1, 0, stream>>>(khz);
              unsigned long long k = 0;
              check(cudaMemcpyAsync(&k, khz, sizeof k, cudaMemcpyDeviceToHost, stream), "clock");
              check(cudaStreamSynchronize(stream), "clock");
              clocks.push_back(k);
            }
          }
          check(cudaStreamSynchronize(stream), "timed calls");
          for (int i = 0; i < timed; ++i) {
            float t = 0;
            check(cudaEventElapsedTime(&t, starts[size_t(i)], ends[size_t(i)]), "elapsed");
            ms.push_back(t);
          }
          c.run(args_for(0), stream);
        } catch (const std::exception& e) {
          std::printf("| %s | %dx%dx%d %s | failed: %s | | |\n", name, c.q, c.k, c.d,
                      sched.c_str(), e.what());
          continue;
        }
        check(cudaStreamSynchronize(stream), "run");
        float d = 0;
        if (!have_first) {
          check(cudaMemcpy(buf.first, buf.out, nq * 2, cudaMemcpyDeviceToDevice), "copy");
          have_first = true;
        } else {
          check(cudaMemset(diff, 0, sizeof(float)), "memset");
          max_abs_diff<<<1024, 256, 0, stream>>>(buf.out, buf.first, nq, diff);
          check(cudaMemcpy(&d, diff, sizeof(float), cudaMemcpyDeviceToHost), "diff");
        }
        if (trace) {
          std::string line = "trace us (SM MHz):";
          for (size_t i = 0; i < ms.size(); ++i) {
            char item[48];
            std::snprintf(item, sizeof item, " %.1f (%llu)", ms[i] * 1e3, clocks[i] / 1000);
            line += item;
          }
          std::printf("%s\n", line.c_str());
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2] * 1e3;
        std::printf("| %s | %dx%dx%d %s | %.1f | %.1f | %.3g |\n", name, c.q, c.k, c.d,
                    sched.c_str(), med, flops / med * 1e-6, double(d));
        std::fflush(stdout);
      }
    }
    for (auto* list : {&buf.q, &buf.k, &buf.v}) {
      for (auto* p : *list) {
        cudaFree(p);
      }
    }
    cudaFree(buf.out);
    cudaFree(buf.first);
  }
  return 0;
}
