//! The FFI layer: the cxx bridge to `cpp/src/bridge.cpp` and the owning handles built on it.
//!
//! This is the only module with `unsafe`. Each raw handle here (stream, event, device buffer)
//! upholds one invariant that makes its methods safe to call: the handle was created by the
//! CUDA runtime on `ordinal`, is owned (or, for borrowed streams, outlived) by the value, and is
//! destroyed at most once, in `Drop`.

use std::sync::Arc;

use crate::error::{Error, Result};

#[cxx::bridge(namespace = "flashcore::bridge")]
mod sys {
    /// Device properties read once when a device is opened.
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

    /// One attention launch; mirrors `flashcore::FmhaArgs` (cpp/include/flashcore/fmha.h).
    struct FmhaCall {
        /// 0: CUTLASS example 41; 1: the WMMA kernel.
        kernel: i32,
        ordinal: i32,
        stream: usize,
        dtype: i32,
        q: usize,
        k: usize,
        v: usize,
        out: usize,
        lse: usize,
        batch: i64,
        seq_q: i64,
        seq_k: i64,
        heads_q: i64,
        heads_kv: i64,
        head_dim: i64,
        q_stride: [i64; 3],
        k_stride: [i64; 3],
        v_stride: [i64; 3],
        o_stride: [i64; 3],
        scale: f32,
        causal: i32,
        tile_q: i32,
        tile_k: i32,
        tile_d: i32,
    }

    unsafe extern "C++" {
        include!("flashcore/cpp/src/bridge.h");

        fn device_count() -> Result<i32>;
        fn device_info(ordinal: i32) -> Result<DeviceInfo>;
        fn retain_pool_memory(ordinal: i32) -> Result<()>;

        fn stream_create(ordinal: i32) -> Result<usize>;
        unsafe fn stream_destroy(ordinal: i32, stream: usize) -> Result<()>;
        unsafe fn stream_synchronize(ordinal: i32, stream: usize) -> Result<()>;
        unsafe fn stream_wait_event(ordinal: i32, stream: usize, event: usize) -> Result<()>;

        fn event_create(ordinal: i32) -> Result<usize>;
        unsafe fn event_destroy(ordinal: i32, event: usize) -> Result<()>;
        unsafe fn event_record(ordinal: i32, event: usize, stream: usize) -> Result<()>;
        unsafe fn event_synchronize(ordinal: i32, event: usize) -> Result<()>;
        unsafe fn event_elapsed_ms(ordinal: i32, start: usize, end: usize) -> Result<f32>;

        unsafe fn malloc_async(ordinal: i32, bytes: usize, stream: usize) -> Result<usize>;
        unsafe fn free_async(ordinal: i32, ptr: usize, stream: usize) -> Result<()>;
        unsafe fn copy_to_device(ordinal: i32, dst: usize, src: &[u8], stream: usize)
            -> Result<()>;
        unsafe fn copy_to_host(
            ordinal: i32,
            dst: &mut [u8],
            src: usize,
            stream: usize,
        ) -> Result<()>;
        unsafe fn copy_device(
            ordinal: i32,
            dst: usize,
            src: usize,
            bytes: usize,
            stream: usize,
        ) -> Result<()>;

        unsafe fn fmha(call: &FmhaCall) -> Result<()>;
        unsafe fn fmha_host_ns(call: &FmhaCall, iters: i32) -> Result<f64>;
    }
}

pub(crate) use sys::{DeviceInfo, FmhaCall};

/// Turns the C++ layer's `"kind|cuda_name|message"` exceptions into typed errors.
fn map_err(e: cxx::Exception) -> Error {
    let mut parts = e.what().splitn(3, '|');
    let (kind, name, message) = (parts.next(), parts.next(), parts.next());
    match (kind, name, message) {
        (Some("0"), Some(name), Some(message)) => Error::Cuda {
            name: name.to_owned(),
            message: message.to_owned(),
        },
        (Some(_), Some(_), Some(message)) => Error::Launch(message.to_owned()),
        _ => Error::Launch(e.what().to_owned()),
    }
}

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

/// A CUDA stream: created and destroyed by us, or borrowed from the caller.
#[derive(Debug)]
pub(crate) struct RawStream {
    ordinal: i32,
    handle: usize,
    owned: bool,
}

impl RawStream {
    pub(crate) fn create(ordinal: usize) -> Result<Self> {
        let ordinal = ordinal_i32(ordinal)?;
        let handle = sys::stream_create(ordinal).map_err(map_err)?;
        Ok(RawStream {
            ordinal,
            handle,
            owned: true,
        })
    }

