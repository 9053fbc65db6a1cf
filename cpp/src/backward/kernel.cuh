// flashcore's backward kernels: the gradients of attention (FlashAttention-2's algorithm) on
// tensor cores: nvcuda::wmma 16x16x16 fragments (f32 accumulation) filled by ldmatrix in the
// register layout that wmma/fragments.cuh documents and checks. docs/BACKWARD.md: design, rounds.
//
//   row_sums:  D_i = dO_i . O_i per query row, and the row's f32 dQ accumulator zeroed;
//   key_block: one block per (kKeys keys, kv head, sequence) holds K and V in shared memory and
//              dK, dV in its warps' accumulators; for every query head of its group and every
//              32-row query tile that sees its keys it recomputes
//                S = Q K^T, P = exp(s(S) - lse), dP = dO V^T, dS = P (dP - D) s'(S),
//              then dV += P^T dO, dK += dS^T Q, and adds dS K to the rows' dQ accumulators
//              (f32 atomics: other key blocks add to the same rows);
//   convert:   dQ from its accumulator to the output type and strides.
// key_block here is the narrow kernel (4 warps, 64 keys, 32-row steps: it fits an L4's shared
// memory up to head dim 128); wide.cuh's (8 warps) runs where core::plan_backward finds its
// shared memory, and at head dim 256.
// s(x) is the score: x * scale, or cap * tanh(x * scale / cap), minus ALiBi's slope times the
// distance from the diagonal, plus the bias; s' is its derivative in x. Masked keys and rows
// whose logsumexp is -inf (they saw no key) have P = 0. A variable-length batch's sequences each
// have their own lengths and mask (offsets clamped on read: sequences.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "backward/launch.h"
#include "element.cuh"
#include "fast_math.cuh"
#include "core/backward.h"
#include "sequences.cuh"
#include "wmma/copy.cuh"
#include "wmma/fragments.cuh"

