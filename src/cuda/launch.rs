//! Launching the GPU kernels: stream ordering, the FFI call, and nothing else (the tile was
//! chosen by `plan`, the arguments checked by `validate`).

use super::ffi::{self, FmhaBuffers, FmhaCall, RawEvent};
use super::stream::Stream;
use crate::element::{AttentionElement, DType};
use crate::error::{Error, Result};
use crate::options::Causal;
use crate::plan::{Kernel, TileRow};
use crate::tensor::{Storage, Tensor};
use crate::validate::Problem;

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

fn device_stream<T: crate::element::Element>(t: &Tensor<T>) -> Result<&Stream> {
    t.stream().ok_or_else(not_on_device)
}

fn strides3(s: [usize; 4]) -> [i64; 3] {
    // Validated against 32-bit limits by `plan::check_index_limits`, so these fit.
    [s[0] as i64, s[1] as i64, s[2] as i64]
}

/// Everything of the launch but the pointers (filled by the FFI layer from the buffers).
///
/// One-query GQA/MQA problems (decoding) are packed: the `group` query heads that share a key/
/// value head become `group` query rows of one head, so each K/V tile is read once per group and
/// the kernel's query tile holds `group` useful rows instead of one. Exact when the one query sees
/// every key (no mask, or bottom-right causal); the dense `[batch, heads, 1]` logsumexp layout is
/// the same either way.
fn describe<T: AttentionElement>(
    kernel: Kernel,
    p: &Problem,
    row: &TileRow,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &Tensor<T>,
) -> FmhaCall {
    let group = p.heads_q / p.heads_kv.max(1);
    let pack = p.packs_heads();
    let (mut q_stride, mut o_stride) = (strides3(q.strides()), strides3(out.strides()));
    let (seq_q, heads_q, causal) = if pack {
        // rows advance by the head stride; "heads" (one per kv head) by `group` heads.
        for st in [&mut q_stride, &mut o_stride] {
            *st = [st[0], st[2], st[2] * group as i64];
        }
        (group, p.heads_kv, Causal::None)
    } else {
        (p.seq_q, p.heads_q, p.causal)
    };
    FmhaCall {
        kernel: match kernel {
            Kernel::CutlassSm80 => 0,
            Kernel::Wmma => 1,
        },
        ordinal: 0,
        stream: 0,
        dtype: if T::DTYPE == DType::F16 { 0 } else { 1 },
        q: 0,
        k: 0,
        v: 0,
        out: 0,
        lse: 0,
        batch: p.batch as i64,
        seq_q: seq_q as i64,
        seq_k: p.seq_k as i64,
        heads_q: heads_q as i64,
        heads_kv: p.heads_kv as i64,
        head_dim: p.head_dim as i64,
        q_stride,
        k_stride: strides3(k.strides()),
        v_stride: strides3(v.strides()),
        o_stride,
        scale: p.scale,
        causal: match causal {
            Causal::None => 0,
            Causal::TopLeft => 1,
            Causal::BottomRight => 2,
        },
        tile_q: row.tile.queries_per_block as i32,
        tile_k: row.tile.keys_per_block as i32,
        tile_d: row.tile.max_head_dim as i32,
    }
}

/// Enqueues `kernel` at the tile of `row` on the output's stream.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<T: AttentionElement>(
    kernel: Kernel,
    p: &Problem,
    row: &TileRow,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<()> {
    let stream = device_stream(out)?.clone();
    let lse_stream = match lse.as_deref() {
        Some(l) => Some(device_stream(l)?.clone()),
        None => None,
    };
    let (qs, ks, vs) = (
        device_stream(q)?.clone(),
        device_stream(k)?.clone(),
        device_stream(v)?.clone(),
    );
    let inputs = [Some(&qs), Some(&ks), Some(&vs), lse_stream.as_ref()];
    let inputs = inputs.iter().flatten().copied();
    for s in inputs.clone() {
        order_after(&stream, &[s])?;
    }

    let call = describe(kernel, p, row, q, k, v, out);
    ffi::fmha(call, stream.raw(), buffers(q, k, v, out, lse)?)?;
    // Frees and copies later enqueued on the inputs' streams must follow the kernel.
    for s in inputs {
        order_after(s, &[&stream])?;
    }
    Ok(())
}

/// Host nanoseconds per launch when C++ calls the launcher directly `iters` times (bench only).
/// All operands must be on `out`'s stream.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cpp_launch_ns<T: AttentionElement>(
    kernel: Kernel,
    p: &Problem,
    row: &TileRow,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    iters: i32,
) -> Result<f64> {
    let stream = device_stream(out)?.clone();
    for t in [q, k, v] {
        if !device_stream(t)?.same_as(&stream) {
            return Err(Error::BackendUnavailable {
                backend: kernel.name(),
                reason: "the C++ overhead probe needs all operands on one stream".into(),
            });
        }
    }
    let call = describe(kernel, p, row, q, k, v, out);
    let buffers = buffers(q, k, v, out, None)?;
    ffi::fmha_host_ns(call, stream.raw(), buffers, iters)
}

/// The device buffers behind the operands.
fn buffers<'a, T: AttentionElement>(
    q: &'a Tensor<T>,
    k: &'a Tensor<T>,
    v: &'a Tensor<T>,
    out: &'a mut Tensor<T>,
    lse: Option<&'a mut Tensor<f32>>,
) -> Result<FmhaBuffers<'a>> {
    Ok(FmhaBuffers {
        q: device_buffer(q)?,
        k: device_buffer(k)?,
        v: device_buffer(v)?,
        out: device_buffer_mut(out)?,
        lse: match lse {
            Some(l) => Some(device_buffer_mut(l)?),
            None => None,
        },
    })
}

fn device_buffer<T: crate::element::Element>(t: &Tensor<T>) -> Result<&ffi::RawBuffer> {
    match &t.storage {
        Storage::Device(b) => Ok(b.raw()),
        Storage::Host(_) => Err(not_on_device()),
    }
}

fn device_buffer_mut<T: crate::element::Element>(t: &mut Tensor<T>) -> Result<&mut ffi::RawBuffer> {
    match &mut t.storage {
        Storage::Device(b) => Ok(b.raw_mut()),
        Storage::Host(_) => Err(not_on_device()),
    }
}
