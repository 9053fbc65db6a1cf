// flashcore's consumer loop for the Hopper kernel: example 88's collective (its types, TMA loads
// and shared-memory layouts) with our own `compute`, in one of two orders, with or without lazy
// rescaling (template flags, chosen per tile by kernel.cuh's ScheduleFlags).
//
// Serial order (example 88's): issue QK(j), wait for it and for P.V(j-1), run the softmax of tile
// j, rescale O, issue P.V(j). Each warpgroup's tensor-core work waits through its own softmax
// unless the other warpgroups fill it.
//
// Overlapped order (kOverlap, FlashAttention-3's intra-warpgroup pipelining): issue QK(j), rescale
// O for tile j-1 while it runs, issue P.V(j-1), wait for QK(j) only, and run the softmax of tile j
// while P.V(j-1) is still in flight. Two score tiles live in registers at once (S of tile j in
// f32, P of tile j-1 in 16 bits). Measured (docs/HOPPER.md, round 3): a tie at d = 64 and 3-8%
// slower at d = 128 and 256 than example 88's loop; with lazy rescaling, the d = 256 row (round 4).
//
// With kTurns (turns.cuh), the warpgroups take turns issuing each tile's products: in the
// overlapped order QK(j), the rescale of O and P.V(j-1); in the serial order P.V(j-1) and QK(j).
//
// Pipeline order is the producer's: K0 V0 K1 V1 ... (one stage each). Each consumer thread
// releases every stage once, after the product that read it has completed.
#pragma once

#include "collective/fmha_collective_tma_warpspecialized.hpp"  // CUTLASS examples/88_hopper_fmha
#include "collective/fmha_common.hpp"
#include "cute/tensor.hpp"
#include "fast_math.cuh"
#include "sm90/bias.cuh"
#include "sm90/mask.cuh"
#include "sm90/pages.cuh"
#include "sm90/rows.cuh"
#include "sm90/turns.cuh"

namespace flashcore::sm90 {

// kLazyRescale: a row keeps its running max until a tile raises it by more than 2^8 (in exp2
// units), so O and the row sum are rescaled only then, once per warp for all its rows; the
// probabilities of a tile stay below 2^8, well inside f16, bf16 and f32 (FlashAttention-4's
// conditional rescaling).
//
// kModifiers: the score modifiers, each where the call has it (a uniform branch per tile), before
// the mask and the max:
// - a softcap: each score becomes tanh(scale * score / cap), and the softmax's scale is cap
//   (log2(e) * cap in exp2 units), so the exponents are those of cap * tanh(scale * score / cap)
//   with one multiply per score fewer (the launcher sets Params' softcap factor and scales);
//   tanh is monotonic, so the max is the same key's either way;
// - ALiBi: each score of query row i and key j gains -slope * |i + diag - j| (natural units,
//   after the scale and any softcap), divided by the softmax's natural scale to stay in the
//   scores' units. A thread's distances differ from its first element's by constants known at
//   compile time, so where all of a tile's distances of a thread have one sign (every tile that
//   the diagonal does not cross) a score takes one FMA by its constant, and the thread's first
//   distance times the factor is a shift that its rows' max and exponents add once per row.
//   So does every tile where no visible key lies right of the diagonal (a causal mask without
//   a window's right side: the mask replaces the scores of the others); elsewhere, on the
//   diagonal's tiles, the absolute value costs an add and an FMA per score;
// - with kBias, an additive bias (bias.cuh), likewise divided by the natural scale (one FMA per
//   score).
// Where a quotient could overflow (a tiny scale or cap, a huge slope), the unit instead takes
// its scores to exp2 units first and adds both in them (a multiply more per score), and runs its
// softmax with a scale of 1.
template <class Base, bool kOverlap, bool kLazyRescale, bool kTurns, bool kModifiers = false,
          bool kBias = false>
struct ConsumerLoop : Base {
  using typename Base::Element;
  using typename Base::MainloopPipeline;
  using typename Base::MainloopPipelineQ;
  using typename Base::PipelineState;
  using typename Base::PipelineStateQ;
  using typename Base::SharedStorage;
  using typename Base::SmemLayoutK;
  using typename Base::SmemLayoutQ;
  using typename Base::SmemLayoutV;
  using typename Base::TiledMmaPV;
  using typename Base::TiledMmaQK;
  using typename Base::TileShape;
  using typename Base::TileShapePV;
  using typename Base::TileShapeQK;
  using Turns = IssueTurns<Base::NumMmaWarpGroups, kTurns>;
  using Pages = PagedKV<Element, SmemLayoutK, SmemLayoutV, int(cute::get<1>(TileShapeQK{})),
                        int(cute::get<2>(TileShapeQK{}))>;