namespace flashcore::backward {

namespace wm = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 16 * kWarps;  // keys per block: each warp owns 16 key rows of dK and dV
constexpr int kRows = 32;           // query rows per step
static_assert(kWarps == core::kBackwardWarps && kKeys == core::kBackwardKeys &&
                  kRows == core::kBackwardRows,
              "core/backward.h");

// Shared-memory plan of the key-block kernel for head dim tier D (elements of T unless named):
// K and V; two step buffers (Q, dO, then the step's logsumexps and row sums in f32), filled by
// cp.async one step ahead; dS^T of the step (keys x query rows). Rows are padded by 16 bytes,
// which keeps ldmatrix free of bank conflicts.
template <typename T, int D>
struct Smem {
  static constexpr int kLd = D + 8;      // K, V, Q, dO rows
  static constexpr int kLt = kRows + 8;  // dS^T rows (one per key)
  static constexpr int kLq = D + 4;      // f32 rows of dK and dV on their way out
  static constexpr size_t kKv = size_t(kKeys) * kLd * sizeof(T);    // K or V
  static constexpr size_t kQ = size_t(kRows) * kLd * sizeof(T);     // Q or dO
  static constexpr size_t kStage = 2 * kQ + 2 * kRows * sizeof(float);
  static constexpr size_t kDs = size_t(kKeys) * kLt * sizeof(T);
  static constexpr size_t kBytes = 2 * kKv + 2 * kStage + kDs;
  // dK and dV leave through K and V's space; the layout check's scratch lies in the stages.
  static_assert(size_t(kKeys) * kLq * sizeof(float) <= 2 * kKv, "dK staging fits K and V");
  static_assert(kWarps * 1536 <= 2 * kStage, "layout check scratch");
  static_assert(kKv % 16 == 0 && kQ % 16 == 0 && kStage % 16 == 0, "16-byte aligned parts");
  static_assert(sizeof(T) != 2 ||
                    int64_t(kBytes) == core::backward_row(BackwardKernel::Narrow, D, kWarps, kKeys,
                                                              kRows, 2, "")
                                             .smem_bytes,
                "core/backward.h plans this layout");
};

// The bias element [b, i, h, j] (launch.h: BackwardLaunch::bias).
__device__ inline float bias_at(const BackwardLaunch& p, int64_t b, int64_t i, int64_t h,
                                int64_t j) {
  const int64_t at =
      b * p.bias_stride[0] + i * p.bias_stride[1] + h * p.bias_stride[2] + j * p.bias_stride[3];
  switch (p.bias_type) {
    case 0: return to_float(static_cast<const __half*>(p.bias)[at]);
    case 1: return to_float(static_cast<const __nv_bfloat16*>(p.bias)[at]);
    default: return static_cast<const float*>(p.bias)[at];
  }
}

// The logsumexp's rows per head and its batch entries: [entries, heads_q, head_rows] (a
// variable-length batch's: [1, heads_q, total_q]), the order of the row sums and of dQ's
// accumulator rows.
__device__ inline int64_t head_rows(const BackwardLaunch& p) {
  return p.cu_q != nullptr ? p.total_q : p.seq_q;
}
__device__ inline int64_t entries(const BackwardLaunch& p) {
  return p.cu_q != nullptr ? 1 : p.batch;
}

// D_i = dO_i . O_i (one warp per logsumexp row), and the row's dQ accumulator (D columns)
// zeroed.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) row_sums(__grid_constant__ const BackwardLaunch p, float* sums,
                                                     float* dq_acc) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t rows = entries(p) * p.heads_q * head_rows(p);
  if (row >= rows) {
    return;
  }
  const int64_t i = row % head_rows(p), bh = row / head_rows(p);
  const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
  const T* o = static_cast<const T*>(p.out) + b * p.o_stride[0] + i * p.o_stride[1] +
               h * p.o_stride[2];
  const T* g = static_cast<const T*>(p.dout) + b * p.do_stride[0] + i * p.do_stride[1] +
               h * p.do_stride[2];
  float sum = 0.f;
  for (int c = lane; c < p.head_dim; c += 32) {
    sum += to_float(o[c]) * to_float(g[c]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  if (lane == 0) {
    sums[row] = sum;
  }
  for (int c = lane; c < D; c += 32) {
    dq_acc[row * D + c] = 0.f;
  }
}

// Adds two floats to adjacent f32 accumulators (8-byte aligned): one float2 atomic from
// compute capability 9.0 on, two scalar ones before.
__device__ inline void add_pair(float* to, float x, float y) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(to), make_float2(x, y));
#else
  atomicAdd(to, x);
  atomicAdd(to + 1, y);
#endif
}

// Sequence b of a launch (batch entry b of a dense one): its batch entry and first query and
// key tokens in the tensors, its lengths, its first logsumexp row (head 0) and rows per head,
// and its mask: key j is visible to row i when lo <= j - i <= hi (a side without has_*:
// unbounded); ALiBi's distance is |i + diagonal - j|.
struct Seq {
  int64_t entry, q0, k0, seq_q, seq_k, row0, rows;
  int64_t diagonal, lo, hi;
  bool has_lo, has_hi;
};
__device__ inline Seq sequence_of(const BackwardLaunch& p, int64_t b) {
  Seq s;
  if (p.cu_q == nullptr) {
    s.entry = b, s.q0 = 0, s.k0 = 0, s.seq_q = p.seq_q, s.seq_k = p.seq_k;
    s.row0 = b * p.heads_q * p.seq_q, s.rows = p.seq_q;
  } else {
    const TokenRange q = token_range(p.cu_q, b, p.total_q);
    const TokenRange k = token_range(p.cu_k, b, p.total_k);
    s.entry = 0, s.q0 = q.begin, s.k0 = key_base(k);
    s.seq_q = q.end - q.begin, s.seq_k = k.end - k.begin;
    s.row0 = q.begin, s.rows = p.total_q;
  }
  s.diagonal = p.bottom_right ? s.seq_k - s.seq_q : 0;
  s.has_hi = p.causal || p.window_right >= 0;
  s.hi = s.diagonal + (p.causal ? 0 : p.window_right);
  s.has_lo = p.window_left >= 0;
  s.lo = s.diagonal - p.window_left;
  return s;
}

