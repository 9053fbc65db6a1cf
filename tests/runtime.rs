//! The runtime spec's memory and concurrency hypotheses on the GPU (issue 14): the pool (H8),
//! fragmentation (H12), leaks, device out-of-memory (H9) and four threads sharing one device
//! (H13). Every test is ignored by default and *fails* (never passes silently) without a CUDA
//! device. The tests read process-wide pool and free-memory figures, so they take one lock and
//! run one at a time. Each prints the figure it measures (`--nocapture`).
//!
//! `cargo test --release --test runtime -- --include-ignored --nocapture`
#![cfg(feature = "cuda")]

mod common;

use std::sync::Mutex;

use common::{logical, naive, randn, rel_l2, Rng};
use flashcore::{
    attention, attention_into, AttentionOptions, Causal, Device, Error, Event, Layout, Stream,
    Tensor,
};
use half::{bf16, f16};

/// Serialises the tests of this file: they measure the device's shared pool.
static DEVICE: Mutex<()> = Mutex::new(());

fn device() -> (std::sync::MutexGuard<'static, ()>, Device, Stream) {
    let guard = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    common::watchdog::arm();
    let device = Device::open(0).expect("this test needs a CUDA device");
    let stream = Stream::new(&device).expect("create stream");
    (guard, device, stream)
}

const MIB: f64 = 1024.0 * 1024.0;

/// H8: 100 attention calls that each allocate fresh outputs (dense, with a logsumexp, and
/// split-KV decode, which also takes scratch memory) grow the pool fewer than 10 times.
#[test]
#[ignore = "needs a CUDA device"]
fn pool_grows_fewer_than_10_times_per_100_calls() {
    let (_lock, device, s) = device();
    let mut rng = Rng::fresh();
    let mut dev = |d: &[usize]| {
        randn::<bf16>(&mut rng, d, Layout::Bshd)
            .to_device(&s)
            .unwrap()
    };
    let (q, k) = (dev(&[2, 1024, 8, 128]), dev(&[2, 1024, 8, 128]));
    let (dq, dk) = (dev(&[1, 1, 32, 128]), dev(&[1, 16384, 8, 128]));
    let with_lse = AttentionOptions {
        return_lse: true,
        ..AttentionOptions::default().causal(Causal::TopLeft)
    };
    let decode = AttentionOptions::default();
    let (mut growths, mut reserved) = (0, device.pool_usage().unwrap().reserved);
    for call in 0..100 {
        let done = if call % 2 == 0 {
            attention(&q, &k, &k, &with_lse).unwrap()
        } else {
            let d = attention(&dq, &dk, &dk, &decode).unwrap();
            assert!(d.execution.splits > 1, "decode splits: {:?}", d.execution);
            d
        };
        drop(done); // freed stream-ordered, back into the pool
        let now = device.pool_usage().unwrap().reserved;
        if now > reserved {
            growths += 1;
        }
        reserved = now;
    }
    s.synchronize().unwrap();
    println!(
        "H8: {growths} pool growths over 100 calls with fresh outputs (reserved {:.1} MiB)",
        reserved as f64 / MIB
    );
    assert!(growths < 10, "{growths} pool growths in 100 calls");
}

