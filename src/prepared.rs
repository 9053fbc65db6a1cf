//! Prepared calls: the host work of an attention call (validation, the kernel and tile choice)
//! done once for operands of fixed shapes, strides and places, so that each later call only
//! checks that its operands are those and launches: one plan, run once per layer of a serving
//! step.

use std::marker::PhantomData;

use crate::dispatch::{route, Batching, Call, Execution, Route, ScoreTensors, CPU};
use crate::element::AttentionElement;
use crate::error::{Error, Operand, Result};
use crate::ffi::{DescFfi, RequestFfi};
use crate::options::AttentionOptions;
use crate::paged::PageTable;
use crate::tensor::Tensor;
use crate::validate::Problem;
use crate::varlen::VarlenBatch;

/// The batch composition a plan was made for, which every run reuses: none (dense), a
/// variable-length batch's offsets, or a paged cache's table (each holds its device copy, if
/// any, by reference count).
#[derive(Clone)]
enum Batch {
    Dense,
    Varlen(VarlenBatch),
    Paged(PageTable),
}

impl Batch {
    /// The plan's own copy of a call's batching (the batch or table by reference count).
    fn of(batching: Batching<'_>) -> Self {
        match batching {
            Batching::Dense => Batch::Dense,
            Batching::Varlen(b) => Batch::Varlen(b.clone()),
            Batching::Paged(p) => Batch::Paged(p.clone()),
        }
    }

    /// Borrowed, for a run.
    fn as_batching(&self) -> Batching<'_> {
        match self {
            Batch::Dense => Batching::Dense,
            Batch::Varlen(b) => Batching::Varlen(b),
            Batch::Paged(p) => Batching::Paged(p),
        }
    }
}

/// Where a plan runs.
#[derive(Clone)]
enum Target {
    Cpu(Problem),
    #[cfg(feature = "cuda")]
    Gpu(crate::ffi::cuda::Planned),
}

/// An attention call validated and planned once: [`AttentionPlan::run`] then launches it on
/// operands of the same shapes, strides, layouts and places (new data, new buffers) without
/// validating or planning again.
///
/// ```
/// use flashcore::{AttentionOptions, AttentionPlan, Causal, Layout, Tensor};
/// use half::f16;
/// let dims = [1, 16, 4, 64];
/// let x = Tensor::full(f16::from_f32(0.5), &dims, Layout::Bshd)?;
/// let mut out = Tensor::full(f16::ZERO, &dims, Layout::Bshd)?;
/// let opts = AttentionOptions::default().causal(Causal::BottomRight);
/// let plan = AttentionPlan::new(&x, &x, &x, &out, None, &opts)?;
/// for _layer in 0..3 {
///     plan.run(&x, &x, &x, &mut out, None)?; // only checks the operands, then runs
/// }
/// // Another shape is refused, naming the operand.
/// let longer = Tensor::full(f16::ZERO, &[1, 17, 4, 64], Layout::Bshd)?;
/// assert!(plan.run(&longer, &x, &x, &mut out, None).is_err());
/// # Ok::<(), flashcore::Error>(())
/// ```
#[derive(Clone)]
pub struct AttentionPlan<T: AttentionElement> {
    request: RequestFfi,
    batch: Batch,
    /// The options the plan was made with: every run reads their ALiBi slopes and bias.
    opts: AttentionOptions,
    target: Target,
    execution: Execution,
    _element: PhantomData<fn() -> T>,
}

impl<T: AttentionElement> std::fmt::Debug for AttentionPlan<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttentionPlan")
            .field("execution", &self.execution)
            .finish_non_exhaustive()
    }
}

impl<T: AttentionElement> AttentionPlan<T> {
    /// Validates the call [`attention_into`](crate::attention_into) would make with these
    /// operands and options, and plans it (backend, kernel, tile) for where they live. Fails
    /// with the same errors as `attention_into`; launches nothing.
    pub fn new(
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        out: &Tensor<T>,
        lse: Option<&Tensor<f32>>,
        opts: &AttentionOptions,
    ) -> Result<Self> {
        Self::plan(Batching::Dense, [q, k, v, out], lse, opts)
    }

