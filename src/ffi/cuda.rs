//! The CUDA half of the FFI layer: the owning handles built on the bridge's CUDA functions.
//! Each raw handle here (stream, event, device buffer)
//! upholds one invariant that makes its methods safe to call: the handle was created by the
//! CUDA runtime on `ordinal`, is owned (or, for borrowed streams, outlived) by the value, and is
//! destroyed at most once, in `Drop`.

use std::sync::Arc;

use crate::element::Element;
use crate::error::{Error, Result};
use crate::tensor::{Shape, Tensor};

use super::{map_err, sys, CapsFfi, DescFfi, RequestFfi};
use crate::cuda::Device;
use crate::dispatch::Execution;
pub(crate) use sys::DeviceInfo;

fn ordinal_i32(ordinal: usize) -> Result<i32> {
    i32::try_from(ordinal).map_err(|_| Error::NoDevice {
        ordinal,
        reason: "ordinal out of range".into(),
    })
}

/// Number of CUDA devices; an error when no driver or device is present.
pub(crate) fn device_count() -> Result<usize> {
    sys::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(map_err)
}

/// Properties of device `ordinal`.
pub(crate) fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    sys::device_info(ordinal_i32(ordinal)?).map_err(map_err)
}

/// Keeps freed memory in device `ordinal`'s default pool for reuse.
pub(crate) fn retain_pool_memory(ordinal: usize) -> Result<()> {
    sys::retain_pool_memory(ordinal_i32(ordinal)?).map_err(map_err)
}

/// Device `ordinal`'s default pool usage.
pub(crate) fn pool_usage(ordinal: usize) -> Result<crate::cuda::PoolUsage> {
    let u = sys::pool_usage(ordinal_i32(ordinal)?).map_err(map_err)?;
    Ok(crate::cuda::PoolUsage {
        reserved: u.reserved,
        reserved_high: u.reserved_high,
        used: u.used,
        used_high: u.used_high,
    })
}

/// Trims device `ordinal`'s default pool to `keep` bytes (what live allocations allow).
pub(crate) fn trim_pool(ordinal: usize, keep: usize) -> Result<()> {
    sys::trim_pool(ordinal_i32(ordinal)?, keep).map_err(map_err)
}

/// Free bytes on device `ordinal` (`cudaMemGetInfo`).
pub(crate) fn free_memory(ordinal: usize) -> Result<usize> {
    sys::free_memory(ordinal_i32(ordinal)?).map_err(map_err)
}

/// A CUDA stream: created and destroyed by us, or borrowed from the caller.
#[derive(Debug)]
pub(crate) struct RawStream {
    ordinal: i32,
    handle: usize,
    owned: bool,
    /// What keeps a borrowed stream alive (a cudarc stream), if anything; only dropped.
    _keepalive: Option<Keepalive>,
}

/// A foreign owner whose lifetime keeps a borrowed resource alive (dropped with the borrower).
pub(crate) type Keepalive = Box<dyn std::any::Any + Send + Sync>;

impl RawStream {
    pub(crate) fn create(ordinal: usize) -> Result<Self> {
        let ordinal = ordinal_i32(ordinal)?;
        let handle = sys::stream_create(ordinal).map_err(map_err)?;
        Ok(RawStream {
            ordinal,
            handle,
            owned: true,
            _keepalive: None,
        })
    }

    /// Wraps a caller's `cudaStream_t` without taking ownership.
    ///
    /// # Safety
    /// `handle` must be a valid stream of device `ordinal` (or null, the legacy default stream)
    /// and must stay valid for as long as the returned value or any tensor using it lives.
    pub(crate) unsafe fn borrowed(
        ordinal: usize,
        handle: usize,
        keepalive: Option<Keepalive>,
    ) -> Result<Self> {
        Ok(RawStream {
            ordinal: ordinal_i32(ordinal)?,
            handle,
            owned: false,
            _keepalive: keepalive,
        })
    }

    pub(crate) fn handle(&self) -> usize {
        self.handle
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is a live stream of `ordinal` (type invariant).
        unsafe { sys::stream_synchronize(self.ordinal, self.handle) }.map_err(map_err)
    }

