//! An additive bias or mask on the attention scores (relative positions, prefix-LM and document
//! masks): one tensor, broadcast through its dims and strides.

use std::sync::Arc;

use half::{bf16, f16};

use crate::element::{DType, Element};
use crate::error::Result;
use crate::ffi::DescFfi;
use crate::tensor::{Location, Shape, Tensor};

/// An additive bias or mask on the scores ([`crate::AttentionOptions::bias`]): query `i` and
/// key `j` of sequence `b` and query head `h` add
///
/// ```text
/// bias[b, i, h, j]
/// ```
///
/// to their score after the scale, any softcap and ALiBi, before the softmax. The tensor's
/// [`Shape`] reads `[batch, seq_q, heads_q, seq_k]`: `batch`, `seq` = the queries, `heads` =
/// the query heads, `head_dim` = the keys (a tensor made with `Layout::Bhsd` and dims
/// `[batch, heads_q, seq_q, seq_k]` is PyTorch's `attn_mask` layout). Each dim is the call's or
/// 1, which broadcasts; a stride of 0 broadcasts too. For a variable-length batch the dims are
/// `[sequences, max_seqlen_q, heads_q, max_seqlen_k]` and `i`, `j` count from each sequence's
/// first query and key; for a paged cache `seq_k` is the longest sequence's key count.
///
/// Elements are `f16`, `bf16` or `f32`, whatever Q's type. `-inf` masks a key; a row whose
/// every key is masked gets output 0 and logsumexp `-inf` (never NaN). NaN or `+inf` elements
/// give NaN rows. Shapes, strides and the place are checked against each call
/// ([`crate::Error::ShapeMismatch`] and [`crate::Error::DeviceMismatch`] on
/// [`crate::Operand::Bias`]); a bias that shares memory with an output is
/// [`crate::Error::OverlappingOutput`].
///
/// The CPU reference, the WMMA kernel and, in a build with the `sm90-bias` feature, the Hopper
/// kernel apply it (`Backend::Auto` then picks the Hopper kernel on compute capability 9.0 where
/// it picks it for the call without the bias, else WMMA; forcing CUTLASS example 41, or the
/// Hopper kernel without the feature, is [`crate::Error::BackendUnavailable`]). The feature adds
/// six kernels, about four minutes of a clean build on 2 cores; without it a bias on an H200
/// takes about 3.6 times as long (docs/PERFORMANCE.md). The Hopper kernel
/// reads an `f16` or `bf16` bias with contiguous keys and even row offsets two keys per load,
/// ahead of the tile that needs them, and any other bias key by key. Making a bias moves the
/// tensor in, without a copy; clones share it, so one bias can serve every layer of a step.
///
/// ```
/// use flashcore::{attention, AttentionOptions, Bias, Layout, Tensor};
/// use half::f16;
/// let (seq, heads) = (6, 2);
/// let x = Tensor::full(f16::ONE, &[1, seq, heads, 64], Layout::Bshd)?;
/// // A document mask: tokens 0..3 and 3..6 are two documents that must not see each other.
/// let doc = |t: usize| t / 3;
/// let mask: Vec<f32> = (0..seq * seq)
///     .map(|n| if doc(n / seq) == doc(n % seq) { 0.0 } else { f32::NEG_INFINITY })
///     .collect();
/// // [1, 1, seq_q, seq_k] in BHSD order: one mask for every sequence and head.
/// let bias = Bias::from(Tensor::from_vec(mask, &[1, 1, seq, seq], Layout::Bhsd)?);
/// let r = attention(&x, &x, &x, &AttentionOptions::default().bias(bias))?;
/// # Ok::<(), flashcore::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Bias(Arc<Held>);

#[derive(Debug)]
enum Held {
    F16(Tensor<f16>),
    BF16(Tensor<bf16>),
    F32(Tensor<f32>),
}

/// Runs `$body` with `$t` bound to the held tensor, whatever its element type.
macro_rules! with_tensor {
    ($held:expr, $t:ident => $body:expr) => {
        match $held {
            Held::F16($t) => $body,
            Held::BF16($t) => $body,
            Held::F32($t) => $body,
        }
    };
}

impl From<Tensor<f16>> for Bias {
    fn from(t: Tensor<f16>) -> Self {
        Bias(Arc::new(Held::F16(t)))
    }
}

impl From<Tensor<bf16>> for Bias {
    fn from(t: Tensor<bf16>) -> Self {
        Bias(Arc::new(Held::BF16(t)))
    }
}

impl From<Tensor<f32>> for Bias {
    fn from(t: Tensor<f32>) -> Self {
        Bias(Arc::new(Held::F32(t)))
    }
}

impl PartialEq for Bias {
    /// The same tensor (clones of one bias), not equal contents.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Bias {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match &*self.0 {
            Held::F16(_) => DType::F16,
            Held::BF16(_) => DType::BF16,
            Held::F32(_) => DType::F32,
        }
    }

    /// The dims, read as `[batch, seq_q, heads_q, seq_k]`.
    pub fn shape(&self) -> Shape {
        with_tensor!(&*self.0, t => t.shape())
    }

    /// The element strides, ordered like [`Bias::shape`].
    pub fn strides(&self) -> [usize; 4] {
        with_tensor!(&*self.0, t => t.strides())
    }

    /// Where the tensor lives.
    pub fn location(&self) -> Location {
        with_tensor!(&*self.0, t => t.location())
    }

    /// The bridge's description of the tensor.
    pub(crate) fn desc(&self) -> Result<DescFfi> {
        with_tensor!(&*self.0, t => crate::validate::desc(t))
    }

    /// Element `[b, i, h, j]` of a host bias as f64 (dims of 1 broadcast); `None` on a device
    /// (validation puts a CPU call's bias on the host).
    pub(crate) fn value(&self, b: usize, i: usize, h: usize, j: usize) -> Option<f64> {
        fn at<T: Element>(t: &Tensor<T>, index: [usize; 4]) -> Option<f64> {
            let dims = t.shape().as_array();
            let [b, i, h, j] = std::array::from_fn(|a| if dims[a] == 1 { 0 } else { index[a] });
            t.host_data().map(|v| v[t.offset(b, i, h, j)].to_f64())
        }
        with_tensor!(&*self.0, t => at(t, [b, i, h, j]))
    }

    /// The device storage and its stream (`None` on the host).
    #[cfg(feature = "cuda")]
    pub(crate) fn device(&self) -> Option<(&crate::ffi::cuda::RawBuffer, &crate::Stream)> {
        fn of<T: Element>(t: &Tensor<T>) -> Option<(&crate::ffi::cuda::RawBuffer, &crate::Stream)> {
            match &t.storage {
                crate::tensor::Storage::Device(b) => Some((b.raw(), b.stream())),
                crate::tensor::Storage::Host(_) => None,
            }
        }
        with_tensor!(&*self.0, t => of(t))
    }
}
