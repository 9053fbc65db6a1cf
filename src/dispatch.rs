//! Dispatch: send a validated problem to the CPU reference or to the C++ library, which plans
//! (resolves `Auto`, picks the tile) and launches on the GPU.

use crate::element::AttentionElement;
use crate::error::{Error, Result};
use crate::options::{AttentionOptions, Backend, BackendKind};
use crate::plan::TileRow;
use crate::tensor::{Location, Tensor};
use crate::validate::Validated;

/// What ran: the backend, and for GPU backends the tile-table row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Execution {
    /// The backend that ran.
    pub backend: BackendKind,
    /// The tile-table row used (GPU backends).
    pub tile: Option<TileRow>,
}

/// The error for a request that cannot run where the operands are; `None` when it can.
fn misplaced(requested: Backend, location: Location) -> Option<Error> {
    let reason = match (requested, location) {
        (Backend::Auto | Backend::Cpu, Location::Host) | (Backend::Auto, Location::Cuda(_)) => {
            return None
        }
        (Backend::CutlassSm80 | Backend::Wmma, Location::Cuda(_)) => return None,
        (Backend::Cpu, Location::Cuda(_)) => {
            "operands are on a GPU; copy them with Tensor::to_host first"
        }
        (Backend::CutlassSm80 | Backend::Wmma, Location::Host) => {
            "operands are on the host; copy them with Tensor::to_device first"
        }
    };
    let backend = match requested {
        Backend::Cpu => "cpu",
        Backend::CutlassSm80 => crate::plan::Kernel::CutlassSm80.name(),
        _ => crate::plan::Kernel::Wmma.name(),
    };
    Some(Error::BackendUnavailable {
        backend,
        reason: reason.into(),
    })
}

/// Runs a validated call on the backend its options and location call for.
pub(crate) fn run<T: AttentionElement>(
    checked: &Validated,
    opts: &AttentionOptions,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<Execution> {
    let problem = &checked.problem;
    if let Some(e) = misplaced(opts.backend, problem.location) {
        return Err(e);
    }
    match problem.location {
        Location::Host => {
            if !problem.is_empty() {
                crate::cpu::attention(problem, q, k, v, out, lse);
            }
            Ok(Execution {
                backend: BackendKind::Cpu,
                tile: None,
            })
        }
        Location::Cuda(_) => run_gpu(checked, q, k, v, out, lse),
    }
}

#[cfg(feature = "cuda")]
fn run_gpu<T: AttentionElement>(
    checked: &Validated,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<Execution> {
    let entry = crate::cuda::launch::Entry::Validated(checked);
    let (kernel, row) = crate::cuda::launch::run(entry, q, k, v, out, lse)?;
    Ok(Execution {
        backend: kernel.into(),
        tile: Some(*row),
    })
}

#[cfg(not(feature = "cuda"))]
fn run_gpu<T: AttentionElement>(
    _: &Validated,
    _: &Tensor<T>,
    _: &Tensor<T>,
    _: &Tensor<T>,
    _: &mut Tensor<T>,
    _: Option<&mut Tensor<f32>>,
) -> Result<Execution> {
    Err(Error::CudaNotBuilt)
}

/// Bench hook: host nanoseconds per launch when C++ plans once and then launches `iters` times
/// from its own loop, for the same call that [`crate::attention_into`] would run. The
/// Rust-vs-C++ host-overhead comparison of `examples/bench.rs` uses it.
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
    let checked = crate::validate::validate(q, k, v, out, None, opts)?;
    if let Some(e) = misplaced(opts.backend, checked.problem.location) {
        return Err(e);
    }
    let iters = i32::try_from(iters).unwrap_or(i32::MAX);
    crate::cuda::launch::cpp_launch_ns(&checked, q, k, v, out, iters)
}
