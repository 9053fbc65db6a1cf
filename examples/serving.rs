//! One decode step of a serving engine: every layer keeps its K and V in a paged cache, the batch
//! holds sequences of different lengths, and the step plans attention once and runs the plan for
//! each layer. Runs on the GPU when one is present, else on the CPU; checks every layer's output
//! against the float64 CPU reference and prints the time per layer (on a GPU also the host's
//! time to enqueue a layer, which shows whether the host or the GPU bounds the step). On a GPU
//! the step is then recorded once into a CUDA graph (`Capture`), which replays every layer with
//! one launch; its outputs are checked and its time per layer printed too.
//!
//! `cargo run --release --example serving -- [--layers N]` (default 32 on a GPU, 2 on the CPU).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{logical, randn, rel_l2, Rng};
use flashcore::{
    attention_paged, AttentionOptions, AttentionPlan, Backend, Causal, Layout, PageTable, Tensor,
};
use half::bf16;

const PAGE_SIZE: usize = 16;
const HEADS_Q: usize = 32;
const HEADS_KV: usize = 8;
const HEAD_DIM: usize = 128;
/// The keys each sequence of the batch has cached (its new token's included).
const LENGTHS: [usize; 6] = [1000, 37, 513, 2048, 1, 300];

/// One layer's inputs for this step: its query (one token per sequence) and its two caches.
struct Layer {
    q: Tensor<bf16>,
    k_cache: Tensor<bf16>,
    v_cache: Tensor<bf16>,
}

/// A block table that hands out the pages of a pool of `num_pages` in shuffled order, as a
/// cache allocator that has run for a while would.
fn page_table(num_pages: usize, rng: &mut Rng) -> flashcore::Result<PageTable> {
    let mut pool: Vec<i32> = (0..num_pages as i32).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, (rng.uniform() * (i + 1) as f64) as usize % (i + 1));
    }
    let mut free = pool.into_iter();
    let block_table = LENGTHS
        .iter()
        .map(|&keys| free.by_ref().take(keys.div_ceil(PAGE_SIZE)).collect())
        .collect();
    let seqlens = LENGTHS.iter().map(|&keys| keys as i32).collect();
    PageTable::new(PAGE_SIZE, block_table, seqlens)
}

fn main() -> flashcore::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut layers = None;
    while let Some(a) = args.next() {
        match (
            a.as_str(),
            args.next().and_then(|n| n.parse::<usize>().ok()),
        ) {
            ("--layers", Some(n)) if n > 0 => layers = Some(n),
            _ => {
                eprintln!("usage: serving [--layers N]");
                std::process::exit(2);
            }
        }
    }
    let gpu = gpu_present();
    let layers = layers.unwrap_or(if gpu { 32 } else { 2 });

    let mut rng = Rng::fresh();
    let num_pages = LENGTHS.iter().map(|k| k.div_ceil(PAGE_SIZE)).sum::<usize>() + 8;
    let pages = page_table(num_pages, &mut rng)?;
    let batch = LENGTHS.len();
    let model: Vec<Layer> = (0..layers)
        .map(|_| Layer {
            q: randn(&mut rng, &[batch, 1, HEADS_Q, HEAD_DIM], Layout::Bshd),
            k_cache: randn(
                &mut rng,
                &[num_pages, PAGE_SIZE, HEADS_KV, HEAD_DIM],
                Layout::Bshd,
            ),
            v_cache: randn(
                &mut rng,
                &[num_pages, PAGE_SIZE, HEADS_KV, HEAD_DIM],
                Layout::Bshd,
            ),
        })
        .collect();
    // The one new query of each sequence is its last token: it sees every cached key.
    let opts = AttentionOptions::default().causal(Causal::BottomRight);

    let step = if gpu {
        on_gpu(&model, &pages, &opts)?
    } else {
        on_cpu(&model, &pages, &opts)?
    };

    let mut worst = 0.0f64;
    for (i, layer) in model.iter().enumerate() {
        let cpu = opts.backend(Backend::Cpu);
        let want = attention_paged(&layer.q, &layer.k_cache, &layer.v_cache, &pages, &cpu)?;
        let want = logical(&want.out);
        for outs in std::iter::once(&step.outs).chain(&step.graph_outs) {
            let err = rel_l2(&logical(&outs[i]), &want);
            worst = if err.is_nan() || worst.is_nan() {
                f64::NAN
            } else {
                worst.max(err)
            };
        }
    }
    println!(
        "decode step: {batch} sequences ({LENGTHS:?} keys), GQA {HEADS_Q}:{HEADS_KV}, d {HEAD_DIM}, \
         bf16, pages of {PAGE_SIZE} (shuffled); {layers} layers on {}: {:.1} us per layer{}{}; \
         worst rel L2 vs f64 {worst:.2e}",
        step.ran,
        step.per_layer_us,
        step.host_us
            .map_or(String::new(), |h| format!(" (the host enqueues one in {h:.1} us)")),
        step.graph_us.map_or(String::new(), |(g, h)| format!(
            "; as one CUDA graph {g:.1} us per layer (the host enqueues the step in {h:.1} us)"
        )),
    );
    if worst.is_nan() || worst >= 1e-2 {
        return Err(flashcore::Error::Launch(format!("error {worst} over 1e-2")));
    }
    Ok(())
}

/// A step's outputs and times.
struct Step {
    /// Each layer's output (on the host) from the plan's runs.
    outs: Vec<Tensor<bf16>>,
    /// Time per layer, microseconds.
    per_layer_us: f64,
    /// On a GPU: the host's time to enqueue a layer.
    host_us: Option<f64>,
    /// On a GPU: each layer's output from the graph's launch, the graph's time per layer and
    /// the host's time to enqueue the whole graph.
    graph_outs: Option<Vec<Tensor<bf16>>>,
    graph_us: Option<(f64, f64)>,
    /// What ran.
    ran: String,
}