    /// Makes later work on `self` wait until `event`'s recorded work is done.
    pub(crate) fn wait(&self, event: &RawEvent) -> Result<()> {
        // SAFETY: both handles are live (type invariants); CUDA allows cross-stream waits.
        unsafe { sys::stream_wait_event(self.ordinal, self.handle, event.handle) }.map_err(map_err)
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we created the stream and destroy it once. Errors cannot be returned from
            // Drop; CUDA lets pending work finish before the stream is released.
            let _ = unsafe { sys::stream_destroy(self.ordinal, self.handle) };
        }
    }
}

impl RawStream {
    /// Starts recording the work enqueued on this stream into a CUDA graph, instead of running
    /// it (relaxed mode: other streams and threads are unaffected).
    pub(crate) fn begin_capture(&self) -> Result<()> {
        // SAFETY: the handle is a live stream of `ordinal` (type invariant).
        unsafe { sys::capture_begin(self.ordinal, self.handle) }.map_err(map_err)
    }

    /// Ends the capture and instantiates what it recorded.
    pub(crate) fn end_capture(&self) -> Result<RawGraph> {
        // SAFETY: the handle is a live stream of `ordinal` (type invariant); C++ ends the
        // capture (also when it fails) and returns an executable graph that we own.
        let exec = unsafe { sys::capture_end(self.ordinal, self.handle) }.map_err(map_err)?;
        Ok(RawGraph {
            ordinal: self.ordinal,
            exec,
        })
    }
}

/// An executable CUDA graph (`cudaGraphExec_t`), owned and destroyed once.
#[derive(Debug)]
pub(crate) struct RawGraph {
    ordinal: i32,
    exec: usize,
}

impl RawGraph {
    /// Enqueues the whole graph on `stream` (of the graph's device: the caller checks).
    pub(crate) fn launch(&self, stream: &RawStream) -> Result<()> {
        // SAFETY: both handles are live (type invariants); the memory the graph's nodes use is
        // kept allocated by the graph's owner (`cuda::Graph`) while it can be launched.
        unsafe { sys::graph_launch(self.ordinal, self.exec, stream.handle) }.map_err(map_err)
    }
}

impl Drop for RawGraph {
    fn drop(&mut self) {
        // SAFETY: we own the executable graph and destroy it once; CUDA lets launches already
        // in flight finish and frees it afterwards.
        let _ = unsafe { sys::graph_destroy(self.ordinal, self.exec) };
    }
}

/// A CUDA event (with timing).
#[derive(Debug)]
pub(crate) struct RawEvent {
    ordinal: i32,
    handle: usize,
}