    /// [`AttentionPlan::new`] for a variable-length batch: validates and plans what
    /// [`attention_varlen_into`](crate::attention_varlen_into) would run, once per batch
    /// composition. The plan keeps `batch` (its device copy by reference); every run uses it,
    /// with operands of the planned shapes (each layer's Q, K, V and output).
    pub fn new_varlen(
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        batch: &VarlenBatch,
        out: &Tensor<T>,
        lse: Option<&Tensor<f32>>,
        opts: &AttentionOptions,
    ) -> Result<Self> {
        Self::plan(Batching::Varlen(batch), [q, k, v, out], lse, opts)
    }

    /// [`AttentionPlan::new`] for a paged KV cache: validates `pages` against the caches and
    /// plans what [`attention_paged_into`](crate::attention_paged_into) would run, once per
    /// batch composition. The plan keeps the table (its device copy by reference); every run
    /// reads through it, with operands of the planned shapes (each layer's queries, K and V
    /// caches and output).
    ///
    /// ```
    /// use flashcore::{AttentionOptions, AttentionPlan, Causal, Layout, PageTable, Tensor};
    /// use half::f16;
    /// let pages = PageTable::new(16, vec![vec![1, 0]], vec![20])?;
    /// let cache = Tensor::full(f16::from_f32(0.5), &[2, 16, 2, 8], Layout::Bshd)?;
    /// let q = Tensor::full(f16::from_f32(0.5), &[1, 1, 2, 8], Layout::Bshd)?;
    /// let mut out = Tensor::full(f16::ZERO, &[1, 1, 2, 8], Layout::Bshd)?;
    /// let opts = AttentionOptions::default().causal(Causal::BottomRight);
    /// let plan = AttentionPlan::new_paged(&q, &cache, &cache, &pages, &out, None, &opts)?;
    /// for _layer in 0..3 {
    ///     plan.run(&q, &cache, &cache, &mut out, None)?; // the table is checked once, above
    /// }
    /// # Ok::<(), flashcore::Error>(())
    /// ```
    pub fn new_paged(
        q: &Tensor<T>,
        k_cache: &Tensor<T>,
        v_cache: &Tensor<T>,
        pages: &PageTable,
        out: &Tensor<T>,
        lse: Option<&Tensor<f32>>,
        opts: &AttentionOptions,
    ) -> Result<Self> {
        let operands = [q, k_cache, v_cache, out];
        Self::plan(Batching::Paged(pages), operands, lse, opts)
    }

    /// Validates the call (with the batch's host arrays) and plans it where the operands live.
    fn plan(
        batching: Batching<'_>,
        [q, k, v, out]: [&Tensor<T>; 4],
        lse: Option<&Tensor<f32>>,
        opts: &AttentionOptions,
    ) -> Result<Self> {
        let operands = [q, k, v, out];
        let request = crate::dispatch::request(operands, lse, batching, opts)?;
        let locations = crate::dispatch::locations(operands, lse, batching, ScoreTensors::of(opts));
        let route = route(&request, batching.hosts(), opts.backend, locations)?;
        let (batch, opts) = (Batch::of(batching), opts.clone());
        match route {
            Route::Gpu => Self::plan_gpu(request, batch, opts, out),
            Route::Cpu(problem) => Ok(AttentionPlan {
                request,
                batch,
                opts,
                target: Target::Cpu(problem),
                execution: CPU,
                _element: PhantomData,
            }),
        }
    }

    #[cfg(feature = "cuda")]
    fn plan_gpu(
        request: RequestFfi,
        batch: Batch,
        opts: AttentionOptions,
        out: &Tensor<T>,
    ) -> Result<Self> {
        let stream = out.stream().ok_or(Error::CudaNotBuilt)?;
        let (host_q, host_k) = batch.as_batching().hosts();
        let (execution, planned) = crate::ffi::cuda::Planned::new(
            &request,
            host_q,
            host_k,
            stream.device(),
            stream.ordinal(),
        )?;
        Ok(AttentionPlan {
            request,
            batch,
            opts,
            target: Target::Gpu(planned),
            execution,
            _element: PhantomData,
        })
    }

