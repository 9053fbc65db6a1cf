//! # flashcore
//!
//! Fast, safe fused attention — `softmax(scale * Q K^T + mask) V` — on NVIDIA GPUs, with a CPU
//! reference backend that runs everywhere.
//!
//! * **GPU** (compute capability 8.0 and later; from 10.0, Blackwell, through the PTX that the
//!   driver compiles), three kernel families ([`plan::Kernel`]), each with
//!   flashcore's own tile table ([`plan::tile_table`]): on compute capability 9.0, CUTLASS
//!   example 88's Hopper mainloop (`wgmma`, TMA) under flashcore's own kernel layer, which
//!   [`Backend::Auto`] runs once a problem fills the GPU; flashcore's FlashAttention-2 kernel on
//!   `nvcuda::wmma` tensor cores, which it runs for the other problems but decode; and CUTLASS's
//!   fused multi-head attention (example 41, the Ampere/Ada kernel), which it runs for wide
//!   decode batches, dense or variable-length ([`plan::auto_kernel`]).
//! * **CPU**: an exact float64-accumulating reference, used on hosts without a GPU and by tests.
//! * **C++**: the same kernels, validation and tile tables are a standalone C++17 library
//!   (`cpp/include/flashcore/flashcore.h`), which this crate calls through its cxx bridge. Device
//!   memory and streams cross in both directions without copies: `Stream::from_raw`,
//!   `Tensor::from_raw_device`, and with feature `cudarc` `Stream::from_cudarc` and
//!   `Tensor::from_cudarc`.
//!
//! Cargo features: `cuda` (on by default) builds the GPU backends; `cudarc` adds the cudarc
//! interop; `sm90-bias` adds the Hopper kernel's bias schedules (six kernels, minutes of build
//! time; see [`Bias`]).
//!
//! The same call runs on either: put the tensors where you want the work done.
//!
//! ```
//! use flashcore::{attention, AttentionOptions, Layout, Tensor};
//! use half::f16;
//! let (b, s, h, d) = (1, 16, 2, 64);
//! let x: Vec<f16> = (0..b * s * h * d).map(|i| f16::from_f32(((i * 37) % 11) as f32 / 11.0)).collect();
//! let q = Tensor::from_vec(x.clone(), &[b, s, h, d], Layout::Bshd)?;
//! let k = Tensor::from_vec(x.clone(), &[b, s, h, d], Layout::Bshd)?;
//! let v = Tensor::from_vec(x, &[b, s, h, d], Layout::Bshd)?;
//! let res = attention(&q, &k, &v, &AttentionOptions::default())?;
//! println!("ran on {:?}", res.execution.backend);
//! # Ok::<(), flashcore::Error>(())
//! ```
//!
//! On a GPU (feature `cuda`, on by default):
//!
//! ```no_run
//! # #[cfg(not(feature = "cuda"))] fn main() {}
//! # #[cfg(feature = "cuda")]
//! # fn main() -> flashcore::Result<()> {
//! use flashcore::{attention, AttentionOptions, Causal, Device, Layout, Stream, Tensor};
//! use half::bf16;
//! let device = Device::open(0)?;
//! let stream = Stream::new(&device)?;
//! let host = Tensor::full(bf16::ONE, &[1, 8, 512, 64], Layout::Bhsd)?;
//! let q = host.to_device(&stream)?;
//! let res = attention(&q, &q, &q, &AttentionOptions::default().causal(Causal::BottomRight))?;
//! let out = res.out.to_host()?; // waits; asynchronous faults surface here as Error::Cuda
//! # Ok(()) }
//! ```
//!
//! Threads: every public type is `Send` and `Sync` but `Graph` (`Send` only), and none implements
//! either by hand (no `unsafe impl`): each gets them from its parts, and `tests/thread_safety.rs`
//! fails to compile if one stops. Why that is sound:
//! * [`Tensor`]: host storage is a `Vec`; device storage is an address and a length (plain
//!   integers) plus its `Stream`. Shared (`&Tensor`) use only reads; every call that writes takes
//!   `&mut Tensor`, so two threads can never write one output at once (the borrow checker refuses
//!   it, as the example below shows), and each GPU call orders itself after the streams of the
//!   tensors it reads.
//! * `Stream`, `Event`, `Device`: CUDA handles and properties held as integers; the CUDA
//!   runtime is thread-safe for every operation flashcore performs on them (each call selects its
//!   device first), and work from several threads on one stream runs in the order it was enqueued.
//!   A stream borrowed from cudarc keeps its owner alive through a `Send + Sync` box.
//! * [`AttentionPlan`], [`VarlenBatch`], [`PageTable`], [`Execution`], [`Error`] and the
//!   options: immutable values once built (a plan's run takes the output by `&mut`).
//! * `Capture` and `Graph` (CUDA graphs): a graph writes its outputs at each launch without
//!   borrowing them, but every tensor it uses lives on the graph's stream, which orders each
//!   launch with every other call on those tensors (each call orders itself on the streams of
//!   its tensors), so a launch's writes and other calls' reads and writes never overlap. The
//!   graph holds a share of each tensor's memory, freed after the graph. `Graph` is not `Sync`:
//!   CUDA requires one executable graph's launches to be serialised.
//!
//! ```compile_fail,E0499
//! use flashcore::{attention_into, AttentionOptions, Layout, Tensor};
//! use half::f16;
//! let x = Tensor::full(f16::ONE, &[1, 4, 1, 8], Layout::Bshd).unwrap();
//! let mut out = Tensor::full(f16::ZERO, &[1, 4, 1, 8], Layout::Bshd).unwrap();
//! let opts = AttentionOptions::default();
//! std::thread::scope(|s| {
//!     s.spawn(|| attention_into(&x, &x, &x, &mut out, None, &opts)); // one writer...
//!     s.spawn(|| attention_into(&x, &x, &x, &mut out, None, &opts)); // ...a second: refused
//! });
//! ```
//!
//! Errors: every bad input is its own [`Error`] variant, returned before anything is launched;
//! CUDA failures (including asynchronous kernel faults, at the next synchronisation) are
//! [`Error::Cuda`] with CUDA's error name and message. No panic crosses the API.
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod alibi;
mod attention;
mod backward;
mod bias;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod dispatch;
mod element;
mod error;
#[allow(unsafe_code)] // the FFI layer: the only module with `unsafe`
mod ffi;
mod merge;
mod options;
mod paged;
pub mod plan;
mod prepared;
mod tensor;
mod validate;
mod varlen;