impl RawEvent {
    pub(crate) fn create(ordinal: usize) -> Result<Self> {
        let ordinal = ordinal_i32(ordinal)?;
        let handle = sys::event_create(ordinal).map_err(map_err)?;
        Ok(RawEvent { ordinal, handle })
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    pub(crate) fn record(&self, stream: &RawStream) -> Result<()> {
        // SAFETY: both handles are live (type invariants).
        unsafe { sys::event_record(self.ordinal, self.handle, stream.handle) }.map_err(map_err)
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live (type invariant).
        unsafe { sys::event_synchronize(self.ordinal, self.handle) }.map_err(map_err)
    }

    /// Milliseconds between `self` and `end`, both recorded and complete.
    pub(crate) fn elapsed_ms(&self, end: &RawEvent) -> Result<f32> {
        // SAFETY: both handles are live (type invariants); CUDA reports unrecorded events as an
        // error, not undefined behaviour.
        unsafe { sys::event_elapsed_ms(self.ordinal, self.handle, end.handle) }.map_err(map_err)
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        // SAFETY: we created the event and destroy it once.
        let _ = unsafe { sys::event_destroy(self.ordinal, self.handle) };
    }
}

/// Device memory allocated stream-ordered (`cudaMallocAsync`) and freed on the same stream.
///
/// Every access to the memory is a CUDA operation enqueued on a stream; work on other streams is
/// ordered against this buffer's stream with events (see `cuda::launch`), so the free never
/// overtakes a use. The memory is freed when the buffer and every [`RawBuffer::share`] of it
/// are gone (a CUDA graph that captured a launch on it holds a share).
#[derive(Debug)]
pub(crate) struct RawBuffer {
    memory: Arc<Memory>,
}

/// The allocation behind a [`RawBuffer`] and its shares.
#[derive(Debug)]
struct Memory {
    ptr: usize,
    bytes: usize,
    stream: Arc<RawStream>,
    /// Allocated here (freed in `Drop`), or foreign memory borrowed through
    /// `Tensor::from_raw_device` (never freed here).
    owned: bool,
    /// The foreign owner of borrowed memory (a cudarc slice), dropped with the memory.
    keepalive: Option<Keepalive>,
}

impl RawBuffer {
    pub(crate) fn alloc(stream: Arc<RawStream>, bytes: usize) -> Result<Self> {
        let ptr = if bytes == 0 {
            0
        } else {
            // SAFETY: the stream is live; the returned pointer is owned by this value.
            unsafe { sys::malloc_async(stream.ordinal, bytes, stream.handle) }.map_err(map_err)?
        };
        Ok(RawBuffer {
            memory: Arc::new(Memory {
                ptr,
                bytes,
                stream,
                owned: true,
                keepalive: None,
            }),
        })
    }

    pub(crate) fn ptr(&self) -> usize {
        self.memory.ptr
    }

    /// What keeps the memory allocated (and borrowed memory's foreign owner alive) after this
    /// buffer is dropped: its free waits for the share too.
    pub(crate) fn share(&self) -> Keepalive {
        Box::new(Arc::clone(&self.memory))
    }

    /// Copies `src` into the start of the buffer (enqueued on the buffer's stream).
    pub(crate) fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        let m = &self.memory;
        assert!(src.len() <= m.bytes, "copy_from_host beyond the buffer");
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: `src.len()` bytes fit the allocation (checked above); the C++ side returns
        // only after the pageable source has been staged, so `src` may be released afterwards.
        unsafe { sys::copy_to_device(m.stream.ordinal, m.ptr, src, m.stream.handle) }
            .map_err(map_err)
    }

