// flashcore's Hopper (sm_90a) attention kernel: CUTLASS example 88's warp-specialized mainloop
// collective (TMA loads, wgmma, online softmax) under our own kernel layer: the problem shape
// with nested GQA heads and a runtime causal offset (problem.cuh), the mask fusion (mask.cuh), the
// tile scheduler (scheduler.cuh) and our epilogue (epilogue.cuh).
//
// One producer warpgroup loads (warp 0: K and V, and Q unless a second warp does; warp 2: Q when
// `kSeparateQ`) and gives up registers; `kMmaWarpGroups` consumer warpgroups take them, each
// computing `block rows / kMmaWarpGroups` query rows. An ordered barrier takes the consumers in
// turn through their first QK product (and, by ScheduleFlags, every softmax and the epilogue), or
// named barriers through every tile's products (kFlagIssueTurns, turns.cuh), so one warpgroup's
// softmax overlaps the other's matrix products. The K/V pipeline has plan.h's sm90_kv_stages().
#pragma once

#include "collective/fmha_collective_tma_warpspecialized.hpp"  // CUTLASS examples/88_hopper_fmha
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "flashcore/plan.h"
#include "kernel/fmha_options.hpp"
#include "sequences.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/mainloop.cuh"
#include "sm90/mask.cuh"
#include "sm90/problem.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/turns.cuh"
#include "split/units.cuh"

namespace flashcore::sm90 {

// How a kernel schedules its work: a sum of these flags (instances.inc names one per tile).
enum ScheduleFlags : int {
  // One block per SM walking the work units (balanced pairs of query blocks: scheduler.cuh), Q
  // loaded by its own warp into a buffer per warpgroup, released once the warpgroup's last QK
  // product of a unit has landed (mainloop.cuh); without it, one block per unit.
  kFlagPersistent = 1,
  // Retired with example 88's consumer loop (its turns through every softmax); refused.
  kFlagRetiredTurnsInSoftmax = 2,
  // The consumers store their output without taking turns.
  kFlagFreeEpilogue = 4,
  // A schedule names at least one of the next five: they select options of our consumer loop
  // (mainloop.cuh). Each warpgroup's softmax overlaps its own P.V product.
  kFlagOverlap = 8,
  // O rescaled only when a row's max grows by more than 2^8 (16 is retired: see docs/HOPPER.md).
  kFlagLazyRescale = 32,
  // The consumers take turns issuing each key tile's matrix products (turns.cuh).
  kFlagIssueTurns = 64,
  // Our loop in example 88's serial order, with none of the options above.
  kFlagOurLoop = 128,
  // Our loop with the score modifiers a softcap and ALiBi, each where the call has it
  // (mainloop.cuh's kModifiers); the other kernels refuse them.
  kFlagModifiers = 256,
  // With kFlagModifiers: an additive bias too (bias.cuh). Its own kernel, so that the registers
  // its loads hold cost the softcap and ALiBi nothing; the other kernels refuse a bias.
  kFlagBias = 512,
  // With kFlagPersistent: the last wave of a walk of equal units in pieces where it would leave
  // blocks idle (scheduler.cuh's Tail; 1024 is retired: docs/HOPPER.md, round 28).
  kFlagTailPieces = 2048,
};

template <class Element, int kBlockQ, int kBlockK, int kHeadDim, int kFlags>
struct Kernel {
  static constexpr bool kPersistent = (kFlags & kFlagPersistent) != 0;
  static constexpr bool kTailPieces = kPersistent && (kFlags & kFlagTailPieces) != 0;
  static constexpr bool kOrderedEpilogue = (kFlags & kFlagFreeEpilogue) == 0;
  // Each consumer warpgroup computes 64 query rows (one wgmma row block): 128 rows take two,
  // 192 rows three.
  static_assert(kBlockQ % 64 == 0 && kBlockQ >= 128 && kBlockQ <= 192, "64 rows per warpgroup");
  static constexpr int kMmaWarpGroups = kBlockQ / 64;
  static constexpr bool kSeparateQ = kPersistent;
  using TileShape = cute::Shape<cute::Int<kBlockQ>, cute::Int<kBlockK>, cute::Int<kHeadDim>>;
  static constexpr int kStagesKV = int(sm90_kv_stages(Tile{kBlockQ, kBlockK, kHeadDim}));
  using Example88Mainloop = cutlass::fmha::collective::FmhaMainloopTmaWarpSpecialized<
      Element, float, float, TileShape, StrideQO, StrideKV, StrideKV, CausalBandMask,
      cutlass::fmha::kernel::Option<cutlass::fmha::kernel::Tag::kIsPersistent,
                                    cute::bool_constant<kPersistent>>,
      cutlass::fmha::kernel::Option<cutlass::fmha::kernel::Tag::kNumMmaWarpGroups,
                                    cute::Int<kMmaWarpGroups>>,
      cutlass::fmha::kernel::Option<cutlass::fmha::kernel::Tag::kStagesKV, cute::Int<kStagesKV>>>;
  static constexpr bool kIssueTurns = (kFlags & kFlagIssueTurns) != 0;
  // Example 88's own consumer loop (rounds 1-2 of docs/HOPPER.md) served no row since round 43
  // and was retired: its collective gives our loop its types, loads and layouts, and the
  // schedule numbers that named no option of ours (0-7) are refused here rather than taken to
  // mean something else.
  static_assert((kFlags & (kFlagOverlap | kFlagLazyRescale | kFlagIssueTurns | kFlagOurLoop |
                           kFlagModifiers)) != 0 &&
                    (kFlags & kFlagRetiredTurnsInSoftmax) == 0,
                "a schedule selects our consumer loop (flags 8-256); example 88's was retired");
  static constexpr bool kModifiers = (kFlags & kFlagModifiers) != 0;
  static constexpr bool kBias = (kFlags & kFlagBias) != 0;
  static_assert(kModifiers || !kBias, "the bias rides on the modifier schedule");
  using Mainloop = ConsumerLoop<Example88Mainloop, (kFlags & kFlagOverlap) != 0,
                                (kFlags & kFlagLazyRescale) != 0, kIssueTurns, kModifiers, kBias>;
  using Scheduler = TileScheduler<kPersistent, kTailPieces>;
  using Out = Epilogue<Element>;