  // Example 88's parameters, the modifiers' and a paged cache's: scores s become
  // tanh(softcap_in * s) where softcap_in is not 0; ALiBi slopes (float [batch or 1, heads_q],
  // row stride alibi_batch_stride; null for none), whose distance is measured from the problem's
  // diagonal; an additive bias (null pointer: none); K and V in pages where pages.table is not
  // null (pages.cuh).
  struct Params : Base::Params {
    float softcap_in = 0.f;
    const float* alibi_slopes = nullptr;
    int64_t alibi_batch_stride = 0;
    BiasParams bias{};
    typename Pages::Params pages{};
  };

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    Base::prefetch_tma_descriptors(params);
    Pages::prefetch(params.pages);
  }

  // A work unit's additive terms: ALiBi's per unit of distance (0: none) and the bias's factor
  // (0: none), in the scores' units where `to_log2` is 0, else in exp2 units, `to_log2` being
  // the factor that takes the scores there. `left_of_diagonal`: no key right of ALiBi's diagonal
  // is visible to any row (a causal mask without a window's right side: j - i <= causal_offset
  // <= diagonal), so every visible distance i + diagonal - j is at least 0.
  struct Factors {
    float alibi = 0.f;
    float bias = 0.f;
    float to_log2 = 0.f;
    bool left_of_diagonal = false;
  };

  // The unit's factors: -slope and 1 over the softmax's natural scale, in the scores' units,
  // while ALiBi's times the largest distance (below seq_q + seq_k) stays below 2^100 and the
  // bias's below 2^24 (a bias of up to 2^100 then stays finite); else exp2 units (a NaN slope
  // takes them too, and gives NaN rows as documented).
  template <class BlkCoord, class ProblemShape>
  CUTLASS_DEVICE static Factors factors_for(BlkCoord const& blk, Params const& params,
                                            ProblemShape const& problem) {
    const bool alibi = params.alibi_slopes != nullptr, biased = kBias && params.bias.ptr != nullptr;
    if (!kModifiers || !(alibi || biased)) {
      return {};
    }
    const int64_t b = cute::get<2, 0>(blk), h = cute::get<2, 1>(blk);
    const float slope = alibi ? params.alibi_slopes[b * params.alibi_batch_stride + h] : 0.f;
    const float factor = -slope / params.scale_softmax;
    const float bias = biased ? 1.f / params.scale_softmax : 0.f;
    const bool left = causal_offset(problem) <= diagonal(problem);
    if (::fabsf(factor) * float(seq_q(problem) + seq_k(problem)) < 0x1p100f && bias < 0x1p24f) {
      return {factor, bias, 0.f, left};
    }
    return {-slope * kLog2e, biased ? kLog2e : 0.f, params.scale_softmax_log2, left};
  }

  // The max over the 4 lanes of a quad, which hold one accumulator row between them (the wgmma
  // accumulator layout, as mma.sync's: lane 4g + t holds rows g and g + 8 of its warp's 16, at
  // columns 2t, 2t + 1 of every 8).
  CUTLASS_DEVICE static float quad_max(float m) {
    m = ::fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    return ::fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  }

