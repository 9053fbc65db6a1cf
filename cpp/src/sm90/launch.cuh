// Launcher for flashcore's Hopper kernel (kernel.cuh): FmhaArgs -> problem shape, CuTe strides,
// TMA descriptors (built on the host by CUTLASS through the driver entry point), grid, launch.
// A variable-length batch's descriptors cover its packed tokens as one batch entry; the kernel
// moves each sequence's loads and stores to its first tokens. A paged cache's K and V have
// descriptors of their own, over the pages (pages.cuh).
//
// Each file in instances/ (one per dtype x tile x role of instances.inc) instantiates
// `launch_sm90<T, Q, K, D, FLAGS>` once (FLAGS: the role's kernel.cuh ScheduleFlags, from
// schedules.h); a Hopper kernel takes about a minute and 2.5 GB to compile.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "../check.h"
#include "../device_limits.h"
#include "../launcher.h"
#include "../programmatic.h"
#include "../smem.h"
#include "sm90/kernel.cuh"
#include "sm90/schedules.h"
#include "split/combine.cuh"

namespace flashcore::sm90 {

// The multiprocessor count of the current device (persistent grids).
inline int sm_count() { return device_limits().sms; }

// A dimension of extent 1 is never stepped over, so validation leaves its stride free; a TMA
// descriptor still needs every stride to be a multiple of 16 bytes. Give such dimensions one.
inline int64_t tma_stride(int64_t stride, int64_t extent) { return extent == 1 ? 8 : stride; }

// Whether a call needs a tile's modifier schedule (a softcap or ALiBi) or its bias schedule (a
// bias, with or without them): the tile's entry routes such calls to it, and the other schedules
// refuse them.
inline bool needs_modifiers(const FmhaArgs& a) {
  return a.softcap > 0.0f || a.alibi_slopes != nullptr;
}
inline bool needs_bias(const FmhaArgs& a) { return a.bias != nullptr; }

// Whether each unit pads its sequence at the start rather than the end (problem.cuh's
// lead_rows): under a causal mask without a window, where the first query block is the
// shortest, and without what indexes rows otherwise (key splits' partial states, packed heads,
// a bias).
inline bool leads_rows(const FmhaArgs& a, int splits) {
  return a.causal != Causal::None && !windowed(a) && splits == 1 && a.packed_group == 0 &&
         !needs_bias(a);
}

template <typename T, int Q, int K, int D, int kFlags>
void launch_sm90(const FmhaArgs& a, cudaStream_t stream) {
  using Kern = Kernel<T, Q, K, D, kFlags>;
  if (a.head_dim > D || a.head_dim % 8 != 0) {
    throw detail::Failure(Code::Launch, "",
                          "sm90 kernel: head dim " + std::to_string(a.head_dim) +
                              " is not a multiple of 8 up to " + std::to_string(D));
  }
  if (needs_modifiers(a) && !Kern::kModifiers) {
    throw detail::Failure(Code::Launch, "",
                          "sm90 kernel: a softcap or ALiBi needs the modifier schedule");
  }
  if (needs_bias(a) && !Kern::kBias) {
    throw detail::Failure(Code::Launch, "", "sm90 kernel: a bias needs the bias schedule");
  }
  const bool varlen = a.cu_seqlens_q != nullptr;
  const bool paged = a.block_table != nullptr;
  // Keys per split, whole key tiles; with per-sequence splits, each sequence's own count of them
  // (the table of their first work units).
  const split::KeySplits key_splits = split::key_splits(a, K);
  const int splits = key_splits.count;
  const split::SequenceUnits sequence_units = split::SequenceUnits::make(a);
  // A variable-length batch's packed one-query heads (FmhaArgs::packed_group): a kv head per
  // unit, its rows the group's query heads (head strides apart), the query axis of Q and the
  // output in head strides, token_rows per token.
  const int64_t packed = a.packed_group;
  int64_t q_stride[3], o_stride[3];
  for (int i = 0; i < 3; ++i) {
    q_stride[i] = a.q_stride[i];
    o_stride[i] = a.o_stride[i];
  }
  if (packed > 0) {
    pack_head_rows(q_stride, packed);
    pack_head_rows(o_stride, packed);
  }
  const auto heads =
      packed > 0 ? cute::make_tuple(1, static_cast<int>(a.heads_kv))
                 : cute::make_tuple(static_cast<int>(a.heads_q / a.heads_kv),
                                    static_cast<int>(a.heads_kv));
  // core::Problem's band (validate.h's blind_rows), which a variable-length batch's kernel
  // applies to each sequence's lengths.
  const Band band{a.causal == Causal::TopLeft, a.causal != Causal::None, a.window_left,
                  a.window_right};
  auto problem_of = [&](int64_t batch, int64_t seq_q, int64_t seq_k) {
    return make_problem(static_cast<int>(batch), heads, static_cast<int>(seq_q),
                        static_cast<int>(seq_k), static_cast<int>(a.head_dim), band);
  };
  // The work: the dense batch or the sequences (each times its key splits) up to the longest
  // (seq_q, seq_k); the tensors: the dense batch, or the packed tokens as one batch entry.
  const ProblemShape work = problem_of(sequence_units.units(a.batch, splits),
                                       packed > 0 ? packed : a.seq_q, a.seq_k);
  const int64_t query_extent = packed > 0 ? (a.total_q - 1) * a.token_rows + packed : a.total_q;
  const ProblemShape problem = varlen ? problem_of(1, query_extent, a.total_k) : work;

  // Q, K and V as CuTe strides over (seq, dim, (batch, (group, heads_kv))).
  const int64_t group = cute::get<1, 0>(problem), batch = cute::get<0>(problem);
  auto qo = [&](const int64_t s[3]) {
    const int64_t head = tma_stride(s[2], cute::size<1>(problem));
    return StrideQO{static_cast<int>(tma_stride(s[1], seq_q(problem))), cute::_1{},
                    cute::make_tuple(tma_stride(s[0], batch),
                                     cute::make_tuple(head, tma_stride(head * group, a.heads_kv)))};
  };
  auto kv = [&](const int64_t s[3]) {
    return StrideKV{static_cast<int>(tma_stride(s[1], seq_k(problem))), cute::_1{},
                    cute::make_tuple(tma_stride(s[0], batch),
                                     cute::make_tuple(cute::_0{}, tma_stride(s[2], a.heads_kv)))};
  };
  typename Kern::Mainloop::Arguments mainloop_args{
      static_cast<const T*>(a.q), qo(q_stride), static_cast<const T*>(a.k), kv(a.k_stride),
      static_cast<const T*>(a.v), kv(a.v_stride)};

  typename Kern::Params params{
      problem,
      typename Kern::Mainloop::Params{
          Kern::Mainloop::to_underlying_arguments(problem, mainloop_args, nullptr)},
      typename Kern::Out::Params{static_cast<T*>(a.out), o_stride[1], o_stride[2], o_stride[0],
                                 a.lse, packed > 0 ? packed * a.total_q : seq_q(problem),
                                 packed > 0 ? a.total_q : 1,
                                 static_cast<int>(packed > 0 ? a.token_rows : 1)},
      Kern::Scheduler::make(work, Q, K, sm_count(), splits == 1 ? a.sequence_order : nullptr,
                            /*uniform=*/!varlen && !paged && splits == 1 && packed == 0),
      typename Kern::Sequences{a.cu_seqlens_q, a.cu_seqlens_k, static_cast<int>(a.total_q),
                               static_cast<int>(a.total_k), band, static_cast<int>(packed),
                               static_cast<int>(a.token_rows), leads_rows(a, splits)},
      typename Kern::Splits{},
      typename Kern::Parts{}};
  // Example 88 derives the scale from the head dim; ours is the caller's. With a softcap the
  // scores reach the softmax as tanh(scale * s / cap), and the cap is its scale.
  constexpr double kLog2e = 1.4426950408889634;
  const bool capped = a.softcap > 0.0f;
  const float natural = capped ? a.softcap : a.scale;
  params.mainloop.scale_softmax = natural;
  params.mainloop.scale_softmax_log2 = static_cast<float>(natural * kLog2e);
  if constexpr (Kern::kModifiers) {
    params.mainloop.softcap_in = capped ? a.scale / a.softcap : 0.0f;
    // ALiBi's distance |i + diag - j| from the causal alignment's diagonal (the problem's).
    params.mainloop.alibi_slopes = a.alibi_slopes;
    params.mainloop.alibi_batch_stride = a.alibi_batch_stride;
  }
  if constexpr (Kern::kBias) {
    params.mainloop.bias = BiasParams::make(a);
  }
  // A paged cache: K and V are read through the pages' descriptors (pages.cuh); the dense ones
  // above, built over the same pointers, are never used.
  if (paged) {
    params.mainloop.pages = Kern::Mainloop::Pages::make(a);
  }

  constexpr auto kernel = fmha_sm90_kernel<Kern>;
  ensure_smem_limit<kernel>(Kern::kSmemBytes);
  // A programmatic dependent launch: the grid sets up (barriers, descriptors) while the stream's
  // previous kernel finishes, and waits for it before it touches global memory (kernel.cuh).
  // Layer after layer of a serving step, each call's start then overlaps the last one's end.
  const auto enqueue = [&](const char* what) {
    launch_programmatic(kernel, Kern::Scheduler::grid_shape(params.scheduler),
                        dim3(Kern::kThreads), Kern::kSmemBytes, stream, true, what, params);
  };
  const Tail& tail = params.scheduler.tail;
  if (splits == 1 && tail.tiles == 0) {
    enqueue("launch fmha_sm90_kernel");
    return;
  }
  // Key splits, or the last wave's pieces (rows by work unit: TailRows); merged by the combine.
  const TailRows tail_rows = TailRows::make(params.scheduler, Q);
  const split::Partials parts(a, splits > 1 ? splits : tail.slots, stream,
                              splits > 1 ? 0 : tail_rows.rows(params.scheduler.units));
  params.parts = typename Kern::Parts{parts.out(), parts.lse(), parts.rows()};
  if (splits > 1) {
    params.splits = typename Kern::Splits{splits, static_cast<int>(key_splits.keys),
                                          cutlass::FastDivmod(splits), sequence_units};
  }
  enqueue(splits > 1 ? "launch fmha_sm90_kernel (split keys)"
                     : "launch fmha_sm90_kernel (last wave in pieces)");
  if constexpr (Kern::kTailPieces) {  // the tail's own combine only in the kernels that cut it
    if (splits == 1) {
      parts.combine<T>(a, stream, /*programmatic=*/true, tail_rows);
      return;
    }
  }
  parts.combine<T>(a, stream, /*programmatic=*/true);
}

// The roles' flags: the modifier schedule carries the modifier flag and the bias schedule both;
// a plain or causal schedule carries no bias flag, and the modifier flag only where it is the
// tile's modifier schedule (one kernel then serves both roles). The tile's entry routes a call by
// what it needs; a kernel without a flag refuses a call that needs it.
constexpr bool roles_well_formed() {
  constexpr int kExtras = kFlagModifiers | kFlagBias;
  for (const TileSchedules& s : kTileSchedules) {
    for (int role : {s.plain, s.causal}) {
      if ((role & kFlagBias) != 0 || ((role & kFlagModifiers) != 0 && role != s.modifiers)) {
        return false;
      }
    }
    if ((s.modifiers & kExtras) != kFlagModifiers || (s.bias & kExtras) != kExtras) {
      return false;
    }
  }
  return true;
}
static_assert(roles_well_formed(), "sm90/instances.inc: the modifier schedule has the modifier "
              "flag and the bias schedule both; a plain or causal schedule has no bias flag, and "
              "the modifier flag only as the tile's modifier schedule");

}  // namespace flashcore::sm90

