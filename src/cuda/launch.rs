//! Launching on the GPU: stream ordering around the C++ call, and nothing else (validation,
//! planning and the launch arguments are the C++ library's).

use super::stream::Stream;
use crate::alibi::AlibiSlopes;
use crate::bias::Bias;
use crate::dispatch::{Batching, Call, Execution};
use crate::element::{AttentionElement, Element};
use crate::error::{Error, Operand, Result};
use crate::ffi::cuda::{self as ffi, IndexBuffers, MergeOperands, Operands, RawBuffer, RawEvent};
use crate::ffi::RequestFfi;
use crate::merge::{AttentionState, StateDescs};
use crate::tensor::{Storage, Tensor};
use crate::validate::desc;

/// Makes later work on `stream` wait for the work enqueued so far on each of `others`.
pub(crate) fn order_after(stream: &Stream, others: &[&Stream]) -> Result<()> {
    for other in others.iter().filter(|o| !o.same_as(stream)) {
        let event = RawEvent::create(other.ordinal())?;
        event.record(other.raw())?;
        stream.raw().wait(&event)?;
    }
    Ok(())
}

/// The error for a host operand reaching a GPU launch (validation rules it out first).
fn not_on_device() -> Error {
    Error::BackendUnavailable {
        backend: "gpu",
        reason: "operands must be device tensors".into(),
    }
}

fn device_stream<T: Element>(t: &Tensor<T>) -> Result<&Stream> {
    t.stream().ok_or_else(not_on_device)
}

/// How a call reaches the C++ library: the first two validate, plan and launch in one crossing.
pub(crate) enum Entry<'a> {
    /// The Rust crate's entry: locations from the tensors, device caps from [`crate::Device`].
    Rust,
    /// The public C++ API, exactly as a C++ program calls it (interop); the host copies of a
    /// variable-length batch's offsets or of a page table are handed over only with
    /// `host_copies`.
    PublicCpp { host_copies: bool },
    /// A call planned once ([`crate::AttentionPlan`]): only the launch; what the plan runs.
    Planned(&'a ffi::Planned, Execution),
    /// A planned call recorded into a CUDA graph ([`crate::Capture`]).
    Captured(&'a ffi::Planned, Execution, Recording<'a>),
}

/// Where a call recorded into a CUDA graph goes ([`crate::Capture`]): it is launched on
/// `capture`, the capture's own stream, where it only records; every operand must be on
/// `target`, the stream the graph is launched on, which then orders it.
#[derive(Clone, Copy)]
pub(crate) struct Recording<'a> {
    pub target: &'a Stream,
    pub capture: &'a ffi::RawStream,
}

impl Recording<'_> {
    /// The first of `operands` (with the output's stream, `out`) not on the target stream, as
    /// [`Error::GraphStream`]: nothing runs now, so nothing can be ordered now, and the graph's
    /// launch on `target` orders only what lives there.
    fn check<'s>(
        &self,
        out: &'s Stream,
        operands: impl IntoIterator<Item = (Operand, &'s Stream)>,
    ) -> Result<()> {
        self.check_all(std::iter::once((Operand::Out, out)).chain(operands))
    }

    /// The first of `operands` not on the target stream, as [`Error::GraphStream`].
    fn check_all<'s>(
        &self,
        operands: impl IntoIterator<Item = (Operand, &'s Stream)>,
    ) -> Result<()> {
        match operands.into_iter().find(|(_, s)| !s.same_as(self.target)) {
            Some((operand, _)) => Err(Error::GraphStream { operand }),
            None => Ok(()),
        }
    }
}

