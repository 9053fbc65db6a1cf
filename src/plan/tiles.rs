//! The tile tables of the two GPU kernels: CUTLASS Ampere/Ada (example 41, `Sm80` tag) and
//! flashcore's own WMMA kernel (`cpp/src/wmma/kernel.cuh`).
//!
//! This file is the single source of truth for which kernels exist: `build.rs` includes it
//! (with `#[path]`) to instantiate exactly the tiles named here, and the planner reads it to
//! pick a row at run time. It must therefore stay free of `crate::` imports.
//!
//! CUTLASS shared-memory figures are `sizeof(AttentionKernel<..>::SharedStorage)` measured with
//! nvcc 13.0.88 and CUTLASS 4.2.0; they are identical for f16 and bf16. Its threads per block are
//! `kQueriesPerBlock * kKeysPerBlock / 32`; CUTLASS's launch bounds ask for 16 warps per SM.
//! WMMA figures come from [`wmma_smem_bytes`], which each generated WMMA translation unit checks
//! against the kernel's own `Config::kSmemBytes` with a `static_assert`.

/// Which shared-memory budget (and SASS) a device falls into for the Ampere/Ada kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArchClass {
    /// sm_80 (A100, A30): 164 KB shared memory per SM, 163 KB opt-in per block.
    Sm80,
    /// sm_86 / sm_87 / sm_89 (RTX 30xx, A10, L4, L40, RTX 40xx): 100 KB per SM, 99 KB per block.
    Sm86Sm89,
    /// sm_90 (H100, H200) running the Ampere/Ada path: 228 KB per SM, 227 KB per block.
    Sm90,
}

impl ArchClass {
    /// All classes, in table order.
    pub const ALL: [ArchClass; 3] = [ArchClass::Sm80, ArchClass::Sm86Sm89, ArchClass::Sm90];

    /// Shared memory one block may opt in to on this class (bytes).
    pub const fn smem_per_block_optin(self) -> usize {
        match self {
            ArchClass::Sm80 => 163 * 1024,
            ArchClass::Sm86Sm89 => 99 * 1024,
            ArchClass::Sm90 => 227 * 1024,
        }
    }

    /// Shared memory per SM on this class (bytes).
    pub const fn smem_per_sm(self) -> usize {
        match self {
            ArchClass::Sm80 => 164 * 1024,
            ArchClass::Sm86Sm89 => 100 * 1024,
            ArchClass::Sm90 => 228 * 1024,
        }
    }
}

/// The GPU kernel families, each with its own tile table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// CUTLASS example 41 (`Sm80` tag): [`TILE_TABLE`] and [`DECODE_TABLE`].
    CutlassSm80,
    /// flashcore's WMMA FlashAttention-2 kernel: [`WMMA_TABLE`].
    Wmma,
}

impl Kernel {
    /// Every GPU kernel family, in the order benches and tests race them.
    pub const ALL: [Kernel; 2] = [Kernel::CutlassSm80, Kernel::Wmma];

    /// A short stable name (also the backend name in errors and bench tables).
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::CutlassSm80 => "cutlass-sm80",
            Kernel::Wmma => "wmma",
        }
    }
}

/// One kernel instantiation. For CUTLASS: `AttentionKernel<T, Sm80, aligned, Q, K, MAX_K>`; for
/// WMMA: `fmha_wmma_kernel<T, BR = Q, BC = K, D = MAX_K>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tile {
    /// `kQueriesPerBlock`: query rows per thread block.
    pub queries_per_block: u32,
    /// `kKeysPerBlock`: keys per inner iteration.
    pub keys_per_block: u32,
    /// `kMaxK`: largest head dim the instantiation accepts. When it exceeds `keys_per_block`
    /// the kernel iterates over the value dim and needs an f32 output accumulator buffer.
    pub max_head_dim: u32,
}

impl Tile {
    /// Stable name used for the generated C++ symbol and source file.
    pub fn name(self) -> String {
        format!(
            "q{}_k{}_d{}",
            self.queries_per_block, self.keys_per_block, self.max_head_dim
        )
    }
}

/// One row of the table: for `arch`, head dims up to `max_head_dim` use `tile`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileRow {
    /// The device class this row serves.
    pub arch: ArchClass,
    /// Largest head dim (inclusive) served by this row; rows of one class ascend.
    pub max_head_dim: u32,
    /// The instantiation to launch.
    pub tile: Tile,
    /// `sizeof(SharedStorage)` of the instantiation, in bytes.
    pub smem_bytes: usize,
    /// Why this tile for this class.
    pub reason: &'static str,
}

