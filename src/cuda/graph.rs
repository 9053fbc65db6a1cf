//! CUDA graphs: planned calls recorded once and replayed with one launch (a serving step's
//! layers), holding every buffer they use.

use std::cell::Cell;
use std::marker::PhantomData;

use super::launch::{device_buffer, Recording};
use super::stream::Stream;
use crate::dispatch::Execution;
use crate::element::AttentionElement;
use crate::error::Result;
use crate::ffi::cuda::{Keepalive, RawGraph, RawStream};
use crate::merge::AttentionState;
use crate::prepared::AttentionPlan;
use crate::tensor::Tensor;

/// Records [`AttentionPlan`] runs (and [`merge_states`](crate::merge_states) calls) into a CUDA
/// graph, which [`Capture::finish`] turns into a [`Graph`] that replays them all with one launch
/// on `stream`.
///
/// Recording happens on a stream of the capture's own, so nothing else the program enqueues,
/// on `stream` or elsewhere, ends up in the graph, and nothing runs while recording. Every
/// operand of a recorded call (and every device array of its plan: offsets, page table,
/// slopes, bias) must live on `stream` ([`crate::Error::GraphStream`] otherwise, before
/// anything is recorded): the graph is launched there, after the work enqueued before it,
/// and the work enqueued after it waits for it, as for any call on that stream.
///
/// The graph holds the memory of every tensor it uses (and its plans), so dropping a tensor
/// while a graph uses it is safe: the memory is freed once the graph is dropped, after its
/// launches. Replays read and write the tensors' current contents: refill the inputs between
/// launches with any work ordered on `stream`.
///
/// ```no_run
/// # fn main() -> flashcore::Result<()> {
/// use flashcore::{AttentionOptions, AttentionPlan, Capture, Causal, Device, Layout, Stream, Tensor};
/// use half::bf16;
/// let device = Device::open(0)?;
/// let stream = Stream::new(&device)?;
/// let dims = [1, 1024, 8, 128];
/// let host = Tensor::full(bf16::from_f32(0.5), &dims, Layout::Bshd)?;
/// let (q, k, v) = (host.to_device(&stream)?, host.to_device(&stream)?, host.to_device(&stream)?);
/// let mut outs: Vec<Tensor<bf16>> = (0..4)
///     .map(|_| Tensor::uninit_on(&stream, &dims, Layout::Bshd))
///     .collect::<flashcore::Result<_>>()?;
/// let opts = AttentionOptions::default().causal(Causal::BottomRight);
/// let plan = AttentionPlan::new(&q, &k, &v, &outs[0], None, &opts)?;
/// let mut capture = Capture::begin(&stream)?;
/// for out in &mut outs {
///     capture.run(&plan, &q, &k, &v, out, None)?; // recorded, not run
/// }
/// let graph = capture.finish()?;
/// for _step in 0..3 {
///     graph.launch()?; // the four calls, in order, on `stream`
/// }
/// stream.synchronize()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Capture {
    target: Stream,
    recorder: RawStream,
    kept: Vec<Keepalive>,
    calls: usize,
    ended: bool,
}

impl Capture {
    /// Starts recording a graph to be launched on `stream`.
    pub fn begin(stream: &Stream) -> Result<Capture> {
        let recorder = RawStream::create(stream.ordinal())?;
        recorder.begin_capture()?;
        Ok(Capture {
            target: stream.clone(),
            recorder,
            kept: Vec::new(),
            calls: 0,
            ended: false,
        })
    }

