//! Typed device memory and the host <-> device copies of [`Tensor`].

use std::marker::PhantomData;
use std::sync::Arc;

use super::stream::Stream;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::ffi::cuda::RawBuffer;
use crate::tensor::{Layout, Shape, Storage, Tensor};

/// `len` elements of `T` in device memory, allocated and freed stream-ordered on one stream.
#[derive(Debug)]
pub(crate) struct DeviceBuffer<T: bytemuck::Pod> {
    raw: RawBuffer,
    len: usize,
    stream: Stream,
    _element: PhantomData<T>,
}

impl<T: bytemuck::Pod> DeviceBuffer<T> {
    /// Allocates `len` elements (contents unspecified).
    pub(crate) fn alloc(stream: &Stream, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::SizeOverflow {
                shape: [len, 0, 0, 0],
                strides: [0; 4],
            })?;
        Ok(DeviceBuffer {
            raw: RawBuffer::alloc(Arc::clone(stream.raw()), bytes)?,
            len,
            stream: stream.clone(),
            _element: PhantomData,
        })
    }

    /// A buffer over foreign memory (`Tensor::from_raw_device`): `raw` is borrowed, so
    /// dropping the buffer frees nothing.
    pub(crate) fn from_raw(raw: RawBuffer, len: usize, stream: &Stream) -> Self {
        DeviceBuffer {
            raw,
            len,
            stream: stream.clone(),
            _element: PhantomData,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    pub(crate) fn raw(&self) -> &RawBuffer {
        &self.raw
    }

    pub(crate) fn raw_mut(&mut self) -> &mut RawBuffer {
        &mut self.raw
    }

    /// The stream and the buffer together: a launch enqueues on the one and writes the other.
    pub(crate) fn parts_mut(&mut self) -> (&Stream, &mut RawBuffer) {
        (&self.stream, &mut self.raw)
    }
}

impl<T: Element> Tensor<T> {
    /// A device tensor on `stream` with unspecified contents, dense in `layout`.
    pub fn uninit_on(stream: &Stream, dims: &[usize], layout: Layout) -> Result<Self> {
        let shape = Shape::from_dims(dims, layout)?;
        let buffer = DeviceBuffer::alloc(stream, shape.numel()?)?;
        Tensor::from_device(buffer, shape, shape.strides(layout)?)
    }

    /// Copies this tensor (storage and strides as they are) to the device of `stream`.
    /// A device tensor is copied device-to-device; one on another device is
    /// [`Error::DeviceMismatch`] (operand [`Source`](crate::Operand::Source)).
    pub fn to_device(&self, stream: &Stream) -> Result<Self> {
        match &self.storage {
            Storage::Host(data) => {
                let mut buffer = DeviceBuffer::alloc(stream, data.len())?;
                buffer.raw.copy_from_host(bytemuck::cast_slice(data))?;
                Tensor::from_device(buffer, self.shape(), self.strides())
            }
            Storage::Device(src) => {
                if src.stream.ordinal() != stream.ordinal() {
                    return Err(Error::DeviceMismatch {
                        operand: crate::error::Operand::Source,
                        got: self.location(),
                        expected: crate::tensor::Location::Cuda(stream.ordinal()),
                    });
                }
                let mut buffer = DeviceBuffer::alloc(stream, src.len)?;
                super::launch::order_after(stream, &[&src.stream])?;
                let bytes = src.len * std::mem::size_of::<T>();
                buffer.raw.copy_from_device(&src.raw, bytes)?;
                super::launch::order_after(&src.stream, &[stream])?;
                Tensor::from_device(buffer, self.shape(), self.strides())
            }
        }
    }

    /// Overwrites this tensor's elements with `src`'s, in place: the storage (and a device
    /// tensor's address, which a [`crate::Graph`] or an [`crate::AttentionPlan`]'s run may
    /// rely on) stays. Host or device on either side; a copy into device memory is enqueued on
    /// this tensor's stream, after the work enqueued on `src`'s (and work enqueued later on
    /// `src`'s stream waits for it); a copy to the host waits for the copy.
    ///
    /// Both tensors must have the same dims and strides, and no gaps between their elements
    /// (the copy is one range): [`Error::CopyMismatch`] otherwise. A device source on another
    /// device is [`Error::DeviceMismatch`] (operand [`Source`](crate::Operand::Source)).
    pub fn copy_from(&mut self, src: &Tensor<T>) -> Result<()> {
        let (shape, strides) = (self.shape(), self.strides());
        let n = crate::tensor::addressed_len(shape, strides)?;
        if src.shape() != shape || src.strides() != strides || n != shape.numel()? {
            return Err(Error::CopyMismatch {
                dims: shape.as_array(),
                src_dims: src.shape().as_array(),
            });
        }
        let bytes = n * std::mem::size_of::<T>();
        match (&mut self.storage, &src.storage) {
            (Storage::Host(dst), Storage::Host(from)) => dst[..n].copy_from_slice(&from[..n]),
            (Storage::Host(dst), Storage::Device(from)) => {
                from.raw
                    .copy_to_host(bytemuck::cast_slice_mut(&mut dst[..n]))?;
            }
            (Storage::Device(dst), Storage::Host(from)) => {
                dst.raw.copy_from_host(bytemuck::cast_slice(&from[..n]))?;
            }
            (Storage::Device(dst), Storage::Device(from)) => {
                if from.stream.ordinal() != dst.stream.ordinal() {
                    return Err(Error::DeviceMismatch {
                        operand: crate::error::Operand::Source,
                        got: src.location(),
                        expected: crate::tensor::Location::Cuda(dst.stream.ordinal()),
                    });
                }
                super::launch::order_after(&dst.stream, &[&from.stream])?;
                dst.raw.copy_from_device(&from.raw, bytes)?;
                super::launch::order_after(&from.stream, &[&dst.stream])?;
            }
        }
        Ok(())
    }

    /// Copies this tensor to the host (waits for the copy). A host tensor is cloned.
    pub fn to_host(&self) -> Result<Self> {
        let data = match &self.storage {
            Storage::Host(data) => data.clone(),
            Storage::Device(src) => {
                let mut data = crate::tensor::host_vec(T::default(), src.len)?;
                src.raw.copy_to_host(bytemuck::cast_slice_mut(&mut data))?;
                data
            }
        };
        Tensor::from_vec_strided(data, self.shape(), self.strides())
    }

    /// The stream a device tensor is allocated on (`None` on the host).
    pub fn stream(&self) -> Option<&Stream> {
        match &self.storage {
            Storage::Host(_) => None,
            Storage::Device(b) => Some(&b.stream),
        }
    }

    /// The device address of element `[0, 0, 0, 0]` (`None` on the host).
    pub fn device_ptr(&self) -> Option<usize> {
        match &self.storage {
            Storage::Host(_) => None,
            Storage::Device(b) => Some(b.raw.ptr()),
        }
    }
}