  // The score modifiers on one tile of scores, in place (kModifiers): the softcap where the call
  // has one, then (in exp2 units where the unit's factors are) ALiBi where the unit has slopes,
  // its distance |i + diag - j|, and the bias where the call has one. Returns the shift that
  // every score of this thread still lacks (ALiBi's term of its first element on a tile whose
  // distances have one sign; else 0): the softmax adds it to the thread's row maxima and
  // exponents.
  template <class AccS, class Index, class Bias>
  CUTLASS_DEVICE static float modify_scores(AccS& acc_s, Index const& index, Factors const& f,
                                            Bias& bias, int diag, Params const& params) {
    using namespace cute;
    if (params.softcap_in != 0.f) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        acc_s(i) = fast_tanh(acc_s(i) * params.softcap_in);
      }
    }
    if (f.to_log2 != 0.f) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        acc_s(i) *= f.to_log2;
      }
    }
    // |i + diag - j| of element e: i - j differs from element 0's by a constant per element, so
    // one float add per score.
    const auto first = index(0);
    const int first_diff = get<0>(first) - get<1>(first);
    const float base = float(first_diff + diag);
    auto offset = [&](int e) {  // a compile-time constant once unrolled
      const auto pos = index(e);
      return float(get<0>(pos) - get<1>(pos) - first_diff);
    };
    float shift = 0.f;
    if (f.alibi != 0.f) {
      float lo = 0.f, hi = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        lo = ::fminf(lo, offset(i));
        hi = ::fmaxf(hi, offset(i));
      }
      const bool at_least_0 = f.left_of_diagonal || base + lo >= 0.f;
      if (at_least_0 || base + hi <= 0.f) {
        // |base + c| = sign * (base + c) for every element (left of the diagonal: for every
        // visible one; the mask replaces the others): the constant part per score, the thread's
        // part as its shift.
        const float factor = at_least_0 ? f.alibi : -f.alibi;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
          acc_s(i) = ::fmaf(factor, offset(i), acc_s(i));
        }
        shift = factor * base;
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
          acc_s(i) = ::fmaf(f.alibi, ::fabsf(base + offset(i)), acc_s(i));
        }
      }
    }
    if (kBias && f.bias != 0.f) {
      Tensor s = as_rows(TiledMmaQK{}, acc_s);
      bias.add(s, as_rows(TiledMmaQK{}, index), f.bias);
    }
    return shift;
  }

  // Scores of the unit's tile `j` -> probabilities in place (masked first where `masked`); updates
  // each row's max and sum, and writes the factor that rescales its output into `rescale`.
  // Returns whether any factor differs from 1 (the same in every lane of a warp).
  template <class Fusion, int kRows, class AccS, class Index, class Bias, class ProblemShape>
  CUTLASS_DEVICE static bool softmax(AccS& acc_s, Index& index, int j, bool masked, float scale,
                                     Factors const& factors, Bias& bias, Params const& params,
                                     ProblemShape const& problem, float (&row_max)[kRows],
                                     float (&row_sum)[kRows], float (&rescale)[kRows]) {
    using namespace cute;
    float shift = 0.f;  // the thread's scores' shift (modify_scores)
    if constexpr (kModifiers) {
      shift = modify_scores(acc_s, index, factors, bias, diagonal(problem), params);
    }
    if (masked) {
      Fusion{}.before_softmax(acc_s, index, problem);
    }
    Tensor s = as_rows(TiledMmaQK{}, acc_s);
    static_assert(decltype(size<0>(s))::value == kRows, "one max and sum per accumulator row");
    float tile_max[kRows];
    bool raise = j == 0;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      float m = j == 0 ? -INFINITY : row_max[i];
      if constexpr (kModifiers) {
        float t = -INFINITY;
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < size<1>(s); ++k) {
          t = ::fmaxf(t, s(i, k));
        }
        m = ::fmaxf(m, t + shift);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < size<1>(s); ++k) {
          m = ::fmaxf(m, s(i, k));
        }
      }
      tile_max[i] = quad_max(m);
      // A finite max that grows by more than 2^8 after scaling, or a row that had no max yet.
      raise = raise || (tile_max[i] - row_max[i]) * scale > 8.f || row_max[i] == -INFINITY;
    }
    if constexpr (kLazyRescale) {
      raise = __any_sync(0xffffffffu, raise);
    } else {
      raise = true;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      if (raise) {
        // A row with no visible key so far keeps an offset of 0 so that exp2 stays finite (its
        // probabilities are exp2(-inf) = 0), and its output and sum, still 0, a factor of 1:
        // rows past seq_q, and under a sliding window rows whose first key lies in a later tile.
        const float safe = tile_max[i] == -INFINITY ? 0.f : tile_max[i];
        const float old = row_max[i] == -INFINITY ? safe : row_max[i];
        rescale[i] = j == 0 ? 1.f : fast_exp2((old - safe) * scale);
        row_max[i] = tile_max[i];
      } else {
        rescale[i] = 1.f;
      }
      float offset = (row_max[i] == -INFINITY ? 0.f : row_max[i]) * scale;
      if constexpr (kModifiers) {
        offset -= shift * scale;
      }
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < size<1>(s); ++k) {
        s(i, k) = fast_exp2(::fmaf(s(i, k), scale, -offset));
        sum += s(i, k);
      }
      row_sum[i] = j == 0 ? sum : row_sum[i] * rescale[i] + sum;
    }
    index.data() = index.data() + E<1>{} * get<1>(TileShapeQK{});
    return raise;
  }

  // Multiplies each accumulator row i by factor[i].
  template <class AccMN, int kRows>
  CUTLASS_DEVICE static void scale_rows(AccMN& acc_mn, float const (&factor)[kRows]) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < cute::size<1>(acc_mn); ++k) {
        acc_mn(i, k) *= factor[i];
      }
    }
  }

  // Waits for the V stage at `read` and issues O += P V on it (asynchronously).
  template <class P, class V, class AccO>
  CUTLASS_DEVICE static void issue_pv(MainloopPipeline& pipeline, PipelineState const& read,
                                      TiledMmaPV& mma, P& p, V const& v, AccO& acc_o) {
    using namespace cute;
    pipeline.consumer_wait(read);
    warpgroup_fence_operand(acc_o);
    warpgroup_fence_operand(p);
    warpgroup_arrive();
    cute::gemm(mma, p, v(_, _, _, read.index()), acc_o);
    warpgroup_commit_batch();
  }

  // `state` (a load's init_state) moved `start` tokens along the sequence axis, mode kSeq of the
  // load's global tensor `shape` (Q and K: 0; V, seen as (head_dim, seq_k): 1): a variable-length
  // batch's sequence starts there in the packed tensors. The TMA coordinates move; the
  // descriptor, made for all the tokens, zero-fills rows past the last.
  template <int kSeq, class Load, class State, class Shape>
  CUTLASS_DEVICE static auto at_token(Load const& load, State const& state, Shape const& shape,
                                      int start) {
    using namespace cute;
    auto at = make_coord(0, 0, make_coord(0, make_coord(0, 0)));
    get<kSeq>(at) = start;
    Tensor src = get<0>(state);
    auto offset = load.params.get_tma_tensor(shape).layout()(at);
    return make_tuple(make_tensor(src.data() + offset, src.layout()), get<1>(state));
  }

  // The Q, K and V load states of a unit (example 88's, from the sequence's first tokens on).
  template <class Load, class ProblemShape, class BlkCoord>
  CUTLASS_DEVICE static auto q_state(Load& load, ProblemShape const& problem,
                                     BlkCoord const& blk) {
    using namespace cute;
    return at_token<0>(
        load, load.init_state(_0{}, problem, TileShapeQK{}, blk, Base::NumMmaWarpGroups),
        make_shape(seq_q(problem), get<4>(problem), select<0, 1>(problem)), q_start(problem));
  }
  template <class Load, class ProblemShape, class BlkCoord>
  CUTLASS_DEVICE static auto k_state(Load& load, ProblemShape const& problem, BlkCoord const& blk,
                                     int end) {
    using namespace cute;
    return at_token<0>(load, load.init_state(0, problem, TileShapeQK{}, blk, end),
                       make_shape(seq_k(problem), get<4>(problem), select<0, 1>(problem)),
                       k_start(problem));
  }
  template <class Load, class ProblemShape, class BlkCoord>
  CUTLASS_DEVICE static auto v_state(Load& load, ProblemShape const& problem, BlkCoord const& blk,
                                     int end) {
    using namespace cute;
    return at_token<1>(load, load.init_state(0, problem, TileShapePV{}, blk, end),
                       make_shape(get<4>(problem), seq_k(problem), select<0, 1>(problem)),
                       k_start(problem));
  }

  // The producer's loads for one work unit, in the order the consumers read them (K V K V ...):
  // the K and V tiles from the first the block visits (a sliding window's left side may skip the
  // leading ones) to its trip count, and, unless a warp of its own loads Q (kLoadQ false), the
  // consumers' Q tiles between them, as example 88's load does (which always starts at key tile
  // 0). The cluster is one block, so no load multicasts. `blk` is the unit's coordinate in the
  // tensors: batch entry 0 for a variable-length batch, whose problem gives its first tokens.
  // A paged cache's K and V tiles are loaded by the whole warp (pages.cuh), the others by the
  // elected lane.
  template <bool kLoadQ, class BlkCoord, class ProblemShape, class QStarted>
  CUTLASS_DEVICE void load_kv_maybe_q(int /*block rank in its cluster of one*/, BlkCoord const& blk,
                                      Params const& params, ProblemShape const& problem,
                                      MainloopPipeline& pipeline, PipelineState& write,
                                      MainloopPipelineQ& pipeline_q, PipelineStateQ& write_q,
                                      SharedStorage& storage, QStarted& q_started,
                                      bool wait_for_q) {
    using namespace cute;
    const int first = CausalBandMask{}.get_first_tile(blk, TileShape{}, problem);
    const int end = CausalBandMask{}.get_trip_count(blk, TileShape{}, problem);
    const int lane = cute::elect_one_sync();
    auto q_tile = make_coord_iterator(Int<Base::NumMmaWarpGroups>{});
    int q_left = Base::NumMmaWarpGroups;
    auto kv_tile = make_coord_iterator(first, end);
    int kv_left = 2 * (end - first);

    typename Base::LoadQ load_q{params.tma_load_q, pipeline_q, storage.smem_q};
    auto q_at = q_state(load_q, problem, blk);

    // Q of the first consumer, K(first), Q of the second, V(first), the other Qs, then K V pairs.
    auto loads = [&](auto&& step_k, auto&& step_v) {
      if constexpr (kLoadQ) {
        load_q.step(q_tile, q_at, write_q, lane, q_left);
      }
      step_k();
      if constexpr (kLoadQ) {
        load_q.step(q_tile, q_at, write_q, lane, q_left);
      } else if (wait_for_q) {
        // The Q warp's first loads and these start together (kernel.cuh's q_started).
        q_started.arrive();
        q_started.wait(0);
      }
      step_v();
      if constexpr (kLoadQ) {
        while (q_left > 0) {
          load_q.step(q_tile, q_at, write_q, lane, q_left);
        }
      }
      CUTLASS_PRAGMA_NO_UNROLL
      while (kv_left > 0) {
        step_k();
        step_v();
      }
    };

    if (params.pages.table != nullptr) {
      // A paged cache: the table entries of tile j's slabs, and those of tiles j + 1 and j + 2,
      // loaded ahead (pages.cuh). (Its own branch, so that the dense loads keep their
      // registers: the producer has few.)
      const auto unit = Pages::unit(params.pages, get<2, 0>(blk), get<2, 1>(blk),
                                    k_start(problem), k_start(problem) + seq_k(problem));
      int j = first;
      int entry = Pages::slab_entry(params.pages, unit, j);
      int entry1 = Pages::slab_entry(params.pages, unit, j + 1), entry2 = 0;
      loads(
          [&] {
            entry2 = Pages::slab_entry(params.pages, unit, j + 2);
            Pages::template load<false>(params.pages, unit, j, entry, pipeline, write,
                                        storage.smem_k.data(), lane == 1);
            --kv_left;
          },
          [&] {
            Pages::template load<true>(params.pages, unit, j, entry, pipeline, write,
                                       storage.smem_v.data(), lane == 1);
            --kv_left;
            ++j;
            entry = entry1;
            entry1 = entry2;
          });
      return;
    }
    typename Base::LoadK load_k{params.tma_load_k, pipeline, storage.smem_k};
    auto k_at = k_state(load_k, problem, blk, end);
    typename Base::LoadV load_v{params.tma_load_v, pipeline, storage.smem_v};
    auto v_at = v_state(load_v, problem, blk, end);
    loads([&] { load_k.template step<false>(kv_tile, k_at, write, lane, kv_left); },
          [&] { load_v.template step<true>(kv_tile, v_at, write, lane, kv_left); });
  }

  // The Q loads of one work unit by a warp of their own (kernel.cuh's kSeparateQ): example 88's
  // load_maybe_q from the sequence's first query on.
  template <class BlkCoord, class ProblemShape, class QStarted>
  CUTLASS_DEVICE void load_maybe_q(BlkCoord const& blk, Params const& params,
                                   ProblemShape const& problem, MainloopPipelineQ& pipeline_q,
                                   PipelineStateQ& write_q, SharedStorage& storage,
                                   QStarted& q_started, bool wait_for_q) {
    using namespace cute;
    const int lane = cute::elect_one_sync();
    typename Base::LoadQ load_q{params.tma_load_q, pipeline_q, storage.smem_q};
    auto q_at = q_state(load_q, problem, blk);
    auto q_tile = make_coord_iterator(Int<Base::NumMmaWarpGroups>{});
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < Base::NumMmaWarpGroups; ++i) {
      int one = 1;
      load_q.step(q_tile, q_at, write_q, lane, one);
      if (i == 0 && wait_for_q) {
        // The K/V warp's first loads and these start together (kernel.cuh's q_started).
        q_started.arrive();
        q_started.wait(0);
      }
    }
  }

  // The stages and turns of the block's key tiles [from, to) for a warpgroup that computes
  // none of them: per tile it waits for K, takes an empty turn, and releases K and V. It holds no
  // turn while it waits for a stage, and it takes one turn per tile, as compute() does, so the
  // warpgroups' turns stay in step (turns.cuh).
  CUTLASS_DEVICE static void skip_tiles(int from, int to, int consumer,
                                        MainloopPipeline& pipeline, PipelineState& read) {
    CUTLASS_PRAGMA_NO_UNROLL
    for (int j = from; j < to; ++j) {
      pipeline.consumer_wait(read);  // K(j)
      Turns::wait(consumer);
      Turns::pass(consumer);
      pipeline.consumer_release(read);
      ++read;
      pipeline.consumer_wait(read);  // V(j)
      pipeline.consumer_release(read);
      ++read;
    }
  }

  // The pipeline traffic of compute() without its work, for a warpgroup whose rows all lie past
  // the unit's queries (a decode's packed rows fill the first warpgroup; a last query block may
  // fill one): its Q stage, the first product's turn (or ordered barrier), then every tile's
  // stages and turn as skip_tiles() takes them, and no product.
  // `flush` runs right after the first turn, as in compute().
  template <class OrderBarrier, class Flush>
  CUTLASS_DEVICE static void idle(int tiles, int consumer, MainloopPipeline& pipeline,
                                  PipelineState& read, MainloopPipelineQ& pipeline_q,
                                  PipelineStateQ& read_q, OrderBarrier& order, Flush&& flush) {
    pipeline_q.consumer_wait(read_q);
    if constexpr (kTurns) {
      Turns::wait(consumer);
      Turns::pass(consumer);
    } else {
      order.wait();
      order.arrive();
    }
    flush();
    skip_tiles(0, tiles, consumer, pipeline, read);
    if constexpr (Base::kIsPersistent) {
      pipeline_q.consumer_release(read_q);
    }
  }

  // Row max and row sum of one thread's rows, and the P.V accumulator, for the epilogue.
  // `flush()` runs once: right after the first QK product is issued and its turn passed, or for
  // a warpgroup without rows in the unit, after its first turn (kernel.cuh stores the last
  // unit's staged output there).
  template <class BlkCoord, class ProblemShape, class OrderBarrier, class Flush,
            class Fusion = CausalBandMask>
  CUTLASS_DEVICE auto compute(BlkCoord const& blk, BlkCoord const& wg, Params const& params,
                              ProblemShape const& problem, MainloopPipeline& pipeline,
                              PipelineState& read, MainloopPipelineQ& pipeline_q,
                              PipelineStateQ& read_q, SharedStorage& storage, OrderBarrier& order,
                              Flush&& flush) {
    using namespace cute;
    using cutlass::fmha::collective::gemm_zero_acc;
    using cutlass::fmha::collective::make_acc_into_op;
    const int thread = int(threadIdx.x);
    const int consumer = cutlass::canonical_warp_group_idx() - 1;  // warpgroup 0 loads

    TiledMmaQK mma_qk;
    auto thr_qk = mma_qk.get_thread_slice(thread);
    Tensor sQ = make_tensor(make_smem_ptr(storage.smem_q.data()), SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(storage.smem_k.data()), SmemLayoutK{});
    Tensor tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ));
    Tensor tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK));
    TiledMmaPV mma_pv;
    auto thr_pv = mma_pv.get_thread_slice(thread);
    Tensor sV = make_tensor(make_smem_ptr(storage.smem_v.data()), SmemLayoutV{});
    Tensor tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV));

    // (row, key) of each score this thread holds, advanced one key tile per step.
    Tensor tPcP = thr_qk.partition_C(make_identity_tensor(take<0, 2>(TileShapeQK{})));
    tPcP.data() = tPcP.data() + E<0>{} * get<0>(wg) * get<0>(TileShapeQK{});

    // The output accumulates from zero without a data-dependent "first product" branch: a
    // branch between products whose registers are in flight makes ptxas fence (warning C7519).
    Tensor acc_o = partition_fragment_C(mma_pv, take<0, 2>(TileShapePV{}));
    clear(acc_o);
    mma_pv.accumulate_ = GMMA::ScaleOut::One;
    Tensor acc_o_mn = as_rows(mma_pv, acc_o);
    constexpr int kRows = decltype(size<0>(acc_o_mn))::value;
    float row_max[kRows], row_sum[kRows];
    // The softmax's scale (exp2 units) and the logsumexp's (natural units): 1 and ln(2) where
    // the unit's modifiers took the scores to exp2 units.
    const Factors factors = factors_for(blk, params, problem);
    const float scale = factors.to_log2 == 0.f ? params.scale_softmax_log2 : 1.f;
    const float natural = factors.to_log2 == 0.f ? params.scale_softmax : kLn2;

    // The unit's key tiles, counted from the first it visits (a window's left side may skip
    // some): the producer loads `tiles` of them for the block. This warpgroup computes the first
    // `own` (its 64 rows see no key of the others: a causal block taller than a key tile), and a
    // tile needs the mask where it crosses a side of the band or the sequence end for one of the
    // warpgroup's own rows (the block's other rows do not matter).
    const int first = Fusion{}.get_first_tile(blk, TileShape{}, problem);
    const int tiles = Fusion{}.get_trip_count(blk, TileShape{}, problem) - first;
    const int own =
        cute::max(1, cute::min(tiles, Fusion{}.get_trip_count(wg, TileShapeQK{}, problem) - first));
    const int full = Fusion{}.get_first_full_tile(wg, TileShapeQK{}, problem) - first;
    const int unmasked = Fusion{}.get_unmasked_trip_count(wg, TileShapeQK{}, problem) - first;
    auto masked = [&](int j) { return j < full || j >= unmasked; };
    tPcP.data() = tPcP.data() + E<1>{} * (first * int(get<1>(TileShapeQK{})));
    // The bias's loads start before the first product (bias.cuh); a unit without a bias (or a
    // kernel without kBias) has none. Two consumer warpgroups have the registers to load the
    // next tile's pairs ahead; three do not.
    constexpr int kTileKeys = int(get<1>(TileShapeQK{}));
    Tensor tPcP_mn = as_rows(mma_qk, tPcP);
    using Bias = BiasTile<kRows, decltype(size<1>(tPcP_mn))::value, kTileKeys,
                          (Base::NumMmaWarpGroups < 3)>;
    Bias bias(params.bias, kBias && factors.bias != 0.f, get<2, 0>(blk), get<2, 1>(blk), tPcP_mn,
              key_first(problem), (first + tiles) * kTileKeys);

    // Rows all past the sequence's last, or all leading ones (problem.cuh's lead_rows): idle.
    const int wg_row = get<0>(wg) * int(get<0>(TileShapeQK{}));
    if (wg_row >= seq_q(problem) || wg_row < lead(problem)) {
      idle(tiles, consumer, pipeline, read, pipeline_q, read_q, order, flush);
      Tensor lse = make_tensor<float>(Int<kRows>{});
      fill(lse, -INFINITY);
      return make_tuple(acc_o, lse);  // rows the epilogue never stores
    }
    pipeline_q.consumer_wait(read_q);

    // Tile 0: S = Q K0^T, taking turns with the other warpgroups for the first product.
    Tensor acc_s = partition_fragment_C(mma_qk, take<0, 2>(TileShapeQK{}));
    pipeline.consumer_wait(read);
    if constexpr (kTurns) {
      Turns::wait(consumer);
    } else {
      order.wait();
    }
    warpgroup_fence_operand(acc_s);
    warpgroup_arrive();
    gemm_zero_acc(mma_qk, tSrQ(_, _, _, read_q.index()), tSrK(_, _, _, read.index()), acc_s);
    warpgroup_commit_batch();
    if constexpr (kTurns) {
      Turns::pass(consumer);
    } else {
      order.arrive();
    }
    // The last unit's staged output (kernel.cuh), stored while S = Q K0^T runs. With turns, the
    // wait for this product's turn and the next one order it after that unit's writes to the
    // staging and before this unit's, for every thread of the warpgroup (Turns::wait syncs all
    // of its 128 threads).
    flush();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);
    pipeline.consumer_release(read);  // K0
    // A persistent block's Q buffer is free once the warpgroup's last QK product has landed, so
    // that the Q warp loads the next unit's while this one's last tile and epilogue run.
    auto release_q_after = [&](int j) {
      if (Base::kIsPersistent && j == own - 1) {
        pipeline_q.consumer_release(read_q);
      }
    };
    release_q_after(0);
    ++read;  // now at V0
    float rescale[kRows];
    bool rescale_o =
        softmax<Fusion>(acc_s, tPcP, 0, masked(0), scale, factors, bias, params, problem, row_max,
                        row_sum, rescale);
    Tensor p = make_acc_into_op<Element>(acc_s, typename TiledMmaPV::LayoutA_TV{});
    if constexpr (!kOverlap) {
      Turns::wait(consumer);  // this turn issues P(0) V(0) and S = Q K(1)^T (or passes after it)
      issue_pv(pipeline, read, mma_pv, p, tOrV, acc_o);  // O = P(0) V(0): nothing to rescale
    }

    CUTLASS_PRAGMA_NO_UNROLL
    for (int j = 1; j < own; ++j) {
      PipelineState read_k = read;
      ++read_k;  // K(j) follows V(j-1)
      pipeline.consumer_wait(read_k);
      if constexpr (kOverlap) {
        Turns::wait(consumer);
      }
      warpgroup_fence_operand(acc_s);
      warpgroup_arrive();
      gemm_zero_acc(mma_qk, tSrQ(_, _, _, read_q.index()), tSrK(_, _, _, read_k.index()), acc_s);
      warpgroup_commit_batch();
      if constexpr (kOverlap) {
        // While S = Q K(j)^T runs, rescale O for tile j-1's max (no product holds O now:
        // P(j-2) V(j-2) completed last iteration); then issue O += P(j-1) V(j-1).
        warpgroup_fence_operand(acc_o);
        if (rescale_o) {
          scale_rows(acc_o_mn, rescale);
        }
        issue_pv(pipeline, read, mma_pv, p, tOrV, acc_o);
        Turns::pass(consumer);
        warpgroup_wait<1>();  // S(j) landed; P(j-1) V(j-1) may still run
        warpgroup_fence_operand(acc_s);
        pipeline.consumer_release(read_k);  // K(j)
        release_q_after(j);
        rescale_o = softmax<Fusion>(acc_s, tPcP, j, masked(j), scale, factors, bias, params,
                                    problem, row_max, row_sum, rescale);
        warpgroup_wait<0>();  // P(j-1) V(j-1) landed: V(j-1) is free, P may be overwritten
        warpgroup_fence_operand(acc_o);
        pipeline.consumer_release(read);  // V(j-1)
        p = make_acc_into_op<Element>(acc_s, typename TiledMmaPV::LayoutA_TV{});
        read = read_k;
        ++read;  // now at V(j)
      } else {
        Turns::pass(consumer);
        warpgroup_wait<0>();  // S(j) and P(j-1) V(j-1) landed
        warpgroup_fence_operand(acc_s);
        warpgroup_fence_operand(acc_o);
        pipeline.consumer_release(read_k);  // K(j)
        pipeline.consumer_release(read);    // V(j-1)
        release_q_after(j);
        rescale_o = softmax<Fusion>(acc_s, tPcP, j, masked(j), scale, factors, bias, params,
                                    problem, row_max, row_sum, rescale);
        if (rescale_o) {
          scale_rows(acc_o_mn, rescale);
        }
        p = make_acc_into_op<Element>(acc_s, typename TiledMmaPV::LayoutA_TV{});
        read = read_k;
        ++read;  // now at V(j)
        Turns::wait(consumer);
        issue_pv(pipeline, read, mma_pv, p, tOrV, acc_o);
      }
    }

    if constexpr (kOverlap) {
      // The last tile's P V, after the last rescale.
      Turns::wait(consumer);
      warpgroup_fence_operand(acc_o);
      if (rescale_o) {
        scale_rows(acc_o_mn, rescale);
      }
      issue_pv(pipeline, read, mma_pv, p, tOrV, acc_o);
    }
    Turns::pass(consumer);  // every turn taken above is passed on
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
    pipeline.consumer_release(read);  // V(own - 1)
    ++read;
    skip_tiles(own, tiles, consumer, pipeline, read);  // the block's tiles past its own

    // Normalise: the row sum over the quad, then O / sum and lse = max * scale + log(sum).
    Tensor lse = make_tensor<float>(Int<kRows>{});
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kRows; ++i) {
      float sum = row_sum[i];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // a row's 4 lanes: see quad_max
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // A row without a visible key (a key split's, or one the device contract allows) is 0
      // with logsumexp -inf, the weight 0 a merge gives it.
      const float inv = sum == 0.f || sum != sum ? 1.f : fast_rcp(sum);
      lse(i) = sum == 0.f ? -INFINITY : row_max[i] * natural + fast_log(sum);
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < size<1>(acc_o_mn); ++k) {
        acc_o_mn(i, k) *= inv;
      }
    }
    return make_tuple(acc_o, lse);
  }
};

}  // namespace flashcore::sm90
