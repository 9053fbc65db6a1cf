//! Element types: `half::f16` and `half::bf16` for attention operands, `f32` for logsumexp.

use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for f32 {}
}

/// The element types a [`Tensor`](crate::Tensor) may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision (logsumexp only).
    F32,
}

/// A tensor element (sealed: `f16`, `bf16`, `f32`).
pub trait Element:
    bytemuck::Pod + Default + Send + Sync + std::fmt::Debug + 'static + sealed::Sealed
{
    /// The runtime tag.
    const DTYPE: DType;
    /// Widens to `f64`.
    fn to_f64(self) -> f64;
    /// Rounds from `f64` to nearest.
    fn from_f64(x: f64) -> Self;
}

/// An attention operand element: `half::f16` or `half::bf16`.
///
/// Q, K, V and the output share one element type, checked at compile time:
///
/// ```compile_fail
/// use flashcore::{attention, AttentionOptions, Layout, Tensor};
/// use half::{bf16, f16};
/// let q = Tensor::from_vec(vec![f16::ZERO; 64], &[1, 1, 1, 64], Layout::Bshd).unwrap();
/// let k = Tensor::from_vec(vec![bf16::ZERO; 64], &[1, 1, 1, 64], Layout::Bshd).unwrap();
/// let _ = attention(&q, &k, &k, &AttentionOptions::default()); // dtype mismatch: no such call
/// ```
pub trait AttentionElement: Element {}
impl AttentionElement for f16 {}
impl AttentionElement for bf16 {}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}
