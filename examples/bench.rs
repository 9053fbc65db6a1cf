//! Bench CLI: races the backends over the named shape list and prints a table (backend, shape,
//! median / p10 / p90 µs, TFLOP/s, % of peak); `--json PATH` writes the records, in the schema
//! that `scripts/torch_sdpa.py` also writes, for `scripts/merge_bench.py` (rewritten after each
//! shape with `"partial": true`, so that a run cut short leaves the shapes it finished).
//!
//! `cargo run --release --example bench -- [--filter SUBSTR] [--iters N] [--json PATH] [--peak-tflops X]`
//! `--shapes-json PATH` writes the shape list (the shapes `--filter` keeps) and exits. After the
//! shape list come fixed rows (variable-length, paged, score modifiers, bias, host cost, small
//! prefills, the backward pass): `--rows varlen,host` runs only
//! those groups, `--rows none` none of them. `--kernels cutlass-sm90,wmma` times only those
//! families on the shape list (default: every one). Each measurement is taken as triton's `do_bench`
//! takes torch's: 25 ms of warm-up calls (`FLASHCORE_BENCH_WARM_MS` sets another), then at least
//! `--iters` calls (default 50) and enough to fill 100 ms, each after an L2 flush
//! (benches/common/mod.rs `time_fn`).

#[path = "../benches/common/mod.rs"]
mod common;

use std::time::Instant;

use common::{percentiles, random_on, shapes, time_calls, time_fn, BenchShape, Inputs};
use flashcore::plan::{ArchClass, Kernel};
use flashcore::{
    attention, attention_into, attention_paged_into, attention_varlen_into, AlibiSlopes,
    AttentionElement, AttentionOptions, Backend, BackendKind, Bias, Causal, Device, Layout,
    PageTable, Stream, Tensor, VarlenBatch,
};
use half::{bf16, f16};
use serde_json::json;

struct Args {
    filter: String,
    iters: usize,
    json: Option<String>,
    peak: Option<f64>,
    shapes_json: Option<String>,
    force: Option<ArchClass>,
    /// The groups of fixed rows to run (`--rows`): all when empty.
    rows: Vec<String>,
    /// The kernel families the shape list times (`--kernels`): every one by default.
    kernels: Vec<Kernel>,
}

/// The groups of fixed rows after the shape list, by `--rows` name.
const ROW_GROUPS: [&str; 8] = [
    "varlen",
    "paged",
    "modifiers",
    "bias",
    "host",
    "small",
    "backward",
    "none",
];

impl Args {
    /// Whether `--rows` selects the fixed rows of `group` (every group without `--rows`).
    fn wants(&self, group: &str) -> bool {
        self.rows.is_empty() || self.rows.iter().any(|r| r == group)
    }
}

fn parse() -> Args {
    let mut a = Args {
        filter: String::new(),
        iters: 50,
        json: None,
        peak: None,
        shapes_json: None,
        force: None,
        rows: Vec::new(),
        kernels: Kernel::ALL.to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--filter" => a.filter = val(),
            "--iters" => a.iters = val().parse().unwrap_or_else(|_| usage("bad --iters")),
            "--json" => a.json = Some(val()),
            "--shapes-json" => a.shapes_json = Some(val()),
            "--force-class" => {
                a.force = Some(match val().as_str() {
                    "sm80" => ArchClass::Sm80,
                    "sm89" => ArchClass::Sm86Sm89,
                    "sm90" => ArchClass::Sm90,
                    _ => usage("--force-class takes sm80, sm89 or sm90"),
                })
            }
            "--rows" => {
                a.rows = val().split(',').map(str::to_owned).collect();
                if let Some(bad) = a.rows.iter().find(|r| !ROW_GROUPS.contains(&r.as_str())) {
                    usage(&format!(
                        "--rows takes {} (comma-separated), not {bad}",
                        ROW_GROUPS.join(",")
                    ));
                }
            }
            "--kernels" => {
                a.kernels = val()
                    .split(',')
                    .map(|n| {
                        Kernel::from_name(n)
                            .unwrap_or_else(|| usage(&format!("--kernels: no kernel named {n}")))
                    })
                    .collect()
            }
            "--peak-tflops" => {
                a.peak = Some(val().parse().unwrap_or_else(|_| usage("bad --peak-tflops")))
            }
            _ => usage(&format!("unknown argument {flag}")),
        }
    }
    a
}

fn usage(msg: &str) -> ! {
    eprintln!("{msg}\nusage: bench [--filter SUBSTR] [--iters N] [--json PATH] [--peak-tflops X] [--shapes-json PATH] [--force-class sm80|sm89|sm90] [--rows varlen,paged,modifiers,bias,host,small,backward|none] [--kernels cutlass-sm80,wmma,cutlass-sm90]");
    std::process::exit(2)
}

struct Record {
    backend: &'static str,
    dtype: &'static str,
    shape: BenchShape,
    times_us: Vec<f64>,
}

/// Times each of `kernels` on one set of inputs (generating them dominates the bench's host
/// time). Returns (backend name, per-call times or the error) in the order of `kernels`.
fn gpu<T: AttentionElement>(
    stream: &Stream,
    shape: &BenchShape,
    iters: usize,
    force: Option<ArchClass>,
    kernels: &[Kernel],
) -> Vec<(&'static str, flashcore::Result<Vec<f64>>)> {
    let mut inputs = match Inputs::<T>::new(stream, shape, Kernel::CutlassSm80.into(), force) {
        Ok(i) => i,
        Err(e) => return kernels.iter().map(|k| (k.name(), Err(e.clone()))).collect(),
    };
    let runs = kernels
        .iter()
        .map(|&kernel| {
            inputs.set_backend(kernel.into());
            (kernel.name(), time_calls(stream, &mut inputs, 10, iters))
        })
        .collect();
    // Which of them Auto runs, with its row and key splits.
    inputs.set_backend(Backend::Auto);
    match inputs.call(0) {
        Ok(e) => {
            let tile = e.tile.map(|r| r.tile);
            let t = tile.map_or(String::from("-"), |t| {
                format!(
                    "{}x{}x{}",
                    t.queries_per_block, t.keys_per_block, t.max_head_dim
                )
            });
            let (name, dtype) = (shape.name(), T::DTYPE);
            let (backend, splits) = (e.backend.name(), e.splits);
            eprintln!("  auto {name} {dtype:?}: {backend}, tile {t}, {splits} split(s)");
        }
        Err(e) => eprintln!("  auto: {e}"),
    }
    runs
}

