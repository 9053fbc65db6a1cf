//! Merging attention states: the outputs and logsumexps of the same queries over disjoint key
//! sets, combined into the state over all their keys.

use crate::element::{AttentionElement, Element};
use crate::error::Result;
use crate::ffi::{self, DescFfi};
use crate::tensor::{Location, Tensor};
use crate::validate::desc;

/// One attention state: an output and its logsumexp over one set of keys, as
/// [`attention`](crate::attention) returns them with
/// [`AttentionOptions::return_lse`](crate::AttentionOptions::return_lse).
#[derive(Debug, Clone, Copy)]
pub struct AttentionState<'a, T: Element> {
    /// `[batch, seq, heads, head_dim]`, any strides with a contiguous head dim.
    pub out: &'a Tensor<T>,
    /// Natural-log logsumexp of the scaled scores, dense `[batch, heads, seq]` (made with
    /// `Layout::Bhsd` and head dim 1).
    pub lse: &'a Tensor<f32>,
}

/// Merges `states`, computed for the same queries over disjoint key sets (the splits of
/// split-KV decoding, the shared prefix and the suffixes of cascade attention, the steps of ring
/// attention), into the state over all their keys. Per query row, accumulated in f32 on a GPU
/// and in f64 on the CPU:
///
/// ```text
/// m = max_i lse_i,  w_i = exp(lse_i - m),  out = sum_i w_i out_i / sum_i w_i,
/// lse = m + ln(sum_i w_i)
/// ```
///
/// A state whose lse is `-inf` covers no key: its weight is 0 and its output is never read.
/// When every state of a row is `-inf`, the row gets `out = 0` and `lse = -inf`; a NaN lse
/// makes the row NaN.
///
/// Takes 1 to [`max_merge_states`](crate::max_merge_states) states, each shaped like `out` and
/// with the same rules as an attention output (head dim a multiple of 8 up to 256, contiguous
/// head dim, strides multiples of 8 elements), all where `out` is. On a GPU the merge runs on
/// `out`'s stream, ordered after pending work on the states' streams. Everything is validated
/// before anything runs.
///
/// ```
/// use flashcore::{attention, merge_states, AttentionOptions, AttentionState, Layout, Tensor};
/// use half::f16;
/// let (s, h, d) = (3, 2, 8);
/// let val = |n: usize, seed: usize| -> Vec<f16> {
///     (0..n).map(|i| f16::from_f32(((i * 7 + seed) % 11) as f32 * 0.1 - 0.5)).collect()
/// };
/// let q = Tensor::from_vec(val(s * h * d, 1), &[1, s, h, d], Layout::Bshd)?;
/// let k = Tensor::from_vec(val(8 * h * d, 2), &[1, 8, h, d], Layout::Bshd)?;
/// let v = Tensor::from_vec(val(8 * h * d, 3), &[1, 8, h, d], Layout::Bshd)?;
/// let opts = AttentionOptions::default().with_lse();
/// // The first five keys and the last three, attended to separately, then merged...
/// let keys = |t: &Tensor<f16>, r: std::ops::Range<usize>| -> flashcore::Result<Tensor<f16>> {
///     let data = t.host_data().unwrap()[r.start * h * d..r.end * h * d].to_vec();
///     Tensor::from_vec(data, &[1, r.len(), h, d], Layout::Bshd)
/// };
/// let a = attention(&q, &keys(&k, 0..5)?, &keys(&v, 0..5)?, &opts)?;
/// let b = attention(&q, &keys(&k, 5..8)?, &keys(&v, 5..8)?, &opts)?;
/// let states = [
///     AttentionState { out: &a.out, lse: a.lse.as_ref().unwrap() },
///     AttentionState { out: &b.out, lse: b.lse.as_ref().unwrap() },
/// ];
/// let mut out = Tensor::full(f16::ZERO, &[1, s, h, d], Layout::Bshd)?;
/// merge_states(&states, &mut out, None)?;
/// // ...equal attention over all eight keys (to f16 rounding).
/// let all = attention(&q, &k, &v, &opts)?;
/// for (x, y) in out.host_data().unwrap().iter().zip(all.out.host_data().unwrap()) {
///     assert!((x.to_f32() - y.to_f32()).abs() < 2e-3);
/// }
/// # Ok::<(), flashcore::Error>(())
/// ```
pub fn merge_states<T: AttentionElement>(
    states: &[AttentionState<'_, T>],
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<()> {
    let Some(descs) = validate_states(states, out, lse.as_deref())? else {
        return Ok(());
    };
    match out.location() {
        Location::Host => {
            crate::cpu::merge(states, out, lse);
            Ok(())
        }
        Location::Cuda(_) => merge_gpu(states, &descs, out, lse),
    }
}

/// [`merge_states`] recorded into a CUDA graph ([`crate::Capture::merge_states`]): validated the
/// same way; a merge without rows records nothing; every tensor must be on the capture's stream.
#[cfg(feature = "cuda")]
pub(crate) fn record<T: AttentionElement>(
    states: &[AttentionState<'_, T>],
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    recording: crate::cuda::launch::Recording<'_>,
) -> Result<bool> {
    let Some(descs) = validate_states(states, out, lse.as_deref())? else {
        return Ok(false);
    };
    if out.location() == Location::Host {
        return Err(crate::Error::GraphStream {
            operand: crate::Operand::Out,
        });
    }
    crate::cuda::launch::merge(states, &descs, out, lse, Some(recording))?;
    Ok(true)
}

/// Merges `other` into the state `(out, lse)` in place: the incremental form of
/// [`merge_states`] (ring attention's step, or a running state over several key sets), with the
/// same formula and rules.
pub fn merge_state_into<T: AttentionElement>(
    out: &mut Tensor<T>,
    lse: &mut Tensor<f32>,
    other: AttentionState<'_, T>,
) -> Result<()> {
    let outs = [desc(out)?, desc(other.out)?];
    let lses = [desc(lse)?, desc(other.lse)?];
    if !validate::<T>(&outs, &lses, &outs[0], Some(&lses[0]))? {
        return Ok(());
    }
    match out.location() {
        Location::Host => {
            crate::cpu::merge_in_place(out, lse, other);
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Location::Cuda(_) => crate::cuda::launch::merge_in_place(out, lse, other),
        #[cfg(not(feature = "cuda"))]
        Location::Cuda(_) => Err(crate::Error::CudaNotBuilt),
    }
}

/// The descriptors of a merge's states, in their order: outputs and logsumexps. Only the GPU
/// merge reads them (the CPU merge reads the tensors), so a build without `cuda` never does.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct StateDescs {
    pub(crate) outs: Vec<DescFfi>,
    pub(crate) lses: Vec<DescFfi>,
}

/// Validates the merge of `states` into `out` (and `lse`): the states' descriptors, or `None`
/// when it has no rows.
fn validate_states<T: AttentionElement>(
    states: &[AttentionState<'_, T>],
    out: &Tensor<T>,
    lse: Option<&Tensor<f32>>,
) -> Result<Option<StateDescs>> {
    let outs = states
        .iter()
        .map(|s| desc(s.out))
        .collect::<Result<Vec<DescFfi>>>()?;
    let lses = states
        .iter()
        .map(|s| desc(s.lse))
        .collect::<Result<Vec<DescFfi>>>()?;
    let lse_desc = lse.map(desc).transpose()?;
    let rows = validate::<T>(&outs, &lses, &desc(out)?, lse_desc.as_ref())?;
    Ok(rows.then_some(StateDescs { outs, lses }))
}

/// Validates a merge (C++ `core::validate_merge`); `Ok(false)` when it has no rows to merge.
fn validate<T: AttentionElement>(
    outs: &[DescFfi],
    lses: &[DescFfi],
    out: &DescFfi,
    lse: Option<&DescFfi>,
) -> Result<bool> {
    ffi::validate_merge(ffi::dtype_id(T::DTYPE), outs, lses, out, lse)?;
    Ok(out.shape[0] != 0 && out.shape[1] != 0 && out.shape[2] != 0)
}

#[cfg(feature = "cuda")]
fn merge_gpu<T: AttentionElement>(
    states: &[AttentionState<'_, T>],
    descs: &StateDescs,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<()> {
    crate::cuda::launch::merge(states, descs, out, lse, None)
}

#[cfg(not(feature = "cuda"))]
fn merge_gpu<T: AttentionElement>(
    _: &[AttentionState<'_, T>],
    _: &StateDescs,
    _: &mut Tensor<T>,
    _: Option<&mut Tensor<f32>>,
) -> Result<()> {
    Err(crate::Error::CudaNotBuilt)
}