/// The step on the CPU: one plan, one run per layer.
fn on_cpu(model: &[Layer], pages: &PageTable, opts: &AttentionOptions) -> flashcore::Result<Step> {
    let mut outs = Vec::new();
    for _ in model {
        outs.push(Tensor::full(
            bf16::ZERO,
            &[LENGTHS.len(), 1, HEADS_Q, HEAD_DIM],
            Layout::Bshd,
        )?);
    }
    let first = &model[0];
    let plan = AttentionPlan::new_paged(
        &first.q,
        &first.k_cache,
        &first.v_cache,
        pages,
        &outs[0],
        None,
        opts,
    )?;
    let t0 = std::time::Instant::now();
    for (layer, out) in model.iter().zip(outs.iter_mut()) {
        plan.run(&layer.q, &layer.k_cache, &layer.v_cache, out, None)?;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / model.len() as f64;
    Ok(Step {
        outs,
        per_layer_us: us,
        host_us: None,
        graph_outs: None,
        graph_us: None,
        ran: plan.execution().backend.name().to_owned(),
    })
}

#[cfg(feature = "cuda")]
fn gpu_present() -> bool {
    flashcore::Device::count() > 0
}

#[cfg(not(feature = "cuda"))]
fn gpu_present() -> bool {
    false
}

/// The step on the GPU: the caches and the table live on the device (the table is copied once
/// per batch composition), one plan, one run per layer, timed with CUDA events; the host's time
/// to enqueue the layers is timed around the same runs (medians of 20 steps).
#[cfg(feature = "cuda")]
fn on_gpu(model: &[Layer], pages: &PageTable, opts: &AttentionOptions) -> flashcore::Result<Step> {
    use flashcore::{Capture, Device, Event, Stream};
    let device = Device::open(0)?;
    let stream = Stream::new(&device)?;
    let pages = pages.to_device(&stream)?;
    let mut on_device = Vec::new();
    for layer in model {
        on_device.push(Layer {
            q: layer.q.to_device(&stream)?,
            k_cache: layer.k_cache.to_device(&stream)?,
            v_cache: layer.v_cache.to_device(&stream)?,
        });
    }
    let mut outs = Vec::new();
    for _ in model {
        let dims = [LENGTHS.len(), 1, HEADS_Q, HEAD_DIM];
        outs.push(Tensor::uninit_on(&stream, &dims, Layout::Bshd)?);
    }
    let first = &on_device[0];
    let plan = AttentionPlan::new_paged(
        &first.q,
        &first.k_cache,
        &first.v_cache,
        &pages,
        &outs[0],
        None,
        opts,
    )?;
    let step = |outs: &mut [Tensor<bf16>]| -> flashcore::Result<()> {
        for (layer, out) in on_device.iter().zip(outs.iter_mut()) {
            plan.run(&layer.q, &layer.k_cache, &layer.v_cache, out, None)?;
        }
        Ok(())
    };
    step(&mut outs)?; // warm-up
    let (start, end) = (Event::new(&device)?, Event::new(&device)?);
    let (mut times, mut host_times) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        start.record(&stream)?;
        let t0 = std::time::Instant::now();
        step(&mut outs)?;
        host_times.push(t0.elapsed().as_secs_f64() * 1e6 / model.len() as f64);
        end.record(&stream)?;
        times.push(f64::from(start.elapsed_ms(&end)?) * 1e3 / model.len() as f64);
    }
    let median = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let to_host = |outs: &[Tensor<bf16>]| -> flashcore::Result<Vec<_>> {
        outs.iter().map(Tensor::to_host).collect()
    };
    let host: Vec<_> = to_host(&outs)?;

    // The same step recorded once into a CUDA graph, the outputs poisoned before its launches.
    let mut capture = Capture::begin(&stream)?;
    for (layer, out) in on_device.iter().zip(outs.iter_mut()) {
        capture.run(&plan, &layer.q, &layer.k_cache, &layer.v_cache, out, None)?;
    }
    let graph = capture.finish()?;
    let nan = Tensor::full(
        bf16::NAN,
        &[LENGTHS.len(), 1, HEADS_Q, HEAD_DIM],
        Layout::Bshd,
    )?;
    for out in &mut outs {
        out.copy_from(&nan)?;
    }
    graph.launch()?; // warm-up
    let (mut graph_times, mut graph_host) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        start.record(&stream)?;
        let t0 = std::time::Instant::now();
        graph.launch()?;
        graph_host.push(t0.elapsed().as_secs_f64() * 1e6);
        end.record(&stream)?;
        graph_times.push(f64::from(start.elapsed_ms(&end)?) * 1e3 / model.len() as f64);
    }
    let e = plan.execution();
    let tile = e.tile.map(|r| r.tile);
    Ok(Step {
        outs: host,
        per_layer_us: median(times),
        host_us: Some(median(host_times)),
        graph_outs: Some(to_host(&outs)?),
        graph_us: Some((median(graph_times), median(graph_host))),
        ran: format!(
            "{} (tile {tile:?}, {} key splits)",
            e.backend.name(),
            e.splits
        ),
    })
}

#[cfg(not(feature = "cuda"))]
fn on_gpu(_: &[Layer], _: &PageTable, _: &AttentionOptions) -> flashcore::Result<Step> {
    Err(flashcore::Error::CudaNotBuilt)
}
