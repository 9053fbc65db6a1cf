//! Validation: describes the operands to the C++ library's validator (`cpp/src/core/
//! validate.cpp`, shared with C++ callers), which checks every shape, stride, alignment, device,
//! size and scale rule once for both languages. Nothing is launched before it passes.

use crate::alibi::AlibiSlopes;
use crate::bias::Bias;
use crate::element::Element;
use crate::error::Result;
use crate::ffi::{self, RequestFfi};
use crate::options::{AttentionOptions, Causal};
use crate::tensor::{Location, Tensor};

/// The host copies of a variable-length batch's query and key offsets (empty: a dense call).
pub(crate) type Hosts<'a> = (&'a [i32], &'a [i32]);

/// A dense call's (no offsets).
pub(crate) const DENSE: Hosts<'static> = (&[], &[]);

/// A checked attention problem. For a variable-length batch, `batch` counts the sequences and
/// `seq_q` / `seq_k` are the longest ones'.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Problem {
    pub batch: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Logit softcapping (validated: positive and finite).
    pub softcap: Option<f32>,
    /// A sliding window's sides (`None`: unbounded; also a side as wide as the problem).
    pub window: (Option<usize>, Option<usize>),
    /// ALiBi slopes (given by the call, not by validation, which only checks their shape).
    pub alibi: Option<AlibiSlopes>,
    /// An additive bias (given by the call, as the slopes are).
    pub bias: Option<Bias>,
    pub causal: Causal,
    pub location: Location,
}

impl Problem {
    /// No output element: nothing to compute or launch.
    pub fn is_empty(&self) -> bool {
        self.batch == 0 || self.seq_q == 0 || self.heads_q == 0
    }

    /// The diagonal's offset (query `i`'s diagonal key is `i + offset`): 0 for top-left
    /// alignment, `seq_k - seq_q` otherwise (validated sizes fit in i64).
    pub fn diagonal(&self) -> i64 {
        if self.causal == Causal::TopLeft {
            0
        } else {
            self.seq_k as i64 - self.seq_q as i64
        }
    }

    /// Keys visible to query row `i` under the causal mask and the window (C++ `core::blind_rows`
    /// counts the rows where this is empty):
    /// `i + offset - left ..= i + offset + right`, clamped to the keys; offset 0 for top-left
    /// alignment, `seq_k - seq_q` otherwise; a causal mask bounds the right side at 0.
    pub fn visible(&self, i: usize) -> std::ops::Range<usize> {
        // Validated sizes fit in i64 (they are tensor extents); sides were capped at seq_q + seq_k.
        let (i, sk) = (i as i64, self.seq_k as i64);
        let offset = self.diagonal();
        let right = match self.causal {
            Causal::None => self.window.1.map(|r| r as i64),
            _ => Some(0),
        };
        let end = right.map_or(sk, |r| (i + offset + r + 1).clamp(0, sk));
        let start = self
            .window
            .0
            .map_or(0, |l| (i + offset - l as i64).clamp(0, sk));
        start as usize..(end.max(start)) as usize
    }
}

/// The bridge's description of one tensor.
pub(crate) fn desc<T: Element>(t: &Tensor<T>) -> Result<ffi::DescFfi> {
    ffi::desc(
        t.address(),
        t.shape(),
        t.strides(),
        t.location(),
        std::mem::size_of::<T>(),
    )
}

/// The C++ library's description of one call (addresses, dims, strides, locations, options).
pub(crate) fn request<T: Element>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &Tensor<T>,
    lse: Option<&Tensor<f32>>,
    opts: &AttentionOptions,
) -> Result<RequestFfi> {
    let q_desc = desc(q)?;
    Ok(RequestFfi {
        dtype: ffi::dtype_id(T::DTYPE),
        q: q_desc,
        k: desc(k)?,
        v: desc(v)?,
        out: desc(out)?,
        lse: match lse {
            Some(l) => desc(l)?,
            None => q_desc,
        },
        has_lse: lse.is_some(),
        has_scale: opts.scale.is_some(),
        scale: opts.scale.unwrap_or(0.0),
        has_softcap: opts.softcap.is_some(),
        softcap: opts.softcap.unwrap_or(0.0),
        window_left: window_side(opts.window.0),
        window_right: window_side(opts.window.1),
        has_alibi: opts.alibi.is_some(),
        alibi: opts
            .alibi
            .as_ref()
            .map_or_else(ffi::AlibiFfi::default, AlibiSlopes::ffi),
        has_bias: opts.bias.is_some(),
        bias_dtype: opts.bias.as_ref().map_or(0, |b| ffi::dtype_id(b.dtype())),
        bias: match &opts.bias {
            Some(b) => b.desc()?,
            None => q_desc,
        },
        causal: ffi::causal_id(opts.causal),
        backend: ffi::backend_id(opts.backend),
        forced_arch: opts.force_arch_class.map_or(-1, ffi::arch_id),
        varlen: false,
        cu_q: ffi::OffsetsFfi::default(),
        cu_k: ffi::OffsetsFfi::default(),
        paged: false,
        pages: ffi::PagesFfi::default(),
    })
}

/// A window side for C++ (-1: unbounded; a side beyond `i64::MAX` bounds nothing either).
fn window_side(side: Option<usize>) -> i64 {
    side.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX))
}

/// Checks `request` (C++ `core::validate`, with the host copies of a variable-length batch's
/// offsets; empty for a dense call) and returns the problem it describes. GPU calls skip this:
/// the C++ library validates them in the same crossing that plans and launches.
pub(crate) fn validate(
    request: &RequestFfi,
    hosts: Hosts<'_>,
    location: Location,
) -> Result<Problem> {
    let raw = ffi::validate(request, hosts.0, hosts.1)?;
    Ok(problem_of(&raw, request, location))
}

/// Checks the backward call of the forward call `request` (with the host copies of a
/// variable-length batch's offsets; empty for a dense call) with the gradients dout, dq, dk, dv
/// (C++ `core::validate_backward`) and returns its problem.
pub(crate) fn validate_backward(
    request: &RequestFfi,
    hosts: Hosts<'_>,
    grads: &[ffi::DescFfi; 4],
    location: Location,
) -> Result<Problem> {
    let raw = ffi::validate_backward(request, hosts, grads)?;
    Ok(problem_of(&raw, request, location))
}

/// The problem that C++ validation described in `raw`, for `request` at `location`.
fn problem_of(raw: &ffi::ProblemFfi, request: &RequestFfi, location: Location) -> Problem {
    let size = |v: i64| v as usize; // validated: non-negative and within the tensors' extents
    let side = |v: i64| usize::try_from(v).ok(); // -1: unbounded
    Problem {
        batch: size(raw.batch),
        seq_q: size(raw.seq_q),
        seq_k: size(raw.seq_k),
        heads_q: size(raw.heads_q),
        heads_kv: size(raw.heads_kv),
        head_dim: size(raw.head_dim),
        scale: raw.scale,
        softcap: request.has_softcap.then_some(request.softcap),
        window: (side(raw.window_left), side(raw.window_right)),
        alibi: None,
        bias: None,
        causal: ffi::causal_of(raw.causal),
        location,
    }
}
