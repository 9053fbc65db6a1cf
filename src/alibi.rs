//! ALiBi slopes (BLOOM, MPT): a linear bias on the distance from the diagonal, one slope per
//! query head (or per sequence and head).

use std::sync::Arc;

use crate::error::{Error, Operand, Result};
use crate::ffi::{view_location_code, AlibiFfi};
use crate::tensor::Location;

/// The slopes of ALiBi ([`crate::AttentionOptions::alibi`]): query head `h` of sequence `b`
/// adds
///
/// ```text
/// -slope[b][h] * |i + offset - j|
/// ```
///
/// to the score of its query `i` and key `j`, after the scale and any softcap. `offset` is the
/// diagonal's, as for the sliding window: `seq_k - seq_q` under `Causal::BottomRight` and
/// `Causal::None`, 0 under `Causal::TopLeft`. One row of slopes may serve every sequence
/// ([`AlibiSlopes::new`], `[heads_q]`), or each sequence has its own
/// ([`AlibiSlopes::per_sequence`], `[batch, heads_q]`). Every slope is finite (checked when
/// the slopes are made, [`Error::InvalidAlibiSlope`]); the count of heads (and sequences) is
/// checked against each call's tensors ([`Error::ShapeMismatch`] on
/// [`Operand::AlibiSlopes`]).
///
/// The CPU reference and the WMMA kernel apply them (`Backend::Auto` picks WMMA on a GPU). For
/// a GPU call, copy them to the device once with `AlibiSlopes::to_device` (feature `cuda`) and
/// reuse them; clones share both copies.
///
/// ```
/// use flashcore::{attention, AlibiSlopes, AttentionOptions, Causal, Layout, Tensor};
/// use half::f16;
/// let x = Tensor::full(f16::ONE, &[1, 8, 4, 64], Layout::Bshd)?;
/// // The ALiBi paper's slopes for 4 heads: 1/4, 1/16, 1/64, 1/256.
/// let slopes = AlibiSlopes::geometric(4)?;
/// assert_eq!(slopes.values(), &[0.25, 0.0625, 0.015625, 0.00390625]);
/// let opts = AttentionOptions::default().causal(Causal::BottomRight).alibi(slopes);
/// let r = attention(&x, &x, &x, &opts)?;
/// # Ok::<(), flashcore::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct AlibiSlopes {
    /// Rows of slopes: 1 (shared by every sequence) or the batch.
    batch: usize,
    heads: usize,
    /// Row-major `batch x heads`, finite.
    values: Arc<[f32]>,
    /// The device copy (`AlibiSlopes::to_device`), immutable like the host copy.
    #[cfg(feature = "cuda")]
    device: Option<Arc<crate::cuda::DeviceBuffer<f32>>>,
}

impl PartialEq for AlibiSlopes {
    /// The same slopes in the same place: equal values and shape, and the same device copy
    /// (or none).
    fn eq(&self, other: &Self) -> bool {
        #[cfg(feature = "cuda")]
        let same_copy = match (&self.device, &other.device) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        #[cfg(not(feature = "cuda"))]
        let same_copy = true;
        self.batch == other.batch
            && self.heads == other.heads
            && self.values == other.values
            && same_copy
    }
}

impl AlibiSlopes {
    /// One slope per query head, shared by every sequence (`[heads_q]`).
    pub fn new(slopes: Vec<f32>) -> Result<Self> {
        let heads = slopes.len();
        Self::make(1, heads, slopes)
    }

    /// One row of `heads_q` slopes per sequence (`[batch, heads_q]`, row-major):
    /// `slopes.len()` must be `batch * heads_q` for some `heads_q`.
    pub fn per_sequence(batch: usize, slopes: Vec<f32>) -> Result<Self> {
        if batch == 0 || slopes.len() % batch != 0 {
            return Err(Error::ShapeMismatch {
                operand: Operand::AlibiSlopes,
                dim: "slope count (a multiple of the batch)",
                got: slopes.len(),
                expected: slopes.len() / batch.max(1) * batch.max(1),
            });
        }
        let heads = slopes.len() / batch;
        Self::make(batch, heads, slopes)
    }

    /// The ALiBi paper's slopes for `heads` heads (Press et al., 2022; as BLOOM computes
    /// them): for `n`, the largest power of two not above `heads`, head `h < n` has
    /// `2^(-8 (h + 1) / n)`; the heads beyond `n` take every other slope of the series for
    /// `2n`, `2^(-4 (2k + 1) / n)` for `k = 0, 1, ...`.
    pub fn geometric(heads: usize) -> Result<Self> {
        let n = if heads == 0 {
            0
        } else {
            1usize << heads.ilog2()
        };
        let slope = |exponent: f64| 2f64.powf(-exponent) as f32;
        let slopes = (0..heads)
            .map(|h| {
                if h < n {
                    slope(8.0 * (h + 1) as f64 / n as f64)
                } else {
                    slope(4.0 * (2 * (h - n) + 1) as f64 / n as f64)
                }
            })
            .collect();
        Self::new(slopes)
    }

    fn make(batch: usize, heads: usize, slopes: Vec<f32>) -> Result<Self> {
        crate::ffi::check_alibi_slopes(&slopes)?;
        Ok(AlibiSlopes {
            batch,
            heads,
            values: slopes.into(),
            #[cfg(feature = "cuda")]
            device: None,
        })
    }

    /// The same slopes with a copy on the device of `stream` (enqueued there), for GPU calls.
    /// Make it once and reuse it for every call and layer.
    #[cfg(feature = "cuda")]
    pub fn to_device(&self, stream: &crate::Stream) -> Result<Self> {
        let mut buffer = crate::cuda::DeviceBuffer::alloc(stream, self.values.len())?;
        buffer
            .raw_mut()
            .copy_from_host(bytemuck::cast_slice(&self.values))?;
        Ok(AlibiSlopes {
            device: Some(Arc::new(buffer)),
            ..self.clone()
        })
    }

    /// The device copy, if any.
    #[cfg(feature = "cuda")]
    pub(crate) fn device(&self) -> Option<&crate::cuda::DeviceBuffer<f32>> {
        self.device.as_deref()
    }

    /// The slopes, row-major `[batch, heads]`.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Rows of slopes: 1 when one row serves every sequence, else the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Slopes per row (the query heads).
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// The slope of query head `h` of sequence `b` (validated: in range).
    pub(crate) fn slope(&self, b: usize, h: usize) -> f32 {
        let row = if self.batch == 1 { 0 } else { b };
        self.values[row * self.heads + h]
    }

    /// Where the kernels read the slopes: the device after `AlibiSlopes::to_device` (feature
    /// `cuda`), else the host.
    pub fn location(&self) -> Location {
        #[cfg(feature = "cuda")]
        if let Some(d) = self.device() {
            return Location::Cuda(d.stream().ordinal());
        }
        Location::Host
    }

    /// The address the kernels read: the device copy's, else the host values'.
    fn address(&self) -> u64 {
        #[cfg(feature = "cuda")]
        if let Some(d) = self.device() {
            return d.raw().ptr() as u64;
        }
        self.values.as_ptr() as u64
    }

    /// The bridge's view.
    pub(crate) fn ffi(&self) -> AlibiFfi {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        AlibiFfi {
            address: self.address(),
            location: view_location_code(self.location()),
            batch: count(self.batch),
            heads: count(self.heads),
        }
    }
}
