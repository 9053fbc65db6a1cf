//! The CUDA runtime side: devices, streams, events, device memory and the kernel launchers.

mod device;
mod event;
mod graph;
#[doc(hidden)]
pub mod interop;
pub(crate) mod launch;
mod memory;
mod pool;
mod stream;

pub use device::Device;
pub use event::Event;
pub use graph::{Capture, Graph};
pub(crate) use memory::DeviceBuffer;
pub use pool::PoolUsage;
pub use stream::Stream;