/// Validates, plans and enqueues a call on the output's stream (a variable-length batch's
/// offsets or a page table, on the device, are ordered like the inputs); returns what ran (a
/// planned call: what the plan names).
pub(crate) fn run<T: AttentionElement>(
    entry: Entry<'_>,
    request: &RequestFfi,
    call: Call<'_, T>,
) -> Result<Execution> {
    let Call {
        q,
        k,
        v,
        out,
        lse,
        batch,
        scores,
    } = call;
    // The output's and the logsumexp's streams are borrowed beside their buffers, not cloned
    // (a clone costs atomic reference counts on every planned run).
    let (stream, out) = device_parts(out)?;
    let (lse_stream, lse) = match lse {
        Some(l) => {
            let (s, buffer) = device_parts(l)?;
            (Some(s).filter(|s| !s.same_as(stream)), Some(buffer))
        }
        None => (None, None),
    };
    let (qs, ks, vs) = (device_stream(q)?, device_stream(k)?, device_stream(v)?);
    // The index arrays (offsets or a page table) with their host copies. Arrays not on the
    // device reach C++ without buffers, which refuses them by location.
    let indices = match batch {
        Batching::Varlen(b) => b.device().map(|(q, k)| (false, q, k, b.host())),
        Batching::Paged(p) => p.device().map(|(t, n)| (true, t, n, p.host())),
        Batching::Dense => None,
    };
    let indices_stream = indices.map(|(_, first, _, _)| first.stream());
    // ALiBi slopes or a bias not on the device reach C++ with their host address, refused by
    // location.
    let slopes = scores.alibi.and_then(AlibiSlopes::device);
    let bias = scores.bias.and_then(Bias::device);
    let index_operand = match batch {
        Batching::Paged(_) => Operand::BlockTable,
        _ => Operand::CuSeqlensQ,
    };
    let inputs = [
        (Operand::Q, Some(qs)),
        (Operand::K, Some(ks)),
        (Operand::V, Some(vs)),
        (Operand::Lse, lse_stream),
        (index_operand, indices_stream),
        (Operand::AlibiSlopes, slopes.map(|s| s.stream())),
        (Operand::Bias, bias.map(|(_, s)| s)),
    ];
    let inputs = inputs.iter().filter_map(|(op, s)| s.map(|s| (*op, s)));
    if let Entry::Captured(_, _, recording) = &entry {
        recording.check(stream, inputs.clone())?;
    } else {
        for (_, s) in inputs.clone() {
            order_after(stream, &[s])?;
        }
    }
    let mut operands = operands(q, k, v, out, lse)?;
    operands.alibi = slopes.map(|s| s.raw());
    operands.bias = bias.map(|(b, _)| b);
    if let Some((paged, first, second, (host_first, host_second))) = indices {
        let hidden = matches!(entry, Entry::PublicCpp { host_copies: false });
        operands.indices = Some(IndexBuffers {
            paged,
            first: first.raw(),
            second: second.raw(),
            host_first: if hidden { &[] } else { host_first },
            host_second: if hidden { &[] } else { host_second },
        });
    }
    let ran = match entry {
        Entry::Rust => ffi::attention(request, stream.device(), stream.raw(), operands)?,
        Entry::PublicCpp { .. } => ffi::cpp_attention_forward(request, stream.raw(), operands)?,
        Entry::Planned(planned, execution) => {
            ffi::attention_planned(request, planned, stream.raw(), operands)?;
            execution
        }
        Entry::Captured(planned, execution, recording) => {
            ffi::attention_planned(request, planned, recording.capture, operands)?;
            return Ok(execution);
        }
    };
    // Frees and copies later enqueued on the inputs' streams must follow the kernel.
    for (_, s) in inputs {
        order_after(s, &[stream])?;
    }
    Ok(ran)
}