  using PipelineKV = typename Mainloop::MainloopPipeline;
  using PipelineQ = typename Mainloop::MainloopPipelineQ;
  using OrderBarrier = cutlass::OrderedSequenceBarrier<2, kMmaWarpGroups>;

  struct PipelineStorage {
    typename Mainloop::SharedStorage mainloop;
    alignas(16) typename PipelineKV::SharedStorage pipeline_kv;
    alignas(16) typename PipelineQ::SharedStorage pipeline_q;
    alignas(16) typename OrderBarrier::SharedStorage order;
    alignas(16) cutlass::arch::ClusterBarrier q_started;  // kSeparateQ: both loaders start together
  };
  // The output rows of each consumer warpgroup, staged for 16-byte stores (epilogue.cuh), where
  // plan.h's sm90_staging_bytes() finds room for them.
  static constexpr int kStagedElements =
      int(sm90_staging_bytes(Tile{kBlockQ, kBlockK, kHeadDim}) / int64_t(sizeof(Element)));
  static constexpr bool kStagedOutput = kStagedElements > 0;
  struct StagedStorage : PipelineStorage {
    alignas(16) Element out_rows[kStagedOutput ? kStagedElements : 1];
  };
  using SharedStorage = std::conditional_t<kStagedOutput, StagedStorage, PipelineStorage>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static constexpr int kThreads = (kMmaWarpGroups + 1) * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kQueryRowsPerWarpGroup = kBlockQ / kMmaWarpGroups;
  // The registers a thread of each warpgroup may hold, summed over the warpgroups (the launch
  // bound's per-thread count, a multiple of 8, times the block's threads, per warpgroup).
  static constexpr uint32_t kRegisterPool =
      65536 / kThreads / 8 * 8 * kThreads / cutlass::NumThreadsPerWarpGroup;
  // Two consumer warpgroups at d <= 128 without a bias take 224 registers a thread (their SASS
  // uses at most 186) and leave the producer 56, so that it keeps its state in registers
  // instead of spilling it: its first unit's set-up took 2-3 us before its first copy with 24
  // (docs/HOPPER.md round 58), and with 56 the serving example runs 9% faster and the decode
  // rows up to 1.4% (round 59). Elsewhere the producer keeps setmaxnreg's least, 24 (round 52:
  // d = 64's three warpgroups left it 32, 0-1.5% slower on an H100), and the consumers share
  // the rest.
  static constexpr bool kRoomyProducer = kMmaWarpGroups == 2 && kHeadDim <= 128 && !kBias;
  static constexpr uint32_t kMmaRegisters =
      kRoomyProducer ? 224 : (kRegisterPool - 24) / kMmaWarpGroups / 8 * 8;
  static constexpr uint32_t kLoadRegisters =
      kRoomyProducer ? kRegisterPool - kMmaWarpGroups * kMmaRegisters : 24;
  static_assert(kLoadRegisters >= 24 && kLoadRegisters <= 256, "setmaxnreg's range");