// Each file of instances/ compiles one kernel: `FLASHCORE_SM90_ROLE(T, TAG, Q, K, D, ROLE)`
// instantiates `launch_sm90<T, Q, K, D, FLAGS>` as fmha_sm90_<TAG>_q<Q>_k<K>_d<D>_<ROLE>, FLAGS
// being the tile's schedule for ROLE (plain, causal, modifiers or bias) in instances.inc. The
// file of a tile's plain schedule, `FLASHCORE_SM90_INSTANCE(T, TAG, Q, K, D)`, also defines the
// tile's entry, fmha_sm90_<TAG>_q<Q>_k<K>_d<D> (declared by dispatch.cpp from instances.inc): the
// modifier kernel (`_modifiers.cu`, only where the modifier schedule differs from the plain one)
// for a softcap or ALiBi, the causal kernel (`_causal.cu`, only where the causal schedule differs
// from the plain one) under a causal mask, and otherwise the plain kernel. A bias call runs the
// tile's bias kernel (instances/bias/, built with the `sm90-bias` feature), which dispatch.cpp
// calls directly; the entry's kernels refuse a bias.
#define FLASHCORE_SM90_ROLE(T, TAG, Q, K, D, ROLE)                                               \
  namespace flashcore::sm90 {                                                                    \
  static_assert(Kernel<T, Q, K, D, schedules_of(Q, K, D).ROLE>::kSmemBytes ==                    \
                    sm90_smem_bytes(Tile{Q, K, D}),                                              \
                "flashcore/plan.h sm90_smem_bytes disagrees with cpp/src/sm90/kernel.cuh");      \
  void fmha_sm90_##TAG##_q##Q##_k##K##_d##D##_##ROLE(const FmhaArgs& args,                       \
                                                      cudaStream_t stream) {                     \
    launch_sm90<T, Q, K, D, schedules_of(Q, K, D).ROLE>(args, stream);                           \
  }                                                                                              \
  }