    /// Wraps a caller's `cudaStream_t` without taking ownership.
    ///
    /// # Safety
    /// `handle` must be a valid stream of device `ordinal` (or null, the legacy default stream)
    /// and must stay valid for as long as the returned value or any tensor using it lives.
    pub(crate) unsafe fn borrowed(ordinal: usize, handle: usize) -> Result<Self> {
        Ok(RawStream {
            ordinal: ordinal_i32(ordinal)?,
            handle,
            owned: false,
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
/// ordered against this buffer's stream with events (see `cuda::launch`), so the free in `Drop`
/// never overtakes a use.
#[derive(Debug)]
pub(crate) struct RawBuffer {
    ptr: usize,
    bytes: usize,
    stream: Arc<RawStream>,
}

impl RawBuffer {
    pub(crate) fn alloc(stream: Arc<RawStream>, bytes: usize) -> Result<Self> {
        let ptr = if bytes == 0 {
            0
        } else {
            // SAFETY: the stream is live; the returned pointer is owned by this value.
            unsafe { sys::malloc_async(stream.ordinal, bytes, stream.handle) }.map_err(map_err)?
        };
        Ok(RawBuffer { ptr, bytes, stream })
    }

    pub(crate) fn ptr(&self) -> usize {
        self.ptr
    }

    /// Copies `src` into the start of the buffer (enqueued on the buffer's stream).
    pub(crate) fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        assert!(src.len() <= self.bytes, "copy_from_host beyond the buffer");
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: `src.len()` bytes fit the allocation (checked above); the C++ side returns
        // only after the pageable source has been staged, so `src` may be released afterwards.
        unsafe { sys::copy_to_device(self.stream.ordinal, self.ptr, src, self.stream.handle) }
            .map_err(map_err)
    }

    /// Copies the start of the buffer into `dst`, waiting for the copy (and earlier work).
    pub(crate) fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        assert!(dst.len() <= self.bytes, "copy_to_host beyond the buffer");
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst.len()` bytes fit the allocation; the C++ side synchronises the stream
        // before returning, so the device never writes `dst` after its borrow ends.
        unsafe { sys::copy_to_host(self.stream.ordinal, dst, self.ptr, self.stream.handle) }
            .map_err(map_err)
    }

    /// Copies all of `src` into the start of `self`, on `self`'s stream.
    pub(crate) fn copy_from_device(&mut self, src: &RawBuffer) -> Result<()> {
        assert!(
            src.bytes <= self.bytes,
            "copy_from_device beyond the buffer"
        );
        if src.bytes == 0 {
            return Ok(());
        }
        // SAFETY: both allocations are live and large enough; the caller ordered `src`'s stream
        // before this one (same stream, or an event wait).
        unsafe {
            sys::copy_device(
                self.stream.ordinal,
                self.ptr,
                src.ptr,
                src.bytes,
                self.stream.handle,
            )
        }
        .map_err(map_err)
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: we allocated the pointer and free it once, stream-ordered after every use
            // enqueued on (or ordered before) this stream.
            let _ = unsafe { sys::free_async(self.stream.ordinal, self.ptr, self.stream.handle) };
        }
    }
}

/// The operands of one launch. Shapes and strides in `call` were validated against each
/// buffer's length (`Tensor` construction and `validate`), so every address the kernel forms lies
/// inside these allocations.
pub(crate) struct FmhaBuffers<'a> {
    pub q: &'a RawBuffer,
    pub k: &'a RawBuffer,
    pub v: &'a RawBuffer,
    pub out: &'a mut RawBuffer,
    pub lse: Option<&'a mut RawBuffer>,
}

fn fill_pointers(call: &mut FmhaCall, stream: &RawStream, b: FmhaBuffers<'_>) {
    call.ordinal = stream.ordinal;
    call.stream = stream.handle;
    call.q = b.q.ptr;
    call.k = b.k.ptr;
    call.v = b.v.ptr;
    call.out = b.out.ptr;
    call.lse = b.lse.map_or(0, |l| l.ptr);
}

/// Enqueues `call.kernel` on `stream`; `call`'s pointer fields are filled here.
///
/// The caller (`cuda::launch`) orders every buffer's stream before `stream` and after the
/// launch, so no free or copy on another stream overtakes the kernel.
pub(crate) fn fmha(mut call: FmhaCall, stream: &RawStream, b: FmhaBuffers<'_>) -> Result<()> {
    fill_pointers(&mut call, stream, b);
    // SAFETY: the pointers are live allocations of `stream`'s device, large enough for the
    // validated shapes and strides; `out` and `lse` are exclusively borrowed; stream ordering
    // is the caller's (see above). The C++ launcher only reads `call`.
    unsafe { sys::fmha(&call) }.map_err(map_err)
}

/// Like [`fmha`], `iters` times from a C++ loop; returns host nanoseconds per launch.
pub(crate) fn fmha_host_ns(
    mut call: FmhaCall,
    stream: &RawStream,
    b: FmhaBuffers<'_>,
    iters: i32,
) -> Result<f64> {
    fill_pointers(&mut call, stream, b);
    // SAFETY: as for `fmha`; repeating the launch rewrites the same exclusively borrowed
    // output on one stream, in order.
    unsafe { sys::fmha_host_ns(&call, iters) }.map_err(map_err)
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
        let raw = unsafe { RawStream::borrowed(device.ordinal(), raw as usize) }?;
        Ok(Self::from_parts(device.clone(), Arc::new(raw)))
    }
}