/// Enqueues the backward pass of the forward call `request` (its inputs q, k, v, out, dout and
/// the logsumexp `lse`, with a variable-length batch's offsets and `scores`' tensors) on dq's
/// stream, ordered after pending work on every other operand's stream and before later work
/// there; or records it into `recording`, where every operand must be on the target stream.
/// Returns the row of [`crate::plan::backward_tile_table`] that runs.
pub(crate) fn backward<T: AttentionElement>(
    request: &RequestFfi,
    inputs: [&Tensor<T>; 5],
    lse: &Tensor<f32>,
    [dq, dk, dv]: [&mut Tensor<T>; 3],
    (batch, scores): (Batching<'_>, crate::dispatch::ScoreTensors<'_>),
    recording: Option<Recording<'_>>,
) -> Result<crate::plan::BackwardTileRow> {
    let dout = desc(inputs[4])?;
    let descs = [desc(dq)?, desc(dk)?, desc(dv)?];
    let (stream, dq) = device_parts(dq)?;
    let (dk_stream, dk) = device_parts(dk)?;
    let (dv_stream, dv) = device_parts(dv)?;
    let [q, k, v, out, dout_t] = inputs.map(device_stream);
    let others = [
        (Operand::DK, Some(dk_stream)),
        (Operand::DV, Some(dv_stream)),
        (Operand::Q, Some(q?)),
        (Operand::K, Some(k?)),
        (Operand::V, Some(v?)),
        (Operand::Out, Some(out?)),
        (Operand::Lse, Some(device_stream(lse)?)),
        (Operand::DOut, Some(dout_t?)),
        (
            Operand::AlibiSlopes,
            scores
                .alibi
                .and_then(AlibiSlopes::device)
                .map(|s| s.stream()),
        ),
        (
            Operand::Bias,
            scores.bias.and_then(Bias::device).map(|(_, s)| s),
        ),
        (
            Operand::CuSeqlensQ,
            match batch {
                Batching::Varlen(b) => b.device().map(|(cu_q, _)| cu_q.stream()),
                _ => None,
            },
        ),
    ];
    let others = others.iter().filter_map(|(op, s)| s.map(|s| (*op, s)));
    match &recording {
        Some(r) => r.check_all(std::iter::once((Operand::DQ, stream)).chain(others.clone()))?,
        None => {
            for (_, s) in others.clone() {
                order_after(stream, &[s])?;
            }
        }
    }
    let [dq_desc, dk_desc, dv_desc] = descs;
    let operands = ffi::BackwardOperands {
        request,
        hosts: batch.hosts(),
        dout,
        grads: [(dq, dq_desc), (dk, dk_desc), (dv, dv_desc)],
    };
    let on = recording
        .as_ref()
        .map_or(stream.raw().as_ref(), |r| r.capture);
    let row = ffi::attention_backward(on, operands)?;
    if recording.is_none() {
        for (_, s) in others {
            order_after(s, &[stream])?;
        }
    }
    Ok(row)
}

/// Host nanoseconds per iteration when C++ runs `probe` `iters` times from its own loop (bench
/// only). All operands must be on `out`'s stream.
pub(crate) fn cpp_launch_ns<T: AttentionElement>(
    request: &RequestFfi,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    iters: i32,
    probe: ffi::HostProbe,
) -> Result<f64> {
    let (stream, out) = device_parts(out)?;
    for t in [q, k, v] {
        if !device_stream(t)?.same_as(stream) {
            return Err(Error::BackendUnavailable {
                backend: "gpu",
                reason: "the C++ overhead probe needs all operands on one stream".into(),
            });
        }
    }
    stream.synchronize()?; // each probe starts with an empty queue
    ffi::attention_host_ns(
        request,
        stream.device(),
        stream.raw(),
        operands(q, k, v, out, None)?,
        iters,
        probe,
    )
}

/// The device buffers behind the inputs, beside the outputs' buffers.
fn operands<'a, T: Element>(
    q: &'a Tensor<T>,
    k: &'a Tensor<T>,
    v: &'a Tensor<T>,
    out: &'a mut RawBuffer,
    lse: Option<&'a mut RawBuffer>,
) -> Result<Operands<'a>> {
    Ok(Operands {
        q: device_buffer(q)?,
        k: device_buffer(k)?,
        v: device_buffer(v)?,
        out,
        lse,
        indices: None,
        alibi: None,
        bias: None,
    })
}

