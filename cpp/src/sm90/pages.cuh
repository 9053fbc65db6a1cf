// A paged KV cache on the Hopper kernel (FmhaArgs' block table): K and V are pages of 2^shift
// keys, [num_pages, page_size, heads_kv, head_dim]; a sequence's key t is slot t % page_size of
// page table[b * pages_per_seq + t / page_size].
//
// TMA cannot gather rows, so the producer loads each key tile as slabs of 16 keys, or of 64 keys
// where pages hold at least 64 (four times fewer TMA copies to issue): a page holds at least 16
// keys (validation) and a unit's keys start at a multiple of the tile's (64 or 128), so a slab
// lies in one page, and its rows are one TMA box per 64 columns, read through a descriptor that
// sees the cache as a dense batch of num_pages sequences of page_size keys. The slabs of a tile
// complete on the tile's pipeline stage like the dense tile's one load. The warp's lanes hold
// the table entry of one slab each (the leader issues the copies, the pages shuffled to it four
// slabs at a time: load_slabs), loaded two tiles ahead
// and first used (clamped) when its tile loads: a load's result used at once stalls the warp for
// the whole memory latency, which cost the first version half its bandwidth
// (docs/PERFORMANCE.md).
//
// Keys past the unit's end: K's scores are masked (set to -inf, whatever K held), so K's slabs
// past the end are not loaded. V's rows must be finite (0 x NaN is NaN in the P.V product), and
// a page's slots past the sequence's keys hold whatever the cache held: the warp copies a slab
// that reaches past the end itself, zero-filling those rows, and publishes it to the tensor
// cores (a proxy fence) before the stage's arrival. No read leaves the cache: a page index is
// clamped to [0, last_page], and TMA zero-fills past the descriptor's extents.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "launcher.h"
#include "sequences.cuh"
#include "sm90/problem.cuh"

