//! A paged KV cache: K and V in pages of `page_size` keys, each sequence's pages named by a block
//! table (vLLM's paged attention; FlashAttention's `block_table`).

use crate::dispatch::{self, Batching, Execution};
use crate::element::AttentionElement;
use crate::error::{Error, Operand, Result};
use crate::ffi::{view_location_code, PagesFfi};
use crate::options::AttentionOptions;
use crate::tensor::{Location, Tensor};

/// The pages of a batch of sequences in a paged KV cache: which pages hold each sequence's keys
/// (a row of the block table per sequence), and how many keys each has.
///
/// K and V are `[num_pages, page_size, heads_kv, head_dim]` tensors (any strides with a
/// contiguous head dim). Sequence `b`'s key `j` is slot `j % page_size` of page
/// `block_table[b][j / page_size]`. Queries and the output stay dense `[batch, seq_q, heads_q,
/// head_dim]`; with bottom-right causal alignment the queries are the sequence's last `seq_q`
/// tokens (chunked prefill: write the new tokens' keys and values into their pages first; decode:
/// `seq_q` is 1).
///
/// Checked with the tensors, before anything runs ([`Error::InvalidPageTable`]): the page size is
/// a power of two from 16 to 1024 and K's dim 1, each sequence's keys fit its row of the table,
/// and every page a sequence's keys reach is in the cache (entries past its keys are never read).
///
/// The CPU reference, the WMMA kernel and, on compute capability 9.0, the Hopper kernel read
/// paged caches. For device tensors Auto picks as for contiguous K/V: the Hopper kernel on an
/// H100/H200 for prefill and for decode batches of up to two (sequence, kv head) units per SM;
/// for wider decode batches the Hopper kernel where pages hold 64 keys or more, else WMMA; WMMA
/// on other GPUs (docs/PERFORMANCE.md has the measurements).
/// For a GPU call, copy the table to the device once with `PageTable::to_device` (feature
/// `cuda`) and reuse it.
///
/// ```
/// use flashcore::PageTable;
/// // Two sequences of 40 and 64 keys in pages of 16: rows of 4 pages each.
/// let pages = PageTable::new(16, vec![vec![3, 0, 9], vec![5, 2, 7, 8]], vec![40, 64])?;
/// assert_eq!((pages.batch(), pages.pages_per_seq(), pages.max_seqlen_k()), (2, 4, 64));
/// # Ok::<(), flashcore::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct PageTable {
    page_size: usize,
    pages_per_seq: usize,
    /// Row-major `batch x pages_per_seq`; short rows padded with -1 (never read).
    table: Vec<i32>,
    seqlens: Vec<i32>,
    max_seqlen_k: usize,
    /// The device copy of `table` and `seqlens` (`PageTable::to_device` (feature `cuda`)); immutable like the
    /// host copy, so the two never disagree.
    #[cfg(feature = "cuda")]
    device: Option<std::sync::Arc<DevicePages>>,
}

/// The block table and key counts on the device.
#[cfg(feature = "cuda")]
#[derive(Debug)]
struct DevicePages {
    table: crate::cuda::DeviceBuffer<i32>,
    seqlens: crate::cuda::DeviceBuffer<i32>,
}

impl PageTable {
    /// The pages of each sequence (`block_table[b]`: its page indices in key order; rows may be
    /// shorter than the longest) and each sequence's key count (`seqlens_k[b]`). One entry per
    /// sequence in both; the page indices and counts are checked against the cache at the call.
    pub fn new(page_size: usize, block_table: Vec<Vec<i32>>, seqlens_k: Vec<i32>) -> Result<Self> {
        if block_table.len() != seqlens_k.len() {
            return Err(Error::ShapeMismatch {
                operand: Operand::BlockTable,
                dim: "sequences",
                got: block_table.len(),
                expected: seqlens_k.len(),
            });
        }
        let pages_per_seq = block_table.iter().map(Vec::len).max().unwrap_or(0);
        let mut table =
            crate::tensor::host_vec(-1, block_table.len().saturating_mul(pages_per_seq))?;
        for (row, pages) in table.chunks_mut(pages_per_seq.max(1)).zip(&block_table) {
            row[..pages.len()].copy_from_slice(pages);
        }
        let max_seqlen_k = seqlens_k
            .iter()
            .map(|&n| usize::try_from(n).unwrap_or(0))
            .max()
            .unwrap_or(0);
        Ok(PageTable {
            page_size,
            pages_per_seq,
            table,
            seqlens: seqlens_k,
            max_seqlen_k,
            #[cfg(feature = "cuda")]
            device: None,
        })
    }

