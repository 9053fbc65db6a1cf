// The wide key-block kernel: FlashAttention-2's tiling of the backward pass, for GPUs whose
// shared memory holds it (core::plan_backward picks a row of core::kBackwardTiles by shared
// memory; kernel.cuh's narrow kernel serves the others up to head dim 128).
//
// One block of W warps (8, or 4) per (KEYS keys, kv head, sequence) keeps K, V, dK and dV on
// chip and walks the ROWS-row query steps that see its keys (every query head of the group). Per
// step, with C = W / 2:
//   S = Q K^T and dP = dO V^T as 2 x C warp tiles of ROWS/2 rows x KEYS/C keys (each loaded
//   fragment feeds several products);
//   P and dS element by element in those accumulators, then to shared memory (T, row-major);
//   dV += P^T dO and dK += dS^T Q as C x 2 warp tiles of KEYS/C keys x D/2 columns over the
//   step's rows;
//   dQ = dS K as 2 x C warp tiles of ROWS/2 rows x D/C columns over the block's keys, added to
//   the rows' f32 accumulators with atomics from registers.
// The next step's Q, dO, logsumexps and row sums arrive by cp.async during the step (with one
// step buffer: during dQ's products).
// Rows (core/backward.h): 8 warps, 128 keys and 64-row steps at head-dim tiers 64 and 128 (32 x
// 32 score tiles per warp); at tier 256, 8 warps, 64 keys and 64- or 32-row steps (a warp's dK
// and dV: 16 keys x 128 columns, the registers of tier 128's 32 x 64), or 4 warps, 32 keys,
// 32-row steps and one step buffer (an L4).
#pragma once

#include "backward/kernel.cuh"

