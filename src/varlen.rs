//! Variable-length batches: sequences of different lengths packed along the token axis, each
//! attended on its own (FlashAttention's `cu_seqlens`).

use crate::dispatch::{self, Batching, Execution};
use crate::element::AttentionElement;
use crate::error::{Error, Operand, Result};
use crate::ffi::{view_location_code, OffsetsFfi};
use crate::options::AttentionOptions;
use crate::tensor::{Location, Tensor};

/// One offsets array (`cu_seqlens`): `batch + 1` int32 offsets into a packed token axis, always
/// with a host copy (checked against the tensors before every launch), and a device copy after
/// `VarlenBatch::to_device`. Both are immutable, so they never disagree.
#[derive(Debug, Clone)]
struct SeqOffsets {
    host: Vec<i32>,
    max_len: usize,
    #[cfg(feature = "cuda")]
    device: Option<std::sync::Arc<crate::cuda::DeviceBuffer<i32>>>,
}

impl SeqOffsets {
    fn new(host: Vec<i32>) -> Self {
        let max_len = host
            .windows(2)
            .map(|w| usize::try_from(i64::from(w[1]) - i64::from(w[0])).unwrap_or(0))
            .max()
            .unwrap_or(0);
        SeqOffsets {
            host,
            max_len,
            #[cfg(feature = "cuda")]
            device: None,
        }
    }

    fn location(&self) -> Location {
        #[cfg(feature = "cuda")]
        if let Some(d) = &self.device {
            return Location::Cuda(d.stream().ordinal());
        }
        Location::Host
    }

    /// Where the kernels read the offsets: the device copy, else the host copy.
    fn address(&self) -> u64 {
        #[cfg(feature = "cuda")]
        if let Some(d) = &self.device {
            return d.raw().ptr() as u64;
        }
        self.host.as_ptr() as u64
    }

    /// The bridge's view.
    fn ffi(&self) -> OffsetsFfi {
        let location = view_location_code(self.location());
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        OffsetsFfi {
            address: self.address(),
            location,
            count: count(self.host.len()) - 1,
            max_len: count(self.max_len),
        }
    }
}

/// The composition of a variable-length batch: for each sequence, where its queries and its
/// keys start in the packed Q and K/V tensors.
///
/// Sequence `b` owns query tokens `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` and key tokens
/// `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`. Every sequence has its own lengths and its own causal
/// alignment; a sequence may have no queries. The offsets are checked against the tensors before
/// anything runs: they start at 0, never decrease, and end at the token counts
/// ([`Error::InvalidOffsets`]); every query must see a key ([`Error::NoVisibleKeys`]).
///
/// ```
/// use flashcore::VarlenBatch;
/// let batch = VarlenBatch::from_lengths(&[3, 0, 5], &[4, 2, 5])?;
/// assert_eq!(batch.cu_seqlens_q(), &[0, 3, 3, 8]);
/// assert_eq!(batch.cu_seqlens_k(), &[0, 4, 6, 11]);
/// assert_eq!((batch.max_seqlen_q(), batch.max_seqlen_k()), (5, 5));
/// # Ok::<(), flashcore::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct VarlenBatch {
    q: SeqOffsets,
    k: SeqOffsets,
}

/// Offsets of `lengths` packed one after another.
fn offsets_of(lengths: &[usize], operand: Operand) -> Result<Vec<i32>> {
    let mut offsets = Vec::with_capacity(lengths.len() + 1);
    let mut total = 0usize;
    offsets.push(0);
    for &n in lengths {
        total = total.saturating_add(n);
        let end = i32::try_from(total).map_err(|_| Error::IndexOverflow {
            backend: "any",
            what: match operand {
                Operand::CuSeqlensK => "total key tokens",
                _ => "total query tokens",
            },
            value: total as u64,
            limit: i32::MAX as u64,
        })?;
        offsets.push(end);
    }
    Ok(offsets)
}

impl VarlenBatch {
    /// A batch of sequences with these query and key lengths (host offsets; see
    /// `VarlenBatch::to_device`). The two slices must have the same length, one entry per
    /// sequence (checked with the tensors, at the call).
    pub fn from_lengths(seqlens_q: &[usize], seqlens_k: &[usize]) -> Result<Self> {
        Ok(VarlenBatch {
            q: SeqOffsets::new(offsets_of(seqlens_q, Operand::CuSeqlensQ)?),
            k: SeqOffsets::new(offsets_of(seqlens_k, Operand::CuSeqlensK)?),
        })
    }

    /// A batch from cumulative offsets (`batch + 1` entries each, FlashAttention's
    /// `cu_seqlens_q` / `cu_seqlens_k`). Their rules are checked with the tensors, at the call.
    pub fn from_offsets(cu_seqlens_q: Vec<i32>, cu_seqlens_k: Vec<i32>) -> Result<Self> {
        for (offsets, operand) in [
            (&cu_seqlens_q, Operand::CuSeqlensQ),
            (&cu_seqlens_k, Operand::CuSeqlensK),
        ] {
            if offsets.is_empty() {
                return Err(Error::ShapeMismatch {
                    operand,
                    dim: "entries (sequences + 1)",
                    got: 0,
                    expected: 1,
                });
            }
        }
        Ok(VarlenBatch {
            q: SeqOffsets::new(cu_seqlens_q),
            k: SeqOffsets::new(cu_seqlens_k),
        })
    }

