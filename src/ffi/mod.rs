//! The FFI layer: the one cxx bridge to the C++ library in `cpp/`, and the only module with
//! `unsafe` (the crate denies `unsafe_code` elsewhere).
//!
//! The host-only half is always built: validation, planning and the tile tables live in C++
//! (`cpp/src/core/`), once for both languages, because the standalone C++ library must validate
//! without Rust while Rust can call C++. This module holds the bridge and the conversions between
//! its plain structs and the crate's types (`plan` reads the tables through it), and maps every
//! C++ `Status` to the typed [`Error`]. The CUDA half (`cuda`, feature `cuda`) wraps streams,
//! events, memory and the launch (one crossing: validate, plan, launch).

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "cudarc")]
mod cudarc;

use crate::element::DType;
use crate::error::{Error, OffsetRule, Operand, PageRule};
use crate::options::{Backend, Causal};
use crate::plan::{ArchClass, Kernel};
use crate::tensor::{Location, Shape};

#[cxx::bridge(namespace = "flashcore::bridge")]
pub(crate) mod sys {
    /// One operand (mirrors `core::TensorDesc`): address, dims `[batch, seq, heads, head_dim]`,
    /// element strides, location (-1 host, else device ordinal), element size in bytes.
    #[derive(Clone, Copy)]
    struct DescFfi {
        address: u64,
        shape: [i64; 4],
        stride: [i64; 4],
        location: i32,
        element_bytes: i32,
    }

    /// One offsets array of a variable-length batch (mirrors `core::OffsetsDesc` but for its
    /// host copy, which crosses as a slice): `count` sequences, so `count + 1` int32 entries.
    #[derive(Clone, Copy, Default)]
    struct OffsetsFfi {
        address: u64,
        location: i32,
        count: i64,
        max_len: i64,
    }

    /// A paged KV cache (mirrors `core::PagesDesc` but for its host copies, which cross as
    /// slices): the block table (`count` x `pages_per_seq` int32) and the key lengths.
    #[derive(Clone, Copy, Default)]
    struct PagesFfi {
        table: u64,
        seqlens: u64,
        table_location: i32,
        seqlens_location: i32,
        count: i64,
        page_size: i64,
        pages_per_seq: i64,
        max_seqlen_k: i64,
    }

    /// ALiBi slopes (mirrors `core::AlibiDesc` but for the host copy: the crate checked its
    /// slopes when it made them): `batch` x `heads` f32 at `address`.
    #[derive(Clone, Copy, Default)]
    struct AlibiFfi {
        address: u64,
        location: i32,
        batch: i64,
        heads: i64,
    }

    /// One attention call (mirrors `core::Request`). `forced_arch`: -1 for none.
    #[derive(Clone, Copy)]
    struct RequestFfi {
        dtype: i32,
        q: DescFfi,
        k: DescFfi,
        v: DescFfi,
        out: DescFfi,
        lse: DescFfi,
        has_lse: bool,
        has_scale: bool,
        scale: f32,
        has_softcap: bool,
        softcap: f32,
        /// Sliding window sides, -1 when unbounded (`Options::window_left / _right`).
        window_left: i64,
        window_right: i64,
        causal: i32,
        backend: i32,
        forced_arch: i32,
        varlen: bool,
        cu_q: OffsetsFfi,
        cu_k: OffsetsFfi,
        paged: bool,
        pages: PagesFfi,
        has_alibi: bool,
        alibi: AlibiFfi,
        /// An additive bias: `bias_dtype` (0 f16, 1 bf16, 2 f32) and its tensor.
        has_bias: bool,
        bias_dtype: i32,
        bias: DescFfi,
    }

    /// A validated problem (mirrors `core::Problem`).
    #[derive(Clone, Copy, Default)]
    struct ProblemFfi {
        batch: i64,
        seq_q: i64,
        seq_k: i64,
        heads_q: i64,
        heads_kv: i64,
        head_dim: i64,
        scale: f32,
        causal: i32,
        location: i32,
        varlen: bool,
        paged: bool,
        window_left: i64,
        window_right: i64,
        alibi: bool,
        bias: bool,
        token_rows: i64,
    }

    /// `flashcore::Status`.
    #[derive(Default)]
    struct StatusFfi {
        code: i32,
        operand: i32,
        field: i32,
        values: [i64; 3],
        cuda_name: String,
        message: String,
    }