namespace flashcore::backward::wide {

// Row TILE of core::kBackwardTiles: its head-dim tier, warps, keys per block, query rows per
// step and step buffers, and the warp tiles (in 16 x 16 fragments) of its three products. The
// warps form a 2 x kSc grid over S / dP (rows x keys) and dQ (rows x columns), and a kSc x 2
// grid over dK / dV (keys x columns).
template <int TILE>
struct Tiling {
  static constexpr BackwardTileRow kRow = core::kBackwardTiles[TILE];
  static_assert(kRow.kernel == BackwardKernel::Wide, "a wide row");
  static constexpr int kWarps = kRow.warps, kThreads = 32 * kWarps, kSc = kWarps / 2;
  static constexpr int kD = kRow.max_head_dim, kKeys = kRow.keys_per_block;
  static constexpr int kRows = kRow.rows_per_step, kBuffers = kRow.step_buffers;
  static constexpr int kTr = kRows / 2, kTc = kKeys / kSc;   // S / dP: rows x keys of a warp
  static constexpr int kTk = kKeys / kSc;                    // dK / dV: a warp's keys (D/2 cols)
  static constexpr int kMs = kTr / 16, kNs = kTc / 16;       // S / dP fragments
  static constexpr int kMk = kTk / 16, kNk = kD / 32;        // dK / dV fragments
  static constexpr int kMq = kTr / 16, kNq = kD / kSc / 16;  // dQ fragments (S's warp rows)
  static_assert((kWarps == 4 || kWarps == 8) && (kBuffers == 1 || kBuffers == 2), "a wide row");
  static_assert(kMs > 0 && kNs > 0 && kMk > 0 && kNk > 0 && kNq > 0, "whole fragments");
};

// Shared-memory plan of row TILE (elements of T unless named): K and V; the step buffers (Q,
// dO, then the step's logsumexps and row sums in f32); P and dS of the step (query rows x keys).
// Rows padded by 16 bytes (ldmatrix without bank conflicts).
template <typename T, int TILE>
struct Smem {
  static constexpr int D = Tiling<TILE>::kD, kKeys = Tiling<TILE>::kKeys;
  static constexpr int kRows = Tiling<TILE>::kRows;
  static constexpr int kLd = D + 8;      // K, V, Q, dO rows
  static constexpr int kLp = kKeys + 8;  // P and dS rows (one per query row)
  static constexpr int kLq = D + 4;      // f32 rows of dK and dV on their way out
  static constexpr size_t kKv = size_t(kKeys) * kLd * sizeof(T);
  static constexpr size_t kQ = size_t(kRows) * kLd * sizeof(T);
  static constexpr size_t kStage = 2 * kQ + 2 * kRows * sizeof(float);
  static constexpr size_t kP = size_t(kRows) * kLp * sizeof(T);
  static constexpr size_t kBytes = 2 * kKv + Tiling<TILE>::kBuffers * kStage + 2 * kP;
  static_assert(size_t(kKeys) * kLq * sizeof(float) <= 2 * kKv, "dK staging fits K and V");
  static_assert(Tiling<TILE>::kWarps * 1536 <= Tiling<TILE>::kBuffers * kStage,
                "layout check scratch");
  static_assert(kKv % 16 == 0 && kQ % 16 == 0 && kStage % 16 == 0 && kP % 16 == 0,
                "16-byte aligned parts");
  static_assert(sizeof(T) != 2 || int64_t(kBytes) == Tiling<TILE>::kRow.smem_bytes,
                "core/backward.h plans this layout");
};

template <typename T, int TILE>
__global__ void __launch_bounds__(Tiling<TILE>::kThreads, 1)
    key_block(__grid_constant__ const BackwardLaunch p, const float* sums, float* dq_acc) {
  using S = Smem<T, TILE>;
  using G = Tiling<TILE>;
  constexpr int kThreads = G::kThreads, kSc = G::kSc, kBuffers = G::kBuffers;
  constexpr int D = G::kD, kKeys = G::kKeys, kRows = G::kRows;
  constexpr int kTr = G::kTr, kTc = G::kTc, kTk = G::kTk;
  constexpr int kMs = G::kMs, kNs = G::kNs, kMk = G::kMk, kNk = G::kNk, kMq = G::kMq;
  using wmma_fa::FragA;
  using wmma_fa::FragAcc;
  using wmma_fa::FragBCol;
  using wmma_fa::FragBRow;
  constexpr int kNq = G::kNq;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kKeys * S::kLd;
  unsigned char* stages = smem + 2 * S::kKv;
  T* ps = reinterpret_cast<T*>(stages + kBuffers * S::kStage);  // P [row][key]
  T* dss = ps + kRows * S::kLp;                                  // dS [row][key]
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
  using Step = typename StepWalk<kRows>::Step;
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

  // Warp roles: S / dP and dQ rows [kTr wr, +kTr); S / dP keys [kTc wc, +kTc), dQ columns
  // [D/kSc wc, +D/kSc); dK / dV keys [kTk wk, +kTk) and columns [D/2 wd, +D/2).
  const int wr = warp / kSc, wc = warp % kSc, wk = warp / 2, wd = warp % 2;
  FragAcc dk[kMk][kNk], dv[kMk][kNk];
#pragma unroll
  for (int m = 0; m < kMk; ++m) {
#pragma unroll
    for (int n = 0; n < kNk; ++n) {
      wm::fill_fragment(dk[m][n], 0.f);
      wm::fill_fragment(dv[m][n], 0.f);
    }
  }
  const bool plain_scores = p.softcap == 0.f && p.alibi == nullptr && p.bias == nullptr;
  const float scale_log2 = p.scale * kLog2e;

  // The next step's copies: with two buffers at the step's start, into the other one; with one,
  // once every warp is done with the step's Q and dO (before dQ's products).
  const auto fetch_next = [&](int64_t s) {
    if (s + 1 < steps) {
      fetched = walk.next(fetched);
      fetch(fetched, int((s + 1) % kBuffers));
    }
    __pipeline_commit();
  };
  for (int64_t s = 0; s < steps; ++s) {
    __pipeline_wait_prior(0);
    __syncthreads();  // step s's buffer is in; the previous step is done with the other, P, dS
    if constexpr (kBuffers == 2) {
      fetch_next(s);
    }
    const int buf = int(s % kBuffers);
    const T* qs = q_of(buf);
    const T* dos = do_of(buf);
    const float* lse = stats_of(buf);
    const float* dsum = lse + kRows;
    const int64_t h = step.h, i0 = step.i0;
    step = walk.next(step);

    // S and dP for the warp's kTr rows x kTc keys.
    FragAcc sc[kMs][kNs], dp[kMs][kNs];
#pragma unroll
    for (int m = 0; m < kMs; ++m) {
#pragma unroll
      for (int n = 0; n < kNs; ++n) {
        wm::fill_fragment(sc[m][n], 0.f);
        wm::fill_fragment(dp[m][n], 0.f);
      }
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA<T> a[kMs];
      FragBCol<T> bt[kNs];
#pragma unroll
      for (int m = 0; m < kMs; ++m) {
        wmma_fa::load_a(a[m], qs + (kTr * wr + 16 * m) * S::kLd + kk * 16, S::kLd, lane);
      }
#pragma unroll
      for (int n = 0; n < kNs; ++n) {
        wmma_fa::load_b_col(bt[n], ks + (kTc * wc + 16 * n) * S::kLd + kk * 16, S::kLd, lane);
      }
#pragma unroll
      for (int m = 0; m < kMs; ++m) {
#pragma unroll
        for (int n = 0; n < kNs; ++n) {
          wm::mma_sync(sc[m][n], a[m], bt[n], sc[m][n]);
        }
      }
#pragma unroll
      for (int m = 0; m < kMs; ++m) {
        wmma_fa::load_a(a[m], dos + (kTr * wr + 16 * m) * S::kLd + kk * 16, S::kLd, lane);
      }
#pragma unroll
      for (int n = 0; n < kNs; ++n) {
        wmma_fa::load_b_col(bt[n], vs + (kTc * wc + 16 * n) * S::kLd + kk * 16, S::kLd, lane);
      }
#pragma unroll
      for (int m = 0; m < kMs; ++m) {
#pragma unroll
        for (int n = 0; n < kNs; ++n) {
          wm::mma_sync(dp[m][n], a[m], bt[n], dp[m][n]);
        }
      }
    }

    // P and dS in place of S and dP (element e of tile (m, n): step row kTr wr + 16 m + acc_row,
    // block key kTc wc + 16 n + acc_col). `full`: the warp's tile is visible with the plain
    // score.
    const int64_t wi0 = i0 + kTr * wr, wj0 = j0 + kTc * wc;
    const bool full = plain_scores && wi0 + kTr <= seq.seq_q && wj0 + kTc <= seq.seq_k &&
                      (!seq.has_lo || wj0 - (wi0 + kTr - 1) >= seq.lo) &&
                      (!seq.has_hi || wj0 + kTc - 1 - wi0 <= seq.hi);
    const float slope = p.alibi != nullptr ? p.alibi[b * p.alibi_batch_stride + h] : 0.f;
    if (full) {
#pragma unroll
      for (int m = 0; m < kMs; ++m) {
#pragma unroll
        for (int n = 0; n < kNs; ++n) {
#pragma unroll
          for (int e = 0; e < FragAcc::num_elements; ++e) {
            const int r = kTr * wr + 16 * m + wmma_fa::acc_row(lane, e);
            const float mx = lse[r];
            const float shift = mx == -INFINITY ? INFINITY : mx * kLog2e;
            const float prob = fast_exp2(sc[m][n].x[e] * scale_log2 - shift);
            sc[m][n].x[e] = prob;
            dp[m][n].x[e] = prob * (dp[m][n].x[e] - dsum[r]) * p.scale;
          }
        }
      }
    } else if (plain_scores) {
      // Visible: lo <= j - i <= hi, where j - i = base + d with d = (16 n + acc_col) - (16 m +
      // acc_row) in [1 - kTr, kTc - 1]: bounds clamped to +-(kTr + kTc) decide alike in 32 bits.
      constexpr int kBound = kTr + kTc;
      const int64_t base = wj0 - wi0;
      const auto clamped = [](int64_t x) {
        return int(max(int64_t(-kBound), min(int64_t(kBound), x)));
      };
      const int d_lo = seq.has_lo ? clamped(seq.lo - base) : -kBound;
      const int d_hi = seq.has_hi ? clamped(seq.hi - base) : kBound;
      const int rows = int(max(int64_t(0), min(int64_t(kTr), seq.seq_q - wi0)));
      const int cols = int(max(int64_t(0), min(int64_t(kTc), seq.seq_k - wj0)));
#pragma unroll
      for (int m = 0; m < kMs; ++m) {
#pragma unroll
        for (int n = 0; n < kNs; ++n) {
#pragma unroll
          for (int e = 0; e < FragAcc::num_elements; ++e) {
            const int rr = 16 * m + wmma_fa::acc_row(lane, e);
            const int cc = 16 * n + wmma_fa::acc_col(lane, e);
            const int d = cc - rr;
            const bool visible = rr < rows && cc < cols && d >= d_lo && d <= d_hi;
            const int r = kTr * wr + rr;
            const float mx = lse[r];
            const float shift = mx == -INFINITY ? INFINITY : mx * kLog2e;
            const float prob = visible ? fast_exp2(sc[m][n].x[e] * scale_log2 - shift) : 0.f;
            sc[m][n].x[e] = prob;
            dp[m][n].x[e] = visible ? prob * (dp[m][n].x[e] - dsum[r]) * p.scale : 0.f;
          }
        }
      }
    } else {
#pragma unroll
      for (int m = 0; m < kMs; ++m) {
#pragma unroll
        for (int n = 0; n < kNs; ++n) {
#pragma unroll
          for (int e = 0; e < FragAcc::num_elements; ++e) {
            const int r = kTr * wr + 16 * m + wmma_fa::acc_row(lane, e);
            const int c = kTc * wc + 16 * n + wmma_fa::acc_col(lane, e);
            const ScoreGrad g = score_grad(p, seq, b, h, slope, i0 + r, j0 + c, sc[m][n].x[e],
                                           dp[m][n].x[e], lse[r], dsum[r]);
            sc[m][n].x[e] = g.prob;
            dp[m][n].x[e] = g.ds;
          }
        }
      }
    }
    // P and dS to shared memory, rounded to T: elements 2w and 2w + 1 are one row's two
    // adjacent keys.
#pragma unroll
    for (int m = 0; m < kMs; ++m) {
#pragma unroll
      for (int n = 0; n < kNs; ++n) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const int r = kTr * wr + 16 * m + wmma_fa::acc_row(lane, 2 * w);
          const int c = kTc * wc + 16 * n + wmma_fa::acc_col(lane, 2 * w);
          *reinterpret_cast<uint32_t*>(ps + r * S::kLp + c) =
              wmma_fa::pack2(T(), sc[m][n].x[2 * w], sc[m][n].x[2 * w + 1]);
          *reinterpret_cast<uint32_t*>(dss + r * S::kLp + c) =
              wmma_fa::pack2(T(), dp[m][n].x[2 * w], dp[m][n].x[2 * w + 1]);
        }
      }
    }
    __syncthreads();  // P and dS complete

