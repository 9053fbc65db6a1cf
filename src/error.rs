//! The error type: every failure of the public API is one of these variants; no panic crosses it.

use crate::tensor::Location;

/// Which tensor an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// The queries.
    Q,
    /// The keys.
    K,
    /// The values.
    V,
    /// The output.
    Out,
    /// The logsumexp output.
    Lse,
    /// The output of the state at this position of [`crate::merge_states`]' list.
    State(usize),
    /// The logsumexp of the state at this position of [`crate::merge_states`]' list.
    StateLse(usize),
    /// The query offsets of a variable-length batch ([`crate::VarlenBatch`]).
    CuSeqlensQ,
    /// The key offsets of a variable-length batch ([`crate::VarlenBatch`]).
    CuSeqlensK,
    /// The block table of a paged KV cache ([`crate::PageTable`]).
    BlockTable,
    /// The key lengths of a paged KV cache ([`crate::PageTable`]).
    SeqlensK,
    /// The slopes of ALiBi ([`crate::AlibiSlopes`]).
    AlibiSlopes,
    /// An additive bias ([`crate::Bias`]).
    Bias,
    /// The source of a copy (`Tensor::to_device`, `Tensor::copy_from`).
    Source,
    /// The gradient of the output given to [`crate::attention_backward`].
    DOut,
    /// The gradient of the queries ([`crate::attention_backward`]'s output).
    DQ,
    /// The gradient of the keys ([`crate::attention_backward`]'s output).
    DK,
    /// The gradient of the values ([`crate::attention_backward`]'s output).
    DV,
}

/// Which rule a paged KV cache breaks ([`Error::InvalidPageTable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageRule {
    /// The page size is not a power of two from 16 to 1024.
    PageSize,
    /// A sequence has more keys than its pages (or the maximum key count) hold; `sequence` is
    /// `None` when the maximum itself is beyond the pages.
    KeysBeyondPages,
    /// A page a sequence's keys reach is outside the cache.
    PageIndex,
    /// Variable-length queries with a paged cache (not supported yet).
    VarlenQueries,
}

impl std::fmt::Display for PageRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PageRule::PageSize => "the page size must be a power of two from 16 to 1024",
            PageRule::KeysBeyondPages => "no sequence may have more keys than its pages hold",
            PageRule::PageIndex => "every page a sequence uses must be in the cache",
            PageRule::VarlenQueries => "variable-length queries are not supported yet",
        })
    }
}

/// Which rule a variable-length batch's offsets break ([`Error::InvalidOffsets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetRule {
    /// The first offset is not 0.
    FirstNotZero,
    /// An offset is below the one before it.
    Decreasing,
    /// The last offset is not the token count of the packed tensor.
    LastNotTokenCount,
    /// A sequence is longer than the batch's maximum length (or the maximum is negative or above
    /// the token count: `index` is then `None`).
    LongerThanMax,
}

impl std::fmt::Display for OffsetRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OffsetRule::FirstNotZero => "the first offset must be 0",
            OffsetRule::Decreasing => "offsets must not decrease",
            OffsetRule::LastNotTokenCount => "the last offset must be the token count",
            OffsetRule::LongerThanMax => "no sequence may exceed the maximum length",
        })
    }
}

impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operand::Q => f.write_str("q"),
            Operand::K => f.write_str("k"),
            Operand::V => f.write_str("v"),
            Operand::Out => f.write_str("out"),
            Operand::Lse => f.write_str("lse"),
            Operand::State(i) => write!(f, "states[{i}].out"),
            Operand::StateLse(i) => write!(f, "states[{i}].lse"),
            Operand::CuSeqlensQ => f.write_str("cu_seqlens_q"),
            Operand::CuSeqlensK => f.write_str("cu_seqlens_k"),
            Operand::BlockTable => f.write_str("block_table"),
            Operand::SeqlensK => f.write_str("seqlens_k"),
            Operand::AlibiSlopes => f.write_str("alibi_slopes"),
            Operand::Bias => f.write_str("bias"),
            Operand::Source => f.write_str("source"),
            Operand::DOut => f.write_str("dout"),
            Operand::DQ => f.write_str("dq"),
            Operand::DK => f.write_str("dk"),
            Operand::DV => f.write_str("dv"),
        }
    }
}