    /// The same batch with its offsets also on the device of `stream` (uploaded there; the
    /// host copies stay and are checked before each launch).
    #[cfg(feature = "cuda")]
    pub fn to_device(&self, stream: &crate::Stream) -> Result<Self> {
        let upload = |o: &SeqOffsets| -> Result<SeqOffsets> {
            let mut buffer = crate::cuda::DeviceBuffer::alloc(stream, o.host.len())?;
            buffer
                .raw_mut()
                .copy_from_host(bytemuck::cast_slice(&o.host))?;
            Ok(SeqOffsets {
                host: o.host.clone(),
                max_len: o.max_len,
                device: Some(std::sync::Arc::new(buffer)),
            })
        };
        Ok(VarlenBatch {
            q: upload(&self.q)?,
            k: upload(&self.k)?,
        })
    }

    /// Number of sequences (by the query offsets).
    pub fn batch(&self) -> usize {
        self.q.host.len().saturating_sub(1)
    }

    /// The query offsets (host copy).
    pub fn cu_seqlens_q(&self) -> &[i32] {
        &self.q.host
    }

    /// The key offsets (host copy).
    pub fn cu_seqlens_k(&self) -> &[i32] {
        &self.k.host
    }

    /// The longest sequence's query count.
    pub fn max_seqlen_q(&self) -> usize {
        self.q.max_len
    }

    /// The longest sequence's key count.
    pub fn max_seqlen_k(&self) -> usize {
        self.k.max_len
    }

    /// Where the kernels read the offsets: the host until `VarlenBatch::to_device`.
    pub fn location(&self) -> Location {
        self.q.location()
    }

    /// The host copies of the query and key offsets.
    pub(crate) fn host(&self) -> (&[i32], &[i32]) {
        (&self.q.host, &self.k.host)
    }

    /// The device copies, if any.
    #[cfg(feature = "cuda")]
    pub(crate) fn device(
        &self,
    ) -> Option<(
        &crate::cuda::DeviceBuffer<i32>,
        &crate::cuda::DeviceBuffer<i32>,
    )> {
        Some((self.q.device.as_deref()?, self.k.device.as_deref()?))
    }

    pub(crate) fn ffi(&self) -> (OffsetsFfi, OffsetsFfi) {
        (self.q.ffi(), self.k.ffi())
    }
}

/// Attention over a variable-length batch, output allocated where the inputs live.
///
/// Q is `[1, total_q, heads_q, head_dim]` and K, V are `[1, total_k, heads_kv, head_dim]`: the
/// sequences of `batch` packed along the token axis (any strides with a contiguous head dim).
/// Each sequence is attended on its own, with the options' causal alignment applied to its own
/// lengths. The output is `[1, total_q, heads_q, head_dim]` (BSHD) and the logsumexp, with
/// [`AttentionOptions::return_lse`], `[1, heads_q, total_q]` (per token, BHSD, head dim 1).
///
/// ```
/// use flashcore::{attention, attention_varlen, AttentionOptions, Causal, Layout, Tensor, VarlenBatch};
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
/// let opts = AttentionOptions::default().causal(Causal::BottomRight);
/// let res = attention_varlen(&q, &k, &v, &batch, &opts)?;
/// // The second sequence alone, as a dense call, gives the same rows.
/// let part = |t: &Tensor<f16>, r: std::ops::Range<usize>| -> flashcore::Result<Tensor<f16>> {
///     let data = t.host_data().unwrap()[r.start * h * d..r.end * h * d].to_vec();
///     Tensor::from_vec(data, &[1, r.len(), h, d], Layout::Bshd)
/// };
/// let second = attention(&part(&q, 3..5)?, &part(&k, 4..6)?, &part(&v, 4..6)?, &opts)?;
/// assert_eq!(res.out.get(0, 4, 1, 5), second.out.get(0, 1, 1, 5));
/// # Ok::<(), flashcore::Error>(())
/// ```
pub fn attention_varlen<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    batch: &VarlenBatch,
    opts: &AttentionOptions,
) -> Result<crate::AttentionOutput<T>> {
    crate::attention::with_outputs(q, opts, |out, lse| {
        attention_varlen_into(q, k, v, batch, out, lse, opts)
    })
}

/// Like [`attention_varlen`], writing into the caller's `out` (`[1, total_q, heads_q,
/// head_dim]`, any strides with a contiguous head dim) and optionally `lse` (dense `[1, heads_q,
/// total_q]`, made with `Layout::Bhsd` and head dim 1). On a GPU the offsets must be on the
/// device (`VarlenBatch::to_device`) and the work runs on `out`'s stream.
///
/// Everything is validated before anything is launched, the offsets against the tensors
/// included. On a GPU, variable-length batches run on every kernel family: Auto picks by
/// [`crate::plan::auto_kernel`] for the longest sequence, as for a dense batch. Prefill: the
/// Hopper kernel ([`crate::plan::Kernel::CutlassSm90`], compute capability 9.0) where its query
/// blocks fill the SMs or its two products take at least 2^30 flops, else the WMMA kernel
/// ([`crate::plan::Kernel::Wmma`]). Decode (at most 32 query rows per sequence): the Hopper
/// kernel on compute capability 9.0, whose blocks walk a batch with more units than SMs longest
/// first (up to 256 sequences; past two units per SM a larger batch whose one-query heads do
/// not pack into rows runs on CUTLASS example 41); elsewhere WMMA below two units per SM, and
/// beyond example 41's decode row ([`crate::plan::Kernel::CutlassSm80`]) where the heads do not
/// pack, else WMMA (as measured: docs/SERVING.md). Example 41 applies no score modifier and
/// splits no keys.
pub fn attention_varlen_into<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    batch: &VarlenBatch,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    opts: &AttentionOptions,
) -> Result<Execution> {
    dispatch::attention_into([q, k, v], Batching::Varlen(batch), out, lse, opts)
}
