// Probe: how fast a decode's K and V stream into shared memory, by the copy mechanism, the TMA
// descriptors' L2 promotion and the blocks per SM, with nothing else in the kernel: the floor of
// the decode rows (issue 12; docs/PERFORMANCE.md, "A decode's K and V read alone").
//
// The pattern is the Hopper kernel's decode: work units of `tiles` K tiles and as many V tiles
// (128 keys x 128 dims, bf16: 32 KB each, read K, V, K, V, ...), walked by blocks with a stride
// of the grid; K and V in BHSD order, so a unit's keys are contiguous rows of 256 bytes. Each
// block's copies land in a ring of `stages` 32 KB buffers that its consumers release once they
// have read one word of each. The mechanisms:
//   boxes64   two TMA boxes of 64 columns x 128 rows, 128-byte swizzle (the Hopper kernel's)
//   box128    one TMA box of 128 columns x 128 rows, no swizzle
//   bulk      one 1D bulk copy of the tile's 32 contiguous KB
//   cp.async  every thread 16-byte cp.async copies, a commit group per tile (cuDNN's sm80 way)
// TMA descriptors with 128- or 256-byte L2 promotion or none. Each TMA and cp.async copy carries
// an L2 cache hint: evict-normal (CuTe's default), or evict-first in the variants that say so
// (docs/HOPPER.md, round 53). And the parameters' size: every launch of the Hopper kernel
// carries about 3.6 KB of them, the probe's about 300 bytes; a padded variant carries more, its
// copies waiting for a word at their end. And consumers that hold each tile for a number of clocks
// before releasing it (spinning on clock64), as a kernel's products do: the cost of a decode
// kernel's time per tile (docs/HOPPER.md, round 55). Times with CUDA events (5
// warm-up calls, median of 50): back to back with the inputs rotated over three copies; after a
// 128 MiB device-to-device copy, as the bench flushes the L2 (its dirty lines are written back
// while the read runs), waiting for each call; and under the bench's whole protocol
// (do_bench_us).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cudart static -o tma_read \
//        benches/probes/tma_read.cu
//   ./tma_read [SUBSTRING]   (only the variants whose names contain it)
//   ./tma_read --trace       (per-block times of the read: traced_read, round 57)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "timing.h"

constexpr int kTileKeys = 128;
constexpr int kRowBytes = 256;  // 128 dims x 2 bytes
constexpr int kTileBytes = kTileKeys * kRowBytes;
constexpr int kConsumerWarps = 4;

enum Copy { kBoxes64, kBox128, kBulk };

__device__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count));
}
__device__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)),
               "r"(bytes)
               : "memory");
}
__device__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
__device__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT;\n}\n" ::"r"(smem_addr(b)),
      "r"(parity)
      : "memory");
}
// The L2 eviction policies of a copy's cache hint (CUTLASS's CacheHintSm90 values).
constexpr uint64_t kEvictNormal = 0x1000000000000000ull, kEvictFirst = 0x12F0000000000000ull;

