//! Planning: which tile-table row runs a problem on a given device. The tables and the choice
//! live in the C++ library (`cpp/src/core/tables.cpp`, `cpp/src/core/plan.cpp`), shared with C++
//! callers; this module is their Rust view, usable without a GPU.

use std::sync::OnceLock;

mod backward;
#[cfg(feature = "cuda")]
pub(crate) use backward::backward_row;
pub use backward::{backward_tile_table, BackwardKernel, BackwardTileRow};

use crate::error::{Error, Result};
use crate::ffi::{self, sys, CapsFfi, RowRef};

/// Which shared-memory budget (and SASS) a device falls into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArchClass {
    /// sm_80 (A100, A30): 164 KB shared memory per SM, 163 KB opt-in per block; also compute
    /// capability 10.0 and later with at least that much (B200), through PTX.
    Sm80,
    /// sm_86 / sm_87 / sm_89 (RTX 30xx, A10, L4, L40, RTX 40xx): 100 KB per SM, 99 KB per block;
    /// also compute capability 10.0 and later with 99 to 162 KB (RTX 50xx), through PTX.
    Sm86Sm89,
    /// sm_90 (H100, H200): 228 KB per SM, 227 KB per block.
    Sm90,
}

impl ArchClass {
    /// All classes, in table order.
    pub const ALL: [ArchClass; 3] = [ArchClass::Sm80, ArchClass::Sm86Sm89, ArchClass::Sm90];

    /// The class of a device of compute capability `(major, minor)` on which one block may opt
    /// in to `smem_per_block_optin` bytes of shared memory (a `Device` reports both), or
    /// `None` below 8.0. From 10.0 on (Blackwell and later), where no SASS is built and the
    /// driver compiles the kernels' PTX when it first loads them, the class is the first whose
    /// per-block budget the device offers: [`ArchClass::Sm80`] from 163 KB (B200: 227 KB), else
    /// [`ArchClass::Sm86Sm89`] from 99 KB (RTX 50xx), else `None`. Never [`ArchClass::Sm90`]:
    /// the Hopper kernel's SASS (`sm_90a`) runs on 9.0 only.
    ///
    /// ```
    /// use flashcore::plan::ArchClass;
    /// let kb = 1024;
    /// assert_eq!(ArchClass::from_compute_capability(8, 9, 99 * kb), Some(ArchClass::Sm86Sm89));
    /// assert_eq!(ArchClass::from_compute_capability(9, 0, 227 * kb), Some(ArchClass::Sm90));
    /// assert_eq!(ArchClass::from_compute_capability(10, 0, 227 * kb), Some(ArchClass::Sm80));
    /// assert_eq!(ArchClass::from_compute_capability(12, 0, 99 * kb), Some(ArchClass::Sm86Sm89));
    /// assert_eq!(ArchClass::from_compute_capability(7, 5, 64 * kb), None);
    /// ```
    pub fn from_compute_capability(
        major: i32,
        minor: i32,
        smem_per_block_optin: usize,
    ) -> Option<ArchClass> {
        let smem = i64::try_from(smem_per_block_optin).unwrap_or(i64::MAX);
        ffi::arch_of(sys::arch_class(major, minor, smem))
    }

    /// Shared memory one block may opt in to on this class (bytes).
    pub fn smem_per_block_optin(self) -> usize {
        ffi::count(sys::arch_smem(ffi::arch_id(self), false))
    }

    /// Shared memory per SM on this class (bytes).
    pub fn smem_per_sm(self) -> usize {
        ffi::count(sys::arch_smem(ffi::arch_id(self), true))
    }
}

/// The GPU kernel families, each with its own tile table. The discriminants are the C++
/// `flashcore::Kernel` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Kernel {
    /// CUTLASS example 41 (`Sm80` tag): [`tile_table`] and [`decode_table`].
    CutlassSm80 = 0,
    /// flashcore's WMMA FlashAttention-2 kernel: [`tile_table`].
    Wmma = 1,
    /// CUTLASS example 88's Hopper mainloop (`wgmma`, TMA, warp specialization) under
    /// flashcore's kernel layer, compute capability 9.0 only (SASS `sm_90a`): [`tile_table`].
    /// Built when 90 is among `FLASHCORE_CUDA_ARCHS`.
    CutlassSm90 = 2,
}