/// H12: 10,000 random allocations and frees (sizes 1 KiB to 10 MiB, log-uniform; 70% allocate,
/// 30% free a random live one), then a trim: the pool keeps at most 1.1x the live bytes.
#[test]
#[ignore = "needs a CUDA device"]
fn pool_after_random_traffic_and_trim_holds_at_most_1_1x_live_bytes() {
    let (_lock, device, s) = device();
    s.synchronize().unwrap();
    device.trim_pool(0).unwrap();
    let base = device.pool_usage().unwrap();
    let mut rng = Rng::fresh();
    let octaves = (10.0 * MIB).log2() - 10.0; // 1 KiB .. 10 MiB
    let mut live: Vec<Tensor<f16>> = Vec::new();
    let (mut allocs, mut frees) = (0, 0);
    for _ in 0..10_000 {
        if rng.uniform() < 0.7 || live.is_empty() {
            let bytes = 2f64.powf(10.0 + rng.uniform() * octaves); // log-uniform
            let elems = bytes as usize / 2; // f16
            live.push(Tensor::uninit_on(&s, &[1, elems, 1, 1], Layout::Bshd).unwrap());
            allocs += 1;
        } else {
            let at = (rng.uniform() * live.len() as f64) as usize;
            live.swap_remove(at.min(live.len() - 1));
            frees += 1;
        }
    }
    let live_bytes: u64 = live.iter().map(|t| 2 * t.shape().seq as u64).sum();
    s.synchronize().unwrap();
    let before = device.pool_usage().unwrap();
    device.trim_pool(0).unwrap();
    let after = device.pool_usage().unwrap();
    let reserved = after.reserved - base.reserved;
    let ratio = reserved as f64 / live_bytes as f64;
    println!(
        "H12: {allocs} allocations, {frees} frees, {} live = {:.1} MiB; pool used {:.1} MiB, \
         reserved {:.1} MiB before the trim, {:.1} MiB after: {ratio:.3}x the live bytes",
        live.len(),
        live_bytes as f64 / MIB,
        (after.used - base.used) as f64 / MIB,
        (before.reserved - base.reserved) as f64 / MIB,
        reserved as f64 / MIB,
    );
    assert!(
        ratio <= 1.1,
        "reserved {ratio:.3}x the live bytes after a trim"
    );
    drop(live);
    s.synchronize().unwrap();
    device.trim_pool(0).unwrap();
}

/// No leaks: 10,000 cycles that create and drop a stream, an event, a device tensor and a copy
/// of a host tensor leave the device's free memory where it was, after a trim (the pool keeps
/// nothing once trimmed with no live allocation).
#[test]
#[ignore = "needs a CUDA device"]
fn create_drop_cycles_leak_nothing() {
    let (_lock, device, s) = device();
    let host = Tensor::full(f16::ONE, &[1, 64, 4, 64], Layout::Bshd).unwrap();
    let settle = || {
        s.synchronize().unwrap();
        device.trim_pool(0).unwrap();
        device.free_memory().unwrap() as i64
    };
    // One warm cycle first: the runtime's first stream and event create lazy state for good.
    drop((Stream::new(&device).unwrap(), Event::new(&device).unwrap()));
    let start = settle();
    for _ in 0..10_000 {
        let stream = Stream::new(&device).unwrap();
        let event = Event::new(&device).unwrap();
        let t = Tensor::<f16>::uninit_on(&stream, &[1, 256, 8, 64], Layout::Bshd).unwrap();
        let copy = host.to_device(&stream).unwrap();
        event.record(&stream).unwrap();
        drop((t, copy));
        event.synchronize().unwrap();
    }
    let delta = start - settle();
    println!("leaks: free device memory {delta} bytes lower after 10,000 create/drop cycles");
    assert!(
        delta.abs() <= 2 << 20,
        "free memory moved by {delta} bytes (slack: the driver's 2 MiB granule)"
    );
}