// The query rows [first, end) of sequence `s` that see any of the keys [j0, j0 + keys)
// (clamped to its keys; j0 below its key count).
struct RowRange {
  int64_t first, end;
};
__device__ inline RowRange rows_seeing(const Seq& s, int64_t j0, int keys) {
  const int64_t j1 = min(j0 + keys, s.seq_k) - 1;  // the block's last key
  // Visible: lo <= j - i <= hi, so i >= j0 - hi and i <= j1 - lo.
  const int64_t first = s.has_hi ? max(int64_t(0), j0 - s.hi) : 0;
  const int64_t end = s.has_lo ? min(s.seq_q, j1 - s.lo + 1) : s.seq_q;
  return {first, max(first, end)};
}

// A key block's query steps: every query head of its kv head's group times the ROWS-row steps
// whose rows see its keys (rows_seeing), heads in turn; next() walks them without a division.
template <int ROWS>
struct StepWalk {
  struct Step {
    int64_t h, i0;  // a query step: its head and first row
  };
  int64_t first, end, count;
  Step start;
  __device__ StepWalk(const Seq& seq, int64_t j0, int keys, int64_t kvh, int group) {
    const RowRange range = rows_seeing(seq, j0, keys);
    first = range.first / ROWS * ROWS, end = range.end;
    count = (end - first + ROWS - 1) / ROWS * group;
    start = {kvh * group, first};
  }
  // The step after `at`: the next ROWS rows of its head, or the next head's first.
  __device__ Step next(Step at) const {
    at.i0 += ROWS;
    if (at.i0 >= end) {
      at.i0 = first;
      ++at.h;
    }
    return at;
  }
};

// Token `token` of head `head` in batch entry `entry` of a [batch, seq, heads, head_dim] tensor
// at `base` with strides `stride` (elements).
template <typename P>
__device__ __forceinline__ P* token_row(P* base, const int64_t (&stride)[3], int64_t entry,
                                        int64_t token, int64_t head) {
  return base + entry * stride[0] + token * stride[1] + head * stride[2];
}

// Writes `keys` key rows of a gradient (the warps' accumulators `acc`) to `out` (the block's
// first key row of its kv head; rows `stride` elements apart), through `stage` (f32 rows of
// Smem::kLq).
template <typename T, int D>
__device__ inline void store_rows(const wm::fragment<wm::accumulator, 16, 16, 16, float> (&acc)[D / 16],
                                  float* stage, T* out, int64_t stride, int64_t keys,
                                  int head_dim) {
  using S = Smem<T, D>;
  const int warp = threadIdx.x / 32;
  __syncthreads();  // the stage is free (K, V, or the previous gradient, are read)
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wm::store_matrix_sync(stage + warp * 16 * S::kLq + n * 16, acc[n], S::kLq, wm::mem_row_major);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kKeys * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (r < keys && c < head_dim) {
      out[r * stride + c] = from_float<T>(stage[r * S::kLq + c]);
    }
  }
}

