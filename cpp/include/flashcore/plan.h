// flashcore — the tile tables: which kernel instantiation serves which arch class and head dim,
// with the reason for each choice. Host-only. The tables themselves are in
// cpp/src/core/tables.cpp; the kernels they name are instantiated in cpp/src/*/instances/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "flashcore/types.h"

namespace flashcore {

// Largest supported head dim; head dims must be multiples of kHeadDimMultiple (16-byte loads).
constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kHeadDimMultiple = 8;
// Problems with at most this many query rows per head (after one-query GQA heads are packed
// into rows) use their kernel's decode table (decode_table), where it has one.
constexpr int64_t kDecodeMaxQueryRows = 32;
// Split-KV decoding (the WMMA kernel): a problem of at most kDecodeMaxQueryRows query rows per
// head whose blocks leave room on the SMs splits its keys over up to kMaxKvSplits blocks per
// unit, each streaming at least kMinKeysPerSplit keys, and combines their partial states.
constexpr int32_t kMaxKvSplits = 64;
constexpr int64_t kMinKeysPerSplit = 512;
// A batch of at most this many sequences whose key counts the host knows (host copies of the
// offsets or key counts) splits each sequence by its own keys; a larger one, or one without host
// copies, splits every sequence as its longest (the kernels take a table of each sequence's
// first split as a launch parameter).
constexpr int64_t kMaxSplitSequences = 256;
// merge_states combines at most this many states in one call (the merge kernel takes their
// addresses as launch parameters); merge more by merging merged states.
constexpr int64_t kMaxMergeStates = 64;

// One kernel instantiation. CUTLASS: AttentionKernel<T, Sm80, aligned, Q, K, MAX_K>; WMMA:
// fmha_wmma_kernel<T, BR = Q, BC = K, D = MAX_K>.
struct Tile {
  int32_t queries_per_block;  // query rows per thread block
  int32_t keys_per_block;     // keys per inner iteration
  int32_t max_head_dim;       // largest head dim the instantiation accepts
};

constexpr bool operator==(Tile a, Tile b) {
  return a.queries_per_block == b.queries_per_block && a.keys_per_block == b.keys_per_block &&
         a.max_head_dim == b.max_head_dim;
}

// One row: for `arch`, head dims up to `max_head_dim` use `tile`.
struct TileRow {
  ArchClass arch;
  int32_t max_head_dim;  // inclusive; the rows of one class ascend
  Tile tile;
  int64_t smem_bytes;    // dynamic shared memory per block
  const char* reason;    // why this tile for this class
};

// A table: `count` rows from `rows`.
struct Table {
  const TileRow* rows;
  size_t count;
  const TileRow* begin() const { return rows; }
  const TileRow* end() const { return rows + count; }
};

// The main table of `kernel`: every problem its decode table does not serve.
Table tile_table(Kernel kernel) noexcept;
// `kernel`'s rows for problems of at most kDecodeMaxQueryRows query rows per head (CUTLASS
// example 41 and WMMA; empty for the Hopper kernel). Head dims above its rows use tile_table.
Table decode_table(Kernel kernel) noexcept;

// The backward pass's key-block kernels (cpp/src/backward/): the narrow one (4 warps, 64 keys,
// 32-row query steps: it fits an L4 up to head dim 128), the wide one (8 warps,
// FlashAttention-2's tiling), both on WMMA, and the Hopper one (backward/sm90/: warpgroup MMAs fed
// by TMA, compute capability 9.0, in builds with Kernel::CutlassSm90).
enum class BackwardKernel : int32_t { Narrow = 0, Wide = 1, Hopper = 2 };

// One row of the backward tile table: head dims up to `max_head_dim` (the row's tier; columns
// past the head dim are zero) on `kernel`, one block of `warps` warps per `keys_per_block` keys
// of a kv head walking `rows_per_step` query rows per step, through `step_buffers` buffers of a
// step's Q and dO (2: the next step's copies overlap this step's products).
struct BackwardTileRow {
  BackwardKernel kernel;
  int32_t max_head_dim;
  int32_t warps;
  int32_t keys_per_block;
  int32_t rows_per_step;
  int32_t step_buffers;
  int64_t smem_bytes;  // dynamic shared memory per block (2-byte elements)
  const char* reason;  // where it runs, and why
};

// The backward tile table: `count` rows from `rows`. attention_backward runs the first row of
// the head dim's tier that takes the call (the Hopper rows or the others: see
// attention_backward) and whose shared memory fits the device (and a forced class).
struct BackwardTable {
  const BackwardTileRow* rows;
  size_t count;
  const BackwardTileRow* begin() const { return rows; }
  const BackwardTileRow* end() const { return rows + count; }
};
BackwardTable backward_tile_table() noexcept;

// Shared memory of the WMMA kernel at `tile` for 2-byte elements: the query tile, two stages of
// K and of V, rows padded by 8 elements (scores and probabilities stay in registers).
// Each WMMA instantiation static_asserts that its own layout takes exactly this much.
constexpr int64_t wmma_smem_bytes(Tile t) {
  const int64_t br = t.queries_per_block, bc = t.keys_per_block, d = t.max_head_dim;
  return (br + 4 * bc) * (d + 8) * 2;
}

// Shared memory one block may opt in to on `arch`, and per SM (bytes): the one source of both
// for the tables, the Hopper kernel's layout below and the planner's checks.
constexpr int64_t smem_per_block_optin(ArchClass arch) noexcept {
  return arch == ArchClass::Sm80       ? 163 * 1024
         : arch == ArchClass::Sm86Sm89 ? 99 * 1024
                                       : 227 * 1024;
}
constexpr int64_t smem_per_sm(ArchClass arch) noexcept {
  return arch == ArchClass::Sm80       ? 164 * 1024
         : arch == ArchClass::Sm86Sm89 ? 100 * 1024
                                       : 228 * 1024;
}

// K/V pipeline stages of the Hopper kernel (cpp/src/sm90/) at `t` for 2-byte elements: five,
// example 88's default, or as many as fit beside the Q buffers in the shared memory a block may opt
// in to on compute capability 9.0 (1 KB kept for the barriers); each stage holds one K or one V
// tile.
constexpr int64_t sm90_kv_stages(Tile t) {
  const int64_t bq = t.queries_per_block, bk = t.keys_per_block, d = t.max_head_dim;
  const int64_t fit = (smem_per_block_optin(ArchClass::Sm90) - 1024 - bq * d * 2) / (bk * d * 2);
  return fit < 5 ? fit : 5;
}

// Shared memory of the Hopper kernel's pipeline at `t` for 2-byte elements: one Q buffer per
// consumer warpgroup of 64 rows (the block's rows), sm90_kv_stages() pipeline stages each holding
// a K or a V tile, and the barriers (16 bytes per K/V stage, 32 per consumer warpgroup for its Q
// stage and its turn, 8 to start the loaders), rounded up to 16 bytes.
constexpr int64_t sm90_pipeline_bytes(Tile t) {
  const int64_t bq = t.queries_per_block, bk = t.keys_per_block, d = t.max_head_dim;
  const int64_t stages = sm90_kv_stages(t);
  const int64_t barriers = stages * 16 + bq / 64 * 32 + 8;
  return (bq * d + stages * bk * d) * 2 + (barriers + 15) / 16 * 16;
}

// Shared memory through which the Hopper kernel at `t` stores its output (2-byte elements): the
// block's output rows, each warpgroup's 64, where they fit beside the pipeline in the shared
// memory a block may opt in to; 0 where they do not, and the output goes straight from registers to
// global memory (cpp/src/sm90/epilogue.cuh; docs/HOPPER.md, round 46).
constexpr int64_t sm90_staging_bytes(Tile t) {
  const int64_t rows = t.queries_per_block * t.max_head_dim * 2;
  return sm90_pipeline_bytes(t) + rows <= smem_per_block_optin(ArchClass::Sm90) ? rows : 0;
}

// Shared memory of the Hopper kernel at `t` for 2-byte elements: its pipeline and its output
// staging. Each sm90 instantiation static_asserts that its SharedStorage takes exactly this much.
constexpr int64_t sm90_smem_bytes(Tile t) { return sm90_pipeline_bytes(t) + sm90_staging_bytes(t); }

// The tile-table class of a device of compute capability `major`.`minor` on which one block may
// opt in to `smem_optin` bytes of shared memory; empty below 8.0. From 10.0 on
// (Blackwell and later; no SASS is built there: the driver compiles the kernels' PTX when it
// loads them) the class is the first whose per-block budget the device offers, Sm80 from 163 KB
// (B200: 227 KB) or Sm86Sm89 from 99 KB (RTX 50xx), else empty. Never Sm90, whose Auto rules
// count on the Hopper kernel: its SASS is sm_90a, which runs on 9.0 only.
std::optional<ArchClass> arch_class(int32_t major, int32_t minor,
                                    int64_t smem_optin) noexcept;

// The row of `kernel`'s tables for `arch` serving `head_dim` with `query_rows` query rows per
// head, or nullptr above the largest tier.
const TileRow* select_row(Kernel kernel, ArchClass arch, int64_t head_dim,
                          int64_t query_rows) noexcept;

// How many key splits `kernel` runs a problem of `query_rows` query rows per head (after packing),
// `batch_heads` (batch x heads) heads and `seq_k` keys with at tile-table `row` on
// `multiprocessors` SMs: 1 (no split) unless the kernel is WMMA or the Hopper kernel and the rows
// are few (decode); then enough splits for two WMMA blocks per SM (at most wmma_blocks_per_sm of
// `row`), or one Hopper block per SM, over the unsplit blocks, at most kMaxKvSplits, each of at
// least kMinKeysPerSplit keys (measured: see its definition in cpp/src/core/plan.cpp).
int32_t kv_splits(Kernel kernel, const TileRow& row, int64_t query_rows, int64_t batch_heads,
                  int64_t seq_k, int32_t multiprocessors) noexcept;

// Blocks of the WMMA kernel at `row` one SM holds at once: by shared memory (1 KB of it reserved
// per block) and by registers (32 threads per warp, up to 4 warps of 16 query rows, at most 255
// registers a thread).
int64_t wmma_blocks_per_sm(const TileRow& row) noexcept;

// Query rows per block of the Hopper kernel's smallest tile (every sm90 row has at least this
// many, tables.cpp checks): Auto's test that the work units fill the SMs and the bound on the
// units an `int` counts both count in blocks of this size.
constexpr int64_t kSm90QueriesPerBlock = 128;

// Keys per TMA slab of a paged cache on the Hopper kernel where pages hold at least as many and
// the tile's key count is a multiple of it (every tile of the table); smaller pages take slabs of
// 16 keys (cpp/src/sm90/pages.cuh). Auto's rule for wide paged decode batches reads it.
constexpr int64_t kSm90WideSlabKeys = 64;

// The Hopper kernel's last wave in pieces (cpp/src/sm90/scheduler.cuh, Tail): a persistent grid
// of `grid` blocks walking `units` equal work units of `unit_tiles` key tiles each leaves
// grid - units % grid blocks idle for the last, partial wave. Where the units are long (at least
// kSm90TailUnitTiles key tiles) and that idle time is at least kSm90TailIdleTiles key tiles per
// block, the last wave's units are cut into key tiles instead, and every block takes an equal
// contiguous range of them (stream-K's idea for GEMM tails), two tiles at least; the pieces of a
// unit are merged as key splits are (split/combine.cuh). The idle bound covers a piece's fixed
// costs (its Q load, its first and last products, the epilogue: about 1.5 key tiles at d = 128,
// docs/HOPPER.md round 27) twice over and the merge. The length bound is measured (rounds 37,
// 50 and 51): on units of 16 key tiles (8x16x2048x128) the cut was 0.6-5% slower under the
// bench's back-to-back calls, on units of 64 (2x16x8192x128) 2-4% faster. Returns the units cut
// (0: none).
constexpr int64_t kSm90TailIdleTiles = 4;
constexpr int64_t kSm90TailUnitTiles = 32;
constexpr int64_t sm90_tail_units(int64_t units, int64_t grid, int64_t unit_tiles) {
  if (grid <= 0 || units <= grid || unit_tiles < kSm90TailUnitTiles) {
    return 0;
  }
  const int64_t cut = units % grid;
  const bool idle = (grid - cut) * unit_tiles >= kSm90TailIdleTiles * grid;
  return cut != 0 && idle && cut * unit_tiles >= 2 * grid ? cut : 0;
}

// The kernel Backend::Auto runs for a problem of `query_rows` query rows per head (after the
// packing of one-query GQA problems) on `batch_heads` (batch x heads, as packed) heads, `seq_k`
// keys and head dim `head_dim`, on a device of class `arch` with `multiprocessors` SMs, where
// this build compiled `kernels` (one bit per Kernel value); measured, see its definition in
// cpp/src/core/plan.cpp. Where it names CUTLASS's decode row (a decode past two units per SM),
// the planner looks at the batch too: on compute capability 9.0 the Hopper kernel runs a batch
// of at most kMaxSplitSequences sequences, whose blocks it walks a sequence's heads side by side
// (variable-length and paged batches: their own rules, in the same file).
Kernel auto_kernel(ArchClass arch, int64_t query_rows, int64_t batch_heads, int64_t seq_k,
                   int64_t head_dim, int32_t multiprocessors, uint32_t kernels = ~0u) noexcept;

// Below this many flops of its two products (4 x batch x heads x seq_q x seq_k x head_dim, as if
// unmasked) a prefill whose Hopper work units do not fill the SMs runs on WMMA under Auto, whose
// smaller blocks start sooner; at or above it, on the Hopper kernel (measured: see auto_kernel).
constexpr double kSm90SmallPrefillFlops = 0x1p30;

}  // namespace flashcore
