// The epilogue of flashcore's Hopper kernel: each consumer warpgroup writes its normalised output
// rows straight from registers to global memory (two adjacent columns per store), and the
// logsumexp when asked for. Unlike example 88's TMA epilogue it takes any output strides the
// validator accepts, GQA's nested heads, partial query tiles and an optional LSE; rows at or past
// seq_q and columns at or past head_dim are never written. A variable-length batch's sequence
// writes its rows from its first token on (the problem's q_start).
#pragma once

#include <cstdint>

#include "collective/fmha_common.hpp"  // CUTLASS examples/88_hopper_fmha: layout_acc_mn
#include "cute/tensor.hpp"
#include "sm90/problem.cuh"

namespace flashcore::sm90 {

template <class Element>
struct Epilogue {
  struct Params {
    Element* out;
    int64_t o_seq, o_head, o_batch;  // output strides in elements (head-dim stride 1)
    float* lse;                      // [batch, heads, lse_rows], or nullptr
    int64_t lse_rows;                // seq_q; a variable-length batch's token count
    // A row's logsumexp step, and the rows per query token along the query axis (q_start):
    // 1 and 1, or for a variable-length batch's packed heads (kernel.cuh's Sequences) the
    // token count (its rows are heads) and the token's rows.
    int64_t lse_row = 1;
    int token_rows = 1;
  };

  // Where row 0 of a unit's (batch entry, head `head`) logsumexp lies: its head's rows, from
  // the unit's first query token on. Row i lies lse_row further per row.
  CUTLASS_DEVICE static int64_t lse_index(Params const& params, ProblemShape const& p, int batch,
                                          int head) {
    return (int64_t(batch) * cute::size<1>(p) + head) * params.lse_rows +
           q_start(p) / params.token_rows;
  }

  // `acc` and `lse` are one warpgroup's (rows of the P.V tile, head dim) accumulator and its
  // per-row logsumexp; `m_rows` is the warpgroup's first query row of the sequence, whose tokens
  // start at q_start(p) in batch entry `batch`.
  template <class TileShapePV, class Acc, class Lse, class TiledMma>
  CUTLASS_DEVICE static void store(TileShapePV const& tile, Acc const& acc, Lse const& lse,
                                   TiledMma const& mma, ProblemShape const& p,
                                   Params const& params, int m_rows, int batch, int head) {
    using namespace cute;
    const int rows = seq_q(p), dim = get<4>(p);
    auto thr = mma.get_thread_slice(threadIdx.x);
    Tensor coord = thr.partition_C(make_identity_tensor(take<0, 2>(tile)));  // (row, col) per value
    static_assert(decltype(size(coord))::value % 2 == 0, "accumulator values come in pairs");

    Element* base = params.out + batch * params.o_batch + head * params.o_head +
                    int64_t(q_start(p)) * params.o_seq;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      const int row = m_rows + get<0>(coord(i));
      const int col = get<1>(coord(i));
      if (row >= rows) {
        continue;
      }
      Element* dst = base + row * params.o_seq + col;
      const bool pair = get<0>(coord(i + 1)) == get<0>(coord(i)) && get<1>(coord(i + 1)) == col + 1;
      if (pair && col + 1 < dim) {
        cutlass::Array<Element, 2> two;
        two[0] = Element(acc(i));
        two[1] = Element(acc(i + 1));
        *reinterpret_cast<cutlass::Array<Element, 2>*>(dst) = two;  // 4-byte aligned: col even
      } else {
        if (col < dim) {
          dst[0] = Element(acc(i));
        }
        const int row1 = m_rows + get<0>(coord(i + 1)), col1 = get<1>(coord(i + 1));
        if (row1 < rows && col1 < dim) {
          base[row1 * params.o_seq + col1] = Element(acc(i + 1));
        }
      }
    }

    if (params.lse != nullptr) {
      // The lane holding column 0 of a row writes that row's logsumexp.
      Tensor coord_mn = make_tensor(coord.data(),
                                    cutlass::fmha::collective::layout_acc_mn(mma, coord.layout()));
      float* lse_head = params.lse + lse_index(params, p, batch, head);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(coord_mn); ++i) {
        const int row = m_rows + get<0>(coord_mn(i, 0));
        if (get<1>(coord_mn(i, 0)) == 0 && row < rows) {
          lse_head[row * params.lse_row] = lse(i);
        }
      }
    }
  }

  // A key split's partial state (split-KV): the warpgroup's normalised rows in f32 and their
  // logsumexps, query row i of the split's (batch, head) at row `row0 + i * lse_row` of `part_out`
  // ([row][head_dim]) and `part_lse` (split/combine.cuh's Partials), and logsumexp -inf for
  // the `absent` split slots after this one (each `slot_rows` further); rows at or past seq_q
  // and columns at or past head_dim are never written.
  template <class TileShapePV, class Acc, class Lse, class TiledMma>
  CUTLASS_DEVICE static void store_partial(TileShapePV const& tile, Acc const& acc,
                                           Lse const& lse, TiledMma const& mma,
                                           ProblemShape const& p, float* part_out,
                                           float* part_lse, int64_t row0, int64_t lse_row,
                                           int m_rows, int64_t slot_rows, int absent) {
    using namespace cute;
    const int rows = seq_q(p), dim = get<4>(p);
    auto thr = mma.get_thread_slice(threadIdx.x);
    Tensor coord = thr.partition_C(make_identity_tensor(take<0, 2>(tile)));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      const int row = m_rows + get<0>(coord(i)), col = get<1>(coord(i));
      if (row < rows && col < dim) {
        part_out[(row0 + row * lse_row) * dim + col] = acc(i);
      }
    }
    Tensor coord_mn = make_tensor(coord.data(),
                                  cutlass::fmha::collective::layout_acc_mn(mma, coord.layout()));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<0>(coord_mn); ++i) {
      const int row = m_rows + get<0>(coord_mn(i, 0));
      if (get<1>(coord_mn(i, 0)) == 0 && row < rows) {
        float* slot = part_lse + row0 + row * lse_row;
        slot[0] = lse(i);
        for (int s = 1; s <= absent; ++s) {
          slot[s * slot_rows] = -INFINITY;
        }
      }
    }
  }
};

}  // namespace flashcore::sm90