    /// `flashcore::TileRow`.
    struct TileRowFfi {
        arch: i32,
        max_head_dim: i32,
        queries_per_block: i32,
        keys_per_block: i32,
        tile_max_head_dim: i32,
        smem_bytes: i64,
        reason: String,
    }

    /// `flashcore::BackwardTileRow`.
    struct BackwardTileRowFfi {
        kernel: i32,
        max_head_dim: i32,
        warps: i32,
        keys_per_block: i32,
        rows_per_step: i32,
        step_buffers: i32,
        smem_bytes: i64,
        reason: String,
    }

    /// The result of a backward call: status, and on success the index of the row of
    /// `backward_tile_table()` that ran.
    #[cfg(feature = "cuda")]
    struct BackwardRanFfi {
        status: StatusFfi,
        row: i32,
    }

    /// A row of the tables: `decode_table(kernel)` or `tile_table(kernel)`, index (-1: none).
    #[derive(Clone, Copy, Default)]
    struct RowRef {
        decode: bool,
        index: i32,
    }

    /// `core::DeviceCaps` (the compiled kernel families are filled in on the C++ side).
    struct CapsFfi {
        major: i32,
        minor: i32,
        smem_per_block_optin: i64,
        multiprocessors: i32,
    }

    /// The C++ constants that Rust re-exports.
    struct LimitsFfi {
        max_head_dim: i64,
        head_dim_multiple: i64,
        decode_max_query_rows: i64,
        max_merge_states: i64,
    }

    /// The result of a launch: status, and on success the kernel and row that ran.
    #[cfg(feature = "cuda")]
    #[derive(Default)]
    struct LaunchedFfi {
        status: StatusFfi,
        kernel: i32,
        row: RowRef,
        splits: i32,
    }

    /// Device properties read once when a device is opened.
    #[cfg(feature = "cuda")]
    struct DeviceInfo {
        name: String,
        major: i32,
        minor: i32,
        sm_count: i32,
        smem_per_block_optin: usize,
        smem_per_sm: usize,
        total_memory: usize,
        l2_bytes: usize,
    }

    /// The device addresses of a planned run's tensors (`lse` 0 for none).
    #[cfg(feature = "cuda")]
    struct RunAddressesFfi {
        q: usize,
        k: usize,
        v: usize,
        out: usize,
        lse: usize,
    }

    /// A device's default memory pool, in bytes (`cudaMemPoolAttr*MemCurrent` / `*MemHigh`).
    #[cfg(feature = "cuda")]
    struct PoolUsage {
        reserved: u64,
        reserved_high: u64,
        used: u64,
        used_high: u64,
    }