    /// Copies the start of the buffer into `dst`, waiting for the copy (and earlier work).
    pub(crate) fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        let m = &self.memory;
        assert!(dst.len() <= m.bytes, "copy_to_host beyond the buffer");
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst.len()` bytes fit the allocation; the C++ side synchronises the stream
        // before returning, so the device never writes `dst` after its borrow ends.
        unsafe { sys::copy_to_host(m.stream.ordinal, dst, m.ptr, m.stream.handle) }.map_err(map_err)
    }

    /// Copies the first `bytes` bytes of `src` into the start of `self`, on `self`'s stream.
    pub(crate) fn copy_from_device(&mut self, src: &RawBuffer, bytes: usize) -> Result<()> {
        let (m, src) = (&self.memory, &src.memory);
        assert!(
            bytes <= src.bytes && bytes <= m.bytes,
            "copy_from_device beyond a buffer"
        );
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both allocations are live and hold `bytes` (checked above); the caller
        // ordered `src`'s stream before this one (same stream, or an event wait).
        unsafe { sys::copy_device(m.stream.ordinal, m.ptr, src.ptr, bytes, m.stream.handle) }
            .map_err(map_err)
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if self.owned && self.ptr != 0 {
            // SAFETY: we allocated the pointer and free it once, stream-ordered after every use
            // enqueued on (or ordered before) this stream.
            let _ = unsafe { sys::free_async(self.stream.ordinal, self.ptr, self.stream.handle) };
        }
    }
}

/// The operands of one launch, borrowed for its duration. Their shapes and strides were
/// validated against each buffer's length (`Tensor` construction and validation), so every
/// address the kernel forms lies inside these allocations.
pub(crate) struct Operands<'a> {
    pub q: &'a RawBuffer,
    pub k: &'a RawBuffer,
    pub v: &'a RawBuffer,
    pub out: &'a mut RawBuffer,
    pub lse: Option<&'a mut RawBuffer>,
    pub indices: Option<IndexBuffers<'a>>,
    /// ALiBi slopes on the device (`batch x heads` f32, equal to their checked host copy).
    pub alibi: Option<&'a RawBuffer>,
    /// An additive bias on the device (its dims and strides in the request).
    pub bias: Option<&'a RawBuffer>,
}

/// A call's two int32 index arrays on the device, holding the same values as their host
/// copies (the owning types are immutable): a variable-length batch's query and key offsets
/// (`first` = `cu_seqlens_q`, `second` = `cu_seqlens_k`), or a paged cache's block table and key
/// counts. A host copy may be left empty when C++ should not see it (interop tests).
pub(crate) struct IndexBuffers<'a> {
    pub paged: bool,
    pub first: &'a RawBuffer,
    pub second: &'a RawBuffer,
    pub host_first: &'a [i32],
    pub host_second: &'a [i32],
}

/// `request` with the addresses of the borrowed buffers, and the index arrays' host copies
/// (empty for a dense call).
fn with_addresses<'a>(request: &RequestFfi, b: Operands<'a>) -> (RequestFfi, &'a [i32], &'a [i32]) {
    let mut r = *request;
    r.q.address = b.q.ptr() as u64;
    r.k.address = b.k.ptr() as u64;
    r.v.address = b.v.ptr() as u64;
    r.out.address = b.out.ptr() as u64;
    if let Some(l) = b.lse {
        r.lse.address = l.ptr() as u64;
    }
    if let Some(a) = b.alibi {
        r.alibi.address = a.ptr() as u64;
    }
    if let Some(x) = b.bias {
        r.bias.address = x.ptr() as u64;
    }
    match b.indices {
        Some(i) if i.paged => {
            r.pages.table = i.first.ptr() as u64;
            r.pages.seqlens = i.second.ptr() as u64;
            (r, i.host_first, i.host_second)
        }
        Some(i) => {
            r.cu_q.address = i.first.ptr() as u64;
            r.cu_k.address = i.second.ptr() as u64;
            (r, i.host_first, i.host_second)
        }
        None => (r, &[], &[]),
    }
}

fn caps(device: &Device) -> CapsFfi {
    let (major, minor) = device.compute_capability();
    CapsFfi {
        major,
        minor,
        smem_per_block_optin: i64::try_from(device.shared_memory_per_block_optin())
            .unwrap_or(i64::MAX),
        multiprocessors: i32::try_from(device.sm_count()).unwrap_or(i32::MAX),
    }
}

/// What a launch ran (or a plan will run).
fn launched(l: sys::LaunchedFfi, request: &RequestFfi) -> Result<Execution> {
    super::check(l.status, &super::Described::Attention(request))?;
    let kernel = super::kernel_of(i64::from(l.kernel))
        .ok_or_else(|| Error::Launch("the C++ planner named no kernel".into()))?;
    let row = crate::plan::row(kernel, l.row)
        .ok_or_else(|| Error::Launch("the C++ planner named no row".into()))?;
    Ok(Execution {
        backend: kernel.into(),
        tile: Some(*row),
        splits: usize::try_from(l.splits).unwrap_or(1).max(1),
        backward_tile: None,
    })
}

/// Validates and plans `request` for `device` and enqueues it on `stream` (one bridge crossing).
///
/// The caller (`cuda::launch`) orders every buffer's stream before `stream` and after the
/// launch, so no free or copy on another stream overtakes the kernel.
pub(crate) fn attention(
    request: &RequestFfi,
    device: &Device,
    stream: &RawStream,
    b: Operands<'_>,
) -> Result<Execution> {
    let (r, host_q, host_k) = with_addresses(request, b);
    // SAFETY: the addresses are live allocations of `stream`'s device, large enough for the
    // validated shapes and strides, borrowed (out and lse exclusively) until we return; the
    // kernel is ordered on `stream` before any later free (see above). A variable-length batch's
    // offsets hold `count + 1` entries on the device, equal to the host copies that validation
    // checked against the token counts; a paged cache's table holds `count x pages_per_seq`
    // entries and its key counts `count`, equal to the host copies validation checked against
    // the pages (and the kernel clamps both regardless). ALiBi slopes hold the `batch x heads`
    // floats validation checked against the call's shape; a bias's buffer holds the extent of
    // its dims and strides, which validation checked against the call's (the kernel clamps its
    // rows and keys to those dims).
    let l = unsafe {
        sys::attention(
            &r,
            host_q,
            host_k,
            &caps(device),
            stream.ordinal,
            stream.handle,
        )
    };
    launched(l, &r)
}

/// A planned call on a GPU: its C++ half (`flashcore::detail::Prepared`: the request as
/// validated and planned, with the addresses of the buffers the plan owns), shared by the
/// plan's clones. A run hands C++ only its tensors' addresses, as a C++ plan's run takes them.
#[derive(Clone)]
pub(crate) struct Planned {
    call: cxx::SharedPtr<sys::Prepared>,
}

// SAFETY: a `Prepared` is plain data (sizes, strides, addresses, options and a pointer into a
// static tile table) that `prepare_plan` fills once and nothing writes afterwards: `run_plan`
// only reads it (it copies the request before giving it the run's addresses), and the CUDA
// runtime calls of a run may come from any thread. So sharing it between threads, or dropping
// the last reference on another thread, is sound.
unsafe impl Send for sys::Prepared {}
// SAFETY: as for Send: every access after construction is a read.
unsafe impl Sync for sys::Prepared {}

impl Planned {
    /// Validates and plans `request` (with `host_q` and `host_k`, the host copies of its
    /// offsets or key counts, where it has them) for `device` once, as [`attention`] does: what
    /// every run launches, and the C++ half that runs it on device `ordinal`.
    pub(crate) fn new(
        request: &RequestFfi,
        host_q: &[i32],
        host_k: &[i32],
        device: &Device,
        ordinal: usize,
    ) -> Result<(Execution, Self)> {
        let mut l = sys::LaunchedFfi::default();
        let call = sys::prepare_plan(
            request,
            host_q,
            host_k,
            &caps(device),
            ordinal_i32(ordinal)?,
            &mut l,
        );
        let execution = launched(l, request)?;
        if call.is_null() {
            return Err(Error::Launch("the C++ planner kept no plan".into()));
        }
        Ok((execution, Planned { call }))
    }
}

/// Launches a planned call on `stream`; its operands match the plan (the caller checked their
/// dims, strides and places; C++ checks their addresses). `request` only describes a failure.
pub(crate) fn attention_planned(
    request: &RequestFfi,
    planned: &Planned,
    stream: &RawStream,
    b: Operands<'_>,
) -> Result<()> {
    let addresses = sys::RunAddressesFfi {
        q: b.q.ptr(),
        k: b.k.ptr(),
        v: b.v.ptr(),
        out: b.out.ptr(),
        lse: b.lse.as_ref().map_or(0, |l| l.ptr()),
    };
    let call = planned
        .call
        .as_ref()
        .ok_or_else(|| Error::Launch("an empty plan".into()))?;
    // SAFETY: as for `attention`: the operands have the shapes, strides and locations that the
    // plan validated (AttentionPlan::run compared them; C++ checks the new addresses' alignment
    // and overlaps before it launches), each a live allocation borrowed until we return; the
    // buffers the plan itself names (offsets, page table, slopes, bias) live as long as the plan.
    let status = unsafe { sys::run_plan(call, &addresses, stream.ordinal, stream.handle) };
    if status.code == super::OK {
        return Ok(());
    }
    let (r, _, _) = with_addresses(request, b);
    super::check(status, &super::Described::Attention(&r))
}

/// What one iteration of [`attention_host_ns`] does in C++.
#[derive(Clone, Copy)]
pub(crate) enum HostProbe {
    /// The launcher alone (validated and planned once, before the loop).
    Launch = 0,
    /// `flashcore::attention_forward`, the public C++ call: validate, plan, launch.
    PublicCall = 1,
    /// `flashcore::AttentionPlan::run` of the call's plan (made before the loop): this run's
    /// addresses checked, then the launcher.
    PlannedRun = 2,
}

/// `iters` iterations of `probe` on the call of [`attention`] from a C++ loop; returns host
/// nanoseconds per iteration.
pub(crate) fn attention_host_ns(
    request: &RequestFfi,
    device: &Device,
    stream: &RawStream,
    b: Operands<'_>,
    iters: i32,
    probe: HostProbe,
) -> Result<f64> {
    let (r, _, _) = with_addresses(request, b);
    let mut ns = 0.0;
    // SAFETY: as for `attention`; repeating the launch rewrites the same exclusively borrowed
    // output on one stream, in order.
    let status = unsafe {
        sys::attention_host_ns(
            &r,
            &caps(device),
            stream.ordinal,
            stream.handle,
            iters,
            probe as i32,
            &mut ns,
        )
    };
    super::check(status, &super::Described::Attention(&r))?;
    Ok(ns)
}

/// Runs the call through the public C++ API (`flashcore::attention_forward`), handing C++ only
/// the raw pointers and stream, as a C++ program would (interop tests).
pub(crate) fn cpp_attention_forward(
    request: &RequestFfi,
    stream: &RawStream,
    b: Operands<'_>,
) -> Result<Execution> {
    let (r, host_q, host_k) = with_addresses(request, b);
    // SAFETY: as for `attention`; the C++ API validates again from the raw values.
    let l =
        unsafe { sys::cpp_attention_forward(&r, host_q, host_k, stream.ordinal, stream.handle) };
    launched(l, &r)
}

impl RawBuffer {
    /// Wraps foreign device memory without taking ownership (never freed here).
    ///
    /// # Safety
    /// `ptr` must address `bytes` bytes of device memory of `stream`'s device that stay
    /// allocated while the value lives, with every other use ordered against `stream`.
    pub(crate) unsafe fn borrowed(
        stream: Arc<RawStream>,
        ptr: usize,
        bytes: usize,
        keepalive: Option<Keepalive>,
    ) -> Self {
        RawBuffer {
            memory: Arc::new(Memory {
                ptr,
                bytes,
                stream,
                owned: false,
                keepalive,
            }),
        }
    }

    /// Takes the foreign owner back out (the buffer then refers to memory it no longer keeps);
    /// `None` while a share of the buffer (a CUDA graph) still holds the memory.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    pub(crate) fn take_keepalive(&mut self) -> Option<Keepalive> {
        Arc::get_mut(&mut self.memory).and_then(|m| m.keepalive.take())
    }

    /// Puts back what [`RawBuffer::take_keepalive`] took.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    pub(crate) fn put_keepalive(&mut self, keepalive: Keepalive) {
        if let Some(m) = Arc::get_mut(&mut self.memory) {
            m.keepalive = Some(keepalive);
        }
    }
}

impl<T: Element> Tensor<T> {
    /// A tensor view over device memory that flashcore did not allocate (from C++, PyTorch,
    /// cudarc, ...), without copying it or taking ownership: flashcore never frees it.
    /// `shape` and `strides` are in elements, ordered like [`Shape::as_array`]; every access
    /// flashcore makes to the memory is enqueued on `stream` (or ordered after it with events).
    ///
    /// Checks what it can: `len * size_of::<T>()` must not overflow
    /// ([`Error::SizeOverflow`]) and the shape and strides must address at most `len` elements
    /// ([`crate::Error::StorageTooSmall`]). Attention calls check 16-byte alignment as for any tensor.
    ///
    /// # Safety
    /// - `ptr` points to device memory of `stream`'s device holding at least `len` elements of
    ///   `T` (or `len` is 0), allocated by any CUDA allocator in this process;
    /// - the memory stays allocated, and is not reused, while the tensor lives and until the
    ///   work flashcore enqueued on it has finished (synchronise `stream`, or order your own
    ///   stream after it, before freeing);
    /// - the caller's own accesses are ordered against `stream`: nothing else writes the memory
    ///   while flashcore may read it, and nothing else touches it while flashcore writes it
    ///   (as an attention output);
    /// - `stream` is the stream of the [`crate::Stream`] given (see [`crate::Stream::from_raw`]
    ///   for wrapping a foreign one).
    ///
    /// ```no_run
    /// # fn main() -> flashcore::Result<()> {
    /// use flashcore::{Device, Layout, Shape, Stream, Tensor};
    /// use half::f16;
    /// let device = Device::open(0)?;
    /// let stream = Stream::new(&device)?;
    /// # let raw_ptr: *mut f16 = std::ptr::null_mut();
    /// let shape = Shape::new(1, 512, 8, 64);
    /// // raw_ptr: 1 * 512 * 8 * 64 f16 allocated by C++ with cudaMalloc on device 0.
    /// let q = unsafe {
    ///     Tensor::from_raw_device(raw_ptr, shape.numel()?, shape, shape.strides(Layout::Bshd)?, &stream)
    /// }?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn from_raw_device(
        ptr: *mut T,
        len: usize,
        shape: Shape,
        strides: [usize; 4],
        stream: &crate::cuda::Stream,
    ) -> Result<Self> {
        // SAFETY: forwarded to the caller's contract above.
        unsafe { Self::from_borrowed(ptr as usize, len, shape, strides, stream, None) }
    }

    /// A tensor over `len` elements of foreign memory at `ptr`, kept alive by `keepalive` (if
    /// any) and never freed by flashcore.
    ///
    /// # Safety
    /// The contract of [`Tensor::from_raw_device`], where `keepalive` may be what keeps the
    /// memory allocated.
    pub(crate) unsafe fn from_borrowed(
        ptr: usize,
        len: usize,
        shape: Shape,
        strides: [usize; 4],
        stream: &crate::cuda::Stream,
        keepalive: Option<Keepalive>,
    ) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::SizeOverflow {
                shape: shape.as_array(),
                strides,
            })?;
        // SAFETY: forwarded to the caller's contract above.
        let raw = unsafe { RawBuffer::borrowed(Arc::clone(stream.raw()), ptr, bytes, keepalive) };
        let buffer = crate::cuda::DeviceBuffer::from_raw(raw, len, stream);
        Tensor::from_device(buffer, shape, strides)
    }
}