impl Kernel {
    /// Every GPU kernel family, in the order benches and tests race them.
    pub const ALL: [Kernel; 3] = [Kernel::CutlassSm80, Kernel::Wmma, Kernel::CutlassSm90];

    /// A short stable name (also the backend name in errors and bench tables; the C++
    /// `flashcore::name(Kernel)` gives the same).
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::CutlassSm80 => "cutlass-sm80",
            Kernel::Wmma => "wmma",
            Kernel::CutlassSm90 => "cutlass-sm90",
        }
    }

    /// The family named `name` (as [`Kernel::name`] spells it).
    ///
    /// ```
    /// use flashcore::plan::Kernel;
    /// assert_eq!(Kernel::from_name("wmma"), Some(Kernel::Wmma));
    /// assert_eq!(Kernel::from_name("tpu"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether this build compiled the family: always false without the `cuda` feature; the
    /// Hopper kernel only where 90 is among `FLASHCORE_CUDA_ARCHS`. Forcing a family that was
    /// not compiled is [`crate::Error::BackendUnavailable`]; Auto never picks one.
    ///
    /// ```
    /// use flashcore::plan::Kernel;
    /// // Every build with the `cuda` feature has the WMMA kernel.
    /// assert_eq!(Kernel::Wmma.is_compiled(), cfg!(feature = "cuda"));
    /// ```
    pub fn is_compiled(self) -> bool {
        #[cfg(feature = "cuda")]
        {
            sys::compiled_kernels() >> (self as u32) & 1 != 0
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }
}

/// One kernel instantiation. For CUTLASS example 41: `AttentionKernel<T, Sm80, aligned, Q, K,
/// MAX_K>`; for WMMA: `fmha_wmma_kernel<T, BR = Q, BC = K, D = MAX_K>`; for the Hopper kernel:
/// `sm90::Kernel<T, Q, K, D, ..>` (`cpp/src/sm90/kernel.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tile {
    /// Query rows per thread block.
    pub queries_per_block: u32,
    /// Keys per inner iteration.
    pub keys_per_block: u32,
    /// Largest head dim the instantiation accepts.
    pub max_head_dim: u32,
}

/// One row of a table: for `arch`, head dims up to `max_head_dim` use `tile`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileRow {
    /// The device class this row serves.
    pub arch: ArchClass,
    /// Largest head dim (inclusive) served by this row; rows of one class ascend.
    pub max_head_dim: u32,
    /// The instantiation to launch.
    pub tile: Tile,
    /// Dynamic shared memory per block, in bytes.
    pub smem_bytes: usize,
    /// Why this tile for this class.
    pub reason: &'static str,
}

/// `kernel`'s main table: every problem its [`decode_table`] does not serve.
///
/// ```
/// use flashcore::plan::{tile_table, ArchClass, Kernel};
/// let l4_rows = tile_table(Kernel::CutlassSm80).iter().filter(|r| r.arch == ArchClass::Sm86Sm89);
/// assert_eq!(l4_rows.count(), 3); // head dims <= 64, <= 128, <= 256
/// ```
pub fn tile_table(kernel: Kernel) -> &'static [TileRow] {
    table(kernel, false)
}

/// `kernel`'s rows for problems of at most [`decode_max_query_rows`] query rows per head (after
/// one-query GQA heads are packed into rows): CUTLASS example 41's and WMMA's (empty for the
/// Hopper kernel). Head dims above its rows use [`tile_table`].
///
/// ```
/// use flashcore::plan::{decode_table, ArchClass, Kernel};
/// let h200 = decode_table(Kernel::Wmma).iter().filter(|r| r.arch == ArchClass::Sm90);
/// assert!(h200.map(|r| r.tile.queries_per_block).all(|rows| rows == 16));
/// assert!(decode_table(Kernel::CutlassSm90).is_empty());
/// ```
pub fn decode_table(kernel: Kernel) -> &'static [TileRow] {
    table(kernel, true)
}

/// The query-row limit of [`decode_table`].
pub fn decode_max_query_rows() -> usize {
    ffi::limits().2
}

