//! Criterion bench racing every available backend over the named shape list, timed with CUDA
//! events (`iter_custom`), inputs rotated so L2 does not flatter. `cargo bench --bench attention`.
//! Reports time; TFLOP/s and the side-by-side torch table come from `examples/bench.rs`.

mod common;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

use common::{shapes, time_calls, Inputs};
use flashcore::{AttentionElement, Device, Stream};
use half::{bf16, f16};

fn bench_dtype<T: AttentionElement>(c: &mut Criterion, stream: &Stream, dtype: &str) {
    let mut group = c.benchmark_group(format!("cutlass-sm80/{dtype}"));
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for shape in shapes() {
        let mut inputs = Inputs::<T>::new(stream, &shape, None).expect("allocate bench inputs");
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

fn benches(c: &mut Criterion) {
    if Device::count() == 0 {
        eprintln!("no CUDA device: GPU backends skipped (the CPU backend is raced by examples/bench.rs on tiny shapes)");
        return;
    }
    let device = Device::open(0).expect("open device 0");
    let stream = Stream::new(&device).expect("create stream");
    bench_dtype::<f16>(c, &stream, "f16");
    bench_dtype::<bf16>(c, &stream, "bf16");
}

criterion_group!(attention, benches);
criterion_main!(attention);