// The score gradient of one element: P = exp(s(x) - lse) and dS = P (dP - D) s'(x) of query row
// i (the sequence's) against key j, for a head whose ALiBi slope is `slope`; zero where the key is
// masked or the row saw no key.
struct ScoreGrad {
  float prob, ds;
};
__device__ inline ScoreGrad score_grad(const BackwardLaunch& p, const Seq& seq, int64_t b,
                                       int64_t h, float slope, int64_t i, int64_t j, float x,
                                       float dp, float lse, float sum) {
  const int64_t gap = j - i;
  const bool visible = i < seq.seq_q && j < seq.seq_k && (!seq.has_lo || gap >= seq.lo) &&
                       (!seq.has_hi || gap <= seq.hi);
  if (!visible || lse == -INFINITY) {
    return {0.f, 0.f};
  }
  float score = x * p.scale, derivative = p.scale;
  if (p.softcap > 0.f) {
    const float t = fast_tanh(__fdividef(score, p.softcap));
    score = p.softcap * t;
    derivative = p.scale * (1.f - t * t);
  }
  if (p.alibi != nullptr) {
    score -= slope * float(llabs(i + seq.diagonal - j));
  }
  if (p.bias != nullptr) {
    score += bias_at(p, b, i, h, j);
  }
  const float prob = __expf(score - lse);
  return {prob, prob * (dp - sum) * derivative};
}

// Blocks per SM that ptxas plans the head-dim-64 kernel's registers for: 3 on sm_90 (168
// registers, 4 bytes of spills; H200 call 249: 7% faster than 4 blocks, which spill 112 bytes, and
// than 2); 2 before, where 168 registers spill 56-88 bytes and an L4's shared memory holds 2
// blocks anyway (unmeasured: no such GPU is lent).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kBlocks64 = 2;
#else
constexpr int kBlocks64 = 3;
#endif

// Where a key-block kernel's block is: its first key j0 (of its sequence), its sequence b and
// kv head.
struct BlockPlace {
  int64_t j0, b, kvh;
};

// Block blockIdx.x of the KEYS-key blocks. Under a mask with a right edge (causal, or a window)
// the first keys are seen by the most query rows: the blocks go in order of their keys, so the
// longest start first. Otherwise every block has the same work, and a (sequence, kv head)'s
// blocks go together, sharing its Q and dO in L2 (call 246: 4% faster than key order). 32-bit
// arithmetic: plan_backward keeps key blocks x slices below 2^31.
template <int KEYS>
__device__ __forceinline__ BlockPlace block_place(const BackwardLaunch& p) {
  const unsigned slices = unsigned(p.batch) * unsigned(p.heads_kv);
  const unsigned key_blocks = (unsigned(p.seq_k) + KEYS - 1) / KEYS;
  const bool longest_first = p.causal || p.window_right >= 0;
  const unsigned slice = longest_first ? blockIdx.x % slices : blockIdx.x / key_blocks;
  const unsigned key_block = longest_first ? blockIdx.x / slices : blockIdx.x % key_blocks;
  return {int64_t(key_block) * KEYS, slice / unsigned(p.heads_kv), slice % unsigned(p.heads_kv)};
}

// Starts the copies of query step (head h, first row i0) of sequence `seq` (not committed):
// its ROWS rows of Q and dO (zero past the sequence and the head dim) into q_dst and do_dst
// (rows of LD elements), and with threads [0, ROWS) and [ROWS, 2 ROWS) their logsumexps and row
// sums (`sums`) into stats_dst.
template <typename T, int D, int ROWS, int LD, int THREADS>
__device__ __forceinline__ void fetch_step(const BackwardLaunch& p, const Seq& seq,
                                           const float* sums, int64_t h, int64_t i0, T* q_dst,
                                           T* do_dst, float* stats_dst) {
  using RowCopy = wmma_fa::TileCopy<ROWS, D, LD, THREADS, T>;
  const T* q = static_cast<const T*>(p.q) + seq.entry * p.q_stride[0] + seq.q0 * p.q_stride[1] +
               h * p.q_stride[2];
  const T* dout = static_cast<const T*>(p.dout) + seq.entry * p.do_stride[0] +
                  seq.q0 * p.do_stride[1] + h * p.do_stride[2];
  const int rows = static_cast<int>(seq.seq_q);
  RowCopy(q, p.q_stride[1], rows, p.head_dim).start(q_dst, static_cast<int>(i0));
  RowCopy(dout, p.do_stride[1], rows, p.head_dim).start(do_dst, static_cast<int>(i0));
  if (threadIdx.x < 2 * ROWS) {
    const int r = threadIdx.x % ROWS;
    const float* from = (threadIdx.x < ROWS ? p.lse : sums) + seq.row0 + h * seq.rows + i0 + r;
    const bool ok = i0 + r < seq.seq_q;
    // A zero-filled copy reads nothing; its address is in bounds.
    __pipeline_memcpy_async(stats_dst + threadIdx.x, ok ? from : p.lse, 4, ok ? 0 : 4);
  }
}

