//! Shared by the criterion bench (`benches/attention.rs`) and the bench CLI
//! (`examples/bench.rs`): the shape list, FLOP counts, and CUDA-event timing with rotated inputs.
#![allow(dead_code)]

#[path = "../../tests/common/mod.rs"]
mod random;

use flashcore::plan::ArchClass;
use flashcore::{
    attention_into, AttentionElement, AttentionOptions, Backend, Causal, Device, Event, Execution,
    Layout, Result, Stream, Tensor,
};
use random::{randn, Rng};
use std::sync::OnceLock;

/// One benchmark problem (BHSD layout, like PyTorch).
#[derive(Debug, Clone, Copy)]
pub struct BenchShape {
    pub group: &'static str,
    pub b: usize,
    pub h: usize,
    pub hk: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub causal: bool,
}

impl BenchShape {
    pub fn name(&self) -> String {
        let heads = if self.hk == self.h {
            format!("{}", self.h)
        } else {
            format!("{}kv{}", self.h, self.hk)
        };
        let seq = if self.sq == self.sk {
            format!("{}", self.sq)
        } else {
            format!("{}q{}k", self.sq, self.sk)
        };
        format!(
            "{}x{}x{}x{}{}",
            self.b,
            heads,
            seq,
            self.d,
            if self.causal { "-causal" } else { "" }
        )
    }

    /// 4·B·H·Sq·Sk·D, halved for causal.
    pub fn flops(&self) -> f64 {
        let f = 4.0 * (self.b * self.h * self.sq * self.sk * self.d) as f64;
        if self.causal {
            f / 2.0
        } else {
            f
        }
    }

    /// Bytes of Q, K, V and the output (2-byte elements).
    pub fn bytes(&self) -> usize {
        2 * (2 * self.b * self.h * self.sq * self.d + 2 * self.b * self.hk * self.sk * self.d)
    }
}

/// `[b, h, hk, sq, sk, d]`.
const fn s(group: &'static str, [b, h, hk, sq, sk, d]: [usize; 6], causal: bool) -> BenchShape {
    BenchShape {
        group,
        b,
        h,
        hk,
        sq,
        sk,
        d,
        causal,
    }
}

/// The named shape list of the bench issue.
pub fn shapes() -> Vec<BenchShape> {
    let mut v = vec![
        s("seed", [1, 8, 8, 512, 512, 64], false),
        s("seed", [4, 8, 8, 256, 256, 64], false),
        s("seed", [1, 8, 8, 1024, 1024, 64], false),
    ];
    for (b, h, n, d) in [
        (8, 32, 2048, 64),
        (2, 32, 8192, 64),
        (8, 16, 2048, 128),
        (2, 16, 8192, 128),
    ] {
        v.push(s("throughput", [b, h, h, n, n, d], false));
        v.push(s("throughput", [b, h, h, n, n, d], true));
    }
    v.push(s("throughput", [4, 8, 8, 4096, 4096, 256], false));
    v.push(s("gqa", [4, 32, 8, 4096, 4096, 128], true));
    v.push(s("decode", [32, 32, 8, 1, 4096, 128], false));
    // The serving decode shapes of issue 12 (contiguous K/V): one long sequence, a mid batch, a
    // wide batch.
    v.push(s("decode", [1, 32, 8, 1, 32768, 128], false));
    v.push(s("decode", [16, 32, 8, 1, 8192, 128], false));
    v.push(s("decode", [64, 32, 8, 1, 2048, 128], false));
    // Half the H200's SMs' worth of units: where Auto's split-KV WMMA meets the Hopper kernel.
    v.push(s("decode", [8, 32, 8, 1, 8192, 128], false));
    // Wider batches of the same bytes as 64 x 2k: where the Hopper kernel's walk (up to 256
    // sequences) meets CUTLASS's decode row; and heads that do not pack (MHA).
    v.push(s("decode", [128, 32, 8, 1, 1024, 128], false));
    v.push(s("decode", [256, 32, 8, 1, 512, 128], false));
    v.push(s("decode", [512, 32, 8, 1, 256, 128], false));
    v.push(s("decode", [32, 32, 32, 1, 2048, 128], false));
    v
}

/// Several input sets whose total size exceeds 3x the L2 cache, so rotating through them keeps
/// each call's inputs out of L2 (the inputs of large shapes exceed it by themselves).
pub struct Inputs<T: AttentionElement> {
    sets: Vec<[Tensor<T>; 3]>,
    out: Tensor<T>,
    opts: AttentionOptions,
}

/// A device tensor of `dims` in `layout`'s order, standard-normal values from a fresh generator:
/// the bench CLI's extra rows (constant inputs make the matrix products cheaper than real data).
pub fn random_on<T: flashcore::Element>(
    stream: &Stream,
    dims: &[usize],
    layout: Layout,
) -> Result<Tensor<T>> {
    randn::<T>(&mut Rng::fresh(), dims, layout).to_device(stream)
}

/// A device tensor of standard-normal values (the tests' generator, never zeros).
fn fill<T: AttentionElement>(
    stream: &Stream,
    dims: [usize; 4],
    rng: &mut Rng,
) -> Result<Tensor<T>> {
    randn::<T>(rng, &dims, Layout::Bhsd).to_device(stream)
}

