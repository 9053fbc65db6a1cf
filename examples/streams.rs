//! Multi-stream speedup (the runtime spec's H10): N independent small attention calls, each set
//! of inputs and outputs living on its own stream, against the same calls with every set on one
//! stream. One host thread enqueues round-robin; the time is the wall clock from a synchronised
//! start until every stream has finished (median of 9 repetitions).
//!
//! `cargo run --release --example streams -- [STREAMS] [CALLS_PER_STREAM]` (default 4, 200)

use std::time::Instant;

use flashcore::{attention_into, AttentionOptions, Device, Layout, Stream, Tensor};
use half::f16;

/// Q, K, V and the output of one call, allocated on one stream.
struct Set {
    qkv: Tensor<f16>,
    out: Tensor<f16>,
}

fn sets(streams: &[&Stream], dims: [usize; 4]) -> flashcore::Result<Vec<Set>> {
    let host = Tensor::full(f16::from_f32(0.5), &dims, Layout::Bshd)?;
    streams
        .iter()
        .map(|s| {
            Ok(Set {
                qkv: host.to_device(s)?,
                out: Tensor::uninit_on(s, &dims, Layout::Bshd)?,
            })
        })
        .collect()
}

/// Wall-clock µs of `calls` rounds over `sets` (one call per set per round), median of 9.
fn time(sets: &mut [Set], streams: &[&Stream], calls: usize) -> flashcore::Result<f64> {
    let opts = AttentionOptions::default();
    let mut times = Vec::new();
    for rep in 0..10 {
        for s in streams {
            s.synchronize()?;
        }
        let t0 = Instant::now();
        for _ in 0..calls {
            for set in sets.iter_mut() {
                attention_into(&set.qkv, &set.qkv, &set.qkv, &mut set.out, None, &opts)?;
            }
        }
        for s in streams {
            s.synchronize()?;
        }
        if rep > 0 {
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn main() -> flashcore::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(4, |a| a.parse().expect("STREAMS"));
    let calls: usize = args
        .next()
        .map_or(200, |a| a.parse().expect("CALLS_PER_STREAM"));
    let device = Device::open(0)?;
    let streams: Vec<Stream> = (0..n)
        .map(|_| Stream::new(&device))
        .collect::<flashcore::Result<_>>()?;
    let all: Vec<&Stream> = streams.iter().collect();
    println!(
        "{} ({} SMs): {n} streams x {calls} calls each, f16, dense BSHD, Auto",
        device.name(),
        device.sm_count()
    );
    println!(
        "| shape (b x s x h x d) | one stream µs/call | {n} streams µs/call | speedup | kernel |"
    );
    println!("|---|---|---|---|---|");
    for dims in [
        [1, 128, 4, 64],
        [1, 256, 8, 64],
        [1, 512, 4, 64],
        [1, 512, 8, 128],
        [1, 1024, 2, 128],
    ] {
        let mut one = sets(&vec![all[0]; n], dims)?;
        let mut many = sets(&all, dims)?;
        let kernel = {
            let s = &mut one[0];
            attention_into(
                &s.qkv,
                &s.qkv,
                &s.qkv,
                &mut s.out,
                None,
                &Default::default(),
            )?
        };
        let t1 = time(&mut one, &all[..1], calls)?;
        let tn = time(&mut many, &all, calls)?;
        let per = (n * calls) as f64;
        println!(
            "| {}x{}x{}x{} | {:.2} | {:.2} | {:.2}x | {} |",
            dims[0],
            dims[1],
            dims[2],
            dims[3],
            t1 / per,
            tn / per,
            t1 / tn,
            kernel.backend.name()
        );
    }
    Ok(())
}