/// The row of `kernel`'s tables for `arch` serving `head_dim` for problems with `query_rows`
/// query rows per head; `None` above the largest tier.
pub fn select_row(
    kernel: Kernel,
    arch: ArchClass,
    head_dim: usize,
    query_rows: usize,
) -> Option<&'static TileRow> {
    let r = sys::select_row(
        ffi::kernel_id(kernel),
        ffi::arch_id(arch),
        i64::try_from(head_dim).unwrap_or(i64::MAX),
        i64::try_from(query_rows).unwrap_or(i64::MAX),
    );
    row(kernel, r)
}

/// Chooses `kernel`'s row for `head_dim` and `query_rows` query rows per head on a device of
/// compute capability `cc` that lets one block opt in to `smem_optin` bytes, or from class
/// `forced` when set.
///
/// ```
/// use flashcore::plan::{choose_row, ArchClass, Kernel};
/// // An L4 (sm_89, 99 KB per block) at head dim 128:
/// let row = choose_row(Kernel::CutlassSm80, 128, 4096, (8, 9), 99 * 1024, None)?;
/// assert_eq!(row.arch, ArchClass::Sm86Sm89);
/// assert_eq!((row.tile.queries_per_block, row.tile.keys_per_block), (32, 128));
/// # Ok::<(), flashcore::Error>(())
/// ```
pub fn choose_row(
    kernel: Kernel,
    head_dim: usize,
    query_rows: usize,
    cc: (i32, i32),
    smem_optin: usize,
    forced: Option<ArchClass>,
) -> Result<&'static TileRow> {
    let caps = CapsFfi {
        major: cc.0,
        minor: cc.1,
        smem_per_block_optin: i64::try_from(smem_optin).unwrap_or(i64::MAX),
        multiprocessors: 0, // Auto is not planned here
    };
    let mut chosen = RowRef::default();
    let status = sys::choose_row(
        ffi::kernel_id(kernel),
        i64::try_from(head_dim).unwrap_or(i64::MAX),
        i64::try_from(query_rows).unwrap_or(i64::MAX),
        &caps,
        forced.map_or(-1, ffi::arch_id),
        &mut chosen,
    );
    ffi::check(status, &ffi::Described::Nothing)?;
    row(kernel, chosen).ok_or_else(|| Error::Launch("the planner named no row".into()))
}

/// Shared memory of the WMMA kernel at `tile` (bytes); every WMMA instantiation checks at
/// compile time that its layout takes exactly this much.
pub fn wmma_smem_bytes(tile: Tile) -> usize {
    ffi::count(sys::wmma_smem_bytes(
        tile.queries_per_block as i32,
        tile.keys_per_block as i32,
        tile.max_head_dim as i32,
    ))
}

/// The kernel [`crate::Backend::Auto`] runs on a GPU of class `arch` with `multiprocessors` SMs,
/// for a problem of `query_rows` query rows per head on `batch_heads` (batch x heads) heads with
/// `seq_k` keys and head dim `head_dim` (a one-query GQA problem counts its packed heads as rows
/// and its kv heads as heads: see [`decode_max_query_rows`]), in a build with every kernel
/// family. Measured, the reasons are beside `flashcore::auto_kernel` in `cpp/src/core/plan.cpp`.
/// Decode (up to [`decode_max_query_rows`] query rows): on compute capability 9.0 the Hopper
/// kernel (split-KV below one unit per SM) up to two units per SM; elsewhere WMMA (split where it
/// helps) below two units per SM; CUTLASS's decode row beyond. There the planner looks at the
/// batch too: on compute capability 9.0 a batch of at most 256 sequences runs on the Hopper
/// kernel, whose blocks walk it a sequence's heads side by side (what ran:
/// [`crate::Execution`]; variable-length batches and paged caches: [`crate::attention_varlen_into`],
/// [`crate::attention_paged_into`]). Otherwise, on compute capability
/// 9.0 the Hopper kernel once its 128-row work units fill the SMs, or once the problem's two
/// products take at least 2^30 flops (4 x `batch_heads` x `query_rows` x `seq_k` x `head_dim`);
/// WMMA otherwise.
///
/// ```
/// use flashcore::plan::{auto_kernel, ArchClass, Kernel};
/// let (h200, l4) = (ArchClass::Sm90, ArchClass::Sm86Sm89);
/// assert_eq!(auto_kernel(h200, 4, 8, 32768, 128, 132), Kernel::CutlassSm90); // one long sequence
/// assert_eq!(auto_kernel(l4, 4, 8, 32768, 128, 58), Kernel::Wmma); // the same on an L4
/// assert_eq!(auto_kernel(h200, 4, 128, 8192, 128, 132), Kernel::CutlassSm90); // 16 sequences
/// // 64 sequences: the decode row by shape (the planner walks them on the Hopper kernel)
/// assert_eq!(auto_kernel(h200, 4, 512, 2048, 128, 132), Kernel::CutlassSm80);
/// assert_eq!(auto_kernel(h200, 4096, 64, 4096, 64, 132), Kernel::CutlassSm90); // 2048 units
/// assert_eq!(auto_kernel(h200, 512, 8, 512, 64, 132), Kernel::Wmma); // 32 units, 2^29 flops
/// assert_eq!(auto_kernel(h200, 1024, 16, 1024, 128, 132), Kernel::CutlassSm90); // 2^33 flops
/// assert_eq!(auto_kernel(l4, 4096, 64, 4096, 64, 58), Kernel::Wmma); // an L4
/// ```
pub fn auto_kernel(
    arch: ArchClass,
    query_rows: usize,
    batch_heads: usize,
    seq_k: usize,
    head_dim: usize,
    multiprocessors: usize,
) -> Kernel {
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let id = sys::auto_kernel(
        ffi::arch_id(arch),
        count(query_rows),
        count(batch_heads),
        count(seq_k),
        count(head_dim),
        i32::try_from(multiprocessors).unwrap_or(i32::MAX),
    );
    ffi::kernel_of(i64::from(id)).unwrap_or(Kernel::Wmma)
}

