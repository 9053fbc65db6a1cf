//! Runs attention on the best available backend (GPU if present, else CPU) and prints the
//! backend, shape, time and error against the float64 CPU reference.
//!
//! `cargo run --release --example attention -- [B H S D] [--causal] [--bf16]
//! [--backend auto|cutlass|cutlass-sm80|wmma|cutlass-sm90] [--kv-heads HK] [--seq-k SK]
//! [--page-size P] [--iters N]` (default: the mission shape 1 x 8 x 512 x 64, f16, `Auto`; K and
//! V have H heads and S keys unless given; N timed calls, 20 by default). With `--page-size`, K
//! and V are read from a paged cache of pages of P keys (SK a multiple of P) in shuffled order,
//! so that one paged call can run under a profiler or a sanitizer.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::{logical, randn, random_pages, rel_l2, Rng};
use flashcore::plan::Kernel;
use flashcore::{
    attention, attention_paged, AttentionElement, AttentionOptions, AttentionOutput, Backend,
    Causal, Layout, PageTable, Tensor,
};
use half::{bf16, f16};

struct Args {
    dims: [usize; 4],
    kv_heads: Option<usize>,
    seq_k: Option<usize>,
    page_size: Option<usize>,
    iters: usize,
    causal: bool,
    bf16: bool,
    backend: Backend,
}

fn parse() -> Result<Args, String> {
    let mut dims = Vec::new();
    let (mut causal, mut bf16, mut backend) = (false, false, Backend::Auto);
    let (mut kv_heads, mut seq_k, mut page_size, mut iters) = (None, None, None, 20);
    let mut args = std::env::args().skip(1);
    let count = |name: &str, value: Option<String>| {
        value
            .and_then(|v| v.parse::<usize>().ok())
            .ok_or_else(|| format!("{name} needs a count"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--kv-heads" => kv_heads = Some(count("--kv-heads", args.next())?),
            "--seq-k" => seq_k = Some(count("--seq-k", args.next())?),
            "--page-size" => page_size = Some(count("--page-size", args.next())?.max(1)),
            "--iters" => iters = count("--iters", args.next())?.max(1),
            "--causal" => causal = true,
            "--bf16" => bf16 = true,
            "--backend" => {
                backend = match args.next().as_deref() {
                    Some("auto") => Backend::Auto,
                    Some("cutlass") => Backend::Kernel(Kernel::CutlassSm80),
                    Some(name) => Kernel::from_name(name)
                        .map(Backend::Kernel)
                        .ok_or_else(|| format!("bad --backend {name:?}"))?,
                    None => return Err("--backend needs a name".into()),
                }
            }
            n => dims.push(
                n.parse::<usize>()
                    .map_err(|_| format!("bad argument {n:?}"))?,
            ),
        }
    }
    let dims = match dims.len() {
        0 => [1, 8, 512, 64],
        4 => [dims[0], dims[1], dims[2], dims[3]],
        _ => return Err("give all four of B H S D, or none".into()),
    };
    let keys = seq_k.unwrap_or(dims[2]);
    if let Some(page) = page_size.filter(|page| keys % page != 0) {
        return Err(format!(
            "--page-size {page} does not divide the {keys} keys"
        ));
    }
    Ok(Args {
        dims,
        kv_heads,
        seq_k,
        page_size,
        iters,
        causal,
        bf16,
        backend,
    })
}

fn run<T: AttentionElement>(args: &Args) -> flashcore::Result<()> {
    let [b, h, s, d] = args.dims;
    let (hk, sk) = (args.kv_heads.unwrap_or(h), args.seq_k.unwrap_or(s));
    let mut rng = Rng::fresh();
    // BHSD, as PyTorch lays it out; K and V BSHD for a paged cache, whose pages are BSHD rows.
    let q = randn::<T>(&mut rng, &[b, h, s, d], Layout::Bhsd);
    let (k, v) = match args.page_size {
        Some(_) => (
            randn::<T>(&mut rng, &[b, sk, hk, d], Layout::Bshd),
            randn::<T>(&mut rng, &[b, sk, hk, d], Layout::Bshd),
        ),
        None => (
            randn::<T>(&mut rng, &[b, hk, sk, d], Layout::Bhsd),
            randn::<T>(&mut rng, &[b, hk, sk, d], Layout::Bhsd),
        ),
    };
    let paged = match args.page_size {
        Some(page) => {
            let (rows, pages) = random_pages(&mut rng, page, &vec![sk; b], 0);
            let (kc, vc) = (
                to_pages(&k, &rows, page, pages)?,
                to_pages(&v, &rows, page, pages)?,
            );
            Some((kc, vc, PageTable::new(page, rows, vec![sk as i32; b])?))
        }
        None => None,
    };
    let causal = if args.causal {
        Causal::BottomRight
    } else {
        Causal::None
    };
    let opts = AttentionOptions::default().causal(causal);

    let (kc, vc, pages) = match &paged {
        Some((kc, vc, table)) => (kc, vc, Some(table)),
        None => (&k, &v, None),
    };
    let (result, ms, backend) =
        run_best(&q, kc, vc, pages, &opts.backend(args.backend), args.iters)?;
    let reference = attention(&q, &k, &v, &opts.backend(Backend::Cpu))?;
    let err = rel_l2(&logical(&result), &logical(&reference.out));
    let paging = args
        .page_size
        .map_or(String::new(), |p| format!(" pages_of={p}"));
    println!(
        "backend={} dtype={:?} shape=B{b}xH{h}(kv {hk})xS{s}(keys {sk})xD{d} causal={}{paging} time={ms:.4} ms rel_l2_vs_cpu_f64={err:.3e}",
        backend,
        T::DTYPE,
        args.causal,
    );
    if err.is_nan() || err >= 1e-2 {
        return Err(flashcore::Error::Launch(format!("error {err} over 1e-2")));
    }
    Ok(())
}

/// `x` (BSHD [b, keys, heads, d]) as a paged cache [pages, page, heads, d]: sequence b's page j
/// at cache page `rows[b][j]` (random_pages' table rows).
fn to_pages<T: AttentionElement>(
    x: &Tensor<T>,
    rows: &[Vec<i32>],
    page: usize,
    pages: usize,
) -> flashcore::Result<Tensor<T>> {
    let s = x.shape();
    let data = x
        .host_data()
        .ok_or_else(|| flashcore::Error::Launch("K and V are made on the host".into()))?;
    let size = page * s.heads * s.head_dim;
    let mut cache = data.to_vec();
    for (from, &at) in data.chunks(size).zip(rows.iter().flatten()) {
        let at = at as usize * size;
        cache[at..at + size].copy_from_slice(from);
    }
    Tensor::from_vec(cache, &[pages, page, s.heads, s.head_dim], Layout::Bshd)
}

/// One call: with contiguous K and V, or with paged caches and their table.
fn call<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    pages: Option<&PageTable>,
    opts: &AttentionOptions,
) -> flashcore::Result<AttentionOutput<T>> {
    match pages {
        Some(table) => attention_paged(q, k, v, table, opts),
        None => attention(q, k, v, opts),
    }
}