/// Errors returned by flashcore.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shape slice had the wrong number of dimensions.
    #[error("expected a rank-{expected} shape, got rank {got}")]
    Rank {
        /// Dimensions expected.
        expected: usize,
        /// Dimensions given.
        got: usize,
    },
    /// Multiplying out a shape or stride overflowed `usize` (or the device's 64-bit offsets).
    #[error("element count overflows for shape {shape:?} with strides {strides:?}")]
    SizeOverflow {
        /// The shape (batch, seq, heads, head_dim).
        shape: [usize; 4],
        /// The strides in elements.
        strides: [usize; 4],
    },
    /// The storage given is smaller than the shape and strides address.
    #[error("storage holds {len} elements but the shape and strides address {needed}")]
    StorageTooSmall {
        /// Elements provided.
        len: usize,
        /// Elements addressed.
        needed: usize,
    },
    /// Two operands disagree on a dimension.
    #[error("{operand}: {dim} is {got}, expected {expected}")]
    ShapeMismatch {
        /// The operand whose dimension is wrong.
        operand: Operand,
        /// The dimension's name.
        dim: &'static str,
        /// What it is.
        got: usize,
        /// What it should be.
        expected: usize,
    },
    /// The number of key/value heads does not divide the number of query heads.
    #[error("{kv_heads} key/value heads do not divide {q_heads} query heads")]
    HeadsNotDivisible {
        /// Query heads.
        q_heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// The head dim is not a multiple of 8 in 8..=256.
    #[error("head dim {0} is not supported (must be a multiple of 8, from 8 to 256)")]
    UnsupportedHeadDim(usize),
    /// The innermost (head dim) stride is not 1.
    #[error("{operand}: the head-dim stride is {stride}; the last dimension must be contiguous")]
    NonContiguousHeadDim {
        /// The operand.
        operand: Operand,
        /// Its head-dim stride.
        stride: usize,
    },
    /// A stride is not a multiple of 8 elements (16 bytes), which the kernels load at once.
    #[error("{operand}: stride {stride} of dimension {dim} is not a multiple of 8 elements")]
    MisalignedStride {
        /// The operand.
        operand: Operand,
        /// The dimension's name.
        dim: &'static str,
        /// The stride in elements.
        stride: usize,
    },
    /// A device pointer is not aligned as the kernels load it (16 bytes for Q, K, V and
    /// outputs, 4 for logsumexps).
    #[error("{operand}: device pointer {ptr:#x} is not {align}-byte aligned")]
    MisalignedPointer {
        /// The operand.
        operand: Operand,
        /// The address.
        ptr: usize,
        /// The alignment it needs, in bytes.
        align: usize,
    },
    /// A logsumexp tensor is not a dense `[batch, heads, seq]` (BHSD, head dim 1) tensor.
    #[error("{operand} must be a dense [batch, heads, seq] f32 tensor (Layout::Bhsd, head dim 1)")]
    LseLayout {
        /// The logsumexp operand.
        operand: Operand,
    },
    /// Operands live on different devices (host vs GPU, or two GPUs).
    #[error("{operand} is on {got}, expected {expected}")]
    DeviceMismatch {
        /// The operand on the wrong device.
        operand: Operand,
        /// Where it is.
        got: Location,
        /// Where it must be: where q is (attention), where out is (merging states).
        expected: Location,
    },
    /// Query rows would see no key (`seq_k == 0`, or bottom-right causal with `seq_q > seq_k`):
    /// softmax over an empty set is undefined, so flashcore refuses rather than emit NaN.
    #[error("{rows} query rows would attend to no key (seq_q {seq_q}, seq_k {seq_k})")]
    NoVisibleKeys {
        /// How many rows see nothing.
        rows: usize,
        /// Query length.
        seq_q: usize,
        /// Key length.
        seq_k: usize,
    },
    /// The softmax scale is not a positive finite number (NaN, infinite, zero or negative).
    #[error("softmax scale {0} is not a positive finite number")]
    InvalidScale(f32),
    /// The softcap is not positive and finite.
    #[error("softcap {0} is not a positive finite number")]
    InvalidSoftcap(f32),
    /// A side of a sliding window is negative (only C++ callers can give one: Rust's sides are
    /// `usize`; the C++ code `InvalidWindow` maps here).
    #[error("sliding window: the {} side is {value}, a window side must not be negative", if *left { "left" } else { "right" })]
    InvalidWindow {
        /// Whether the left side (else the right) is the negative one.
        left: bool,
        /// Its value.
        value: i64,
    },
    /// An ALiBi slope is not finite (C++ `Code::InvalidAlibiSlope`).
    #[error("ALiBi slope {index} is {value}, not finite")]
    InvalidAlibiSlope {
        /// Its position in the slopes (row-major `[batch, heads]`).
        index: usize,
        /// Its value.
        value: f32,
    },
    /// A bias's element type code is none of f16 (0), bf16 (1) and f32 (2) (C++
    /// `Code::UnsupportedBiasType`; a Rust [`crate::Bias`] always has one of them).
    #[error("bias element type {value} is none of f16 (0), bf16 (1) and f32 (2)")]
    UnsupportedBiasType {
        /// The code given.
        value: i64,
    },
    /// A dimension or stride exceeds what a backend's 32-bit indexing can address.
    #[error("{what} = {value} exceeds the {backend} backend's limit of {limit}")]
    IndexOverflow {
        /// The backend.
        backend: &'static str,
        /// What overflowed.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// The requested backend cannot run on these tensors or this device.
    #[error("backend {backend} is unavailable: {reason}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: &'static str,
        /// Why.
        reason: String,
    },
    /// The chosen tile needs more shared memory per block than the device offers.
    #[error("tile needs {needed} bytes of shared memory per block, the device offers {available}")]
    SharedMemoryExceeded {
        /// Bytes needed.
        needed: usize,
        /// Bytes available (opt-in maximum).
        available: usize,
    },
    /// The device has no kernels in this build: compute capability below 8.0, or from 10.0 on
    /// with less shared memory per block than any tile class (99 KB).
    #[error("compute capability {major}.{minor} is not supported (needs 8.0 or later)")]
    UnsupportedDevice {
        /// Major version.
        major: i32,
        /// Minor version.
        minor: i32,
    },
    /// No CUDA device (or no driver) is present, or the ordinal is out of range.
    #[error("no CUDA device {ordinal}: {reason}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Why.
        reason: String,
    },
    /// A host allocation could not be satisfied (a tensor, a copy to the host, or the CPU
    /// backend's buffers): returned instead of aborting the process.
    #[error("out of host memory: could not allocate {bytes} bytes")]
    OutOfHostMemory {
        /// The bytes asked for.
        bytes: usize,
    },
    /// A device allocation could not be satisfied (a tensor, a copy to the device, or a
    /// kernel's scratch memory). Nothing was launched, and the process can go on: the device
    /// and every live tensor stay usable.
    #[error("out of device memory: could not allocate {bytes} bytes")]
    OutOfDeviceMemory {
        /// The bytes asked for.
        bytes: usize,
    },
    /// This build has no CUDA support (the `cuda` feature is off).
    #[error("flashcore was built without the `cuda` feature")]
    CudaNotBuilt,
    /// A CUDA runtime call or kernel launch failed, or an earlier asynchronous fault surfaced.
    #[error("CUDA error {name}: {message}")]
    Cuda {
        /// CUDA's error name, e.g. `cudaErrorIllegalAddress`.
        name: String,
        /// The call that failed and CUDA's message.
        message: String,
    },
    /// The kernel layer rejected a launch (e.g. CUTLASS's own argument check).
    #[error("kernel launch rejected: {0}")]
    Launch(String),
    /// An [`AttentionPlan`](crate::AttentionPlan) ran on an operand whose dims, strides or
    /// location differ from the plan's (or with a logsumexp output where the plan had none, or
    /// the reverse).
    #[error("{0} does not match the plan (dims, strides or location)")]
    PlanMismatch(Operand),
    /// [`crate::merge_states`] got no state, or more than one call merges.
    #[error("merge_states takes {min} to {max} states, got {count}")]
    StateCount {
        /// The states given.
        count: usize,
        /// The fewest a call takes (1).
        min: usize,
        /// The most a call takes ([`crate::max_merge_states`]).
        max: usize,
    },
    /// The offsets of a variable-length batch break a rule: `value` at entry `index` against
    /// `bound` (the entry before it, the token count, or the maximum length).
    #[error("{operand}: {rule} (entry {index:?} is {value}, bound {bound})")]
    InvalidOffsets {
        /// [`Operand::CuSeqlensQ`] or [`Operand::CuSeqlensK`].
        operand: Operand,
        /// The rule broken.
        rule: OffsetRule,
        /// The entry (for [`OffsetRule::LongerThanMax`], the sequence); `None` when the maximum
        /// length itself is out of range.
        index: Option<usize>,
        /// The offending value.
        value: i64,
        /// What it is checked against.
        bound: i64,
    },
    /// A paged KV cache breaks `rule`: `value` (a page size, a key count or a page index) of
    /// `sequence` against `bound`.
    #[error("paged KV cache: {rule} (sequence {sequence:?}: {value}, bound {bound})")]
    InvalidPageTable {
        /// The rule broken.
        rule: PageRule,
        /// The sequence, where one is at fault.
        sequence: Option<usize>,
        /// The offending value.
        value: i64,
        /// What it is checked against.
        bound: i64,
    },
    /// An output shares memory with itself (`other` is `None`: two of its elements have one
    /// address, as a stride of 0 makes them), with an input, or with the other output: the
    /// kernel's writes would race with each other or with its reads. An output's strides,
    /// ordered, must each exceed the span of the smaller dimensions; an output and an input may
    /// share a buffer (interleaved views of a packed one) but no element. Where they have other
    /// element sizes or strides, any intersection of their address ranges counts. A merge may
    /// write in place: its output may be one of the states exactly.
    #[error("{operand} overlaps {}", match other { Some(o) => format!("the memory of {o}"), None => "itself (two elements share an address)".into() })]
    OverlappingOutput {
        /// The output: [`Operand::Out`] or [`Operand::Lse`] (of the backward pass:
        /// [`Operand::DQ`], [`Operand::DK`] or [`Operand::DV`]).
        operand: Operand,
        /// What it overlaps; `None`: itself.
        other: Option<Operand>,
    },
    /// [`Tensor::copy_from`](crate::Tensor) got a source whose dims or strides differ from
    /// the destination's, or tensors with gaps between their elements (the copy is one range).
    #[error(
        "copy_from needs equal dims and strides without gaps (destination dims {dims:?}, source \
         dims {src_dims:?})"
    )]
    CopyMismatch {
        /// The destination's dims, ordered like [`crate::Shape::as_array`].
        dims: [usize; 4],
        /// The source's dims.
        src_dims: [usize; 4],
    },
    /// A call recorded into a CUDA graph (`Capture::run`, feature `cuda`) has an operand (or the
    /// plan has an offsets array, page table, slopes or bias) on a stream other than the
    /// capture's: the graph is launched on that stream, which must order every buffer the graph
    /// uses. Nothing was recorded.
    #[error("{operand} is not on the stream the graph is captured for")]
    GraphStream {
        /// The first operand found on another stream.
        operand: Operand,
    },
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
