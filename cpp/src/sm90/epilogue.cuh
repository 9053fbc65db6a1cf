// The epilogue of flashcore's Hopper kernel: each consumer warpgroup writes its normalised output
// rows to global memory, and the logsumexp when asked for. Where the tile leaves shared memory
// for it (plan.h's sm90_staging_bytes), the warpgroup stages its rows there and stores whole
// 16-byte pieces of them (docs/HOPPER.md, round 46); otherwise it stores two adjacent columns
// per store straight from registers, at constant offsets from the row's address (round 29).
// Unlike example 88's TMA epilogue it takes any output strides the validator accepts (multiples
// of 8 elements from a 16-byte aligned address), GQA's nested heads, partial query tiles and an
// optional LSE; rows at or past seq_q and columns at or past head_dim are never written. A
// variable-length batch's sequence writes its rows from its first token on (the problem's
// q_start).
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "sm90/problem.cuh"
#include "sm90/rows.cuh"

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

  // The (row, column) of each accumulator value of this thread, as a (row, column) tensor like
  // the accumulator's as_rows view.
  template <class TileShapePV, class TiledMma>
  CUTLASS_DEVICE static auto coords_mn(TileShapePV const& tile, TiledMma const& mma) {
    using namespace cute;
    return as_rows(mma, mma.get_thread_slice(threadIdx.x)
                            .partition_C(make_identity_tensor(take<0, 2>(tile))));
  }

  // Calls `write(i, row)` for each of this thread's rows i below `rows` whose column 0 it holds
  // (one lane per row): the row's logsumexp goes there.
  template <class CoordMN, class Write>
  CUTLASS_DEVICE static void for_rows_at_column_0(CoordMN const& coord, int m_rows, int rows,
                                                  Write&& write) {
    using namespace cute;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<0>(coord); ++i) {
      const int row = m_rows + get<0>(coord(i, 0));
      if (get<1>(coord(i, 0)) == 0 && row < rows) {
        write(i, row);
      }
    }
  }

  // Whether value k of row i of a thread's accumulator view and value k + 1 are adjacent columns
  // (a pair, as the accumulator layout holds them); a constant once loops over them unroll.
  template <class CoordMN>
  CUTLASS_DEVICE static bool pairs_with_next(CoordMN const& coord, int i, int k) {
    using namespace cute;
    return k + 1 < size<1>(coord) && get<1>(coord(i, k + 1)) == get<1>(coord(i, k)) + 1;
  }

  // Stores each of this thread's rows below `rows`: `row_at(row)` is the row's first element
  // (column 0), and `put(dst, a, b, pair)` stores a at dst and, for a pair (two adjacent columns,
  // as the accumulator layout holds them), b after it. Columns at or past `dim` are never
  // written; `dim` is a multiple of 8 (the launcher's check), so a pair is either wholly inside
  // or wholly outside it.
  template <class AccMN, class CoordMN, class RowAt, class Put>
  CUTLASS_DEVICE static void store_rows(AccMN const& acc, CoordMN const& coord, int m_rows,
                                        int rows, int dim, RowAt&& row_at, Put&& put) {
    using namespace cute;
    const int col0 = get<1>(coord(0, 0));
    const int room = dim - col0;  // columns at col0 + at exist for at < room
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<0>(acc); ++i) {
      const int row = m_rows + get<0>(coord(i, 0));
      if (row >= rows) {
        continue;
      }
      auto* dst = row_at(row) + col0;
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < size<1>(acc); ++k) {
        if (k > 0 && pairs_with_next(coord, i, k - 1)) {
          continue;  // stored with the first of its pair
        }
        const int at = get<1>(coord(i, k)) - col0;  // a constant once unrolled
        const bool pair = pairs_with_next(coord, i, k);
        if (at < room) {
          put(dst + at, acc(i, k), pair ? acc(i, k + 1) : 0.f, pair);
        }
      }
    }
  }

  // A warpgroup's staging of its output rows: `rows`, its rows x the tile's head dim in shared
  // memory (unused, and may be null, where the kernel stores from registers), and the named
  // barrier (a user id past the issue turns', turns.cuh) its 128 threads sync on.
  struct Staging {
    Element* rows;
    uint32_t barrier;
  };

  // Output rows staged and not yet stored: `rows` rows (0: none) from `first`, `stride` apart,
  // `dim` columns each.
  struct Pending {
    Element* first = nullptr;
    int64_t stride = 0;
    int rows = 0;
    int dim = 0;
  };

  // Where piece `piece` (columns 8 * piece to 8 * piece + 7) of staged row r lies, in elements:
  // a row's 16-byte pieces are swizzled by the row (p ^ (r % 8)), so that neither the pairs'
  // writes (a warp's lanes hold 8 rows at the same columns) nor a warp's reads of consecutive
  // pieces meet in a shared memory bank.
  template <int kDim>
  CUTLASS_DEVICE static int staged_at(int r, int piece) {
    return r * kDim + ((piece ^ (r % 8)) * 8);
  }

  // Writes this warpgroup's rows into `stage` (its rows x kDim elements), for flush to store.
  // Unless kSynced (the caller's own barriers order them so), the warpgroup syncs before the
  // writes (the last flush read everything) and after them (every write is visible to every
  // thread's flush).
  template <int kDim, bool kSynced, class AccMN, class CoordMN>
  CUTLASS_DEVICE static void stage_rows(AccMN const& acc, CoordMN const& coord, Staging stage) {
    using namespace cute;
    if constexpr (!kSynced) {
      sync(stage);
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<0>(acc); ++i) {
      const int r = get<0>(coord(i, 0));
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < size<1>(acc); ++k) {
        if (k > 0 && pairs_with_next(coord, i, k - 1)) {
          continue;  // written with the first of its pair
        }
        const int c = get<1>(coord(i, k));
        Element* to = stage.rows + staged_at<kDim>(r, c / 8) + c % 8;
        if (pairs_with_next(coord, i, k)) {  // c is even: both columns lie in one piece
          cutlass::Array<Element, 2> two;
          two[0] = Element(acc(i, k));
          two[1] = Element(acc(i, k + 1));
          *reinterpret_cast<cutlass::Array<Element, 2>*>(to) = two;
        } else {
          to[0] = Element(acc(i, k));
        }
      }
    }
    if constexpr (!kSynced) {
      sync(stage);
    }
  }

  // Syncs the warpgroup's threads on its staging barrier.
  CUTLASS_DEVICE static void sync(Staging stage) {
    cutlass::arch::NamedBarrier::sync(cutlass::NumThreadsPerWarpGroup, stage.barrier);
  }

  // Stores the pending rows from `stage` (kRows x kDim elements): each thread whole 16-byte
  // pieces, consecutive threads consecutive pieces (a warp 512 bytes), each predicated on its
  // row and columns.
  template <int kRows, int kDim>
  CUTLASS_DEVICE static void flush(Pending const& pending, Staging stage) {
    constexpr int kPieces = kDim / 8;
    constexpr int kThreads = cutlass::NumThreadsPerWarpGroup;
    static_assert(kDim % 64 == 0, "a row spans the swizzle's 8 pieces");
    static_assert(kRows * kPieces % kThreads == 0, "every thread stores as many pieces");
    const int t = threadIdx.x % kThreads;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kRows * kPieces / kThreads; ++j) {
      const int n = t + j * kThreads, r = n / kPieces, piece = n % kPieces;
      if (r < pending.rows && piece * 8 < pending.dim) {
        *reinterpret_cast<uint4*>(pending.first + r * pending.stride + piece * 8) =
            *reinterpret_cast<const uint4*>(stage.rows + staged_at<kDim>(r, piece));
      }
    }
  }

  // `acc` and `lse` are one warpgroup's (rows of the P.V tile, head dim) accumulator and its
  // per-row logsumexp; `m_rows` is the warpgroup's first query row of the sequence, whose tokens
  // start at q_start(p) in batch entry `batch`. Where kStaged, the rows go to `stage` and
  // `pending` says where they belong (flush stores them; kSynced as for stage_rows); else they
  // are stored now.
  template <bool kStaged, bool kSynced, class TileShapePV, class Acc, class Lse, class TiledMma>
  CUTLASS_DEVICE static void store(TileShapePV const& tile, Acc const& acc, Lse const& lse,
                                   TiledMma const& mma, ProblemShape const& p,
                                   Params const& params, int m_rows, int batch, int head,
                                   Staging stage, Pending& pending) {
    using namespace cute;
    const int rows = seq_q(p);
    Tensor coord = coords_mn(tile, mma);
    Element* base = params.out + batch * params.o_batch + head * params.o_head +
                    int64_t(q_start(p)) * params.o_seq;
    if constexpr (kStaged) {
      stage_rows<decltype(size<1>(tile))::value, kSynced>(as_rows(mma, acc), coord, stage);
      pending.first = base + int64_t(m_rows) * params.o_seq;
      pending.stride = params.o_seq;
      pending.rows = cute::max(0, cute::min(int(size<0>(tile)), rows - m_rows));
      pending.dim = get<4>(p);
    } else {
      store_rows(as_rows(mma, acc), coord, m_rows, rows, get<4>(p),
                 [&](int row) { return base + row * params.o_seq; },
        [](Element* dst, float a, float b, bool pair) {
          if (pair) {
            cutlass::Array<Element, 2> two;
            two[0] = Element(a);
            two[1] = Element(b);
            *reinterpret_cast<cutlass::Array<Element, 2>*>(dst) = two;  // 4-byte aligned: even
          } else {
            dst[0] = Element(a);
          }
        });
    }

    if (params.lse != nullptr) {
      float* lse_head = params.lse + lse_index(params, p, batch, head);
      for_rows_at_column_0(coord, m_rows, rows,
                           [&](int i, int row) { lse_head[row * params.lse_row] = lse(i); });
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
    Tensor coord = coords_mn(tile, mma);
    store_rows(
        as_rows(mma, acc), coord, m_rows, rows, dim,
        [&](int row) { return part_out + (row0 + row * lse_row) * dim; },
        [](float* dst, float a, float b, bool pair) {
          if (pair) {
            *reinterpret_cast<float2*>(dst) = make_float2(a, b);  // 8-byte aligned: even
          } else {
            dst[0] = a;
          }
        });
    for_rows_at_column_0(coord, m_rows, rows, [&](int i, int row) {
      float* slot = part_lse + row0 + row * lse_row;
      slot[0] = lse(i);
      for (int s = 1; s <= absent; ++s) {
        slot[s * slot_rows] = -INFINITY;
      }
    });
  }
};

}  // namespace flashcore::sm90