/// H9: asking for more than the GPU has is `OutOfDeviceMemory`, both for one impossible
/// request and after filling the device; the same process then allocates and computes
/// attention correctly.
#[test]
#[ignore = "needs a CUDA device"]
fn device_out_of_memory_is_an_error_and_the_process_goes_on() {
    let (_lock, device, s) = device();
    let too_many = device.total_memory() / 2 + 1; // f16 elements: more bytes than the device has
    match Tensor::<f16>::uninit_on(&s, &[1, too_many, 1, 1], Layout::Bshd) {
        Err(Error::OutOfDeviceMemory { bytes }) => assert_eq!(bytes, 2 * too_many),
        other => panic!("expected OutOfDeviceMemory, got {other:?}"),
    }
    // Fill the device 1 GiB at a time until it refuses.
    let gib = 1 << 29; // f16 elements
    let mut held = Vec::new();
    let refused = loop {
        assert!(held.len() <= device.total_memory() >> 30, "never refused");
        match Tensor::<f16>::uninit_on(&s, &[1, gib, 1, 1], Layout::Bshd) {
            Ok(t) => held.push(t),
            Err(e) => break e,
        }
    };
    println!(
        "H9: {} GiB held, then {refused}; the first request of {} bytes: OutOfDeviceMemory",
        held.len(),
        2 * too_many
    );
    assert!(
        matches!(refused, Error::OutOfDeviceMemory { bytes } if bytes == 2 * gib),
        "{refused:?}"
    );
    drop(held);
    s.synchronize().unwrap();
    device.trim_pool(0).unwrap();
    let mut rng = Rng::fresh();
    let q = randn::<f16>(&mut rng, &[2, 300, 8, 64], Layout::Bshd);
    let k = randn::<f16>(&mut rng, &[2, 300, 8, 64], Layout::Bshd);
    let v = randn::<f16>(&mut rng, &[2, 300, 8, 64], Layout::Bshd);
    let opts = AttentionOptions::default().causal(Causal::BottomRight);
    let (dq, dk, dv) = (
        q.to_device(&s).unwrap(),
        k.to_device(&s).unwrap(),
        v.to_device(&s).unwrap(),
    );
    let mut out = Tensor::full(f16::NAN, &[2, 300, 8, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    attention_into(&dq, &dk, &dv, &mut out, None, &opts).unwrap();
    let (want, _) = naive(&q, &k, &v, 1.0 / 8.0, Causal::BottomRight);
    let err = rel_l2(&logical(&out.to_host().unwrap()), &want);
    assert!(err < 2e-3, "after the out-of-memory errors: rel L2 {err}");
}

/// H13: four threads, each with its own stream, 1,000 launches each on their own data: every
/// output equals the single-thread result bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn four_threads_on_one_device_match_one_thread_bit_for_bit() {
    let (_lock, device, s) = device();
    const SETS: usize = 8;
    const THREADS: usize = 4;
    const ROUNDS: usize = 100;
    const BATCH: usize = 10; // launches enqueued between two checks
    let dims = [1, 256, 8, 64];
    let opts = [
        AttentionOptions::default(),
        AttentionOptions::default().causal(Causal::BottomRight),
    ];
    let mut rng = Rng::fresh();
    let inputs: Vec<[Tensor<f16>; 3]> = (0..SETS)
        .map(|_| std::array::from_fn(|_| randn(&mut rng, &dims, Layout::Bshd)))
        .collect();
    // The single-thread results, on this thread's stream.
    let reference: Vec<Vec<f16>> = inputs
        .iter()
        .enumerate()
        .map(|(i, [q, k, v])| {
            let d = |t: &Tensor<f16>| t.to_device(&s).unwrap();
            let out = attention(&d(q), &d(k), &d(v), &opts[i % 2]).unwrap().out;
            out.to_host().unwrap().host_data().unwrap().to_vec()
        })
        .collect();
    let mismatches: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (device, inputs, reference, opts) = (&device, &inputs, &reference, &opts);
                scope.spawn(move || {
                    let stream = Stream::new(device).unwrap();
                    let mine = [t, t + THREADS]; // this thread's two data sets
                    let on_device: Vec<[Tensor<f16>; 3]> = mine
                        .iter()
                        .map(|&i| std::array::from_fn(|j| inputs[i][j].to_device(&stream).unwrap()))
                        .collect();
                    let mut outs: Vec<Tensor<f16>> = (0..BATCH)
                        .map(|_| Tensor::uninit_on(&stream, &dims, Layout::Bshd).unwrap())
                        .collect();
                    let mut wrong = 0;
                    for round in 0..ROUNDS {
                        for (n, out) in outs.iter_mut().enumerate() {
                            let pick = (round + n) % 2;
                            let [q, k, v] = &on_device[pick];
                            attention_into(q, k, v, out, None, &opts[mine[pick] % 2]).unwrap();
                        }
                        for (n, out) in outs.iter().enumerate() {
                            let want = &reference[mine[(round + n) % 2]];
                            let got = out.to_host().unwrap();
                            if got.host_data().unwrap() != want.as_slice() {
                                wrong += 1;
                            }
                        }
                    }
                    wrong
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    println!(
        "H13: {THREADS} threads x {} launches, {mismatches} outputs differ from one thread's",
        ROUNDS * BATCH
    );
    assert_eq!(mismatches, 0);
}
