// flashcore's Hopper (sm_90a) backward key-block kernel: the algorithm of ../kernel.cuh
// (FlashAttention-2's backward, one block per key block) on warpgroup MMAs (wgmma) fed by TMA.
//
// One block per (128 keys, kv head, batch entry), three warpgroups:
// - warpgroup 0 loads: K and V once (TMA, one barrier), then for each query step (every query
//   head of the kv head's group, every 64-row step whose rows see the block's keys: ../kernel.cuh
//   StepWalk) Q and dO into one of two stages (a PipelineTmaAsync);
// - warpgroups 1 and 2 compute, each for its 64 keys (w = 0, 1), per step:
//     S^T = K_w Q^T and dP^T = V_w dO^T   (wgmma from shared memory; 64 keys x 64 rows each)
//     P^T = exp2(S^T scale log2(e) - lse log2(e)), dS^T = P^T (dP^T - D) scale   (registers)
//     dV_w += P^T dO and dK_w += dS^T Q   (wgmma with A from registers: the accumulator layout
//                                          of S^T is the A operand's)
//   and, once both warpgroups have written their dS^T to shared memory (as dS, rows contiguous),
//     dQ[:, half w] = dS K[:, half w]     (64 rows x D/2 columns over the block's 128 keys)
//   added to the rows' f32 accumulators with float2 atomics. The step's logsumexps and row sums
//   reach shared memory a step ahead (threads 0-127 of the computing warpgroups load one each
//   during the previous step), off the step's path (docs/BACKWARD.md, session 69).
// K, Q and dO are each read by two products in two roles (the K-major operand of one, the
// MN-major operand of another): Config's layouts give one byte layout both views.
//
// Covered (core::plan_backward): a dense batch, f16 or bf16, head dims up to 128 in multiples of
// 8 (TMA: 16-byte rows), strides in multiples of 8 elements and 16-byte aligned bases, causal or
// windowed masks with either alignment, GQA and MQA; not the score modifiers (a softcap, ALiBi,
// a bias) or variable lengths, which take the WMMA kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backward/kernel.cuh"
#include "collective/fmha_common.hpp"  // CUTLASS examples/88_hopper_fmha: make_acc_into_op
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "fast_math.cuh"
#include "tma.h"

namespace flashcore::backward::sm90 {

// The kernel's tiles and shared-memory layouts for element T (cutlass::half_t or bfloat16_t)
// at head-dim tier D (64 or 128).
template <class T, int D>
struct Config {
  static_assert(D == 64 || D == 128, "head-dim tiers 64 and 128");
  static constexpr int kRows = 64;     // query rows per step
  static constexpr int kWgKeys = 64;   // keys per computing warpgroup
  static constexpr int kWarpGroups = 2;
  static constexpr int kKeys = kWgKeys * kWarpGroups;
  static constexpr int kStages = 2;    // Q / dO stages
  static constexpr int kThreads = (kWarpGroups + 1) * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kHalf = D / 2;  // dQ columns per warpgroup

  // Swizzle atoms D / 2 elements wide, so that each half of K's columns (dQ's B operand of a
  // warpgroup) is a whole column of atoms.
  using AtomK = std::conditional_t<D == 128, cute::GMMA::Layout_K_SW128_Atom<T>,
                                   cute::GMMA::Layout_K_SW64_Atom<T>>;
  using AtomMN = std::conditional_t<D == 128, cute::GMMA::Layout_MN_SW128_Atom<T>,
                                    cute::GMMA::Layout_MN_SW64_Atom<T>>;
  using Rows = cute::Int<kRows>;
  using WgKeys = cute::Int<kWgKeys>;
  using Dim = cute::Int<D>;
  using Half = cute::Int<kHalf>;