pub(crate) fn device_buffer<T: Element>(t: &Tensor<T>) -> Result<&RawBuffer> {
    match &t.storage {
        Storage::Device(b) => Ok(b.raw()),
        Storage::Host(_) => Err(not_on_device()),
    }
}

/// A device tensor's stream and its buffer, borrowed together.
fn device_parts<T: Element>(t: &mut Tensor<T>) -> Result<(&Stream, &mut RawBuffer)> {
    match &mut t.storage {
        Storage::Device(b) => Ok(b.parts_mut()),
        Storage::Host(_) => Err(not_on_device()),
    }
}

fn device_buffer_mut<T: Element>(t: &mut Tensor<T>) -> Result<&mut RawBuffer> {
    device_parts(t).map(|(_, buffer)| buffer)
}

/// Merges device `states` (validated, with their descriptors `descs`) into `out` (and `lse`) on
/// `out`'s stream, ordered after pending work on the states' streams (and before later work
/// there), or records the merge (`recording`).
pub(crate) fn merge<T: AttentionElement>(
    states: &[AttentionState<'_, T>],
    descs: &StateDescs,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    recording: Option<Recording<'_>>,
) -> Result<()> {
    let mut inputs = Vec::with_capacity(2 * states.len() + 1);
    for (i, s) in states.iter().enumerate() {
        inputs.push((Operand::State(i), device_stream(s.out)?.clone()));
        inputs.push((Operand::StateLse(i), device_stream(s.lse)?.clone()));
    }
    enqueue_merge::<T>(&inputs, &descs.outs, &descs.lses, out, lse, recording)
}

/// Merges device `other` into `(out, lse)` in place on `out`'s stream. State 0 is the output
/// itself (same address and strides): the kernel reads each element and logsumexp before
/// writing it.
pub(crate) fn merge_in_place<T: AttentionElement>(
    out: &mut Tensor<T>,
    lse: &mut Tensor<f32>,
    other: AttentionState<'_, T>,
) -> Result<()> {
    let inputs = [
        (Operand::State(1), device_stream(other.out)?.clone()),
        (Operand::StateLse(1), device_stream(other.lse)?.clone()),
    ];
    let outs = [desc(out)?, desc(other.out)?];
    let lses = [desc(lse)?, desc(other.lse)?];
    enqueue_merge::<T>(&inputs, &outs, &lses, out, Some(lse), None)
}

/// Enqueues the merge of the states `outs` / `lses` (on the streams `inputs`) into `out` and
/// `lse` on `out`'s stream, with the stream ordering of [`run`], or records it.
fn enqueue_merge<T: AttentionElement>(
    inputs: &[(Operand, Stream)],
    outs: &[crate::ffi::DescFfi],
    lses: &[crate::ffi::DescFfi],
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    recording: Option<Recording<'_>>,
) -> Result<()> {
    let stream = device_stream(out)?.clone();
    let lse_stream = match lse.as_deref() {
        Some(l) => Some((Operand::Lse, device_stream(l)?.clone())),
        None => None,
    };
    let inputs: Vec<(Operand, &Stream)> = inputs
        .iter()
        .chain(lse_stream.as_ref())
        .map(|(op, s)| (*op, s))
        .collect();
    match &recording {
        Some(r) => r.check(&stream, inputs.iter().copied())?,
        None => {
            for (_, s) in &inputs {
                order_after(&stream, &[s])?;
            }
        }
    }
    let out_desc = desc(out)?;
    let lse = match lse {
        Some(l) => {
            let d = desc(l)?;
            Some((device_buffer_mut(l)?, d))
        }
        None => None,
    };
    let operands = MergeOperands {
        outs,
        lses,
        out: device_buffer_mut(out)?,
        out_desc,
        lse,
    };
    let on = recording.map_or(stream.raw().as_ref(), |r| r.capture);
    ffi::merge_states(crate::ffi::dtype_id(T::DTYPE), on, operands)?;
    if recording.is_none() {
        for (_, s) in inputs {
            order_after(s, &[&stream])?;
        }
    }
    Ok(())
}
