//! CUDA devices: enumeration and properties.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ffi::cuda as ffi;

/// An opened CUDA device and its properties (cheap to clone).
#[derive(Debug, Clone)]
pub struct Device {
    ordinal: usize,
    info: Arc<ffi::DeviceInfo>,
}

impl std::fmt::Debug for ffi::DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (sm_{}{})", self.name, self.major, self.minor)
    }
}

impl Device {
    /// Number of CUDA devices; 0 when there is no driver or no GPU.
    pub fn count() -> usize {
        ffi::device_count().unwrap_or(0)
    }

    /// Opens device `ordinal` and keeps memory freed to its default pool cached, so repeated
    /// stream-ordered allocations do not reach the driver. No driver, no GPU or an out-of-range ordinal is
    /// [`Error::NoDevice`].
    pub fn open(ordinal: usize) -> Result<Device> {
        let count = ffi::device_count().map_err(|e| Error::NoDevice {
            ordinal,
            reason: e.to_string(),
        })?;
        if ordinal >= count {
            return Err(Error::NoDevice {
                ordinal,
                reason: format!("{count} CUDA device(s) present"),
            });
        }
        let info = ffi::device_info(ordinal)?;
        ffi::retain_pool_memory(ordinal)?;
        Ok(Device {
            ordinal,
            info: Arc::new(info),
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, e.g. `"NVIDIA H200"`.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        (self.info.major, self.info.minor)
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.info.sm_count.max(0) as usize
    }

    /// Shared memory one block may opt in to, in bytes.
    pub fn shared_memory_per_block_optin(&self) -> usize {
        self.info.smem_per_block_optin
    }

    /// Shared memory per multiprocessor, in bytes.
    pub fn shared_memory_per_sm(&self) -> usize {
        self.info.smem_per_sm
    }

    /// Global memory in bytes.
    pub fn total_memory(&self) -> usize {
        self.info.total_memory
    }

    /// L2 cache size in bytes.
    pub fn l2_cache_bytes(&self) -> usize {
        self.info.l2_bytes
    }
}
