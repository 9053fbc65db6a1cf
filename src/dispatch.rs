//! Dispatch: send a call to the CPU reference, or to the C++ library, which validates, plans
//! (resolves `Auto`, picks the tile) and launches GPU calls in one crossing.

use crate::alibi::AlibiSlopes;
use crate::bias::Bias;
use crate::element::AttentionElement;
use crate::error::{Error, Result};
use crate::ffi::RequestFfi;
use crate::options::{AttentionOptions, Backend, BackendKind};
use crate::paged::PageTable;
use crate::plan::{BackwardTileRow, TileRow};
use crate::tensor::{Location, Tensor};
use crate::validate::{Hosts, Problem, DENSE};
use crate::varlen::VarlenBatch;

/// What ran: the backend, for GPU backends the tile-table row, and the key splits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Execution {
    /// The backend that ran.
    pub backend: BackendKind,
    /// The tile-table row used (GPU forward calls).
    pub tile: Option<TileRow>,
    /// Into how many blocks per (batch, head) the keys were split and combined (split-KV
    /// decoding, [`crate::plan::kv_splits`]); 1 when not split.
    pub splits: usize,
    /// The row of [`crate::plan::backward_tile_table`] used (GPU backward calls).
    pub backward_tile: Option<BackwardTileRow>,
}

/// Whether `requested` runs on the GPU for operands at `location` (q's).
fn on_gpu(requested: Backend, location: Location) -> bool {
    matches!(location, Location::Cuda(_)) && requested != Backend::Cpu
}

/// The error for a backend that cannot run where the (validated) operands are.
pub(crate) fn misplaced(requested: Backend) -> Error {
    let backend = match requested {
        Backend::Cpu => {
            return Error::BackendUnavailable {
                backend: "cpu",
                reason: "operands are on a GPU; copy them with Tensor::to_host first".into(),
            }
        }
        Backend::Kernel(kernel) => kernel.name(),
        Backend::Auto => "auto",
    };
    Error::BackendUnavailable {
        backend,
        reason: "operands are on the host; copy them with Tensor::to_device first".into(),
    }
}

/// Where a call goes: the GPU (which validates and plans in C++), or the CPU reference with the
/// validated problem.
pub(crate) enum Route {
    Gpu,
    Cpu(Problem),
}

/// The route of the call `request` describes, for operands at these `locations` (q's first).
/// Host operands, the CPU asked for, or operands in different places are validated here:
/// validation errors come first (DeviceMismatch for the last), then placement.
pub(crate) fn route(
    request: &RequestFfi,
    hosts: Hosts<'_>,
    backend: Backend,
    locations: impl IntoIterator<Item = Location>,
) -> Result<Route> {
    route_with(backend, locations, |location| {
        crate::validate::validate(request, hosts, location)
    })
}

/// [`route`] for a call that `validate` checks (given q's location) wherever it is not sent
/// whole to the GPU, whose C++ entry validates it once there: the forward call's validation, or
/// the backward call's (`crate::validate::validate_backward`).
pub(crate) fn route_with(
    backend: Backend,
    locations: impl IntoIterator<Item = Location>,
    validate: impl FnOnce(Location) -> Result<Problem>,
) -> Result<Route> {
    let mut locations = locations.into_iter();
    let location = locations.next().unwrap_or(Location::Host);
    let together = locations.all(|l| l == location);
    if together && on_gpu(backend, location) {
        return Ok(Route::Gpu);
    }
    let problem = validate(location)?;
    match (backend, location) {
        (Backend::Auto | Backend::Cpu, Location::Host) => Ok(Route::Cpu(problem)),
        (requested, _) => Err(misplaced(requested)),
    }
}

/// The C++ library's description of the call that these operands (q, k, v, out) make with
/// `batch` and `opts`.
pub(crate) fn request<T: AttentionElement>(
    [q, k, v, out]: [&Tensor<T>; 4],
    lse: Option<&Tensor<f32>>,
    batch: Batching<'_>,
    opts: &AttentionOptions,
) -> Result<RequestFfi> {
    let mut request = crate::validate::request(q, k, v, out, lse, opts)?;
    batch.describe(&mut request);
    Ok(request)
}

