//! CUDA graphs: planned calls and backward passes recorded once and replayed with one launch (a
//! serving step's layers, a training step's attention), holding every buffer they use.

use std::cell::Cell;
use std::marker::PhantomData;

use super::launch::{device_buffer, Recording};
use super::stream::Stream;
use crate::backward::GradientsMut;
use crate::dispatch::Batching;
use crate::dispatch::Execution;
use crate::element::AttentionElement;
use crate::error::Result;
use crate::ffi::cuda::{Keepalive, RawGraph, RawStream};
use crate::merge::AttentionState;
use crate::options::AttentionOptions;
use crate::prepared::AttentionPlan;
use crate::tensor::Tensor;
use crate::varlen::VarlenBatch;

/// Records [`AttentionPlan`] runs (and [`merge_states`](crate::merge_states) calls, and
/// backward passes: [`Capture::backward`]) into a CUDA graph, which [`Capture::finish`] turns
/// into a [`Graph`] that replays them all with one launch on `stream`.
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

    /// Records the backward pass ([`attention_backward_into`](crate::attention_backward_into))
    /// of a forward call: validated now, as that call validates it (a call that would run on
    /// the CPU, or on operands in different places, is refused alike), with every tensor on the
    /// capture's stream ([`crate::Error::GraphStream`] otherwise, naming the first elsewhere).
    /// A graph launch computes the gradients of the tensors' contents at that launch: a
    /// training step's forward and backward calls replayed with one launch. Each launch
    /// allocates dQ's f32 accumulator from the device's memory pool and frees it before the
    /// launch ends. Errors are as for [`Capture::run`].
    ///
    /// ```no_run
    /// # fn main() -> flashcore::Result<()> {
    /// use flashcore::{
    ///     AttentionOptions, AttentionPlan, AttentionState, Capture, Causal, Device, GradientsMut,
    ///     Layout, Stream, Tensor,
    /// };
    /// use half::bf16;
    /// let device = Device::open(0)?;
    /// let stream = Stream::new(&device)?;
    /// let dims = [2, 1024, 8, 128];
    /// let host = Tensor::full(bf16::from_f32(0.5), &dims, Layout::Bshd)?;
    /// let [q, k, v, dout] = [0; 4].map(|_| host.to_device(&stream));
    /// let (q, k, v, dout) = (q?, k?, v?, dout?);
    /// let new = || Tensor::<bf16>::uninit_on(&stream, &dims, Layout::Bshd);
    /// let (mut out, mut dq, mut dk, mut dv) = (new()?, new()?, new()?, new()?);
    /// let mut lse = Tensor::<f32>::uninit_on(&stream, &[2, 8, 1024, 1], Layout::Bhsd)?;
    /// let opts = AttentionOptions::default().causal(Causal::BottomRight).with_lse();
    /// let plan = AttentionPlan::new(&q, &k, &v, &out, Some(&lse), &opts)?;
    /// let mut capture = Capture::begin(&stream)?;
    /// capture.run(&plan, &q, &k, &v, &mut out, Some(&mut lse))?;
    /// let state = AttentionState { out: &out, lse: &lse };
    /// let grads = GradientsMut { dq: &mut dq, dk: &mut dk, dv: &mut dv };
    /// capture.backward(&q, &k, &v, state, &dout, grads, &opts)?;
    /// let step = capture.finish()?;
    /// step.launch()?; // the forward call, then its gradients, on `stream`
    /// stream.synchronize()?;
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)] // the forward call's operands, dout, the gradients
    pub fn backward<T: AttentionElement>(
        &mut self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        forward: AttentionState<'_, T>,
        dout: &Tensor<T>,
        grads: GradientsMut<'_, T>,
        opts: &AttentionOptions,
    ) -> Result<Execution> {
        self.record_backward([q, k, v], Batching::Dense, forward, dout, grads, opts)
    }

    /// [`Capture::backward`] over a variable-length batch
    /// ([`attention_varlen_backward_into`](crate::attention_varlen_backward_into)); the batch's
    /// offsets must be on the device, on the capture's stream.
    #[allow(clippy::too_many_arguments)] // the call's operands and batch, dout, the gradients
    pub fn varlen_backward<T: AttentionElement>(
        &mut self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        batch: &VarlenBatch,
        forward: AttentionState<'_, T>,
        dout: &Tensor<T>,
        grads: GradientsMut<'_, T>,
        opts: &AttentionOptions,
    ) -> Result<Execution> {
        let batching = Batching::Varlen(batch);
        self.record_backward([q, k, v], batching, forward, dout, grads, opts)
    }

    fn record_backward<T: AttentionElement>(
        &mut self,
        qkv: [&Tensor<T>; 3],
        batch: Batching<'_>,
        forward: AttentionState<'_, T>,
        dout: &Tensor<T>,
        grads: GradientsMut<'_, T>,
        opts: &AttentionOptions,
    ) -> Result<Execution> {
        let tensors = [qkv[0], qkv[1], qkv[2], forward.out, dout];
        let mut used: Vec<_> = tensors.iter().map(|t| memory(t)).collect();
        used.extend([
            memory(forward.lse),
            memory(grads.dq),
            memory(grads.dk),
            memory(grads.dv),
        ]);
        let ran =
            crate::backward::record(qkv, batch, forward, dout, grads, opts, self.recording())?;
        self.kept.extend(used.into_iter().flatten());
        // The device arrays the kernels read: a batch's offsets, ALiBi slopes, a bias.
        if let Batching::Varlen(b) = batch {
            self.kept.push(Box::new(b.clone()));
        }
        self.kept
            .push(Box::new((opts.alibi.clone(), opts.bias.clone())));
        self.calls += 1;
        Ok(ran)
    }

    /// How many calls (attention runs, merges and backward passes) were recorded so far.
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