/// Into how many blocks per (batch, head) `kernel` splits the keys of a problem of `query_rows`
/// query rows per head (after one-query GQA heads are packed into rows), `batch_heads` (batch x
/// heads, as packed) and `seq_k` keys at tile-table `row` on a GPU with `multiprocessors` SMs
/// (split-KV decoding, combined through the partial states' logsumexps;
/// [`Execution::splits`](crate::Execution) reports it). 1 unless the kernel is WMMA or the Hopper
/// kernel and the rows are at most [`decode_max_query_rows`]; then enough splits for two WMMA
/// blocks of `row` per SM (as measured on the H200; fewer where `row` fits fewer), or one Hopper
/// block per SM, at most 64, each of at least 512 keys (the C++ library's `flashcore::kv_splits`).
/// A variable-length batch or a paged cache takes its longest sequence's rows and keys. A
/// variable-length batch packs its heads only where its longest sequence has one query, which
/// sees every key, and Q's and the output's token strides are the same whole number of head
/// strides (packed BSHD tensors): then `batch_heads` is sequences x kv heads, else sequences x
/// query heads.
///
/// ```
/// use flashcore::plan::{decode_table, kv_splits, ArchClass, Kernel};
/// let row = decode_table(Kernel::Wmma)
///     .iter()
///     .find(|r| r.arch == ArchClass::Sm90 && r.max_head_dim >= 128)
///     .unwrap();
/// assert_eq!(kv_splits(Kernel::Wmma, row, 4, 8, 32768, 132), 33); // one sequence, 8 kv heads
/// assert_eq!(kv_splits(Kernel::Wmma, row, 4, 128, 8192, 132), 2); // 16 sequences
/// assert_eq!(kv_splits(Kernel::Wmma, row, 4, 512, 2048, 132), 1); // the SMs are full
/// assert_eq!(kv_splits(Kernel::CutlassSm80, row, 4, 8, 32768, 132), 1);
/// ```
pub fn kv_splits(
    kernel: Kernel,
    row: &TileRow,
    query_rows: usize,
    batch_heads: usize,
    seq_k: usize,
    multiprocessors: usize,
) -> usize {
    let n = sys::kv_splits(
        ffi::kernel_id(kernel),
        &row_ffi(row),
        i64::try_from(query_rows).unwrap_or(i64::MAX),
        i64::try_from(batch_heads).unwrap_or(i64::MAX),
        i64::try_from(seq_k).unwrap_or(i64::MAX),
        i32::try_from(multiprocessors).unwrap_or(i32::MAX),
    );
    usize::try_from(n).unwrap_or(1)
}