/// The CPU reference, wall clock, on host tensors (tiny shapes only).
fn cpu<T: AttentionElement>(shape: &BenchShape, iters: usize) -> flashcore::Result<Vec<f64>> {
    let q = Tensor::full(
        T::from_f64(0.5),
        &[shape.b, shape.h, shape.sq, shape.d],
        Layout::Bhsd,
    )?;
    let kv = Tensor::full(
        T::from_f64(0.25),
        &[shape.b, shape.hk, shape.sk, shape.d],
        Layout::Bhsd,
    )?;
    let causal = if shape.causal {
        Causal::BottomRight
    } else {
        Causal::None
    };
    let opts = AttentionOptions::default().causal(causal);
    (0..iters)
        .map(|_| {
            let t0 = Instant::now();
            attention(&q, &kv, &kv, &opts)?;
            Ok(t0.elapsed().as_secs_f64() * 1e6)
        })
        .collect()
}

/// Writes the shape list, those whose names contain `filter` (for scripts/torch_sdpa.py, so both
/// sides time the same problems).
fn write_shapes(path: &str, filter: &str) {
    let list: Vec<_> = shapes()
        .iter()
        .filter(|s| s.name().contains(filter))
        .map(|s| {
            json!({"name": s.name(), "group": s.group, "b": s.b, "h": s.h, "hk": s.hk,
                        "sq": s.sq, "sk": s.sk, "d": s.d, "causal": s.causal, "flops": s.flops(),
                        "bytes": s.bytes()})
        })
        .collect();
    std::fs::write(path, serde_json::to_string_pretty(&list).unwrap()).expect("write shapes");
}

/// Host cost per call (H4 / H11), for one tiny problem that keeps the GPU ahead of the host:
/// Rust `attention_into` (validation, planning, FFI, launcher) against the public C++ call
/// (`attention_forward`: the same work from C++), a Rust `AttentionPlan::run` against a run of
/// the public C++ plan of the same call (`flashcore::AttentionPlan::run`: address check +
/// launcher), and the bare C++ launcher. Each loop enqueues 200 calls (below the launch queue's
/// depth) after a synchronise. A round runs the Rust loops and the C++ loops back to back, Rust
/// first in even rounds and C++ first in odd ones, so that neither side always follows the
/// other; each round gives the two ratios. Medians over 60 rounds (a first one discarded).
struct HostCost {
    /// Median ns per call: Rust call, C++ call, Rust planned run, C++ planned run, launcher.
    ns: [f64; 5],
    /// Rust call / C++ call and Rust planned run / C++ planned run, per round: (median, p10,
    /// p90).
    ratios: [(f64, f64, f64); 2],
}

fn host_overhead(stream: &Stream) -> flashcore::Result<HostCost> {
    let q = Tensor::full(f16::ONE, &[1, 1, 16, 64], Layout::Bhsd)?.to_device(stream)?;
    let mut out = Tensor::uninit_on(stream, &[1, 1, 16, 64], Layout::Bhsd)?;
    let opts = AttentionOptions::default();
    const CALLS: u32 = 200;
    const ROUNDS: usize = 60;
    let plan = flashcore::AttentionPlan::new(&q, &q, &q, &out, None, &opts)?;
    let mut rounds: [Vec<f64>; 5] = Default::default();
    let mut ratios: [Vec<f64>; 2] = Default::default();
    for round in 0..=ROUNDS {
        // Host ns per call of `CALLS` calls of `f`, enqueued after a synchronise.
        let per_call = |f: &mut dyn FnMut() -> flashcore::Result<()>| -> flashcore::Result<f64> {
            stream.synchronize()?;
            let t0 = Instant::now();
            for _ in 0..CALLS {
                f()?;
            }
            Ok(t0.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS))
        };
        let rust_loops = |out: &mut Tensor<f16>| -> flashcore::Result<(f64, f64)> {
            let call = per_call(&mut || {
                flashcore::attention_into(&q, &q, &q, out, None, &opts).map(|_| ())
            })?;
            let planned = per_call(&mut || plan.run(&q, &q, &q, out, None).map(|_| ()))?;
            Ok((call, planned))
        };
        let ((rust, planned), cpp) = if round % 2 == 0 {
            let r = rust_loops(&mut out)?;
            (
                r,
                flashcore::cpp_host_ns(&q, &q, &q, &mut out, &opts, CALLS)?,
            )
        } else {
            let c = flashcore::cpp_host_ns(&q, &q, &q, &mut out, &opts, CALLS)?;
            (rust_loops(&mut out)?, c)
        };
        if round > 0 {
            for (r, x) in rounds
                .iter_mut()
                .zip([rust, cpp.call, planned, cpp.planned, cpp.launch])
            {
                r.push(x);
            }
            ratios[0].push(rust / cpp.call);
            ratios[1].push(planned / cpp.planned);
        }
    }
    stream.synchronize()?;
    Ok(HostCost {
        ns: rounds.map(|mut r| percentiles(&mut r).0),
        ratios: ratios.map(|mut r| percentiles(&mut r)),
    })
}