    unsafe extern "C++" {
        include!("flashcore/cpp/src/bridge.h");

        /// Validates `request`; `host_q` / `host_k` are the host copies of a variable-length
        /// batch's offsets, or of a paged call's block table and key lengths (empty: none).
        fn validate(
            request: &RequestFfi,
            host_q: &[i32],
            host_k: &[i32],
            problem: &mut ProblemFfi,
        ) -> StatusFfi;
        /// Validates a backward call (C++ `core::validate_backward`).
        #[allow(clippy::too_many_arguments)]
        fn validate_backward(
            request: &RequestFfi,
            host_q: &[i32],
            host_k: &[i32],
            dout: &DescFfi,
            dq: &DescFfi,
            dk: &DescFfi,
            dv: &DescFfi,
            problem: &mut ProblemFfi,
        ) -> StatusFfi;
        /// Checks that every ALiBi slope is finite (C++ `core::check_alibi_values`).
        fn check_alibi_slopes(slopes: &[f32]) -> StatusFfi;
        /// Validates a merge of `outs.len()` states (C++ `core::validate_merge`).
        fn validate_merge(
            dtype: i32,
            outs: &[DescFfi],
            lses: &[DescFfi],
            out: &DescFfi,
            lse: &DescFfi,
            has_lse: bool,
        ) -> StatusFfi;
        fn table_rows(kernel: i32, decode: bool) -> Vec<TileRowFfi>;
        /// `flashcore::backward_tile_table()`.
        fn backward_rows() -> Vec<BackwardTileRowFfi>;
        fn select_row(kernel: i32, arch: i32, head_dim: i64, query_rows: i64) -> RowRef;
        fn choose_row(
            kernel: i32,
            head_dim: i64,
            query_rows: i64,
            caps: &CapsFfi,
            forced_arch: i32,
            row: &mut RowRef,
        ) -> StatusFfi;
        fn arch_class(major: i32, minor: i32, smem_optin: i64) -> i32;
        fn arch_smem(arch: i32, per_sm: bool) -> i64;
        fn wmma_smem_bytes(queries: i32, keys: i32, head_dim: i32) -> i64;
        fn auto_kernel(
            arch: i32,
            query_rows: i64,
            batch_heads: i64,
            seq_k: i64,
            head_dim: i64,
            multiprocessors: i32,
        ) -> i32;
        fn kv_splits(
            kernel: i32,
            row: &TileRowFfi,
            query_rows: i64,
            batch_heads: i64,
            seq_k: i64,
            multiprocessors: i32,
        ) -> i32;
        fn sequence_splits(
            kernel: i32,
            row: &TileRowFfi,
            query_rows: i64,
            heads: i64,
            key_counts: &[i64],
            multiprocessors: i32,
        ) -> i32;
        fn limits() -> LimitsFfi;

        #[cfg(feature = "cuda")]
        fn compiled_kernels() -> u32;
        #[cfg(feature = "cuda")]
        fn device_count() -> Result<i32>;
        #[cfg(feature = "cuda")]
        fn device_info(ordinal: i32) -> Result<DeviceInfo>;
        #[cfg(feature = "cuda")]
        fn retain_pool_memory(ordinal: i32) -> Result<()>;
        #[cfg(feature = "cuda")]
        fn pool_usage(ordinal: i32) -> Result<PoolUsage>;
        #[cfg(feature = "cuda")]
        fn trim_pool(ordinal: i32, keep: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        fn free_memory(ordinal: i32) -> Result<usize>;

        #[cfg(feature = "cuda")]
        fn stream_create(ordinal: i32) -> Result<usize>;
        #[cfg(feature = "cuda")]
        unsafe fn stream_destroy(ordinal: i32, stream: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn stream_synchronize(ordinal: i32, stream: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn stream_wait_event(ordinal: i32, stream: usize, event: usize) -> Result<()>;

        #[cfg(feature = "cuda")]
        fn event_create(ordinal: i32) -> Result<usize>;
        #[cfg(feature = "cuda")]
        unsafe fn event_destroy(ordinal: i32, event: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn event_record(ordinal: i32, event: usize, stream: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn event_synchronize(ordinal: i32, event: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn event_elapsed_ms(ordinal: i32, start: usize, end: usize) -> Result<f32>;

        #[cfg(feature = "cuda")]
        unsafe fn malloc_async(ordinal: i32, bytes: usize, stream: usize) -> Result<usize>;
        #[cfg(feature = "cuda")]
        unsafe fn free_async(ordinal: i32, ptr: usize, stream: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn copy_to_device(ordinal: i32, dst: usize, src: &[u8], stream: usize)
            -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn capture_begin(ordinal: i32, stream: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn capture_end(ordinal: i32, stream: usize) -> Result<usize>;
        #[cfg(feature = "cuda")]
        unsafe fn graph_launch(ordinal: i32, exec: usize, stream: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn graph_destroy(ordinal: i32, exec: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn copy_to_host(
            ordinal: i32,
            dst: &mut [u8],
            src: usize,
            stream: usize,
        ) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn copy_device(
            ordinal: i32,
            dst: usize,
            src: usize,
            bytes: usize,
            stream: usize,
        ) -> Result<()>;

        /// Validates, plans and launches `request` on `stream` of device `ordinal` (`host_q` /
        /// `host_k` as for `validate`).
        #[cfg(feature = "cuda")]
        unsafe fn attention(
            request: &RequestFfi,
            host_q: &[i32],
            host_k: &[i32],
            caps: &CapsFfi,
            ordinal: i32,
            stream: usize,
        ) -> LaunchedFfi;
        /// A call validated and planned once (`flashcore::detail::Prepared`): what every run
        /// of an [`crate::AttentionPlan`] on a GPU launches.
        #[cfg(feature = "cuda")]
        #[namespace = "flashcore::detail"]
        type Prepared;
        /// Validates and plans `request` (with the host copies of its offsets or key counts)
        /// for a device with `caps`, as `attention` does, and keeps the result for runs on
        /// device `ordinal`. `launched` says what every run launches, or why there is no plan;
        /// then the result is null.
        #[cfg(feature = "cuda")]
        fn prepare_plan(
            request: &RequestFfi,
            host_q: &[i32],
            host_k: &[i32],
            caps: &CapsFfi,
            ordinal: i32,
            launched: &mut LaunchedFfi,
        ) -> SharedPtr<Prepared>;
        /// Runs `call` on the tensors at `addresses` (the caller matched their dims, strides
        /// and places to the plan) on `stream` of device `ordinal`, as the C++
        /// `flashcore::AttentionPlan::run` does: addresses checked, then the launch.
        #[cfg(feature = "cuda")]
        unsafe fn run_plan(
            call: &Prepared,
            addresses: &RunAddressesFfi,
            ordinal: i32,
            stream: usize,
        ) -> StatusFfi;
        /// Host nanoseconds per iteration of `iters` iterations of `mode` from a C++ loop
        /// (bench only; `cuda::HostProbe`).
        #[cfg(feature = "cuda")]
        unsafe fn attention_host_ns(
            request: &RequestFfi,
            caps: &CapsFfi,
            ordinal: i32,
            stream: usize,
            iters: i32,
            mode: i32,
            ns: &mut f64,
        ) -> StatusFfi;
        /// Calls the public C++ API (`flashcore::attention_forward`) exactly as a C++ program
        /// would, on the raw pointers and stream of `request` (interop tests).
        #[cfg(feature = "cuda")]
        unsafe fn cpp_attention_forward(
            request: &RequestFfi,
            host_q: &[i32],
            host_k: &[i32],
            ordinal: i32,
            stream: usize,
        ) -> LaunchedFfi;
        /// Merges the states through the public C++ API (`flashcore::merge_states`) on
        /// `stream` of device `ordinal`.
        #[cfg(feature = "cuda")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn merge_states(
            dtype: i32,
            outs: &[DescFfi],
            lses: &[DescFfi],
            out: &DescFfi,
            lse: &DescFfi,
            has_lse: bool,
            ordinal: i32,
            stream: usize,
        ) -> StatusFfi;
        /// The backward pass through the public C++ API (`flashcore::attention_backward`) on
        /// `stream` of device `ordinal` (`host_q` / `host_k` as for `validate`).
        #[cfg(feature = "cuda")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn attention_backward(
            request: &RequestFfi,
            host_q: &[i32],
            host_k: &[i32],
            dout: &DescFfi,
            dq: &DescFfi,
            dk: &DescFfi,
            dv: &DescFfi,
            ordinal: i32,
            stream: usize,
        ) -> BackwardRanFfi;
        /// `cudaMalloc` / `cudaFree` / synchronous copies done by C++ (interop tests).
        #[cfg(feature = "cuda")]
        fn cpp_malloc(ordinal: i32, bytes: usize) -> Result<usize>;
        #[cfg(feature = "cuda")]
        unsafe fn cpp_free(ordinal: i32, ptr: usize) -> Result<()>;
        #[cfg(feature = "cuda")]
        unsafe fn cpp_upload(ordinal: i32, dst: usize, src: &[u8]) -> Result<()>;
    }
}

pub(crate) use sys::{
    AlibiFfi, CapsFfi, DescFfi, OffsetsFfi, PagesFfi, ProblemFfi, RequestFfi, RowRef, StatusFfi,
};

// ---- Status codes (cpp/include/flashcore/status.h; bridge_core.cpp static_asserts them) ----
const OK: i32 = 0;
const SHAPE_MISMATCH: i32 = 1;
const HEADS_NOT_DIVISIBLE: i32 = 2;
const UNSUPPORTED_HEAD_DIM: i32 = 3;
const NON_CONTIGUOUS_HEAD_DIM: i32 = 4;
const MISALIGNED_STRIDE: i32 = 5;
const MISALIGNED_POINTER: i32 = 6;
const LSE_LAYOUT: i32 = 7;
const DEVICE_MISMATCH: i32 = 8;
const NO_VISIBLE_KEYS: i32 = 9;
const INVALID_SCALE: i32 = 10;
const SIZE_OVERFLOW: i32 = 11;
const INDEX_OVERFLOW: i32 = 12;
const BACKEND_UNAVAILABLE: i32 = 13;
const SHARED_MEMORY_EXCEEDED: i32 = 14;
const UNSUPPORTED_DEVICE: i32 = 15;
const NO_DEVICE: i32 = 16;
const CUDA: i32 = 17;
const STATE_COUNT: i32 = 19;
const INVALID_OFFSETS: i32 = 20;
const OVERLAPPING_OUTPUT: i32 = 21;
const INVALID_PAGE_TABLE: i32 = 22;
const INVALID_SOFTCAP: i32 = 23;
const OUT_OF_DEVICE_MEMORY: i32 = 24;
const PLAN_MISMATCH: i32 = 25;
const INVALID_WINDOW: i32 = 26;
const INVALID_ALIBI_SLOPE: i32 = 27;
const UNSUPPORTED_BIAS_TYPE: i32 = 28;

// `flashcore::Field` values of the offsets rules.
const FIRST_OFFSET: i32 = 12;
const OFFSET_ORDER: i32 = 13;
const LAST_OFFSET: i32 = 14;
const SEQUENCES: i32 = 16;
const PAGE_SIZE: i32 = 17;
const KEYS_BEYOND_PAGES: i32 = 18;
// The `flashcore::Field` of a window's left side (InvalidWindow).
const WINDOW_LEFT: i32 = 20;

/// `flashcore::Field` names, by value.
const FIELDS: [&str; 20] = [
    "",
    "batch",
    "seq",
    "heads",
    "head_dim",
    "seq_q",
    "seq_k",
    "batch * seq_q",
    "batch stride",
    "seq stride",
    "head stride",
    "work units (query blocks x batch x heads)",
    "first offset",
    "offset order",
    "last offset",
    "max_seqlen",
    "sequences",
    "page size",
    "keys beyond pages",
    "page index",
];

/// `flashcore::Operand`; a state's position in merge_states' list rides in `index`.
fn operand(value: i32, index: i64) -> Operand {
    match value {
        2 => Operand::K,
        3 => Operand::V,
        4 => Operand::Out,
        5 => Operand::Lse,
        6 => Operand::State(count(index)),
        7 => Operand::StateLse(count(index)),
        8 => Operand::CuSeqlensQ,
        9 => Operand::CuSeqlensK,
        10 => Operand::BlockTable,
        11 => Operand::SeqlensK,
        12 => Operand::AlibiSlopes,
        13 => Operand::Bias,
        14 => Operand::DOut,
        15 => Operand::DQ,
        16 => Operand::DK,
        17 => Operand::DV,
        _ => Operand::Q,
    }
}

fn location(value: i64) -> Location {
    usize::try_from(value).map_or(Location::Host, Location::Cuda)
}

pub(crate) fn dtype_id(dtype: DType) -> i32 {
    match dtype {
        DType::F16 => 0,
        DType::BF16 => 1,
        DType::F32 => 2, // never an attention input: validation sees only f16/bf16 requests
    }
}

pub(crate) fn causal_id(causal: Causal) -> i32 {
    match causal {
        Causal::None => 0,
        Causal::TopLeft => 1,
        Causal::BottomRight => 2,
    }
}

pub(crate) fn causal_of(id: i32) -> Causal {
    match id {
        1 => Causal::TopLeft,
        2 => Causal::BottomRight,
        _ => Causal::None,
    }
}

/// `flashcore::Backend`: the GPU kernel asked for, whose value is its Kernel's plus one (the CPU
/// backend is Rust's own and never reaches C++; `Auto` lets the planner choose).
pub(crate) fn backend_id(backend: Backend) -> i32 {
    match backend {
        Backend::Auto | Backend::Cpu => 0,
        Backend::Kernel(kernel) => kernel_id(kernel) + 1,
    }
}

/// `flashcore::Kernel`: the same discriminants on both sides.
pub(crate) fn kernel_id(kernel: Kernel) -> i32 {
    kernel as i32
}

pub(crate) fn kernel_of(id: i64) -> Option<Kernel> {
    Kernel::ALL
        .into_iter()
        .find(|&k| i64::from(kernel_id(k)) == id)
}

pub(crate) fn arch_id(arch: ArchClass) -> i32 {
    match arch {
        ArchClass::Sm80 => 0,
        ArchClass::Sm86Sm89 => 1,
        ArchClass::Sm90 => 2,
    }
}

pub(crate) fn arch_of(id: i32) -> Option<ArchClass> {
    match id {
        0 => Some(ArchClass::Sm80),
        1 => Some(ArchClass::Sm86Sm89),
        2 => Some(ArchClass::Sm90),
        _ => None,
    }
}

pub(crate) fn count(v: i64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// The operands of a failed call, for the shape and strides `SizeOverflow` reports.
#[derive(Clone, Copy)]
pub(crate) enum Described<'a> {
    /// Not an operand check (planning, tables).
    Nothing,
    /// An attention call.
    Attention(&'a RequestFfi),
    /// A backward call: the forward call and the gradients dout, dq, dk, dv.
    Backward(&'a RequestFfi, &'a [DescFfi; 4]),
    /// A merge of states.
    Merge {
        outs: &'a [DescFfi],
        lses: &'a [DescFfi],
        out: &'a DescFfi,
        lse: &'a DescFfi,
    },
}

impl Described<'_> {
    fn of(&self, op: Operand) -> Option<DescFfi> {
        match (*self, op) {
            (Described::Nothing, _) => None,
            (Described::Attention(r), op) => Some(match op {
                Operand::Q => r.q,
                Operand::K => r.k,
                Operand::V => r.v,
                Operand::Lse | Operand::StateLse(_) => r.lse,
                Operand::Bias => r.bias,
                Operand::Out
                | Operand::State(_)
                | Operand::CuSeqlensQ
                | Operand::CuSeqlensK
                | Operand::BlockTable
                | Operand::SeqlensK
                | Operand::AlibiSlopes
                | Operand::Source
                | Operand::DOut
                | Operand::DQ
                | Operand::DK
                | Operand::DV => r.out,
            }),
            (Described::Backward(_, grads), Operand::DOut) => Some(grads[0]),
            (Described::Backward(_, grads), Operand::DQ) => Some(grads[1]),
            (Described::Backward(_, grads), Operand::DK) => Some(grads[2]),
            (Described::Backward(_, grads), Operand::DV) => Some(grads[3]),
            (Described::Backward(r, _), op) => Described::Attention(r).of(op),
            (Described::Merge { outs, .. }, Operand::State(i)) => outs.get(i).copied(),
            (Described::Merge { lses, .. }, Operand::StateLse(i)) => lses.get(i).copied(),
            (Described::Merge { lse, .. }, Operand::Lse) => Some(*lse),
            (Described::Merge { out, .. }, _) => Some(*out),
        }
    }
}

/// The typed error for a failed C++ `Status`; `described` supplies the operand's shape and
/// strides for `SizeOverflow`.
pub(crate) fn to_error(s: StatusFfi, described: &Described<'_>) -> Error {
    let [a, b, c] = s.values;
    let field = FIELDS.get(s.field as usize).copied().unwrap_or("");
    let op = operand(s.operand, c);
    match s.code {
        SHAPE_MISMATCH => Error::ShapeMismatch {
            operand: op,
            dim: field,
            got: count(a),
            expected: count(b),
        },
        HEADS_NOT_DIVISIBLE => Error::HeadsNotDivisible {
            q_heads: count(a),
            kv_heads: count(b),
        },
        UNSUPPORTED_HEAD_DIM => Error::UnsupportedHeadDim(count(a)),
        NON_CONTIGUOUS_HEAD_DIM => Error::NonContiguousHeadDim {
            operand: op,
            stride: count(a),
        },
        MISALIGNED_STRIDE => Error::MisalignedStride {
            operand: op,
            dim: field,
            stride: count(a),
        },
        MISALIGNED_POINTER => Error::MisalignedPointer {
            operand: op,
            ptr: a as usize,
            align: count(b),
        },
        LSE_LAYOUT => Error::LseLayout { operand: op },
        DEVICE_MISMATCH => Error::DeviceMismatch {
            operand: op,
            got: location(a),
            expected: location(b),
        },
        NO_VISIBLE_KEYS => Error::NoVisibleKeys {
            rows: count(a),
            seq_q: count(b),
            seq_k: count(c),
        },
        INVALID_SCALE => Error::InvalidScale(f32::from_bits(a as u32)),
        INVALID_SOFTCAP => Error::InvalidSoftcap(f32::from_bits(a as u32)),
        SIZE_OVERFLOW => {
            let desc = described.of(op);
            Error::SizeOverflow {
                shape: desc.map_or([0; 4], |d| d.shape.map(count)),
                strides: desc.map_or([0; 4], |d| d.stride.map(count)),
            }
        }
        INDEX_OVERFLOW => Error::IndexOverflow {
            backend: kernel_of(c).map_or("unknown", Kernel::name),
            what: field,
            value: a as u64,
            limit: b as u64,
        },
        BACKEND_UNAVAILABLE => Error::BackendUnavailable {
            backend: kernel_of(a).map_or("unknown", Kernel::name),
            reason: s.message,
        },
        SHARED_MEMORY_EXCEEDED => Error::SharedMemoryExceeded {
            needed: count(a),
            available: count(b),
        },
        UNSUPPORTED_DEVICE => Error::UnsupportedDevice {
            major: a as i32,
            minor: b as i32,
        },
        NO_DEVICE => Error::NoDevice {
            ordinal: count(a),
            reason: s.message,
        },
        CUDA => Error::Cuda {
            name: s.cuda_name,
            message: s.message,
        },
        STATE_COUNT => Error::StateCount {
            count: count(a),
            min: count(b),
            max: count(c),
        },
        INVALID_OFFSETS => Error::InvalidOffsets {
            operand: op,
            rule: match s.field {
                FIRST_OFFSET => OffsetRule::FirstNotZero,
                OFFSET_ORDER => OffsetRule::Decreasing,
                LAST_OFFSET => OffsetRule::LastNotTokenCount,
                _ => OffsetRule::LongerThanMax,
            },
            index: usize::try_from(a).ok(),
            value: b,
            bound: c,
        },
        INVALID_PAGE_TABLE => Error::InvalidPageTable {
            rule: match s.field {
                PAGE_SIZE => PageRule::PageSize,
                KEYS_BEYOND_PAGES => PageRule::KeysBeyondPages,
                SEQUENCES => PageRule::VarlenQueries,
                _ => PageRule::PageIndex,
            },
            sequence: usize::try_from(a).ok(),
            value: b,
            bound: c,
        },
        OVERLAPPING_OUTPUT => Error::OverlappingOutput {
            operand: op,
            other: (a != 0).then(|| operand(a as i32, b)),
        },
        OUT_OF_DEVICE_MEMORY => Error::OutOfDeviceMemory { bytes: count(a) },
        PLAN_MISMATCH => Error::PlanMismatch(op),
        INVALID_WINDOW => Error::InvalidWindow {
            left: s.field == WINDOW_LEFT,
            value: a,
        },
        INVALID_ALIBI_SLOPE => Error::InvalidAlibiSlope {
            index: count(a),
            value: f32::from_bits(b as u32),
        },
        UNSUPPORTED_BIAS_TYPE => Error::UnsupportedBiasType { value: a },
        _ => Error::Launch(s.message),
    }
}

/// `Ok(())` for an ok status, else its typed error.
pub(crate) fn check(s: StatusFfi, described: &Described<'_>) -> crate::Result<()> {
    if s.code == OK {
        Ok(())
    } else {
        Err(to_error(s, described))
    }
}

/// Turns the C++ layer's `"code|cuda_name|value|message"` exceptions (`detail::Failure`) into
/// typed errors.
#[cfg(feature = "cuda")]
pub(crate) fn map_err(e: cxx::Exception) -> Error {
    let mut parts = e.what().splitn(4, '|');
    let (code, name, value, message) = (parts.next(), parts.next(), parts.next(), parts.next());
    let value = value.and_then(|v| v.parse::<i64>().ok());
    match (
        code.and_then(|c| c.parse::<i32>().ok()),
        name,
        value,
        message,
    ) {
        (Some(CUDA), Some(name), Some(_), Some(message)) => Error::Cuda {
            name: name.to_owned(),
            message: message.to_owned(),
        },
        (Some(OUT_OF_DEVICE_MEMORY), Some(_), Some(bytes), Some(_)) => Error::OutOfDeviceMemory {
            bytes: count(bytes),
        },
        (Some(_), Some(_), Some(_), Some(message)) => Error::Launch(message.to_owned()),
        _ => Error::Launch(e.what().to_owned()),
    }
}

/// Validates `request` (C++ `core::validate`), with the host copies of a variable-length
/// batch's offsets (empty for a dense call).
pub(crate) fn validate(
    request: &RequestFfi,
    host_q: &[i32],
    host_k: &[i32],
) -> crate::Result<ProblemFfi> {
    let mut problem = ProblemFfi::default();
    check(
        sys::validate(request, host_q, host_k, &mut problem),
        &Described::Attention(request),
    )?;
    Ok(problem)
}

/// Validates a backward call (C++ `core::validate_backward`): the forward call `request` (its
/// logsumexp required; a variable-length batch's offsets with their host copies `hosts`) and the
/// gradients dout, dq, dk, dv.
pub(crate) fn validate_backward(
    request: &RequestFfi,
    (host_q, host_k): (&[i32], &[i32]),
    grads: &[DescFfi; 4],
) -> crate::Result<ProblemFfi> {
    let mut problem = ProblemFfi::default();
    let [dout, dq, dk, dv] = grads;
    check(
        sys::validate_backward(request, host_q, host_k, dout, dq, dk, dv, &mut problem),
        &Described::Backward(request, grads),
    )?;
    Ok(problem)
}

/// Checks ALiBi slopes' values (C++ `core::check_alibi_values`).
pub(crate) fn check_alibi_slopes(slopes: &[f32]) -> crate::Result<()> {
    check(sys::check_alibi_slopes(slopes), &Described::Nothing)
}

/// Validates a merge (C++ `core::validate_merge`).
pub(crate) fn validate_merge(
    dtype: i32,
    outs: &[DescFfi],
    lses: &[DescFfi],
    out: &DescFfi,
    lse: Option<&DescFfi>,
) -> crate::Result<()> {
    let status = sys::validate_merge(dtype, outs, lses, out, lse.unwrap_or(out), lse.is_some());
    let lse = lse.unwrap_or(out);
    check(
        status,
        &Described::Merge {
            outs,
            lses,
            out,
            lse,
        },
    )
}

/// (largest head dim, head-dim multiple, decode query-row limit, most states one merge takes)
/// from the C++ library.
pub(crate) fn limits() -> (usize, usize, usize, usize) {
    let l = sys::limits();
    (
        count(l.max_head_dim),
        count(l.head_dim_multiple),
        count(l.decode_max_query_rows),
        count(l.max_merge_states),
    )
}

impl DescFfi {
    /// Whether this descriptor has these dims, strides and location (its address aside): what
    /// [`desc`] would give them, compared without building a descriptor.
    pub(crate) fn describes(&self, shape: Shape, strides: [usize; 4], location: Location) -> bool {
        let equal = |ours: &[i64; 4], theirs: &[usize; 4]| {
            ours.iter()
                .zip(theirs)
                .all(|(&a, &b)| i64::try_from(b) == Ok(a))
        };
        equal(&self.shape, &shape.as_array())
            && equal(&self.stride, &strides)
            && location_code(location) == Some(self.location)
    }
}

/// The bridge's code for a location: -1 for the host, else the device ordinal; `None` for an
/// ordinal that does not fit an `i32` ([`desc`] refuses it; the other views use
/// [`view_location_code`]).
pub(crate) fn location_code(location: Location) -> Option<i32> {
    match location {
        Location::Host => Some(-1),
        Location::Cuda(i) => i32::try_from(i).ok(),
    }
}

/// [`location_code`] for the ALiBi, page-table and offsets views: an ordinal that does not fit
/// an `i32` becomes `i32::MAX`, which matches no device, so the core refuses the view.
pub(crate) fn view_location_code(location: Location) -> i32 {
    location_code(location).unwrap_or(i32::MAX)
}

/// The bridge's view of one operand.
pub(crate) fn desc(
    address: u64,
    shape: Shape,
    strides: [usize; 4],
    location: Location,
    element_bytes: usize,
) -> crate::Result<DescFfi> {
    let overflow = || Error::SizeOverflow {
        shape: shape.as_array(),
        strides,
    };
    let mut d = DescFfi {
        address,
        shape: [0; 4],
        stride: [0; 4],
        location: match location {
            Location::Host => -1,
            Location::Cuda(i) => i32::try_from(i).map_err(|_| Error::NoDevice {
                ordinal: i,
                reason: "ordinal out of range".into(),
            })?,
        },
        element_bytes: element_bytes as i32,
    };
    for (i, (&n, &st)) in shape.as_array().iter().zip(&strides).enumerate() {
        d.shape[i] = i64::try_from(n).map_err(|_| overflow())?;
        d.stride[i] = i64::try_from(st).map_err(|_| overflow())?;
    }
    Ok(d)
}
