//! The CUTLASS Ampere/Ada (example 41, `Sm80` tag) tile table.
//!
//! This file is the single source of truth for which kernels exist: `build.rs` includes it
//! (with `#[path]`) to instantiate exactly the tiles named here, and the planner reads it to
//! pick a row at run time. It must therefore stay free of `crate::` imports.
//!
//! Shared-memory figures are `sizeof(AttentionKernel<..>::SharedStorage)` measured with nvcc
//! 13.0.88 and CUTLASS 4.2.0; they are identical for f16 and bf16. Threads per block are
//! `kQueriesPerBlock * kKeysPerBlock / 32`; CUTLASS's launch bounds ask for 16 warps per SM.

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

/// One CUTLASS example-41 instantiation: `AttentionKernel<T, Sm80, aligned, Q, K, MAX_K>`.
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
    /// Threads per block (one warp per 32x32 sub-tile of the `Q x K` tile).
    pub const fn threads(self) -> u32 {
        self.queries_per_block * self.keys_per_block / 32
    }

    /// Whether the kernel needs the f32 output accumulator scratch buffer.
    pub const fn needs_accumulator(self) -> bool {
        self.max_head_dim > self.keys_per_block
    }

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

/// Every distinct tile named by the tables, in table order (what `build.rs` instantiates).
pub fn distinct_tiles() -> Vec<Tile> {
    let mut out: Vec<Tile> = Vec::new();
    for row in TILE_TABLE.iter().chain(DECODE_TABLE) {
        if !out.contains(&row.tile) {
            out.push(row.tile);
        }
    }
    out
}
