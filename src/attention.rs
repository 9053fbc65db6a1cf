//! The public attention entry points.

use crate::dispatch::{self, Batching, Execution};
use crate::element::{AttentionElement, Element};
use crate::error::Result;
use crate::options::AttentionOptions;
use crate::tensor::{Layout, Location, Tensor};

/// The result of [`attention`].
#[derive(Debug)]
pub struct AttentionOutput<T: Element> {
    /// `[batch, seq_q, heads_q, head_dim]`, dense BSHD, where the inputs live.
    pub out: Tensor<T>,
    /// With [`AttentionOptions::return_lse`]: `[batch, heads_q, seq_q]` natural-log
    /// logsumexp of the scaled scores (a dense BHSD tensor of head dim 1).
    pub lse: Option<Tensor<f32>>,
    /// Which backend and tile ran.
    pub execution: Execution,
}

/// A tensor shaped `dims` (in `layout`'s order) where `like` lives; host tensors are zeroed,
/// device contents are unspecified (the kernel writes every element).
pub(crate) fn alloc_like<U: Element, T: Element>(
    like: &Tensor<T>,
    dims: &[usize],
    layout: Layout,
) -> Result<Tensor<U>> {
    match like.location() {
        Location::Host => Tensor::full(U::default(), dims, layout),
        #[cfg(feature = "cuda")]
        Location::Cuda(_) => match like.stream() {
            Some(stream) => Tensor::uninit_on(stream, dims, layout),
            None => Err(crate::Error::CudaNotBuilt),
        },
        #[cfg(not(feature = "cuda"))]
        Location::Cuda(_) => Err(crate::Error::CudaNotBuilt),
    }
}

/// `softmax(scale * Q K^T + mask) V`, output allocated where the inputs live.
///
/// Q is `[batch, seq_q, heads_q, head_dim]`, K and V `[batch, seq_k, heads_kv, head_dim]`
/// (`heads_kv` divides `heads_q`: GQA/MQA), in any layout whose head dim is contiguous.
/// On a GPU the work is enqueued on the stream of Q; it is ordered after pending work on the
/// streams of K and V, and the output belongs to Q's stream.
///
/// ```
/// use flashcore::{attention, AttentionOptions, BackendKind, Causal, Layout, Tensor};
/// use half::f16;
/// let (b, s, h, d) = (1, 4, 2, 8);
/// let data: Vec<f16> = (0..b * s * h * d).map(|i| f16::from_f32((i % 7) as f32 * 0.1)).collect();
/// let q = Tensor::from_vec(data.clone(), &[b, s, h, d], Layout::Bshd)?;
/// let k = Tensor::from_vec(data.clone(), &[b, s, h, d], Layout::Bshd)?;
/// let v = Tensor::from_vec(data, &[b, s, h, d], Layout::Bshd)?;
/// let res = attention(&q, &k, &v, &AttentionOptions::default().causal(Causal::TopLeft))?;
/// assert_eq!(res.execution.backend, BackendKind::Cpu); // host tensors run on the CPU
/// // The first query sees only the first key, so its output is that key's value.
/// assert_eq!(res.out.get(0, 0, 1, 3), v.get(0, 0, 1, 3));
/// # Ok::<(), flashcore::Error>(())
/// ```
pub fn attention<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    opts: &AttentionOptions,
) -> Result<AttentionOutput<T>> {
    with_outputs(q, opts, |out, lse| attention_into(q, k, v, out, lse, opts))
}

/// Allocates an output shaped like `q` (dense BSHD) and, with `opts.return_lse`, its logsumexp
/// (dense BHSD, head dim 1) where `q` lives, and fills them with `run`.
pub(crate) fn with_outputs<T: AttentionElement>(
    q: &Tensor<T>,
    opts: &AttentionOptions,
    run: impl FnOnce(&mut Tensor<T>, Option<&mut Tensor<f32>>) -> Result<Execution>,
) -> Result<AttentionOutput<T>> {
    let s = q.shape();
    let mut out = alloc_like(q, &[s.batch, s.seq, s.heads, s.head_dim], Layout::Bshd)?;
    let mut lse = if opts.return_lse {
        Some(alloc_like(q, &[s.batch, s.heads, s.seq, 1], Layout::Bhsd)?)
    } else {
        None
    };
    let execution = run(&mut out, lse.as_mut())?;
    Ok(AttentionOutput {
        out,
        lse,
        execution,
    })
}

/// Like [`attention`], writing into the caller's `out` (`[batch, seq_q, heads_q, head_dim]`,
/// any strides with a contiguous head dim) and optionally `lse` (dense `[batch, heads_q, seq_q]`,
/// made with `Layout::Bhsd` and head dim 1). On a GPU the work runs on `out`'s stream.
///
/// Everything is validated before anything is launched; an empty problem (batch, heads or
/// seq_q of 0) validates and returns without launching.
pub fn attention_into<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    opts: &AttentionOptions,
) -> Result<Execution> {
    dispatch::attention_into([q, k, v], Batching::Dense, out, lse, opts)
}
