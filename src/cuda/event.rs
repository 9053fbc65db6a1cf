//! CUDA events, for ordering streams and timing.

use super::device::Device;
use super::stream::Stream;
use crate::error::{Error, Result};
use crate::ffi::cuda::RawEvent;

/// A CUDA event with timing enabled.
///
/// ```no_run
/// # fn main() -> flashcore::Result<()> {
/// use flashcore::{Device, Event, Stream};
/// let device = Device::open(0)?;
/// let stream = Stream::new(&device)?;
/// let (start, end) = (Event::new(&device)?, Event::new(&device)?);
/// start.record(&stream)?;
/// // ... enqueue work on `stream` ...
/// end.record(&stream)?;
/// println!("{} ms", start.elapsed_ms(&end)?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Event {
    raw: RawEvent,
}

impl Event {
    /// Creates an event on `device`.
    pub fn new(device: &Device) -> Result<Event> {
        Ok(Event {
            raw: RawEvent::create(device.ordinal())?,
        })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        if stream.ordinal() != self.raw.ordinal() {
            return Err(Error::NoDevice {
                ordinal: stream.ordinal(),
                reason: format!("event belongs to cuda:{}", self.raw.ordinal()),
            });
        }
        self.raw.record(stream.raw())
    }

    /// Waits until the recorded work is complete.
    pub fn synchronize(&self) -> Result<()> {
        self.raw.synchronize()
    }

    /// Milliseconds from `self` to `end`; waits for `end` first.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        end.synchronize()?;
        self.raw.elapsed_ms(&end.raw)
    }
}
