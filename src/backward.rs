//! The backward pass: the gradients of attention's output with respect to Q, K and V.

use crate::attention::alloc_like;
use crate::dispatch::{Batching, Execution, Route, ScoreTensors, CPU};
use crate::element::{AttentionElement, Element};
use crate::error::Result;
use crate::ffi::RequestFfi;
use crate::merge::AttentionState;
use crate::options::AttentionOptions;
use crate::tensor::{Layout, Tensor};
use crate::validate::desc;
use crate::varlen::VarlenBatch;

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
/// the GPU backward kernels (f32 accumulation), on dq's stream, ordered after pending work on
/// the other operands' streams, with the row of [`crate::plan::backward_tile_table`] that ran
/// in [`Execution::backward_tile`]:
/// - the WMMA kernels (compute capability 8.0 and later; [`crate::plan::Kernel::Wmma`]),
///   every head dim up to 256, on the first row of its tier that fits the GPU's shared memory
///   (an L4 takes every tier; a GPU with less than 73 KB per block none at 256:
///   [`crate::Error::SharedMemoryExceeded`]);
/// - the Hopper kernel ([`crate::plan::Kernel::CutlassSm90`]: warpgroup MMAs and TMA, on an
///   H100 / H200 in a build with 90 among its archs) where it covers the call: a dense batch
///   with queries, without a softcap, ALiBi or bias, head dims up to 128, q, k, v and dout with
///   positive strides (no broadcast K / V). Forced elsewhere, it is
///   [`crate::Error::BackendUnavailable`].
///
/// [`crate::Backend::Auto`] takes the Hopper kernel for the calls it covers whose grid (128-key
/// blocks x batch x kv heads) has a block per SM: 1.08-1.25x the WMMA rows there on the H200
/// (docs/BACKWARD.md, session 69); the WMMA kernels elsewhere.
///
/// Forcing [`crate::plan::Kernel::CutlassSm80`] is [`crate::Error::BackendUnavailable`]. It
/// allocates an f32 dQ
/// accumulator of `batch * heads_q * seq_q * D` floats for the call (D: 64, 128 or 256, the
/// head dim rounded up to one of them); dQ's f32 additions (atomics) arrive in no fixed order,
/// so dQ may differ in its last bits between runs. **Speed:** 0.47-0.55x torch's cuDNN
/// backward and 0.80-0.99x its FlashAttention-2 backward on the H200 (docs/PERFORMANCE.md,
/// session 68). Variable-length batches: [`attention_varlen_backward`]; CUDA graphs:
/// `Capture::backward` (feature `cuda`); no paged cache.
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
    with_gradients([q, k, v], |grads| {
        attention_backward_into(q, k, v, forward, dout, grads, opts)
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
    backward_into([q, k, v], Batching::Dense, forward, dout, grads, opts)
}

/// The gradients of [`attention_varlen`](crate::attention_varlen)'s output: as
/// [`attention_backward`], for the sequences of `batch` packed along the token axis (Q, dout and
/// dQ `[1, total_q, heads_q, head_dim]`, K, V, dK and dV `[1, total_k, heads_kv, head_dim]`,
/// the logsumexp `[1, heads_q, total_q]` as the forward call wrote it). Each sequence's
/// gradients are those of its own attention; a sequence without queries gets zero dK and dV.
/// On a GPU the offsets must be on the device (`VarlenBatch::to_device`).
///
/// ```
/// use flashcore::{
///     attention_backward, attention_varlen, attention_varlen_backward, AttentionOptions,
///     AttentionState, Causal, Layout, Tensor, VarlenBatch,
/// };
/// use half::f16;
/// let (h, d) = (2, 8);
/// let val = |n: usize, seed: usize| -> Vec<f16> {
///     (0..n).map(|i| f16::from_f32(((i * 7 + seed) % 11) as f32 * 0.1 - 0.5)).collect()
/// };
/// // Two sequences: 3 queries on 4 keys, then 2 queries on 2 keys.
/// let batch = VarlenBatch::from_lengths(&[3, 2], &[4, 2])?;
/// let q = Tensor::from_vec(val(5 * h * d, 1), &[1, 5, h, d], Layout::Bshd)?;
/// let k = Tensor::from_vec(val(6 * h * d, 2), &[1, 6, h, d], Layout::Bshd)?;
/// let v = Tensor::from_vec(val(6 * h * d, 3), &[1, 6, h, d], Layout::Bshd)?;
/// let dout = Tensor::from_vec(val(5 * h * d, 4), &[1, 5, h, d], Layout::Bshd)?;
/// let opts = AttentionOptions::default().causal(Causal::BottomRight).with_lse();
/// let fwd = attention_varlen(&q, &k, &v, &batch, &opts)?;
/// let state = AttentionState { out: &fwd.out, lse: fwd.lse.as_ref().unwrap() };
/// let grads = attention_varlen_backward(&q, &k, &v, &batch, state, &dout, &opts)?;
/// // The first sequence's keys get the gradients of the first sequence alone.
/// let part = |t: &Tensor<f16>, r: std::ops::Range<usize>| -> flashcore::Result<Tensor<f16>> {
///     let data = t.host_data().unwrap()[r.start * h * d..r.end * h * d].to_vec();
///     Tensor::from_vec(data, &[1, r.len(), h, d], Layout::Bshd)
/// };
/// let (q0, k0, v0, g0) = (part(&q, 0..3)?, part(&k, 0..4)?, part(&v, 0..4)?, part(&dout, 0..3)?);
/// let first = flashcore::attention(&q0, &k0, &v0, &opts)?;
/// let state = AttentionState { out: &first.out, lse: first.lse.as_ref().unwrap() };
/// let alone = attention_backward(&q0, &k0, &v0, state, &g0, &opts)?;
/// assert_eq!(grads.dk.get(0, 3, 1, 5), alone.dk.get(0, 3, 1, 5));
/// # Ok::<(), flashcore::Error>(())
/// ```
pub fn attention_varlen_backward<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    batch: &VarlenBatch,
    forward: AttentionState<'_, T>,
    dout: &Tensor<T>,
    opts: &AttentionOptions,
) -> Result<Gradients<T>> {
    with_gradients([q, k, v], |grads| {
        attention_varlen_backward_into(q, k, v, batch, forward, dout, grads, opts)
    })
}