  // A variable-length batch (cu_q null: a dense one): batch + 1 offsets each into the token
  // axis of Q/O and of K/V, clamped to the token counts as the WMMA kernel clamps them
  // (sequences.cuh), and the band rule every sequence (of a variable-length batch or a paged
  // cache) applies to its own lengths.
  // Its one-query heads packed (FmhaArgs::packed_group, 0: none): each unit is a (sequence, kv
  // head) of packed_rows rows, whose Q and output rows advance by the head stride, the
  // sequence's query token starting token_rows rows (head strides) per token along that axis.
  // `lead`: each unit's problem takes lead_rows (problem.cuh): the launcher sets it under a
  // causal mask without a window, key splits, packed heads or a bias.
  struct Sequences {
    const int32_t* cu_q = nullptr;
    const int32_t* cu_k = nullptr;
    int total_q = 0, total_k = 0;
    Band band;
    int packed_rows = 0, token_rows = 1;
    bool lead = false;
  };

  // Split-KV (count 1: none): the keys of each (batch entry, head) in splits of `keys` keys (the
  // last may hold fewer), the scheduler's batch index running over (batch entry or sequence,
  // split): `count` splits each, or with per-sequence splits (`sequences`) each sequence's own
  // number of them, at most `count`. Each split writes its partial state to Parts (split s's
  // state of the row whose logsumexp index is n at row s * rows + n), which the launcher
  // combines; a sequence's last split also gives the slots after its own the weightless state
  // (logsumexp -inf), whose state the combine never uses. A sequence of a variable-length
  // batch shorter than the longest may get splits past its keys: their rows end as 0 and
  // logsumexp -inf, weight 0.
  struct Splits {
    int count = 1;
    int keys = 0;
    cutlass::FastDivmod div;  // scheduler batch index -> (batch entry, split)
    split::SequenceUnits sequences;
  };

  // The partial states of key splits or of the last wave's pieces (scheduler.cuh's Tail), in
  // f32: split/combine.cuh's Partials, `rows` rows per slot. A piece's slot holds row r of its
  // query block at row (unit - Tail::first) * kBlockQ + r (the combine's TailRows); null where
  // no unit stores a partial state.
  struct Parts {
    float* out = nullptr;
    float* lse = nullptr;
    int64_t rows = 0;
  };

  // `problem`: the dense batch's; for a variable-length batch, the packed tensors' (one batch
  // entry of total_q and total_k tokens: the TMA descriptors' extents), whose heads and head dim
  // every sequence shares.
  struct Params {
    ProblemShape problem;
    typename Mainloop::Params mainloop;
    typename Out::Params out;
    typename Scheduler::Params scheduler;
    Sequences seqs;
    Splits splits;
    Parts parts;
  };

  // A work unit's problem, batch entry or sequence, and key split; `absent`: the split slots
  // after this one that its sequence does not use (per-sequence splits, on its last split).
  // `piece`: a piece of the last wave's unit (unit_at), whose split and absent are the piece's
  // slot and absent slots.
  struct Unit {
    ProblemShape problem;
    int batch, split;
    int absent = 0;
    bool piece = false;
  };