/// The variable-length prefill rows of issue 12: 16 causal sequences of 128 to 4096 tokens (GQA
/// 32:8, d = 128, bf16) as one variable-length batch, and a dense batch of 16 equal sequences
/// with the same token count, on the same kernel: WMMA (forced), and whatever Auto runs (the
/// Hopper kernel on an H200). Returns per row (the kernel, varlen us, varlen TFLOP/s, dense us,
/// dense TFLOP/s), medians.
fn varlen_prefill(stream: &Stream, iters: usize) -> flashcore::Result<Vec<(String, [f64; 4])>> {
    const LENGTHS: [usize; 16] = [
        128, 4096, 256, 3072, 512, 2048, 1024, 3584, 384, 2560, 768, 1536, 1792, 3840, 640, 2304,
    ];
    let (h, hk, d) = (32, 8, 128);
    let total: usize = LENGTHS.iter().sum();
    let n = total / LENGTHS.len();
    let flops = |lens: &[usize]| {
        lens.iter()
            .map(|&n| 2.0 * (h * n * n * d) as f64)
            .sum::<f64>()
    };
    let dev = |dims: &[usize]| random_on::<bf16>(stream, dims, Layout::Bshd);
    let median = |mut t: Vec<f64>| percentiles(&mut t).0;
    let tflops = |f: f64, us: f64| f / (us * 1e-6) / 1e12;

    let batch = VarlenBatch::from_lengths(&LENGTHS, &LENGTHS)?.to_device(stream)?;
    let (q, k, v, mut out) = (
        dev(&[1, total, h, d])?,
        dev(&[1, total, hk, d])?,
        dev(&[1, total, hk, d])?,
        dev(&[1, total, h, d])?,
    );
    let (dq, dk, dv, mut dout) = (
        dev(&[16, n, h, d])?,
        dev(&[16, n, hk, d])?,
        dev(&[16, n, hk, d])?,
        dev(&[16, n, h, d])?,
    );
    let mut rows = Vec::new();
    for backend in [Backend::Kernel(Kernel::Wmma), Backend::Auto] {
        let opts = AttentionOptions::default()
            .causal(Causal::BottomRight)
            .backend(backend);
        let ran = attention_varlen_into(&q, &k, &v, &batch, &mut out, None, &opts)?.backend;
        let varlen = median(time_fn(stream, 3, iters, |_| {
            attention_varlen_into(&q, &k, &v, &batch, &mut out, None, &opts).map(|_| ())
        })?);
        // The dense batch on the kernel the variable-length batch ran on.
        let same = opts.backend(match ran {
            BackendKind::Kernel(k) => Backend::Kernel(k),
            _ => backend,
        });
        let dense = median(time_fn(stream, 3, iters, |_| {
            attention_into(&dq, &dk, &dv, &mut dout, None, &same).map(|_| ())
        })?);
        let auto = if backend == Backend::Auto {
            " (Auto)"
        } else {
            ""
        };
        let name = format!("{}{auto}", ran.name());
        rows.push((
            name,
            [
                varlen,
                tflops(flops(&LENGTHS), varlen),
                dense,
                tflops(flops(&[n; 16]), dense),
            ],
        ));
    }
    Ok(rows)
}

/// A variable-length decode row (issue 12's split-KV for variable-length batches): the variable-
/// length batch's sequences, one query each on `keys[i]` keys (bf16, GQA 32:8, d = 128; Q and
/// the output in `layout`: BSHD packs the one-query heads into rows, BHSD does not), under
/// Auto, forced onto WMMA, onto the Hopper kernel (NaN where refused, as off compute
/// capability 9.0) and onto CUTLASS example 41, beside the dense batch of the longest length
/// under Auto. Returns the kernel and splits Auto ran and (Auto us, WMMA us, Hopper us,
/// example 41 us, dense us, GB/s of K+V under Auto), medians.
fn varlen_decode(
    stream: &Stream,
    iters: usize,
    keys: &[usize],
    layout: Layout,
) -> flashcore::Result<(String, usize, [f64; 6])> {
    let (h, hk, d) = (32, 8, 128);
    let (b, longest, total) = (
        keys.len(),
        keys.iter().max().copied().unwrap_or(0),
        keys.iter().sum(),
    );
    let dev = |dims: &[usize]| random_on::<bf16>(stream, dims, Layout::Bshd);
    let median = |mut t: Vec<f64>| percentiles(&mut t).0;
    let batch = VarlenBatch::from_lengths(&vec![1; b], keys)?.to_device(stream)?;
    // Q's and the output's dims in `layout`'s order.
    let rows = if layout == Layout::Bshd {
        [1, b, h, d]
    } else {
        [1, h, b, d]
    };
    let (q, k, v, mut out) = (
        random_on::<bf16>(stream, &rows, layout)?,
        dev(&[1, total, hk, d])?,
        dev(&[1, total, hk, d])?,
        random_on::<bf16>(stream, &rows, layout)?,
    );
    let mut time = |backend: Backend| {
        let opts = AttentionOptions::default()
            .causal(Causal::BottomRight)
            .backend(backend);
        let ran = attention_varlen_into(&q, &k, &v, &batch, &mut out, None, &opts)?;
        let us = median(time_fn(stream, 3, iters, |_| {
            attention_varlen_into(&q, &k, &v, &batch, &mut out, None, &opts).map(|_| ())
        })?);
        Ok::<_, flashcore::Error>((ran, us))
    };
    let (ran, auto) = time(Backend::Auto)?;
    let (_, wmma) = time(Backend::Kernel(Kernel::Wmma))?;
    let hopper = time(Backend::Kernel(Kernel::CutlassSm90)).map_or(f64::NAN, |(_, us)| us);
    let (_, cutlass) = time(Backend::Kernel(Kernel::CutlassSm80))?;
    let (dq, dk, dv, mut dout) = (
        dev(&[b, 1, h, d])?,
        dev(&[b, longest, hk, d])?,
        dev(&[b, longest, hk, d])?,
        dev(&[b, 1, h, d])?,
    );
    let opts = AttentionOptions::default().causal(Causal::BottomRight);
    let dense = median(time_fn(stream, 3, iters, |_| {
        attention_into(&dq, &dk, &dv, &mut dout, None, &opts).map(|_| ())
    })?);
    let bytes = (2 * total * hk * d * 2) as f64;
    Ok((
        ran.backend.name().to_string(),
        ran.splits,
        [auto, wmma, hopper, cutlass, dense, bytes / (auto * 1e3)],
    ))
}

/// The block table of `b` sequences of `n` keys in pages of `size`: page i of the batch is cache
/// page (i · stride) mod pages, shuffled for the prime 7919 (no page count here is a multiple of
/// it), in order for 1.
fn page_table(b: usize, n: usize, size: usize, stride: usize) -> flashcore::Result<PageTable> {
    let (per_seq, pages) = (n / size, b * n / size);
    let table = (0..b)
        .map(|s| {
            (0..per_seq)
                .map(|j| ((s * per_seq + j) * stride % pages) as i32)
                .collect()
        })
        .collect();
    PageTable::new(size, table, vec![n as i32; b])
}

/// The kernel a paged call ran under the caller's options, and its µs there, on WMMA and on the
/// Hopper kernel (NaN where refused).
type PagedRun = (String, [f64; 3]);