    // dV += P^T dO and dK += dS^T Q for the warp's kTk keys x D/2 columns, over the step's
    // rows.
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      FragA<T> pa[kMk], da[kMk];
#pragma unroll
      for (int m = 0; m < kMk; ++m) {
        const int at = kk * 16 * S::kLp + kTk * wk + 16 * m;
        wmma_fa::load_a_col(pa[m], ps + at, S::kLp, lane);
        wmma_fa::load_a_col(da[m], dss + at, S::kLp, lane);
      }
#pragma unroll
      for (int n = 0; n < kNk; ++n) {
        const int at = kk * 16 * S::kLd + (D / 2) * wd + 16 * n;
        FragBRow<T> x;
        wmma_fa::load_b_row(x, dos + at, S::kLd, lane);
#pragma unroll
        for (int m = 0; m < kMk; ++m) {
          wm::mma_sync(dv[m][n], pa[m], x, dv[m][n]);
        }
        wmma_fa::load_b_row(x, qs + at, S::kLd, lane);
#pragma unroll
        for (int m = 0; m < kMk; ++m) {
          wm::mma_sync(dk[m][n], da[m], x, dk[m][n]);
        }
      }
    }

    if constexpr (kBuffers == 1) {
      __syncthreads();  // Q, dO and the row statistics are read
      fetch_next(s);
    }

    // dQ = dS K for the warp's kTr rows x D/kSc columns, over the block's keys, added to the
    // rows' accumulators.
    FragAcc dq[kMq][kNq];