/// How many key splits `kernel` runs at most per (sequence, head) of a decode batch whose
/// sequences have `key_counts` keys, when the planner knows them (a variable-length batch or
/// paged cache with host copies, of at most 256 sequences): each sequence's
/// keys in splits of one length, a whole number of key tiles, so that a short sequence gets few
/// splits and a long one many. The length is the shortest (at least 512 keys, at most 64 splits
/// of the longest) whose work units, `heads` per split of a sequence (as packed), fit the
/// [`kv_splits`] target: two WMMA blocks or one Hopper block per SM. 1 (no split) where the
/// unsplit units fill it, where the rows are more than a decode's, or for CUTLASS example 41.
/// Other batches split as [`kv_splits`] says, every sequence as the longest.
///
/// ```
/// use flashcore::plan::{decode_table, sequence_splits, ArchClass, Kernel};
/// let row = decode_table(Kernel::Wmma)
///     .iter()
///     .find(|r| r.arch == ArchClass::Sm90 && r.max_head_dim >= 128)
///     .unwrap();
/// // 8 kv heads (4 query heads each, packed) of 4 sequences of 32k, 4k, 1000 and 300 keys on
/// // 132 SMs: splits of 1216 keys, 27 of the longest, 4, 1 and 1 of the others.
/// assert_eq!(sequence_splits(Kernel::Wmma, row, 4, 8, &[32768, 4096, 1000, 300], 132), 27);
/// assert_eq!(sequence_splits(Kernel::Wmma, row, 4, 8, &[8192; 64], 132), 1); // the SMs are full
/// ```
pub fn sequence_splits(
    kernel: Kernel,
    row: &TileRow,
    query_rows: usize,
    heads: usize,
    key_counts: &[usize],
    multiprocessors: usize,
) -> usize {
    let counts: Vec<i64> = key_counts
        .iter()
        .map(|&k| i64::try_from(k).unwrap_or(i64::MAX))
        .collect();
    let n = sys::sequence_splits(
        ffi::kernel_id(kernel),
        &row_ffi(row),
        i64::try_from(query_rows).unwrap_or(i64::MAX),
        i64::try_from(heads).unwrap_or(i64::MAX),
        &counts,
        i32::try_from(multiprocessors).unwrap_or(i32::MAX),
    );
    usize::try_from(n).unwrap_or(1)
}

/// The bridge's copy of `row` (its reason left out).
fn row_ffi(row: &TileRow) -> sys::TileRowFfi {
    sys::TileRowFfi {
        arch: ffi::arch_id(row.arch),
        max_head_dim: row.max_head_dim as i32,
        queries_per_block: row.tile.queries_per_block as i32,
        keys_per_block: row.tile.keys_per_block as i32,
        tile_max_head_dim: row.tile.max_head_dim as i32,
        smem_bytes: i64::try_from(row.smem_bytes).unwrap_or(i64::MAX),
        reason: String::new(),
    }
}

/// `kernel`'s main table, or its decode table, read from C++ once per process.
fn table(kernel: Kernel, decode: bool) -> &'static [TileRow] {
    // One slot per family's main table, then one per family's decode table.
    const SLOTS: usize = 2 * Kernel::ALL.len();
    static TABLES: [OnceLock<Vec<TileRow>>; SLOTS] = [const { OnceLock::new() }; SLOTS];
    let slot = kernel as usize + if decode { Kernel::ALL.len() } else { 0 };
    TABLES[slot].get_or_init(|| {
        sys::table_rows(ffi::kernel_id(kernel), decode)
            .into_iter()
            .map(|r| TileRow {
                arch: ffi::arch_of(r.arch).unwrap_or(ArchClass::Sm80),
                max_head_dim: r.max_head_dim as u32,
                tile: Tile {
                    queries_per_block: r.queries_per_block as u32,
                    keys_per_block: r.keys_per_block as u32,
                    max_head_dim: r.tile_max_head_dim as u32,
                },
                smem_bytes: ffi::count(r.smem_bytes),
                // Leaked once per process (the tables are loaded once): rows are `Copy` and
                // `'static`, like the C++ tables they mirror.
                reason: r.reason.leak(),
            })
            .collect()
    })
}

/// The row a C++ `RowRef` names in `kernel`'s tables (`None` for index -1).
pub(crate) fn row(kernel: Kernel, r: RowRef) -> Option<&'static TileRow> {
    let index = usize::try_from(r.index).ok()?;
    table(kernel, r.decode).get(index)
}