/// One paged problem beside contiguous K/V (bf16, GQA 32:8, d = 128): `b` sequences of `sq`
/// queries on `n` keys, timed with contiguous K/V under `opts`, then in a cache paged each way of
/// `pagings` ((page size, page stride): page_table's) under `opts`, forced onto WMMA and forced
/// onto the Hopper kernel (refused off compute capability 9.0: NaN). Returns the contiguous µs
/// and per paging the kernel `opts` ran and the three paged µs, medians.
fn paged_against_contiguous(
    stream: &Stream,
    iters: usize,
    (b, sq, n): (usize, usize, usize),
    pagings: &[(usize, usize)],
    opts: &AttentionOptions,
) -> flashcore::Result<(f64, Vec<PagedRun>)> {
    let (h, hk, d) = (32, 8, 128);
    let dev = |dims: &[usize]| random_on::<bf16>(stream, dims, Layout::Bshd);
    let median = |mut t: Vec<f64>| percentiles(&mut t).0;
    let q = dev(&[b, sq, h, d])?;
    let mut out = dev(&[b, sq, h, d])?;
    let (k, v) = (dev(&[b, n, hk, d])?, dev(&[b, n, hk, d])?);
    let contiguous = median(time_fn(stream, 3, iters, |_| {
        attention_into(&q, &k, &v, &mut out, None, opts).map(|_| ())
    })?);
    drop((k, v));
    let mut runs = Vec::new();
    for &(size, stride) in pagings {
        let pages = b * n / size;
        let table = page_table(b, n, size, stride)?.to_device(stream)?;
        let (k, v) = (dev(&[pages, size, hk, d])?, dev(&[pages, size, hk, d])?);
        let mut time = |opts: &AttentionOptions| {
            let ran = attention_paged_into(&q, &k, &v, &table, &mut out, None, opts)?.backend;
            let us = median(time_fn(stream, 3, iters, |_| {
                attention_paged_into(&q, &k, &v, &table, &mut out, None, opts).map(|_| ())
            })?);
            Ok::<_, flashcore::Error>((ran, us))
        };
        let (ran, paged) = time(opts)?;
        let (_, wmma) = time(&opts.backend(Backend::Kernel(Kernel::Wmma)))?;
        let hopper = time(&opts.backend(Backend::Kernel(Kernel::CutlassSm90)))
            .map_or(f64::NAN, |(_, us)| us);
        runs.push((ran.name().to_string(), [paged, wmma, hopper]));
    }
    Ok((contiguous, runs))
}

/// The paged decode rows of issue 12 (bf16, GQA 32:8, d = 128, one query per sequence): 1 x 32k,
/// 16 x 8k and 64 x 2k keys in shuffled pages of 16 and of 64 keys, under Auto and forced onto
/// WMMA and the Hopper kernel, beside the same problem with contiguous K/V under Auto (and pages
/// of 64 in order). Returns per row the kernel Auto ran and (batch, keys, page size, paged µs
/// under Auto, contiguous µs, K+V GB/s of the paged call under Auto, page stride, paged µs on
/// WMMA, paged µs on the Hopper kernel or NaN), medians.
fn paged_decode(stream: &Stream, iters: usize) -> flashcore::Result<Vec<(String, [f64; 9])>> {
    let pagings = [(16, 7919), (64, 7919), (64, 1)];
    let opts = AttentionOptions::default();
    let mut rows = Vec::new();
    for (b, n) in [(1, 32768), (16, 8192), (64, 2048)] {
        let (contiguous, runs) =
            paged_against_contiguous(stream, iters, (b, 1, n), &pagings, &opts)?;
        let bytes = 2.0 * (b * n * 8 * 128 * 2) as f64;
        for ((size, stride), (ran, [paged, wmma, hopper])) in pagings.into_iter().zip(runs) {
            let gbps = bytes / paged / 1e3;
            let (b, n, size, stride) = (b as f64, n as f64, size as f64, stride as f64);
            rows.push((
                ran,
                [b, n, size, paged, contiguous, gbps, stride, wmma, hopper],
            ));
        }
    }
    Ok(rows)
}

/// A paged chunked-prefill row (bf16, GQA 32:8, d = 128, bottom-right causal): 4 sequences of
/// 8192 cached keys, the last 2048 of them the new queries', in shuffled pages of 64, under Auto
/// and forced onto WMMA and the Hopper kernel, beside the same problem with contiguous K/V under
/// Auto. Returns (the kernel Auto ran, [paged µs under Auto, on WMMA, on the Hopper kernel or
/// NaN, contiguous µs]), medians.
fn paged_prefill(stream: &Stream, iters: usize) -> flashcore::Result<(String, [f64; 4])> {
    let opts = AttentionOptions::default().causal(Causal::BottomRight);
    let (contiguous, mut runs) =
        paged_against_contiguous(stream, iters, (4, 2048, 8192), &[(64, 7919)], &opts)?;
    let (ran, [auto, wmma, hopper]) = runs.remove(0);
    Ok((ran, [auto, wmma, hopper, contiguous]))
}

/// The score-modifier rows of issue 13 (bf16, d = 128, bottom-right causal, same run): a
/// sliding window of 4096 keys on 1 x 32 x 16384 against the full causal call, both on the WMMA
/// kernel (the family that applies every modifier) and both under Auto (the Hopper kernel on an
/// H100/H200); a softcap of 30 and ALiBi (the paper's slopes for 32 heads) on 4 x 32 x 4096
/// against the same call without them, on WMMA and under Auto (the Hopper kernel's modifier
/// schedule on an H100/H200). Returns (full WMMA us, windowed WMMA us, full Auto us, windowed
/// Auto us, plain WMMA us, softcapped WMMA us, ALiBi WMMA us, plain Auto us, softcapped Auto us,
/// ALiBi Auto us), medians.
fn score_modifiers(stream: &Stream, iters: usize) -> flashcore::Result<[f64; 10]> {
    let dev = |dims: &[usize]| random_on::<bf16>(stream, dims, Layout::Bshd);
    let median = |mut t: Vec<f64>| percentiles(&mut t).0;
    let wmma = AttentionOptions::default()
        .causal(Causal::BottomRight)
        .backend(Backend::Kernel(Kernel::Wmma));
    let time = |b: usize, s: usize, opts: AttentionOptions| -> flashcore::Result<f64> {
        let x = dev(&[b, s, 32, 128])?;
        let mut out = dev(&[b, s, 32, 128])?;
        Ok(median(time_fn(stream, 3, iters, |_| {
            attention_into(&x, &x, &x, &mut out, None, &opts).map(|_| ())
        })?))
    };
    let slopes = AlibiSlopes::geometric(32)?.to_device(stream)?;
    Ok([
        time(1, 16384, wmma.clone())?,
        time(1, 16384, wmma.window(Some(4096), None))?,
        time(1, 16384, wmma.backend(Backend::Auto))?,
        time(
            1,
            16384,
            wmma.window(Some(4096), None).backend(Backend::Auto),
        )?,
        time(4, 4096, wmma.clone())?,
        time(4, 4096, wmma.softcap(30.0))?,
        time(4, 4096, wmma.alibi(slopes.clone()))?,
        time(4, 4096, wmma.backend(Backend::Auto))?,
        time(4, 4096, wmma.softcap(30.0).backend(Backend::Auto))?,
        time(4, 4096, wmma.alibi(slopes).backend(Backend::Auto))?,
    ])
}