/// Runs on the GPU when one is present (median of `iters` timed calls, CUDA events), else on the
/// CPU (one call, wall clock). Returns the output on the host, the time per call and the backend.
#[cfg(feature = "cuda")]
fn run_best<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    pages: Option<&PageTable>,
    opts: &AttentionOptions,
    iters: usize,
) -> flashcore::Result<(Tensor<T>, f64, &'static str)> {
    use flashcore::{Device, Event, Stream};
    if Device::count() == 0 {
        return run_cpu(q, k, v, pages, opts);
    }
    let device = Device::open(0)?;
    let stream = Stream::new(&device)?;
    let (dq, dk, dv) = (
        q.to_device(&stream)?,
        k.to_device(&stream)?,
        v.to_device(&stream)?,
    );
    let dpages = pages.map(|p| p.to_device(&stream)).transpose()?;
    let warm = call(&dq, &dk, &dv, dpages.as_ref(), opts)?;
    let (start, end) = (Event::new(&device)?, Event::new(&device)?);
    let mut times = Vec::new();
    for _ in 0..iters {
        start.record(&stream)?;
        let r = call(&dq, &dk, &dv, dpages.as_ref(), opts)?;
        end.record(&stream)?;
        times.push(f64::from(start.elapsed_ms(&end)?));
        drop(r);
    }
    times.sort_by(f64::total_cmp);
    let backend = warm.execution.backend.name();
    Ok((warm.out.to_host()?, times[times.len() / 2], backend))
}

#[cfg(not(feature = "cuda"))]
fn run_best<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    pages: Option<&PageTable>,
    opts: &AttentionOptions,
    _iters: usize,
) -> flashcore::Result<(Tensor<T>, f64, &'static str)> {
    run_cpu(q, k, v, pages, opts)
}

fn run_cpu<T: AttentionElement>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    pages: Option<&PageTable>,
    opts: &AttentionOptions,
) -> flashcore::Result<(Tensor<T>, f64, &'static str)> {
    let t0 = Instant::now();
    let r = call(q, k, v, pages, opts)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    Ok((r.out, ms, r.execution.backend.name()))
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "{e}\nusage: attention [B H S D] [--causal] [--bf16] [--backend auto|cutlass|wmma] \
                 [--kv-heads HK] [--seq-k SK] [--page-size P] [--iters N]"
            );
            std::process::exit(2);
        }
    };
    let res = if args.bf16 {
        run::<bf16>(&args)
    } else {
        run::<f16>(&args)
    };
    if let Err(e) = res {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