  // The unit of the scheduler's batch index `index`: a dense batch entry's problem is the
  // call's; a sequence's has its own lengths, band and first tokens (a paged cache's sequence,
  // its own key count); a split takes its keys.
  CUTLASS_DEVICE static Unit unit_of(Params const& params, int index) {
    Unit u{params.problem, index, 0};
    Splits const& sp = params.splits;
    if (sp.count > 1 && sp.sequences.sequences > 0) {
      const split::SequenceUnits::Split found = sp.sequences.find(index);
      u.batch = found.sequence;
      u.split = found.split;
      u.absent = found.split == found.count - 1 ? sp.count - found.count : 0;
    } else if (sp.count > 1) {
      sp.div(u.batch, u.split, index);
    }
    Sequences const& s = params.seqs;
    if (s.cu_q != nullptr) {
      const TokenRange q = token_range(s.cu_q, u.batch, s.total_q);
      const TokenRange k = token_range(s.cu_k, u.batch, s.total_k);
      // Packed: the query token's rows, from row q.begin * token_rows (below the descriptor's
      // row extent, (total_q - 1) * token_rows + packed_rows: validated to fit an int).
      const int rows = sequence_rows(q, s.packed_rows);
      const int first_row = s.packed_rows == 0 ? q.begin : rows > 0 ? q.begin * s.token_rows : 0;
      u.problem = make_problem(1, cute::get<1>(params.problem), rows, k.end - k.begin,
                               cute::get<4>(params.problem), s.band, first_row, k.begin);
    }
    auto const& pages = params.mainloop.pages;
    if (pages.table != nullptr) {  // a paged cache: the sequence's own key count
      u.problem = make_problem(
          cute::get<0>(params.problem), cute::get<1>(params.problem), seq_q(params.problem),
          paged_keys(pages.seqlens_k, u.batch, pages.pages_per_seq, pages.page_shift),
          cute::get<4>(params.problem), s.band);
    }
    if (s.lead) {
      u.problem = lead_rows<kBlockQ>(u.problem);
    }
    if (params.splits.count > 1) {
      const int64_t keys = params.splits.keys;
      u.problem = key_split(u.problem, u.split * keys, keys);
    }
    return u;
  }
  // Whether unit_of reads only the parameters (a dense call: no offsets or key lengths in
  // global memory), so that a unit can be found before the grid wait.
  CUTLASS_DEVICE static bool unit_from_parameters(Params const& params) {
    return params.seqs.cu_q == nullptr && params.mainloop.pages.table == nullptr;
  }
  // The batch coordinate of a unit's loads and stores: 0 in a variable-length batch's packed
  // tensors.
  CUTLASS_DEVICE static int memory_batch(Params const& params, int b) {
    return params.seqs.cu_q == nullptr ? b : 0;
  }

  // Whether the unit's query block holds a row of its sequence (a variable-length batch's
  // grid covers its longest sequence; every block of a dense batch does).
  template <class BlkCoord>
  CUTLASS_DEVICE static bool has_rows(BlkCoord const& blk, ProblemShape const& problem) {
    return cute::get<0>(blk) * kBlockQ < seq_q(problem);
  }

  // The unit at the scheduler's `blk` (unit_of), cut to its piece's key tiles in the tail.
  template <class BlkCoord>
  CUTLASS_DEVICE static Unit unit_at(Params const& params, Scheduler const& s,
                                     BlkCoord const& blk) {
    Unit u = unit_of(params, cute::get<2, 0>(blk));
    if (s.in_tail()) {
      const Piece piece = s.piece();
      u.problem = key_split(u.problem, int64_t(piece.first_tile) * kBlockK,
                            int64_t(piece.tiles) * kBlockK);
      u.split = piece.slot;
      u.absent = piece.absent;
      u.piece = true;
    }
    return u;
  }

  // For the loaders: the unit at the scheduler's `blk`, whose batch coordinate becomes that of
  // its loads; false when its query block holds no row (no load, as the consumers skip it).
  template <class BlkCoord>
  CUTLASS_DEVICE static bool load_unit(Params const& params, Scheduler const& s, BlkCoord& blk,
                                       Unit& u) {
    u = unit_at(params, s, blk);
    if (!has_rows(blk, u.problem)) {
      return false;
    }
    cute::get<2, 0>(blk) = memory_batch(params, u.batch);
    return true;
  }