/// Device memory allocated and freed by C++ (`cudaMalloc` / `cudaFree` in
/// `cpp/src/bridge.cpp`): memory Rust did not allocate, for the interop tests and examples.
#[doc(hidden)]
#[derive(Debug)]
pub struct CppDeviceBuffer {
    ordinal: i32,
    ptr: usize,
    bytes: usize,
}

impl CppDeviceBuffer {
    /// Allocates `data.len()` elements on `device` from C++ and copies `data` in (synchronous).
    pub fn from_host<T: Element>(device: &Device, data: &[T]) -> Result<Self> {
        let ordinal = ordinal_i32(device.ordinal())?;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let ptr = sys::cpp_malloc(ordinal, bytes.len()).map_err(map_err)?;
        let buffer = CppDeviceBuffer {
            ordinal,
            ptr,
            bytes: bytes.len(),
        };
        // SAFETY: `ptr` holds `bytes.len()` bytes (just allocated); the copy is synchronous.
        unsafe { sys::cpp_upload(ordinal, ptr, bytes) }.map_err(map_err)?;
        Ok(buffer)
    }

    /// The device address.
    pub fn as_ptr<T>(&self) -> *mut T {
        self.ptr as *mut T
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for CppDeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `cpp_malloc` and freed once; `cudaFree` synchronises the device,
        // so queued work on the memory finishes first.
        let _ = unsafe { sys::cpp_free(self.ordinal, self.ptr) };
    }
}

