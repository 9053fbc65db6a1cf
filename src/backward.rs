//! The backward pass: the gradients of attention's output with respect to Q, K and V.

use crate::attention::alloc_like;
use crate::dispatch::{misplaced, Execution, CPU};
use crate::element::{AttentionElement, Element};
use crate::error::Result;
use crate::ffi::RequestFfi;
use crate::merge::AttentionState;
use crate::options::{AttentionOptions, Backend};
use crate::tensor::{Layout, Location, Tensor};
use crate::validate::desc;

/// The result of [`attention_backward`]: the gradients, each shaped like its input (dense BSHD,
/// where the inputs live).
#[derive(Debug)]
pub struct Gradients<T: Element> {
    /// The gradient of the queries, `[batch, seq_q, heads_q, head_dim]`.
    pub dq: Tensor<T>,
    /// The gradient of the keys, `[batch, seq_k, heads_kv, head_dim]` (summed over the query
    /// heads that share each key/value head).
    pub dk: Tensor<T>,
    /// The gradient of the values, shaped like the keys'.
    pub dv: Tensor<T>,
    /// Which backend ran.
    pub execution: Execution,
}

/// The caller's tensors that [`attention_backward_into`] writes: the gradients of Q, K and V,
/// each shaped like its input, in any layout whose head dim is contiguous.
#[derive(Debug)]
pub struct GradientsMut<'a, T: Element> {
    /// The gradient of the queries, shaped like Q.
    pub dq: &'a mut Tensor<T>,
    /// The gradient of the keys, shaped like K.
    pub dk: &'a mut Tensor<T>,
    /// The gradient of the values, shaped like V.
    pub dv: &'a mut Tensor<T>,
}

