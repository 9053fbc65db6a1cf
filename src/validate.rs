//! Validation: the one place where operands are checked. Nothing is launched before this passes.

use crate::element::Element;
use crate::error::{Error, Operand, Result};
use crate::options::{AttentionOptions, Causal};
use crate::tensor::{Layout, Location, Shape, Tensor};

/// Largest supported head dim.
pub const MAX_HEAD_DIM: usize = 256;
/// Head dims must be multiples of this (16-byte vector loads of f16/bf16).
pub const HEAD_DIM_MULTIPLE: usize = 8;

/// A checked attention problem.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Problem {
    pub batch: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub causal: Causal,
    pub location: Location,
}

impl Problem {
    /// No output element: nothing to compute or launch.
    pub fn is_empty(&self) -> bool {
        self.batch == 0 || self.seq_q == 0 || self.heads_q == 0
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    /// Whether a one-query GQA/MQA problem runs with the query heads that share a key/value head
    /// packed as query rows (exact because the one query sees every key).
    pub fn packs_heads(&self) -> bool {
        self.seq_q == 1
            && self.heads_kv > 0
            && self.heads_q > self.heads_kv
            && matches!(self.causal, Causal::None | Causal::BottomRight)
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    /// Query rows per (batch, head) the kernel sees, after packing.
    pub fn query_rows(&self) -> usize {
        if self.packs_heads() {
            self.heads_q / self.heads_kv
        } else {
            self.seq_q
        }
    }

    /// Keys visible to query row `i`: `0..visible_keys(i)`.
    pub fn visible_keys(&self, i: usize) -> usize {
        match self.causal {
            Causal::None => self.seq_k,
            Causal::TopLeft => (i + 1).min(self.seq_k),
            Causal::BottomRight => (i + 1 + self.seq_k)
                .saturating_sub(self.seq_q)
                .min(self.seq_k),
        }
    }
}

fn expect_dim(operand: Operand, dim: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            operand,
            dim,
            got,
            expected,
        })
    }
}

fn expect_shape(operand: Operand, got: Shape, expected: Shape) -> Result<()> {
    expect_dim(operand, "batch", got.batch, expected.batch)?;
    expect_dim(operand, "seq", got.seq, expected.seq)?;
    expect_dim(operand, "heads", got.heads, expected.heads)?;
    expect_dim(operand, "head_dim", got.head_dim, expected.head_dim)
}

/// Head-dim stride 1; other strides (of dims longer than 1) multiples of 8 elements; device
/// pointers 16-byte aligned.
fn check_strides<T: Element>(operand: Operand, t: &Tensor<T>) -> Result<()> {
    let strides = t.strides();
    let dims = t.shape().as_array();
    if dims[3] > 1 && strides[3] != 1 {
        return Err(Error::NonContiguousHeadDim {
            operand,
            stride: strides[3],
        });
    }
    const NAMES: [&str; 3] = ["batch", "seq", "heads"];
    for i in 0..3 {
        if dims[i] > 1 && strides[i] % HEAD_DIM_MULTIPLE != 0 {
            return Err(Error::MisalignedStride {
                operand,
                dim: NAMES[i],
                stride: strides[i],
            });
        }
    }
    #[cfg(feature = "cuda")]
    if let Some(ptr) = t.device_ptr() {
        if ptr % 16 != 0 {
            return Err(Error::MisalignedPointer { operand, ptr });
        }
    }
    Ok(())
}

fn check_location(operand: Operand, got: Location, expected: Location) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            operand,
            got,
            expected,
        })
    }
}

/// Checks the operands of one attention call and returns the problem they describe.
pub(crate) fn validate<T: Element>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &Tensor<T>,
    lse: Option<&Tensor<f32>>,
    opts: &AttentionOptions,
) -> Result<Problem> {
    let location = q.location();
    check_location(Operand::K, k.location(), location)?;
    check_location(Operand::V, v.location(), location)?;
    check_location(Operand::Out, out.location(), location)?;
    if let Some(l) = lse {
        check_location(Operand::Lse, l.location(), location)?;
    }

    let (qs, ks) = (q.shape(), k.shape());
    expect_dim(Operand::K, "batch", ks.batch, qs.batch)?;
    expect_dim(Operand::K, "head_dim", ks.head_dim, qs.head_dim)?;
    expect_shape(Operand::V, v.shape(), ks)?;
    expect_shape(Operand::Out, out.shape(), qs)?;
    if let Some(l) = lse {
        let want = Shape::new(qs.batch, qs.seq, qs.heads, 1);
        expect_shape(Operand::Lse, l.shape(), want)?;
        if l.strides() != want.strides(Layout::Bhsd)? && want.numel()? > 1 {
            return Err(Error::LseLayout);
        }
    }

    if ks.heads == 0 && qs.heads > 0 || ks.heads > 0 && qs.heads % ks.heads != 0 {
        return Err(Error::HeadsNotDivisible {
            q_heads: qs.heads,
            kv_heads: ks.heads,
        });
    }
    let d = qs.head_dim;
    if d == 0 || d > MAX_HEAD_DIM || d % HEAD_DIM_MULTIPLE != 0 {
        return Err(Error::UnsupportedHeadDim(d));
    }
    check_strides(Operand::Q, q)?;
    check_strides(Operand::K, k)?;
    check_strides(Operand::V, v)?;
    check_strides(Operand::Out, out)?;

    let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::InvalidScale(scale));
    }
    let problem = Problem {
        batch: qs.batch,
        seq_q: qs.seq,
        seq_k: ks.seq,
        heads_q: qs.heads,
        heads_kv: ks.heads,
        head_dim: d,
        scale,
        causal: opts.causal,
        location,
    };
    if !problem.is_empty() {
        let blind_rows = match (problem.seq_k, problem.causal) {
            (0, _) => problem.seq_q,
            (_, Causal::BottomRight) => problem.seq_q.saturating_sub(problem.seq_k),
            _ => 0,
        };
        if blind_rows > 0 {
            return Err(Error::NoVisibleKeys {
                rows: blind_rows,
                seq_q: problem.seq_q,
                seq_k: problem.seq_k,
            });
        }
    }
    Ok(problem)
}
