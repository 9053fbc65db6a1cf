//! Zero-copy exchange with [cudarc](https://docs.rs/cudarc) (feature `cudarc`): its streams
//! and device slices become flashcore streams and tensors without copying, and slices go back.
//!
//! cudarc works in the device's primary context (`CudaContext::new`), the same one the CUDA
//! runtime (and so flashcore) uses, so pointers and streams are valid on both sides.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, DeviceRepr};

use super::cuda::RawStream;
use crate::cuda::{Device, Stream};
use crate::element::Element;
use crate::error::Result;
use crate::tensor::{Shape, Storage, Tensor};

impl Stream {
    /// Shares a cudarc stream: work flashcore enqueues on the returned `Stream` runs on it, in
    /// order with cudarc's own work there. The `Stream` (and its clones) keep the cudarc stream
    /// alive; flashcore never destroys it.
    pub fn from_cudarc(stream: &Arc<CudaStream>) -> Result<Stream> {
        let device = Device::open(stream.context().ordinal())?;
        let handle = stream.cu_stream() as usize;
        // SAFETY: `handle` is the live stream of `stream`, on `device` (cudarc's context is the
        // device's primary context); the Arc stored inside keeps it alive as long as the
        // RawStream.
        let raw = unsafe {
            RawStream::borrowed(device.ordinal(), handle, Some(Box::new(Arc::clone(stream))))
        }?;
        Ok(Stream::from_parts(device, Arc::new(raw)))
    }
}

impl<T: Element + DeviceRepr> Tensor<T> {
    /// Moves a cudarc slice into a device tensor without copying. `shape` and `strides` (in
    /// elements, ordered like [`Shape::as_array`]) must address at most `slice.len()` elements
    /// ([`crate::Error::StorageTooSmall`]). The tensor lives on the slice's stream ([`Stream::from_cudarc`]);
    /// flashcore enqueues all its work on the memory there, so cudarc's later work on that stream
    /// (including the free when the slice is dropped) follows it. Get the slice back with
    /// [`Tensor::into_cudarc`].
    pub fn from_cudarc(mut slice: CudaSlice<T>, shape: Shape, strides: [usize; 4]) -> Result<Self> {
        let cudarc_stream = Arc::clone(slice.stream());
        let stream = Stream::from_cudarc(&cudarc_stream)?;
        let len = slice.len();
        // Waits (on the slice's stream) for cudarc's earlier work on the slice.
        let (ptr, sync) = slice.device_ptr_mut(&cudarc_stream);
        drop(sync);
        // SAFETY: `ptr` is the slice's allocation of `len` elements on the stream's device; the
        // slice itself becomes the keepalive, so the memory lives as long as the tensor, and its
        // free (on the same stream) follows every use flashcore enqueues there.
        unsafe {
            Tensor::from_borrowed(
                ptr as usize,
                len,
                shape,
                strides,
                &stream,
                Some(Box::new(slice)),
            )
        }
    }

    /// Gives the cudarc slice back (for a tensor made by [`Tensor::from_cudarc`]); any other
    /// tensor, or one whose memory a [`crate::Graph`] still holds, is returned unchanged as
    /// the error value.
    pub fn into_cudarc(mut self) -> std::result::Result<CudaSlice<T>, Box<Self>> {
        let taken = match &mut self.storage {
            Storage::Device(b) => b.raw_mut().take_keepalive(),
            Storage::Host(_) => None,
        };
        match taken.map(|k| k.downcast::<CudaSlice<T>>()) {
            Some(Ok(slice)) => Ok(*slice),
            Some(Err(other)) => {
                if let Storage::Device(b) = &mut self.storage {
                    b.raw_mut().put_keepalive(other);
                }
                Err(Box::new(self))
            }
            None => Err(Box::new(self)),
        }
    }
}