#define FLASHCORE_SM90_INSTANCE(T, TAG, Q, K, D)                                                 \
  FLASHCORE_SM90_ROLE(T, TAG, Q, K, D, plain)                                                    \
  namespace flashcore::sm90 {                                                                    \
  void fmha_sm90_##TAG##_q##Q##_k##K##_d##D##_causal(const FmhaArgs&, cudaStream_t);             \
  void fmha_sm90_##TAG##_q##Q##_k##K##_d##D##_modifiers(const FmhaArgs&, cudaStream_t);          \
  void fmha_sm90_##TAG##_q##Q##_k##K##_d##D(const FmhaArgs& args, cudaStream_t stream) {         \
    constexpr TileSchedules kSchedules = schedules_of(Q, K, D);                                  \
    if constexpr (kSchedules.modifiers != kSchedules.plain) {                                    \
      if (needs_modifiers(args)) {                                                               \
        return fmha_sm90_##TAG##_q##Q##_k##K##_d##D##_modifiers(args, stream);                   \
      }                                                                                          \
    }                                                                                            \
    if constexpr (kSchedules.causal != kSchedules.plain) {                                       \
      if (args.causal != Causal::None && !needs_modifiers(args)) {                               \
        return fmha_sm90_##TAG##_q##Q##_k##K##_d##D##_causal(args, stream);                      \
      }                                                                                          \
    }                                                                                            \
    fmha_sm90_##TAG##_q##Q##_k##K##_d##D##_plain(args, stream);                                  \
  }                                                                                              \
  }
