//! The backward pass's tile table: which key-block kernel instance runs a head dim's tier, on
//! which GPUs, and why (`cpp/src/core/backward.h`, `kBackwardTiles`).

use std::sync::OnceLock;

use crate::ffi::{self, sys};

/// The backward pass's key-block kernels (`cpp/src/backward/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackwardKernel {
    /// 4 warps per 64 keys, 32-row query steps: it fits an L4 up to head dim 128.
    Narrow,
    /// 8 warps, FlashAttention-2's tiling: more keys or rows per block, where shared memory
    /// allows (and every row of head dims above 128).
    Wide,
    /// Warpgroup MMAs fed by TMA (compute capability 9.0, in a build with
    /// [`crate::plan::Kernel::CutlassSm90`]): a producer warpgroup and two computing ones per 128
    /// keys. It takes the calls it covers (a dense batch without a softcap, ALiBi or bias, head
    /// dims up to 128) when that kernel is forced, and under [`crate::Backend::Auto`] those
    /// whose grid has a block per SM.
    Hopper,
}

/// One row of [`backward_tile_table`]: head dims up to `max_head_dim` (the row's tier; columns
/// past the head dim are zero) on `kernel`, one block of `warps` warps per `keys_per_block`
/// keys of a kv head, walking `rows_per_step` query rows per step through `step_buffers`
/// buffers of a step's Q and dO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackwardTileRow {
    /// The key-block kernel.
    pub kernel: BackwardKernel,
    /// The row's head-dim tier: 64, 128 or 256.
    pub max_head_dim: u32,
    /// Warps per block.
    pub warps: u32,
    /// Keys per block.
    pub keys_per_block: u32,
    /// Query rows per step.
    pub rows_per_step: u32,
    /// Buffers of a step's Q and dO: 2 (the next step's copies overlap this step's products) or
    /// 1 (they overlap dQ's products only).
    pub step_buffers: u32,
    /// Dynamic shared memory per block, in bytes.
    pub smem_bytes: usize,
    /// Where it runs, and why.
    pub reason: &'static str,
}

/// The backward tile table. A GPU backward call runs the first row of its head dim's tier that
/// takes it (the [`BackwardKernel::Hopper`] rows take the calls that kernel covers when it is
/// forced or Auto picks it, the others every other call) and whose shared memory fits the
/// device (and a forced
/// [`crate::plan::ArchClass`]); the call's [`crate::Execution::backward_tile`] says which.
///
/// ```
/// use flashcore::plan::{backward_tile_table, BackwardKernel};
/// let at_256: Vec<_> = backward_tile_table().iter().filter(|r| r.max_head_dim == 256).collect();
/// assert!(at_256.iter().all(|r| r.kernel == BackwardKernel::Wide));
/// // The last row at 256 fits an L4's 99 KB per block.
/// assert!(at_256.last().unwrap().smem_bytes <= 99 * 1024);
/// ```
pub fn backward_tile_table() -> &'static [BackwardTileRow] {
    static TABLE: OnceLock<Vec<BackwardTileRow>> = OnceLock::new();
    TABLE.get_or_init(|| {
        sys::backward_rows()
            .into_iter()
            .map(|r| BackwardTileRow {
                kernel: match r.kernel {
                    0 => BackwardKernel::Narrow,
                    1 => BackwardKernel::Wide,
                    _ => BackwardKernel::Hopper,
                },
                max_head_dim: r.max_head_dim as u32,
                warps: r.warps as u32,
                keys_per_block: r.keys_per_block as u32,
                rows_per_step: r.rows_per_step as u32,
                step_buffers: r.step_buffers as u32,
                smem_bytes: ffi::count(r.smem_bytes),
                // Leaked once per process, as the forward tables' reasons.
                reason: r.reason.leak(),
            })
            .collect()
    })
}

/// The row at `index` of [`backward_tile_table`] (`None` for -1).
#[cfg(feature = "cuda")]
pub(crate) fn backward_row(index: i32) -> Option<BackwardTileRow> {
    backward_tile_table()
        .get(usize::try_from(index).ok()?)
        .copied()
}
