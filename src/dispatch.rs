//! Dispatch: resolve the backend for a validated problem and run it.

use crate::element::AttentionElement;
use crate::error::{Error, Result};
use crate::options::{AttentionOptions, Backend, BackendKind};
use crate::plan::{Kernel, TileRow};
use crate::tensor::{Location, Tensor};
use crate::validate::Problem;

/// What ran: the backend, and for GPU backends the tile-table row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Execution {
    /// The backend that ran.
    pub backend: BackendKind,
    /// The tile-table row used (GPU backends).
    pub tile: Option<TileRow>,
}

/// The backend that serves `requested` for `problem` (whose operands are all at one location).
pub(crate) fn resolve(requested: Backend, problem: &Problem) -> Result<BackendKind> {
    let gpu = |kernel: Kernel| match problem.location {
        Location::Cuda(_) => Ok(BackendKind::from(kernel)),
        Location::Host => Err(Error::BackendUnavailable {
            backend: kernel.name(),
            reason: "operands are on the host; copy them with Tensor::to_device first".into(),
        }),
    };
    match (requested, problem.location) {
        (Backend::Auto | Backend::Cpu, Location::Host) => Ok(BackendKind::Cpu),
        (Backend::Cpu, Location::Cuda(_)) => Err(Error::BackendUnavailable {
            backend: "cpu",
            reason: "operands are on a GPU; copy them with Tensor::to_host first".into(),
        }),
        (Backend::Auto, Location::Cuda(_)) => gpu(crate::plan::auto_kernel()),
        (Backend::CutlassSm80, _) => gpu(Kernel::CutlassSm80),
        (Backend::Wmma, _) => gpu(Kernel::Wmma),
    }
}

/// Runs `problem` (already validated) on the resolved backend.
pub(crate) fn run<T: AttentionElement>(
    problem: &Problem,
    opts: &AttentionOptions,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<Execution> {
    let backend = resolve(opts.backend, problem)?;
    match backend.kernel() {
        None => {
            if !problem.is_empty() {
                crate::cpu::attention(problem, q, k, v, out, lse);
            }
            Ok(Execution {
                backend,
                tile: None,
            })
        }
        Some(kernel) => run_gpu(kernel, problem, opts, q, k, v, out, lse),
    }
}

/// `kernel`'s tile-table row for `problem` on the device of `out`'s stream.
#[cfg(feature = "cuda")]
fn plan_gpu<T: AttentionElement>(
    kernel: Kernel,
    problem: &Problem,
    opts: &AttentionOptions,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &Tensor<T>,
) -> Result<&'static TileRow> {
    let device = match out.stream() {
        Some(s) => s.device().clone(),
        None => return Err(Error::CudaNotBuilt),
    };
    crate::plan::check_index_limits(
        kernel,
        problem,
        &[q.strides(), k.strides(), v.strides(), out.strides()],
    )?;
    crate::plan::choose_row(
        kernel,
        problem.head_dim,
        problem.query_rows(),
        device.compute_capability(),
        device.shared_memory_per_block_optin(),
        opts.force_arch_class,
    )
}

#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
fn run_gpu<T: AttentionElement>(
    kernel: Kernel,
    problem: &Problem,
    opts: &AttentionOptions,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<Execution> {
    let row = plan_gpu(kernel, problem, opts, q, k, v, out)?;
    if !problem.is_empty() {
        crate::cuda::launch::run(kernel, problem, row, q, k, v, out, lse)?;
    }
    Ok(Execution {
        backend: kernel.into(),
        tile: Some(*row),
    })
}

/// Bench hook: host nanoseconds per launch when C++ calls the CUTLASS launcher directly
/// `iters` times, for the same validated problem that [`crate::attention_into`] would run.
/// The Rust-vs-C++ host-overhead comparison of `examples/bench.rs` uses it.
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub fn cpp_direct_launch_ns<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    opts: &AttentionOptions,
    iters: u32,
) -> Result<f64> {
    let problem = crate::validate::validate(q, k, v, out, None, opts)?;
    let kernel = resolve(opts.backend, &problem)?
        .kernel()
        .ok_or(Error::BackendUnavailable {
            backend: "cpu",
            reason: "the C++ overhead probe runs GPU kernels only".into(),
        })?;
    let row = plan_gpu(kernel, &problem, opts, q, k, v, out)?;
    let iters = i32::try_from(iters).unwrap_or(i32::MAX);
    crate::cuda::launch::cpp_launch_ns(kernel, &problem, row, q, k, v, out, iters)
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::too_many_arguments)]
fn run_gpu<T: AttentionElement>(
    _: Kernel,
    _: &Problem,
    _: &AttentionOptions,
    _: &Tensor<T>,
    _: &Tensor<T>,
    _: &Tensor<T>,
    _: &mut Tensor<T>,
    _: Option<&mut Tensor<f32>>,
) -> Result<Execution> {
    Err(Error::CudaNotBuilt)
}