  // K and V: (keys, D, warpgroup), rows of D elements (the K-major A operand of S^T and dP^T).
  using LayoutKV =
      decltype(cute::tile_to_shape(AtomK{}, cute::Shape<WgKeys, Dim, cute::_2>{}));
  // One warpgroup's half of K's columns in the same bytes, as dQ's B operand (D / 2, keys),
  // MN-major; it starts kHalf * kWgKeys elements into the warpgroup's K for half 1.
  using LayoutKHalf = decltype(cute::tile_to_shape(AtomMN{}, cute::Shape<Half, WgKeys>{},
                                                   cute::Step<cute::_2, cute::_1>{}));
  // Q and dO: (rows, D, stage), the K-major B operand of S^T and dP^T ...
  using LayoutQ = decltype(cute::tile_to_shape(AtomK{}, cute::Shape<Rows, Dim, cute::_2>{}));
  // ... and in the same bytes (D, rows, stage), the MN-major B operand of dK and dV.
  using LayoutQt = decltype(cute::tile_to_shape(AtomMN{}, cute::Shape<Dim, Rows, cute::_2>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{}));
  // dS: (rows, keys, warpgroup, buffer), rows contiguous: dQ's MN-major A operand, which each
  // warpgroup writes from its dS^T accumulator (consecutive rows in a thread's pairs).
  using LayoutDS = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<T>{},
                                                cute::Shape<Rows, WgKeys, cute::_2, cute::_2>{}));

  // S^T, dP^T: M = keys, N = rows, K = D, both operands from shared memory.
  using MmaS = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float, cute::Shape<WgKeys, Rows, Dim>>()));
  // dV, dK: M = keys, N = D, K = rows; A (P^T, dS^T) from registers, B MN-major.
  using MmaKV = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::rs_op_selector<T, T, float, cute::Shape<WgKeys, Dim, Rows>,
                                       cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  // dQ: M = rows, N = D / 2, K = a warpgroup's keys (twice), both MN-major.
  using MmaQ = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<T, T, float, cute::Shape<Rows, Half, WgKeys>,
                                       cute::GMMA::Major::MN, cute::GMMA::Major::MN>()));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  // The bytes one stage receives (Q and dO; rows past the sequence and columns past the head dim
  // arrive as zeros and count) and K and V's.
  static constexpr uint32_t kStageBytes = 2 * kRows * D * sizeof(T);
  static constexpr uint32_t kKeyBytes = 2 * kKeys * D * sizeof(T);

  struct alignas(1024) Storage {
    cute::array_aligned<T, cute::cosize_v<LayoutKV>, 1024> k;
    cute::array_aligned<T, cute::cosize_v<LayoutKV>, 1024> v;
    cute::array_aligned<T, cute::cosize_v<LayoutQ>, 1024> q;
    cute::array_aligned<T, cute::cosize_v<LayoutQ>, 1024> dout;
    cute::array_aligned<T, cute::cosize_v<LayoutDS>, 1024> ds;
    // Per step parity: the step's logsumexps (exp2 units) and row sums, staged by the computing
    // warpgroups one step ahead.
    float stats[2][2][kRows];
    typename Pipeline::SharedStorage pipeline;
    uint64_t keys_in;  // K and V's transaction barrier
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));
  static_assert(kSmemBytes == core::hopper_key_block_smem_bytes(kKeys, kRows, D, kStages),
                "core/backward.h plans this layout");

  // The global tensors of the TMA loads: (token, head dim, batch entry, head).
  using GShape = cute::Shape<int, int, int, int>;
  using GStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GTensor =
      decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<const T*>(nullptr)), GShape{},
                                 GStride{}));
  using TmaRows = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GTensor{},
                                               LayoutQ{}(cute::_, cute::_, cute::_0{})));
  using TmaKeys = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GTensor{},
                                               LayoutKV{}(cute::_, cute::_, cute::_0{})));
};

template <class T, int D>
struct Params {
  BackwardLaunch p;
  const float* sums;  // D_i = dO_i . O_i per logsumexp row (../kernel.cuh row_sums)
  float* dq_acc;      // dQ's f32 accumulator rows, D floats each (zeroed)
  typename Config<T, D>::TmaRows q, dout;
  typename Config<T, D>::TmaKeys k, v;
};

// The TMA view of one [batch, seq, heads, head_dim] operand at `base` (strides in elements; a
// dimension of extent 1 gets a valid one: tma.h).
template <class T>
auto tma_view(const void* base, const int64_t (&stride)[3], int tokens, int head_dim, int batch,
              int heads) {
  using namespace cute;
  return make_tensor(make_gmem_ptr(static_cast<const T*>(base)),
                     make_shape(tokens, head_dim, batch, heads),
                     make_stride(tma_stride(stride[1], tokens), _1{}, tma_stride(stride[0], batch),
                                 tma_stride(stride[2], heads)));
}