    /// Records `plan`'s run on these operands (checked as [`AttentionPlan::run`] checks them,
    /// and all on the capture's stream): a graph launch will run it, in the order recorded.
    /// A refused operand records nothing, and the capture goes on; a CUDA error may invalidate
    /// the capture, which [`Capture::finish`] then reports.
    pub fn run<T: AttentionElement>(
        &mut self,
        plan: &AttentionPlan<T>,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        out: &mut Tensor<T>,
        lse: Option<&mut Tensor<f32>>,
    ) -> Result<Execution> {
        let lse_memory = lse.as_deref().and_then(memory);
        let used = [memory(q), memory(k), memory(v), memory(out), lse_memory];
        let ran = plan.record(q, k, v, out, lse, self.recording())?;
        self.kept.extend(used.into_iter().flatten());
        // The plan holds its offsets, page table, slopes and bias.
        self.kept.push(Box::new(plan.clone()));
        self.calls += 1;
        Ok(ran)
    }

    /// Records [`merge_states`](crate::merge_states) of `states` into `out` (and `lse`),
    /// validated as that call validates them, with every tensor on the capture's stream
    /// ([`crate::Error::GraphStream`] otherwise): cascade attention's prefix and suffix states,
    /// or a ring step's, merged inside the graph. A merge without rows records nothing; errors
    /// are as for [`Capture::run`].
    pub fn merge_states<T: AttentionElement>(
        &mut self,
        states: &[AttentionState<'_, T>],
        out: &mut Tensor<T>,
        lse: Option<&mut Tensor<f32>>,
    ) -> Result<()> {
        let mut used: Vec<_> = states
            .iter()
            .flat_map(|s| [memory(s.out), memory(s.lse)])
            .collect();
        used.extend([memory(out), lse.as_deref().and_then(memory)]);
        if crate::merge::record(states, out, lse, self.recording())? {
            self.kept.extend(used.into_iter().flatten());
            self.calls += 1;
        }
        Ok(())
    }

    /// How many calls (attention runs and merges) were recorded so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn recording(&self) -> Recording<'_> {
        Recording {
            target: &self.target,
            capture: &self.recorder,
        }
    }

    /// Ends the recording and makes the graph ([`crate::Error::Cuda`] where CUDA invalidated
    /// the capture).
    pub fn finish(mut self) -> Result<Graph> {
        self.ended = true;
        let raw = self.recorder.end_capture()?;
        Ok(Graph {
            raw,
            stream: self.target.clone(),
            calls: self.calls,
            _kept: std::mem::take(&mut self.kept),
            _not_sync: PhantomData,
        })
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if !self.ended {
            // A capture left unfinished (an error, a panic): end it and discard what it holds.
            let _ = self.recorder.end_capture();
        }
    }
}

/// The memory behind a device tensor, shared (a host tensor never reaches a recorded call).
fn memory<T: crate::Element>(t: &Tensor<T>) -> Option<Keepalive> {
    device_buffer(t).ok().map(|b| b.share())
}

/// Recorded calls ([`Capture`]), replayed by [`Graph::launch`] on the stream they were recorded
/// for, with the graph's own launch cost instead of one per call.
///
/// `Send` but not `Sync`: CUDA requires the launches of one executable graph to be serialised,
/// so a graph is used from one thread at a time (move it, or share it behind a `Mutex`).
///
/// ```compile_fail
/// fn shared_by_threads<T: Sync>() {}
/// shared_by_threads::<flashcore::Graph>();
/// ```
#[derive(Debug)]
pub struct Graph {
    raw: RawGraph,
    stream: Stream,
    calls: usize,
    /// The memory of every tensor and plan the calls use: freed after the graph is destroyed
    /// (and its launches, ordered on `stream`, are done). Declared after `raw`, so dropped after.
    _kept: Vec<Keepalive>,
    _not_sync: PhantomData<Cell<()>>,
}

impl Graph {
    /// Enqueues every recorded call on the graph's stream, in the order recorded. Faults in
    /// the kernels surface at the next synchronisation, as for any call.
    pub fn launch(&self) -> Result<()> {
        self.raw.launch(self.stream.raw())
    }

    /// The stream the graph is launched on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// How many calls a launch runs.
    pub fn calls(&self) -> usize {
        self.calls
    }
}