__device__ void tma_2d(void* dst, const CUtensorMap* map, int col, int row, uint64_t* bar,
                       uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
__device__ void bulk_1d(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Tile i of unit u (K on even i, V on odd): its first key row, and its tensor's map.
__device__ int tile_row(int u, int i, int tiles) { return (u * tiles + i / 2) * kTileKeys; }
__device__ const CUtensorMap* tile_map(int i, const CUtensorMap& k_map, const CUtensorMap& v_map) {
  return (i & 1) ? &v_map : &k_map;
}

// A block's ring of `stages` 32 KB tile buffers in dynamic shared memory, each with a full
// barrier (the producer's copies) and an empty one (`consumers` warps' releases), and a position
// in it that the producer and the consumers advance alike.
struct Ring {
  char* smem;
  int stages;
  uint64_t* full;
  uint64_t* empty;
  int s = 0;
  uint32_t phase = 0;

  // Called by every thread; thread 0 initialises the barriers, and the block syncs.
  __device__ Ring(char* smem_, int stages_, int consumers)
      : smem(smem_),
        stages(stages_),
        full(reinterpret_cast<uint64_t*>(smem_ + size_t(stages_) * kTileBytes)),
        empty(full + stages_) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < stages; ++i) {
        mbar_init(&full[i], 1);
        mbar_init(&empty[i], consumers);
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }
  __device__ char* buf() const { return smem + size_t(s) * kTileBytes; }
  // The producer's lane: waits for the stage to be free and expects a tile's bytes on it.
  __device__ void acquire() {
    mbar_wait(&empty[s], phase ^ 1);
    mbar_expect_tx(&full[s], kTileBytes);
  }
  // A consumer warp: waits for the stage's tile, reads one word of it per thread (at `word`),
  // spins `delay` clocks (its work on the tile), and releases it; returns the word.
  __device__ unsigned consume(int word, int delay = 0) {
    mbar_wait(&full[s], phase);
    const unsigned w = reinterpret_cast<const unsigned*>(buf())[word];
    if (delay > 0) {
      const long long until = clock64() + delay;
      while (clock64() < until) {
      }
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
      mbar_arrive(&empty[s]);
    }
    return w;
  }
  __device__ void next() {
    if (++s == stages) {
      s = 0;
      phase ^= 1;
    }
  }
};

// The tile of `map` from key row `row` into the ring's stage as two 64-column boxes (the Hopper
// kernel's copies).
__device__ void two_boxes(Ring& ring, const CUtensorMap* map, int row, uint64_t policy) {
  tma_2d(ring.buf(), map, 0, row, &ring.full[ring.s], policy);
  tma_2d(ring.buf() + kTileBytes / 2, map, 64, row, &ring.full[ring.s], policy);
}

// Parameter bytes that a launch carries beside the probe's own (0: none).
template <int kBytes>
struct Pad {
  int words[kBytes / 4];
};
template <>
struct Pad<0> {};

// One producer warp (lane 0 issues the copies) and kConsumerWarps consumer warps. With kPad
// bytes of padding, each copy's row adds the padding's last word (0), so the copies wait for it.
template <Copy kCopy, int kPad = 0, uint64_t kPolicy = kEvictNormal>
__global__ void __launch_bounds__(32 * (kConsumerWarps + 1))
    tma_read(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
             const char* k, const char* v, int units, int tiles, int stages, unsigned* sink,
             int delay, const __grid_constant__ Pad<kPad> pad) {
  extern __shared__ __align__(1024) char smem[];
  Ring ring(smem, stages, kConsumerWarps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned acc = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    for (int i = 0; i < 2 * tiles; ++i, ring.next()) {
      if (warp != kConsumerWarps) {
        acc ^= ring.consume(threadIdx.x * 16, delay);
      } else if (lane == 0) {
        ring.acquire();
        int row = tile_row(u, i, tiles);
        if constexpr (kPad > 0) {
          row += pad.words[kPad / 4 - 1];  // 0, read from the padding's last line
        }
        if (kCopy == kBoxes64) {
          two_boxes(ring, tile_map(i, k_map, v_map), row, kPolicy);
        } else if (kCopy == kBox128) {
          tma_2d(ring.buf(), tile_map(i, k_map, v_map), 0, row, &ring.full[ring.s], kPolicy);
        } else {
          bulk_1d(ring.buf(), ((i & 1) ? v : k) + size_t(row) * kRowBytes, kTileBytes,
                  &ring.full[ring.s]);
        }
      }
    }
  }
  if (acc == 0x9e3779b9u) {  // practically never: keeps the reads
    sink[blockIdx.x] = acc;
  }
}

// The read in the Hopper decode kernel's shape (docs/HOPPER.md, round 56): 384 threads, a
// producer warpgroup whose warp 0 issues the copies (lane 0) and two consumer warpgroups whose 8
// warps wait for and release every stage; with kRegs, the kernel's register split (setmaxnreg:
// 24 for the producer warpgroup, 240 for the consumers). The launch's shared memory may exceed
// the stages' (the kernel's Q tiles and staging).
template <bool kRegs>
__global__ void __launch_bounds__(384, 1)
    shaped_read(const __grid_constant__ CUtensorMap k_map,
                const __grid_constant__ CUtensorMap v_map, int units, int tiles, int stages,
                unsigned* sink) {
  extern __shared__ __align__(1024) char smem[];
  Ring ring(smem, stages, 8);  // the two consumer warpgroups' warps
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool producer = warp < 4;
  if constexpr (kRegs) {
    if (producer) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    }
  }
  if (producer && warp > 0) {
    return;
  }
  unsigned acc = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    for (int i = 0; i < 2 * tiles; ++i, ring.next()) {
      if (!producer) {
        acc ^= ring.consume((threadIdx.x % 128) * 16);
      } else if (lane == 0) {
        ring.acquire();
        two_boxes(ring, tile_map(i, k_map, v_map), tile_row(u, i, tiles), kEvictNormal);
      }
    }
  }
  if (acc == 0x9e3779b9u) {  // practically never: keeps the reads
    sink[blockIdx.x] = acc;
  }
}

