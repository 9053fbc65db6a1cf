//! The device memory pool behind every flashcore device allocation, and what it holds.
//!
//! Tensors, copies and kernel scratch memory come from the device's default memory pool,
//! stream-ordered (`cudaMallocAsync` / `cudaFreeAsync`). [`Device::open`] sets the pool's release
//! threshold to "keep everything", so memory freed by a dropped tensor stays reserved for the next
//! allocation instead of going back to the driver: a serving loop that allocates fresh outputs
//! every call reaches a steady state and stops growing the pool. [`Device::trim_pool`] gives the
//! unused part back.

use super::device::Device;
use crate::error::Result;
use crate::ffi::cuda as ffi;

/// What a device's memory pool holds, in bytes ([`Device::pool_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUsage {
    /// Device memory the pool has taken from the driver now.
    pub reserved: u64,
    /// The most the pool has held since the process started.
    pub reserved_high: u64,
    /// Bytes of live allocations now (a part of `reserved`).
    pub used: u64,
    /// The most bytes live at once since the process started.
    pub used_high: u64,
}

impl Device {
    /// What the device's default memory pool holds now. The pool is shared by every stream
    /// and every user of the device's default pool in the process (cudarc and C++ callers too).
    pub fn pool_usage(&self) -> Result<PoolUsage> {
        ffi::pool_usage(self.ordinal())
    }

    /// Gives the pool's unused memory back to the driver, keeping at least `keep` bytes
    /// reserved. Memory freed by dropped tensors is unused once the stream it was freed on has
    /// passed the free: synchronise those streams first. Live allocations are never moved, so
    /// a pool chunk with one live allocation in it stays reserved.
    ///
    /// ```no_run
    /// # fn main() -> flashcore::Result<()> {
    /// use flashcore::{Device, Layout, Stream, Tensor};
    /// let device = Device::open(0)?;
    /// let stream = Stream::new(&device)?;
    /// let t = Tensor::<half::f16>::uninit_on(&stream, &[1, 4096, 32, 128], Layout::Bshd)?;
    /// drop(t);
    /// stream.synchronize()?;
    /// device.trim_pool(0)?;
    /// assert_eq!(device.pool_usage()?.used, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn trim_pool(&self, keep: usize) -> Result<()> {
        ffi::trim_pool(self.ordinal(), keep)
    }

    /// Free device memory as the driver reports it (`cudaMemGetInfo`), in bytes. Memory the pool
    /// keeps reserved counts as used.
    pub fn free_memory(&self) -> Result<usize> {
        ffi::free_memory(self.ordinal())
    }
}