/// The backward pass's rows (`scripts/torch_sdpa_backward.py` times torch's on the same shapes):
/// (name, batch, heads_q, heads_kv, seq, head_dim, causal).
const BACKWARD_ROWS: [(&str, usize, usize, usize, usize, usize, bool); 5] = [
    ("4x16x2048x128", 4, 16, 16, 2048, 128, false),
    ("4x16x2048x128 causal", 4, 16, 16, 2048, 128, true),
    ("4x32(kv8)x2048x128 causal", 4, 32, 8, 2048, 128, true),
    ("8x16x2048x64 causal", 8, 16, 16, 2048, 64, true),
    ("4x16x2048x256 causal", 4, 16, 16, 2048, 256, true),
];

/// One backward bench row: (shape name, kernel name, median us, TFLOP/s, the tile row that ran).
type BackwardTiming = (String, &'static str, f64, f64, String);

/// The backward pass (bf16) on [`BACKWARD_ROWS`] on each of `kernels` that has a backward pass
/// (WMMA, the Hopper kernel), with `force`'s kernel choice where given: per row and kernel that
/// takes it (name, kernel, median us, TFLOP/s at 2.5 times the forward pass's FLOPs, as
/// FlashAttention counts, the backward tile row that ran).
fn backward_rows(
    stream: &Stream,
    iters: usize,
    force: Option<ArchClass>,
    kernels: &[Kernel],
) -> flashcore::Result<Vec<BackwardTiming>> {
    let mut out = Vec::new();
    for kernel in [Kernel::CutlassSm90, Kernel::Wmma] {
        if kernels.contains(&kernel) {
            out.extend(backward_rows_on(stream, iters, force, kernel)?);
        }
    }
    Ok(out)
}

/// [`backward_rows`] on `kernel`, skipping the rows it does not take (BackendUnavailable).
fn backward_rows_on(
    stream: &Stream,
    iters: usize,
    force: Option<ArchClass>,
    kernel: Kernel,
) -> flashcore::Result<Vec<BackwardTiming>> {
    use flashcore::{attention_backward_into, AttentionState, GradientsMut};
    let mut out = Vec::new();
    for (name, b, hq, hk, s, d, causal) in BACKWARD_ROWS {
        let dev = |h: usize| random_on::<bf16>(stream, &[b, s, h, d], Layout::Bshd);
        let (q, k, v, dout) = (dev(hq)?, dev(hk)?, dev(hk)?, dev(hq)?);
        let causal = if causal {
            Causal::BottomRight
        } else {
            Causal::None
        };
        let forward_opts = AttentionOptions {
            force_arch_class: force,
            ..AttentionOptions::default().causal(causal).with_lse()
        };
        let fwd = attention(&q, &k, &v, &forward_opts)?;
        let opts = forward_opts.backend(Backend::Kernel(kernel));
        let state = AttentionState {
            out: &fwd.out,
            lse: fwd.lse.as_ref().expect("asked for"),
        };
        let (mut dq, mut dk, mut dv) = (dev(hq)?, dev(hk)?, dev(hk)?);
        let mut row = None;
        let timed = time_fn(stream, 3, iters, |_| {
            let grads = GradientsMut {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            };
            let ran = attention_backward_into(&q, &k, &v, state, &dout, grads, &opts)?;
            row = ran.backward_tile;
            Ok(())
        });
        let times = match timed {
            Err(flashcore::Error::BackendUnavailable { .. }) => continue,
            other => other?,
        };
        let row = row.map_or("none".to_owned(), |r| {
            format!(
                "{:?} {} keys x {} rows",
                r.kernel, r.keys_per_block, r.rows_per_step
            )
        });
        let us = percentiles(&mut times.clone()).0;
        let forward =
            4.0 * (b * hq * s * s * d) as f64 * if causal == Causal::None { 1.0 } else { 0.5 };
        let tflops = 2.5 * forward / (us * 1e-6) / 1e12;
        out.push((name.to_owned(), kernel.name(), us, tflops, row));
    }
    Ok(out)
}

/// Times `call` (one attention call with the options it is given) under Auto, WMMA and the
/// Hopper kernel, `opts` otherwise: (the backend Auto ran, [Auto, WMMA, Hopper] us), medians.
fn race_auto(
    stream: &Stream,
    iters: usize,
    opts: &AttentionOptions,
    mut call: impl FnMut(&AttentionOptions) -> flashcore::Result<flashcore::Execution>,
) -> flashcore::Result<(String, [f64; 3])> {
    let mut runs = [0.0; 3];
    let mut ran = None;
    for (slot, backend) in [
        Backend::Auto,
        Backend::Kernel(Kernel::Wmma),
        Backend::Kernel(Kernel::CutlassSm90),
    ]
    .into_iter()
    .enumerate()
    {
        let opts = opts.clone().backend(backend);
        ran = ran.or(Some(call(&opts)?.backend));
        let mut times = time_fn(stream, 3, iters, |_| call(&opts).map(|_| ()))?;
        runs[slot] = percentiles(&mut times).0;
    }
    Ok((format!("{:?}", ran.expect("Auto ran first")), runs))
}

/// Small prefills (bf16), dense and variable-length, whose Hopper work units leave SMs idle: where
/// Auto's choice between WMMA and the Hopper kernel lies (plan.h's `kSm90SmallPrefillFlops`). Per
/// row, (name, Auto's kernel, [Auto, WMMA, Hopper] us), medians.
type SmallRow = (String, String, [f64; 3]);
fn small_prefill(stream: &Stream, iters: usize) -> flashcore::Result<Vec<SmallRow>> {
    let shapes: [(usize, usize, usize, usize, bool); 12] = [
        (1, 8, 512, 64, false),
        (4, 8, 256, 64, false),
        (1, 8, 1024, 64, false),
        (1, 8, 2048, 64, false),
        (2, 8, 512, 128, false),
        (1, 16, 1024, 128, false),
        (1, 8, 2048, 128, false),
        (1, 4, 4096, 128, false),
        (2, 8, 1024, 256, false),
        (1, 8, 1024, 64, true),
        (1, 16, 1024, 128, true),
        (1, 8, 4096, 128, true),
    ];
    let mut rows = Vec::new();
    for (b, h, n, d, causal) in shapes {
        let x = random_on::<bf16>(stream, &[b, n, h, d], Layout::Bshd)?;
        let mut out = Tensor::uninit_on(stream, &[b, n, h, d], Layout::Bshd)?;
        let mask = if causal {
            Causal::BottomRight
        } else {
            Causal::None
        };
        let opts = AttentionOptions::default().causal(mask);
        let (ran, runs) = race_auto(stream, iters, &opts, |o| {
            attention_into(&x, &x, &x, &mut out, None, o)
        })?;
        let name = format!("{b}x{h}x{n}x{d}{}", if causal { "-causal" } else { "" });
        rows.push((name, ran, runs));
    }
    // Variable-length batches (bottom-right causal, each sequence as many queries as keys), which
    // Auto plans by their longest sequence: (lengths, query heads, kv heads, head dim).
    let batches: [(&[usize], usize, usize, usize); 3] = [
        (&[300, 100], 8, 2, 64),
        (&[600, 200], 8, 8, 128),
        (&[512, 256], 16, 4, 128),
    ];
    for (lengths, h, hk, d) in batches {
        let total: usize = lengths.iter().sum();
        let batch = VarlenBatch::from_lengths(lengths, lengths)?.to_device(stream)?;
        let q = random_on::<bf16>(stream, &[1, total, h, d], Layout::Bshd)?;
        let kv = random_on::<bf16>(stream, &[1, total, hk, d], Layout::Bshd)?;
        let mut out = Tensor::uninit_on(stream, &[1, total, h, d], Layout::Bshd)?;
        let opts = AttentionOptions::default().causal(Causal::BottomRight);
        let (ran, runs) = race_auto(stream, iters, &opts, |o| {
            attention_varlen_into(&q, &kv, &kv, &batch, &mut out, None, o)
        })?;
        rows.push((
            format!("varlen {lengths:?} x {h}kv{hk} x d{d}-causal"),
            ran,
            runs,
        ));
    }
    Ok(rows)
}

/// The additive-bias rows of issue 13 (4 x 16 x 2048 x 128 bf16, no causal mask: PyTorch takes
/// `attn_mask` or `is_causal`, not both; `scripts/torch_sdpa.py` times the same bias as
/// `attn_mask`), random normal inputs and biases: the call without a bias on WMMA and under Auto;
/// with a full bf16 bias `[4, 16, 2048, 2048]` (PyTorch's memory order) on WMMA and under Auto;
/// under Auto with one broadcast over the batch `[1, 16, 2048, 2048]`, and with a full f32 bias.
/// Returns the kernel Auto ran the full bias on and (plain WMMA, plain Auto, full bias WMMA, full
/// bias Auto, broadcast bias Auto, f32 bias Auto) us, medians.
fn bias_rows(stream: &Stream, iters: usize) -> flashcore::Result<(String, [f64; 6])> {
    let (b, h, s, d) = (4, 16, 2048, 128);
    let x = random_on::<bf16>(stream, &[b, s, h, d], Layout::Bshd)?;
    let mut out = Tensor::uninit_on(stream, &[b, s, h, d], Layout::Bshd)?;
    let median = |mut t: Vec<f64>| percentiles(&mut t).0;
    let mut time = |opts: AttentionOptions| -> flashcore::Result<f64> {
        Ok(median(time_fn(stream, 3, iters, |_| {
            attention_into(&x, &x, &x, &mut out, None, &opts).map(|_| ())
        })?))
    };
    let plain = AttentionOptions::default();
    let wmma = plain.backend(Backend::Kernel(Kernel::Wmma));
    let full = Bias::from(random_on::<bf16>(stream, &[b, h, s, s], Layout::Bhsd)?);
    let shared = Bias::from(random_on::<bf16>(stream, &[1, h, s, s], Layout::Bhsd)?);
    let wide = Bias::from(random_on::<f32>(stream, &[b, h, s, s], Layout::Bhsd)?);
    let ran = attention(&x, &x, &x, &plain.bias(full.clone()))?
        .execution
        .backend
        .name()
        .to_string();
    Ok((
        ran,
        [
            time(wmma.clone())?,
            time(plain.clone())?,
            time(wmma.bias(full.clone()))?,
            time(plain.bias(full))?,
            time(plain.bias(shared))?,
            time(plain.bias(wide))?,
        ],
    ))
}

fn main() {
    let args = parse();
    if let Some(path) = &args.shapes_json {
        write_shapes(path, &args.filter);
        return;
    }
    let device = Device::open(0).unwrap_or_else(|e| {
        eprintln!("bench needs a CUDA device: {e}");
        std::process::exit(1)
    });
    let stream = Stream::new(&device).expect("create stream");
    let list: Vec<BenchShape> = shapes()
        .into_iter()
        .filter(|s| s.name().contains(&args.filter))
        .collect();
    // Each shape's rows are printed as soon as it is measured, so that a run cut short keeps
    // the shapes it finished.
    println!(
        "{:<14} {:<5} {:<26} {:>10} {:>10} {:>10} {:>9} {:>7}",
        "backend", "dtype", "shape", "median_us", "p10_us", "p90_us", "TFLOP/s", "%peak"
    );
    let mut rows = Vec::new();
    for (i, shape) in list.iter().enumerate() {
        eprintln!("[{}/{}] {}", i + 1, list.len(), shape.name());
        let mut records = Vec::new();
        for dtype in ["f16", "bf16"] {
            let runs = match dtype {
                "f16" => gpu::<f16>(&stream, shape, args.iters, args.force, &args.kernels),
                _ => gpu::<bf16>(&stream, shape, args.iters, args.force, &args.kernels),
            };
            for (name, run) in runs {
                match run {
                    Ok(times_us) => records.push(Record {
                        backend: name,
                        dtype,
                        shape: *shape,
                        times_us,
                    }),
                    Err(e) => eprintln!("  {name} {dtype}: {e}"),
                }
            }
        }
        if shape.group == "seed" && shape.b == 4 && args.force.is_none() {
            if let Ok(times_us) = cpu::<f16>(shape, 3) {
                records.push(Record {
                    backend: "cpu",
                    dtype: "f16",
                    shape: *shape,
                    times_us,
                });
            }
        }
        for r in &mut records {
            let (med, p10, p90) = percentiles(&mut r.times_us);
            let tflops = r.shape.flops() / (med * 1e-6) / 1e12;
            let pct = args
                .peak
                .map_or(String::from("-"), |p| format!("{:.1}", 100.0 * tflops / p));
            println!(
                "{:<14} {:<5} {:<26} {:>10.1} {:>10.1} {:>10.1} {:>9.1} {:>7}",
                r.backend,
                r.dtype,
                r.shape.name(),
                med,
                p10,
                p90,
                tflops,
                pct
            );
            rows.push(json!({
                "impl": format!("flashcore/{}", r.backend), "dtype": r.dtype,
                "shape": r.shape.name(), "median_us": med, "p10_us": p10, "p90_us": p90,
                "tflops": tflops,
            }));
        }
        // The shapes so far, so that a run cut short (a device call's time limit) still leaves
        // merge_bench.py a file; the full document below replaces it.
        if let Some(path) = &args.json {
            let doc = json!({ "device": device.name(), "records": rows, "partial": true });
            write_json(path, &doc);
        }
    }
    let varlen = if !args.wants("varlen") {
        serde_json::Value::Null
    } else {
        match varlen_prefill(&stream, args.iters) {
            Ok(rows) => {
                for (kernel, [vus, vtf, dus, dtf]) in &rows {
                    println!(
                        "varlen prefill (16 causal seqs of 128-4096 tokens, 32kv8, d128, bf16) on \
                     {kernel}: {vus:.1} us {vtf:.1} TFLOP/s; dense 16 equal seqs, same tokens, \
                     same kernel: {dus:.1} us {dtf:.1} TFLOP/s; ratio {:.3}",
                        vtf / dtf
                    );
                }
                json!(rows
                    .iter()
                    .map(|(kernel, [vus, vtf, dus, dtf])| json!({ "kernel": kernel,
                    "varlen_us": vus, "varlen_tflops": vtf, "dense_us": dus, "dense_tflops": dtf }))
                    .collect::<Vec<_>>())
            }
            Err(e) => {
                eprintln!("varlen prefill: {e}");
                serde_json::Value::Null
            }
        }
    };
    let mut varlen_decodes = Vec::new();
    // Past two (sequence, kv head) units per SM (64 sequences: 512 packed units, 2048 unpacked)
    // Auto runs CUTLASS's decode row, as for a dense batch.
    let mixed: Vec<usize> = (0..64).map(|i| 1024 + i * 797 % 2048).collect();
    let decode_rows = if args.wants("varlen") {
        vec![
            (vec![32768], Layout::Bshd),
            (vec![8192; 16], Layout::Bshd),
            (vec![32768, 4096, 1000, 300], Layout::Bshd),
            (vec![4096; 32], Layout::Bshd),
            (vec![2048; 64], Layout::Bshd),
            (mixed.clone(), Layout::Bshd),
            (vec![8192; 16], Layout::Bhsd),
            (mixed, Layout::Bhsd),
        ]
    } else {
        Vec::new()
    };
    for (keys, layout) in decode_rows {
        let what = if keys.len() == 1 || keys.iter().all(|&k| k == keys[0]) {
            format!("{}x{}", keys.len(), keys[0])
        } else if keys.len() > 8 {
            format!(
                "{} sequences of {}-{}",
                keys.len(),
                keys.iter().min().unwrap(),
                keys.iter().max().unwrap()
            )
        } else {
            format!("{keys:?}")
        };
        let heads = if layout == Layout::Bshd {
            "packed heads"
        } else {
            "unpacked heads (BHSD)"
        };
        match varlen_decode(&stream, args.iters, &keys, layout) {
            Ok((ran, splits, [auto, wmma, hopper, cutlass, dense, gbps])) => {
                println!(
                    "varlen decode {what} keys, one query each (32kv8, d128, bf16, {heads}): \
                     {auto:.1} us on {ran} (Auto, {splits} splits, {gbps:.0} GB/s of K+V), \
                     {wmma:.1} us on wmma, {hopper:.1} us on cutlass-sm90, {cutlass:.1} us on \
                     cutlass-sm80; dense batch of the longest under Auto {dense:.1} us"
                );
                varlen_decodes.push(json!({ "keys": keys, "layout": format!("{layout:?}"),
                    "kernel": ran, "splits": splits, "auto_us": auto, "wmma_us": wmma,
                    "hopper_us": hopper, "cutlass_sm80_us": cutlass, "dense_us": dense,
                    "gbps": gbps }));
            }
            Err(e) => eprintln!("varlen decode {what}: {e}"),
        }
    }
    let paged = if !args.wants("paged") {
        serde_json::Value::Null
    } else {
        match paged_decode(&stream, args.iters) {
            Ok(rows) => {
                for (ran, [b, n, size, us, contiguous, gbps, stride, wmma, hopper]) in &rows {
                    let order = if *stride == 1.0 {
                        "in order"
                    } else {
                        "shuffled"
                    };
                    println!(
                    "paged decode {b}x{n} keys (32kv8, d128, bf16), pages of {size} ({order}): {us:.1} us \
                     on {ran} (Auto, {gbps:.0} GB/s of K+V), {wmma:.1} us on wmma, {hopper:.1} us \
                     on cutlass-sm90; contiguous K/V \
                     {contiguous:.1} us; ratio {:.3}",
                    us / contiguous
                );
                }
                json!(rows
                    .iter()
                    .map(|(ran, r)| json!({ "kernel": ran, "row": r }))
                    .collect::<Vec<_>>())
            }
            Err(e) => {
                eprintln!("paged decode: {e}");
                serde_json::Value::Null
            }
        }
    };
    let prefill = if !args.wants("paged") {
        serde_json::Value::Null
    } else {
        match paged_prefill(&stream, args.iters) {
            Ok((ran, [auto, wmma, hopper, contiguous])) => {
                println!(
                "paged chunked prefill 4x2048 queries on 8192 keys (32kv8, d128, bf16, causal), \
                 pages of 64 (shuffled): {auto:.1} us on {ran} (Auto), {wmma:.1} us on wmma, \
                 {hopper:.1} us on cutlass-sm90; contiguous K/V {contiguous:.1} us; ratio {:.3}",
                auto / contiguous
            );
                json!({ "kernel": ran, "auto_us": auto, "wmma_us": wmma, "hopper_us": hopper,
                    "contiguous_us": contiguous })
            }
            Err(e) => {
                eprintln!("paged prefill: {e}");
                serde_json::Value::Null
            }
        }
    };
    let modifiers = if !args.wants("modifiers") {
        serde_json::Value::Null
    } else {
        match score_modifiers(&stream, args.iters) {
            Ok(
                [full, windowed, auto, auto_windowed, plain, capped, alibi, auto_plain, auto_capped, auto_alibi],
            ) => {
                println!(
                "sliding window (1x32x16384x128 bf16 causal, wmma): full {full:.1} us, window 4096 \
                 {windowed:.1} us, ratio {:.3}; under Auto: full {auto:.1} us, window 4096 \
                 {auto_windowed:.1} us, ratio {:.3}",
                windowed / full,
                auto_windowed / auto
            );
                println!(
                "softcap 30 (4x32x4096x128 bf16 causal, wmma): {capped:.1} us vs {plain:.1} us \
                 without, ratio {:.3}",
                capped / plain
            );
                println!(
                    "softcap 30 (4x32x4096x128 bf16 causal, Auto): {auto_capped:.1} us vs \
                 {auto_plain:.1} us without, ratio {:.3}",
                    auto_capped / auto_plain
                );
                println!(
                "alibi (4x32x4096x128 bf16 causal, Auto, geometric slopes): {auto_alibi:.1} us \
                 vs {auto_plain:.1} us without, ratio {:.3}",
                auto_alibi / auto_plain
            );
                println!(
                    "alibi (4x32x4096x128 bf16 causal, wmma, geometric slopes): {alibi:.1} us vs \
                 {plain:.1} us without, ratio {:.3}",
                    alibi / plain
                );
                json!({ "full_us": full, "window_us": windowed, "auto_full_us": auto,
                    "auto_window_us": auto_windowed,
                    "plain_us": plain, "softcap_us": capped, "alibi_us": alibi,
                    "auto_plain_us": auto_plain, "auto_softcap_us": auto_capped,
                    "auto_alibi_us": auto_alibi })
            }
            Err(e) => {
                eprintln!("score modifiers: {e}");
                serde_json::Value::Null
            }
        }
    };
    let bias = if !args.wants("bias") {
        serde_json::Value::Null
    } else {
        match bias_rows(&stream, args.iters) {
            Ok((ran, [wmma, auto, full_wmma, full, shared, wide])) => {
                println!(
                    "bias (4x16x2048x128 bf16, random): without a bias {wmma:.1} us on wmma, \
                 {auto:.1} us under Auto; full bf16 bias [4,16,2048,2048] {full_wmma:.1} us on \
                 wmma (ratio {:.3}), {full:.1} us under Auto on {ran} (ratio {:.3}); broadcast \
                 [1,16,2048,2048] {shared:.1} us, f32 [4,16,2048,2048] {wide:.1} us under Auto",
                    full_wmma / wmma,
                    full / auto
                );
                json!({ "plain_wmma_us": wmma, "plain_auto_us": auto, "full_bias_wmma_us": full_wmma,
                    "full_bias_us": full, "auto_kernel": ran, "broadcast_bias_us": shared,
                    "f32_bias_us": wide })
            }
            Err(e) => {
                eprintln!("bias: {e}");
                serde_json::Value::Null
            }
        }
    };
    let overhead = if !args.wants("host") {
        serde_json::Value::Null
    } else {
        match host_overhead(&stream) {
            Ok(HostCost {
                ns: [rust, cpp, planned, cpp_planned, launch],
                ratios: [call_ratio, planned_ratio],
            }) => {
                println!(
                    "host cost per call: Rust attention_into {:.2} us, C++ attention_forward \
                     {:.2} us, ratio {:.3} (p10 {:.3}, p90 {:.3}); Rust planned run {:.2} us, \
                     C++ planned run {:.2} us, ratio {:.3} (p10 {:.3}, p90 {:.3}); C++ launcher \
                     alone {:.2} us (Rust call beyond it: {:.2} us)",
                    rust / 1e3,
                    cpp / 1e3,
                    call_ratio.0,
                    call_ratio.1,
                    call_ratio.2,
                    planned / 1e3,
                    cpp_planned / 1e3,
                    planned_ratio.0,
                    planned_ratio.1,
                    planned_ratio.2,
                    launch / 1e3,
                    (rust - launch) / 1e3,
                );
                json!({ "rust_ns": rust, "cpp_ns": cpp, "ratio": call_ratio.0,
                    "ratio_p10_p90": [call_ratio.1, call_ratio.2],
                    "planned_ns": planned, "cpp_planned_ns": cpp_planned,
                    "planned_ratio": planned_ratio.0,
                    "planned_ratio_p10_p90": [planned_ratio.1, planned_ratio.2],
                    "launcher_ns": launch })
            }
            Err(e) => {
                eprintln!("host overhead: {e}");
                serde_json::Value::Null
            }
        }
    };
    let small = if !args.wants("small") {
        serde_json::Value::Null
    } else {
        match small_prefill(&stream, args.iters) {
            Ok(rows) => {
                let mut out = Vec::new();
                for (name, ran, [auto, wmma, hopper]) in rows {
                    println!(
                        "small prefill {name} bf16: Auto {auto:.1} us on {ran}, wmma {wmma:.1} us, \
                         cutlass-sm90 {hopper:.1} us"
                    );
                    out.push(json!({ "shape": name, "auto_kernel": ran, "auto_us": auto,
                        "wmma_us": wmma, "hopper_us": hopper }));
                }
                serde_json::Value::Array(out)
            }
            Err(e) => {
                eprintln!("small prefill: {e}");
                serde_json::Value::Null
            }
        }
    };
    let backward = if !args.wants("backward") {
        serde_json::Value::Null
    } else {
        match backward_rows(&stream, args.iters, args.force, &args.kernels) {
            Ok(rows) => {
                let mut out = Vec::new();
                for (name, kernel, us, tflops, row) in rows {
                    println!(
                        "backward {name} bf16 {kernel}: {us:.1} us, {tflops:.1} TFLOP/s ({row})"
                    );
                    out.push(json!({ "shape": name, "kernel": kernel, "us": us, "tflops": tflops, "row": row }));
                }
                serde_json::Value::Array(out)
            }
            Err(e) => {
                eprintln!("backward: {e}");
                serde_json::Value::Null
            }
        }
    };
    if let Some(path) = args.json {
        let doc = json!({ "device": device.name(), "records": rows, "host_overhead": overhead,
                          "varlen_prefill": varlen, "varlen_decode": varlen_decodes, "paged_decode": paged, "paged_prefill": prefill,
                          "score_modifiers": modifiers, "bias": bias, "small_prefill": small,
                          "backward": backward });
        write_json(&path, &doc);
        eprintln!("wrote {path}");
    }
}

/// Writes `doc` to `path` whole: into a temporary file beside it, then renamed over it, so that a
/// run killed mid-write leaves the last complete document.
fn write_json(path: &str, doc: &serde_json::Value) {
    let tmp = format!("{path}.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(doc).unwrap()).expect("write json");
    std::fs::rename(&tmp, path).expect("rename json");
}