/// The locations of a call's operands (q, k, v, out) and logsumexp, q's first, then those of a
/// variable-length batch's offsets or a page table, then the score modifiers' tensors.
pub(crate) fn locations<'a, T: AttentionElement>(
    operands: [&'a Tensor<T>; 4],
    lse: Option<&'a Tensor<f32>>,
    batch: Batching<'a>,
    scores: ScoreTensors<'a>,
) -> impl Iterator<Item = Location> + 'a {
    operands
        .into_iter()
        .map(Tensor::location)
        .chain(lse.map(Tensor::location))
        .chain(batch.location())
        .chain(scores.locations())
}

/// A call's batch composition: dense, a variable-length batch's offsets, or a paged KV cache's
/// table.
#[derive(Clone, Copy)]
pub(crate) enum Batching<'a> {
    Dense,
    Varlen(&'a VarlenBatch),
    Paged(&'a PageTable),
}

impl<'a> Batching<'a> {
    /// Where the offsets or the page table live (none for a dense call).
    pub fn location(self) -> Option<Location> {
        match self {
            Batching::Dense => None,
            Batching::Varlen(b) => Some(b.location()),
            Batching::Paged(p) => Some(p.location()),
        }
    }

    /// The host arrays validation checks: a variable-length batch's offsets, or a page table's
    /// block table and key counts (empty for a dense call).
    pub fn hosts(self) -> Hosts<'a> {
        match self {
            Batching::Dense => DENSE,
            Batching::Varlen(b) => b.host(),
            Batching::Paged(p) => p.host(),
        }
    }

    /// Adds the offsets or the page table to the C++ library's description of a call.
    fn describe(self, request: &mut RequestFfi) {
        match self {
            Batching::Dense => {}
            Batching::Varlen(b) => {
                request.varlen = true;
                (request.cu_q, request.cu_k) = b.ffi();
            }
            Batching::Paged(p) => {
                request.paged = true;
                request.pages = p.ffi();
            }
        }
    }
}

/// The tensors of one attention call and its batching.
pub(crate) struct Call<'a, T: AttentionElement> {
    pub q: &'a Tensor<T>,
    pub k: &'a Tensor<T>,
    pub v: &'a Tensor<T>,
    pub out: &'a mut Tensor<T>,
    pub lse: Option<&'a mut Tensor<f32>>,
    pub batch: Batching<'a>,
    pub scores: ScoreTensors<'a>,
}

/// The tensors of a call's score modifiers, from its options: ALiBi slopes
/// ([`crate::AttentionOptions::alibi`]) and an additive bias ([`crate::AttentionOptions::bias`]).
#[derive(Clone, Copy)]
pub(crate) struct ScoreTensors<'a> {
    pub alibi: Option<&'a AlibiSlopes>,
    pub bias: Option<&'a Bias>,
}

impl<'a> ScoreTensors<'a> {
    /// Those of `opts`.
    pub fn of(opts: &'a AttentionOptions) -> Self {
        ScoreTensors {
            alibi: opts.alibi.as_ref(),
            bias: opts.bias.as_ref(),
        }
    }

    /// Their locations (ALiBi slopes first).
    pub fn locations(self) -> impl Iterator<Item = Location> + 'a {
        let alibi = self.alibi.map(AlibiSlopes::location);
        alibi.into_iter().chain(self.bias.map(Bias::location))
    }
}

impl<'a, T: AttentionElement> Call<'a, T> {
    /// The call these operands make with `batch` and `opts`, and the C++ library's description
    /// of it.
    pub fn new(
        [q, k, v]: [&'a Tensor<T>; 3],
        batch: Batching<'a>,
        out: &'a mut Tensor<T>,
        lse: Option<&'a mut Tensor<f32>>,
        opts: &'a AttentionOptions,
    ) -> Result<(RequestFfi, Self)> {
        let request = request([q, k, v, out], lse.as_deref(), batch, opts)?;
        let scores = ScoreTensors::of(opts);
        let call = Call {
            q,
            k,
            v,
            out,
            lse,
            batch,
            scores,
        };
        Ok((request, call))
    }

    /// The operands' locations ([`locations`]).
    fn locations(&self) -> impl Iterator<Item = Location> + '_ {
        let operands = [self.q, self.k, self.v, &*self.out];
        locations(operands, self.lse.as_deref(), self.batch, self.scores)
    }
}

