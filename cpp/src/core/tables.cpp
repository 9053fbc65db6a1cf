// The tile tables of the GPU kernel families, with the reason for every row. This file is the one
// place a tile is chosen; the kernels it names are listed in each family's instances.inc
// (sm80/, wmma/, sm90/; checked below at compile time).
//
// CUTLASS shared-memory figures are sizeof(AttentionKernel<..>::SharedStorage) measured with
// nvcc 13.0.88 and CUTLASS 4.2.0, the same for f16 and bf16. Its threads per block are
// kQueriesPerBlock * kKeysPerBlock / 32; CUTLASS's launch bounds ask for 16 warps per SM.
// WMMA figures come from wmma_smem_bytes() (flashcore/plan.h), which every WMMA instantiation
// checks against the kernel's own layout.
#include <iterator>

#include "flashcore/plan.h"

namespace flashcore {
namespace {

constexpr Tile tile(int32_t q, int32_t k, int32_t d) { return Tile{q, k, d}; }

constexpr TileRow kCutlassRows[] = {
    // ---- sm_80: 164 KB per SM ----
    {ArchClass::Sm80, 64, tile(64, 64, 64), 18944,
     "19 KB: 4 blocks x 4 warps fill the 16-warp launch bound with room to spare; the whole head "
     "dim stays in registers (single value iteration)"},
    {ArchClass::Sm80, 128, tile(64, 128, 128), 52224,
     "52 KB: 2 blocks x 8 warps fit 164 KB; 64 query rows halve K/V re-reads against 32, and 128 "
     "keys keep the output in registers for d<=128"},
    {ArchClass::Sm80, 256, tile(64, 128, 256), 69632,
     "70 KB: 2 blocks x 8 warps (139 KB) fit 164 KB; d>128 iterates over the value dim with an "
     "f32 accumulator, so the widest key tile amortises it best"},
    // ---- sm_86 / sm_89 (L4 is the design target): 100 KB per SM ----
    {ArchClass::Sm86Sm89, 64, tile(64, 64, 64), 18944,
     "19 KB: 4 blocks x 4 warps (76 KB) fit 100 KB and reach the 16-warp bound"},
    {ArchClass::Sm86Sm89, 128, tile(32, 128, 128), 42496,
     "42 KB: 2 blocks (85 KB) fit 100 KB, where 64x128 (52 KB) fits only one; 128 keys keep the "
     "output in registers for d<=128"},
    {ArchClass::Sm86Sm89, 256, tile(64, 64, 256), 34304,
     "34 KB: 2 blocks (69 KB) fit 100 KB, where 32x128 (51 KB) and 64x128 (70 KB) fit only one "
     "block per SM"},
    // ---- sm_90 on the Ampere/Ada path: 228 KB per SM ----
    {ArchClass::Sm90, 64, tile(64, 64, 64), 18944,
     "19 KB: measured on the H200 (2026-11-21), 64x64 beats 128x64 on every d=64 bench shape "
     "(2x32x8192x64: 7.53 ms vs 8.14 ms): twice the blocks in flight"},
    {ArchClass::Sm90, 128, tile(64, 128, 128), 52224,
     "52 KB: 2 blocks x 8 warps (104 KB) well inside 228 KB; same reuse as sm_80"},
    {ArchClass::Sm90, 256, tile(64, 128, 256), 69632,
     "70 KB: 3 blocks fit 228 KB, but the launch bound targets 2; widest key tile to amortise the "
     "f32 accumulator pass"},
};

constexpr const char* kDecodeReason =
    "decode (<= 32 query rows per head): a 32-row query tile wastes the fewest rows; measured on "
    "the H200 (2026-11-21) at 32x32(kv 8)x1x4096 d=128: 136 us vs 199 us with 64 rows. 42 KB "
    "fits every class";

// Head dims above the last decode row use kCutlassRows.
constexpr TileRow kCutlassDecodeRows[] = {
    {ArchClass::Sm80, 128, tile(32, 128, 128), 42496, kDecodeReason},
    {ArchClass::Sm86Sm89, 128, tile(32, 128, 128), 42496, kDecodeReason},
    {ArchClass::Sm90, 128, tile(32, 128, 128), 42496, kDecodeReason},
};

constexpr TileRow wmma_row(ArchClass arch, int32_t max_head_dim, Tile t, const char* reason) {
  return TileRow{arch, max_head_dim, t, wmma_smem_bytes(t), reason};
}

// queries_per_block = 16 x warps x row tiles: up to 4 warps, each owning 16 or 32 query rows
// (cpp/src/wmma/kernel.cuh); smaller head dims than the row's are zero-padded in shared memory.
// Measured on the H200 (2026-11-21, docs/WMMA.md "versions", f16 and bf16 within 3%):
constexpr const char* kWmma64 =
    "46 KB, 139-145 registers: 3 blocks x 4 warps per SM. Against 128x64 (32 rows per warp): 4-12% "
    "slower on 8x32x2048x64 and 2x32x8192x64 (254-264 vs 271-285 TFLOP/s) but 21-27% faster on "
    "the seeds (1x8x512x64: 12.5 vs 17.1 us)";
constexpr const char* kWmma128 =
    "70 KB, 237-245 registers: 2 blocks x 4 warps per SM, 32 rows per warp. 309-336 TFLOP/s against "
    "258-272 for 64x32 and 172 for 64x64 (8x16x2048x128, 2x16x8192x128)";
constexpr const char* kWmma256 =
    "101 KB, 235-241 registers: 2 blocks per SM. 253 TFLOP/s at 4x8x4096x256 against 217 for 64x64 "
    "(169 KB, 1 block)";

constexpr TileRow kWmmaRows[] = {
    // ---- sm_80: 164 KB per SM (rows as measured best on the H200, which shares the ISA) ----
    wmma_row(ArchClass::Sm80, 64, tile(64, 64, 64), kWmma64),
    wmma_row(ArchClass::Sm80, 128, tile(128, 32, 128), kWmma128),
    wmma_row(ArchClass::Sm80, 256, tile(64, 32, 256), kWmma256),
    // ---- sm_86 / sm_89: 100 KB per SM, 99 KB per block ----
    wmma_row(ArchClass::Sm86Sm89, 64, tile(64, 64, 64),
             "46 KB: 2 blocks per SM fit 100 KB; the H200's best d<=64 tile"),
    wmma_row(ArchClass::Sm86Sm89, 128, tile(128, 32, 128),
             "70 KB: 1 block per SM, as 64x32 (52 KB) would be; 32 rows per warp halve K and V "
             "reads per FLOP, which won by 20% on the H200"),
    wmma_row(ArchClass::Sm86Sm89, 256, tile(64, 16, 256),
             "68 KB: 64x32 (101 KB) exceeds the 99 KB per-block limit"),
    // ---- sm_90 on the Ampere/Ada instruction set: 228 KB per SM ----
    wmma_row(ArchClass::Sm90, 64, tile(64, 64, 64), kWmma64),
    wmma_row(ArchClass::Sm90, 128, tile(128, 32, 128), kWmma128),
    wmma_row(ArchClass::Sm90, 256, tile(64, 32, 256), kWmma256),
};

// Decode on WMMA (at most kDecodeMaxQueryRows query rows per head: one-query GQA heads packed
// into rows, or a few speculative queries): one warp of 16 query rows per block, which split-KV
// (kv_splits) multiplies by the key splits until the SMs hold no more resident blocks. Each stage
// of K and V is 16 KB at every head dim, so five blocks per SM on sm_90 (two on sm_86/89, four on
// sm_80) keep 32-80 KB of loads in flight where the 128-row tile kept 2 x 8 KB and computed 32 rows
// per working warp for 4 real ones.
constexpr const char* kWmmaDecode =
    "decode: 16 query rows (one warp), 16 KB of K and V per stage; ~40 KB per block";

constexpr TileRow kWmmaDecodeRows[] = {
    wmma_row(ArchClass::Sm80, 64, tile(16, 64, 64), kWmmaDecode),
    wmma_row(ArchClass::Sm80, 128, tile(16, 32, 128), kWmmaDecode),
    wmma_row(ArchClass::Sm80, 256, tile(16, 16, 256), kWmmaDecode),
    wmma_row(ArchClass::Sm86Sm89, 64, tile(16, 64, 64), kWmmaDecode),
    wmma_row(ArchClass::Sm86Sm89, 128, tile(16, 32, 128), kWmmaDecode),
    wmma_row(ArchClass::Sm86Sm89, 256, tile(16, 16, 256), kWmmaDecode),
    wmma_row(ArchClass::Sm90, 64, tile(16, 64, 64), kWmmaDecode),
    wmma_row(ArchClass::Sm90, 128, tile(16, 32, 128), kWmmaDecode),
    wmma_row(ArchClass::Sm90, 256, tile(16, 16, 256), kWmmaDecode),
};

// CUTLASS example 88's warp-specialized mainloop under flashcore's kernel layer (cpp/src/sm90/):
// consumer warpgroups of 64 query rows each, one producer warpgroup, TMA loads of K and V through
// a shared-memory pipeline of sm90_kv_stages() stages (five where they fit). Shared memory is
// sm90_smem_bytes(), which each instantiation checks against its SharedStorage. Rows for compute
// capability 9.0 only: the SASS is sm_90a. Chosen by scripts/sweep_sm90.sh (benches/sm90_sweep/,
// bf16, medians) on the H200, 2026-11-23 to 2026-11-26; docs/HOPPER.md has the rounds.
// The schedules of each tile (without a mask, causal, with a softcap, ALiBi or a bias) are in
// sm90/instances.inc.
constexpr TileRow kSm90Rows[] = {
    {ArchClass::Sm90, 64, tile(192, 128, 64), sm90_smem_bytes(tile(192, 128, 64)),
     "104 KB, three consumer warpgroups (474 vs 443 TFLOP/s at 2x32x8192x64 against 128x128 "
     "persistent, round 4); our overlapped loop with issue turns and a free "
     "epilogue (421-422 vs 408-411, 312-313 vs 298 causal, round 7); with the one-instruction "
     "exp2 (round 8a: 452-454 vs 421-423, 334-336 vs 312-313 causal, 525-544 vs 493-500 at "
     "2x32x8192x64, 476-477 vs 424-426 causal) lazy rescaling wins too (round 8c: 457-460 vs "
     "451-453, 339-343 vs 333-336 causal, 541-542 vs 539-547, 478-480 vs 464-470 causal); "
     "persistent once its walk rotates each head's units and leaves units without a mask "
     "unpaired (round 23: 563-566 vs 589-591 us at 8x32x2048x64, 369-375 vs 385-386 causal, "
     "2074-2080 vs 2032-2058 at 2x32x8192x64, 1142-1146 vs 1155-1165 causal)"},
    {ArchClass::Sm90, 128, tile(128, 128, 128), sm90_smem_bytes(tile(128, 128, 128)),
     "192 KB; persistent over balanced pairs of query blocks, free epilogue, for both masks "
     "(round 8a); our overlapped loop with lazy rescaling and issue turns, timed over do_bench's "
     "stretches of load (round 25 against example 88's order, which had won at the boost clock: "
     "465.8 vs 485.5-486.8 us at 8x16x2048x128, 282.6-286.0 vs 288.6-289.2 causal, 1664.8-1693.9 "
     "vs 1754.0-1756.7 at 2x16x8192x128, 889.2-892.3 vs 915.4-918.8 causal, 956.1-959.6 vs "
     "977.1-981.4 at 4x32kv8x4096x128 causal); with the modifiers in the same kernel, which "
     "serves calls without one as fast (round 43, H100: 442.3 vs 438.3 us at 8x16x2048x128, "
     "263.1 vs 278.4 causal, 1701.5 vs 1683.9 at 2x16x8192x128, 879.0 vs 878.1 causal, 931.7 "
     "vs 936.6 at 4x32kv8x4096x128 causal) for two kernels fewer to build"},
    {ArchClass::Sm90, 256, tile(128, 64, 256), sm90_smem_bytes(tile(128, 64, 256)),
     "224 KB (the widest key tile that fits 227 KB; 80 keys lose 40%, round 5), our overlapped "
     "loop with lazy rescaling (676-678 vs 645-650 TFLOP/s at 4x8x4096x256 against example 88's "
     "loop, round 4); persistent over balanced pairs: 631-643 vs 553-573 TFLOP/s causal, 718-720 vs "
     "725-726 without a mask, where a second kernel would win 1% for 50 s of build (round 7); "
     "with the modifiers in the same kernel (round 43, H100: 781.2 vs 816.3 us at 4x8x4096x256, "
     "426.8 vs 436.5 causal)"},
};

// ---- compile-time checks: every row is instantiated, fits its class, and classes ascend ----
constexpr Tile kSm80Instances[] = {
#define FLASHCORE_TILE(Q, K, D) tile(Q, K, D),
#include "sm80/instances.inc"
#undef FLASHCORE_TILE
};
constexpr Tile kWmmaInstances[] = {
#define FLASHCORE_TILE(Q, K, D) tile(Q, K, D),
#include "wmma/instances.inc"
#undef FLASHCORE_TILE
};
constexpr Tile kSm90Instances[] = {
#define FLASHCORE_TILE(Q, K, D, FLAGS, CAUSAL_FLAGS, MODIFIER_FLAGS, BIAS_FLAGS) tile(Q, K, D),
#include "sm90/instances.inc"
#undef FLASHCORE_TILE
};

template <size_t N, size_t M>
constexpr bool well_formed(const TileRow (&rows)[N], const Tile (&instances)[M]) {
  for (size_t i = 0; i < N; ++i) {
    bool instantiated = false;
    for (size_t j = 0; j < M; ++j) {
      instantiated = instantiated || instances[j] == rows[i].tile;
    }
    const bool fits = rows[i].smem_bytes <= smem_per_block_optin(rows[i].arch) &&
                      rows[i].max_head_dim <= rows[i].tile.max_head_dim;
    const bool ascends = i == 0 || rows[i - 1].arch != rows[i].arch ||
                         rows[i - 1].max_head_dim < rows[i].max_head_dim;
    if (!instantiated || !fits || !ascends) {
      return false;
    }
  }
  return true;
}

static_assert(well_formed(kCutlassRows, kSm80Instances), "a CUTLASS row is not instantiated "
              "(sm80/instances.inc), exceeds its class's shared memory, or is out of order");
static_assert(well_formed(kCutlassDecodeRows, kSm80Instances), "a decode row is not instantiated");
static_assert(well_formed(kWmmaDecodeRows, kWmmaInstances), "a WMMA decode row is not "
              "instantiated, exceeds its class's shared memory, or is out of order");
static_assert(well_formed(kWmmaRows, kWmmaInstances), "a WMMA row is not instantiated "
              "(wmma/instances.inc), exceeds its class's shared memory, or is out of order");
static_assert(well_formed(kSm90Rows, kSm90Instances), "an sm90 row is not instantiated "
              "(sm90/instances.inc), exceeds its class's shared memory, or is out of order");

constexpr bool sm90_blocks_at_least_counted() {
  for (const TileRow& row : kSm90Rows) {
    if (row.tile.queries_per_block < kSm90QueriesPerBlock) {
      return false;
    }
  }
  return true;
}
static_assert(sm90_blocks_at_least_counted(),
              "an sm90 row has fewer query rows per block than plan.h's kSm90QueriesPerBlock");

// Each family's main and decode tables, indexed by Kernel.
constexpr Table kTables[kKernelCount] = {
    {kCutlassRows, std::size(kCutlassRows)},
    {kWmmaRows, std::size(kWmmaRows)},
    {kSm90Rows, std::size(kSm90Rows)},
};
constexpr Table kDecodeTables[kKernelCount] = {
    {kCutlassDecodeRows, std::size(kCutlassDecodeRows)},
    {kWmmaDecodeRows, std::size(kWmmaDecodeRows)},
    {nullptr, 0},
};

}  // namespace

Table tile_table(Kernel kernel) noexcept {
  const auto k = static_cast<size_t>(kernel);
  return k < std::size(kTables) ? kTables[k] : Table{nullptr, 0};
}

Table decode_table(Kernel kernel) noexcept {
  const auto k = static_cast<size_t>(kernel);
  return k < std::size(kDecodeTables) ? kDecodeTables[k] : Table{nullptr, 0};
}

}  // namespace flashcore