    /// The same table with a copy on the device of `stream` (enqueued there), for GPU calls;
    /// the host copy stays, and every call checks it before the launch. Build it once per batch
    /// composition and reuse it for every layer.
    #[cfg(feature = "cuda")]
    pub fn to_device(&self, stream: &crate::Stream) -> Result<Self> {
        let upload = |host: &[i32]| -> Result<crate::cuda::DeviceBuffer<i32>> {
            let mut buffer = crate::cuda::DeviceBuffer::alloc(stream, host.len())?;
            buffer
                .raw_mut()
                .copy_from_host(bytemuck::cast_slice(host))?;
            Ok(buffer)
        };
        let device = DevicePages {
            table: upload(&self.table)?,
            seqlens: upload(&self.seqlens)?,
        };
        Ok(PageTable {
            device: Some(std::sync::Arc::new(device)),
            ..self.clone()
        })
    }

    /// The device copies (block table, key counts), if any.
    #[cfg(feature = "cuda")]
    pub(crate) fn device(
        &self,
    ) -> Option<(
        &crate::cuda::DeviceBuffer<i32>,
        &crate::cuda::DeviceBuffer<i32>,
    )> {
        self.device.as_deref().map(|d| (&d.table, &d.seqlens))
    }

    /// Keys per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.seqlens.len()
    }

    /// Columns of the block table (the longest row given).
    pub fn pages_per_seq(&self) -> usize {
        self.pages_per_seq
    }

    /// The longest sequence's key count.
    pub fn max_seqlen_k(&self) -> usize {
        self.max_seqlen_k
    }

    /// The block table, row-major `batch x pages_per_seq` (short rows padded with -1).
    pub fn block_table(&self) -> &[i32] {
        &self.table
    }

    /// Each sequence's key count.
    pub fn seqlens_k(&self) -> &[i32] {
        &self.seqlens
    }

    /// Where the kernels read the table: the device after `PageTable::to_device` (feature `cuda`), else the
    /// host.
    pub fn location(&self) -> Location {
        #[cfg(feature = "cuda")]
        if let Some((table, _)) = self.device() {
            return Location::Cuda(table.stream().ordinal());
        }
        Location::Host
    }

    /// The addresses the kernels read (block table, key counts).
    fn addresses(&self) -> (u64, u64) {
        #[cfg(feature = "cuda")]
        if let Some((table, seqlens)) = self.device() {
            return (table.raw().ptr() as u64, seqlens.raw().ptr() as u64);
        }
        (self.table.as_ptr() as u64, self.seqlens.as_ptr() as u64)
    }

    /// The bridge's view.
    pub(crate) fn ffi(&self) -> PagesFfi {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let location = view_location_code(self.location());
        let (table, seqlens) = self.addresses();
        PagesFfi {
            table,
            seqlens,
            table_location: location,
            seqlens_location: location,
            count: count(self.batch()),
            page_size: count(self.page_size),
            pages_per_seq: count(self.pages_per_seq),
            max_seqlen_k: count(self.max_seqlen_k),
        }
    }

    /// The host copies validation checks: the block table and the key counts.
    pub(crate) fn host(&self) -> (&[i32], &[i32]) {
        (&self.table, &self.seqlens)
    }
}

