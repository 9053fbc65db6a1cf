// The tile scheduler of flashcore's Hopper kernel: which (query block, batch, head) each thread
// block works on, and in which order.
//
// Work units are numbered query-block fastest, so the blocks of one head run side by side and
// share its K and V through L2. One block per unit: within a head the last query block comes
// first, since under a causal mask it visits the most key tiles; the hardware hands the next unit
// to whichever SM frees first, so the short blocks fill the tail. Persistent: a grid of at most
// one block per SM walks the units with a stride of the grid. When there are more query blocks
// than SMs and a causal mask makes them uneven, a unit is a pair: the pair `i` of a head is its
// query blocks `m_blocks - 1 - i` (the longest) and `i` (the shortest). Every pair of a head then
// visits about the same number of key tiles, so a static walk stays balanced without a work
// queue (measured: docs/HOPPER.md, round 7); without a mask a unit is one block (round 23). With
// an odd count the middle block is a unit of its own, half a pair's work. Where the grid is a
// multiple of the units per head, a block would meet the same position of every head it visits
// (the single middle block at every step, say, and another block never), so there each step
// rotates the positions within every head by one and every block meets each position in turn
// (round 23); a step of the grid then covers whole heads, so the rotation maps the step's units
// onto themselves.
//
// A decode batch (one query block per head) with more units than blocks is walked in the order
// of FmhaArgs::sequence_order instead (longest sequence first where the host knows the key
// counts, else batch order): unit u is (rank u / heads, head u % heads), rank r being sequence
// order[r], so a sequence's heads (whose K and V lie side by side, and whose query heads share
// a kv head's) run at once; and the steps deal the units back and forth (step t gives block c
// unit t * grid + c, or t * grid + grid - 1 - c when t is odd), so that the block that took one
// of a step's longest units takes one of the next step's shortest.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/fast_math.h"
#include "flashcore/plan.h"
#include "sm90/problem.cuh"

namespace flashcore::sm90 {

// The order in which the blocks walk a decode batch's sequences (FmhaArgs::sequence_order;
// `sequences` 0: the scheduler's own walk).
struct SequenceOrder {
  int32_t sequences = 0;
  uint16_t rank[kMaxSplitSequences] = {};
};

template <bool kPersistent>
struct TileScheduler {
  struct Params {
    int units;                    // (query blocks or pairs of them) x batch x heads
    int m_blocks;                 // query blocks per head
    cutlass::FastDivmod m_div;    // unit -> (query block or pair, batch * heads)
    cutlass::FastDivmod b_div;    // batch * heads -> (batch, head)
    int grid;
    bool paired;                  // a unit is a pair of query blocks
    int per_head;                 // units per head
    bool rotate;                  // each step rotates the positions in a head (grid % per_head 0)
    // In `order`, dealt back and forth (order.sequences > 0): unit -> (rank, head).
    cutlass::FastDivmod h_div;
    SequenceOrder order;
  };

  // `order`: the batch's sequences in walking order (batch entries), or null; taken where the
  // walk is a decode's (one query block per head) with more units than blocks.
  static Params make(ProblemShape const& p, int block_rows, int sm_count,
                     const uint16_t* order = nullptr) {
    const int heads = cute::size<1>(p);
    const int m_blocks = (seq_q(p) + block_rows - 1) / block_rows;
    // Pairs balance blocks that visit different numbers of key tiles: only where the causal
    // side hides from the first block keys that later ones see (without a mask every block
    // visits them all, and a unit of one block splits the work finer).
    const bool uneven = int64_t(causal_offset(p)) + block_rows < seq_k(p);
    const bool paired =
        kPersistent && uneven && int64_t(m_blocks) * cute::get<0>(p) * heads > sm_count;
    const int per_head = paired ? (m_blocks + 1) / 2 : m_blocks;
    const int units = per_head * cute::get<0>(p) * heads;
    const int grid = kPersistent ? std::max(1, std::min(units, sm_count)) : units;
    Params params{units, m_blocks, cutlass::FastDivmod(per_head),
                  cutlass::FastDivmod(cute::get<0>(p)), grid, paired,
                  per_head, kPersistent && per_head > 1 && grid % per_head == 0,
                  cutlass::FastDivmod(heads), SequenceOrder{}};
    const int batch = cute::get<0>(p);
    if (kPersistent && order != nullptr && m_blocks == 1 && !paired && units > grid &&
        batch <= kMaxSplitSequences) {
      params.order.sequences = batch;
      std::copy(order, order + batch, params.order.rank);
    }
    return params;
  }

  static dim3 grid_shape(Params const& params) { return dim3(params.grid, 1, 1); }

  Params const& params;
  int unit;
  int shift = 0;        // rotate: the positions' rotation at this step, (steps walked) % per_head
  bool second = false;  // paired: the pair's shorter query block
  int step = 0;         // longest first: the steps walked

  CUTLASS_DEVICE explicit TileScheduler(Params const& p) : params(p), unit(blockIdx.x) {}

  CUTLASS_DEVICE bool is_valid() const { return unit < params.units; }

  // The unit's position within its head (the pair or query block index), rotated by the step
  // where the grid covers whole heads.
  CUTLASS_DEVICE int position(int m) const {
    const int r = m + shift;
    return r < params.per_head ? r : r - params.per_head;
  }

  // (query block, _0, (batch, head)), head being the flat index into (group, heads_kv).
  CUTLASS_DEVICE auto get_block_coord() const {
    if (params.order.sequences > 0) {
      int rank = 0, h = 0;
      params.h_div(rank, h, unit);
      return cute::make_coord(0, cute::_0{}, cute::make_coord(int(params.order.rank[rank]), h));
    }
    int rest = 0, m = 0, b = 0, h = 0;
    params.m_div(rest, m, unit);
    params.b_div(h, b, rest);
    m = position(m);
    return cute::make_coord(second ? m : params.m_blocks - 1 - m, cute::_0{},
                            cute::make_coord(b, h));
  }

  CUTLASS_DEVICE TileScheduler& operator++() {
    if constexpr (kPersistent) {
      if (params.order.sequences > 0) {
        ++step;
        const int grid = int(gridDim.x), block = int(blockIdx.x);
        unit = step * grid + ((step & 1) != 0 ? grid - 1 - block : block);
        return *this;
      }
      // The pair's second block, unless the pair is the middle block of an odd count.
      const int m = position(params.m_div.rem(unit));
      if (params.paired && !second && m != params.m_blocks - 1 - m) {
        second = true;
        return *this;
      }
      second = false;
      unit += int(gridDim.x);
      if (params.rotate) {
        shift = shift + 1 < params.per_head ? shift + 1 : 0;
      }
    } else {
      unit += params.units;
    }
    return *this;
  }
};

}  // namespace flashcore::sm90
