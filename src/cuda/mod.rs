//! The CUDA runtime side: devices, streams, events, device memory and the kernel launchers.

mod device;
mod event;
#[doc(hidden)]
pub mod interop;
pub(crate) mod launch;
mod memory;
mod stream;

pub use device::Device;
pub use event::Event;
pub(crate) use memory::DeviceBuffer;
pub use stream::Stream;