/// Validates, plans and runs attention on these operands (the public `*_into` calls).
pub(crate) fn attention_into<T: AttentionElement>(
    qkv: [&Tensor<T>; 3],
    batch: Batching<'_>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    opts: &AttentionOptions,
) -> Result<Execution> {
    let (request, call) = Call::new(qkv, batch, out, lse, opts)?;
    run(&request, opts, call)
}

/// What the CPU reference runs.
pub(crate) const CPU: Execution = Execution {
    backend: BackendKind::Cpu,
    tile: None,
    splits: 1,
    backward_tile: None,
};

/// Runs the call `request` describes on the backend its options and location call for.
pub(crate) fn run<T: AttentionElement>(
    request: &RequestFfi,
    opts: &AttentionOptions,
    call: Call<'_, T>,
) -> Result<Execution> {
    match route(request, call.batch.hosts(), opts.backend, call.locations())? {
        Route::Gpu => run_gpu(request, call),
        Route::Cpu(problem) => run_cpu(&problem, call),
    }
}

/// Runs a validated call on the CPU reference.
pub(crate) fn run_cpu<T: AttentionElement>(
    problem: &Problem,
    call: Call<'_, T>,
) -> Result<Execution> {
    if !problem.is_empty() {
        let Call {
            q,
            k,
            v,
            out,
            lse,
            batch,
            scores,
        } = call;
        let problem = &Problem {
            alibi: scores.alibi.cloned(),
            bias: scores.bias.cloned(),
            ..problem.clone()
        };
        match batch {
            Batching::Varlen(b) => crate::cpu::attention_varlen(problem, b, q, k, v, out, lse)?,
            Batching::Paged(p) => crate::cpu::attention_paged(problem, p, q, k, v, out, lse)?,
            Batching::Dense => crate::cpu::attention(problem, q, k, v, out, lse)?,
        }
    }
    Ok(CPU)
}

/// Validates, plans and launches on the GPU.
#[cfg(feature = "cuda")]
fn run_gpu<T: AttentionElement>(request: &RequestFfi, call: Call<'_, T>) -> Result<Execution> {
    crate::cuda::launch::run(crate::cuda::launch::Entry::Rust, request, call)
}

#[cfg(not(feature = "cuda"))]
fn run_gpu<T: AttentionElement>(_: &RequestFfi, _: Call<'_, T>) -> Result<Execution> {
    Err(Error::CudaNotBuilt)
}

/// Host nanoseconds per call that C++ spends from its own loop on the call that
/// [`crate::attention_into`] would run (bench hook: the Rust-vs-C++ host-cost rows of
/// `examples/bench.rs`).
#[cfg(feature = "cuda")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct CppHostNs {
    /// The launcher alone, validated and planned once before the loop.
    pub launch: f64,
    /// The public C++ call, `flashcore::attention_forward` (validate, plan, launch).
    pub call: f64,
    /// A run of the public C++ plan, `flashcore::AttentionPlan::run` (this run's addresses
    /// checked, then the launcher), planned once before the loop.
    pub planned: f64,
}

/// Bench hook: [`CppHostNs`] over `iters` calls each, for `attention_into(q, k, v, out, None,
/// opts)`; all operands on `out`'s stream.
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn cpp_host_ns<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    opts: &AttentionOptions,
    iters: u32,
) -> Result<CppHostNs> {
    use crate::ffi::cuda::HostProbe;
    let request = crate::validate::request(q, k, v, out, None, opts)?;
    if !on_gpu(opts.backend, q.location()) {
        crate::validate::validate(&request, DENSE, q.location())?;
        return Err(misplaced(opts.backend));
    }
    let iters = i32::try_from(iters).unwrap_or(i32::MAX);
    let mut probe = |p| crate::cuda::launch::cpp_launch_ns(&request, q, k, v, out, iters, p);
    Ok(CppHostNs {
        launch: probe(HostProbe::Launch)?,
        call: probe(HostProbe::PublicCall)?,
        planned: probe(HostProbe::PlannedRun)?,
    })
}