/// Attention over a paged KV cache, output allocated where the queries live.
///
/// Q is `[batch, seq_q, heads_q, head_dim]`; K and V are the caches `[num_pages, page_size,
/// heads_kv, head_dim]`, read through `pages` ([`PageTable`]). The output is `[batch, seq_q,
/// heads_q, head_dim]` (BSHD) and the logsumexp, with [`AttentionOptions::return_lse`],
/// `[batch, heads_q, seq_q]`.
///
/// ```
/// use flashcore::{attention, attention_paged, AttentionOptions, Causal, Layout, PageTable, Tensor};
/// use half::f16;
/// let (h, d, ps) = (2, 8, 16);
/// let val = |n: usize, seed: usize| -> Vec<f16> {
///     (0..n).map(|i| f16::from_f32(((i * 7 + seed) % 11) as f32 * 0.1 - 0.5)).collect()
/// };
/// // One sequence of 20 keys in pages 1 and 0 of a two-page cache, one query.
/// let cache = |seed| Tensor::from_vec(val(2 * ps * h * d, seed), &[2, ps, h, d], Layout::Bshd);
/// let (k, v) = (cache(2)?, cache(3)?);
/// let pages = PageTable::new(ps, vec![vec![1, 0]], vec![20])?;
/// let q = Tensor::from_vec(val(h * d, 1), &[1, 1, h, d], Layout::Bshd)?;
/// let opts = AttentionOptions::default().causal(Causal::BottomRight);
/// let paged = attention_paged(&q, &k, &v, &pages, &opts)?;
/// // The same keys, gathered into a contiguous sequence, give the same output.
/// let gather = |t: &Tensor<f16>| -> flashcore::Result<Tensor<f16>> {
///     let data = t.host_data().unwrap();
///     let rows: Vec<f16> = (0..20)
///         .flat_map(|j| {
///             let at = ([1, 0][j / ps] * ps + j % ps) * h * d;
///             data[at..at + h * d].to_vec()
///         })
///         .collect();
///     Tensor::from_vec(rows, &[1, 20, h, d], Layout::Bshd)
/// };
/// let dense = attention(&q, &gather(&k)?, &gather(&v)?, &opts)?;
/// assert_eq!(paged.out.host_data(), dense.out.host_data());
/// # Ok::<(), flashcore::Error>(())
/// ```
pub fn attention_paged<T: AttentionElement>(
    q: &Tensor<T>,
    k_cache: &Tensor<T>,
    v_cache: &Tensor<T>,
    pages: &PageTable,
    opts: &AttentionOptions,
) -> Result<crate::AttentionOutput<T>> {
    crate::attention::with_outputs(q, opts, |out, lse| {
        attention_paged_into(q, k_cache, v_cache, pages, out, lse, opts)
    })
}

/// Like [`attention_paged`], writing into the caller's `out` (`[batch, seq_q, heads_q,
/// head_dim]`, any strides with a contiguous head dim) and optionally `lse` (dense `[batch,
/// heads_q, seq_q]`, made with `Layout::Bhsd` and head dim 1).
///
/// Everything is validated before anything runs, the pages against the cache included (through
/// the table's host copy, which a device table keeps). Device tensors need a device table
/// (`PageTable::to_device` (feature `cuda`); a host table gives [`Error::DeviceMismatch`] for
/// [`Operand::BlockTable`]). On a GPU a paged cache runs on the WMMA kernel
/// ([`crate::plan::Kernel::Wmma`]) or, on compute capability 9.0, the Hopper kernel
/// ([`crate::plan::Kernel::CutlassSm90`]). Auto follows the dense rule there
/// ([`crate::plan::auto_kernel`], by the longest sequence: the Hopper kernel for prefill but the
/// smallest, and for decode batches of up to two units per SM), and runs wider decode batches on
/// the Hopper kernel where pages hold 64 keys or more, else on WMMA (README, "Paged KV cache").
/// Forcing CUTLASS example 41 gives [`Error::BackendUnavailable`].
pub fn attention_paged_into<T: AttentionElement>(
    q: &Tensor<T>,
    k_cache: &Tensor<T>,
    v_cache: &Tensor<T>,
    pages: &PageTable,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    opts: &AttentionOptions,
) -> Result<Execution> {
    let batch = Batching::Paged(pages);
    dispatch::attention_into([q, k_cache, v_cache], batch, out, lse, opts)
}