namespace flashcore::sm90 {

template <class Element, class SmemLayoutK, class SmemLayoutV, int kTileKeys, int kHeadDim>
struct PagedKV {
  // Slabs of kKeys keys: kSlabs of them per tile, one table entry each (a lane per slab).
  template <int kKeys>
  struct Slab {
    static constexpr int kSlabs = kTileKeys / kKeys;
    static_assert(kTileKeys % kKeys == 0 && kSlabs <= 32, "a lane per slab");
    static constexpr int kBytes = kKeys * kHeadDim * int(sizeof(Element));
    // Stage 0's first slab in shared memory: K (keys, dims), V (dims, keys). A slab starts a
    // whole number of swizzle periods into its stage, so every slab has this layout.
    using K = decltype(cute::composition(
        SmemLayoutK{}(cute::_, cute::_, cute::_0{}),
        cute::make_tile(cute::Layout<cute::Int<kKeys>>{}, cute::Layout<cute::Int<kHeadDim>>{})));
    using V = decltype(cute::composition(
        SmemLayoutV{}(cute::_, cute::_, cute::_0{}),
        cute::make_tile(cute::Layout<cute::Int<kHeadDim>>{}, cute::Layout<cute::Int<kKeys>>{})));
  };
  // Slab keys: any page; pages of kSm90WideSlabKeys (plan.h) or more where the tile holds whole
  // slabs of that many (every tile of the table; the sweep's 160- and 176-key tiles of round 27
  // do not).
  static constexpr int kWideKeys = int(kSm90WideSlabKeys);
  static constexpr int kNarrow = 16, kWide = kTileKeys % kWideKeys == 0 ? kWideKeys : kNarrow;
  // The cache as TMA sees it: K (slot, dim, (page, (group, heads_kv))), V (dim, slot, ...).
  using StrideV = decltype(cute::select<1, 0, 2>(StrideKV{}));
  using CacheShape = decltype(cute::repeat_like(StrideKV{}, int32_t(0)));
  template <class Stride, class SlabLayout>
  using Tma = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), CacheShape{},
                        Stride{}),
      SlabLayout{}));
  // K's and V's descriptors for slabs of kKeys keys.
  template <int kKeys>
  struct Copies {
    Tma<StrideKV, typename Slab<kKeys>::K> k;
    Tma<StrideV, typename Slab<kKeys>::V> v;
  };

  struct Params {
    const int32_t* table = nullptr;  // null: contiguous keys
    const int32_t* seqlens_k = nullptr;
    int64_t pages_per_seq = 0;
    int page_shift = 0, last_page = 0;
    int group = 1, head_dim = 0;  // query heads per kv head; the head dim (<= kHeadDim)
    CacheShape shape_k, shape_v;
    bool wide = false;  // pages of kWide keys or more: slabs of kWide keys (`wide_copies`)
    Copies<kNarrow> narrow_copies;
    Copies<kWide> wide_copies;
    // V for the warp's own copies: element (page, slot, kv head, dim) at page * v_page + slot *
    // v_slot + head * v_head + dim.
    const Element* v = nullptr;
    int64_t v_page = 0, v_slot = 0, v_head = 0;
  };

  // The parameters of the call's cache (FmhaArgs: K and V with the strides (page, slot, kv
  // head) in elements).
  static Params make(const FmhaArgs& a) {
    using namespace cute;
    const auto* k = static_cast<const Element*>(a.k);
    const auto* v = static_cast<const Element*>(a.v);
    const PageBounds bounds = page_bounds(a);
    const int heads_kv = static_cast<int>(a.heads_kv);
    Params p;
    p.table = a.block_table;
    p.seqlens_k = a.seqlens_k;
    p.pages_per_seq = bounds.pages_per_seq;
    p.page_shift = bounds.shift;
    p.last_page = bounds.last_page;
    // Without pages no key is read (every sequence's count clamps to 0); the descriptors, which
    // need an extent of at least 1, then see one page and are never used.
    const int64_t num_pages = int64_t{bounds.last_page} + 1;
    p.group = static_cast<int>(a.heads_q) / heads_kv;
    p.head_dim = static_cast<int>(a.head_dim);
    const int slots = 1 << bounds.shift;
    // A dimension of extent 1 is never stepped over; TMA still wants a stride of 16 bytes.
    auto stride = [](int64_t s, int64_t extent) { return extent == 1 ? int64_t{8} : s; };
    auto kv = [&](const int64_t (&s)[3]) {
      const auto heads = make_tuple(_0{}, stride(s[2], heads_kv));
      return StrideKV{static_cast<int>(stride(s[1], slots)), _1{},
                      make_tuple(stride(s[0], num_pages), heads)};
    };
    p.shape_k = CacheShape{slots, p.head_dim,
                           make_tuple(static_cast<int>(num_pages), make_tuple(p.group, heads_kv))};
    p.shape_v = select<1, 0, 2>(p.shape_k);
    const auto gk = make_tensor(make_gmem_ptr(k), p.shape_k, kv(a.k_stride));
    const auto gv = make_tensor(make_gmem_ptr(v), p.shape_v, select<1, 0, 2>(kv(a.v_stride)));
    p.wide = slots >= kWide;
    if (p.wide) {
      p.wide_copies = {make_tma_copy(SM90_TMA_LOAD{}, gk, typename Slab<kWide>::K{}),
                       make_tma_copy(SM90_TMA_LOAD{}, gv, typename Slab<kWide>::V{})};
    } else {
      p.narrow_copies = {make_tma_copy(SM90_TMA_LOAD{}, gk, typename Slab<kNarrow>::K{}),
                         make_tma_copy(SM90_TMA_LOAD{}, gv, typename Slab<kNarrow>::V{})};
    }
    p.v = v;
    p.v_page = a.v_stride[0];
    p.v_slot = a.v_stride[1];
    p.v_head = a.v_stride[2];
    return p;
  }

  CUTLASS_DEVICE static void prefetch(Params const& p) {
    if (p.table == nullptr) {
      return;
    }
    if (p.wide) {
      cute::prefetch_tma_descriptor(p.wide_copies.k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.wide_copies.v.get_tma_descriptor());
    } else {
      cute::prefetch_tma_descriptor(p.narrow_copies.k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.narrow_copies.v.get_tma_descriptor());
    }
  }

  // One work unit's loads: batch entry `b`, query head `head` (of kv head `kv_head`), keys from
  // token `start` of the sequence to `end` (a split's; the sequence's keys lie below it too).
  struct Unit {
    const int32_t* row;  // the sequence's row of the block table
    int kv_head, start, end;
  };
  CUTLASS_DEVICE static Unit unit(Params const& p, int b, int head, int start, int end) {
    return {p.table + int64_t(b) * p.pages_per_seq, head / p.group, start, end};
  }

  // The block table's entry for this lane's slab of key tile `tile`, as loaded (not yet used:
  // load() clamps it); lanes past the slabs, and entries past the table row (keys past the
  // sequence), give -1, page 0 once clamped.
  CUTLASS_DEVICE static int slab_entry(Params const& p, Unit const& u, int tile) {
    const int lane = int(threadIdx.x) % 32;
    const int keys = p.wide ? kWide : kNarrow;
    const int64_t token = int64_t(u.start) + int64_t(tile) * kTileKeys + lane * keys;
    const int64_t entry = token >> p.page_shift;
    return lane < kTileKeys / keys && entry < p.pages_per_seq ? u.row[entry] : -1;
  }

  // Loads key tile `tile` of the unit, K (kV false) or V, into the pipeline stage at `write`
  // and advances it; the whole warp calls it, `leader` (the pipeline's producer lane) issues the
  // TMA copies and arrives. `entry`: slab_entry() of this tile.
  template <bool kV, class Pipeline, class State>
  CUTLASS_DEVICE static void load(Params const& p, Unit const& u, int tile, int entry,
                                  Pipeline& pipeline, State& write, Element* smem, bool leader) {
    if (p.wide) {
      load_slabs<kV, kWide>(p, p.wide_copies, u, tile, entry, pipeline, write, smem, leader);
    } else {
      load_slabs<kV, kNarrow>(p, p.narrow_copies, u, tile, entry, pipeline, write, smem, leader);
    }
  }

  // load() in slabs of kKeys keys, through `copies`.
  template <bool kV, int kKeys, class Pipeline, class State>
  CUTLASS_DEVICE static void load_slabs(Params const& p, Copies<kKeys> const& copies, Unit const& u,
                                        int tile, int entry, Pipeline& pipeline, State& write,
                                        Element* smem, bool leader) {
    using namespace cute;
    constexpr int kSlabKeys = kKeys, kSlabs = Slab<kKeys>::kSlabs;
    constexpr int kSlabBytes = Slab<kKeys>::kBytes;
    const int pages = clamp_page(entry, p.last_page);
    const int token0 = u.start + tile * kTileKeys;
    // TMA loads the slabs below `by_tma`: K's that hold a key of the unit, V's that hold only its
    // keys. K's other slabs keep what the stage held (their scores are masked); V's the warp
    // copies, zero-filled past the end.
    const int keys = u.end - token0;
    const int by_tma = ::max(
        0, ::min(kSlabs, kV ? keys / kSlabKeys : (keys + kSlabKeys - 1) / kSlabKeys));
    while (pipeline.producer_try_acquire(write) != cutlass::BarrierStatus::WaitDone) {
    }
    if constexpr (kV) {
      copy_tail<kKeys>(p, u, token0, by_tma, pages, smem, write.index());
    }
    auto* barrier = pipeline.producer_get_barrier(write);
    if (leader) {
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(barrier, by_tma * kSlabBytes);
    }
    // The descriptor stays in the kernel's parameters (a TMA copy takes its address).
    auto const& tma = [&]() -> auto const& {
      if constexpr (kV) {
        return copies.v;
      } else {
        return copies.k;
      }
    }();
    Tensor m = tma.get_tma_tensor(kV ? p.shape_v : p.shape_k);
    auto issue = [&](int s, int page) {
      const int slot_tile = ((token0 + s * kSlabKeys) & ((1 << p.page_shift) - 1)) / kSlabKeys;
      auto cta = tma.get_slice(0);
      if constexpr (kV) {
        Tensor g = local_tile(m(_, _, make_coord(page, make_coord(0, u.kv_head))),
                              Shape<Int<kHeadDim>, Int<kSlabKeys>>{}, make_coord(0, slot_tile));
        Tensor sv = make_tensor(make_smem_ptr(smem), SmemLayoutV{});
        Tensor slab = local_tile(sv(_, _, write.index()), Shape<Int<kHeadDim>, Int<kSlabKeys>>{},
                                 make_coord(0, s));
        copy(tma.with(*barrier), cta.partition_S(g), cta.partition_D(slab));
      } else {
        Tensor g = local_tile(m(_, _, make_coord(page, make_coord(0, u.kv_head))),
                              Shape<Int<kSlabKeys>, Int<kHeadDim>>{}, make_coord(slot_tile, 0));
        Tensor sk = make_tensor(make_smem_ptr(smem), SmemLayoutK{});
        Tensor slab = local_tile(sk(_, _, write.index()), Shape<Int<kSlabKeys>, Int<kHeadDim>>{},
                                 make_coord(s, 0));
        copy(tma.with(*barrier), cta.partition_S(g), cta.partition_D(slab));
      }
    };
    // The leader issues every slab's copies; the slabs' pages (a lane's each) reach it in groups
    // of kGroup, each group's shuffles issued together, so that its copies wait for one
    // shuffle's latency per group, not per slab (pages of 16: 16 x 8k decodes in 141.9 us, 163.2
    // with a shuffle per slab; docs/SERVING.md). Each lane issuing its own slab's copies (ptxas
    // serialises them in a loop of its own) took K's 16 x 8k to 144.7 us but the serving example
    // 2.5% faster, and V's came out wrong in some builds.
    constexpr int kGroup = kSlabs < 4 ? kSlabs : 4;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int first = 0; first < by_tma; first += kGroup) {
      int page[kGroup];
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kGroup; ++g) {
        page[g] = __shfl_sync(0xffffffffu, pages, first + g);
      }
      if (leader) {
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < kGroup; ++g) {
          if (first + g < by_tma) {
            issue(first + g, page[g]);
          }
        }
      }
    }
    ++write;
  }

  // The warp's copy of V's slabs (of kKeys keys) [first, kSlabs) of the tile at token0 into
  // `stage`: rows past the unit's end and columns past the head dim become 0. Published to the
  // async proxy (the tensor cores read the stage through it) before the caller's arrival.
  template <int kKeys>
  CUTLASS_DEVICE static void copy_tail(Params const& p, Unit const& u, int token0, int first,
                                       int pages, Element* smem, int stage) {
    using namespace cute;
    constexpr int kSlabKeys = kKeys, kSlabs = Slab<kKeys>::kSlabs;
    if (first == kSlabs) {
      return;
    }
    constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per key
    Tensor sv = make_tensor(make_smem_ptr(smem), SmemLayoutV{});
    const int lane = int(threadIdx.x) % 32;
    const int64_t head = u.kv_head;
    // One chunk in flight per lane: the producer warp has few registers (kernel.cuh).
    CUTLASS_PRAGMA_NO_UNROLL
    for (int s = first; s < kSlabs; ++s) {
      const int page = __shfl_sync(0xffffffffu, pages, s);
      CUTLASS_PRAGMA_NO_UNROLL
      for (int c = lane; c < kSlabKeys * kChunks; c += 32) {
        const int key = s * kSlabKeys + c / kChunks, dim = c % kChunks * 8;
        const int token = token0 + key;
        uint4 value = make_uint4(0, 0, 0, 0);
        if (token < u.end && dim < p.head_dim) {
          const int64_t slot = token & ((1 << p.page_shift) - 1);
          value = *reinterpret_cast<const uint4*>(p.v + page * p.v_page + slot * p.v_slot +
                                                  head * p.v_head + dim);
        }
        *reinterpret_cast<uint4*>(&sv(dim, key, stage)) = value;
      }
    }
    cutlass::arch::fence_view_async_shared();
    __syncwarp();
  }
};

}  // namespace flashcore::sm90
