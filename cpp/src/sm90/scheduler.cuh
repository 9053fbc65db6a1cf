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
//
// With `kTail` (kernel.cuh's kFlagTailPieces): equal units (no mask, one query block each, no
// order) whose last wave would leave blocks idle long enough (plan.h sm90_tail_units) walk whole
// units for the whole waves only. The last wave's units are cut into key tiles, and block b takes
// tail tiles [b * tiles / grid, (b + 1) * tiles / grid) in order: fewer than a unit's, so at most
// the end of one unit and the start of the next. Each piece is a key split of its unit, which
// the kernel stores as a partial state in the slot of its rank among the unit's pieces, and
// split/combine.cuh merges the slots, its rows mapped back to the walk's units by TailRows.
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

// The last wave in pieces (`tiles` 0: none): units from `first` on, `unit_tiles` key tiles
// each, `tiles` in all (at least one per block, so every block between a unit's first and last
// holds a piece of it), dealt to the blocks in ranges; a unit is cut into `slots` pieces at most.
struct Tail {
  int first = 0;
  int unit_tiles = 0;
  int64_t tiles = 0;
  int slots = 0;

  // Block b's first tail tile (b = grid: the end of the last block's range).
  CUTLASS_HOST_DEVICE int64_t start(int b, int grid) const { return int64_t(b) * tiles / grid; }
  // The block whose range holds tail tile t: the last b with start(b) <= t.
  CUTLASS_HOST_DEVICE int block_of(int64_t t, int grid) const {
    return int(((t + 1) * grid + tiles - 1) / tiles - 1);
  }
  // The tail of `cut` units from `first` on, dealt to `grid` blocks.
  static Tail make(int first, int cut, int unit_tiles, int grid) {
    Tail t{first, unit_tiles, int64_t(cut) * unit_tiles, 0};
    for (int u = 0; u < cut; ++u) {
      const int64_t begin = int64_t(u) * unit_tiles;
      t.slots = std::max(t.slots, t.block_of(begin + unit_tiles - 1, grid) -
                                      t.block_of(begin, grid) + 1);
    }
    return t;
  }
};

// A piece of a tail unit: key tiles [first_tile, first_tile + tiles) of it, the slot of its
// partial state, and on the unit's last piece the slots after its own that no piece fills.
struct Piece {
  int first_tile, tiles, slot, absent;
};

// A position `m` of a head's `per_head` units, rotated by `shift` (< per_head).
CUTLASS_HOST_DEVICE int rotated(int m, int shift, int per_head) {
  const int r = m + shift;
  return r < per_head ? r : r - per_head;
}

// Where a unit of the walk of a dense batch lies: its query block, batch entry and head (the
// flat index into (group, heads_kv)). `m_div` splits a unit into (its position in the head,
// batch x heads), `b_div` the latter into (head, batch entry), so batch entries run fastest,
// then heads; position m (rotated by `shift`) is query block m_blocks - 1 - m, the last first,
// or block m for a pair's `second` (shorter) block.
struct UnitCoord {
  int block, batch, head;
};
CUTLASS_HOST_DEVICE UnitCoord walk_coord(int unit, cutlass::FastDivmod const& m_div,
                                         cutlass::FastDivmod const& b_div, int m_blocks,
                                         int per_head, int shift, bool second) {
  int rest = 0, m = 0, b = 0, h = 0;
  m_div(rest, m, unit);
  b_div(h, b, rest);
  m = rotated(m, shift, per_head);
  return {second ? m : m_blocks - 1 - m, b, h};
}

