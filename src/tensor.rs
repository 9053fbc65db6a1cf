//! Tensors: a 4-D view `[batch, seq, heads, head_dim]` with element strides over host or device
//! storage.

use crate::element::Element;
use crate::error::{Error, Result};

/// Memory order of a 4-D attention tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[batch, seq, heads, head_dim]`, row-major (the layout of most inference engines).
    Bshd,
    /// `[batch, heads, seq, head_dim]`, row-major (PyTorch SDPA's layout).
    Bhsd,
}

/// Logical sizes of an attention tensor, independent of its layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Batch size.
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Number of heads.
    pub heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl Shape {
    /// A shape from its four sizes.
    pub const fn new(batch: usize, seq: usize, heads: usize, head_dim: usize) -> Self {
        Shape {
            batch,
            seq,
            heads,
            head_dim,
        }
    }

    /// Reads `dims` in `layout`'s order (`[b, s, h, d]` for BSHD, `[b, h, s, d]` for BHSD).
    pub fn from_dims(dims: &[usize], layout: Layout) -> Result<Self> {
        let [b, x, y, d] = <[usize; 4]>::try_from(dims).map_err(|_| Error::Rank {
            expected: 4,
            got: dims.len(),
        })?;
        Ok(match layout {
            Layout::Bshd => Shape::new(b, x, y, d),
            Layout::Bhsd => Shape::new(b, y, x, d),
        })
    }

    /// The sizes as `[batch, seq, heads, head_dim]`.
    pub const fn as_array(&self) -> [usize; 4] {
        [self.batch, self.seq, self.heads, self.head_dim]
    }

    /// Number of elements, or [`Error::SizeOverflow`].
    pub fn numel(&self) -> Result<usize> {
        self.as_array()
            .iter()
            .try_fold(1usize, |acc, &n| acc.checked_mul(n))
            .ok_or(Error::SizeOverflow {
                shape: self.as_array(),
                strides: [0; 4],
            })
    }

    /// Dense strides of this shape in `layout`, ordered like [`Shape::as_array`].
    pub fn strides(&self, layout: Layout) -> Result<[usize; 4]> {
        let overflow = || Error::SizeOverflow {
            shape: self.as_array(),
            strides: [0; 4],
        };
        let d = self.head_dim;
        match layout {
            Layout::Bshd => {
                let s = self.heads.checked_mul(d).ok_or_else(overflow)?;
                let b = self.seq.checked_mul(s).ok_or_else(overflow)?;
                Ok([b, s, d, 1])
            }
            Layout::Bhsd => {
                let h = self.seq.checked_mul(d).ok_or_else(overflow)?;
                let b = self.heads.checked_mul(h).ok_or_else(overflow)?;
                Ok([b, d, h, 1])
            }
        }
    }
}

/// Where a tensor's storage lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory.
    Host,
    /// Memory of the CUDA device with this ordinal.
    Cuda(usize),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Host => f.write_str("host"),
            Location::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

pub(crate) enum Storage<T: Element> {
    Host(Vec<T>),
    #[cfg(feature = "cuda")]
    Device(crate::cuda::DeviceBuffer<T>),
}

/// A 4-D tensor `[batch, seq, heads, head_dim]` with element strides, on the host or a GPU.
///
/// ```
/// use flashcore::{Layout, Tensor};
/// use half::f16;
/// // BHSD dims are given in BHSD order: [batch, heads, seq, head_dim].
/// let t = Tensor::from_vec(vec![f16::ONE; 2 * 4 * 3 * 8], &[2, 4, 3, 8], Layout::Bhsd)?;
/// assert_eq!(t.shape().seq, 3);
/// assert_eq!(t.strides(), [96, 8, 24, 1]);
/// # Ok::<(), flashcore::Error>(())
/// ```
pub struct Tensor<T: Element> {
    pub(crate) storage: Storage<T>,
    shape: Shape,
    strides: [usize; 4],
}

