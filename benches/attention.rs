//! Criterion bench racing every available backend over the named shape list: the GPU backends
//! timed with CUDA events (`iter_custom`), inputs rotated so L2 does not flatter; the CPU
//! reference on the tiny seed shape only (wall clock). `cargo bench --bench attention`.
//! Throughput is reported in FLOP/s ("elem/s"). The side-by-side torch table comes from
//! `examples/bench.rs` (see docs/PERFORMANCE.md).

mod common;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

use common::{shapes, time_calls, Inputs};
use flashcore::plan::Kernel;
use flashcore::{attention, AttentionElement, AttentionOptions, Device, Layout, Stream, Tensor};
use half::{bf16, f16};

fn bench_gpu<T: AttentionElement>(c: &mut Criterion, stream: &Stream, kernel: Kernel, dtype: &str) {
    let mut group = c.benchmark_group(format!("{}/{dtype}", kernel.name()));
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for shape in shapes() {
        let mut inputs =
            Inputs::<T>::new(stream, &shape, kernel.into(), None).expect("allocate bench inputs");
        group.throughput(Throughput::Elements(shape.flops() as u64));
        group.bench_function(shape.name(), |b| {
            b.iter_custom(|iters| {
                let times =
                    time_calls(stream, &mut inputs, 0, iters as usize).expect("timed calls");
                Duration::from_secs_f64(times.iter().sum::<f64>() * 1e-6)
            })
        });
    }
    group.finish();
}

/// The CPU reference on the smallest seed shape (the others take seconds per call).
fn bench_cpu(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu/f16");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for shape in shapes()
        .into_iter()
        .filter(|s| s.group == "seed" && s.b == 4)
    {
        let q = Tensor::full(
            f16::from_f32(0.5),
            &[shape.b, shape.h, shape.sq, shape.d],
            Layout::Bhsd,
        )
        .expect("host tensor");
        group.throughput(Throughput::Elements(shape.flops() as u64));
        group.bench_function(shape.name(), |b| {
            b.iter(|| attention(&q, &q, &q, &AttentionOptions::default()).expect("cpu attention"))
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_cpu(c);
    if Device::count() == 0 {
        eprintln!("no CUDA device: GPU backends skipped");
        return;
    }
    let device = Device::open(0).expect("open device 0");
    let stream = Stream::new(&device).expect("create stream");
    for kernel in Kernel::ALL {
        bench_gpu::<f16>(c, &stream, kernel, "f16");
        bench_gpu::<bf16>(c, &stream, kernel, "bf16");
    }
}

criterion_group!(attention_benches, benches);
criterion_main!(attention_benches);