#pragma unroll
    for (int m = 0; m < kMq; ++m) {
#pragma unroll
      for (int n = 0; n < kNq; ++n) {
        wm::fill_fragment(dq[m][n], 0.f);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      FragA<T> a[kMq];
#pragma unroll
      for (int m = 0; m < kMq; ++m) {
        wmma_fa::load_a(a[m], dss + (kTr * wr + 16 * m) * S::kLp + kk * 16, S::kLp, lane);
      }
#pragma unroll
      for (int n = 0; n < kNq; ++n) {
        FragBRow<T> x;
        wmma_fa::load_b_row(x, ks + kk * 16 * S::kLd + (D / kSc) * wc + 16 * n, S::kLd, lane);
#pragma unroll
        for (int m = 0; m < kMq; ++m) {
          wm::mma_sync(dq[m][n], a[m], x, dq[m][n]);
        }
      }
    }
    const int64_t valid = min(int64_t(kRows), seq.seq_q - i0);
    float* acc = dq_acc + (lse_row0(h) + i0) * D;
#pragma unroll
    for (int m = 0; m < kMq; ++m) {
#pragma unroll
      for (int n = 0; n < kNq; ++n) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {  // elements 2w and 2w + 1: one row, two adjacent columns
          const int r = kTr * wr + 16 * m + wmma_fa::acc_row(lane, 2 * w);
          const int c = (D / kSc) * wc + 16 * n + wmma_fa::acc_col(lane, 2 * w);
          if (r < valid && c < p.head_dim) {
            add_pair(acc + int64_t(r) * D + c, dq[m][n].x[2 * w], dq[m][n].x[2 * w + 1]);
          }
        }
      }
    }
  }
  __pipeline_wait_prior(0);  // K and V's copies when no step ran

  // dK and dV leave through K and V's space (f32 rows of kLq), one after the other.
  float* stage = reinterpret_cast<float*>(smem);
  const auto store = [&](const FragAcc (&acc)[kMk][kNk], void* t, const int64_t (&stride)[3]) {
    __syncthreads();  // the stage is free (K, V, or the previous gradient, are read)
#pragma unroll
    for (int m = 0; m < kMk; ++m) {
#pragma unroll
      for (int n = 0; n < kNk; ++n) {
        wm::store_matrix_sync(stage + (kTk * wk + 16 * m) * S::kLq + (D / 2) * wd + 16 * n,
                              acc[m][n], S::kLq, wm::mem_row_major);
      }
    }
    __syncthreads();
    T* out = token_row(static_cast<T*>(t), stride, seq.entry, kt, kvh);
    for (int e = threadIdx.x; e < kKeys * D; e += kThreads) {
      const int r = e / D, c = e % D;
      if (r < keys && c < p.head_dim) {
        out[r * stride[1] + c] = from_float<T>(stage[r * S::kLq + c]);
      }
    }
  };
  store(dk, p.dk, p.dk_stride);
  store(dv, p.dv, p.dv_stride);
}

}  // namespace flashcore::backward::wide