impl<T: AttentionElement> Inputs<T> {
    /// Inputs for `s` run by `backend`; `force` selects another class's tile-table row.
    pub fn new(
        stream: &Stream,
        s: &BenchShape,
        backend: Backend,
        force: Option<ArchClass>,
    ) -> Result<Self> {
        let l2 = stream.device().l2_cache_bytes().max(1);
        let n = (3 * l2).div_ceil(s.bytes().max(1)).clamp(1, 16);
        let mut sets = Vec::with_capacity(n);
        let mut rng = Rng::fresh();
        for _ in 0..n {
            sets.push([
                fill(stream, [s.b, s.h, s.sq, s.d], &mut rng)?,
                fill(stream, [s.b, s.hk, s.sk, s.d], &mut rng)?,
                fill(stream, [s.b, s.hk, s.sk, s.d], &mut rng)?,
            ]);
        }
        let out = Tensor::uninit_on(stream, &[s.b, s.h, s.sq, s.d], Layout::Bhsd)?;
        let causal = if s.causal {
            Causal::BottomRight
        } else {
            Causal::None
        };
        let opts = AttentionOptions {
            force_arch_class: force,
            ..AttentionOptions::default().causal(causal).backend(backend)
        };
        Ok(Inputs { sets, out, opts })
    }

    /// Switches the backend that later calls run (the inputs are reused).
    pub fn set_backend(&mut self, backend: Backend) {
        self.opts.backend = backend;
    }

    /// Runs call number `i` (rotating input sets); returns what ran.
    pub fn call(&mut self, i: usize) -> Result<Execution> {
        let [q, k, v] = &self.sets[i % self.sets.len()];
        attention_into(q, k, v, &mut self.out, None, &self.opts)
    }
}

/// Per-call device times in microseconds of the inputs' calls, as [`time_fn`] takes them.
pub fn time_calls<T: AttentionElement>(
    stream: &Stream,
    inputs: &mut Inputs<T>,
    warmup: usize,
    iters: usize,
) -> Result<Vec<f64>> {
    time_fn(stream, warmup, iters, |i| inputs.call(i).map(|_| ()))
}

/// Device time of the untimed calls before the timed ones (milliseconds): 25, that of triton's
/// `do_bench`, which times torch (torch_sdpa.py), unless the environment variable
/// `FLASHCORE_BENCH_WARM_MS` gives another (torch_sdpa.py reads it too). A warm-up of a second or
/// more brings the GPU to the clock it holds under its power cap, whatever ran or idled before
/// the call: our rows follow seconds of input generation on the host, torch's follow each other.
/// Panics on a value that is not a number of milliseconds (a bench's setting, not an API).
pub fn warm_ms() -> f32 {
    static WARM_MS: OnceLock<f32> = OnceLock::new();
    *WARM_MS.get_or_init(|| match std::env::var("FLASHCORE_BENCH_WARM_MS") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|ms: &f32| ms.is_finite() && *ms >= 0.0)
            .unwrap_or_else(|| panic!("FLASHCORE_BENCH_WARM_MS={v:?}: not milliseconds")),
        Err(_) => 25.0,
    })
}
/// The least device time the timed calls fill: do_bench's.
pub const TIMED_MS: f32 = 100.0;
/// The most timed calls of one measurement (calls of a few microseconds do not slow the clock).
const MAX_TIMED: usize = 2000;
/// Bytes that `do_bench` writes before each timed call to clear the L2 (ours copies half as many
/// device to device: the same traffic).
const FLUSH_BYTES: usize = 256 << 20;

/// Per-call device times in microseconds of `call(i)` (which enqueues on `stream`), taken as
/// triton's `do_bench` takes torch's: with a `warmup` (> 0), at least `warmup` untimed calls and
/// [`warm_ms()`] of device time, then at least `iters` timed calls and enough to fill [`TIMED_MS`]
/// (at most 2000), each after 256 MiB of memory traffic that clears the L2, and each between two
/// CUDA events. The flush matters beyond the L2: its tens of microseconds without tensor work keep
/// an H200 under its power cap, where back-to-back calls lower its SM clock within tens of
/// milliseconds (docs/PERFORMANCE.md). Without a warm-up (criterion warms up itself): `iters`
/// calls back to back.
pub fn time_fn(
    stream: &Stream,
    warmup: usize,
    iters: usize,
    mut call: impl FnMut(usize) -> Result<()>,
) -> Result<Vec<f64>> {
    let device: &Device = stream.device();
    let events: Vec<(Event, Event)> = (0..MAX_TIMED.max(iters))
        .map(|_| Ok((Event::new(device)?, Event::new(device)?)))
        .collect::<Result<_>>()?;
    let (mut done, mut spent, mut chunk) = (0, 0.0, warmup.max(1));
    let warm_ms = warm_ms();
    while warmup > 0 && (done < warmup || spent < warm_ms) {
        let (start, end) = &events[0];
        start.record(stream)?;
        for _ in 0..chunk {
            call(done)?;
            done += 1;
        }
        end.record(stream)?;
        spent += start.elapsed_ms(end)?;
        chunk = (chunk * 2).min(1 << 12);
    }
    // do_bench's protocol where there was a warm-up: enough calls to fill TIMED_MS at the
    // warm-up's pace, each after a flush; else `iters` calls back to back.
    let (flush, timed) = if warmup > 0 {
        let elements = FLUSH_BYTES / 2 / std::mem::size_of::<f32>();
        let scratch = Tensor::<f32>::uninit_on(stream, &[1, 1, elements, 1], Layout::Bhsd)?;
        let per_call = spent / done as f32;
        let timed = iters.max(((TIMED_MS / per_call).ceil() as usize).min(MAX_TIMED));
        (Some(scratch), timed)
    } else {
        (None, iters)
    };
    for (i, (start, end)) in events[..timed].iter().enumerate() {
        if let Some(scratch) = &flush {
            drop(scratch.to_device(stream)?);
        }
        start.record(stream)?;
        call(done + i)?;
        end.record(stream)?;
    }
    events[..timed]
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(|ms| f64::from(ms) * 1e3))
        .collect()
}

/// (median, p10, p90) of `xs`.
pub fn percentiles(xs: &mut [f64]) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let at = |p: f64| xs[((xs.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}