const fn tile(q: u32, k: u32, d: u32) -> Tile {
    Tile {
        queries_per_block: q,
        keys_per_block: k,
        max_head_dim: d,
    }
}

/// The table. Rows of one class ascend by `max_head_dim`; tiers are <=64, <=128, <=256.
pub const TILE_TABLE: &[TileRow] = &[
    // ---- sm_80: 164 KB per SM ----
    TileRow {
        arch: ArchClass::Sm80,
        max_head_dim: 64,
        tile: tile(64, 64, 64),
        smem_bytes: 18_944,
        reason: "19 KB: 4 blocks x 4 warps fill the 16-warp launch bound with room to spare; \
                 the whole head dim stays in registers (single value iteration)",
    },
    TileRow {
        arch: ArchClass::Sm80,
        max_head_dim: 128,
        tile: tile(64, 128, 128),
        smem_bytes: 52_224,
        reason: "52 KB: 2 blocks x 8 warps fit 164 KB; 64 query rows halve K/V re-reads \
                 against 32, and 128 keys keep the output in registers for d<=128",
    },
    TileRow {
        arch: ArchClass::Sm80,
        max_head_dim: 256,
        tile: tile(64, 128, 256),
        smem_bytes: 69_632,
        reason: "70 KB: 2 blocks x 8 warps (139 KB) fit 164 KB; d>128 iterates over the value \
                 dim with an f32 accumulator, so the widest key tile amortises it best",
    },
    // ---- sm_86 / sm_89 (L4 is the design target): 100 KB per SM ----
    TileRow {
        arch: ArchClass::Sm86Sm89,
        max_head_dim: 64,
        tile: tile(64, 64, 64),
        smem_bytes: 18_944,
        reason: "19 KB: 4 blocks x 4 warps (76 KB) fit 100 KB and reach the 16-warp bound",
    },
    TileRow {
        arch: ArchClass::Sm86Sm89,
        max_head_dim: 128,
        tile: tile(32, 128, 128),
        smem_bytes: 42_496,
        reason: "42 KB: 2 blocks (85 KB) fit 100 KB, where 64x128 (52 KB) fits only one; \
                 128 keys keep the output in registers for d<=128",
    },
    TileRow {
        arch: ArchClass::Sm86Sm89,
        max_head_dim: 256,
        tile: tile(64, 64, 256),
        smem_bytes: 34_304,
        reason: "34 KB: 2 blocks (69 KB) fit 100 KB, where 32x128 (51 KB) and 64x128 (70 KB) \
                 fit only one block per SM",
    },
    // ---- sm_90 on the Ampere/Ada path: 228 KB per SM ----
    TileRow {
        arch: ArchClass::Sm90,
        max_head_dim: 64,
        tile: tile(64, 64, 64),
        smem_bytes: 18_944,
        reason: "19 KB: measured on the H200 (2026-11-21), 64x64 beats 128x64 on every d=64 \
                 bench shape (2x32x8192x64: 7.53 ms vs 8.14 ms): twice the blocks in flight",
    },
    TileRow {
        arch: ArchClass::Sm90,
        max_head_dim: 128,
        tile: tile(64, 128, 128),
        smem_bytes: 52_224,
        reason: "52 KB: 2 blocks x 8 warps (104 KB) well inside 228 KB; same reuse as sm_80",
    },
    TileRow {
        arch: ArchClass::Sm90,
        max_head_dim: 256,
        tile: tile(64, 128, 256),
        smem_bytes: 69_632,
        reason: "70 KB: 3 blocks fit 228 KB, but the launch bound targets 2; widest key tile \
                 to amortise the f32 accumulator pass",
    },
];

/// Problems with at most this many query rows per head (after packing one-query GQA heads
/// into rows) use [`DECODE_TABLE`].
pub const DECODE_MAX_QUERY_ROWS: usize = 32;

const fn decode_row(arch: ArchClass) -> TileRow {
    TileRow {
        arch,
        max_head_dim: 128,
        tile: tile(32, 128, 128),
        smem_bytes: 42_496,
        reason: "decode (<= 32 query rows per head): a 32-row query tile wastes the fewest \
                 rows; measured on the H200 (2026-11-21) at 32x32(kv 8)x1x4096 d=128: \
                 136 us vs 199 us with 64 rows. 42 KB fits every class",
    }
}

/// Rows for few-query problems (decoding). Head dims above the last row use [`TILE_TABLE`].
pub const DECODE_TABLE: &[TileRow] = &[
    decode_row(ArchClass::Sm80),
    decode_row(ArchClass::Sm86Sm89),
    decode_row(ArchClass::Sm90),
];