/// Like [`attention_varlen_backward`], writing the gradients into the caller's tensors, as
/// [`attention_backward_into`] does.
#[allow(clippy::too_many_arguments)] // the forward call's operands and batch, dout, the gradients
pub fn attention_varlen_backward_into<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    batch: &VarlenBatch,
    forward: AttentionState<'_, T>,
    dout: &Tensor<T>,
    grads: GradientsMut<'_, T>,
    opts: &AttentionOptions,
) -> Result<Execution> {
    backward_into(
        [q, k, v],
        Batching::Varlen(batch),
        forward,
        dout,
        grads,
        opts,
    )
}

/// Gradients shaped like `qkv` (dense BSHD, where Q lives), filled by `run`.
fn with_gradients<T: AttentionElement>(
    qkv: [&Tensor<T>; 3],
    run: impl FnOnce(GradientsMut<'_, T>) -> Result<Execution>,
) -> Result<Gradients<T>> {
    let like = |t: &Tensor<T>| {
        let s = t.shape();
        alloc_like::<T, T>(t, &[s.batch, s.seq, s.heads, s.head_dim], Layout::Bshd)
    };
    let [mut dq, mut dk, mut dv] = [like(qkv[0])?, like(qkv[1])?, like(qkv[2])?];
    let execution = run(GradientsMut {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    })?;
    Ok(Gradients {
        dq,
        dk,
        dv,
        execution,
    })
}

/// Validates the backward call of these operands (C++ `core::validate_backward`), then runs it
/// on the CPU backend (host tensors) or the GPU.
fn backward_into<T: AttentionElement>(
    [q, k, v]: [&Tensor<T>; 3],
    batch: Batching<'_>,
    forward: AttentionState<'_, T>,
    dout: &Tensor<T>,
    grads: GradientsMut<'_, T>,
    opts: &AttentionOptions,
) -> Result<Execution> {
    let GradientsMut { dq, dk, dv } = grads;
    let (request, route) = route([q, k, v], batch, forward, dout, [dq, dk, dv], opts)?;
    let problem = match route {
        Route::Cpu(problem) => problem,
        Route::Gpu => {
            let inputs = [q, k, v, forward.out, dout];
            return on_gpu(&request, inputs, forward.lse, [dq, dk, dv], (batch, opts));
        }
    };
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
    let varlen = match batch {
        Batching::Varlen(b) => Some(b),
        _ => None,
    };
    crate::cpu::attention_backward(&problem, varlen, &operands, [dq, dk, dv])?;
    Ok(CPU)
}

/// The C++ library's description of the backward call of these operands, and where it runs:
/// operands all on one GPU go there whole (its C++ entry validates them); any other call is
/// validated here first.
fn route<T: AttentionElement>(
    [q, k, v]: [&Tensor<T>; 3],
    batch: Batching<'_>,
    forward: AttentionState<'_, T>,
    dout: &Tensor<T>,
    [dq, dk, dv]: [&Tensor<T>; 3],
    opts: &AttentionOptions,
) -> Result<(RequestFfi, Route)> {
    let request = crate::dispatch::request([q, k, v, forward.out], Some(forward.lse), batch, opts)?;
    let descs = [desc(dout)?, desc(dq)?, desc(dk)?, desc(dv)?];
    let scores = ScoreTensors::of(opts);
    let locations =
        crate::dispatch::locations([q, k, v, forward.out], Some(forward.lse), batch, scores)
            .chain([dout.location(), dq.location(), dk.location(), dv.location()]);
    let route = crate::dispatch::route_with(opts.backend, locations, |location| {
        crate::validate::validate_backward(&request, batch.hosts(), &descs, location)
    })?;
    Ok((request, route))
}

/// The backward pass on device tensors, all on one GPU (the C++ entry validates, plans and
/// launches: cpp/src/backward.cpp), enqueued or recorded into `recording`; what it reports: the
/// kernel family and the row that ran.
#[cfg(feature = "cuda")]
fn launch_on_gpu<T: AttentionElement>(
    request: &RequestFfi,
    inputs: [&Tensor<T>; 5],
    lse: &Tensor<f32>,
    grads: [&mut Tensor<T>; 3],
    (batch, opts): (Batching<'_>, &AttentionOptions),
    recording: Option<crate::cuda::launch::Recording<'_>>,
) -> Result<Execution> {
    let scores = crate::dispatch::ScoreTensors::of(opts);
    let batching = (batch, scores);
    let row = crate::cuda::launch::backward(request, inputs, lse, grads, batching, recording)?;
    let kernel = match row.kernel {
        crate::plan::BackwardKernel::Hopper => crate::plan::Kernel::CutlassSm90,
        _ => crate::plan::Kernel::Wmma,
    };
    Ok(Execution {
        backend: crate::BackendKind::Kernel(kernel),
        tile: None,
        splits: 1,
        backward_tile: Some(row),
    })
}

/// [`launch_on_gpu`], enqueued.
#[cfg(feature = "cuda")]
fn on_gpu<T: AttentionElement>(
    request: &RequestFfi,
    inputs: [&Tensor<T>; 5],
    lse: &Tensor<f32>,
    grads: [&mut Tensor<T>; 3],
    batch: (Batching<'_>, &AttentionOptions),
) -> Result<Execution> {
    launch_on_gpu(request, inputs, lse, grads, batch, None)
}

#[cfg(not(feature = "cuda"))]
fn on_gpu<T: AttentionElement>(
    _: &RequestFfi,
    _: [&Tensor<T>; 5],
    _: &Tensor<f32>,
    _: [&mut Tensor<T>; 3],
    _: (Batching<'_>, &AttentionOptions),
) -> Result<Execution> {
    Err(crate::Error::CudaNotBuilt)
}

/// Records the backward call into a CUDA graph ([`crate::Capture::backward`]): routed as a call
/// is (a call that would run on the CPU is refused), validated by the C++ entry now, and every
/// operand on the capture's stream.
#[cfg(feature = "cuda")]
pub(crate) fn record<T: AttentionElement>(
    [q, k, v]: [&Tensor<T>; 3],
    batch: Batching<'_>,
    forward: AttentionState<'_, T>,
    dout: &Tensor<T>,
    grads: GradientsMut<'_, T>,
    opts: &AttentionOptions,
    recording: crate::cuda::launch::Recording<'_>,
) -> Result<Execution> {
    let GradientsMut { dq, dk, dv } = grads;
    let (request, route) = route([q, k, v], batch, forward, dout, [dq, dk, dv], opts)?;
    match route {
        Route::Cpu(_) => Err(crate::Error::BackendUnavailable {
            backend: "cpu",
            reason: "a call on host tensors cannot be recorded into a CUDA graph".into(),
        }),
        Route::Gpu => {
            let inputs = [q, k, v, forward.out, dout];
            let batching = (batch, opts);
            launch_on_gpu(
                &request,
                inputs,
                forward.lse,
                [dq, dk, dv],
                batching,
                Some(recording),
            )
        }
    }
}