template <bool kPersistent, bool kTail = false>
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
    Tail tail;
  };

  // `order`: the batch's sequences in walking order (batch entries), or null; taken where the
  // walk is a decode's (one query block per head) with more units than blocks. `uniform`: every
  // (batch, head) has the problem's lengths (a dense batch without key splits or packed heads),
  // so that with kTail the last wave may go in pieces of `block_keys`-key tiles.
  static Params make(ProblemShape const& p, int block_rows, int block_keys, int sm_count,
                     const uint16_t* order = nullptr, bool uniform = false) {
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
                  cutlass::FastDivmod(heads), SequenceOrder{}, Tail{}};
    const int batch = cute::get<0>(p);
    if (kPersistent && order != nullptr && m_blocks == 1 && !paired && units > grid &&
        batch <= kMaxSplitSequences) {
      params.order.sequences = batch;
      std::copy(order, order + batch, params.order.rank);
    }
    // Every unit the same work: one query block each, no band (no mask, no window), no order.
    const bool banded = causal_offset(p) < seq_k(p) || window_offset(p) > -seq_q(p);
    if (kPersistent && kTail && uniform && !paired && !banded && params.order.sequences == 0) {
      const int unit_tiles = (seq_k(p) + block_keys - 1) / block_keys;
      const int64_t cut = sm90_tail_units(units, grid, unit_tiles);
      const Tail tail = cut > 0 ? Tail::make(units - int(cut), int(cut), unit_tiles, grid) : Tail{};
      if (tail.slots <= kMaxKvSplits) {  // the merge reads at most that many states per row
        params.tail = tail;
      }
    }
    return params;
  }

  static dim3 grid_shape(Params const& params) { return dim3(params.grid, 1, 1); }

  Params const& params;
  int unit;
  int shift = 0;        // rotate: the positions' rotation at this step, (steps walked) % per_head
  bool second = false;  // paired: the pair's shorter query block
  int step = 0;         // longest first: the steps walked
  int64_t tile = 0;     // in the tail: this piece's first tail tile, and the block's range end
  int64_t tile_end = 0;

  CUTLASS_DEVICE explicit TileScheduler(Params const& p) : params(p), unit(blockIdx.x) {}

  CUTLASS_DEVICE bool is_valid() const { return unit < params.units; }

  // Whether the unit is a piece of the last wave's (piece()); never without kTail.
  CUTLASS_DEVICE bool in_tail() const { return kTail && tile < tile_end; }

  CUTLASS_DEVICE Piece piece() const {
    Tail const& t = params.tail;
    const int grid = int(gridDim.x);
    const int64_t begin = int64_t(unit - t.first) * t.unit_tiles, end = begin + t.unit_tiles;
    const int64_t last = cute::min(tile_end, end);
    const int slot = int(blockIdx.x) - t.block_of(begin, grid);
    return {int(tile - begin), int(last - tile), slot, last == end ? t.slots - 1 - slot : 0};
  }

  // The unit's position within its head (the pair or query block index), rotated by the step
  // where the grid covers whole heads.
  CUTLASS_DEVICE int position(int m) const { return rotated(m, shift, params.per_head); }

  // (query block, _0, (batch, head)), head being the flat index into (group, heads_kv).
  CUTLASS_DEVICE auto get_block_coord() const {
    if (params.order.sequences > 0) {
      int rank = 0, h = 0;
      params.h_div(rank, h, unit);
      return cute::make_coord(0, cute::_0{}, cute::make_coord(int(params.order.rank[rank]), h));
    }
    const UnitCoord c = walk_coord(unit, params.m_div, params.b_div, params.m_blocks,
                                   params.per_head, shift, second);
    return cute::make_coord(c.block, cute::_0{}, cute::make_coord(c.batch, c.head));
  }

  CUTLASS_DEVICE TileScheduler& operator++() {
    if constexpr (kPersistent) {
      if (params.order.sequences > 0) {
        ++step;
        const int grid = int(gridDim.x), block = int(blockIdx.x);
        unit = step * grid + ((step & 1) != 0 ? grid - 1 - block : block);
        return *this;
      }
      if (in_tail()) {  // the next piece: the rest of the range, in the next unit
        tile = cute::min(tile_end, int64_t(unit - params.tail.first + 1) * params.tail.unit_tiles);
        unit = in_tail() ? unit + 1 : params.units;
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
      if (kTail && params.tail.tiles > 0 && unit >= params.tail.first) {  // the last wave
        Tail const& t = params.tail;
        tile = t.start(int(blockIdx.x), int(gridDim.x));
        tile_end = t.start(int(blockIdx.x) + 1, int(gridDim.x));
        unit = in_tail() ? t.first + int(tile / t.unit_tiles) : params.units;
        shift = 0;  // the whole waves map their units onto themselves; the tail is unrotated
      }
    } else {
      unit += params.units;
    }
    return *this;
  }
};

// The split-KV combine's row map for the last wave's pieces (split/combine.cuh's LseRows says
// what a row map is): a piece stores query row r of its unit's block at partial row (unit -
// Tail::first) * unit_rows + r (kernel.cuh's Parts), and the unit lies where the walk put it
// (walk_coord; the tail is unrotated and has no pairs).
struct TailRows {
  int first = 0, unit_rows = 0, m_blocks = 0, per_head = 0;
  cutlass::FastDivmod m_div, b_div;

  template <class Params>
  static TailRows make(Params const& p, int unit_rows) {
    return {p.tail.first, unit_rows, p.m_blocks, p.per_head, p.m_div, p.b_div};
  }
  // The partial rows of one slot: every tail unit's.
  int64_t rows(int units) const { return int64_t(units - first) * unit_rows; }

  // `c`: the combine's CombineParams (seq_q rows per head, heads).
  template <class CombineParams>
  CUTLASS_DEVICE bool operator()(int64_t row, CombineParams const& c, int64_t* out_row) const {
    const UnitCoord u = walk_coord(first + int(row / unit_rows), m_div, b_div, m_blocks,
                                   per_head, 0, false);
    const int64_t i = int64_t(u.block) * unit_rows + row % unit_rows;
    if (i >= c.seq_q) {
      return false;  // past the last query block's rows: no piece wrote it
    }
    *out_row = (int64_t(u.batch) * c.heads + u.head) * c.seq_q + i;
    return true;
  }
};

}  // namespace flashcore::sm90