/// Shared memory of the WMMA kernel at `tile` for 2-byte elements (bytes): the query tile, two
/// stages of K and of V (rows padded by 8 elements), and one f32 score tile of 16 rows x
/// (keys + 8) per warp.
pub const fn wmma_smem_bytes(tile: Tile) -> usize {
    let (br, bc, d) = (
        tile.queries_per_block as usize,
        tile.keys_per_block as usize,
        tile.max_head_dim as usize,
    );
    (br * (d + 8) + 4 * bc * (d + 8)) * 2 + (br / 16) * 16 * (bc + 8) * 4
}

const fn wmma_row(arch: ArchClass, max_head_dim: u32, t: Tile, reason: &'static str) -> TileRow {
    TileRow {
        arch,
        max_head_dim,
        tile: t,
        smem_bytes: wmma_smem_bytes(t),
        reason,
    }
}

/// The WMMA kernel's table: `queries_per_block` = 16 x warps (each warp owns 16 query rows),
/// `keys_per_block` keys per iteration, head dims up to `max_head_dim` (smaller ones are
/// zero-padded in shared memory). Rows of one class ascend by `max_head_dim`.
pub const WMMA_TABLE: &[TileRow] = &[
    // ---- sm_80: 164 KB per SM ----
    wmma_row(
        ArchClass::Sm80,
        64,
        tile(64, 64, 64),
        "63 KB: 2 blocks x 4 warps fit 164 KB. On the H200 (2026-11-21) 64x64 beat 64x32 \
         (133 vs 127 TFLOP/s f16, 8x32x2048x64) and 128x64 (103 TFLOP/s: 1 block by registers)",
    ),
    wmma_row(
        ArchClass::Sm80,
        128,
        tile(64, 32, 128),
        "61 KB: 2 blocks x 4 warps fit 164 KB; 32 keys beat 64 on the H200 (149 vs 144 \
         TFLOP/s f16, 8x16x2048x128)",
    ),
    wmma_row(
        ArchClass::Sm80,
        256,
        tile(64, 16, 256),
        "72 KB, 2 blocks: 16-key tiles keep bf16 at 248 registers without spills (32-key tiles \
         spill); the 256-wide output alone takes 128 registers per thread",
    ),
    // ---- sm_86 / sm_89: 100 KB per SM ----
    wmma_row(
        ArchClass::Sm86Sm89,
        64,
        tile(64, 64, 64),
        "63 KB: 1 block per SM within the 99 KB limit; the H200's best d<=64 tile",
    ),
    wmma_row(
        ArchClass::Sm86Sm89,
        128,
        tile(64, 32, 128),
        "61 KB: 64x64 (103 KB) exceeds the 99 KB per-block limit",
    ),
    wmma_row(
        ArchClass::Sm86Sm89,
        256,
        tile(64, 16, 256),
        "72 KB fits the 99 KB per-block limit; 16-key tiles: 32 keys spill in bf16",
    ),
    // ---- sm_90 on the Ampere/Ada instruction set: 228 KB per SM ----
    wmma_row(
        ArchClass::Sm90,
        64,
        tile(64, 64, 64),
        "63 KB, 139 registers: 3 blocks x 4 warps per SM. Measured on the H200 (2026-11-21): \
         133 TFLOP/s f16 at 8x32x2048x64 against 127 for 64x32 and 103 for 128x64",
    ),
    wmma_row(
        ArchClass::Sm90,
        128,
        tile(64, 32, 128),
        "61 KB, 168 registers: 3 blocks x 4 warps per SM. Measured on the H200 (2026-11-21): \
         149 TFLOP/s f16 at 8x16x2048x128 against 144 for 64x64 (103 KB, 2 blocks)",
    ),
    wmma_row(
        ArchClass::Sm90,
        256,
        tile(64, 16, 256),
        "72 KB: 3 blocks x 4 warps per SM; 16-key tiles: 32 keys spill in bf16",
    ),
];

impl Kernel {
    /// Every distinct tile this kernel's tables name, in table order (what `build.rs`
    /// instantiates).
    pub fn distinct_tiles(self) -> Vec<Tile> {
        let rows: Vec<&TileRow> = match self {
            Kernel::CutlassSm80 => TILE_TABLE.iter().chain(DECODE_TABLE).collect(),
            Kernel::Wmma => WMMA_TABLE.iter().collect(),
        };
        let mut out: Vec<Tile> = Vec::new();
        for row in rows {
            if !out.contains(&row.tile) {
                out.push(row.tile);
            }
        }
        out
    }
}