constexpr int kTracedStages = 5;  // the traced read's ring

// The probe's read (two boxes, five stages, one block per SM) with globaltimer stamps per block, as
// docs/HOPPER.md round 39 traced the decode kernel (round 57): [0] the block's start, [1] its first
// copy issued, [2] its last copy issued, [3] its last tile landed (consumer warp 0), [4] its end.
__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__global__ void __launch_bounds__(32 * (kConsumerWarps + 1))
    traced_read(const __grid_constant__ CUtensorMap k_map,
                const __grid_constant__ CUtensorMap v_map, int units, int tiles,
                uint64_t* trace) {
  const uint64_t start = now_ns();
  extern __shared__ __align__(1024) char smem[];
  Ring ring(smem, kTracedStages, kConsumerWarps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* mine = trace + 5 * blockIdx.x;
  unsigned acc = 0;
  bool first = true;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    for (int i = 0; i < 2 * tiles; ++i, ring.next()) {
      if (warp != kConsumerWarps) {
        acc ^= ring.consume(threadIdx.x * 16);
        if (threadIdx.x == 0) {
          mine[3] = now_ns();  // after its release: the tile landed just before
        }
      } else if (lane == 0) {
        ring.acquire();
        const uint64_t t = now_ns();
        if (first) {
          mine[1] = t;
          first = false;
        }
        mine[2] = t;
        two_boxes(ring, tile_map(i, k_map, v_map), tile_row(u, i, tiles), kEvictNormal);
      }
    }
  }
  if (threadIdx.x == 0) {
    mine[0] = start;
    mine[4] = now_ns() + (acc == 0x9e3779b9u);  // keeps the reads
  }
}