pub use alibi::AlibiSlopes;
pub use attention::{attention, attention_into, AttentionOutput};
pub use backward::{
    attention_backward, attention_backward_into, attention_varlen_backward,
    attention_varlen_backward_into, Gradients, GradientsMut,
};
pub use bias::Bias;
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub use cuda::interop;
#[cfg(feature = "cuda")]
pub use cuda::{Capture, Device, Event, Graph, PoolUsage, Stream};
pub use dispatch::Execution;
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub use dispatch::{cpp_host_ns, CppHostNs};
pub use element::{AttentionElement, DType, Element};
pub use error::{Error, OffsetRule, Operand, PageRule, Result};
pub use merge::{merge_state_into, merge_states, AttentionState};
pub use options::{AttentionOptions, Backend, BackendKind, Causal};
pub use paged::{attention_paged, attention_paged_into, PageTable};
pub use prepared::AttentionPlan;
pub use tensor::{Layout, Location, Shape, Tensor};
pub use varlen::{attention_varlen, attention_varlen_into, VarlenBatch};

/// Largest supported head dim (the C++ library's `flashcore::kMaxHeadDim`).
pub fn max_head_dim() -> usize {
    ffi::limits().0
}

/// Head dims must be multiples of this (16-byte vector loads; `flashcore::kHeadDimMultiple`).
pub fn head_dim_multiple() -> usize {
    ffi::limits().1
}

/// The most states one [`merge_states`] call takes (`flashcore::kMaxMergeStates`); merge more
/// by merging merged states.
pub fn max_merge_states() -> usize {
    ffi::limits().3
}

/// Number of CUDA devices visible (0 without a driver, a GPU, or the `cuda` feature).
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        Device::count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}