template <class T, int D>
__global__ void __launch_bounds__(Config<T, D>::kThreads, 1)
    key_block(CUTLASS_GRID_CONSTANT const Params<T, D> params) {
#if defined(CUTLASS_ARCH_MMA_SM90A_ENABLED)
  using namespace cute;
  using C = Config<T, D>;
  using Pipeline = typename C::Pipeline;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  extern __shared__ char smem[];
  auto& st = *reinterpret_cast<typename C::Storage*>(smem);
  const BackwardLaunch& p = params.p;

  const int warp = cutlass::canonical_warp_idx_sync();
  const int group = cutlass::canonical_warp_group_idx();
  const bool loader = warp == 0 && cute::elect_one_sync();

  typename Pipeline::Params pp;
  pp.transaction_bytes = C::kStageBytes;
  pp.is_leader = loader;
  pp.num_consumers = C::kWarpGroups * cutlass::NumThreadsPerWarpGroup;
  pp.role = group == 0 ? (warp == 0 ? Pipeline::ThreadCategory::Producer
                                    : Pipeline::ThreadCategory::NonParticipant)
                       : Pipeline::ThreadCategory::Consumer;
  Pipeline pipeline(st.pipeline, pp, Shape<_1, _1, _1>{});
  if (loader) {
    Barrier::init(&st.keys_in, 1);
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  const BlockPlace place = block_place<C::kKeys>(p);
  const Seq seq = sequence_of(p, place.b);
  const int group_size = p.heads_q / p.heads_kv;
  const StepWalk<C::kRows> walk(seq, place.j0, C::kKeys, place.kvh, group_size);
  const int b = int(seq.entry), kvh = int(place.kvh);
  const int key_tile = int(place.j0 / C::kWgKeys);

  if (group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (!loader) {
      return;
    }
    // K and V (two 64-key tiles each), then Q and dO of every step.
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename C::LayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(st.v.data()), typename C::LayoutKV{});
    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename C::LayoutQ{});
    Tensor sDO = make_tensor(make_smem_ptr(st.dout.data()), typename C::LayoutQ{});
    const auto tile_rows = Shape<Int<C::kRows>, Int<D>>{};
    Barrier::arrive_and_expect_tx(&st.keys_in, C::kKeyBytes);
    {
      Tensor mK = params.k.get_tma_tensor(make_shape(p.seq_k, p.head_dim, p.batch, p.heads_kv));
      Tensor mV = params.v.get_tma_tensor(make_shape(p.seq_k, p.head_dim, p.batch, p.heads_kv));
      Tensor gK = local_tile(mK(_, _, b, kvh), tile_rows, make_coord(_, _0{}));
      Tensor gV = local_tile(mV(_, _, b, kvh), tile_rows, make_coord(_, _0{}));
      auto tk = params.k.get_slice(_0{});
      auto tv = params.v.get_slice(_0{});
      Tensor srcK = tk.partition_S(gK);
      Tensor dstK = tk.partition_D(sK);
      Tensor srcV = tv.partition_S(gV);
      Tensor dstV = tv.partition_D(sV);
      for (int w = 0; w < C::kWarpGroups; ++w) {
        copy(params.k.with(st.keys_in), srcK(_, _, _, key_tile + w), dstK(_, _, _, w));
        copy(params.v.with(st.keys_in), srcV(_, _, _, key_tile + w), dstV(_, _, _, w));
      }
    }
    Tensor mQ = params.q.get_tma_tensor(make_shape(p.seq_q, p.head_dim, p.batch, p.heads_q));
    Tensor mDO =
        params.dout.get_tma_tensor(make_shape(p.seq_q, p.head_dim, p.batch, p.heads_q));
    auto tq = params.q.get_slice(_0{});
    auto tdo = params.dout.get_slice(_0{});
    Tensor dstQ = tq.partition_D(sQ);
    Tensor dstDO = tdo.partition_D(sDO);
    auto write = cutlass::make_producer_start_state<Pipeline>();
    auto at = walk.start;
    for (int64_t s = 0; s < walk.count; ++s, at = walk.next(at)) {
      const int h = int(at.h), tile = int(at.i0 / C::kRows);
      Tensor srcQ = tq.partition_S(local_tile(mQ(_, _, b, h), tile_rows, make_coord(_, _0{})));
      Tensor srcDO =
          tdo.partition_S(local_tile(mDO(_, _, b, h), tile_rows, make_coord(_, _0{})));
      pipeline.producer_acquire(write);
      auto* full = pipeline.producer_get_barrier(write);
      copy(params.q.with(*full), srcQ(_, _, _, tile), dstQ(_, _, _, write.index()));
      copy(params.dout.with(*full), srcDO(_, _, _, tile), dstDO(_, _, _, write.index()));
      ++write;
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<240>();
  const int w = group - 1;                           // this warpgroup's 64 keys
  const int t = int(threadIdx.x) % cutlass::NumThreadsPerWarpGroup;
  const int64_t j0 = place.j0 + int64_t(w) * C::kWgKeys;  // its first key

  typename C::MmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(t);
  Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename C::LayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(st.v.data()), typename C::LayoutKV{});
  Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename C::LayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(st.dout.data()), typename C::LayoutQ{});
  Tensor fK = thr_s.make_fragment_A(thr_s.partition_A(sK(_, _, w)));
  Tensor fV = thr_s.make_fragment_A(thr_s.partition_A(sV(_, _, w)));
  Tensor fQ = thr_s.make_fragment_B(thr_s.partition_B(sQ));
  Tensor fDO = thr_s.make_fragment_B(thr_s.partition_B(sDO));

  typename C::MmaKV mma_kv;
  auto thr_kv = mma_kv.get_thread_slice(t);
  Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename C::LayoutQt{});
  Tensor sDOt = make_tensor(make_smem_ptr(st.dout.data()), typename C::LayoutQt{});
  Tensor fQt = thr_kv.make_fragment_B(thr_kv.partition_B(sQt));
  Tensor fDOt = thr_kv.make_fragment_B(thr_kv.partition_B(sDOt));

  typename C::MmaQ mma_q;
  auto thr_q = mma_q.get_thread_slice(t);
  Tensor sDS = make_tensor(make_smem_ptr(st.ds.data()), typename C::LayoutDS{});
  Tensor fDS = thr_q.make_fragment_A(thr_q.partition_A(sDS));  // (.., .., .., wg, buffer)
  // Half w of K's columns, for each warpgroup's 64 keys u (cosize of a (64, D) slice apart).
  constexpr int kKeyTileElements = C::kWgKeys * D;
  Tensor sKh0 = make_tensor(make_smem_ptr(st.k.data() + w * C::kHalf * C::kWgKeys),
                            typename C::LayoutKHalf{});
  Tensor sKh1 = make_tensor(
      make_smem_ptr(st.k.data() + kKeyTileElements + w * C::kHalf * C::kWgKeys),
      typename C::LayoutKHalf{});
  Tensor fKh0 = thr_q.make_fragment_B(thr_q.partition_B(sKh0));
  Tensor fKh1 = thr_q.make_fragment_B(thr_q.partition_B(sKh1));

  // (key, row) of each S^T element this thread holds, (row, column) of each dQ element, and
  // (key, column) of each dK / dV element.
  Tensor cS = thr_s.partition_C(make_identity_tensor(Shape<Int<C::kWgKeys>, Int<C::kRows>>{}));
  Tensor cQ = thr_q.partition_C(make_identity_tensor(Shape<Int<C::kRows>, Int<C::kHalf>>{}));
  Tensor cKV = thr_kv.partition_C(make_identity_tensor(Shape<Int<C::kWgKeys>, Int<D>>{}));

  Tensor acc_dk = partition_fragment_C(mma_kv, Shape<Int<C::kWgKeys>, Int<D>>{});
  Tensor acc_dv = partition_fragment_C(mma_kv, Shape<Int<C::kWgKeys>, Int<D>>{});
  clear(acc_dk);
  clear(acc_dv);
  mma_kv.accumulate_ = GMMA::ScaleOut::One;

  // A thread's S^T / dP^T elements (wgmma's m64nNk16 f32 accumulator: element e = c + 2 m +
  // 4 n is key row 8 m + the thread's, query column 8 n + c + the thread's): the query rows
  // it holds are kSlots, slot c + 2 n, each in elements with m = 0 and 1.
  constexpr int kElements = decltype(size(partition_fragment_C(
      mma_s, Shape<Int<C::kWgKeys>, Int<C::kRows>>{})))::value;
  constexpr int kSlots = kElements / 2;
  const auto slot_of = [](int e) { return e % 2 + 2 * (e / 4); };
  const auto element_of = [](int k) { return k % 2 + 4 * (k / 2); };
  const float scale = p.scale, scale_log2 = p.scale * kLog2e;
  // The statistic this thread stages for each step (threads 0-63 of the computing warpgroups:
  // the logsumexp of row tc in exp2 units, +inf past the sequence and where the row saw no key,
  // so that P = 0; threads 64-127: the row sum of row tc - 64, 0 past the sequence), loaded a
  // step ahead without a branch (rows past the sequence read its first).
  const int tc = int(threadIdx.x) - cutlass::NumThreadsPerWarpGroup;
  const bool stager = tc < 2 * C::kRows;
  const int stat_row = tc % C::kRows, stat_kind = tc / C::kRows;
  using Step = typename StepWalk<C::kRows>::Step;
  const auto load_stat = [&](Step at) {
    const bool in = at.i0 + stat_row < seq.seq_q;
    const int64_t row = seq.row0 + at.h * seq.rows + at.i0 + (in ? stat_row : 0);
    const float v = __ldg((stat_kind == 0 ? p.lse : params.sums) + row);
    return stat_kind == 0 ? (in && v != -INFINITY ? v * kLog2e : INFINITY) : (in ? v : 0.f);
  };
  if (stager && walk.count > 0) {
    st.stats[0][stat_kind][stat_row] = load_stat(walk.start);
  }
  cutlass::arch::NamedBarrier::sync(C::kWarpGroups * cutlass::NumThreadsPerWarpGroup, 1);
  Barrier::wait(&st.keys_in, 0);
  typename Pipeline::PipelineState read;
  auto at = walk.start;
  for (int64_t s = 0; s < walk.count; ++s, at = walk.next(at)) {
    const int64_t h = at.h, i0 = at.i0;
    const int buf = int(s % 2);
    pipeline.consumer_wait(read);
    const int stage = read.index();

    Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<C::kWgKeys>, Int<C::kRows>>{});
    Tensor acc_dp = partition_fragment_C(mma_s, Shape<Int<C::kWgKeys>, Int<C::kRows>>{});
    warpgroup_fence_operand(acc_s);
    warpgroup_fence_operand(acc_dp);
    warpgroup_arrive();
    cutlass::fmha::collective::gemm_zero_acc(mma_s, fK, fQ(_, _, _, stage), acc_s);
    warpgroup_commit_batch();
    cutlass::fmha::collective::gemm_zero_acc(mma_s, fV, fDO(_, _, _, stage), acc_dp);
    warpgroup_commit_batch();

    // The next step's statistic, on its way while this step runs.
    const bool stage_next = stager && s + 1 < walk.count;
    const float next_stat = stage_next ? load_stat(walk.next(at)) : 0.f;
    // The logsumexps of this thread's rows.
    const int64_t row0 = seq.row0 + h * seq.rows + i0;
    float stat[kSlots];
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kSlots; ++k) {
      stat[k] = st.stats[buf][0][get<1>(cS(element_of(k)))];
    }
    // Whether every (key, row) of the tile is visible: its keys exist and lie inside the band.
    const int64_t gap_hi = j0 + C::kWgKeys - 1 - i0, gap_lo = j0 - (i0 + C::kRows - 1);
    const bool full = j0 + C::kWgKeys <= seq.seq_k && (!seq.has_hi || gap_hi <= seq.hi) &&
                      (!seq.has_lo || gap_lo >= seq.lo);

    warpgroup_wait<1>();  // S^T
    warpgroup_fence_operand(acc_s);
    if (full) {
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < kElements; ++e) {
        acc_s(e) = fast_exp2(acc_s(e) * scale_log2 - stat[slot_of(e)]);
      }
    } else {
      // Key j0 + kk is visible to row i0 + r when kk < keys and lo <= kk - r <= hi, the bounds
      // taken relative to j0 - i0 and clamped to +-128 (|kk - r| < 64), so 32 bits suffice.
      const int64_t base = j0 - i0;
      const auto clamp = [](int64_t x) { return int(max<int64_t>(-128, min<int64_t>(128, x))); };
      const int keys = clamp(seq.seq_k - j0);
      const int hi = seq.has_hi ? clamp(seq.hi - base) : 128;
      const int lo = seq.has_lo ? clamp(seq.lo - base) : -128;
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < kElements; ++e) {
        const int kk = get<0>(cS(e)), gap = kk - get<1>(cS(e));
        const float prob = fast_exp2(acc_s(e) * scale_log2 - stat[slot_of(e)]);
        acc_s(e) = kk < keys && gap <= hi && gap >= lo ? prob : 0.f;
      }
    }
    // The row sums D_i.
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kSlots; ++k) {
      stat[k] = st.stats[buf][1][get<1>(cS(element_of(k)))];
    }
    warpgroup_wait<0>();  // dP^T
    warpgroup_fence_operand(acc_dp);
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < kElements; ++e) {
      acc_dp(e) = acc_s(e) * (acc_dp(e) - stat[slot_of(e)]) * scale;
    }
    // P^T and dS^T in T, as the A operands of dV += P^T dO and dK += dS^T Q (for 16-bit types
    // element e of either is element e of the accumulator).
    Tensor op_p = cutlass::fmha::collective::make_acc_into_op<T>(
        acc_s, typename C::MmaKV::LayoutA_TV{});
    Tensor op_ds = cutlass::fmha::collective::make_acc_into_op<T>(
        acc_dp, typename C::MmaKV::LayoutA_TV{});
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(op_p);
    warpgroup_fence_operand(op_ds);
    warpgroup_arrive();
    cute::gemm(mma_kv, op_p, fDOt(_, _, _, stage), acc_dv);
    warpgroup_commit_batch();
    cute::gemm(mma_kv, op_ds, fQt(_, _, _, stage), acc_dk);
    warpgroup_commit_batch();

    // dS (rows x this warpgroup's keys) into buffer `buf`, a thread's pairs of adjacent rows
    // in one 4-byte store: the other buffer may still feed the other warpgroup's dQ of the
    // previous step.
    Tensor ds = make_tensor(op_ds.data(), acc_dp.layout());
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < kElements; e += 2) {
      T* at = &sDS(get<1>(cS(e)), get<0>(cS(e)), w, buf);
      T pair[2] = {ds(e), ds(e + 1)};
      *reinterpret_cast<uint32_t*>(at) = *reinterpret_cast<const uint32_t*>(pair);
    }
    // The next step's statistics into the other parity: its last readers were the previous
    // step's, before that step's barrier; its next ones come after this step's.
    if (stage_next) {
      st.stats[buf ^ 1][stat_kind][stat_row] = next_stat;
    }
    cutlass::arch::fence_view_async_shared();  // dS visible to the wgmma (async proxy)
    cutlass::arch::NamedBarrier::sync(C::kWarpGroups * cutlass::NumThreadsPerWarpGroup, 1);

    Tensor acc_dq = partition_fragment_C(mma_q, Shape<Int<C::kRows>, Int<C::kHalf>>{});
    warpgroup_fence_operand(acc_dq);
    warpgroup_arrive();
    cutlass::fmha::collective::gemm_zero_acc(mma_q, fDS(_, _, _, 0, buf), fKh0, acc_dq);
    cute::gemm(mma_q, fDS(_, _, _, 1, buf), fKh1, acc_dq);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dq);
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(acc_dv);
    pipeline.consumer_release(read);  // Q and dO of this stage are read
    ++read;

    // This warpgroup's half of the step's dQ rows, added to their accumulators (pairs of
    // adjacent columns), addressed from the thread's first element (the others lie at offsets
    // known at compile time).
    const int r0 = get<0>(cQ(0)), c0 = get<1>(cQ(0));
    float* dq = params.dq_acc + (row0 + r0) * D + w * C::kHalf + c0;
    const int64_t rows_left = seq.seq_q - (i0 + r0);
    CUTLASS_PRAGMA_UNROLL
    for (int e = 0; e < size(acc_dq); e += 2) {
      const int dr = get<0>(cQ(e)) - r0, dc = get<1>(cQ(e)) - c0;
      if (dr < rows_left) {
        add_pair(dq + dr * D + dc, acc_dq(e), acc_dq(e + 1));
      }
    }
  }

  // dK and dV of this warpgroup's keys (columns past the head dim are zero and not stored).
  T* dk = token_row(static_cast<T*>(p.dk), p.dk_stride, seq.entry, seq.k0 + j0, place.kvh);
  T* dv = token_row(static_cast<T*>(p.dv), p.dv_stride, seq.entry, seq.k0 + j0, place.kvh);
  CUTLASS_PRAGMA_UNROLL
  for (int e = 0; e < size(acc_dk); ++e) {
    const int kk = get<0>(cKV(e)), c = get<1>(cKV(e));
    if (j0 + kk < seq.seq_k && c < p.head_dim) {
      dk[int64_t(kk) * p.dk_stride[1] + c] = static_cast<T>(acc_dk(e));
      dv[int64_t(kk) * p.dv_stride[1] + c] = static_cast<T>(acc_dv(e));
    }
  }
#endif
}

}  // namespace flashcore::backward::sm90
