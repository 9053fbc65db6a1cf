//! Interop hooks for the tests and examples that exercise the C++ side from Rust: memory that
//! C++ allocated ([`CppDeviceBuffer`]), and the public C++ API called on Rust tensors' memory
//! ([`cpp_attention_forward`]). Hidden from the docs: applications use the safe API, plus
//! [`crate::Tensor::from_raw_device`] and [`crate::Stream::from_raw`] for foreign memory.

use super::launch::{run, Entry};
use crate::dispatch::{Batching, Call, Execution};
use crate::element::AttentionElement;
use crate::error::Result;
use crate::options::AttentionOptions;
use crate::paged::PageTable;
use crate::tensor::Tensor;
use crate::varlen::VarlenBatch;

pub use crate::ffi::cuda::CppDeviceBuffer;

/// Runs attention on the memory of Rust device tensors through the public C++ API
/// (`flashcore::attention_forward`, cpp/include/flashcore/flashcore.h): C++ receives only raw
/// pointers, shapes, strides and the raw `cudaStream_t` of `out`, validates them itself and
/// launches. Stream ordering with the inputs' streams is done as for [`crate::attention_into`].
pub fn cpp_attention_forward<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    opts: &AttentionOptions,
) -> Result<Execution> {
    let (request, call) = Call::new([q, k, v], Batching::Dense, out, lse, opts)?;
    run(Entry::PublicCpp { host_copies: false }, &request, call)
}

/// [`cpp_attention_forward`] for a variable-length batch (`flashcore::Sequences`), whose device
/// offsets C++ receives as raw pointers, with the host copies only when `host_offsets` (without
/// them C++ cannot check the contents, and the kernel must still stay inside the buffers).
#[allow(clippy::too_many_arguments)] // the operands of one call plus the switch under test
pub fn cpp_attention_varlen<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    batch: &VarlenBatch,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    opts: &AttentionOptions,
    host_offsets: bool,
) -> Result<Execution> {
    let (request, call) = Call::new([q, k, v], Batching::Varlen(batch), out, lse, opts)?;
    let entry = Entry::PublicCpp {
        host_copies: host_offsets,
    };
    run(entry, &request, call)
}

/// [`cpp_attention_forward`] over a paged KV cache (`flashcore::Pages`), whose device block table
/// and key counts C++ receives as raw pointers, with the host copies only when `host_copies`
/// (without them C++ cannot check the contents, and the kernel must still stay inside the
/// buffers).
#[allow(clippy::too_many_arguments)] // the operands of one call plus the switch under test
pub fn cpp_attention_paged<T: AttentionElement>(
    q: &Tensor<T>,
    k_cache: &Tensor<T>,
    v_cache: &Tensor<T>,
    pages: &PageTable,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    opts: &AttentionOptions,
    host_copies: bool,
) -> Result<Execution> {
    let qkv = [q, k_cache, v_cache];
    let (request, call) = Call::new(qkv, Batching::Paged(pages), out, lse, opts)?;
    run(Entry::PublicCpp { host_copies }, &request, call)
}