impl crate::cuda::Stream {
    /// Wraps a `cudaStream_t` created elsewhere (by C++ code, PyTorch, cudarc, ...) without
    /// taking ownership; flashcore never destroys it.
    ///
    /// # Safety
    /// `raw` must be a valid stream of `device` (or null for the legacy default stream) and must
    /// outlive the returned `Stream`, its clones, and every tensor allocated on it.
    pub unsafe fn from_raw(
        device: &crate::cuda::Device,
        raw: *mut std::ffi::c_void,
    ) -> Result<Self> {
        // SAFETY: forwarded to the caller's contract above.
        let raw = unsafe { RawStream::borrowed(device.ordinal(), raw as usize, None) }?;
        Ok(Self::from_parts(device.clone(), Arc::new(raw)))
    }
}

/// A backward call: the forward call's description (its inputs' device addresses), the output
/// gradient's, and the gradients' buffers, borrowed exclusively for the call, with their
/// descriptions.
pub(crate) struct BackwardOperands<'a> {
    pub request: &'a RequestFfi,
    /// The host copies of a variable-length batch's offsets (empty: none), which C++
    /// validation checks against the token counts.
    pub hosts: crate::validate::Hosts<'a>,
    pub dout: DescFfi,
    pub grads: [(&'a mut RawBuffer, DescFfi); 3],
}

/// The backward pass through the public C++ API (`flashcore::attention_backward`) on `stream`:
/// the row of [`crate::plan::backward_tile_table`] that ran.
pub(crate) fn attention_backward(
    stream: &RawStream,
    b: BackwardOperands<'_>,
) -> Result<crate::plan::BackwardTileRow> {
    let [dq, dk, dv] = b.grads.map(|(buffer, mut d)| {
        d.address = buffer.ptr() as u64;
        d
    });
    let descs = [b.dout, dq, dk, dv];
    // SAFETY: every address is a live allocation of `stream`'s device: the inputs' tensors are
    // borrowed by the caller for this call, the gradients' buffers exclusively here; C++
    // validates (shapes, strides, places, overlaps, and a batch's offsets against their host
    // copies) before launching, and the kernels are ordered on `stream` before any later free
    // (the caller orders the other streams around it).
    let ran = unsafe {
        sys::attention_backward(
            b.request,
            b.hosts.0,
            b.hosts.1,
            &descs[0],
            &descs[1],
            &descs[2],
            &descs[3],
            stream.ordinal,
            stream.handle,
        )
    };
    super::check(ran.status, &super::Described::Backward(b.request, &descs))?;
    crate::plan::backward_row(ran.row)
        .ok_or_else(|| Error::Launch("the C++ backward planner named no row".into()))
}

/// The descriptions of a merge, with the device addresses of the borrowed tensors.
pub(crate) struct MergeOperands<'a> {
    pub outs: &'a [DescFfi],
    pub lses: &'a [DescFfi],
    pub out: &'a mut RawBuffer,
    pub out_desc: DescFfi,
    pub lse: Option<(&'a mut RawBuffer, DescFfi)>,
}

/// Merges states through the public C++ API (`flashcore::merge_states`) on `stream`.
pub(crate) fn merge_states(dtype: i32, stream: &RawStream, m: MergeOperands<'_>) -> Result<()> {
    let mut out = m.out_desc;
    out.address = m.out.ptr() as u64;
    let lse = m.lse.map(|(b, mut d)| {
        d.address = b.ptr() as u64;
        d
    });
    let described = super::Described::Merge {
        outs: m.outs,
        lses: m.lses,
        out: &out,
        lse: lse.as_ref().unwrap_or(&out),
    };
    // SAFETY: every address is a live allocation of `stream`'s device (the states' tensors are
    // borrowed by the caller for this call, the output and lse exclusively here), large enough
    // for the shapes and strides C++ validates again before launching; the kernel is ordered on
    // `stream` before any later free, and the caller orders the states' streams around it.
    let status = unsafe {
        sys::merge_states(
            dtype,
            m.outs,
            m.lses,
            &out,
            lse.as_ref().unwrap_or(&out),
            lse.is_some(),
            stream.ordinal,
            stream.handle,
        )
    };
    super::check(status, &described)
}
