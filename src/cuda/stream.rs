//! CUDA streams: owned, or borrowed from a raw `cudaStream_t` (see `Stream::from_raw`).

use std::sync::Arc;

use super::device::Device;
use crate::error::Result;
use crate::ffi::cuda::RawStream;

/// A CUDA stream. Clones share the stream; an owned stream is destroyed with its last clone.
///
/// `Send` and `Sync` come from its parts: the CUDA runtime is thread-safe for all the stream
/// operations used here.
#[derive(Debug, Clone)]
pub struct Stream {
    device: Device,
    raw: Arc<RawStream>,
}

impl Stream {
    /// Creates a new non-blocking stream on `device`.
    pub fn new(device: &Device) -> Result<Stream> {
        let raw = RawStream::create(device.ordinal())?;
        Ok(Self::from_parts(device.clone(), Arc::new(raw)))
    }

    pub(crate) fn from_parts(device: Device, raw: Arc<RawStream>) -> Stream {
        Stream { device, raw }
    }

    pub(crate) fn raw(&self) -> &Arc<RawStream> {
        &self.raw
    }

    /// The device this stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// The underlying `cudaStream_t`, for passing to other CUDA code.
    pub fn as_raw(&self) -> *mut std::ffi::c_void {
        self.raw.handle() as *mut std::ffi::c_void
    }

    /// Waits for all work on the stream; surfaces asynchronous faults as [`crate::Error::Cuda`].
    pub fn synchronize(&self) -> Result<()> {
        self.raw.synchronize()
    }

    /// Whether two handles refer to the same CUDA stream.
    pub fn same_as(&self, other: &Stream) -> bool {
        self.raw.handle() == other.raw.handle() && self.ordinal() == other.ordinal()
    }
}