    #[cfg(not(feature = "cuda"))]
    fn plan_gpu(_: RequestFfi, _: Batch, _: AttentionOptions, _: &Tensor<T>) -> Result<Self> {
        Err(Error::CudaNotBuilt)
    }

    /// What every run of this plan runs: the backend and tile-table row.
    pub fn execution(&self) -> Execution {
        self.execution
    }

    /// Runs the planned call on these operands, which must have the shapes, strides and
    /// locations the plan was made with (their data and buffers may differ; a new device
    /// address must be 16-byte aligned, and the output may not overlap an input). Otherwise
    /// returns [`Error::PlanMismatch`] (or [`Error::MisalignedPointer`],
    /// [`Error::OverlappingOutput`]) and launches nothing. On a GPU the work runs on `out`'s
    /// stream, ordered as [`attention_into`](crate::attention_into) orders it.
    pub fn run(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        out: &mut Tensor<T>,
        lse: Option<&mut Tensor<f32>>,
    ) -> Result<Execution> {
        let call = self.call(q, k, v, out, lse)?;
        match &self.target {
            Target::Cpu(problem) => {
                crate::dispatch::run_cpu(problem, call)?;
            }
            #[cfg(feature = "cuda")]
            Target::Gpu(planned) => {
                // C++ checks this run's addresses (alignment, overlapping outputs) before it
                // launches.
                let entry = crate::cuda::launch::Entry::Planned(planned, self.execution);
                crate::cuda::launch::run(entry, &self.request, call)?;
            }
        }
        Ok(self.execution)
    }

    /// [`AttentionPlan::run`] recorded into a CUDA graph ([`crate::Capture::run`]).
    #[cfg(feature = "cuda")]
    pub(crate) fn record(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        out: &mut Tensor<T>,
        lse: Option<&mut Tensor<f32>>,
        recording: crate::cuda::launch::Recording<'_>,
    ) -> Result<Execution> {
        let call = self.call(q, k, v, out, lse)?;
        let Target::Gpu(planned) = &self.target else {
            return Err(Error::BackendUnavailable {
                backend: "cpu",
                reason: "a plan for the CPU cannot be recorded into a CUDA graph".into(),
            });
        };
        let entry = crate::cuda::launch::Entry::Captured(planned, self.execution, recording);
        crate::cuda::launch::run(entry, &self.request, call)?;
        Ok(self.execution)
    }

    /// A run's call, once its operands are checked against the plan.
    fn call<'a>(
        &'a self,
        q: &'a Tensor<T>,
        k: &'a Tensor<T>,
        v: &'a Tensor<T>,
        out: &'a mut Tensor<T>,
        lse: Option<&'a mut Tensor<f32>>,
    ) -> Result<Call<'a, T>> {
        let r = &self.request;
        same(Operand::Q, &r.q, q)?;
        same(Operand::K, &r.k, k)?;
        same(Operand::V, &r.v, v)?;
        same(Operand::Out, &r.out, out)?;
        match lse.as_deref() {
            Some(l) if r.has_lse => same(Operand::Lse, &r.lse, l)?,
            None if !r.has_lse => {}
            _ => return Err(Error::PlanMismatch(Operand::Lse)),
        }
        Ok(Call {
            q,
            k,
            v,
            out,
            lse,
            batch: self.batch.as_batching(),
            scores: ScoreTensors::of(&self.opts),
        })
    }
}

/// `t` has the dims, strides and location the plan validated in `planned`.
fn same<U: crate::Element>(op: Operand, planned: &DescFfi, t: &Tensor<U>) -> Result<()> {
    if planned.describes(t.shape(), t.strides(), t.location()) {
        Ok(())
    } else {
        Err(Error::PlanMismatch(op))
    }
}