/// The gradients of [`attention`](crate::attention)'s output with respect to Q, K and V, given
/// the gradient of a loss with respect to that output (`dout`), allocated where the inputs live.
///
/// `forward` is the forward call's state: its output and logsumexp, as
/// [`attention`](crate::attention) returns them with
/// [`AttentionOptions::return_lse`](crate::AttentionOptions::return_lse); `opts` are the
/// forward call's options (scale, causal mask, window, softcap, ALiBi slopes, bias). The
/// gradients are those of the function the forward call computed, from its inputs, its output
/// and its logsumexp (so they follow the rounding of that output, as other attention libraries'
/// backward passes do). ALiBi slopes and a bias are constants: they get no gradient.
///
/// **Where it runs:** host tensors on the CPU backend, in f64 (the reference); device tensors on
/// the GPU backward kernels (compute capability 8.0 and later, WMMA tensor cores, f32
/// accumulation; reported as [`crate::plan::Kernel::Wmma`]), on dq's stream, ordered after
/// pending work on the other operands' streams. The GPU takes head dims up to 128 (a larger one, or forcing
/// another kernel family, is [`crate::Error::BackendUnavailable`]) and allocates an f32 dQ
/// accumulator of `batch * heads_q * seq_q * 64` (head dims up to 64) or `* 128` floats for the
/// call. **It is correct, not yet fast:** 0.12-0.15x the speed of torch's cuDNN backward on the
/// H200 (docs/PERFORMANCE.md, session 65). Dense batches only (no variable-length batch or
/// paged cache).
///
/// ```
/// use flashcore::{
///     attention, attention_backward, AttentionOptions, AttentionState, Layout, Tensor,
/// };
/// use half::f16;
/// let (b, s, h, d) = (1, 4, 2, 8);
/// let val = |seed: usize| -> Vec<f16> {
///     let x = |i: usize| ((i * 7 + seed) % 11) as f32 * 0.1 - 0.5;
///     (0..b * s * h * d).map(|i| f16::from_f32(x(i))).collect()
/// };
/// let q = Tensor::from_vec(val(1), &[b, s, h, d], Layout::Bshd)?;
/// let k = Tensor::from_vec(val(2), &[b, s, h, d], Layout::Bshd)?;
/// let v = Tensor::from_vec(val(3), &[b, s, h, d], Layout::Bshd)?;
/// let opts = AttentionOptions::default().with_lse();
/// let fwd = attention(&q, &k, &v, &opts)?;
/// let state = AttentionState { out: &fwd.out, lse: fwd.lse.as_ref().unwrap() };
/// // The loss sum(out): its gradient with respect to the output is all ones.
/// let dout = Tensor::full(f16::ONE, &[b, s, h, d], Layout::Bshd)?;
/// let grads = attention_backward(&q, &k, &v, state, &dout, &opts)?;
/// // Each row of attention's weights sums to 1, so shifting every value by the same vector
/// // shifts every output by it: the values' gradients sum to the queries' count per head.
/// let dv = grads.dv.host_data().unwrap();
/// let total: f32 = (0..s).map(|j| dv[j * h * d].to_f32()).sum();
/// assert!((total - s as f32).abs() < 1e-2);
/// # Ok::<(), flashcore::Error>(())
/// ```
pub fn attention_backward<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    forward: AttentionState<'_, T>,
    dout: &Tensor<T>,
    opts: &AttentionOptions,
) -> Result<Gradients<T>> {
    let like = |t: &Tensor<T>| {
        let s = t.shape();
        alloc_like::<T, T>(t, &[s.batch, s.seq, s.heads, s.head_dim], Layout::Bshd)
    };
    let (mut dq, mut dk, mut dv) = (like(q)?, like(k)?, like(v)?);
    let grads = GradientsMut {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    let execution = attention_backward_into(q, k, v, forward, dout, grads, opts)?;
    Ok(Gradients {
        dq,
        dk,
        dv,
        execution,
    })
}

/// Like [`attention_backward`], writing the gradients into the caller's tensors (every element
/// of each). Everything is validated before anything runs, with the forward call's rules and
/// then the gradients' (shapes, strides, locations, and no gradient sharing memory with an input
/// or another gradient); a problem without queries (seq_q of 0) writes zeros to dk and dv.
pub fn attention_backward_into<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    forward: AttentionState<'_, T>,
    dout: &Tensor<T>,
    grads: GradientsMut<'_, T>,
    opts: &AttentionOptions,
) -> Result<Execution> {
    let GradientsMut { dq, dk, dv } = grads;
    let request = crate::validate::request(q, k, v, forward.out, Some(forward.lse), opts)?;
    let descs = [desc(dout)?, desc(dq)?, desc(dk)?, desc(dv)?];
    let location = q.location();
    let problem = crate::validate::validate_backward(&request, &descs, location)?;
    match (opts.backend, location) {
        (Backend::Auto | Backend::Cpu, Location::Host) => {}
        (Backend::Cpu, Location::Cuda(_)) | (_, Location::Host) => {
            return Err(misplaced(opts.backend))
        }
        (_, Location::Cuda(_)) => {
            let inputs = [q, k, v, forward.out, dout];
            return on_gpu(&request, inputs, forward.lse, [dq, dk, dv], opts);
        }
    }
    let problem = crate::validate::Problem {
        alibi: opts.alibi.clone(),
        bias: opts.bias.clone(),
        ..problem
    };
    let operands = crate::cpu::BackwardOperands {
        q,
        k,
        v,
        out: forward.out,
        lse: forward.lse,
        dout,
    };
    crate::cpu::attention_backward(&problem, &operands, [dq, dk, dv])?;
    Ok(CPU)
}

/// The backward pass on device tensors (validated here; C++ validates again, plans and
/// launches: cpp/src/backward.cpp).
#[cfg(feature = "cuda")]
fn on_gpu<T: AttentionElement>(
    request: &RequestFfi,
    inputs: [&Tensor<T>; 5],
    lse: &Tensor<f32>,
    grads: [&mut Tensor<T>; 3],
    opts: &AttentionOptions,
) -> Result<Execution> {
    let scores = crate::dispatch::ScoreTensors::of(opts);
    crate::cuda::launch::backward(request, inputs, lse, grads, scores)?;
    // Its one kernel family.
    Ok(Execution {
        backend: crate::BackendKind::Kernel(crate::plan::Kernel::Wmma),
        tile: None,
        splits: 1,
    })
}

#[cfg(not(feature = "cuda"))]
fn on_gpu<T: AttentionElement>(
    _: &RequestFfi,
    _: [&Tensor<T>; 5],
    _: &Tensor<f32>,
    _: [&mut Tensor<T>; 3],
    _: &AttentionOptions,
) -> Result<Execution> {
    Err(crate::Error::CudaNotBuilt)
}
