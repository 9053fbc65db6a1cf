// The tile scheduler of flashcore's Hopper kernel: which (query block, batch, head) each thread
// block works on, and in which order.
//
// Work units are numbered query-block fastest, so the blocks of one head run side by side and
// share its K and V through L2. Within a head the last query block comes first: under a causal
// mask it visits the most key tiles, so the longest work starts earliest and the short blocks
// fill the tail. Persistent: a grid of at most one block per SM walks the units with a stride
// of the grid; otherwise each block runs one unit.
#pragma once

#include <algorithm>

#include "cute/tensor.hpp"
#include "cutlass/fast_math.h"
#include "sm90/problem.cuh"

namespace flashcore::sm90 {

template <bool kPersistent>
struct TileScheduler {
  struct Params {
    int units;                    // query blocks x batch x heads
    int m_blocks;                 // query blocks per head
    cutlass::FastDivmod m_div;    // unit -> (query block, batch * heads)
    cutlass::FastDivmod b_div;    // batch * heads -> (batch, head)
    int grid;
  };

  static Params make(ProblemShape const& p, int block_rows, int sm_count) {
    const int heads = cute::size<1>(p);
    const int m_blocks = (seq_q(p) + block_rows - 1) / block_rows;
    const int units = m_blocks * cute::get<0>(p) * heads;
    const int grid = kPersistent ? std::max(1, std::min(units, sm_count)) : units;
    return Params{units, m_blocks, cutlass::FastDivmod(m_blocks), cutlass::FastDivmod(cute::get<0>(p)),
                  grid};
  }

  static dim3 grid_shape(Params const& params) { return dim3(params.grid, 1, 1); }

  Params const& params;
  int unit;

  CUTLASS_DEVICE explicit TileScheduler(Params const& p) : params(p), unit(blockIdx.x) {}

  CUTLASS_DEVICE bool is_valid() const { return unit < params.units; }

  // (query block, _0, (batch, head)), head being the flat index into (group, heads_kv).
  CUTLASS_DEVICE auto get_block_coord() const {
    int rest = 0, m = 0, b = 0, h = 0;
    params.m_div(rest, m, unit);
    params.b_div(h, b, rest);
    return cute::make_coord(params.m_blocks - 1 - m, cute::_0{}, cute::make_coord(b, h));
  }

  CUTLASS_DEVICE TileScheduler& operator++() {
    unit += kPersistent ? int(gridDim.x) : params.units;
    return *this;
  }
};

}  // namespace flashcore::sm90