// cuDNN's sm80 way: 128 threads, every thread copying 16-byte chunks with cp.async, one commit
// group per tile, `kStages` tiles in flight.
template <int kStages, uint64_t kPolicy = kEvictNormal>
__global__ void __launch_bounds__(128)
    cp_async_read(const char* k, const char* v, int units, int tiles, unsigned* sink) {
  extern __shared__ __align__(1024) char smem[];
  const int mine = (units - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  const int total = mine * 2 * tiles;
  auto issue = [&](int n) {
    if (n < total) {
      const int u = blockIdx.x + (n / (2 * tiles)) * gridDim.x, i = n % (2 * tiles);
      const char* src = ((i & 1) ? v : k) + size_t(tile_row(u, i, tiles)) * kRowBytes;
      const uint32_t dst = smem_addr(smem + (n % kStages) * kTileBytes);
      for (int c = threadIdx.x; c < kTileBytes / 16; c += blockDim.x) {
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(
                         dst + c * 16),
                     "l"(src + c * 16), "l"(kPolicy)
                     : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  for (int n = 0; n < kStages - 1; ++n) {
    issue(n);
  }
  unsigned acc = 0;
  for (int n = 0; n < total; ++n) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    acc ^= reinterpret_cast<const unsigned*>(smem + (n % kStages) * kTileBytes)[threadIdx.x * 16];
    issue(n + kStages - 1);
  }
  if (acc == 0x9e3779b9u) {
    sink[blockIdx.x] = acc;
  }
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult got{};
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &got));
  if (got != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// A 2D map over `rows` key rows of 128 bf16 columns.
static CUtensorMap make_map(const void* base, uint64_t rows, Copy copy,
                            CUtensorMapL2promotion promotion) {
  static const auto encode = encode_fn();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {128, rows};
  const cuuint64_t strides[1] = {kRowBytes};
  const cuuint32_t box[2] = {copy == kBox128 ? 128u : 64u, kTileKeys};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base),
                            dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            copy == kBox128 ? CU_TENSOR_MAP_SWIZZLE_NONE
                                            : CU_TENSOR_MAP_SWIZZLE_128B,
                            promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return map;
}

struct Shape {
  const char* name;
  int units, tiles;
};

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row as it is measured
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, sms);
  // Units of the Hopper kernel's decode rows (bf16, 8 kv heads, d = 128).
  const Shape shapes[] = {
      {"64 x 2048 keys (512 units of 16 tile pairs)", 64 * 8, 16},
      {"16 x 8192 keys (128 units of 64)", 16 * 8, 64},
      {"1 x 32768 keys, 16 splits (128 units of 16)", 8 * 16, 16},
  };
  size_t most = 0;
  for (const Shape& sh : shapes) {
    most = std::max(most, size_t(sh.units) * sh.tiles * kTileBytes);
  }
  constexpr int kCopies = 3;
  std::vector<char*> k(kCopies), v(kCopies);
  for (int c = 0; c < kCopies; ++c) {
    CHECK(cudaMalloc(&k[c], most));
    CHECK(cudaMalloc(&v[c], most));
    CHECK(cudaMemset(k[c], 1, most));
    CHECK(cudaMemset(v[c], 2, most));
  }
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(unsigned) * 64 * sms));
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  const Flush flush(st);
  // The copy bandwidth as torch_sdpa.py measures the roofline's (read + write of 1 GiB here).
  {
    const size_t bytes = size_t{1} << 30;
    char *a = nullptr, *b = nullptr;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    const float us = median_us(
        [&](int) { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st)); }, st);
    std::printf("device-to-device copy of 1 GiB: %.1f us, %.1f GB/s (read + write)\n", us,
                2 * bytes / (us * 1e-6) / 1e9);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
  }

  // A variant launches shape `shape` (an index into `shapes`) on input copy `copy`.
  struct Variant {
    std::string name;
    std::function<void(int shape, int copy)> launch;
  };
  std::vector<Variant> variants;
  // Blocks per SM of a persistent grid, or 0: a block per unit.
  constexpr int kBlockPerUnit = 0;
  auto blocks = [](int per_sm) {
    return per_sm == kBlockPerUnit ? std::string("a block per unit")
                                   : std::to_string(per_sm) + " block(s)/SM";
  };
  auto grid = [&](const Shape& sh, int per_sm) {
    return per_sm == kBlockPerUnit ? sh.units : std::min(sh.units, per_sm * sms);
  };
  // The K and V descriptors of every shape and input copy (shape * kCopies + copy), built up
  // front so that no host work is timed.
  auto maps_for = [&](Copy copy, CUtensorMapL2promotion promo) {
    auto maps = std::make_shared<std::vector<std::pair<CUtensorMap, CUtensorMap>>>();
    for (const Shape& sh : shapes) {
      const uint64_t rows = uint64_t(sh.units) * sh.tiles * kTileKeys;
      for (int c = 0; c < kCopies; ++c) {
        maps->push_back({make_map(k[c], rows, copy, promo), make_map(v[c], rows, copy, promo)});
      }
    }
    return maps;
  };
  // pad_c: a std::integral_constant, the bytes of padding (Pad) its launches carry.
  // first: the copies' cache hint is evict-first (else evict-normal, as CuTe's TMA copies).
  auto tma_padded = [&](Copy copy, CUtensorMapL2promotion promo, int per_sm, int stages,
                        auto pad_c, bool first = false, int delay = 0) {
    constexpr int kPad = decltype(pad_c)::value;
    const char* cname = copy == kBoxes64 ? "boxes64" : copy == kBox128 ? "box128" : "bulk";
    const char* promo_name = copy == kBulk                                 ? "   -"
                             : promo == CU_TENSOR_MAP_L2_PROMOTION_L2_256B ? " 256"
                             : promo == CU_TENSOR_MAP_L2_PROMOTION_L2_128B ? " 128"
                                                                           : "none";
    char name[128];
    std::snprintf(name, sizeof name, "%-8s L2 %s, %s, %d stages%s%s%s", cname, promo_name,
                  blocks(per_sm).c_str(), stages,
                  kPad == 0 ? "" : (", +" + std::to_string(kPad) + " B params").c_str(),
                  first ? ", evict-first" : "",
                  delay == 0 ? "" : (", " + std::to_string(delay) + " clk/tile").c_str());
    const int smem = stages * kTileBytes + 2 * stages * 8;
    auto kernel = copy == kBoxes64 ? (first ? tma_read<kBoxes64, kPad, kEvictFirst>
                                            : tma_read<kBoxes64, kPad>)
                  : copy == kBox128 ? tma_read<kBox128, kPad>
                                    : tma_read<kBulk, kPad>;
    // The cap, not this variant's size: variants of one kernel share the attribute.
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(prop.sharedMemPerBlockOptin)));
    auto maps = maps_for(copy, promo);
    variants.push_back({name, [=, &k, &v, &st, &shapes](int shape, int c) {
      const Shape& sh = shapes[shape];
      const auto& m = (*maps)[shape * kCopies + c];
      kernel<<<grid(sh, per_sm), 32 * (kConsumerWarps + 1), smem, st>>>(
          m.first, m.second, k[c], v[c], sh.units, sh.tiles, stages, sink, delay, Pad<kPad>{});
    }});
  };
  auto tma = [&](Copy copy, CUtensorMapL2promotion promo, int per_sm, int stages) {
    tma_padded(copy, promo, per_sm, stages, std::integral_constant<int, 0>{});
  };
  const auto p256 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B, p128 = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  tma(kBoxes64, p128, 1, 5);  // the Hopper kernel's (CuTe's promotion)
  tma_padded(kBoxes64, p128, 1, 5, std::integral_constant<int, 0>{}, true);
  // With 1 KB more parameters, and with as many as the Hopper kernel's.
  tma_padded(kBoxes64, p128, 1, 5, std::integral_constant<int, 1024>{});
  tma_padded(kBoxes64, p128, 1, 5, std::integral_constant<int, 3328>{});
  // The consumers holding each tile for a while before releasing it, as a kernel's products do.
  for (int delay : {250, 500, 750, 1000, 1500, 2000}) {
    tma_padded(kBoxes64, p128, 1, 5, std::integral_constant<int, 0>{}, false, delay);
  }
  tma(kBoxes64, p256, 1, 5);  // session 41's promotion (reverted: slower on the H200)
  tma(kBoxes64, CU_TENSOR_MAP_L2_PROMOTION_NONE, 1, 5);
  for (int stages : {2, 3, 4, 6}) {
    tma(kBoxes64, p128, 1, stages);
  }
  tma(kBoxes64, p128, 2, 3);
  tma(kBoxes64, p128, 2, 2);
  tma(kBoxes64, p128, 3, 2);
  tma(kBoxes64, p128, kBlockPerUnit, 3);
  tma(kBox128, p128, 1, 5);
  tma(kBox128, p256, 1, 5);
  tma(kBox128, p128, 2, 3);
  tma(kBulk, p128, 1, 5);  // no descriptor: the promotion does not apply
  tma(kBulk, p128, 2, 3);
  auto cp_async = [&](int per_sm, auto stages_c, bool first = false) {
    constexpr int kStages = decltype(stages_c)::value;
    char name[128];
    std::snprintf(name, sizeof name, "cp.async 128 threads, %s, %d stages%s",
                  blocks(per_sm).c_str(), kStages, first ? ", evict-first" : "");
    const int smem = kStages * kTileBytes;
    auto kernel = first ? cp_async_read<kStages, kEvictFirst> : cp_async_read<kStages>;
    CHECK(cudaFuncSetAttribute(kernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(prop.sharedMemPerBlockOptin)));
    variants.push_back({name, [=, &k, &v, &st, &shapes](int shape, int c) {
      const Shape& sh = shapes[shape];
      kernel<<<grid(sh, per_sm), 128, smem, st>>>(k[c], v[c], sh.units, sh.tiles, sink);
    }});
  };
  cp_async(1, std::integral_constant<int, 4>{});
  cp_async(1, std::integral_constant<int, 4>{}, true);
  cp_async(2, std::integral_constant<int, 3>{});
  cp_async(2, std::integral_constant<int, 2>{});
  cp_async(3, std::integral_constant<int, 2>{});
  cp_async(kBlockPerUnit, std::integral_constant<int, 3>{});
  // The decode kernel's shape: 384 threads, with and without its register split, with the
  // stages' shared memory alone or the d = 128 kernel's 229,536 bytes (its Q tiles and staging
  // beside them).
  auto shaped = [&](bool regs, int smem) {
    char name[128];
    std::snprintf(name, sizeof name, "kernel-shaped 384 threads%s, %d KB smem, 5 stages",
                  regs ? ", setmaxnreg" : "", smem / 1024);
    auto kernel = regs ? shaped_read<true> : shaped_read<false>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(prop.sharedMemPerBlockOptin)));
    auto maps = maps_for(kBoxes64, p128);
    variants.push_back({name, [=, &st, &shapes](int shape, int c) {
      const Shape& sh = shapes[shape];
      const auto& m = (*maps)[shape * kCopies + c];
      kernel<<<grid(sh, 1), 384, smem, st>>>(m.first, m.second, sh.units, sh.tiles, 5, sink);
    }});
  };
  constexpr int kStagesSmem = 5 * kTileBytes + 1024, kKernelSmem = 229536;  // the d = 128 kernel's
  shaped(false, kStagesSmem);
  shaped(false, kKernelSmem);
  shaped(true, kKernelSmem);

  if (only == "--trace") {
    // Round 57: the read's per-block times, after the bench's flush, five launches per shape.
    CHECK(cudaFuncSetAttribute(traced_read, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(prop.sharedMemPerBlockOptin)));
    uint64_t* trace = nullptr;
    CHECK(cudaMalloc(&trace, sizeof(uint64_t) * 5 * sms));
    const auto maps = maps_for(kBoxes64, p128);
    for (int shape = 0; shape < int(std::size(shapes)); ++shape) {
      const Shape& sh = shapes[shape];
      const auto& [km, vm] = (*maps)[shape * kCopies];  // input copy 0
      const int grid = std::min(sh.units, sms), smem = kTracedStages * kTileBytes + 1024;
      std::printf("\n%s: per block, us: first copy after start (median, max); last tile landed"
                  " after last copy (median, max); ends after the first start (min, median, max)\n",
                  sh.name);
      for (int run = 0; run < 6; ++run) {
        flush();
        traced_read<<<grid, 32 * (kConsumerWarps + 1), smem, st>>>(km, vm, sh.units, sh.tiles,
                                                                    trace);
        CHECK(cudaStreamSynchronize(st));
        std::vector<uint64_t> t(5 * grid);
        CHECK(cudaMemcpy(t.data(), trace, t.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        uint64_t first = t[0];
        for (int b = 0; b < grid; ++b) {
          first = std::min(first, t[5 * b]);
        }
        std::vector<double> lead, drain, end;
        for (int b = 0; b < grid; ++b) {
          lead.push_back((t[5 * b + 1] - t[5 * b]) * 1e-3);
          drain.push_back((double(t[5 * b + 3]) - double(t[5 * b + 2])) * 1e-3);
          end.push_back((t[5 * b + 4] - first) * 1e-3);
        }
        for (auto* v : {&lead, &drain, &end}) {
          std::sort(v->begin(), v->end());
        }
        if (run > 0) {  // the first launch warms up
          std::printf("  %.2f %.2f; %.2f %.2f; %.1f %.1f %.1f\n", lead[grid / 2], lead.back(),
                      drain[grid / 2], drain.back(), end.front(), end[grid / 2], end.back());
        }
      }
    }
    return 0;
  }
  for (int shape = 0; shape < int(std::size(shapes)); ++shape) {
    const Shape& sh = shapes[shape];
    const size_t bytes = size_t(sh.units) * sh.tiles * kTileBytes * 2;
    std::printf("\n%s: %.1f MB of K and V\n", sh.name, bytes / 1e6);
    std::printf("%-64s %10s %7s %10s %7s %10s %7s\n", "", "rotated us", "GB/s", "flushed us",
                "GB/s", "do_bench", "GB/s");
    for (const Variant& var : variants) {
      if (var.name.find(only) == std::string::npos) {
        continue;
      }
      const float rotated = median_us([&](int i) { var.launch(shape, i % kCopies); }, st);
      const float flushed = median_us([&](int) { var.launch(shape, 0); }, st, flush);
      const float bench = do_bench_us([&](int) { var.launch(shape, 0); }, st, flush);
      auto gbps = [&](float us) { return bytes / (us * 1e-6) / 1e9; };
      std::printf("%-64s %10.1f %7.1f %10.1f %7.1f %10.1f %7.1f\n", var.name.c_str(), rotated,
                  gbps(rotated), flushed, gbps(flushed), bench, gbps(bench));
    }
  }
  return 0;
}