// One block per (kKeys keys, kv head, sequence); warp w owns keys [16w, 16w + 16) of the block.
// Per 32-row query step (every query head of the group, every step that sees the block's keys),
// with the operands' fragments loaded by ldmatrix in the layout of wmma/fragments.cuh:
//   S^T = K Q^T and dP^T = V dO^T, each warp its 16 key rows, in accumulators;
//   P^T and dS^T element by element in those registers, which are the A operands of
//   dV += P^T dO and dK += dS^T Q (identical element positions);
//   dS^T to shared memory, then dQ = dS K: warp w computes query rows [16 (w % 2), +16) and half
//   of the head dim, and adds them to the rows' f32 accumulators with atomics from registers.
// The next step's Q, dO, logsumexps and row sums arrive by cp.async during the step.
// Registers: ptxas is held to 2 blocks per SM (dK and dV's accumulators alone take 128 registers
// a thread at head dim 128), and at head dim 64 on sm_90 to 3 (kBlocks64).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads, (D == 64 ? kBlocks64 : 2))
    key_block(__grid_constant__ const BackwardLaunch p, const float* sums, float* dq_acc) {
  using S = Smem<T, D>;
  using wmma_fa::FragA;
  using wmma_fa::FragAcc;
  using wmma_fa::FragBCol;
  using wmma_fa::FragBRow;
  constexpr int kCols = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kKeys * S::kLd;
  unsigned char* stages = smem + 2 * S::kKv;
  T* dsts = reinterpret_cast<T*>(stages + 2 * S::kStage);  // dS^T
  const auto q_of = [&](int buf) { return reinterpret_cast<T*>(stages + buf * S::kStage); };
  const auto do_of = [&](int buf) { return q_of(buf) + kRows * S::kLd; };
  const auto stats_of = [&](int buf) {  // the step's logsumexps, then its row sums
    return reinterpret_cast<float*>(stages + buf * S::kStage + 2 * S::kQ);
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (!wmma_fa::layout_matches<T>(stages + warp * 1536, lane)) {
    __trap();  // this GPU's wmma fragments differ from wmma/fragments.cuh: refuse, never compute wrong
  }
  __syncthreads();  // the scratch is step space, about to be filled

  const BlockPlace place = block_place<kKeys>(p);
  const int64_t j0 = place.j0, b = place.b, kvh = place.kvh;
  const int group = p.heads_q / p.heads_kv;
  const Seq seq = sequence_of(p, b);
  if (j0 >= seq.seq_k) {
    return;  // past this sequence's keys (a variable-length batch's shorter ones)
  }
  const int64_t kt = seq.k0 + j0;  // the block's first key token
  const T* k = token_row(static_cast<const T*>(p.k), p.k_stride, seq.entry, kt, kvh);
  const T* v = token_row(static_cast<const T*>(p.v), p.v_stride, seq.entry, kt, kvh);
  const int keys = static_cast<int>(min(int64_t(kKeys), seq.seq_k - j0));
  using KeyCopy = wmma_fa::TileCopy<kKeys, D, S::kLd, kThreads, T>;
  KeyCopy(k, p.k_stride[1], keys, p.head_dim).start(ks, 0);
  KeyCopy(v, p.v_stride[1], keys, p.head_dim).start(vs, 0);

  // The query steps that see the keys: every query head of the group, kRows rows at a time.
  const StepWalk<kRows> walk(seq, j0, kKeys, kvh, group);
  using Step = StepWalk<kRows>::Step;
  const int64_t steps = walk.count;
  const Step start = walk.start;
  Step fetched = start, step = start;  // the step copied last, the step computed next
  const auto lse_row0 = [&](int64_t h) { return seq.row0 + h * seq.rows; };
  // Starts step `at`'s copies into buffer `buf` (not committed).
  const auto fetch = [&](Step at, int buf) {
    fetch_step<T, D, kRows, S::kLd, kThreads>(p, seq, sums, at.h, at.i0, q_of(buf), do_of(buf),
                                             stats_of(buf));
  };
  if (steps > 0) {
    fetch(start, 0);
  }
  __pipeline_commit();

  FragAcc dk[kCols], dv[kCols];
#pragma unroll
  for (int n = 0; n < kCols; ++n) {
    wm::fill_fragment(dk[n], 0.f);
    wm::fill_fragment(dv[n], 0.f);
  }
  const bool plain_scores = p.softcap == 0.f && p.alibi == nullptr && p.bias == nullptr;
  const float scale_log2 = p.scale * kLog2e;

  for (int64_t s = 0; s < steps; ++s) {
    __pipeline_wait_prior(0);
    __syncthreads();  // step s's buffer is in; the previous step is done with the other and dS^T
    if (s + 1 < steps) {
      fetched = walk.next(fetched);
      fetch(fetched, int((s + 1) % 2));
    }
    __pipeline_commit();
    const int buf = int(s % 2);
    const T* qs = q_of(buf);
    const T* dos = do_of(buf);
    const float* lse = stats_of(buf);
    const float* dsum = lse + kRows;
    const int64_t h = step.h, i0 = step.i0;
    step = walk.next(step);

    // S^T and dP^T for the warp's 16 keys: two 16-column tiles of query rows each.
    FragAcc st[kRows / 16], dpt[kRows / 16];
#pragma unroll
    for (int nt = 0; nt < kRows / 16; ++nt) {
      wm::fill_fragment(st[nt], 0.f);
      wm::fill_fragment(dpt[nt], 0.f);
    }
#pragma unroll
    for (int kk = 0; kk < kCols; ++kk) {
      FragA<T> a;
      FragBCol<T> bt;
      wmma_fa::load_a(a, ks + warp * 16 * S::kLd + kk * 16, S::kLd, lane);
#pragma unroll
      for (int nt = 0; nt < kRows / 16; ++nt) {
        wmma_fa::load_b_col(bt, qs + nt * 16 * S::kLd + kk * 16, S::kLd, lane);
        wm::mma_sync(st[nt], a, bt, st[nt]);
      }
      wmma_fa::load_a(a, vs + warp * 16 * S::kLd + kk * 16, S::kLd, lane);
#pragma unroll
      for (int nt = 0; nt < kRows / 16; ++nt) {
        wmma_fa::load_b_col(bt, dos + nt * 16 * S::kLd + kk * 16, S::kLd, lane);
        wm::mma_sync(dpt[nt], a, bt, dpt[nt]);
      }
    }

    // P^T and dS^T in place of S^T and dP^T (accumulator element e of tile nt: key 16w +
    // acc_row, query row 16 nt + acc_col). `full`: the whole step is visible with the plain score.
    const bool full = plain_scores && i0 + kRows <= seq.seq_q && j0 + kKeys <= seq.seq_k &&
                      (!seq.has_lo || j0 - (i0 + kRows - 1) >= seq.lo) &&
                      (!seq.has_hi || j0 + kKeys - 1 - i0 <= seq.hi);
    const float slope = p.alibi != nullptr ? p.alibi[b * p.alibi_batch_stride + h] : 0.f;
    if (full) {
      // Every element visible with the plain score: P = 2^(x scale log2(e) - lse log2(e)), an
      // FFMA and an ex2 each, and dS = P (dP - D) scale. A row that saw no key (lse = -inf) gets
      // an exponent of -inf: P = 0.
#pragma unroll
      for (int nt = 0; nt < kRows / 16; ++nt) {
#pragma unroll
        for (int e = 0; e < FragAcc::num_elements; ++e) {
          const int r = nt * 16 + wmma_fa::acc_col(lane, e);
          const float m = lse[r];
          const float shift = m == -INFINITY ? INFINITY : m * kLog2e;
          const float prob = fast_exp2(st[nt].x[e] * scale_log2 - shift);
          st[nt].x[e] = prob;
          dpt[nt].x[e] = prob * (dpt[nt].x[e] - dsum[r]) * p.scale;
        }
      }
    } else if (plain_scores) {
      // The plain score on a step that a mask's edge or the sequence's end cuts: as above where
      // visible, zero elsewhere. Visible: lo <= j - i <= hi, where j - i = base + d with the
      // element's d = acc_row - (16 nt + acc_col) in [-31, 15], so bounds clamped to +-64 decide
      // alike in 32 bits; and inside the sequence's rows and keys.
      const int64_t base = j0 + warp * 16 - i0;
      const auto clamped = [](int64_t x) { return int(max(int64_t(-64), min(int64_t(64), x))); };
      const int d_lo = seq.has_lo ? clamped(seq.lo - base) : -64;
      const int d_hi = seq.has_hi ? clamped(seq.hi - base) : 64;
      const int rows = int(min(int64_t(kRows), seq.seq_q - i0));
      const int warp_keys = keys - warp * 16;
#pragma unroll
      for (int nt = 0; nt < kRows / 16; ++nt) {
#pragma unroll
        for (int e = 0; e < FragAcc::num_elements; ++e) {
          const int kr = wmma_fa::acc_row(lane, e);
          const int r = nt * 16 + wmma_fa::acc_col(lane, e);
          const int d = kr - r;
          const bool visible = r < rows && kr < warp_keys && d >= d_lo && d <= d_hi;
          const float m = lse[r];
          const float shift = m == -INFINITY ? INFINITY : m * kLog2e;
          const float prob = visible ? fast_exp2(st[nt].x[e] * scale_log2 - shift) : 0.f;
          st[nt].x[e] = prob;
          dpt[nt].x[e] = visible ? prob * (dpt[nt].x[e] - dsum[r]) * p.scale : 0.f;
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < kRows / 16; ++nt) {
#pragma unroll
        for (int e = 0; e < FragAcc::num_elements; ++e) {
          const int kr = warp * 16 + wmma_fa::acc_row(lane, e);
          const int r = nt * 16 + wmma_fa::acc_col(lane, e);
          const ScoreGrad g = score_grad(p, seq, b, h, slope, i0 + r, j0 + kr, st[nt].x[e],
                                         dpt[nt].x[e], lse[r], dsum[r]);
          st[nt].x[e] = g.prob;
          dpt[nt].x[e] = g.ds;
        }
      }
    }
    // P^T and dS^T as A fragments (rounded to T), and dS^T to shared memory.
    FragA<T> pa[kRows / 16], dsa[kRows / 16];
#pragma unroll
    for (int nt = 0; nt < kRows / 16; ++nt) {
      uint32_t dw[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {  // elements 2w and 2w + 1: one key, two adjacent rows
        dw[w] = wmma_fa::pack2(T(), dpt[nt].x[2 * w], dpt[nt].x[2 * w + 1]);
        *reinterpret_cast<uint32_t*>(dsts + (warp * 16 + lane / 4 + 8 * (w & 1)) * S::kLt +
                                     nt * 16 + 2 * (lane % 4) + 8 * (w >> 1)) = dw[w];
      }
      wmma_fa::acc_to_a(pa[nt], st[nt]);
      wmma_fa::set_words(dsa[nt], dw);
    }

    // dV += P^T dO and dK += dS^T Q.
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < kCols; ++n) {
        FragBRow<T> x;
        wmma_fa::load_b_row(x, dos + kk * 16 * S::kLd + n * 16, S::kLd, lane);
        wm::mma_sync(dv[n], pa[kk], x, dv[n]);
        wmma_fa::load_b_row(x, qs + kk * 16 * S::kLd + n * 16, S::kLd, lane);
        wm::mma_sync(dk[n], dsa[kk], x, dk[n]);
      }
    }
    __syncthreads();  // dS^T complete

    // dQ = dS K for query rows [16 mt, +16) and head-dim tiles [n0, n0 + kDqCols), added to the
    // rows' accumulators.
    constexpr int kDqCols = kCols / (kWarps / (kRows / 16));
    static_assert(kDqCols * kWarps == kCols * (kRows / 16), "whole dQ tiles per warp");
    const int mt = warp % (kRows / 16), n0 = warp / (kRows / 16) * kDqCols;
    FragAcc dq[kDqCols];
#pragma unroll
    for (int n = 0; n < kDqCols; ++n) {
      wm::fill_fragment(dq[n], 0.f);
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      FragA<T> a;
      wmma_fa::load_a_col(a, dsts + kk * 16 * S::kLt + mt * 16, S::kLt, lane);
#pragma unroll
      for (int n = 0; n < kDqCols; ++n) {
        FragBRow<T> x;
        wmma_fa::load_b_row(x, ks + kk * 16 * S::kLd + (n0 + n) * 16, S::kLd, lane);
        wm::mma_sync(dq[n], a, x, dq[n]);
      }
    }
    const int64_t valid = min(int64_t(kRows), seq.seq_q - i0);
    float* acc = dq_acc + (lse_row0(h) + i0) * D;
    if (valid == kRows && p.head_dim == D) {
      // Every element real: one base address per lane, constant offsets.
      float* base = acc + (mt * 16 + lane / 4) * D + n0 * 16 + 2 * (lane % 4);
#pragma unroll
      for (int n = 0; n < kDqCols; ++n) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          add_pair(base + 8 * (w & 1) * D + n * 16 + 8 * (w >> 1), dq[n].x[2 * w],
                   dq[n].x[2 * w + 1]);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kDqCols; ++n) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {  // elements 2w and 2w + 1: one row, two adjacent columns
          const int r = mt * 16 + wmma_fa::acc_row(lane, 2 * w);
          const int c = (n0 + n) * 16 + wmma_fa::acc_col(lane, 2 * w);
          if (r < valid && c < p.head_dim) {
            add_pair(acc + int64_t(r) * D + c, dq[n].x[2 * w], dq[n].x[2 * w + 1]);
          }
        }
      }
    }
  }
  __pipeline_wait_prior(0);  // K and V's copies when no step ran

  // dK and dV leave through K and V's space (f32 rows of kLq), one after the other.
  float* stage = reinterpret_cast<float*>(smem);
  const auto at = [&](void* t, const int64_t (&stride)[3]) {
    return token_row(static_cast<T*>(t), stride, seq.entry, kt, kvh);
  };
  store_rows<T, D>(dk, stage, at(p.dk, p.dk_stride), p.dk_stride[1], seq.seq_k - j0, p.head_dim);
  store_rows<T, D>(dv, stage, at(p.dv, p.dv_stride), p.dv_stride[1], seq.seq_k - j0, p.head_dim);
}

// dQ from its f32 accumulator (logsumexp rows of D floats) to T at dq's strides.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) convert(__grid_constant__ const BackwardLaunch p, const float* dq_acc) {
  const int64_t rows = entries(p) * p.heads_q * head_rows(p);
  for (int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x; e < rows * p.head_dim;
       e += int64_t(gridDim.x) * kThreads) {
    const int64_t row = e / p.head_dim, c = e % p.head_dim;
    const int64_t i = row % head_rows(p), bh = row / head_rows(p);
    const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
    static_cast<T*>(p.dq)[b * p.dq_stride[0] + i * p.dq_stride[1] + h * p.dq_stride[2] + c] =
        from_float<T>(dq_acc[row * D + c]);
  }
}

}  // namespace flashcore::backward
