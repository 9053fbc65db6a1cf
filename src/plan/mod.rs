//! Planning: which tile-table row runs a validated problem on a given device. Pure data, testable
//! without a GPU.

mod tiles;

pub use tiles::{
    wmma_smem_bytes, ArchClass, Kernel, Tile, TileRow, DECODE_MAX_QUERY_ROWS, DECODE_TABLE,
    TILE_TABLE, WMMA_TABLE,
};

use crate::error::{Error, Result};
use crate::validate::Problem;

impl ArchClass {
    /// The class of a compute capability, or `None` where this build has no Ampere/Ada kernels
    /// (below 8.0, or 10.0 and newer).
    pub fn from_compute_capability(major: i32, minor: i32) -> Option<ArchClass> {
        match (major, minor) {
            (8, 0) => Some(ArchClass::Sm80),
            (8, _) => Some(ArchClass::Sm86Sm89),
            (9, _) => Some(ArchClass::Sm90),
            _ => None,
        }
    }
}

/// The row of `kernel`'s tables for `arch` serving `head_dim` for problems with `query_rows`
/// query rows per head; `None` above the largest tier. For CUTLASS: [`DECODE_TABLE`] for at most
/// [`DECODE_MAX_QUERY_ROWS`] rows where it covers the head dim, else [`TILE_TABLE`]. For WMMA:
/// [`WMMA_TABLE`].
pub fn select_row(
    kernel: Kernel,
    arch: ArchClass,
    head_dim: usize,
    query_rows: usize,
) -> Option<&'static TileRow> {
    let fits = |r: &&TileRow| r.arch == arch && head_dim <= r.max_head_dim as usize;
    match kernel {
        Kernel::CutlassSm80 => {
            let decode = if query_rows <= DECODE_MAX_QUERY_ROWS {
                DECODE_TABLE.iter().find(fits)
            } else {
                None
            };
            decode.or_else(|| TILE_TABLE.iter().find(fits))
        }
        Kernel::Wmma => WMMA_TABLE.iter().find(fits),
    }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const I32_MAX: u64 = i32::MAX as u64;
/// CUDA's limit on `gridDim.y` and `gridDim.z` (heads and batch).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
const GRID_YZ_MAX: u64 = 65_535;

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn limit(kernel: Kernel, what: &'static str, value: usize, limit: u64) -> Result<()> {
    if value as u64 <= limit {
        Ok(())
    } else {
        Err(Error::IndexOverflow {
            backend: kernel.name(),
            what,
            value: value as u64,
            limit,
        })
    }
}

/// Both kernels index with 32-bit sequence lengths and put heads and batch on the grid's y and z
/// axes; example 41 also keeps seq/head strides and `batch * seq_q` in 32 bits (the WMMA kernel
/// shares those limits so that both accept the same problems).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn check_index_limits(
    kernel: Kernel,
    p: &Problem,
    strides: &[[usize; 4]],
) -> Result<()> {
    let limit = |what, value, max| limit(kernel, what, value, max);
    limit("seq_q", p.seq_q, I32_MAX)?;
    limit("seq_k", p.seq_k, I32_MAX)?;
    limit("heads", p.heads_q, GRID_YZ_MAX)?;
    limit("batch", p.batch, GRID_YZ_MAX)?;
    limit(
        "batch * seq_q",
        p.batch.saturating_mul(p.seq_q),
        u32::MAX as u64,
    )?;
    for s in strides {
        limit("seq stride", s[1], I32_MAX)?;
        limit("head stride", s[2], I32_MAX)?;
        limit("batch stride", s[0], i64::MAX as u64)?;
    }
    Ok(())
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
    let arch = match forced {
        Some(a) => a,
        None => ArchClass::from_compute_capability(cc.0, cc.1).ok_or(Error::UnsupportedDevice {
            major: cc.0,
            minor: cc.1,
        })?,
    };
    let row = select_row(kernel, arch, head_dim, query_rows)
        .ok_or(Error::UnsupportedHeadDim(head_dim))?;
    if row.smem_bytes > smem_optin {
        return Err(Error::SharedMemoryExceeded {
            needed: row.smem_bytes,
            available: smem_optin,
        });
    }
    Ok(row)
}

/// The kernel [`crate::Backend::Auto`] runs on a GPU.
///
/// CUTLASS for every problem: on the H200 (2026-11-21, `docs/PERFORMANCE.md`) the WMMA kernel
/// beat it only on two small f16 seed shapes (by 1% and 6%) and trailed it everywhere else:
/// 0.92-0.95x (d=64, f16), 0.83-0.84x (d=128, f16), 0.55-0.64x (bf16), 0.39-0.49x (decode).
pub const fn auto_kernel() -> Kernel {
    Kernel::CutlassSm80
}