  CUTLASS_DEVICE void operator()(Params const& params, char* smem) const {
#if defined(CUTLASS_ARCH_MMA_SM90A_ENABLED)
    using namespace cute;
    auto& storage = *reinterpret_cast<SharedStorage*>(smem);
    const int warp = cutlass::canonical_warp_idx_sync();
    const int warp_in_group = warp % cutlass::NumWarpsPerWarpGroup;
    const int group = cutlass::canonical_warp_group_idx();
    const bool producer = group == 0;
    const int consumer = group - 1;
    const int elected = cute::elect_one_sync();
    constexpr int kLoadKV = 0, kLoadQ = kSeparateQ ? 2 : 0;

    if (warp == 0 && elected) {
      Mainloop::prefetch_tma_descriptors(params.mainloop);
    }
    // The stream's next kernel, where it is launched as a programmatic dependent (the split-KV
    // combine, split/combine.cuh; the next call's Hopper kernel, launch.cuh), may start on the
    // SMs this grid leaves free; it waits for this whole grid before it touches global memory.
    cudaTriggerProgrammaticLaunchCompletion();

    typename PipelineQ::Params q_params;
    q_params.transaction_bytes = Mainloop::kOuterLoadBytes;
    q_params.is_leader = elected && warp_in_group == kLoadQ;
    q_params.num_consumers = cutlass::NumThreadsPerWarpGroup;
    typename PipelineKV::Params kv_params;
    kv_params.transaction_bytes = Mainloop::kInnerLoadBytes;
    kv_params.is_leader = elected && warp_in_group == kLoadKV;
    kv_params.num_consumers = kMmaWarpGroups * cutlass::NumThreadsPerWarpGroup;
    if (producer) {
      // Threads of producer warps that load nothing must not count as producers.
      q_params.role = warp_in_group == kLoadQ ? PipelineQ::ThreadCategory::Producer
                                              : PipelineQ::ThreadCategory::NonParticipant;
      kv_params.role = warp_in_group == kLoadKV ? PipelineKV::ThreadCategory::Producer
                                                : PipelineKV::ThreadCategory::NonParticipant;
    } else {
      q_params.role = PipelineQ::ThreadCategory::Consumer;
      kv_params.role = PipelineKV::ThreadCategory::Consumer;
    }
    PipelineQ pipeline_q(storage.pipeline_q, q_params, Shape<_1, _1, _1>{});
    PipelineKV pipeline_kv(storage.pipeline_kv, kv_params, typename Mainloop::ClusterShape{});

    typename OrderBarrier::Params order_params;
    order_params.group_id = consumer;
    order_params.group_size = cutlass::NumThreadsPerWarpGroup;
    OrderBarrier order(storage.order, order_params);

    if constexpr (kSeparateQ) {
      if (warp == 0 && elected) {
        storage.q_started.init(2 * cutlass::NumThreadsPerWarp);
      }
      cutlass::arch::fence_barrier_init();
    }
    // The loaders' walk. A dense call's first unit comes from the parameters alone
    // (unit_from_parameters), so the loaders compute it before the barrier and the grid wait,
    // while the blocks of the previous kernel end: on the kernels whose producer has the
    // registers to carry it (kRoomyProducer). docs/HOPPER.md round 62.
    Scheduler walk(params.scheduler);
    decltype(walk.get_block_coord()) walk_blk{};
    Unit walk_unit;
    const bool loader =
        producer && (warp_in_group == kLoadKV || (kSeparateQ && warp_in_group == kLoadQ));
    // `ready`: the early unit has rows to load (else the loop looks at it again).
    bool ready = false;
    if (kRoomyProducer && loader && unit_from_parameters(params) && walk.is_valid()) {
      walk_blk = walk.get_block_coord();
      ready = load_unit(params, walk, walk_blk, walk_unit);
    }
    __syncthreads();  // barriers initialised before any thread uses them
    // This grid is launched as a programmatic dependent of the stream's previous kernel
    // (launch.cuh), so it may start while that kernel runs: the set-up above (the barriers, the
    // loaders' first unit) read only the parameters and wrote only shared memory. Nothing below
    // reads or writes global memory before that kernel's grid has completed and its writes are
    // visible.
    cudaGridDependencySynchronize();

    Mainloop mainloop;
    typename Mainloop::PipelineState kv_write = cutlass::make_producer_start_state<PipelineKV>();
    typename Mainloop::PipelineStateQ q_write = cutlass::make_producer_start_state<PipelineQ>();
    typename Mainloop::PipelineState kv_read;
    typename Mainloop::PipelineStateQ q_read;

    if (producer) {
      cutlass::arch::warpgroup_reg_dealloc<kLoadRegisters>();
      // Calls `load(first)` for each unit of the walk with rows to load (load_unit), the early
      // one first; `first`: the loader's first unit.
      const auto walk_units = [&](auto&& load) {
        for (bool first = true; walk.is_valid(); ++walk) {
          if (ready) {
            ready = false;
          } else {
            walk_blk = walk.get_block_coord();
            if (!load_unit(params, walk, walk_blk, walk_unit)) {
              continue;
            }
          }
          load(first);
          first = false;
        }
      };
      if (warp_in_group == kLoadKV) {
        walk_units([&](bool first) {
          mainloop.template load_kv_maybe_q<!kSeparateQ>(
              0, walk_blk, params.mainloop, walk_unit.problem, pipeline_kv, kv_write, pipeline_q,
              q_write, storage.mainloop, storage.q_started, kSeparateQ && first);
        });
      } else if (kSeparateQ && warp_in_group == kLoadQ) {
        walk_units([&](bool first) {
          mainloop.load_maybe_q(walk_blk, params.mainloop, walk_unit.problem, pipeline_q,
                                q_write, storage.mainloop, storage.q_started, first);
        });
      }
      return;
    }

    cutlass::arch::warpgroup_reg_alloc<kMmaRegisters>();
    IssueTurns<kMmaWarpGroups, kIssueTurns>::start(consumer);
    Element* staging = nullptr;
    if constexpr (kStagedOutput) {
      staging = storage.out_rows + consumer * kQueryRowsPerWarpGroup * kHeadDim;
    }
    const typename Out::Staging stage{staging, uint32_t(kMmaWarpGroups + consumer)};
    // The last unit's staged output rows, stored while the next unit's first product runs
    // (mainloop.cuh). With issue turns, the turns order the staging's writes and reads for the
    // warpgroup's threads; otherwise the epilogue syncs them itself.
    constexpr bool kStagingSynced = kIssueTurns;
    typename Out::Pending pending;
    const auto flush = [&] {
      if constexpr (kStagedOutput) {
        Out::template flush<kQueryRowsPerWarpGroup, kHeadDim>(pending, stage);
        pending.rows = 0;
      }
    };
    for (Scheduler s(params.scheduler); s.is_valid(); ++s) {
      auto blk = s.get_block_coord();
      const Unit u = unit_at(params, s, blk);
      const ProblemShape& problem = u.problem;
      if (!has_rows(blk, problem)) {
        continue;
      }
      get<2, 0>(blk) = u.batch;  // ALiBi's slopes and the bias are the batch entry's or sequence's
      auto wg = blk;
      get<0>(wg) = kMmaWarpGroups * get<0>(blk) + consumer;
      q_read.advance(consumer * Mainloop::kOuterLoads);  // each consumer has its own Q buffer
      auto result = mainloop.compute(blk, wg, params.mainloop, problem, pipeline_kv, kv_read,
                                     pipeline_q, q_read, storage.mainloop, order, flush);
      q_read.advance(Mainloop::kOuterLoads * (kMmaWarpGroups - consumer));
      if constexpr (kOrderedEpilogue) {
        order.wait();
      }
      // The warpgroup's first row of the sequence; below 0 for one of the leading rows alone,
      // which stores nothing (compute()'s flush has emptied `pending`). Only a causal call
      // without key splits takes leading rows (launch.cuh's leads_rows).
      const int m_rows = get<0>(wg) * kQueryRowsPerWarpGroup - lead(problem);
      if (params.splits.count > 1 || u.piece) {
        // A key split's state at its row's logsumexp index; a piece's, at its unit's rows:
        // query row r of the unit's block at row (unit - first) * kBlockQ + r - block * kBlockQ.
        Parts const& parts = params.parts;
        int64_t row0 = 0, row_step = 1;
        if (u.piece) {
          row0 = int64_t(s.unit - params.scheduler.tail.first - get<0>(blk)) * kBlockQ;
        } else {
          row0 = Out::lse_index(params.out, problem, memory_batch(params, u.batch), get<2, 1>(blk));
          row_step = params.out.lse_row;
        }
        Out::store_partial(typename Mainloop::TileShapePV{}, get<0>(result), get<1>(result),
                           typename Mainloop::TiledMmaPV{}, problem, parts.out, parts.lse,
                           u.split * parts.rows + row0, row_step, m_rows, parts.rows, u.absent);
      } else if (m_rows >= 0) {
        Out::template store<kStagedOutput, kStagingSynced>(
            typename Mainloop::TileShapePV{}, get<0>(result), get<1>(result),
            typename Mainloop::TiledMmaPV{}, own_rows(problem), params.out, m_rows,
            memory_batch(params, u.batch), get<2, 1>(blk), stage, pending);
      }
      if constexpr (kOrderedEpilogue) {
        order.arrive();
      }
    }
    if constexpr (kStagedOutput && kStagingSynced) {
      Out::sync(stage);  // no turn follows the last unit's writes
    }
    flush();
#endif
  }
};

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1)
    fmha_sm90_kernel(CUTLASS_GRID_CONSTANT typename K::Params const params) {
  extern __shared__ char smem[];
  K{}(params, smem);
}

}  // namespace flashcore::sm90