/// `n` copies of `value` on the host, or [`Error::OutOfHostMemory`] when the allocator cannot
/// provide them (never an abort).
pub(crate) fn host_vec<T: Clone>(value: T, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfHostMemory {
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    v.resize(n, value);
    Ok(v)
}

/// Elements a view addresses: 1 + the largest offset, 0 when empty.
pub(crate) fn addressed_len(shape: Shape, strides: [usize; 4]) -> Result<usize> {
    let dims = shape.as_array();
    if dims.contains(&0) {
        return Ok(0);
    }
    dims.iter()
        .zip(strides)
        .try_fold(1usize, |acc, (&n, s)| {
            acc.checked_add((n - 1).checked_mul(s)?)
        })
        .ok_or(Error::SizeOverflow {
            shape: dims,
            strides,
        })
}

impl<T: Element> Tensor<T> {
    /// Wraps host data laid out densely in `layout`; `dims` are in that layout's order.
    pub fn from_vec(data: Vec<T>, dims: &[usize], layout: Layout) -> Result<Self> {
        let shape = Shape::from_dims(dims, layout)?;
        let strides = shape.strides(layout)?;
        Self::from_vec_strided(data, shape, strides)
    }

    /// Wraps host data with explicit element strides (ordered like [`Shape::as_array`]).
    pub fn from_vec_strided(data: Vec<T>, shape: Shape, strides: [usize; 4]) -> Result<Self> {
        let needed = addressed_len(shape, strides)?;
        if data.len() < needed {
            return Err(Error::StorageTooSmall {
                len: data.len(),
                needed,
            });
        }
        Ok(Tensor {
            storage: Storage::Host(data),
            shape,
            strides,
        })
    }

    /// A dense host tensor filled with `value`; [`Error::OutOfHostMemory`] when the host cannot
    /// hold it.
    ///
    /// ```
    /// use flashcore::{Error, Layout, Tensor};
    /// use half::f16;
    /// // 2^48 bytes: more than any host can give; an error, not an abort.
    /// let huge = Tensor::full(f16::ZERO, &[1 << 24, 1 << 20, 1, 8], Layout::Bshd);
    /// assert!(matches!(huge, Err(Error::OutOfHostMemory { .. })));
    /// ```
    pub fn full(value: T, dims: &[usize], layout: Layout) -> Result<Self> {
        let shape = Shape::from_dims(dims, layout)?;
        Self::from_vec(host_vec(value, shape.numel()?)?, dims, layout)
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn from_device(
        buffer: crate::cuda::DeviceBuffer<T>,
        shape: Shape,
        strides: [usize; 4],
    ) -> Result<Self> {
        let needed = addressed_len(shape, strides)?;
        if buffer.len() < needed {
            return Err(Error::StorageTooSmall {
                len: buffer.len(),
                needed,
            });
        }
        Ok(Tensor {
            storage: Storage::Device(buffer),
            shape,
            strides,
        })
    }

    /// Logical sizes.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Element strides, ordered like [`Shape::as_array`].
    pub fn strides(&self) -> [usize; 4] {
        self.strides
    }

    /// Where the storage lives.
    pub fn location(&self) -> Location {
        match &self.storage {
            Storage::Host(_) => Location::Host,
            #[cfg(feature = "cuda")]
            Storage::Device(b) => Location::Cuda(b.stream().ordinal()),
        }
    }

    /// The host storage, or `None` for a device tensor.
    pub fn host_data(&self) -> Option<&[T]> {
        match &self.storage {
            Storage::Host(v) => Some(v),
            #[cfg(feature = "cuda")]
            Storage::Device(_) => None,
        }
    }

    pub(crate) fn host_data_mut(&mut self) -> Option<&mut [T]> {
        match &mut self.storage {
            Storage::Host(v) => Some(v),
            #[cfg(feature = "cuda")]
            Storage::Device(_) => None,
        }
    }

    /// The address of element `[0, 0, 0, 0]`: device or host.
    pub(crate) fn address(&self) -> u64 {
        match &self.storage {
            Storage::Host(v) => v.as_ptr() as u64,
            #[cfg(feature = "cuda")]
            Storage::Device(b) => b.raw().ptr() as u64,
        }
    }

    /// Storage offset of element `[b, s, h, d]`.
    pub fn offset(&self, b: usize, s: usize, h: usize, d: usize) -> usize {
        let [sb, ss, sh, sd] = self.strides;
        b * sb + s * ss + h * sh + d * sd
    }

    /// Reads element `[b, s, h, d]` of a host tensor (`None` out of range or on a device).
    pub fn get(&self, b: usize, s: usize, h: usize, d: usize) -> Option<T> {
        let Shape {
            batch,
            seq,
            heads,
            head_dim,
        } = self.shape;
        if b >= batch || s >= seq || h >= heads || d >= head_dim {
            return None;
        }
        self.host_data().map(|v| v[self.offset(b, s, h, d)])
    }
}

impl<T: Element> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &T::DTYPE)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("location", &self.location())
            .finish()
    }
}
