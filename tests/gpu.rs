//! GPU suite: every GPU backend ([`Kernel::ALL`]: CUTLASS example 41, WMMA and, on compute
//! capability 9.0, the Hopper kernel) vs the f64 reference over one matrix. Every test is ignored by
//! default and *fails* (never passes silently) when no CUDA device is present. Run with
//! `cargo test --release --test gpu -- --include-ignored`, or the bundle's runner.
#![cfg(feature = "cuda")]

mod common;

use common::{
    dims, logical, lse_values, naive, naive_paged, naive_varlen, randn, random_lengths,
    random_pages, random_varlen, rel_l2, tokens, varlen_of_lengths, Rng,
};
use flashcore::interop::{
    cpp_attention_forward, cpp_attention_paged, cpp_attention_varlen, CppDeviceBuffer,
};
use flashcore::plan::{
    auto_kernel, decode_table, kv_splits, sequence_splits, tile_table, ArchClass, BackwardKernel,
    Kernel,
};
use flashcore::{
    attention, attention_into, attention_paged, attention_paged_into, attention_varlen,
    attention_varlen_into, merge_state_into, merge_states, AlibiSlopes, AttentionElement,
    AttentionOptions, AttentionPlan, AttentionState, Backend, BackendKind, Bias, Capture, Causal,
    DType, Device, Error, Execution, Layout, OffsetRule, Operand, PageTable, Shape, Stream, Tensor,
    VarlenBatch,
};
use half::{bf16, f16};

/// Counts the heap allocations of each thread (a thread-local counter: the suite's tests run on
/// several threads at once), for the hot-path test below.
struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count_allocation() {
    // try_with: a thread being torn down has no counter left (and allocates nothing we count).
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged,
// so System's guarantees hold; counting touches only a const-initialised thread-local Cell,
// which neither allocates nor unwinds.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: forwarded as received (see the impl).
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: forwarded as received (see the impl).
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        count_allocation();
        // SAFETY: forwarded as received (see the impl).
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: forwarded as received (see the impl).
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(std::cell::Cell::get)
}

/// Fails with every collected case failure, one per line.
fn assert_none_failed(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn stream() -> Stream {
    common::watchdog::arm();
    let device = Device::open(0).expect("this test needs a CUDA device");
    Stream::new(&device).expect("create stream")
}

#[derive(Debug, Clone, Copy)]
struct Case {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    causal: Causal,
    layout: Layout,
    lse: bool,
    force: Option<ArchClass>,
    /// `None`: `1 / sqrt(d)`.
    scale: Option<f32>,
    /// `None`: run the case on every GPU kernel ([`Kernel::ALL`]).
    backend: Option<Kernel>,
}

const fn case(b: usize, h: usize, s: usize, d: usize) -> Case {
    Case {
        b,
        sq: s,
        sk: s,
        hq: h,
        hk: h,
        d,
        causal: Causal::None,
        layout: Layout::Bshd,
        lse: false,
        force: None,
        scale: None,
        backend: None,
    }
}

/// Fresh random Q, K and V of `c` on the host.
fn case_inputs<T: AttentionElement>(c: &Case) -> [Tensor<T>; 3] {
    let mut rng = Rng::fresh();
    let (qs, ks) = (
        Shape::new(c.b, c.sq, c.hq, c.d),
        Shape::new(c.b, c.sk, c.hk, c.d),
    );
    [qs, ks, ks].map(|shape| randn::<T>(&mut rng, &dims(shape, c.layout), c.layout))
}

/// `c`'s output, and its logsumexp where it asks for one, on the device, every element NaN.
fn poisoned_outputs<T: AttentionElement>(s: &Stream, c: &Case) -> (Tensor<T>, Option<Tensor<f32>>) {
    let qs = Shape::new(c.b, c.sq, c.hq, c.d);
    let out = Tensor::full(T::from_f64(f64::NAN), &dims(qs, c.layout), c.layout);
    let lse = c.lse.then(|| {
        let lse = Tensor::full(f32::NAN, &[c.b, c.hq, c.sq, 1], Layout::Bhsd);
        lse.unwrap().to_device(s).unwrap()
    });
    (out.unwrap().to_device(s).unwrap(), lse)
}

/// Runs one case on the GPU with a NaN-poisoned output and returns the relative L2 error of
/// the output (and of the lse, if asked) against the f64 reference.
fn run_case<T: AttentionElement>(s: &Stream, c: Case, kernel: Kernel) -> (f64, f64) {
    let [q, k, v] = case_inputs::<T>(&c);
    let (mut out, mut lse) = poisoned_outputs::<T>(s, &c);
    let opts = AttentionOptions {
        causal: c.causal,
        backend: Backend::from(kernel),
        return_lse: c.lse,
        force_arch_class: c.force,
        scale: c.scale,
        ..Default::default()
    };
    let (dq, dk, dv) = (
        q.to_device(s).unwrap(),
        k.to_device(s).unwrap(),
        v.to_device(s).unwrap(),
    );
    let exec = attention_into(&dq, &dk, &dv, &mut out, lse.as_mut(), &opts)
        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert_eq!(exec.backend, BackendKind::from(kernel));
    if let Some(class) = c.force {
        assert_eq!(exec.tile.unwrap().arch, class);
    }
    let got = logical(&out.to_host().unwrap());
    let scale = c.scale.map_or(1.0 / (c.d as f64).sqrt(), f64::from);
    let (want, want_lse) = naive(&q, &k, &v, scale, c.causal);
    let lse_err = lse.map_or(0.0, |l| {
        rel_l2(&lse_values(&l.to_host().unwrap()), &want_lse)
    });
    (rel_l2(&got, &want), lse_err)
}

fn tolerance<T: AttentionElement>() -> f64 {
    if T::DTYPE == DType::BF16 {
        1e-2
    } else {
        2e-3
    }
}

/// Whether `kernel` runs on device 0: compiled, and for the Hopper kernel compute capability
/// 9.0 (a build without 90 among its archs, run on an H200, has none).
fn runs_here(kernel: Kernel) -> bool {
    common::watchdog::arm();
    let device = Device::open(0).expect("this test needs a CUDA device");
    kernel.is_compiled() && (kernel != Kernel::CutlassSm90 || device.compute_capability() == (9, 0))
}

/// `device`'s tile-table class.
fn class_of(device: &Device) -> Option<ArchClass> {
    let (major, minor) = device.compute_capability();
    ArchClass::from_compute_capability(major, minor, device.shared_memory_per_block_optin())
}

/// The class whose rules [`auto_kernel`] should follow for device 0: its own where the Hopper
/// kernel runs or its class never uses it, else Sm80's (the class only decides whether Auto
/// counts on the Hopper kernel).
fn auto_class(device: &Device) -> ArchClass {
    let class = class_of(device).expect("a device this build supports");
    if class == ArchClass::Sm90 && !runs_here(Kernel::CutlassSm90) {
        ArchClass::Sm80
    } else {
        class
    }
}

/// The families that take variable-length batches, paged caches and key splits and run on
/// device 0: WMMA, and the Hopper kernel on compute capability 9.0.
fn indexed_kernels_here() -> Vec<Kernel> {
    [Kernel::Wmma, Kernel::CutlassSm90]
        .into_iter()
        .filter(|&k| runs_here(k))
        .collect()
}

/// The families that take variable-length batches and run on device 0: those of
/// [`indexed_kernels_here`] and CUTLASS example 41 (which splits no keys and reads no pages).
fn varlen_kernels_here() -> Vec<Kernel> {
    let mut kernels = indexed_kernels_here();
    kernels.push(Kernel::CutlassSm80);
    kernels
}

/// Runs every case (on its pinned kernel, or on every kernel that runs here) and fails listing
/// all cases over tolerance (NaN counts as infinite error).
fn check_all<T: AttentionElement>(cases: &[Case]) {
    let s = stream();
    let mut failures = Vec::new();
    for &c in cases {
        let pinned = c.backend.map(|k| [k]);
        let kernels = pinned.as_ref().map_or(&Kernel::ALL[..], |p| &p[..]);
        for &backend in kernels.iter().filter(|&&k| runs_here(k)) {
            let (err, lse_err) = run_case::<T>(&s, c, backend);
            println!(
                "{backend:?} {:?} {c:?}: rel L2 {err:.2e} lse {lse_err:.2e}",
                T::DTYPE
            );
            if err.is_nan() || err >= tolerance::<T>() || lse_err.is_nan() || lse_err >= 1e-4 {
                failures.push(format!(
                    "{backend:?} {c:?}: out {err:.3e}, lse {lse_err:.3e}"
                ));
            }
        }
    }
    assert_none_failed(&failures);
}

fn both_dtypes(cases: &[Case]) {
    check_all::<f16>(cases);
    check_all::<bf16>(cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn seed_shapes() {
    both_dtypes(&[
        case(1, 8, 512, 64),
        case(4, 8, 256, 64),
        case(1, 8, 1024, 64),
    ]);
}

#[test]
#[ignore = "needs a CUDA device"]
fn odd_lengths_and_unequal_seqs() {
    let mut cases = vec![case(2, 4, 1, 64), case(2, 4, 17, 64), case(1, 4, 1000, 64)];
    for (sq, sk) in [(100, 300), (300, 100), (1, 777), (129, 65)] {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            if causal == Causal::BottomRight && sq > sk {
                continue; // refused by validation (rows without keys)
            }
            cases.push(Case {
                sq,
                sk,
                causal,
                ..case(2, 4, 0, 64)
            });
        }
    }
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn long_sequences_with_partial_tiles() {
    // 4097 = 32 x 128 + 1 leaves a one-row query tile and a one-key key tile at every tile size
    // of the Hopper table; the masked tiles cross the diagonal and the sequence end at once.
    // Hopper only (the other kernels run the shorter odd lengths above): the f64 reference of
    // one such head costs seconds.
    let mut cases = Vec::new();
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        cases.push(Case {
            sq: 4097,
            sk: 4097,
            causal,
            lse: true,
            backend: Some(Kernel::CutlassSm90),
            ..case(1, 1, 0, 64)
        });
    }
    cases.push(Case {
        sq: 1000,
        sk: 4097,
        causal: Causal::BottomRight,
        backend: Some(Kernel::CutlassSm90),
        ..case(1, 1, 0, 128)
    });
    both_dtypes(&cases);
}

/// A case pinned to the Hopper kernel with the lse of every row, from
/// `(batch, heads, kv heads, seq_q, seq_k, d)`.
fn hopper_case(
    (b, hq, hk, sq, sk, d): (usize, usize, usize, usize, usize, usize),
    causal: Causal,
    layout: Layout,
) -> Case {
    Case {
        b,
        sq,
        sk,
        hq,
        hk,
        d,
        causal,
        layout,
        lse: true,
        backend: Some(Kernel::CutlassSm90),
        ..case(0, 0, 0, 0)
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn hopper_causal_pairs_cover_every_query_block() {
    // Under a causal mask the Hopper kernel's persistent blocks walk the query blocks of each
    // head in pairs (longest with shortest) once there are more query blocks than SMs (132 on
    // an H100/H200): here 144-240 blocks, an odd count per head (a middle block without a
    // partner) and an even one, both alignments, Sq != Sk, GQA, and the lse of every row.
    // Without a mask a unit is one block. Where the grid is a multiple of a head's units the
    // walk rotates them each step (the d = 64 cases: 3 and 2 pairs of 192-row blocks per head,
    // and 4 single blocks without a mask).
    let cases: Vec<Case> = [
        ((1, 36, 4, 520, 520, 128), Causal::TopLeft),
        ((1, 36, 12, 400, 650, 128), Causal::BottomRight),
        ((2, 24, 8, 300, 300, 256), Causal::BottomRight),
        ((2, 24, 24, 383, 250, 256), Causal::TopLeft),
        ((1, 48, 8, 800, 800, 64), Causal::TopLeft),
        ((1, 48, 16, 700, 900, 64), Causal::BottomRight),
        ((1, 40, 8, 700, 650, 64), Causal::None),
        ((1, 36, 4, 520, 700, 128), Causal::None),
    ]
    .into_iter()
    .map(|(dims, causal)| hopper_case(dims, causal, Layout::Bshd))
    .collect();
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn hopper_causal_leading_rows() {
    // Under a causal mask the Hopper kernel pads a sequence whose last query block would be
    // partial at its start instead, in whole warpgroups of 64 rows (sm90/problem.cuh's
    // lead_rows): 64 or 128 leading rows in the 192-row blocks of d = 64, 64 in the 128-row
    // blocks of d = 128, none where the remainder leaves less than a warpgroup. Each such row
    // count, both alignments, Sq != Sk both ways, GQA, both layouts and the lse of every row.
    // (Key splits, packed heads, a window and a bias take none: sm90/launch.cuh's leads_rows.)
    let (tl, br) = (Causal::TopLeft, Causal::BottomRight);
    let (bshd, bhsd) = (Layout::Bshd, Layout::Bhsd);
    // ((batch, heads, kv heads, seq_q, seq_k, d), causal, layout): leading rows
    let cases: Vec<Case> = [
        ((1, 8, 2, 2048, 2048, 64), br, bshd),  // 64
        ((1, 8, 8, 1930, 2100, 64), br, bhsd),  // 128
        ((2, 4, 1, 2000, 1900, 64), tl, bshd),  // 64
        ((1, 8, 4, 1900, 1900, 64), tl, bshd),  // none: 172 of 192 rows
        ((1, 8, 2, 2049, 2049, 128), tl, bshd), // 64
        ((1, 6, 3, 1050, 1500, 128), br, bhsd), // 64
        ((1, 6, 6, 1150, 1000, 128), tl, bshd), // none: 126 of 128 rows
        ((1, 4, 4, 1030, 1030, 256), br, bshd), // 64
    ]
    .into_iter()
    .map(|(dims, causal, layout)| hopper_case(dims, causal, layout))
    .collect();
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn hopper_last_wave_in_pieces_matches_the_reference() {
    // Without a mask the Hopper kernel's persistent blocks walk equal units; where the units
    // hold at least 32 key tiles and the last wave would leave blocks idle for at least 4 key
    // tiles each (plan.h sm90_tail_units), the d = 128 row (schedule flag 2048, instances.inc)
    // cuts the last wave's units into key tiles dealt evenly to every block and merges each
    // unit's pieces (scheduler.cuh's Tail). On an H100 or H200 (132 SMs) each case here takes
    // that path: 140-144 units of 32-40 key tiles, 8-12 of them cut, 11-17 pieces a unit; a
    // query block of one row, partial key tiles, GQA and MQA, two batch entries, a head dim below
    // the tile's, both layouts, the lse of every row.
    // ((batch, heads, kv heads, seq_q, seq_k, d), layout)
    let cases: Vec<Case> = [
        ((1, 70, 10, 129, 4100, 128), Layout::Bshd),
        ((2, 36, 1, 250, 3990, 128), Layout::Bhsd),
        ((1, 35, 35, 500, 5000, 96), Layout::Bshd),
    ]
    .into_iter()
    .map(|(dims, layout)| hopper_case(dims, Causal::None, layout))
    .collect();
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn head_dims() {
    let cases: Vec<Case> = [8, 64, 72, 96, 128, 160, 256]
        .into_iter()
        .flat_map(|d| {
            [
                case(2, 4, 200, d),
                Case {
                    causal: Causal::TopLeft,
                    ..case(1, 2, 333, d)
                },
            ]
        })
        .collect();
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn causal_alignments() {
    let mut cases = Vec::new();
    for causal in [Causal::TopLeft, Causal::BottomRight] {
        for (sq, sk) in [(256, 256), (128, 384), (1, 512), (257, 1000)] {
            cases.push(Case {
                sq,
                sk,
                causal,
                ..case(2, 8, 0, 64)
            });
            cases.push(Case {
                sq,
                sk,
                causal,
                ..case(1, 4, 0, 128)
            });
        }
    }
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn explicit_scales() {
    // A subnormal scale (the WMMA launcher raises it to the smallest normal float so that masked
    // keys stay -inf after scaling), a small one and a large one (peaked rows). Zero and negative
    // scales are refused by validation (tests/cpu.rs).
    let mut cases = Vec::new();
    for scale in [1e-40, 0.01, 1.5] {
        for causal in [Causal::None, Causal::BottomRight] {
            cases.push(Case {
                sq: 100,
                sk: 300,
                causal,
                scale: Some(scale),
                lse: true,
                ..case(1, 4, 0, 64)
            });
            cases.push(Case {
                sq: 130,
                sk: 200,
                causal,
                scale: Some(scale),
                ..case(1, 2, 0, 128)
            });
        }
    }
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gqa_and_mqa() {
    let mut cases = Vec::new();
    for hk in [2, 1] {
        // GQA 8:1 (16 query heads, 2 kv heads) and MQA (1 kv head); one-query problems with
        // no mask or bottom-right are packed (heads as rows), top-left ones are not.
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            for (sq, sk) in [(256, 256), (1, 300), (64, 500)] {
                cases.push(Case {
                    sq,
                    sk,
                    hk,
                    causal,
                    lse: true,
                    ..case(2, 16, 0, 64)
                });
                cases.push(Case {
                    sq,
                    sk,
                    hk,
                    causal,
                    ..case(1, 16, 0, 128)
                });
            }
        }
    }
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn layouts_and_lse() {
    let mut cases = Vec::new();
    for layout in [Layout::Bshd, Layout::Bhsd] {
        for lse in [false, true] {
            cases.push(Case {
                layout,
                lse,
                ..case(2, 8, 300, 64)
            });
            cases.push(Case {
                layout,
                lse,
                causal: Causal::TopLeft,
                sk: 500,
                ..case(2, 4, 77, 128)
            });
            cases.push(Case {
                layout,
                lse,
                hk: 2,
                ..case(1, 8, 129, 256)
            });
        }
    }
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_tile_row_including_forced_sm89() {
    let device = Device::open(0).expect("this test needs a CUDA device");
    let mut cases = Vec::new();
    for backend in Kernel::ALL {
        for row in tile_table(backend) {
            if row.smem_bytes > device.shared_memory_per_block_optin() {
                continue; // cannot run here; the plan refuses it (tested on the CPU)
            }
            let d = row.max_head_dim as usize;
            for d in [d, d - 8] {
                for causal in [Causal::None, Causal::BottomRight] {
                    cases.push(Case {
                        force: Some(row.arch),
                        backend: Some(backend),
                        causal,
                        lse: true,
                        sk: 515,
                        ..case(2, 4, 260, d)
                    });
                }
            }
        }
    }
    // The decode rows: one query, GQA 4:1 (packed to 4 query rows per kv head).
    let decode_rows = [Kernel::CutlassSm80, Kernel::Wmma]
        .into_iter()
        .flat_map(|kernel| decode_table(kernel).iter().map(move |row| (kernel, row)));
    for (kernel, row) in decode_rows {
        for d in [64, row.max_head_dim as usize] {
            cases.push(Case {
                force: Some(row.arch),
                backend: Some(kernel),
                sq: 1,
                sk: 777,
                hk: 2,
                lse: true,
                ..case(3, 8, 0, d)
            });
        }
    }
    let forced_sm89 = |backend| {
        cases
            .iter()
            .filter(|c| c.force == Some(ArchClass::Sm86Sm89) && c.backend == Some(backend))
            .count()
    };
    assert_eq!(
        forced_sm89(Kernel::CutlassSm80),
        14,
        "every CUTLASS sm_89 row must run here"
    );
    assert_eq!(
        forced_sm89(Kernel::Wmma),
        18,
        "every WMMA sm_89 row must run here"
    );
    both_dtypes(&cases);
}

#[test]
#[ignore = "needs a CUDA device"]
fn auto_backend_and_results_on_other_streams() {
    let (s1, s2) = (stream(), stream());
    let mut rng = Rng::fresh();
    let q = randn::<f16>(&mut rng, &[2, 64, 4, 64], Layout::Bshd);
    let k = randn::<f16>(&mut rng, &[2, 96, 4, 64], Layout::Bshd);
    let (dq, dk, dv) = (
        q.to_device(&s1).unwrap(),
        k.to_device(&s2).unwrap(),
        k.to_device(&s2).unwrap(),
    );
    let res = attention(&dq, &dk, &dv, &AttentionOptions::default().with_lse()).unwrap();
    let device = Device::open(0).unwrap();
    let class = auto_class(&device);
    let auto = |rows, batch_heads, keys| {
        auto_kernel(class, rows, batch_heads, keys, 64, device.sm_count())
    };
    assert_eq!(res.execution.backend, BackendKind::from(auto(64, 8, 96)));
    assert!(res.out.stream().unwrap().same_as(&s1));
    // One query per head: Auto takes the decode row's kernel.
    let one = randn::<f16>(&mut rng, &[2, 1, 4, 64], Layout::Bshd)
        .to_device(&s1)
        .unwrap();
    let dec = attention(&one, &dk, &dv, &AttentionOptions::default()).unwrap();
    assert_eq!(dec.execution.backend, BackendKind::from(auto(1, 8, 96)));
    // A problem that fills the GPU: on an H100 or H200, the Hopper kernel.
    let big = randn::<f16>(&mut rng, &[4, 1024, 16, 64], Layout::Bshd)
        .to_device(&s1)
        .unwrap();
    let filled = attention(&big, &big, &big, &AttentionOptions::default()).unwrap();
    assert_eq!(
        filled.execution.backend,
        BackendKind::from(auto(1024, 64, 1024))
    );
    if runs_here(Kernel::CutlassSm90) {
        assert_eq!(
            filled.execution.backend,
            BackendKind::from(Kernel::CutlassSm90)
        );
    }
    let (want, _) = naive(&q, &k, &k, 0.125, Causal::None);
    let err = rel_l2(&logical(&res.out.to_host().unwrap()), &want);
    assert!(err < 2e-3, "rel L2 {err}");
    // The CPU backend on the host copy agrees with the GPU.
    let cpu = attention(&q, &k, &k, &Default::default()).unwrap();
    assert_eq!(cpu.execution.backend, BackendKind::Cpu);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_errors_launch_nothing() {
    let s = stream();
    let host = Tensor::full(f16::ONE, &[1, 8, 2, 64], Layout::Bshd).unwrap();
    let dev = host.to_device(&s).unwrap();
    let e = attention(&dev, &host, &dev, &Default::default()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DeviceMismatch {
                operand: Operand::K,
                ..
            }
        ),
        "{e}"
    );
    let e = attention(
        &dev,
        &dev,
        &dev,
        &AttentionOptions::default().backend(Backend::Cpu),
    );
    assert!(matches!(
        e,
        Err(Error::BackendUnavailable { backend: "cpu", .. })
    ));
    // The Hopper kernel forced with another class's rows: a typed error, nothing launched.
    let e = attention(
        &dev,
        &dev,
        &dev,
        &AttentionOptions::default()
            .backend(Kernel::CutlassSm90.into())
            .force_arch_class(ArchClass::Sm86Sm89),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::BackendUnavailable {
                backend: "cutlass-sm90",
                ..
            }
        ),
        "{e}"
    );
    // Empty problems validate and launch nothing.
    let empty = Tensor::full(f16::ONE, &[0, 8, 2, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let res = attention(&empty, &empty, &empty, &Default::default()).unwrap();
    assert_eq!(res.out.shape().numel().unwrap(), 0);
    s.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_properties() {
    let d = Device::open(0).expect("this test needs a CUDA device");
    assert!(Device::count() >= 1);
    let (major, _) = d.compute_capability();
    assert!(major >= 8, "{}", d.name());
    assert!(d.sm_count() > 0 && d.shared_memory_per_block_optin() >= 48 * 1024);
    println!(
        "{} cc {:?} sms {} smem/block {}",
        d.name(),
        d.compute_capability(),
        d.sm_count(),
        d.shared_memory_per_block_optin()
    );
}

/// The interop problem: GQA 4:1, seq_q != seq_k, bottom-right causal, BSHD, with lse.
const INTEROP: Case = Case {
    sk: 130,
    hk: 2,
    causal: Causal::BottomRight,
    lse: true,
    ..case(2, 8, 100, 64)
};

fn interop_opts() -> AttentionOptions {
    AttentionOptions {
        causal: INTEROP.causal,
        return_lse: true,
        ..Default::default()
    }
}

/// Relative L2 errors of a GPU result (out, lse) against the f64 reference.
fn interop_errors(inputs: [&Tensor<f16>; 3], out: &Tensor<f16>, lse: &Tensor<f32>) -> (f64, f64) {
    let [q, k, v] = inputs;
    let (want, want_lse) = naive(q, k, v, 1.0 / (INTEROP.d as f64).sqrt(), INTEROP.causal);
    let got = logical(&out.to_host().unwrap());
    let got_lse = lse_values(&lse.to_host().unwrap());
    (rel_l2(&got, &want), rel_l2(&got_lse, &want_lse))
}

fn interop_inputs() -> [Tensor<f16>; 3] {
    let mut rng = Rng::fresh();
    let c = INTEROP;
    let (qs, ks) = (
        Shape::new(c.b, c.sq, c.hq, c.d),
        Shape::new(c.b, c.sk, c.hk, c.d),
    );
    [qs, ks, ks].map(|s| randn::<f16>(&mut rng, &dims(s, c.layout), c.layout))
}

#[test]
#[ignore = "needs a CUDA device"]
#[allow(unsafe_code)]
fn cpp_allocates_rust_computes() {
    let device = Device::open(0).expect("this test needs a CUDA device");
    let owner = Stream::new(&device).unwrap();
    // SAFETY: `owner` outlives `stream` and every view below.
    let stream = unsafe { Stream::from_raw(&device, owner.as_raw()) }.unwrap();
    let inputs = interop_inputs();
    let c = INTEROP;
    let out_shape = Shape::new(c.b, c.sq, c.hq, c.d);
    let nan_out = vec![f16::NAN; out_shape.numel().unwrap()];
    let nan_lse = vec![f32::NAN; c.b * c.hq * c.sq];
    // Memory C++ allocated (cudaMalloc) and filled; Rust only sees raw pointers. Each input has
    // 8 spare elements at the end, so that a view shifted by one element still fits.
    let spare = 8;
    let buffers = inputs.each_ref().map(|t| {
        let mut data = t.host_data().unwrap().to_vec();
        data.extend(vec![f16::ZERO; spare]);
        CppDeviceBuffer::from_host(&device, &data).unwrap()
    });
    let out_buf = CppDeviceBuffer::from_host(&device, &nan_out).unwrap();
    let lse_buf = CppDeviceBuffer::from_host(&device, &nan_lse).unwrap();
    let lse_shape = Shape::new(c.b, c.sq, c.hq, 1);
    // SAFETY: each buffer holds the tensor's elements on `stream`'s device and outlives the
    // views; the test touches the memory only through them, on `stream`.
    let view = |b: &CppDeviceBuffer, t: &Tensor<f16>, offset: usize| unsafe {
        Tensor::from_raw_device(
            b.as_ptr::<f16>().add(offset),
            t.host_data().unwrap().len() + spare - offset,
            t.shape(),
            t.strides(),
            &stream,
        )
    };
    let [q, k, v] = [0, 1, 2].map(|i| view(&buffers[i], &inputs[i], 0).unwrap());
    let mut out = unsafe {
        Tensor::from_raw_device(
            out_buf.as_ptr::<f16>(),
            nan_out.len(),
            out_shape,
            out_shape.strides(c.layout).unwrap(),
            &stream,
        )
    }
    .unwrap();
    let mut lse = unsafe {
        Tensor::from_raw_device(
            lse_buf.as_ptr::<f32>(),
            nan_lse.len(),
            lse_shape,
            lse_shape.strides(Layout::Bhsd).unwrap(),
            &stream,
        )
    }
    .unwrap();
    let exec = attention_into(&q, &k, &v, &mut out, Some(&mut lse), &interop_opts()).unwrap();
    let class = auto_class(&device);
    let batch_heads = INTEROP.b * INTEROP.hq;
    let auto = auto_kernel(
        class,
        INTEROP.sq,
        batch_heads,
        INTEROP.sk,
        INTEROP.d,
        device.sm_count(),
    );
    assert_eq!(exec.backend, BackendKind::from(auto));
    let (err, lse_err) = interop_errors(inputs.each_ref(), &out, &lse);
    println!("C++ memory, Rust call: rel L2 {err:.2e}, lse {lse_err:.2e}");
    assert!(
        err < tolerance::<f16>() && lse_err < 1e-4,
        "{err} {lse_err}"
    );

    // A view one element into a C++ buffer is not 16-byte aligned: refused, nothing launched.
    let shifted = view(&buffers[0], &inputs[0], 1).unwrap();
    let e = attention_into(&shifted, &k, &v, &mut out, None, &interop_opts()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::MisalignedPointer {
                operand: Operand::Q,
                ..
            }
        ),
        "{e:?}"
    );
    // A view longer than the memory says it holds is refused at construction.
    let short = unsafe {
        Tensor::<f16>::from_raw_device(
            buffers[0].as_ptr(),
            10,
            out_shape,
            out_shape.strides(c.layout).unwrap(),
            &stream,
        )
    };
    assert!(
        matches!(short, Err(Error::StorageTooSmall { len: 10, .. })),
        "{short:?}"
    );
    stream.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn rust_allocates_cpp_computes() {
    let s = stream();
    let inputs = interop_inputs();
    let [q, k, v] = inputs.each_ref().map(|t| t.to_device(&s).unwrap());
    let c = INTEROP;
    let mut out = Tensor::full(
        f16::NAN,
        &dims(Shape::new(c.b, c.sq, c.hq, c.d), c.layout),
        c.layout,
    )
    .unwrap()
    .to_device(&s)
    .unwrap();
    let mut lse = Tensor::full(f32::NAN, &[c.b, c.hq, c.sq, 1], Layout::Bhsd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    // The public C++ API receives the raw pointers and stream of Rust's allocations.
    let exec =
        cpp_attention_forward(&q, &k, &v, &mut out, Some(&mut lse), &interop_opts()).unwrap();
    let (err, lse_err) = interop_errors(inputs.each_ref(), &out, &lse);
    println!("Rust memory, C++ call: rel L2 {err:.2e}, lse {lse_err:.2e}");
    assert!(
        err < tolerance::<f16>() && lse_err < 1e-4,
        "{err} {lse_err}"
    );
    // Same plan as the Rust entry.
    let rust = attention_into(&q, &k, &v, &mut out, Some(&mut lse), &interop_opts()).unwrap();
    assert_eq!(exec, rust);
    // The C++ API's own validation reports in Rust's categories, and launches nothing.
    let mut poisoned = Tensor::full(f16::NAN, &[1, 4, 2, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let e = cpp_attention_forward(&q, &k, &v, &mut poisoned, None, &interop_opts()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShapeMismatch {
                operand: Operand::Out,
                dim: "batch",
                got: 1,
                expected: 2
            }
        ),
        "{e:?}"
    );
    let untouched = poisoned.to_host().unwrap();
    assert!(untouched.host_data().unwrap().iter().all(|x| x.is_nan()));
}

/// Relative L2 error of merged logsumexps, where rows that no state covers must be exactly -inf
/// in both (infinite error otherwise).
fn lse_error(got: &[f64], want: &[f64]) -> f64 {
    let empty = |x: &f64| *x == f64::NEG_INFINITY;
    if got.iter().zip(want).any(|(g, w)| empty(g) != empty(w)) {
        return f64::INFINITY;
    }
    let (g, w): (Vec<f64>, Vec<f64>) = got.iter().zip(want).filter(|(_, w)| !empty(w)).unzip();
    rel_l2(&g, &w)
}

/// `count` random states of `[2, 37, 3, d]` rows (alternating BSHD and BHSD outputs; state 0
/// covers no key on every fifth row, where its output is NaN and must not be read), merged on
/// the GPU into a NaN-poisoned output, against the f64 CPU merge of the same states.
fn merge_case<T: AttentionElement>(s: &Stream, count: usize, d: usize) {
    let mut rng = Rng::fresh();
    let shape = Shape::new(2, 37, 3, d);
    let lse_dims = [2, 3, 37, 1];
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    for i in 0..count {
        let layout = if i % 2 == 0 {
            Layout::Bshd
        } else {
            Layout::Bhsd
        };
        let mut out = randn::<T>(&mut rng, &dims(shape, layout), layout);
        let mut l: Vec<f32> = (0..2 * 3 * 37)
            .map(|_| (3.0 * rng.normal()) as f32)
            .collect();
        if i == 0 {
            let nan = T::from_f64(f64::NAN);
            let mut data = Vec::new();
            for (row, l) in l.iter_mut().enumerate().filter(|(row, _)| row % 5 == 0) {
                *l = f32::NEG_INFINITY;
                let (b, h, q) = (row / (3 * 37), row / 37 % 3, row % 37);
                data.push((b, q, h));
            }
            let strides = out.strides();
            let mut values = out.host_data().unwrap().to_vec();
            for (b, q, h) in data {
                let o = b * strides[0] + q * strides[1] + h * strides[2];
                values[o..o + d].fill(nan);
            }
            out = Tensor::from_vec_strided(values, shape, strides).unwrap();
        }
        outs.push(out);
        lses.push(Tensor::from_vec(l, &lse_dims, Layout::Bhsd).unwrap());
    }
    let states: Vec<_> = outs
        .iter()
        .zip(&lses)
        .map(|(out, lse)| AttentionState { out, lse })
        .collect();
    let mut want =
        Tensor::full(T::from_f64(0.0), &dims(shape, Layout::Bshd), Layout::Bshd).unwrap();
    let mut want_lse = Tensor::full(0f32, &lse_dims, Layout::Bhsd).unwrap();
    merge_states(&states, &mut want, Some(&mut want_lse)).unwrap();
    let (want, want_lse) = (logical(&want), lse_values(&want_lse));

    let dev_outs: Vec<_> = outs.iter().map(|t| t.to_device(s).unwrap()).collect();
    let dev_lses: Vec<_> = lses.iter().map(|t| t.to_device(s).unwrap()).collect();
    let dev_states: Vec<_> = dev_outs
        .iter()
        .zip(&dev_lses)
        .map(|(out, lse)| AttentionState { out, lse })
        .collect();
    let poison = T::from_f64(f64::NAN);
    let mut out = Tensor::full(poison, &dims(shape, Layout::Bshd), Layout::Bshd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let mut lse = Tensor::full(f32::NAN, &lse_dims, Layout::Bhsd)
        .unwrap()
        .to_device(s)
        .unwrap();
    merge_states(&dev_states, &mut out, Some(&mut lse)).unwrap();
    let err = rel_l2(&logical(&out.to_host().unwrap()), &want);
    let lse_err = lse_error(&lse_values(&lse.to_host().unwrap()), &want_lse);
    println!(
        "merge {:?} {count} states d={d}: rel L2 {err:.2e} lse {lse_err:.2e}",
        T::DTYPE
    );
    assert!(err < tolerance::<T>(), "{count} states d={d}: rel L2 {err}");
    assert!(lse_err < 1e-6, "{count} states d={d}: lse rel L2 {lse_err}");

    // In place, one state at a time from state 0 (its rows without keys weigh 0 in each step).
    if count <= 7 {
        let mut running = dev_outs[0].to_host().unwrap().to_device(s).unwrap();
        let mut running_lse = dev_lses[0].to_host().unwrap().to_device(s).unwrap();
        for st in &dev_states[1..] {
            merge_state_into(&mut running, &mut running_lse, *st).unwrap();
        }
        let err = rel_l2(&logical(&running.to_host().unwrap()), &want);
        let lse_err = lse_error(&lse_values(&running_lse.to_host().unwrap()), &want_lse);
        if count > 1 {
            assert!(
                err < tolerance::<T>(),
                "in place, {count} states d={d}: rel L2 {err}"
            );
            assert!(
                lse_err < 1e-6,
                "in place, {count} states: lse rel L2 {lse_err}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn merge_states_match_the_reference() {
    let s = stream();
    for (count, d) in [(1, 64), (2, 128), (7, 40), (64, 256), (3, 8), (2, 256)] {
        merge_case::<f16>(&s, count, d);
        merge_case::<bf16>(&s, count, d);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn merge_edge_rows_and_errors_on_the_gpu() {
    let s = stream();
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    let state = |rows: &[(f32, f32)]| {
        let n = rows.len();
        let out = rows
            .iter()
            .flat_map(|&(_, x)| [f16::from_f32(x); 8])
            .collect();
        let lse = rows.iter().map(|&(l, _)| l).collect();
        (
            Tensor::from_vec(out, &[1, n, 1, 8], Layout::Bshd).unwrap(),
            Tensor::from_vec(lse, &[1, 1, n, 1], Layout::Bhsd).unwrap(),
        )
    };
    // Row 0: b covers no key (NaN output, never read). Row 1: neither does. Row 2: a NaN lse.
    // Row 3: equal weights.
    let (ao, al) = state(&[(0.5, 1.0), (-inf, nan), (nan, 1.0), (2.0, 1.0)]);
    let (bo, bl) = state(&[(-inf, nan), (-inf, 5.0), (0.0, 1.0), (2.0, 3.0)]);
    let dev = |t: &Tensor<f16>| t.to_device(&s).unwrap();
    let devl = |t: &Tensor<f32>| t.to_device(&s).unwrap();
    let (ao, al, bo, bl) = (dev(&ao), devl(&al), dev(&bo), devl(&bl));
    let states = [
        AttentionState { out: &ao, lse: &al },
        AttentionState { out: &bo, lse: &bl },
    ];
    let mut out = dev(&Tensor::full(f16::NAN, &[1, 4, 1, 8], Layout::Bshd).unwrap());
    let mut lse = devl(&Tensor::full(nan, &[1, 1, 4, 1], Layout::Bhsd).unwrap());
    merge_states(&states, &mut out, Some(&mut lse)).unwrap();
    let (out, lse) = (out.to_host().unwrap(), lse.to_host().unwrap());
    let o = |q: usize| out.get(0, q, 0, 5).unwrap().to_f32();
    let l = |q: usize| lse.get(0, q, 0, 0).unwrap();
    assert_eq!((o(0), l(0)), (1.0, 0.5));
    assert_eq!((o(1), l(1)), (0.0, -inf));
    assert!(o(2).is_nan() && l(2).is_nan());
    assert_eq!(o(3), 2.0);
    assert!((l(3) - (2.0 + std::f32::consts::LN_2)).abs() < 1e-6);

    // A host state with a device output: refused before any launch, naming the state.
    let host_lse = Tensor::full(0f32, &[1, 1, 4, 1], Layout::Bhsd).unwrap();
    let mixed = [
        AttentionState { out: &ao, lse: &al },
        AttentionState {
            out: &ao,
            lse: &host_lse,
        },
    ];
    let mut out = dev(&Tensor::full(f16::NAN, &[1, 4, 1, 8], Layout::Bshd).unwrap());
    let e = merge_states(&mixed, &mut out, None).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DeviceMismatch {
                operand: Operand::StateLse(1),
                ..
            }
        ),
        "{e:?}"
    );
    let untouched = out.to_host().unwrap();
    assert!(
        untouched.get(0, 0, 0, 0).unwrap().is_nan(),
        "nothing was launched"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn planned_runs_match_the_reference_and_refuse_other_operands() {
    let s = stream();
    let (qs, ks) = (Shape::new(2, 300, 8, 128), Shape::new(2, 300, 2, 128));
    let opts = AttentionOptions::default()
        .causal(Causal::BottomRight)
        .with_lse();
    let mut rng = Rng::fresh();
    let mut fresh = || {
        let q = randn::<bf16>(&mut rng, &dims(qs, Layout::Bshd), Layout::Bshd);
        let k = randn::<bf16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
        let v = randn::<bf16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
        let dev = (
            q.to_device(&s).unwrap(),
            k.to_device(&s).unwrap(),
            v.to_device(&s).unwrap(),
        );
        ((q, k, v), dev)
    };
    let poisoned = || {
        let out = Tensor::full(bf16::NAN, &dims(qs, Layout::Bshd), Layout::Bshd).unwrap();
        let lse = Tensor::full(f32::NAN, &[2, 8, 300, 1], Layout::Bhsd).unwrap();
        (out.to_device(&s).unwrap(), lse.to_device(&s).unwrap())
    };
    let (_, (q, k, v)) = fresh();
    let (out, lse) = poisoned();
    let plan = AttentionPlan::new(&q, &k, &v, &out, Some(&lse), &opts).unwrap();
    let mut direct = poisoned().0;
    let auto = attention_into(&q, &k, &v, &mut direct, None, &opts).unwrap();
    assert_eq!(
        plan.execution().backend,
        auto.backend,
        "the plan runs what Auto runs"
    );
    for layer in 0..3 {
        let ((hq, hk, hv), (q, k, v)) = fresh();
        let (mut out, mut lse) = poisoned();
        plan.run(&q, &k, &v, &mut out, Some(&mut lse)).unwrap();
        let (want, want_lse) = naive(&hq, &hk, &hv, 1.0 / 128f64.sqrt(), Causal::BottomRight);
        let err = rel_l2(&logical(&out.to_host().unwrap()), &want);
        let lse_err = rel_l2(&lse_values(&lse.to_host().unwrap()), &want_lse);
        println!(
            "planned {:?} layer {layer}: rel L2 {err:.2e} lse {lse_err:.2e}",
            plan.execution().backend
        );
        assert!(
            err < tolerance::<bf16>() && lse_err < 1e-4,
            "layer {layer}: {err} {lse_err}"
        );
    }
    // Another sequence length: refused before any launch.
    let other = Tensor::full(bf16::ONE, &[2, 301, 8, 128], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let (mut out, mut lse) = poisoned();
    let e = plan
        .run(&other, &k, &v, &mut out, Some(&mut lse))
        .unwrap_err();
    assert_eq!(e, Error::PlanMismatch(Operand::Q));
    assert!(
        out.to_host().unwrap().get(0, 0, 0, 0).unwrap().is_nan(),
        "nothing was launched"
    );
}

/// The softmax scale of each call of a chain (`x0`, then each call's output as the next one's
/// query), from the chain computed on the host: one that spreads the scores over about one unit,
/// so that each output depends on its query without a few keys taking all the weight.
fn chain_scales<T: AttentionElement>(
    x0: &Tensor<T>,
    kv: &[(Tensor<T>, Tensor<T>)],
    causal: Causal,
) -> Vec<f32> {
    let dims = x0.shape().as_array();
    let mut x = logical(x0);
    let mut scales = Vec::new();
    for (k, v) in kv {
        let rms = (x.iter().map(|e| e * e).sum::<f64>() / x.len() as f64).sqrt();
        let scale = (1.0 / (rms * (dims[3] as f64).sqrt())) as f32;
        let q = x.iter().map(|&e| T::from_f64(e)).collect();
        let q = Tensor::from_vec(q, &dims, Layout::Bshd).unwrap();
        x = naive(&q, k, v, f64::from(scale), causal).0;
        scales.push(scale);
    }
    scales
}

/// The inputs of a chain of calls, as a model's layers run them: the first query, each call's
/// K and V, and each call's softmax scale. Each call reads the previous call's output as its
/// query.
struct Chain<T: AttentionElement> {
    x0: Tensor<T>,
    kv: Vec<(Tensor<T>, Tensor<T>)>,
    scales: Vec<f32>,
}

impl<T: AttentionElement> Chain<T> {
    /// Fresh inputs, with the scales of `scales` (a recorded graph's plans fix them), or
    /// chosen for these inputs ([`chain_scales`]).
    fn fresh(
        rng: &mut Rng,
        (qs, ks): (Shape, Shape),
        causal: Causal,
        layers: usize,
        scales: Option<&[f32]>,
    ) -> Self {
        let (qd, kd) = (dims(qs, Layout::Bshd), dims(ks, Layout::Bshd));
        let x0 = randn::<T>(rng, &qd, Layout::Bshd);
        let kv: Vec<_> = (0..layers)
            .map(|_| {
                let k = randn::<T>(rng, &kd, Layout::Bshd);
                (k, randn::<T>(rng, &kd, Layout::Bshd))
            })
            .collect();
        let scales = scales.map_or_else(|| chain_scales(&x0, &kv, causal), <[f32]>::to_vec);
        Chain { x0, kv, scales }
    }

    /// Call `i`'s options on `kernel`.
    fn options(&self, i: usize, kernel: Kernel, causal: Causal) -> AttentionOptions {
        AttentionOptions {
            causal,
            backend: Backend::from(kernel),
            scale: Some(self.scales[i]),
            ..Default::default()
        }
    }

    /// The worst error of the GPU's outputs (`got[0]` the first query, `got[i + 1]` call i's
    /// output) against each call's f64 reference on the query it was given (the previous output
    /// as the GPU wrote it), and, as a negative control, how far one stale read (the query from
    /// two calls back) moves the last reference.
    fn check(&self, got: &[Tensor<T>], causal: Causal) -> (f64, f64) {
        let reference = |q: &Tensor<T>, i: usize| {
            let (k, v) = &self.kv[i];
            naive(q, k, v, f64::from(self.scales[i]), causal).0
        };
        let layers = self.kv.len();
        let mut worst = 0.0f64;
        for i in 0..layers {
            let err = rel_l2(&logical(&got[i + 1]), &reference(&got[i], i));
            worst = if err.is_nan() { err } else { worst.max(err) };
        }
        let last = layers - 1;
        let control = rel_l2(
            &reference(&got[last - 1], last),
            &reference(&got[last], last),
        );
        (worst, control)
    }
}

/// A chain of calls enqueued back to back on one stream. Where Q and V have one shape, each call
/// also writes its output over the V that the call before it read (write after read). Returns
/// [`Chain::check`] of the outputs.
fn chain_case<T: AttentionElement>(
    s: &Stream,
    kernel: Kernel,
    (qs, ks): (Shape, Shape),
    causal: Causal,
    layers: usize,
) -> (f64, f64) {
    let chain = Chain::<T>::fresh(&mut Rng::fresh(), (qs, ks), causal, layers, None);
    let qd = dims(qs, Layout::Bshd);
    let poisoned = || {
        Tensor::full(T::from_f64(f64::NAN), &qd, Layout::Bshd)
            .unwrap()
            .to_device(s)
            .unwrap()
    };
    let ks_dev: Vec<_> = chain
        .kv
        .iter()
        .map(|(k, _)| k.to_device(s).unwrap())
        .collect();
    let mut vs_dev: Vec<_> = chain
        .kv
        .iter()
        .map(|(_, v)| Some(v.to_device(s).unwrap()))
        .collect();
    let overwrite_v = qs == ks;
    let mut outs = vec![chain.x0.to_device(s).unwrap()];
    s.synchronize().unwrap();
    for i in 0..layers {
        let mut out = match i {
            1.. if overwrite_v => vs_dev[i - 1].take().unwrap(),
            _ => poisoned(),
        };
        let v = vs_dev[i].as_ref().unwrap();
        let opts = chain.options(i, kernel, causal);
        let exec = attention_into(&outs[i], &ks_dev[i], v, &mut out, None, &opts).unwrap();
        assert_eq!(exec.backend, BackendKind::from(kernel));
        outs.push(out);
    }
    let got: Vec<_> = outs.iter().map(|o| o.to_host().unwrap()).collect();
    chain.check(&got, causal)
}

/// Runs `case` (returning a worst error and a negative control) for every family that runs
/// here, f16 and bf16, on a split-KV decode (one query per head, GQA 32:8, 4096 keys) and a
/// causal prefill (2x300x8x128), and fails on any error at or past the tolerance, or any
/// control that would not have failed.
fn chain_matrix(
    what: &str,
    case_f16: impl Fn(Kernel, (Shape, Shape), Causal) -> (f64, f64),
    case_bf16: impl Fn(Kernel, (Shape, Shape), Causal) -> (f64, f64),
) {
    let decode = (Shape::new(1, 1, 32, 128), Shape::new(1, 4096, 8, 128));
    let prefill = (Shape::new(2, 300, 8, 128), Shape::new(2, 300, 8, 128));
    let mut failures = Vec::new();
    for kernel in Kernel::ALL.into_iter().filter(|&k| runs_here(k)) {
        for (name, shapes, causal) in [
            ("decode", decode, Causal::None),
            ("prefill", prefill, Causal::BottomRight),
        ] {
            for dtype in [DType::F16, DType::BF16] {
                let ((err, control), tol) = if dtype == DType::F16 {
                    (case_f16(kernel, shapes, causal), tolerance::<f16>())
                } else {
                    (case_bf16(kernel, shapes, causal), tolerance::<bf16>())
                };
                println!(
                    "{kernel:?} {dtype:?} {name}: {what}, worst rel L2 {err:.2e} (one stale \
                     read: {control:.2e})"
                );
                if err.is_nan() || err >= tol {
                    failures.push(format!("{kernel:?} {dtype:?} {name}: {err:.3e}"));
                }
                // The test can fail: one stale read moves a result far past the tolerance.
                assert!(
                    control > 10.0 * tol,
                    "{kernel:?} {dtype:?} {name}: control {control}"
                );
            }
        }
    }
    assert_none_failed(&failures);
}

#[test]
#[ignore = "needs a CUDA device"]
fn chained_calls_read_and_overwrite_each_others_buffers() {
    let s = stream();
    chain_matrix(
        "6 calls back to back",
        |kernel, shapes, causal| chain_case::<f16>(&s, kernel, shapes, causal, 6),
        |kernel, shapes, causal| chain_case::<bf16>(&s, kernel, shapes, causal, 6),
    );
}

/// A chain of planned calls recorded into one CUDA graph and launched twice: on the inputs it
/// was recorded with, then on fresh inputs copied into the same tensors, after every K and V
/// tensor was dropped (the graph holds their memory) and new allocations took the pool's free
/// memory. Checks that recording runs nothing, and each launch's every output
/// ([`Chain::check`]). Returns the worst error of the two launches and the smaller control.
fn graph_case<T: AttentionElement>(
    s: &Stream,
    kernel: Kernel,
    shapes: (Shape, Shape),
    causal: Causal,
    layers: usize,
) -> (f64, f64) {
    let mut rng = Rng::fresh();
    let first = Chain::<T>::fresh(&mut rng, shapes, causal, layers, None);
    let qd = dims(shapes.0, Layout::Bshd);
    let nan = Tensor::full(T::from_f64(f64::NAN), &qd, Layout::Bshd).unwrap();
    let mut outs: Vec<_> = (0..=layers).map(|_| nan.to_device(s).unwrap()).collect();
    outs[0].copy_from(&first.x0).unwrap();
    let mut kv: Vec<_> = first
        .kv
        .iter()
        .map(|(k, v)| (k.to_device(s).unwrap(), v.to_device(s).unwrap()))
        .collect();
    let mut capture = Capture::begin(s).unwrap();
    for i in 0..layers {
        let opts = first.options(i, kernel, causal);
        let (k, v) = &kv[i];
        let plan = AttentionPlan::new(&outs[i], k, v, &outs[i + 1], None, &opts).unwrap();
        let (done, rest) = outs.split_at_mut(i + 1);
        let exec = capture
            .run(&plan, &done[i], k, v, &mut rest[0], None)
            .unwrap();
        assert_eq!(exec.backend, BackendKind::from(kernel));
    }
    assert_eq!(capture.calls(), layers);
    let graph = capture.finish().unwrap();
    let last = outs[layers].to_host().unwrap();
    assert!(
        logical(&last).iter().all(|x| x.is_nan()),
        "recording ran nothing"
    );
    graph.launch().unwrap();
    let got: Vec<_> = outs.iter().map(|o| o.to_host().unwrap()).collect();
    let (err1, control1) = first.check(&got, causal);

    // The second launch: fresh data in the same tensors, the K and V tensors dropped and
    // their memory offered to new allocations, which hold NaN.
    let second = Chain::<T>::fresh(&mut rng, shapes, causal, layers, Some(&first.scales));
    let kd = dims(shapes.1, Layout::Bshd);
    let nan_kv = Tensor::full(T::from_f64(f64::NAN), &kd, Layout::Bshd).unwrap();
    for ((k, v), (new_k, new_v)) in kv.iter_mut().zip(&second.kv) {
        k.copy_from(new_k).unwrap();
        v.copy_from(new_v).unwrap();
    }
    drop(kv);
    s.synchronize().unwrap();
    let refills: Vec<_> = (0..2 * layers)
        .map(|_| nan_kv.to_device(s).unwrap())
        .collect();
    outs[0].copy_from(&second.x0).unwrap();
    for o in &mut outs[1..] {
        o.copy_from(&nan).unwrap();
    }
    graph.launch().unwrap();
    let got: Vec<_> = outs.iter().map(|o| o.to_host().unwrap()).collect();
    let (err2, control2) = second.check(&got, causal);
    let worst = if err1.is_nan() || err2.is_nan() {
        f64::NAN
    } else {
        err1.max(err2)
    };
    drop(graph);
    drop(refills);
    (worst, control1.min(control2))
}

#[test]
#[ignore = "needs a CUDA device"]
fn graphs_replay_planned_calls_on_current_data() {
    let s = stream();
    chain_matrix(
        "graph of 4 calls, two launches",
        |kernel, shapes, causal| graph_case::<f16>(&s, kernel, shapes, causal, 4),
        |kernel, shapes, causal| graph_case::<bf16>(&s, kernel, shapes, causal, 4),
    );
}

/// Cascade attention recorded into one graph: a shared prefix's state (no mask), the suffix's
/// state (bottom-right causal) and their merge, launched twice on fresh queries copied into the
/// same tensor. Returns the worst (output, logsumexp) errors against attention over the prefix
/// and the suffix together.
fn cascade_graph_case<T: AttentionElement>(s: &Stream) -> (f64, f64) {
    let mut rng = Rng::fresh();
    let (sq, prefix, heads, kv_heads, d) = (64, 700, 8, 2, 64);
    let kd = [1, prefix + sq, kv_heads, d];
    let (k, v) = (
        randn::<T>(&mut rng, &kd, Layout::Bshd),
        randn::<T>(&mut rng, &kd, Layout::Bshd),
    );
    let up = |t: &Tensor<T>| t.to_device(s).unwrap();
    let (kp, vp) = (up(&tokens(&k, 0..prefix)), up(&tokens(&v, 0..prefix)));
    let (ks, vs) = (
        up(&tokens(&k, prefix..prefix + sq)),
        up(&tokens(&v, prefix..prefix + sq)),
    );
    let qd = [1, sq, heads, d];
    let nan = Tensor::full(T::from_f64(f64::NAN), &qd, Layout::Bshd).unwrap();
    let nan_lse = Tensor::full(f32::NAN, &[1, heads, sq, 1], Layout::Bhsd).unwrap();
    let mut q = up(&nan);
    let [mut out_p, mut out_s, mut out] = [(); 3].map(|_| up(&nan));
    let [mut lse_p, mut lse_s, mut lse] = [(); 3].map(|_| nan_lse.to_device(s).unwrap());
    let prefix_opts = AttentionOptions::default().with_lse();
    let suffix_opts = prefix_opts.clone().causal(Causal::BottomRight);
    let plan_p = AttentionPlan::new(&q, &kp, &vp, &out_p, Some(&lse_p), &prefix_opts).unwrap();
    let plan_s = AttentionPlan::new(&q, &ks, &vs, &out_s, Some(&lse_s), &suffix_opts).unwrap();
    let mut capture = Capture::begin(s).unwrap();
    capture
        .run(&plan_p, &q, &kp, &vp, &mut out_p, Some(&mut lse_p))
        .unwrap();
    capture
        .run(&plan_s, &q, &ks, &vs, &mut out_s, Some(&mut lse_s))
        .unwrap();
    let states = [
        AttentionState {
            out: &out_p,
            lse: &lse_p,
        },
        AttentionState {
            out: &out_s,
            lse: &lse_s,
        },
    ];
    capture
        .merge_states(&states, &mut out, Some(&mut lse))
        .unwrap();
    assert_eq!(capture.calls(), 3);
    let graph = capture.finish().unwrap();
    let mut worst = (0.0f64, 0.0f64);
    for _launch in 0..2 {
        let q_host = randn::<T>(&mut rng, &qd, Layout::Bshd);
        q.copy_from(&q_host).unwrap();
        out.copy_from(&nan).unwrap();
        lse.copy_from(&nan_lse).unwrap();
        graph.launch().unwrap();
        let (want, want_lse) = naive(
            &q_host,
            &k,
            &v,
            1.0 / (d as f64).sqrt(),
            Causal::BottomRight,
        );
        let err = rel_l2(&logical(&out.to_host().unwrap()), &want);
        let lse_err = rel_l2(&lse_values(&lse.to_host().unwrap()), &want_lse);
        worst = if err.is_nan() || lse_err.is_nan() {
            (f64::NAN, f64::NAN)
        } else {
            (worst.0.max(err), worst.1.max(lse_err))
        };
    }
    worst
}

#[test]
#[ignore = "needs a CUDA device"]
fn graphs_record_cascade_attention_and_its_merge() {
    let s = stream();
    let (f16_err, f16_lse) = cascade_graph_case::<f16>(&s);
    let (bf16_err, bf16_lse) = cascade_graph_case::<bf16>(&s);
    println!(
        "cascade graph (prefix, suffix, merge), two launches: f16 rel L2 {f16_err:.2e} lse \
         {f16_lse:.2e}, bf16 {bf16_err:.2e} lse {bf16_lse:.2e}"
    );
    assert!(
        f16_err < tolerance::<f16>() && f16_lse < 1e-4,
        "f16 {f16_err} {f16_lse}"
    );
    assert!(
        bf16_err < tolerance::<bf16>() && bf16_lse < 1e-4,
        "bf16 {bf16_err} {bf16_lse}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn graph_capture_refuses_operands_off_its_stream_and_records_nothing() {
    let s = stream();
    let other = Stream::new(s.device()).unwrap();
    let mut rng = Rng::fresh();
    let d = [1, 64, 4, 64];
    let x = randn::<f16>(&mut rng, &d, Layout::Bshd);
    let (q, k, v) = (
        x.to_device(&s).unwrap(),
        x.to_device(&s).unwrap(),
        x.to_device(&s).unwrap(),
    );
    let nan = Tensor::full(f16::NAN, &d, Layout::Bshd).unwrap();
    let mut out = nan.to_device(&s).unwrap();
    let plan = AttentionPlan::new(&q, &k, &v, &out, None, &AttentionOptions::default()).unwrap();
    let mut capture = Capture::begin(&s).unwrap();
    // K on another stream: refused, naming it, and nothing is recorded.
    let k_other = x.to_device(&other).unwrap();
    other.synchronize().unwrap();
    let e = capture
        .run(&plan, &q, &k_other, &v, &mut out, None)
        .unwrap_err();
    assert_eq!(
        e,
        Error::GraphStream {
            operand: Operand::K
        }
    );
    // The output on another stream.
    let mut out_other = nan.to_device(&other).unwrap();
    let e = capture
        .run(&plan, &q, &k, &v, &mut out_other, None)
        .unwrap_err();
    assert_eq!(
        e,
        Error::GraphStream {
            operand: Operand::Out
        }
    );
    // A mismatched operand: the plan's own error.
    let longer = Tensor::full(f16::ZERO, &[1, 65, 4, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let e = capture
        .run(&plan, &longer, &k, &v, &mut out, None)
        .unwrap_err();
    assert_eq!(e, Error::PlanMismatch(Operand::Q));
    // A CPU plan cannot be recorded.
    let mut host_out = Tensor::full(f16::NAN, &d, Layout::Bshd).unwrap();
    let cpu_plan =
        AttentionPlan::new(&x, &x, &x, &host_out, None, &AttentionOptions::default()).unwrap();
    let e = capture
        .run(&cpu_plan, &x, &x, &x, &mut host_out, None)
        .unwrap_err();
    assert!(matches!(e, Error::BackendUnavailable { .. }), "{e}");
    // A merge whose second state's logsumexp is on another stream.
    let lse_dims = [1, 4, 64, 1];
    let lse_nan = Tensor::full(f32::NAN, &lse_dims, Layout::Bhsd).unwrap();
    let (lse_here, lse_there) = (
        lse_nan.to_device(&s).unwrap(),
        lse_nan.to_device(&other).unwrap(),
    );
    other.synchronize().unwrap();
    let states = [
        AttentionState {
            out: &q,
            lse: &lse_here,
        },
        AttentionState {
            out: &k,
            lse: &lse_there,
        },
    ];
    let e = capture.merge_states(&states, &mut out, None).unwrap_err();
    assert_eq!(
        e,
        Error::GraphStream {
            operand: Operand::StateLse(1)
        }
    );
    assert_eq!(capture.calls(), 0);
    // An empty graph launches and does nothing; the output is untouched.
    let graph = capture.finish().unwrap();
    assert_eq!(graph.calls(), 0);
    graph.launch().unwrap();
    s.synchronize().unwrap();
    assert!(logical(&out.to_host().unwrap()).iter().all(|x| x.is_nan()));
    // A capture dropped unfinished leaves the stream usable: the same call then runs.
    let mut capture = Capture::begin(&s).unwrap();
    capture.run(&plan, &q, &k, &v, &mut out, None).unwrap();
    drop(capture);
    plan.run(&q, &k, &v, &mut out, None).unwrap();
    let err = rel_l2(
        &logical(&out.to_host().unwrap()),
        &naive(&x, &x, &x, 0.125, Causal::None).0,
    );
    assert!(err < 2e-3, "rel L2 {err}");
}

/// `n` random sequence lengths up to `max_len` for `causal` ([`random_lengths`]).
fn lengths(n: usize, max_len: usize, causal: Causal) -> (Vec<usize>, Vec<usize>) {
    let bottom_right = causal == Causal::BottomRight;
    random_lengths(&mut Rng::fresh(), n, max_len, max_len, bottom_right)
}

/// One variable-length batch of fresh normal inputs with sequences of `lq` queries and `lk`
/// keys, on `kernel` (forced) with NaN-poisoned outputs, against the naive formula per sequence.
/// Returns (out, lse) relative L2 errors.
fn varlen_case<T: AttentionElement>(
    s: &Stream,
    kernel: Kernel,
    lengths: (Vec<usize>, Vec<usize>),
    heads: (usize, usize),
    d: usize,
    causal: Causal,
    layout: Layout,
) -> (f64, f64) {
    varlen_run::<T>(s, kernel, lengths, heads, d, causal, layout).0
}

/// [`varlen_case`], also returning what ran.
#[allow(clippy::too_many_arguments)]
fn varlen_run<T: AttentionElement>(
    s: &Stream,
    kernel: Kernel,
    (lq, lk): (Vec<usize>, Vec<usize>),
    heads: (usize, usize),
    d: usize,
    causal: Causal,
    layout: Layout,
) -> ((f64, f64), Execution) {
    let mut rng = Rng::fresh();
    let (batch, q, k, v) = varlen_of_lengths::<T>(&mut rng, &lq, &lk, heads, d, layout);
    let tq = q.shape().seq;
    let out_dims = dims(Shape::new(1, tq, heads.0, d), layout);
    let mut out = Tensor::full(T::from_f64(f64::NAN), &out_dims, layout)
        .unwrap()
        .to_device(s)
        .unwrap();
    let mut lse = Tensor::full(f32::NAN, &[1, heads.0, tq, 1], Layout::Bhsd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let opts = AttentionOptions::default()
        .causal(causal)
        .with_lse()
        .backend(Backend::Kernel(kernel));
    let on_device = batch.to_device(s).unwrap();
    let exec = attention_varlen_into(
        &q.to_device(s).unwrap(),
        &k.to_device(s).unwrap(),
        &v.to_device(s).unwrap(),
        &on_device,
        &mut out,
        Some(&mut lse),
        &opts,
    )
    .unwrap_or_else(|e| {
        panic!(
            "{:?} x {:?}: {e}",
            batch.cu_seqlens_q(),
            batch.cu_seqlens_k()
        )
    });
    assert_eq!(exec.backend, BackendKind::Kernel(kernel));
    let (want, want_lse) = naive_varlen(
        &q,
        &k,
        &v,
        batch.cu_seqlens_q(),
        batch.cu_seqlens_k(),
        1.0 / (d as f64).sqrt(),
        causal,
    );
    let errors = (
        rel_l2(&logical(&out.to_host().unwrap()), &want),
        rel_l2(&lse_values(&lse.to_host().unwrap()), &want_lse),
    );
    (errors, exec)
}

#[test]
#[ignore = "needs a CUDA device"]
fn varlen_batches_match_the_reference() {
    let s = stream();
    let mut failures = Vec::new();
    let mut check = |what: String, (err, lse_err): (f64, f64), tol: f64| {
        println!("varlen {what}: rel L2 {err:.2e} lse {lse_err:.2e}");
        if !(err < tol && lse_err < 1e-4) {
            failures.push(format!("{what}: out {err:.3e}, lse {lse_err:.3e}"));
        }
    };
    for kernel in varlen_kernels_here() {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            for (d, heads, layout) in [
                (64, (8, 2), Layout::Bshd),
                (128, (4, 4), Layout::Bhsd),
                (72, (6, 1), Layout::Bshd),
                (256, (2, 1), Layout::Bshd),
            ] {
                let what =
                    |t: &str| format!("{kernel:?} {t} d {d} heads {heads:?} {causal:?} {layout:?}");
                let f16_case = lengths(5, 2000, causal);
                check(
                    what("f16"),
                    varlen_case::<f16>(&s, kernel, f16_case, heads, d, causal, layout),
                    2e-3,
                );
                let bf16_case = lengths(7, 700, causal);
                check(
                    what("bf16"),
                    varlen_case::<bf16>(&s, kernel, bf16_case, heads, d, causal, layout),
                    1e-2,
                );
            }
            // Partial tiles of every size beside empty and one-token sequences, Sq < Sk and
            // Sq = Sk (bottom-right needs Sk >= Sq for every query to see a key).
            let fixed = (
                vec![1, 17, 0, 1000, 4097, 3],
                vec![5, 17, 9, 1300, 4097, 4000],
            );
            check(
                format!("{kernel:?} f16 lengths {:?} {causal:?}", fixed.0),
                varlen_case::<f16>(&s, kernel, fixed, (2, 1), 64, causal, Layout::Bshd),
                2e-3,
            );
        }
        // One query per sequence (or none) on up to 3000 keys, GQA 4:1 in packed BSHD tensors:
        // the one-query heads run packed into rows (packs_varlen_heads), both dtypes.
        for causal in [Causal::None, Causal::BottomRight] {
            let lq: Vec<usize> = (0..37).map(|i| usize::from(i % 9 != 4)).collect();
            let lk: Vec<usize> = (0..37).map(|i| 1 + i * 8191 % 3000).collect();
            assert!(packs_varlen_heads(&lq, (8, 2), causal, Layout::Bshd));
            let case = (lq, lk);
            check(
                format!("{kernel:?} f16 packed one-query heads {causal:?}"),
                varlen_case::<f16>(&s, kernel, case.clone(), (8, 2), 128, causal, Layout::Bshd),
                2e-3,
            );
            check(
                format!("{kernel:?} bf16 packed one-query heads {causal:?}"),
                varlen_case::<bf16>(&s, kernel, case, (8, 2), 64, causal, Layout::Bshd),
                1e-2,
            );
        }
        // Many short sequences, one query each included (decode-like rows).
        check(
            format!("{kernel:?} f16 40 x <= 3"),
            varlen_case::<f16>(
                &s,
                kernel,
                lengths(40, 3, Causal::BottomRight),
                (8, 2),
                128,
                Causal::BottomRight,
                Layout::Bshd,
            ),
            2e-3,
        );
    }
    assert_none_failed(&failures);
}

/// Wide decode batches of unequal sequences (more (sequence, kv head) units than SMs, the host's
/// key counts known): the Hopper kernel's blocks walk them longest first, dealt back and forth
/// (sm90/scheduler.cuh; plan: core/splits.h `sequence_order`). Variable-length batches packed
/// and unpacked and a paged cache (pages of 64), on every kernel that reads them here, against
/// the f64 reference.
#[test]
#[ignore = "needs a CUDA device"]
fn wide_decode_batches_of_unequal_sequences_match() {
    let s = stream();
    let sms = Device::open(0).unwrap().sm_count();
    let mut failures = Vec::new();
    let mut rng = Rng::fresh();
    // 2 x 160 packed units: more than any GPU here has SMs.
    let n = 160;
    let keys: Vec<usize> = (0..n)
        .map(|_| 1 + (rng.uniform() * rng.uniform() * 3000.0) as usize)
        .collect();
    assert!(2 * n > sms, "{sms} SMs: the batch must outnumber them");
    for kernel in indexed_kernels_here() {
        for (layout, d) in [(Layout::Bshd, 128), (Layout::Bhsd, 64)] {
            let lengths = (vec![1; n], keys.clone());
            let ((err, lse_err), exec) =
                varlen_run::<bf16>(&s, kernel, lengths, (8, 2), d, Causal::BottomRight, layout);
            println!(
                "wide varlen decode {kernel:?} {layout:?}: rel L2 {err:.2e} lse {lse_err:.2e}"
            );
            if !(err < 1e-2 && lse_err < 1e-4 && exec.splits == 1) {
                failures.push(format!(
                    "varlen {kernel:?} {layout:?}: out {err:.3e}, lse {lse_err:.3e}, {} splits",
                    exec.splits
                ));
            }
        }
        let run = (Backend::Kernel(kernel), kernel);
        let paged_keys: Vec<usize> = keys.iter().map(|k| k % 1200 + 1).collect();
        let (err, lse_err, splits) = paged_case::<f16>(
            &s,
            run,
            64,
            &paged_keys,
            1,
            (8, 2),
            128,
            Causal::BottomRight,
            Layout::Bshd,
        );
        println!("wide paged decode {kernel:?}: rel L2 {err:.2e} lse {lse_err:.2e}");
        if !(err < 2e-3 && lse_err < 1e-4 && splits == 1) {
            failures.push(format!(
                "paged {kernel:?}: out {err:.3e}, lse {lse_err:.3e}, {splits} splits"
            ));
        }
    }
    assert_none_failed(&failures);
}

/// Whether a variable-length batch's one-query GQA heads run packed into the rows of (sequence,
/// kv head) units: every sequence has at most one query, which sees every key (no top-left
/// mask), and Q's token stride is a whole number of head strides (BSHD; BHSD with one token).
fn packs_varlen_heads(lq: &[usize], heads: (usize, usize), causal: Causal, layout: Layout) -> bool {
    lq.iter().max() == Some(&1)
        && heads.0 > heads.1
        && causal != Causal::TopLeft
        && (layout == Layout::Bshd || lq.iter().sum::<usize>() == 1)
}

/// Variable-length decode batches (a few queries per sequence, keys up to 32k) split their keys
/// on both kernels that read them, against the f64 reference: with host copies each sequence by
/// its own keys (`sequence_splits`: a long sequence many splits, a short one few, its unused
/// split slots weightless), without them (through the C++ API) every sequence by the longest's
/// (`kv_splits`: the shorter ones' later splits hold no key); a sequence without queries, one
/// key, every causal alignment, d 64 / 72 / 128 / 256, both dtypes and layouts; batches of one
/// query per sequence (1, 2, 4 and 7 sequences) with their GQA and MQA heads packed into rows
/// (every kv head one unit where they pack: `packs_varlen_heads`, which the count shows).
#[test]
#[ignore = "needs a CUDA device"]
fn varlen_split_kv_matches_the_reference() {
    let s = stream();
    let sms = s.device().sm_count();
    let mut failures = Vec::new();
    // (query lengths, key lengths, heads (q, kv), d, layout)
    let cases = [
        (
            vec![1, 3, 0, 2],
            vec![20_000, 5000, 300, 17],
            (8, 2),
            128,
            Layout::Bshd,
        ),
        (vec![1], vec![32_768], (4, 1), 64, Layout::Bhsd),
        (vec![2, 1, 1], vec![9000, 700, 1], (2, 1), 256, Layout::Bshd),
        (vec![1, 4], vec![4097, 2500], (6, 3), 72, Layout::Bshd),
        // Decode batches (at most one query per sequence): their GQA heads pack into rows.
        (
            vec![1, 0, 1, 1],
            vec![20_000, 300, 1, 4500],
            (8, 2),
            128,
            Layout::Bshd,
        ),
        (
            vec![1; 7],
            vec![6000, 1, 12_000, 700, 9000, 4096, 33],
            (32, 8),
            128,
            Layout::Bshd,
        ),
        (vec![1, 1], vec![9000, 12_000], (6, 1), 256, Layout::Bshd),
        (vec![0, 1], vec![100, 15_000], (8, 4), 72, Layout::Bshd),
    ];
    // Whether each case split under some mask (a top-left mask leaves a decode batch unpacked,
    // whose (sequence, query head) units may fill the SMs unsplit).
    let mut split = vec![false; cases.len()];
    for kernel in indexed_kernels_here() {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            for (case, (lq, lk, heads, d, layout)) in cases.iter().enumerate() {
                let lengths = (lq.clone(), lk.clone());
                for (dtype, ((err, lse_err), exec), tol) in [
                    (
                        "f16",
                        varlen_run::<f16>(&s, kernel, lengths.clone(), *heads, *d, causal, *layout),
                        2e-3,
                    ),
                    (
                        "bf16",
                        varlen_run::<bf16>(&s, kernel, lengths, *heads, *d, causal, *layout),
                        1e-2,
                    ),
                ] {
                    // The batch has host copies: each sequence splits by its own keys.
                    let row = exec.tile.expect("a GPU run names its row");
                    let (rows, heads_per_seq) = if packs_varlen_heads(lq, *heads, causal, *layout) {
                        (heads.0 / heads.1, heads.1)
                    } else {
                        (*lq.iter().max().unwrap(), heads.0)
                    };
                    let want = sequence_splits(kernel, &row, rows, heads_per_seq, lk, sms);
                    let what = format!(
                        "{kernel:?} {lq:?} x {lk:?} {heads:?} d {d} {causal:?} {dtype}: {} \
                         splits (want {want})",
                        exec.splits
                    );
                    println!("varlen split-KV {what}, rel L2 {err:.2e} lse {lse_err:.2e}");
                    let accurate = err < tol && lse_err < 1e-4; // false for NaN
                    split[case] |= want >= 2;
                    if exec.splits != want || !accurate {
                        failures.push(format!("{what}: out {err:.3e}, lse {lse_err:.3e}"));
                    }
                }
            }
        }
    }
    for (case, _) in split.iter().enumerate().filter(|(_, s)| !**s) {
        failures.push(format!("case {case} never split its keys"));
    }
    // Without host copies (the public C++ API): every sequence splits as the longest.
    let (lq, lk, heads, d) = (vec![1, 1, 1], vec![20_000, 300, 4500], (8, 2), 128);
    for kernel in indexed_kernels_here() {
        let mut rng = Rng::fresh();
        let (batch, q, k, v) =
            varlen_of_lengths::<bf16>(&mut rng, &lq, &lk, heads, d, Layout::Bshd);
        let mut out = Tensor::full(bf16::NAN, &[1, lq.len(), heads.0, d], Layout::Bshd)
            .unwrap()
            .to_device(&s)
            .unwrap();
        let exec = cpp_attention_varlen(
            &q.to_device(&s).unwrap(),
            &k.to_device(&s).unwrap(),
            &v.to_device(&s).unwrap(),
            &batch.to_device(&s).unwrap(),
            &mut out,
            None,
            &AttentionOptions::default().backend(Backend::Kernel(kernel)),
            false,
        )
        .unwrap();
        let row = exec.tile.expect("a GPU run names its row");
        let want = kv_splits(
            kernel,
            &row,
            heads.0 / heads.1,
            lq.len() * heads.1,
            20_000,
            sms,
        );
        let (reference, _) = naive_varlen(
            &q,
            &k,
            &v,
            batch.cu_seqlens_q(),
            batch.cu_seqlens_k(),
            1.0 / (d as f64).sqrt(),
            Causal::None,
        );
        let err = rel_l2(&logical(&out.to_host().unwrap()), &reference);
        println!(
            "varlen split-KV without host copies {kernel:?}: {} splits (want {want}), rel L2 \
             {err:.2e}",
            exec.splits
        );
        if exec.splits != want || want < 2 || err.is_nan() || err >= 1e-2 {
            failures.push(format!(
                "{kernel:?} without host copies: {} splits (want {want} > 1), rel L2 {err:.3e}",
                exec.splits
            ));
        }
    }
    assert_none_failed(&failures);
}

/// `call` forced onto each of `kernels` (families that do not read its batch) is refused before
/// any launch.
fn refused_on(
    kernels: &[Kernel],
    mut call: impl FnMut(&AttentionOptions) -> Result<Execution, Error>,
) {
    for &kernel in kernels {
        let forced = AttentionOptions::default().backend(Backend::Kernel(kernel));
        let err = call(&forced).unwrap_err();
        assert!(
            matches!(err, Error::BackendUnavailable { .. }),
            "{kernel:?}: {err}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn varlen_errors_launch_nothing() {
    let s = stream();
    let mut rng = Rng::fresh();
    let batch = VarlenBatch::from_lengths(&[3, 5], &[4, 6]).unwrap();
    let q = randn::<f16>(&mut rng, &[1, 8, 4, 64], Layout::Bshd)
        .to_device(&s)
        .unwrap();
    let k = randn::<f16>(&mut rng, &[1, 10, 2, 64], Layout::Bshd)
        .to_device(&s)
        .unwrap();
    let mut out = Tensor::full(f16::NAN, &[1, 8, 4, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let auto = AttentionOptions::default();
    // Host offsets with device tensors.
    let err = attention_varlen_into(&q, &k, &k, &batch, &mut out, None, &auto).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeviceMismatch {
                operand: Operand::CuSeqlensQ,
                ..
            }
        ),
        "{err}"
    );
    let short = VarlenBatch::from_offsets(vec![0, 3, 7], vec![0, 4, 10])
        .unwrap()
        .to_device(&s)
        .unwrap();
    let err = attention_varlen_into(&q, &k, &k, &short, &mut out, None, &auto).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOffsets {
                operand: Operand::CuSeqlensQ,
                rule: OffsetRule::LastNotTokenCount,
                ..
            }
        ),
        "{err}"
    );
    // The public C++ API with the host copies checks them too.
    let err = cpp_attention_varlen(&q, &k, &k, &short, &mut out, None, &auto, true).unwrap_err();
    assert!(
        matches!(err, Error::InvalidOffsets { .. }),
        "C++ API: {err}"
    );
    let untouched = out.to_host().unwrap();
    assert!(untouched.host_data().unwrap().iter().all(|x| x.is_nan()));
}

/// A call whose device inputs broke their contract (`exec`, its result) ran on `kernel`; returns
/// the finite elements of its NaN-poisoned device output (copying it back also shows the stream
/// healthy): the rows the kernel wrote, which clamped offsets or tables never make NaN from
/// nothing.
fn finite_elements<T: AttentionElement>(
    exec: Result<Execution, Error>,
    kernel: Kernel,
    out: &Tensor<T>,
    what: &str,
) -> usize {
    let exec = exec.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(exec.backend, BackendKind::Kernel(kernel), "{what}");
    let written = out.to_host().unwrap_or_else(|e| panic!("{what}: {e}"));
    let values = written.host_data().unwrap();
    values.iter().filter(|x| x.to_f64().is_finite()).count()
}

/// Device offsets that break their contract, given to the public C++ API without host copies
/// (so that nothing can check them before the launch), on the WMMA kernel and (on compute
/// capability 9.0) the Hopper kernel: each kernel clamps them and stays inside the buffers
/// (compute-sanitizer memcheck runs this test in bundle/run.sh), the stream stays healthy, and a
/// valid batch given the same way still matches the reference.
#[test]
#[ignore = "needs a CUDA device"]
fn varlen_device_offsets_stay_inside_the_buffers() {
    let s = stream();
    let mut rng = Rng::fresh();
    let (h, d) = (2, 64);
    let mut packed = |tokens: usize| randn::<bf16>(&mut rng, &[1, tokens, h, d], Layout::Bshd);
    let (q, k, v) = (packed(300), packed(50), packed(50));
    let (dq, dk, dv) = (
        q.to_device(&s).unwrap(),
        k.to_device(&s).unwrap(),
        v.to_device(&s).unwrap(),
    );
    // (The host copies give max_seqlen, which the C++ API checks against the token counts.)
    let bad = [
        (vec![0, 30, 10, 40], vec![0, 20, 60, 50]), // decreasing, beyond the keys
        (vec![-5, 30, 40, 330], vec![-20, 7, 30, 60]), // below 0, beyond the tokens
        (vec![0, 20, 40, 40], vec![0, 0, 50, 50]),  // queries without keys
        // 290 queries on 2 keys: under bottom-right causal (and a window) rows 0-287 see no key,
        // whole query blocks among them.
        (vec![0, 290, 295, 300], vec![0, 2, 3, 50]),
    ];
    for kernel in varlen_kernels_here() {
        let causal = AttentionOptions::default()
            .causal(Causal::BottomRight)
            .backend(Backend::Kernel(kernel))
            .with_lse();
        // Example 41 applies no window.
        let windows: &[_] = if kernel == Kernel::CutlassSm80 {
            &[None]
        } else {
            &[None, Some((Some(1), Some(0)))]
        };
        for (cu_q, cu_k) in &bad {
            for opts in windows.iter().map(|w| match w {
                Some((left, right)) => causal.window(*left, *right),
                None => causal.clone(),
            }) {
                let batch = VarlenBatch::from_offsets(cu_q.clone(), cu_k.clone())
                    .unwrap()
                    .to_device(&s)
                    .unwrap();
                let mut out = Tensor::full(bf16::NAN, &[1, 300, h, d], Layout::Bshd)
                    .unwrap()
                    .to_device(&s)
                    .unwrap();
                let mut lse = Tensor::full(f32::NAN, &[1, h, 300, 1], Layout::Bhsd)
                    .unwrap()
                    .to_device(&s)
                    .unwrap();
                let what = format!("{kernel:?} {cu_q:?} / {cu_k:?} window {:?}", opts.window);
                let lse = Some(&mut lse);
                let exec = cpp_attention_varlen(&dq, &dk, &dv, &batch, &mut out, lse, &opts, false);
                let finite = finite_elements(exec, kernel, &out, &what);
                println!("bad offsets {what}: {finite} finite elements written");
            }
        }
        // A valid batch without host copies, on the first 40 queries.
        let q = randn::<bf16>(&mut rng, &[1, 40, h, d], Layout::Bshd);
        let opts = AttentionOptions::default()
            .causal(Causal::BottomRight)
            .backend(Backend::Kernel(kernel));
        let batch = VarlenBatch::from_lengths(&[10, 0, 30], &[15, 0, 35]).unwrap();
        let on_device = batch.to_device(&s).unwrap();
        let mut out = Tensor::full(bf16::NAN, &[1, 40, h, d], Layout::Bshd)
            .unwrap()
            .to_device(&s)
            .unwrap();
        let exec = cpp_attention_varlen(
            &q.to_device(&s).unwrap(),
            &dk,
            &dv,
            &on_device,
            &mut out,
            None,
            &opts,
            false,
        )
        .unwrap();
        assert_eq!(exec.backend, BackendKind::Kernel(kernel));
        let (want, _) = naive_varlen(
            &q,
            &k,
            &v,
            batch.cu_seqlens_q(),
            batch.cu_seqlens_k(),
            1.0 / 8.0,
            opts.causal,
        );
        let err = rel_l2(&logical(&out.to_host().unwrap()), &want);
        assert!(
            err < 1e-2,
            "{kernel:?}: valid batch through the C++ API without host copies: {err:.3e}"
        );
    }
}

/// One decode-like case on `kernel` (NaN-poisoned outputs): what ran, and the relative L2 errors
/// of the output and the logsumexp against the f64 reference.
fn split_case<T: AttentionElement>(
    s: &Stream,
    kernel: Kernel,
    (b, sq, sk, hq, hk, d): (usize, usize, usize, usize, usize, usize),
    causal: Causal,
) -> (Execution, f64, f64) {
    let mut rng = Rng::fresh();
    let q = randn::<T>(&mut rng, &[b, sq, hq, d], Layout::Bshd);
    let k = randn::<T>(&mut rng, &[b, sk, hk, d], Layout::Bshd);
    let v = randn::<T>(&mut rng, &[b, sk, hk, d], Layout::Bshd);
    let poison = T::from_f64(f64::NAN);
    let mut out = Tensor::full(poison, &[b, sq, hq, d], Layout::Bshd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let mut lse = Tensor::full(f32::NAN, &[b, hq, sq, 1], Layout::Bhsd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let opts = AttentionOptions::default()
        .causal(causal)
        .backend(Backend::Kernel(kernel))
        .with_lse();
    let (dq, dk, dv) = (
        q.to_device(s).unwrap(),
        k.to_device(s).unwrap(),
        v.to_device(s).unwrap(),
    );
    let exec = attention_into(&dq, &dk, &dv, &mut out, Some(&mut lse), &opts).unwrap();
    let (want, want_lse) = naive(&q, &k, &v, 1.0 / (d as f64).sqrt(), causal);
    (
        exec,
        rel_l2(&logical(&out.to_host().unwrap()), &want),
        rel_l2(&lse_values(&lse.to_host().unwrap()), &want_lse),
    )
}

/// Split-KV decoding on the WMMA kernel and (on compute capability 9.0) the Hopper kernel: few
/// query rows over many keys, split over blocks and combined through their logsumexps, against
/// the f64 reference. The split count is `kv_splits`', and 1 when the (batch, head) units fill
/// the GPU.
#[test]
#[ignore = "needs a CUDA device"]
fn split_kv_decode_matches_the_reference() {
    let s = stream();
    let sms = s.device().sm_count();
    let mut failures = Vec::new();
    // (batch, query rows, keys, heads q, heads kv, d), causal
    let cases = [
        ((1, 1, 32768, 32, 8, 128), Causal::BottomRight),
        ((2, 1, 5001, 32, 8, 128), Causal::None),
        ((7, 1, 3000, 16, 16, 64), Causal::BottomRight),
        ((64, 1, 2048, 32, 8, 128), Causal::BottomRight),
        ((1, 1, 9000, 8, 1, 256), Causal::TopLeft), // the one query sees key 0 only
        ((1, 3, 20000, 4, 4, 128), Causal::BottomRight),
        ((3, 17, 4100, 2, 1, 72), Causal::TopLeft),
    ];
    for (shape, causal) in cases {
        let (b, sq, sk, hq, hk, _) = shape;
        let packed = sq == 1 && hq > hk && causal != Causal::TopLeft;
        let (rows, units) = if packed {
            (hq / hk, b * hk)
        } else {
            (sq, b * hq)
        };
        for kernel in indexed_kernels_here() {
            for (dtype, (exec, err, lse_err), tol) in [
                ("f16", split_case::<f16>(&s, kernel, shape, causal), 2e-3),
                ("bf16", split_case::<bf16>(&s, kernel, shape, causal), 1e-2),
            ] {
                // Every case has at most 32 rows per head: WMMA runs its decode row, the Hopper
                // kernel its one table.
                let row = exec.tile.expect("a GPU run names its row");
                let right_row = kernel != Kernel::Wmma || decode_table(kernel).contains(&row);
                let want = kv_splits(kernel, &row, rows, units, sk, sms);
                let what = format!(
                    "{kernel:?} {shape:?} {causal:?} {dtype}: {} splits (want {want}), tile {:?}",
                    exec.splits, row.tile
                );
                println!("split-KV {what}, rel L2 {err:.2e} lse {lse_err:.2e}");
                let accurate = err < tol && lse_err < 1e-4; // false for NaN
                if exec.splits != want || !right_row || !accurate {
                    failures.push(format!("{what}: out {err:.3e}, lse {lse_err:.3e}"));
                }
            }
        }
    }
    let class = class_of(s.device());
    let row = decode_table(Kernel::Wmma)
        .iter()
        .find(|r| Some(r.arch) == class && r.max_head_dim >= 128)
        .expect("a decode row for this GPU");
    assert!(
        kv_splits(Kernel::Wmma, row, 4, 8, 32768, sms) > 1,
        "one sequence of 32k keys is split on this GPU"
    );
    assert_none_failed(&failures);
}

/// An output whose rows share addresses, copied to the device, is refused before any launch
/// (the issue's report: it was accepted and the kernel's writes raced), on every GPU family.
#[test]
#[ignore = "needs a CUDA device"]
fn overlapping_outputs_launch_nothing() {
    let s = stream();
    let mut rng = Rng::fresh();
    let q = randn::<f16>(&mut rng, &[1, 64, 2, 64], Layout::Bshd)
        .to_device(&s)
        .unwrap();
    let poison = vec![f16::from_f32(7.0); 128];
    let host = Tensor::from_vec_strided(poison, Shape::new(1, 64, 2, 64), [128, 0, 64, 1]).unwrap();
    let mut out = host.to_device(&s).unwrap();
    for backend in [
        Backend::Auto,
        Kernel::Wmma.into(),
        Kernel::CutlassSm80.into(),
    ] {
        let opts = AttentionOptions::default().backend(backend);
        let e = attention_into(&q, &q, &q, &mut out, None, &opts).unwrap_err();
        assert_eq!(
            e,
            Error::OverlappingOutput {
                operand: Operand::Out,
                other: None
            },
            "{backend:?}"
        );
    }
    let after = out.to_host().unwrap();
    assert!(after
        .host_data()
        .unwrap()
        .iter()
        .all(|x| *x == f16::from_f32(7.0)));
}

/// The host hot path allocates nothing on the Rust heap per call, once warm: attention_into
/// (validation, planning and launch in C++), a planned run, a planned paged decode, and split-KV
/// decode (its workspace is stream-ordered device memory). C++'s own validation and planning are
/// checked the same way by cpp/tests/core_test.cpp (no_allocation_on_the_hot_path).
#[test]
#[ignore = "needs a CUDA device"]
fn hot_path_allocates_nothing_on_the_host() {
    let s = stream();
    let mut rng = Rng::fresh();
    let dev =
        |rng: &mut Rng, d: &[usize]| randn::<bf16>(rng, d, Layout::Bshd).to_device(&s).unwrap();
    let (q, k) = (
        dev(&mut rng, &[2, 256, 8, 64]),
        dev(&mut rng, &[2, 256, 2, 64]),
    );
    let mut out = Tensor::uninit_on(&s, &[2, 256, 8, 64], Layout::Bshd).unwrap();
    let mut lse = Tensor::<f32>::uninit_on(&s, &[2, 8, 256, 1], Layout::Bhsd).unwrap();
    let (dq, dk) = (
        dev(&mut rng, &[1, 1, 32, 128]),
        dev(&mut rng, &[1, 32768, 8, 128]),
    );
    let mut dout = Tensor::uninit_on(&s, &[1, 1, 32, 128], Layout::Bshd).unwrap();
    let causal = AttentionOptions::default().causal(Causal::BottomRight);
    let plan = AttentionPlan::new(&q, &k, &k, &out, Some(&lse), &causal).unwrap();
    // A planned paged decode: the same 32k keys as 512 pages of 64.
    let cache = dev(&mut rng, &[512, 64, 8, 128]);
    let pages = PageTable::new(64, vec![(0..512).rev().collect()], vec![32768])
        .unwrap()
        .to_device(&s)
        .unwrap();
    let paged =
        AttentionPlan::new_paged(&dq, &cache, &cache, &pages, &dout, None, &causal).unwrap();
    let calls = |out: &mut Tensor<bf16>, lse: &mut Tensor<f32>, dout: &mut Tensor<bf16>| {
        attention_into(&q, &k, &k, out, Some(lse), &causal).unwrap();
        plan.run(&q, &k, &k, out, Some(lse)).unwrap();
        paged.run(&dq, &cache, &cache, dout, None).unwrap();
        attention_into(&dq, &dk, &dk, dout, None, &Default::default()).unwrap()
    };
    let warm = calls(&mut out, &mut lse, &mut dout); // fills the tables and the pools once
    assert!(warm.splits > 1, "the decode call splits its keys: {warm:?}");
    let before = allocations();
    for _ in 0..100 {
        calls(&mut out, &mut lse, &mut dout);
    }
    let made = allocations() - before;
    s.synchronize().unwrap();
    assert_eq!(made, 0, "400 calls allocated {made} times on the host");
}

/// One paged call on the GPU under `backend`, which must run `kernel` (a random cache: `lengths` keys per sequence
/// in shuffled pages of `size`, a few spare pages, every page's slots past its sequence's keys
/// NaN) against the f64 formula on each sequence's gathered keys; NaN poisoned outputs. Returns
/// the output's and the logsumexp's relative L2 errors and the split count that ran.
#[allow(clippy::too_many_arguments)]
fn paged_case<T: AttentionElement>(
    s: &Stream,
    (backend, kernel): (Backend, Kernel),
    size: usize,
    lengths: &[usize],
    seq_q: usize,
    heads: (usize, usize),
    d: usize,
    causal: Causal,
    layout: Layout,
) -> (f64, f64, usize) {
    let mut rng = Rng::fresh();
    let batch = lengths.len();
    let (table, num_pages) = random_pages(&mut rng, size, lengths, 3);
    let seqlens = lengths.iter().map(|&n| n as i32).collect();
    let pages = PageTable::new(size, table.clone(), seqlens).unwrap();
    let at = |b, s, h| dims(Shape::new(b, s, h, d), layout);
    let k = unused_slots_nan(
        randn::<T>(&mut rng, &at(num_pages, size, heads.1), layout),
        &table,
        lengths,
        size,
    );
    let v = unused_slots_nan(
        randn::<T>(&mut rng, &at(num_pages, size, heads.1), layout),
        &table,
        lengths,
        size,
    );
    let q = randn::<T>(&mut rng, &at(batch, seq_q, heads.0), layout);
    let mut out = Tensor::full(T::from_f64(f64::NAN), &at(batch, seq_q, heads.0), layout)
        .unwrap()
        .to_device(s)
        .unwrap();
    let mut lse = Tensor::full(f32::NAN, &[batch, heads.0, seq_q, 1], Layout::Bhsd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let opts = AttentionOptions::default()
        .causal(causal)
        .with_lse()
        .backend(backend);
    let exec = attention_paged_into(
        &q.to_device(s).unwrap(),
        &k.to_device(s).unwrap(),
        &v.to_device(s).unwrap(),
        &pages.to_device(s).unwrap(),
        &mut out,
        Some(&mut lse),
        &opts,
    )
    .unwrap_or_else(|e| panic!("{kernel:?}, pages of {size}, lengths {lengths:?}: {e}"));
    assert_eq!(exec.backend, BackendKind::Kernel(kernel));
    let scale = 1.0 / (d as f64).sqrt();
    let (want, want_lse) = naive_paged(&q, &k, &v, &table, lengths, size, scale, causal);
    (
        rel_l2(&logical(&out.to_host().unwrap()), &want),
        rel_l2(&lse_values(&lse.to_host().unwrap()), &want_lse),
        exec.splits,
    )
}

/// Paged caches on the WMMA kernel and (on compute capability 9.0) the Hopper kernel: every page
/// size from 16 to 256, shuffled pages and partial last pages whose unused slots hold NaN, decode
/// (one query, keys split across blocks for the long ones) and chunked prefill (several queries,
/// every causal mode), GQA, both layouts and dtypes, head dims 64 to 256; and the kernel Auto
/// picks for a small decode batch.
#[test]
#[ignore = "needs a CUDA device"]
fn paged_caches_match_the_reference() {
    let s = stream();
    let mut failures = Vec::new();
    for kernel in indexed_kernels_here() {
        let run = (Backend::Kernel(kernel), kernel);
        let mut split_seen = false;
        let mut check = |what: String, (err, lse_err, splits): (f64, f64, usize), tol: f64| {
            println!(
                "paged {kernel:?} {what}: rel L2 {err:.2e} lse {lse_err:.2e}, {splits} split(s)"
            );
            split_seen |= splits > 1;
            if !(err < tol && lse_err < 1e-4) {
                failures.push(format!(
                    "{kernel:?} {what}: out {err:.3e}, lse {lse_err:.3e}"
                ));
            }
        };
        let bshd = Layout::Bshd;
        for size in [16, 32, 64, 128, 256] {
            let lengths = [size * 3 + 5, 1, size - 1, 2 * size];
            for (d, heads) in [(64, (8, 2)), (128, (4, 4)), (256, (2, 1))] {
                let what = |t: &str, n| format!("{t} pages {size} d {d} heads {heads:?} seq_q {n}");
                let br = Causal::BottomRight;
                check(
                    what("f16 decode", 1),
                    paged_case::<f16>(&s, run, size, &lengths, 1, heads, d, br, bshd),
                    2e-3,
                );
                check(
                    what("bf16 decode", 1),
                    paged_case::<bf16>(&s, run, size, &lengths, 1, heads, d, br, Layout::Bhsd),
                    1e-2,
                );
            }
        }
        // Chunked prefill: new queries attend to the cache's keys (their own included).
        for (causal, seq_q) in [
            (Causal::BottomRight, 7),
            (Causal::BottomRight, 100),
            (Causal::None, 33),
            (Causal::TopLeft, 70),
        ] {
            for size in [16, 64] {
                let lengths = [300, seq_q, 129 + seq_q];
                let what = format!("f16 prefill pages {size} seq_q {seq_q} {causal:?}");
                let heads = (8, 2);
                check(
                    what,
                    paged_case::<f16>(&s, run, size, &lengths, seq_q, heads, 128, causal, bshd),
                    2e-3,
                );
                let what = format!("bf16 prefill pages {size} seq_q {seq_q} {causal:?} d 72");
                let (heads, bhsd) = ((4, 1), Layout::Bhsd);
                check(
                    what,
                    paged_case::<bf16>(&s, run, size, &lengths, seq_q, heads, 72, causal, bhsd),
                    1e-2,
                );
            }
        }
        // Prefill on the d = 64 and d = 256 tiles (four and one page per key tile at pages of 16).
        for (d, heads) in [(64, (8, 2)), (256, (2, 2))] {
            for size in [16, 128] {
                let lengths = [500, 100, 333];
                let br = Causal::BottomRight;
                check(
                    format!("f16 prefill pages {size} seq_q 100 d {d}"),
                    paged_case::<f16>(&s, run, size, &lengths, 100, heads, d, br, bshd),
                    2e-3,
                );
            }
        }
        // Split-KV decode over pages: one and seven long sequences.
        for (n, size) in [(1, 16), (1, 64), (7, 64)] {
            let lengths: Vec<usize> = (0..n).map(|i| 20_000 + 977 * i).collect();
            let none = Causal::None;
            check(
                format!("bf16 split decode {n} x ~20k keys, pages {size}"),
                paged_case::<bf16>(&s, run, size, &lengths, 1, (32, 8), 128, none, bshd),
                1e-2,
            );
        }
        assert!(split_seen, "{kernel:?}: no paged decode split its keys");
    }
    // Auto: a small decode batch takes the Hopper kernel on compute capability 9.0 (faster there,
    // docs/PERFORMANCE.md), WMMA elsewhere; paged_case asserts which one ran.
    let auto = if runs_here(Kernel::CutlassSm90) {
        Kernel::CutlassSm90
    } else {
        Kernel::Wmma
    };
    let (err, lse_err, _) = paged_case::<bf16>(
        &s,
        (Backend::Auto, auto),
        64,
        &[3000, 1000],
        1,
        (32, 8),
        128,
        Causal::BottomRight,
        Layout::Bshd,
    );
    println!("paged Auto ({auto:?}) bf16 decode 2 sequences: rel L2 {err:.2e} lse {lse_err:.2e}");
    if !(err < 1e-2 && lse_err < 1e-4) {
        failures.push(format!(
            "Auto ({auto:?}) decode: out {err:.3e}, lse {lse_err:.3e}"
        ));
    }
    assert_none_failed(&failures);
}

/// `t` (a paged cache of pages of `size` slots, named by `table` for sequences of `lengths`
/// keys) with NaN in every slot past its sequence's keys and in every page no sequence names:
/// a kernel must not let them reach the output.
fn unused_slots_nan<T: AttentionElement>(
    t: Tensor<T>,
    table: &[Vec<i32>],
    lengths: &[usize],
    size: usize,
) -> Tensor<T> {
    let (shape, st) = (t.shape(), t.strides());
    let slots = shape.seq;
    let mut used = vec![false; shape.batch * slots];
    for (row, &n) in table.iter().zip(lengths) {
        for j in 0..n {
            used[row[j / size] as usize * slots + j % size] = true;
        }
    }
    let mut data = t.host_data().unwrap().to_vec();
    for (slot, _) in used.iter().enumerate().filter(|(_, &u)| !u) {
        let (page, i) = (slot / slots, slot % slots);
        for h in 0..shape.heads {
            for x in 0..shape.head_dim {
                data[page * st[0] + i * st[1] + h * st[2] + x * st[3]] = T::from_f64(f64::NAN);
            }
        }
    }
    Tensor::from_vec_strided(data, shape, st).unwrap()
}

/// Paged calls that cannot run: a host table with device tensors, a family that reads no pages
/// (example 41 everywhere, the Hopper kernel off compute capability 9.0), a table the host copy
/// refutes; nothing is written.
#[test]
#[ignore = "needs a CUDA device"]
fn paged_errors_launch_nothing() {
    let s = stream();
    let mut rng = Rng::fresh();
    let q = randn::<f16>(&mut rng, &[2, 1, 4, 64], Layout::Bshd)
        .to_device(&s)
        .unwrap();
    let k = randn::<f16>(&mut rng, &[10, 16, 2, 64], Layout::Bshd)
        .to_device(&s)
        .unwrap();
    let mut out = Tensor::full(f16::NAN, &[2, 1, 4, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let auto = AttentionOptions::default();
    let pages = PageTable::new(16, vec![vec![3, 0, 9], vec![5, 2, 7, 8]], vec![40, 64]).unwrap();
    let err = attention_paged_into(&q, &k, &k, &pages, &mut out, None, &auto).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeviceMismatch {
                operand: Operand::BlockTable,
                ..
            }
        ),
        "{err}"
    );
    let on_device = pages.to_device(&s).unwrap();
    // Example 41 reads no pages; the Hopper kernel does, on compute capability 9.0 only.
    let indexed = indexed_kernels_here();
    let refusing: Vec<Kernel> = Kernel::ALL
        .into_iter()
        .filter(|k| !indexed.contains(k))
        .collect();
    refused_on(&refusing, |forced| {
        attention_paged_into(&q, &k, &k, &on_device, &mut out, None, forced)
    });
    let bad = PageTable::new(16, vec![vec![3, 0, 10], vec![5, 2, 7, 8]], vec![40, 64])
        .unwrap()
        .to_device(&s)
        .unwrap();
    let err = attention_paged_into(&q, &k, &k, &bad, &mut out, None, &auto).unwrap_err();
    assert!(matches!(err, Error::InvalidPageTable { .. }), "{err}");
    let err = cpp_attention_paged(&q, &k, &k, &bad, &mut out, None, &auto, true).unwrap_err();
    assert!(
        matches!(err, Error::InvalidPageTable { .. }),
        "C++ API: {err}"
    );
    let untouched = out.to_host().unwrap();
    assert!(untouched.host_data().unwrap().iter().all(|x| x.is_nan()));
}

/// A device block table and key counts that break their contract, given to the public C++ API
/// without host copies (so that nothing can check them before the launch): page indices below 0
/// or past the cache, a negative key count. Each kernel that reads pages (WMMA, and the Hopper
/// kernel on compute capability 9.0) clamps them and stays inside the buffers
/// (compute-sanitizer memcheck runs this test); a valid table given the same way still matches
/// the reference.
#[test]
#[ignore = "needs a CUDA device"]
fn paged_device_table_stays_inside_the_buffers() {
    let s = stream();
    let mut rng = Rng::fresh();
    let (h, d, size) = (2, 64, 16);
    let q = randn::<bf16>(&mut rng, &[2, 3, h, d], Layout::Bshd);
    let k = randn::<bf16>(&mut rng, &[6, size, h, d], Layout::Bshd);
    let v = randn::<bf16>(&mut rng, &[6, size, h, d], Layout::Bshd);
    let (dq, dk, dv) = (
        q.to_device(&s).unwrap(),
        k.to_device(&s).unwrap(),
        v.to_device(&s).unwrap(),
    );
    // A device table without host copies, and a NaN-poisoned output.
    let device_pages = |table: &[Vec<i32>], seqlens: &[i32]| {
        PageTable::new(size, table.to_vec(), seqlens.to_vec())
            .unwrap()
            .to_device(&s)
            .unwrap()
    };
    let nan_out = || {
        Tensor::full(bf16::NAN, &[2, 3, h, d], Layout::Bshd)
            .unwrap()
            .to_device(&s)
            .unwrap()
    };
    for kernel in indexed_kernels_here() {
        let opts = AttentionOptions::default()
            .causal(Causal::BottomRight)
            .with_lse()
            .backend(Backend::Kernel(kernel));
        let bad = [
            (vec![vec![-7, 2, 99], vec![5, 6, 1 << 30]], vec![48, 40]), // pages outside the cache
            (vec![vec![0, 1], vec![2, 3]], vec![-5, 32]), // a negative count (the longest fits)
        ];
        for (table, seqlens) in bad {
            let pages = device_pages(&table, &seqlens);
            let mut out = nan_out();
            let mut lse = Tensor::full(f32::NAN, &[2, h, 3, 1], Layout::Bhsd)
                .unwrap()
                .to_device(&s)
                .unwrap();
            let what = format!("{kernel:?}: table {table:?}, counts {seqlens:?}");
            let lse = Some(&mut lse);
            let exec = cpp_attention_paged(&dq, &dk, &dv, &pages, &mut out, lse, &opts, false);
            let finite = finite_elements(exec, kernel, &out, &what);
            println!("bad paged cache {what}: {finite} finite elements written");
        }
        let table = vec![vec![4, 1], vec![0, 5, 3]];
        let lengths = [20, 40];
        let pages = device_pages(&table, &[20, 40]);
        let mut out = nan_out();
        let exec =
            cpp_attention_paged(&dq, &dk, &dv, &pages, &mut out, None, &opts, false).unwrap();
        assert_eq!(exec.backend, BackendKind::Kernel(kernel));
        let (want, _) = naive_paged(
            &q,
            &k,
            &v,
            &table,
            &lengths,
            size,
            0.125,
            Causal::BottomRight,
        );
        let err = rel_l2(&logical(&out.to_host().unwrap()), &want);
        assert!(
            err < 1e-2,
            "{kernel:?}, valid table without host copies: rel L2 {err}"
        );
    }
}

/// Plans made once per batch composition (a paged cache's table with split-KV decode, a
/// variable-length batch) run each layer's new operands like the direct calls, bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn plans_for_paged_caches_and_varlen_batches_run_like_the_direct_calls() {
    let s = stream();
    let mut rng = Rng::fresh();
    let dev =
        |rng: &mut Rng, d: &[usize]| randn::<bf16>(rng, d, Layout::Bshd).to_device(&s).unwrap();
    let host = |t: &Tensor<bf16>| t.to_host().unwrap().host_data().unwrap().to_vec();
    // Paged decode: one sequence of 20,000 keys in shuffled pages of 64, keys split.
    let (table, num_pages) = random_pages(&mut rng, 64, &[20_000], 2);
    let pages = PageTable::new(64, table, vec![20_000])
        .unwrap()
        .to_device(&s)
        .unwrap();
    let q = dev(&mut rng, &[1, 1, 32, 128]);
    let mut out = Tensor::uninit_on(&s, &[1, 1, 32, 128], Layout::Bshd).unwrap();
    let opts = AttentionOptions::default();
    let caches = |rng: &mut Rng| {
        (
            dev(rng, &[num_pages, 64, 8, 128]),
            dev(rng, &[num_pages, 64, 8, 128]),
        )
    };
    let (k, v) = caches(&mut rng);
    let plan = AttentionPlan::new_paged(&q, &k, &v, &pages, &out, None, &opts).unwrap();
    assert!(plan.execution().splits > 1, "{:?}", plan.execution());
    for _layer in 0..2 {
        let (k, v) = caches(&mut rng);
        plan.run(&q, &k, &v, &mut out, None).unwrap();
        let want = attention_paged(&q, &k, &v, &pages, &opts).unwrap().out;
        assert_eq!(host(&out), host(&want), "planned paged run");
    }
    // Variable-length prefill.
    let batch = VarlenBatch::from_lengths(&[300, 0, 77], &[500, 10, 77])
        .unwrap()
        .to_device(&s)
        .unwrap();
    let causal = AttentionOptions::default().causal(Causal::BottomRight);
    let mut out = Tensor::uninit_on(&s, &[1, 377, 8, 64], Layout::Bshd).unwrap();
    let layer = |rng: &mut Rng| {
        (
            dev(rng, &[1, 377, 8, 64]),
            dev(rng, &[1, 587, 2, 64]),
            dev(rng, &[1, 587, 2, 64]),
        )
    };
    let (q, k, v) = layer(&mut rng);
    let plan = AttentionPlan::new_varlen(&q, &k, &v, &batch, &out, None, &causal).unwrap();
    for _layer in 0..2 {
        let (q, k, v) = layer(&mut rng);
        plan.run(&q, &k, &v, &mut out, None).unwrap();
        let want = attention_varlen(&q, &k, &v, &batch, &causal).unwrap().out;
        assert_eq!(host(&out), host(&want), "planned varlen run");
    }
}

/// One dense call with score modifiers on the GPU (Auto: the WMMA kernel), NaN-poisoned, against
/// the naive f64 formula; returns (out error, lse error) and the key splits it ran.
fn mods_case<T: AttentionElement>(
    s: &Stream,
    sizes: (usize, usize, usize),
    heads: (usize, usize, usize),
    causal: Causal,
    mods: common::Mods,
) -> ((f64, f64), usize) {
    mods_case_on::<T>(s, Kernel::Wmma, None, sizes, heads, causal, mods)
}

/// Options with `causal` and `mods`' window, softcap and ALiBi slopes (on `s`'s device) for
/// `batch` sequences of `heads_q` heads; their scale and bias are the caller's.
fn modifier_options(
    s: &Stream,
    causal: Causal,
    mods: &common::Mods,
    (batch, heads_q): (usize, usize),
) -> AttentionOptions {
    let mut opts = AttentionOptions::default()
        .causal(causal)
        .window(mods.window.0, mods.window.1);
    opts.softcap = mods.softcap.map(|c| c as f32);
    opts.alibi = mods.alibi.as_ref().map(|slopes| {
        let slopes = if slopes.len() == heads_q {
            AlibiSlopes::new(slopes.clone())
        } else {
            AlibiSlopes::per_sequence(batch, slopes.clone())
        };
        slopes.unwrap().to_device(s).unwrap()
    });
    opts
}

/// [`mods_case`] on `kernel`, forced where `forced` (else Auto, which must choose it).
fn mods_case_on<T: AttentionElement>(
    s: &Stream,
    kernel: Kernel,
    forced: Option<Kernel>,
    (b, sq, sk): (usize, usize, usize),
    (hq, hk, d): (usize, usize, usize),
    causal: Causal,
    mods: common::Mods,
) -> ((f64, f64), usize) {
    let mut rng = Rng::fresh();
    let (qs, ks) = (Shape::new(b, sq, hq, d), Shape::new(b, sk, hk, d));
    let q = randn::<T>(&mut rng, &dims(qs, Layout::Bshd), Layout::Bshd);
    let k = randn::<T>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
    let v = randn::<T>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
    let mut out = Tensor::full(T::from_f64(f64::NAN), &dims(qs, Layout::Bshd), Layout::Bshd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let mut lse = Tensor::full(f32::NAN, &[b, hq, sq, 1], Layout::Bhsd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let mut opts = modifier_options(s, causal, &mods, (b, hq)).with_lse();
    opts.scale = mods.scale;
    opts.bias = mods.bias.as_ref().map(|nb| device_bias(nb, s));
    if let Some(k) = forced {
        opts = opts.backend(Backend::Kernel(k));
    }
    let exec = attention_into(
        &q.to_device(s).unwrap(),
        &k.to_device(s).unwrap(),
        &v.to_device(s).unwrap(),
        &mut out,
        Some(&mut lse),
        &opts,
    )
    .unwrap_or_else(|e| panic!("{b}x{sq}x{sk} {causal:?} {mods:?}: {e}"));
    assert_eq!(exec.backend, BackendKind::Kernel(kernel));
    let scale = mods.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let (want, want_lse) = common::naive_mods(&q, &k, &v, scale, causal, mods);
    let errs = (
        rel_l2(&logical(&out.to_host().unwrap()), &want),
        common::lse_error(&lse_values(&lse.to_host().unwrap()), &want_lse),
    );
    (errs, exec.splits)
}

/// Sliding windows and softcaps on the GPU (the WMMA kernel's modifier instantiation) against
/// the naive f64 formula: every causal alignment, Sq below, equal to and above Sk, GQA, both
/// dtypes, head dims 64 / 128 / 256 and 72, the edge of the band (windows of 0 and 1, one side
/// only, wider than Sk), small and large caps, both combined, one-query decode (split over the
/// keys) with a window. Forcing another family is refused; variable-length and paged calls with
/// a window and a softcap match the CPU reference.
#[test]
#[ignore = "needs a CUDA device"]
fn score_modifiers_match_the_reference() {
    use common::Mods;
    let s = stream();
    let mut checks = Checks::new("modifiers");
    let windows = [
        (Some(0), Some(0)),
        (Some(1), None),
        (Some(64), Some(0)),
        (Some(100), Some(37)),
        (None, Some(5)),
        (Some(5000), None),
    ];
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        for (i, &window) in windows.iter().enumerate() {
            // Every window fits every causal mode on these lengths (no row without keys).
            let (sizes, heads) = match i % 3 {
                0 => ((2, 200, 333), (8, 2, 128)),
                1 => ((1, 150, 150), (4, 4, 64)),
                _ => ((2, 97, 300), (6, 1, 256)),
            };
            let mods = Mods {
                window,
                ..Mods::default()
            };
            let what = format!("{sizes:?} {heads:?} {causal:?} window {window:?}");
            checks.both_dtypes(&s, &what, (sizes, heads, causal), mods);
        }
        for cap in [0.5, 30.0, 1e4] {
            let mods = Mods {
                softcap: Some(cap),
                ..Mods::default()
            };
            let what = format!("{causal:?} softcap {cap}");
            checks.check(
                format!("f16 {what}"),
                mods_case::<f16>(&s, (2, 130, 257), (8, 2, 128), causal, mods.clone()).0,
                2e-3,
            );
            checks.check(
                format!("bf16 d72 {what}"),
                mods_case::<bf16>(&s, (1, 64, 100), (4, 2, 72), causal, mods).0,
                1e-2,
            );
        }
        let both = Mods {
            softcap: Some(20.0),
            window: (Some(50), Some(10)),
            ..Mods::default()
        };
        // Sq > Sk (bottom-right causal would leave rows without keys: Sq < Sk there).
        let sizes = match causal {
            Causal::BottomRight => (1, 290, 300),
            _ => (1, 300, 290),
        };
        checks.check(
            format!("f16 {causal:?} softcap and window {sizes:?}"),
            mods_case::<f16>(&s, sizes, (8, 8, 64), causal, both).0,
            2e-3,
        );
    }
    // Decode: one query per head against 20k keys, a window of 1000: split over the keys.
    let decode = Mods {
        softcap: Some(30.0),
        window: (Some(1000), None),
        ..Mods::default()
    };
    let wmma = Kernel::Wmma;
    let (errs, splits) = mods_case_on::<bf16>(
        &s,
        wmma,
        Some(wmma),
        (1, 1, 20_000),
        (32, 8, 128),
        Causal::BottomRight,
        decode,
    );
    assert!(splits > 1, "a long decode splits its keys ({splits})");
    checks.check(
        format!("bf16 decode 1x20000 window 1000, {splits} splits"),
        errs,
        1e-2,
    );
    assert_eq!(checks.count, 58, "every modifier case ran");
    assert_none_failed(&checks.failures);

    // Forcing a family without the modifier is refused before any launch (the Hopper kernel
    // takes a window and a softcap: hopper_window_and_softcap_match_the_reference).
    let x = Tensor::full(f16::ONE, &[1, 64, 4, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    for (opts, kernels) in [
        (
            AttentionOptions::default().window(Some(8), None),
            &[Kernel::CutlassSm80][..],
        ),
        (
            AttentionOptions::default().softcap(10.0),
            &[Kernel::CutlassSm80][..],
        ),
        (
            AttentionOptions::default()
                .window(Some(8), None)
                .softcap(10.0),
            &[Kernel::CutlassSm80][..],
        ),
    ] {
        for &kernel in kernels {
            let err = attention(&x, &x, &x, &opts.backend(Backend::Kernel(kernel))).unwrap_err();
            assert!(
                matches!(err, Error::BackendUnavailable { .. }),
                "{kernel:?}: {err}"
            );
        }
    }

    // Variable-length and paged calls with modifiers match the CPU reference's.
    let opts = AttentionOptions::default()
        .causal(Causal::BottomRight)
        .window(Some(70), None)
        .softcap(25.0);
    modified_batches_match_the_cpu(&s, "a window and a softcap", |_, _, _| {
        (opts.backend(Backend::Cpu), opts.clone())
    });
}

/// Sliding windows, softcaps and ALiBi on the Hopper kernel (forced) against the naive f64
/// formula: its three tiles (d = 64, 128, 256, and 72 on the d = 128 tile), every causal
/// alignment, Sq below, equal to and above Sk, GQA and MQA, windows of 0 and 1 keys, one side
/// only, both sides, wider than Sk, on lengths of several query and key tiles with partial ones,
/// where whole key tiles left of the band are skipped and rows see no key of their block's first
/// tiles; small, middle and large caps and the paper's, per-sequence, zero, negative and large
/// slopes (each tile's modifier kernel), all three together; both dtypes, the lse. Auto runs the
/// Hopper kernel for a modified call that fills the chip. Off compute capability 9.0, forcing it
/// is refused.
#[test]
#[ignore = "needs a CUDA device"]
fn hopper_window_softcap_and_alibi_match_the_reference() {
    use common::Mods;
    let s = stream();
    if !runs_here(Kernel::CutlassSm90) {
        let x = Tensor::full(f16::ONE, &[1, 64, 4, 64], Layout::Bshd)
            .unwrap()
            .to_device(&s)
            .unwrap();
        let opts = AttentionOptions::default()
            .window(Some(8), None)
            .backend(Backend::Kernel(Kernel::CutlassSm90));
        let err = attention(&x, &x, &x, &opts).unwrap_err();
        assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
        return;
    }
    let mut checks = Checks::new("hopper modifiers");
    let mut run = |what: &str, sizes, heads, causal, window, softcap, alibi| {
        let mods = Mods {
            window,
            softcap,
            alibi,
            ..Mods::default()
        };
        let hopper = Kernel::CutlassSm90;
        checks.both_dtypes_on(&s, hopper, Some(hopper), what, (sizes, heads, causal), mods);
    };
    let windows = [
        (Some(0), Some(0)),
        (Some(1), None),
        (Some(64), Some(0)),
        (Some(200), Some(37)),
        (None, Some(5)),
        (Some(3000), None),
    ];
    let caps = [0.5, 30.0, 1e4];
    let geometric = |heads: usize| AlibiSlopes::geometric(heads).unwrap().values().to_vec();
    let mut rng = Rng::fresh();
    // (sizes, heads, slopes, name)
    let alibi_cases = [
        ((1, 700, 1300), (8, 2, 128), geometric(8), "geometric"),
        (
            (2, 600, 600),
            (4, 4, 64),
            random_slopes(&mut rng, 8),
            "per sequence",
        ),
        (
            (1, 450, 1000),
            (6, 1, 256),
            vec![0.0, -0.05, 8.0, 100.0, 0.5, 1e-3],
            "zero, negative, large",
        ),
        (
            (1, 740, 700),
            (4, 2, 72),
            random_slopes(&mut rng, 4),
            "Sq > Sk",
        ),
    ];
    // Sq <= Sk: every window leaves every row a key under every alignment.
    let problem = |i: usize| match i % 4 {
        0 => ((1, 700, 1300), (8, 2, 128)),
        1 => ((2, 600, 600), (4, 4, 64)),
        2 => ((1, 450, 1000), (6, 1, 256)),
        _ => ((1, 517, 517), (4, 2, 72)),
    };
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        for (i, &window) in windows.iter().enumerate() {
            let (sizes, heads) = problem(i);
            let what = format!("{sizes:?} {heads:?} {causal:?} window {window:?}");
            run(&what, sizes, heads, causal, window, None, None);
        }
        for (i, &cap) in caps.iter().enumerate() {
            let (sizes, heads) = problem(i + 1);
            let what = format!("{sizes:?} {heads:?} {causal:?} softcap {cap}");
            run(&what, sizes, heads, causal, (None, None), Some(cap), None);
        }
        for (sizes, heads, slopes, name) in &alibi_cases {
            if causal == Causal::BottomRight && sizes.1 > sizes.2 {
                continue; // rows without keys
            }
            let what = format!("{sizes:?} {heads:?} {causal:?} ALiBi {name}");
            let alibi = Some(slopes.clone());
            run(&what, *sizes, *heads, causal, (None, None), None, alibi);
        }
    }
    // Sq > Sk, top-left: rows past Sk see the keys the window leaves them.
    run(
        "Sq > Sk top-left window (50, none)",
        (1, 740, 700),
        (8, 8, 64),
        Causal::TopLeft,
        (Some(50), None),
        None,
        None,
    );
    // A long causal band: 4097 x 4097 with a window of 1000 (partial tiles on both ends).
    run(
        "4097 bottom-right window (1000, 0)",
        (1, 4097, 4097),
        (2, 1, 128),
        Causal::BottomRight,
        (Some(1000), None),
        None,
        None,
    );
    // A window and a softcap together, and with ALiBi, on the d = 128 and d = 64 tiles.
    run(
        "bottom-right window (200, 37) softcap 20",
        (1, 700, 1300),
        (8, 2, 128),
        Causal::BottomRight,
        (Some(200), Some(37)),
        Some(20.0),
        None,
    );
    run(
        "Sq > Sk top-left window (50, none) softcap 5",
        (1, 740, 700),
        (8, 8, 64),
        Causal::TopLeft,
        (Some(50), None),
        Some(5.0),
        None,
    );
    run(
        "bottom-right window (200, 37) softcap 20 ALiBi",
        (1, 700, 1300),
        (8, 2, 128),
        Causal::BottomRight,
        (Some(200), Some(37)),
        Some(20.0),
        Some(geometric(8)),
    );
    run(
        "Sq > Sk top-left window (50, none) softcap 5 ALiBi per sequence",
        (2, 740, 700),
        (8, 8, 64),
        Causal::TopLeft,
        (Some(50), None),
        Some(5.0),
        Some(random_slopes(&mut rng, 16)),
    );
    // A tiny scale (and a tiny cap): slope / scale would overflow in the scores' units, so the
    // kernel adds the bias in exp2 units, which only the slopes then steer.
    for (scale, softcap) in [(1e-36f32, None), (0.125, Some(1e-36))] {
        let mods = Mods {
            alibi: Some(geometric(8)),
            softcap,
            scale: Some(scale),
            ..Mods::default()
        };
        let what = format!("ALiBi, scale {scale:e}, softcap {softcap:?}");
        let hopper = Kernel::CutlassSm90;
        let problem = ((1, 700, 1300), (8, 2, 128), Causal::BottomRight);
        checks.both_dtypes_on(&s, hopper, Some(hopper), &what, problem, mods);
    }
    // Decode under Auto, split over the keys (one query per head, 20k keys): a window of 1000
    // with a softcap (the splits before the band see no key) and ALiBi.
    for (name, mods) in [
        (
            "window 1000 softcap 30",
            Mods {
                softcap: Some(30.0),
                window: (Some(1000), None),
                ..Mods::default()
            },
        ),
        (
            "ALiBi",
            Mods {
                alibi: Some(geometric(32)),
                ..Mods::default()
            },
        ),
    ] {
        let hopper = Kernel::CutlassSm90;
        let (errs, splits) = mods_case_on::<bf16>(
            &s,
            hopper,
            None,
            (1, 1, 20_000),
            (32, 8, 128),
            Causal::BottomRight,
            mods,
        );
        assert!(splits > 1, "a long decode splits its keys ({splits})");
        checks.check(
            format!("bf16 decode 1x20000 {name}, {splits} splits"),
            errs,
            1e-2,
        );
    }
    // Every alibi case under None and TopLeft, all but Sq > Sk under BottomRight.
    let alibi_runs = 3 * alibi_cases.len() - 1;
    assert_eq!(
        checks.count,
        2 * (3 * (windows.len() + caps.len()) + alibi_runs + 8) + 2,
        "every window, softcap and ALiBi case ran"
    );
    assert_none_failed(&checks.failures);

    // Auto chooses the Hopper kernel for a windowed, softcapped or ALiBi call that fills the
    // chip.
    let q = Tensor::full(bf16::ONE, &[4, 2048, 32, 128], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let kv = Tensor::full(bf16::ONE, &[4, 2048, 8, 128], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let causal = AttentionOptions::default().causal(Causal::BottomRight);
    let slopes = AlibiSlopes::geometric(32).unwrap().to_device(&s).unwrap();
    for opts in [
        causal.window(Some(512), None),
        causal.softcap(30.0),
        causal.window(Some(512), None).softcap(30.0),
        causal.alibi(slopes),
    ] {
        let res = attention(&q, &kv, &kv, &opts).unwrap();
        assert_eq!(
            res.execution.backend,
            BackendKind::Kernel(Kernel::CutlassSm90),
            "{opts:?}"
        );
    }
}

/// ALiBi on the GPU (the WMMA kernel's modifier instantiation) against the naive f64 formula:
/// every causal alignment, Sq below, equal to and above Sk, GQA and MQA, both dtypes, head dims
/// 64 / 128 / 256 and 72, shared and per-sequence slopes (the paper's, random, zero, negative
/// and large ones), ALiBi with a softcap and a window, one-query decode split over 20k keys.
/// Variable-length and paged calls match the CPU reference (and a plan runs them); host slopes,
/// slopes of the wrong shape and forced families without ALiBi are refused before any launch.
#[test]
#[ignore = "needs a CUDA device"]
fn alibi_matches_the_reference() {
    use common::Mods;
    let s = stream();
    let mut checks = Checks::new("alibi");
    let geometric = |heads: usize| AlibiSlopes::geometric(heads).unwrap().values().to_vec();
    let mut rng = Rng::fresh();
    // (sizes, heads, slopes, name)
    let cases = [
        ((2, 200, 333), (8, 2, 128), geometric(8), "geometric"),
        (
            (2, 97, 300),
            (6, 1, 256),
            random_slopes(&mut rng, 12),
            "per sequence",
        ),
        (
            (1, 150, 150),
            (4, 4, 64),
            vec![0.0, -0.05, 8.0, 100.0],
            "zero, negative, large",
        ),
        (
            (3, 64, 40),
            (4, 2, 72),
            random_slopes(&mut rng, 4),
            "Sq > Sk",
        ),
    ];
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        for (sizes, heads, slopes, name) in &cases {
            if causal == Causal::BottomRight && sizes.1 > sizes.2 {
                continue; // rows without keys
            }
            let mods = Mods {
                alibi: Some(slopes.clone()),
                ..Mods::default()
            };
            let what = format!("{sizes:?} {heads:?} {causal:?} {name}");
            checks.both_dtypes(&s, &what, (*sizes, *heads, causal), mods);
        }
        let all = Mods {
            softcap: Some(20.0),
            window: (Some(50), Some(10)),
            alibi: Some(geometric(8)),
            ..Mods::default()
        };
        let sizes = match causal {
            Causal::BottomRight => (1, 290, 300),
            _ => (1, 300, 290),
        };
        checks.check(
            format!("f16 {causal:?} ALiBi, softcap and window {sizes:?}"),
            mods_case::<f16>(&s, sizes, (8, 8, 64), causal, all).0,
            2e-3,
        );
    }
    let decode = Mods {
        alibi: Some(geometric(32)),
        ..Mods::default()
    };
    let wmma = Kernel::Wmma;
    let (errs, splits) = mods_case_on::<bf16>(
        &s,
        wmma,
        Some(wmma),
        (1, 1, 20_000),
        (32, 8, 128),
        Causal::BottomRight,
        decode,
    );
    assert!(splits > 1, "a long decode splits its keys ({splits})");
    checks.check(format!("bf16 decode 1x20000, {splits} splits"), errs, 1e-2);
    assert_eq!(checks.count, 26, "every ALiBi case ran");
    assert_none_failed(&checks.failures);

    // Refusals, before any launch.
    let x = Tensor::full(f16::ONE, &[2, 64, 4, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let host_slopes = AlibiSlopes::geometric(4).unwrap();
    let opts = AttentionOptions::default().alibi(host_slopes.clone());
    let err = attention(&x, &x, &x, &opts).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeviceMismatch {
                operand: Operand::AlibiSlopes,
                ..
            }
        ),
        "host slopes on a GPU call: {err}"
    );
    let three = AlibiSlopes::per_sequence(3, vec![0.5; 12]).unwrap();
    let eight = AlibiSlopes::geometric(8).unwrap();
    for (slopes, dim) in [(three, "batch"), (eight, "heads")] {
        let opts = AttentionOptions::default().alibi(slopes.to_device(&s).unwrap());
        let err = attention(&x, &x, &x, &opts).unwrap_err();
        assert!(
            matches!(err, Error::ShapeMismatch { operand: Operand::AlibiSlopes, dim: d, .. } if d == dim),
            "slopes of the wrong {dim}: {err}"
        );
    }
    // CUTLASS example 41 has no ALiBi (the Hopper kernel does:
    // hopper_window_softcap_and_alibi_match_the_reference).
    let device_slopes = host_slopes.to_device(&s).unwrap();
    let opts = AttentionOptions::default()
        .alibi(device_slopes)
        .backend(Backend::Kernel(Kernel::CutlassSm80));
    let err = attention(&x, &x, &x, &opts).unwrap_err();
    assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");

    // Variable-length and paged calls with per-sequence slopes match the CPU reference's.
    modified_batches_match_the_cpu(&s, "ALiBi", |sequences, _, _| {
        let slopes = AlibiSlopes::per_sequence(sequences, random_slopes(&mut rng, 8 * sequences));
        let slopes = slopes.unwrap();
        let opts = AttentionOptions::default().causal(Causal::BottomRight);
        let gpu = opts.alibi(slopes.to_device(&s).unwrap());
        (opts.alibi(slopes).backend(Backend::Cpu), gpu)
    });
}

/// `nb` as a device [`Bias`] on `s`.
fn device_bias(nb: &common::NaiveBias, s: &Stream) -> Bias {
    match nb.dtype {
        DType::F16 => Bias::from(nb.tensor::<f16>().to_device(s).unwrap()),
        DType::BF16 => Bias::from(nb.tensor::<bf16>().to_device(s).unwrap()),
        DType::F32 => Bias::from(nb.tensor::<f32>().to_device(s).unwrap()),
    }
}

/// A random bias of `dims` (values of scale 3, a `masked` fraction -inf) in which query 5 of every
/// sequence and head, where there is one, sees no key.
fn masked_bias(
    rng: &mut Rng,
    dims: [usize; 4],
    dtype: DType,
    layout: Layout,
    masked: f64,
) -> common::NaiveBias {
    let mut nb = common::NaiveBias::random(rng, dims, (3.0, masked), dtype, layout);
    if dims[1] > 5 {
        for (n, x) in nb.values.iter_mut().enumerate() {
            if n / (dims[2] * dims[3]) % dims[1] == 5 {
                *x = f64::NEG_INFINITY;
            }
        }
    }
    nb
}

/// A bias test case: (sizes, heads, bias dims, bias dtype, memory order, -inf fraction).
type BiasCase = (
    (usize, usize, usize),
    (usize, usize, usize),
    [usize; 4],
    DType,
    Layout,
    f64,
);

/// Each of `cases` with its bias alone under `causal`, in both dtypes, on `kernel` (forced where
/// `forced`), the bias made by `bias`; bottom-right cases with more queries than keys are skipped
/// (rows without keys). Returns how many cases ran.
fn bias_cases(
    checks: &mut Checks,
    s: &Stream,
    (kernel, forced): (Kernel, Option<Kernel>),
    causal: Causal,
    cases: &[BiasCase],
    bias: &mut impl FnMut([usize; 4], DType, Layout, f64) -> common::NaiveBias,
) -> usize {
    let mut runs = 0;
    for &(sizes, heads, dims, dtype, layout, masked) in cases {
        if causal == Causal::BottomRight && sizes.1 > sizes.2 {
            continue; // rows without keys
        }
        let mods = common::Mods {
            bias: Some(bias(dims, dtype, layout, masked)),
            ..common::Mods::default()
        };
        let what = format!("{sizes:?} {heads:?} {causal:?} {dims:?} {dtype:?} {layout:?}");
        checks.both_dtypes_on(s, kernel, forced, &what, (sizes, heads, causal), mods);
        runs += 1;
    }
    runs
}

/// An additive bias on the GPU (the WMMA kernel's modifier instantiation) against the naive f64
/// formula: every causal alignment, Sq below, equal to and above Sk, GQA and MQA, both dtypes,
/// head dims 64 / 128 / 256 and 72, f32 / f16 / bf16 biases, full (PyTorch's memory order) and
/// broadcast, -inf masks with whole rows masked (output 0, lse -inf), with ALiBi, a softcap and
/// a window, one-query decode split over 20k keys. Variable-length and paged calls match the
/// CPU reference (a plan runs them, on the kernel Auto picks); a host bias and a forced CUTLASS
/// example 41 (and the Hopper kernel off compute capability 9.0) are refused before any launch.
#[test]
#[ignore = "needs a CUDA device"]
fn bias_matches_the_reference() {
    use common::Mods;
    let s = stream();
    let mut checks = Checks::new("bias");
    let mut rng = Rng::fresh();
    // (sizes, heads, bias dims, bias dtype, layout, -inf fraction)
    let cases = [
        (
            (2, 200, 333),
            (8, 2, 128),
            [2, 200, 8, 333],
            DType::F32,
            Layout::Bhsd,
            0.1,
        ),
        (
            (2, 97, 300),
            (6, 1, 256),
            [1, 97, 1, 300],
            DType::BF16,
            Layout::Bshd,
            0.0,
        ),
        (
            (1, 150, 150),
            (4, 4, 64),
            [1, 1, 4, 150],
            DType::F16,
            Layout::Bhsd,
            0.5,
        ),
        (
            (3, 64, 40),
            (4, 2, 72),
            [3, 64, 4, 40],
            DType::F32,
            Layout::Bshd,
            0.3,
        ),
    ];
    let mut bias = |dims, dtype, layout, masked| masked_bias(&mut rng, dims, dtype, layout, masked);
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        let wmma = (Kernel::Wmma, None);
        bias_cases(&mut checks, &s, wmma, causal, &cases, &mut bias);
        let sizes = match causal {
            Causal::BottomRight => (1, 290, 300),
            _ => (1, 300, 290),
        };
        let all = Mods {
            softcap: Some(20.0),
            window: (Some(50), Some(10)),
            alibi: Some(AlibiSlopes::geometric(8).unwrap().values().to_vec()),
            bias: Some(bias(
                [1, sizes.1, 8, sizes.2],
                DType::BF16,
                Layout::Bhsd,
                0.2,
            )),
            ..Mods::default()
        };
        checks.check(
            format!("f16 {causal:?} bias, ALiBi, softcap and window {sizes:?}"),
            mods_case::<f16>(&s, sizes, (8, 8, 64), causal, all).0,
            2e-3,
        );
    }
    let decode = Mods {
        bias: Some(bias([1, 1, 32, 20_000], DType::F32, Layout::Bhsd, 0.5)),
        ..Mods::default()
    };
    let wmma = Kernel::Wmma;
    let (errs, splits) = mods_case_on::<bf16>(
        &s,
        wmma,
        Some(wmma),
        (1, 1, 20_000),
        (32, 8, 128),
        Causal::BottomRight,
        decode,
    );
    assert!(splits > 1, "a long decode splits its keys ({splits})");
    checks.check(format!("bf16 decode 1x20000, {splits} splits"), errs, 1e-2);
    assert_eq!(checks.count, 26, "every bias case ran");
    assert_none_failed(&checks.failures);

    // Refusals, before any launch.
    let x = Tensor::full(f16::ONE, &[2, 64, 4, 64], Layout::Bshd)
        .unwrap()
        .to_device(&s)
        .unwrap();
    let host = bias([2, 64, 4, 64], DType::F16, Layout::Bshd, 0.0);
    let err = attention(&x, &x, &x, &AttentionOptions::default().bias(host.bias())).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeviceMismatch {
                operand: Operand::Bias,
                ..
            }
        ),
        "a host bias on a GPU call: {err}"
    );
    for kernel in [Kernel::CutlassSm80, Kernel::CutlassSm90] {
        if runs_here(kernel) && kernel == Kernel::CutlassSm90 {
            continue; // hopper_bias_matches_the_reference
        }
        let opts = AttentionOptions::default()
            .bias(device_bias(&host, &s))
            .backend(Backend::Kernel(kernel));
        let err = attention(&x, &x, &x, &opts).unwrap_err();
        assert!(
            matches!(err, Error::BackendUnavailable { .. }),
            "{kernel:?}: {err}"
        );
    }

    // Variable-length and paged calls with a per-sequence bias match the CPU reference's.
    modified_batches_match_the_cpu(&s, "a bias", |sequences, queries, keys| {
        let nb = bias([sequences, queries, 8, keys], DType::F16, Layout::Bhsd, 0.1);
        let opts = AttentionOptions::default().causal(Causal::BottomRight);
        let gpu = opts.bias(device_bias(&nb, &s));
        (opts.bias(nb.bias()).backend(Backend::Cpu), gpu)
    });
}

/// An additive bias on the Hopper kernel (each tile's bias schedule) against the naive f64
/// formula: every tile (d 64, 128, 256 and 72 on the d = 128 tile), every causal alignment, Sq
/// below, equal to and above Sk, GQA and MQA, both dtypes, f16 / bf16 / f32 biases in both
/// memory orders, full and broadcast over batch, rows, heads and keys; keys in pairs (16-bit,
/// even row offsets) and one by one (f32, odd row offsets, a broadcast key axis, the tiles past
/// the last whole one); -inf masks with whole rows masked (output 0, lse -inf); with ALiBi, a
/// softcap and a window; a tiny scale (the bias added in exp2 units); one-query decode split
/// over 20k keys under Auto. Auto runs the Hopper kernel for a biased call that fills the chip.
/// Off compute capability 9.0, or in a build without the `sm90-bias` feature, forcing it is
/// refused; in such a build Auto applies the bias with WMMA on compute capability 9.0 too.
#[test]
#[ignore = "needs a CUDA device"]
fn hopper_bias_matches_the_reference() {
    use common::Mods;
    let s = stream();
    let hopper = Kernel::CutlassSm90;
    let mut rng = Rng::fresh();
    if !runs_here(hopper) || !cfg!(feature = "sm90-bias") {
        let x = Tensor::full(f16::ONE, &[1, 64, 4, 64], Layout::Bshd)
            .unwrap()
            .to_device(&s)
            .unwrap();
        let nb = masked_bias(&mut rng, [1, 64, 4, 64], DType::F16, Layout::Bhsd, 0.0);
        let opts = AttentionOptions::default()
            .bias(device_bias(&nb, &s))
            .backend(Backend::Kernel(hopper));
        let err = attention(&x, &x, &x, &opts).unwrap_err();
        assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
        if runs_here(hopper) {
            assert!(err.to_string().contains("sm90-bias"), "{err}");
            let wmma = BackendKind::Kernel(Kernel::Wmma);
            assert_eq!(auto_biased_backend(&mut rng, &s), wmma);
        }
        return;
    }
    let mut checks = Checks::new("hopper bias");
    // (sizes, heads, bias dims, bias dtype, memory order, -inf fraction)
    let cases = [
        // Pairs, then one by one past key 1280; 6 query blocks.
        (
            (1, 700, 1300),
            (8, 2, 128),
            [1, 700, 8, 1300],
            DType::BF16,
            Layout::Bhsd,
            0.1,
        ),
        // The 192-row tile; rows (dims order) of 4 x 600 keys.
        (
            (2, 600, 600),
            (4, 4, 64),
            [2, 600, 4, 600],
            DType::F16,
            Layout::Bshd,
            0.3,
        ),
        // f32, broadcast over rows; MQA on the d = 256 tile.
        (
            (1, 450, 1000),
            (6, 1, 256),
            [1, 1, 6, 1000],
            DType::F32,
            Layout::Bhsd,
            0.0,
        ),
        // Rows of 517 keys: odd offsets, one by one.
        (
            (1, 517, 517),
            (4, 2, 72),
            [1, 517, 4, 517],
            DType::BF16,
            Layout::Bhsd,
            0.2,
        ),
        // A broadcast key axis (one value per row).
        (
            (2, 300, 333),
            (8, 2, 128),
            [2, 300, 8, 1],
            DType::F16,
            Layout::Bshd,
            0.0,
        ),
        // Sq > Sk.
        (
            (1, 740, 700),
            (8, 8, 64),
            [1, 740, 8, 700],
            DType::F16,
            Layout::Bhsd,
            0.1,
        ),
    ];
    let mut runs = 0;
    let mut bias = |dims, dtype, layout, masked| masked_bias(&mut rng, dims, dtype, layout, masked);
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        runs += bias_cases(
            &mut checks,
            &s,
            (hopper, Some(hopper)),
            causal,
            &cases,
            &mut bias,
        );
    }
    // Every modifier together, on the d = 128 and d = 64 tiles; a tiny scale.
    let geometric = |heads: usize| AlibiSlopes::geometric(heads).unwrap().values().to_vec();
    for (sizes, heads, scale) in [
        ((1, 700, 1300), (8, 2, 128), None),
        ((2, 600, 640), (8, 8, 64), None),
        ((1, 700, 1300), (8, 2, 128), Some(1e-36f32)),
    ] {
        let dims = [sizes.0, sizes.1, heads.0, sizes.2];
        let all = scale.is_none();
        let mods = Mods {
            softcap: all.then_some(20.0),
            window: if all {
                (Some(200), Some(37))
            } else {
                (None, None)
            },
            alibi: all.then(|| geometric(heads.0)),
            bias: Some(masked_bias(&mut rng, dims, DType::BF16, Layout::Bhsd, 0.2)),
            scale,
        };
        let what = format!("{sizes:?} {heads:?} all modifiers {all}, scale {scale:?}");
        let problem = (sizes, heads, Causal::BottomRight);
        checks.both_dtypes_on(&s, hopper, Some(hopper), &what, problem, mods);
        runs += 1;
    }
    // Decode under Auto, split over the keys (one query per head, 20k keys).
    let decode = Mods {
        bias: Some(masked_bias(
            &mut rng,
            [1, 1, 32, 20_000],
            DType::BF16,
            Layout::Bhsd,
            0.5,
        )),
        ..Mods::default()
    };
    let (errs, splits) = mods_case_on::<bf16>(
        &s,
        hopper,
        None,
        (1, 1, 20_000),
        (32, 8, 128),
        Causal::BottomRight,
        decode,
    );
    assert!(splits > 1, "a long decode splits its keys ({splits})");
    checks.check(format!("bf16 decode 1x20000, {splits} splits"), errs, 1e-2);
    assert_eq!(runs, 3 * cases.len() - 1 + 3, "every case ran");
    assert_eq!(checks.count, 2 * runs + 1, "every bias check ran");
    assert_none_failed(&checks.failures);

    // Auto chooses the Hopper kernel for a biased call that fills the chip.
    assert_eq!(
        auto_biased_backend(&mut rng, &s),
        BackendKind::Kernel(hopper)
    );
}

/// The backend Auto runs a biased call on that fills an H200 (4 x 2048 queries, GQA 32:8,
/// d = 128, bf16).
fn auto_biased_backend(rng: &mut Rng, s: &Stream) -> BackendKind {
    let q = Tensor::full(bf16::ONE, &[4, 2048, 32, 128], Layout::Bshd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let kv = Tensor::full(bf16::ONE, &[4, 2048, 8, 128], Layout::Bshd)
        .unwrap()
        .to_device(s)
        .unwrap();
    let nb = masked_bias(rng, [1, 2048, 32, 2048], DType::BF16, Layout::Bhsd, 0.0);
    let opts = AttentionOptions::default().bias(device_bias(&nb, s));
    attention(&q, &kv, &kv, &opts).unwrap().execution.backend
}

/// The checks of one modifier test: each case's (out, lse) errors against its tolerance
/// (lse: 1e-4), printed; the failures are reported together at the end.
struct Checks {
    name: &'static str,
    failures: Vec<String>,
    count: usize,
}

impl Checks {
    fn new(name: &'static str) -> Self {
        Checks {
            name,
            failures: Vec::new(),
            count: 0,
        }
    }

    /// One dense case with score modifiers, in f16 (tolerance 2e-3) and in bf16 (1e-2), under
    /// Auto on the WMMA kernel.
    fn both_dtypes(
        &mut self,
        s: &Stream,
        what: &str,
        case: ((usize, usize, usize), (usize, usize, usize), Causal),
        mods: common::Mods,
    ) {
        self.both_dtypes_on(s, Kernel::Wmma, None, what, case, mods);
    }

    /// [`Checks::both_dtypes`] on `kernel`, forced where `forced`.
    fn both_dtypes_on(
        &mut self,
        s: &Stream,
        kernel: Kernel,
        forced: Option<Kernel>,
        what: &str,
        (sizes, heads, causal): ((usize, usize, usize), (usize, usize, usize), Causal),
        mods: common::Mods,
    ) {
        let f16_errs = mods_case_on::<f16>(s, kernel, forced, sizes, heads, causal, mods.clone());
        self.check(format!("f16 {what}"), f16_errs.0, 2e-3);
        let bf16_errs = mods_case_on::<bf16>(s, kernel, forced, sizes, heads, causal, mods);
        self.check(format!("bf16 {what}"), bf16_errs.0, 1e-2);
    }

    fn check(&mut self, what: String, (err, lse_err): (f64, f64), tol: f64) {
        println!("{} {what}: rel L2 {err:.2e} lse {lse_err:.2e}", self.name);
        self.count += 1;
        if !(err < tol && lse_err < 1e-4) {
            self.failures
                .push(format!("{what}: out {err:.3e}, lse {lse_err:.3e}"));
        }
    }
}

/// A variable-length batch (6 sequences, up to 300 queries and 600 keys, GQA 8:2, d 128, f16;
/// on the kernel Auto picks) and a paged
/// decode-and-prefill (3 sequences of 700 / 33 / 1500 keys in shuffled pages of 16, 5 queries
/// each) with score modifiers on the GPU against the CPU reference; `opts(sequences)` gives
/// (CPU options, GPU options) for a batch of that many sequences, (at most) that many queries
/// and keys. A plan made for the varlen batch runs it bit for bit as the direct call.
fn modified_batches_match_the_cpu(
    s: &Stream,
    what: &str,
    mut opts: impl FnMut(usize, usize, usize) -> (AttentionOptions, AttentionOptions),
) {
    let mut rng = Rng::fresh();
    let (batch, q, k, v) =
        random_varlen::<f16>(&mut rng, 6, (300, 600), (8, 2), 128, true, Layout::Bshd);
    let (cpu, gpu) = opts(6, batch.max_seqlen_q(), batch.max_seqlen_k());
    let want = attention_varlen(&q, &k, &v, &batch, &cpu).unwrap();
    let (qd, kd, vd) = (
        q.to_device(s).unwrap(),
        k.to_device(s).unwrap(),
        v.to_device(s).unwrap(),
    );
    let batch = batch.to_device(s).unwrap();
    let got = attention_varlen(&qd, &kd, &vd, &batch, &gpu).unwrap();
    let err = rel_l2(&logical(&got.out.to_host().unwrap()), &logical(&want.out));
    println!(
        "{what} varlen on {}: rel L2 {err:.2e}",
        got.execution.backend.name()
    );
    // Auto: the dense rule for the longest sequence over the 6 x 8 (sequence, head) pairs
    // (auto_kernel), on the Hopper kernel where it runs and that rule names it, else on WMMA; a
    // bias only in a build with the Hopper bias kernels (feature sm90-bias).
    let device = Device::open(0).unwrap();
    let class = auto_class(&device);
    let (rows, keys) = (batch.max_seqlen_q(), batch.max_seqlen_k());
    let dense = auto_kernel(class, rows, 6 * 8, keys, 128, device.sm_count());
    let hopper = runs_here(Kernel::CutlassSm90)
        && dense == Kernel::CutlassSm90
        && (gpu.bias.is_none() || cfg!(feature = "sm90-bias"));
    let expected = if hopper {
        Kernel::CutlassSm90
    } else {
        Kernel::Wmma
    };
    assert_eq!(
        got.execution.backend,
        BackendKind::Kernel(expected),
        "varlen with {what}"
    );
    assert!(err < 2e-3, "varlen with {what}: {err:.3e}");
    let mut out = got.out.to_host().unwrap().to_device(s).unwrap();
    let plan = AttentionPlan::new_varlen(&qd, &kd, &vd, &batch, &out, None, &gpu).unwrap();
    plan.run(&qd, &kd, &vd, &mut out, None).unwrap();
    let host = |t: &Tensor<f16>| t.to_host().unwrap().host_data().unwrap().to_vec();
    assert_eq!(
        host(&out),
        host(&got.out),
        "a planned varlen run with {what}"
    );

    let (cpu, gpu) = opts(3, 5, 1500);
    let lengths = [700, 33, 1500];
    let (table, num_pages) = random_pages(&mut rng, 16, &lengths, 3);
    let seqlens = lengths.iter().map(|&n| n as i32).collect();
    let pages = PageTable::new(16, table, seqlens).unwrap();
    let cache = |rng: &mut Rng| randn::<f16>(rng, &[num_pages, 16, 2, 128], Layout::Bshd);
    let (kc, vc) = (cache(&mut rng), cache(&mut rng));
    let q = randn::<f16>(&mut rng, &[3, 5, 8, 128], Layout::Bshd);
    let want = attention_paged(&q, &kc, &vc, &pages, &cpu).unwrap();
    let got = attention_paged(
        &q.to_device(s).unwrap(),
        &kc.to_device(s).unwrap(),
        &vc.to_device(s).unwrap(),
        &pages.to_device(s).unwrap(),
        &gpu,
    )
    .unwrap();
    let err = rel_l2(&logical(&got.out.to_host().unwrap()), &logical(&want.out));
    println!("{what} paged: rel L2 {err:.2e}");
    assert!(err < 2e-3, "paged with {what}: {err:.3e}");
}

/// `n` slopes of magnitude about 0.1, a fifth of them negative.
fn random_slopes(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = 0.1 * rng.normal().abs() as f32;
            if i % 5 == 4 {
                -x
            } else {
                x
            }
        })
        .collect()
}

/// One random problem of [`random_problems_match_the_reference`].
#[derive(Debug, Clone)]
struct Drawn {
    bf16: bool,
    /// Shapes, causal mode, layout, logsumexp, a forced class (the tile rows of the A100 or the
    /// L4 instead of this device's own) and the scale; its `backend` is unused.
    case: Case,
    mods: common::Mods,
}

impl Drawn {
    /// A problem of at most 2^29 multiply-adds per product (the f64 reference stays fast):
    /// decode, short and long sequences, Sq above and below Sk, GQA and MQA, every head dim,
    /// both layouts, each score modifier at random, and a fifth of the problems on the tile rows
    /// of compute capability 8.0 or 8.6-8.9.
    fn draw(rng: &mut Rng) -> Drawn {
        let pick = |rng: &mut Rng, xs: &[usize]| xs[rng.below(xs.len())];
        let length = |rng: &mut Rng| match rng.below(10) {
            0..=1 => 1 + rng.below(3),
            2..=5 => 1 + rng.below(128),
            6..=8 => 129 + rng.below(400),
            _ => 529 + rng.below(1100),
        };
        loop {
            let hk = pick(rng, &[1, 1, 2, 4, 8]);
            let hq = hk * pick(rng, &[1, 2, 4, 8]);
            let d = match rng.below(3) {
                0 => pick(rng, &[64, 128, 256]),
                _ => 8 * (1 + rng.below(32)),
            };
            let (b, sq, sk) = (1 + rng.below(3), length(rng), length(rng));
            if b * hq * sq * sk * d > 1 << 29 {
                continue;
            }
            let causal = [Causal::None, Causal::TopLeft, Causal::BottomRight][rng.below(3)];
            let mut mods = common::Mods::default();
            if rng.below(4) == 0 {
                mods.softcap = Some([0.5, 5.0, 30.0][rng.below(3)]);
            }
            if rng.below(4) == 0 {
                let side = |rng: &mut Rng| (rng.below(3) > 0).then(|| rng.below(2 * sk.max(sq)));
                mods.window = (side(rng), side(rng));
            }
            if rng.below(5) == 0 {
                let n = if rng.below(2) == 0 { hq } else { b * hq };
                mods.alibi = Some(random_slopes(rng, n));
            }
            let scale = (rng.below(4) == 0).then(|| [0.03, 0.3, 1.0][rng.below(3)]);
            let layout = [Layout::Bshd, Layout::Bhsd][rng.below(2)];
            let (bf16, lse) = (rng.below(2) == 0, rng.below(2) == 0);
            let force = match rng.below(10) {
                0 => Some(ArchClass::Sm80),
                1 => Some(ArchClass::Sm86Sm89),
                _ => None,
            };
            let case = Case {
                sq,
                sk,
                hk,
                causal,
                layout,
                lse,
                force,
                scale,
                ..case(b, hq, sq, d)
            };
            return Drawn { bf16, case, mods };
        }
    }

    /// Whether a score modifier is set (CUTLASS example 41 applies none). A window side of at
    /// least Sq + Sk bounds nothing and counts as unbounded ([`AttentionOptions::window`]).
    fn modified(&self) -> bool {
        let m = &self.mods;
        let bounds = |side: Option<usize>| side.is_some_and(|w| w < self.case.sq + self.case.sk);
        m.softcap.is_some() || bounds(m.window.0) || bounds(m.window.1) || m.alibi.is_some()
    }

    /// Whether some query sees no key: worked out here from the mask's definition (the causal
    /// diagonal and the window around it), independently of the validator.
    fn has_blind_rows(&self) -> bool {
        let c = &self.case;
        let (sq, sk) = (c.sq as i64, c.sk as i64);
        let off = if c.causal == Causal::TopLeft {
            0
        } else {
            sk - sq
        };
        (0..sq).any(|i| {
            let diagonal = i + off;
            let lo = self.mods.window.0.map_or(0, |l| diagonal - l as i64).max(0);
            let hi = match (c.causal, self.mods.window.1) {
                (Causal::None, Some(r)) => diagonal + r as i64,
                (Causal::None, None) => sk - 1,
                _ => diagonal,
            };
            lo > hi.min(sk - 1)
        })
    }
}

/// How one family answered the problems of a fuzz run.
#[derive(Default)]
struct Tally {
    ran: usize,
    refused: usize,
}

/// [`check_families`] for dense problem `p` against the f64 reference, or, where a query sees
/// no key, `NoVisibleKeys`. CUTLASS example 41 must refuse score modifiers, and the Hopper
/// kernel the tile rows of another class (`BackendUnavailable`).
fn fuzz_one<T: AttentionElement>(s: &Stream, p: &Drawn, fuzz: &mut Fuzz) {
    let c = &p.case;
    let [q, k, v] = case_inputs::<T>(c);
    let (dq, dk, dv) = (
        q.to_device(s).unwrap(),
        k.to_device(s).unwrap(),
        v.to_device(s).unwrap(),
    );
    let expected = if p.has_blind_rows() {
        Expected::Refused(Box::new(|e| matches!(e, Error::NoVisibleKeys { .. })))
    } else {
        let scale = c.scale.map_or(1.0 / (c.d as f64).sqrt(), f64::from);
        let (out, lse) = common::naive_mods(&q, &k, &v, scale, c.causal, p.mods.clone());
        Expected::Values(out, c.lse.then_some(lse))
    };
    let mut opts = modifier_options(s, c.causal, &p.mods, (c.b, c.hq));
    opts.return_lse = c.lse;
    opts.force_arch_class = c.force;
    opts.scale = c.scale;
    let refusal = |k| match k {
        Kernel::CutlassSm80 if p.modified() => Refusal::Must,
        Kernel::CutlassSm90 if c.force.is_some() => Refusal::Must,
        _ => Refusal::Never,
    };
    let what = format!("{p:?}");
    check_families(
        s,
        &what,
        c,
        &expected,
        &opts,
        fuzz,
        refusal,
        |out, lse, opts| attention_into(&dq, &dk, &dv, out, lse, opts),
    );
}

/// The state of one fuzz run: the families under test, and what each did.
struct Fuzz {
    families: Vec<Kernel>,
    /// Auto's first, then one per family.
    tallies: Vec<Tally>,
    failures: Vec<String>,
}

/// A kind of random call that a fuzz test draws and checks.
trait FuzzCall: std::fmt::Debug {
    /// A random call.
    fn random(rng: &mut Rng) -> Self;
    /// Whether its tensors are bf16 (else f16).
    fn bf16(&self) -> bool;
    /// Checks the call in dtype `T` on Auto and every family of `fuzz`, counting and noting
    /// what each did.
    fn check<T: AttentionElement>(&self, s: &Stream, fuzz: &mut Fuzz);
}

/// Implements [`FuzzCall`] for `$call` through its own `draw` and the check `$check`.
macro_rules! fuzz_call {
    ($call:ty, $check:ident) => {
        impl FuzzCall for $call {
            fn random(rng: &mut Rng) -> Self {
                <$call>::draw(rng)
            }
            fn bf16(&self) -> bool {
                self.bf16
            }
            fn check<T: AttentionElement>(&self, s: &Stream, fuzz: &mut Fuzz) {
                $check::<T>(s, self, fuzz)
            }
        }
    };
}
fuzz_call!(Drawn, fuzz_one);
fuzz_call!(DrawnPaged, fuzz_paged_one);
fuzz_call!(DrawnVarlen, fuzz_varlen_one);

/// A fuzz test's generator, call count and seed: `FLASHCORE_FUZZ_CASES` calls (else `default`)
/// from the seed `FLASHCORE_FUZZ_SEED` (else the time), both printed under `name`.
fn fuzz_draws(name: &str, default: u64) -> (Rng, u64, u64) {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = var("FLASHCORE_FUZZ_SEED").unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map_or(1, |t| t.as_nanos() as u64)
    });
    let cases = var("FLASHCORE_FUZZ_CASES").unwrap_or(default);
    println!("{name}: FLASHCORE_FUZZ_SEED={seed} FLASHCORE_FUZZ_CASES={cases}");
    (Rng::seeded(seed), cases, seed)
}

/// Runs a fuzz test of calls `P`: `FLASHCORE_FUZZ_CASES` calls (default 300), each checked on
/// Auto and every family that runs here, from a seed it prints (a time, unless
/// `FLASHCORE_FUZZ_SEED` replays one); then prints what each family did, and fails with every
/// failed call.
fn fuzz_run<P: FuzzCall>(name: &str) {
    let s = stream();
    let (mut rng, cases, seed) = fuzz_draws(name, 300);
    let families: Vec<Kernel> = Kernel::ALL.into_iter().filter(|&k| runs_here(k)).collect();
    let tallies = (0..=families.len()).map(|_| Tally::default()).collect();
    let mut fuzz = Fuzz {
        families,
        tallies,
        failures: Vec::new(),
    };
    for i in 0..cases {
        let before = fuzz.failures.len();
        let call = P::random(&mut rng);
        if call.bf16() {
            call.check::<bf16>(&s, &mut fuzz);
        } else {
            call.check::<f16>(&s, &mut fuzz);
        }
        if fuzz.failures.len() > before {
            println!("{name} case {i} (seed {seed}) failed: {call:?}");
        }
    }
    let names = std::iter::once("auto").chain(fuzz.families.iter().map(|k| k.name()));
    for (family, t) in names.zip(&fuzz.tallies) {
        println!(
            "{name}: {family}: {} ran and matched, {} refused as expected",
            t.ran, t.refused
        );
    }
    assert!(fuzz.tallies[0].ran > 0, "no problem ran on Auto");
    assert!(
        fuzz.failures.is_empty(),
        "{} of the run's calls failed (FLASHCORE_FUZZ_SEED={seed}):\n{}",
        fuzz.failures.len(),
        fuzz.failures.join("\n")
    );
}

/// Differential fuzzing on the GPU: random problems (decode to 1.6k tokens, Sq above and below
/// Sk, GQA and MQA, every head dim, both causal alignments and none, both layouts, the
/// logsumexp, scales, softcaps, windows, ALiBi; [`Drawn::draw`]) on Auto and on every family
/// that runs here, each against the f64 reference ([`fuzz_one`] says what each must do;
/// [`fuzz_run`] the run's size and seed).
#[test]
#[ignore = "needs a CUDA device"]
fn random_problems_match_the_reference() {
    fuzz_run::<Drawn>("fuzz");
}

/// Differential fuzzing of paged caches on the GPU: random calls ([`DrawnPaged::draw`]) on
/// Auto and every family that runs here, against the CPU backend ([`fuzz_paged_one`] says what
/// each must do; [`fuzz_run`] the run's size and seed).
#[test]
#[ignore = "needs a CUDA device"]
fn random_paged_calls_match_the_cpu() {
    fuzz_run::<DrawnPaged>("paged fuzz");
}

/// Differential fuzzing of variable-length batches on the GPU: random batches
/// ([`DrawnVarlen::draw`]) on Auto and every family that runs here, against the CPU backend
/// ([`fuzz_varlen_one`] says what each must do; [`fuzz_run`] the run's size and seed).
#[test]
#[ignore = "needs a CUDA device"]
fn random_varlen_batches_match_the_cpu() {
    fuzz_run::<DrawnVarlen>("varlen fuzz");
}

/// Score modifiers for a batched fuzz call of `heads_q` heads, each at random: a softcap of 20,
/// a window of up to `left` keys before the diagonal (and a quarter of the time up to `right`
/// after it), ALiBi slopes.
fn random_mods(rng: &mut Rng, heads_q: usize, (left, right): (usize, usize)) -> common::Mods {
    let mut mods = common::Mods::default();
    if rng.below(4) == 0 {
        mods.softcap = Some(20.0);
    }
    if rng.below(4) == 0 {
        mods.window = (
            Some(rng.below(left)),
            (rng.below(2) == 0).then(|| rng.below(right)),
        );
    }
    if rng.below(5) == 0 {
        mods.alibi = Some(random_slopes(rng, heads_q));
    }
    mods
}

/// One random paged call of [`random_paged_calls_match_the_cpu`]: Q `[batch, seq_q, heads_q,
/// d]` against each sequence's keys in a shuffled cache of pages of `page` slots.
#[derive(Debug, Clone)]
struct DrawnPaged {
    bf16: bool,
    page: usize,
    lengths: Vec<usize>,
    case: Case,
    mods: common::Mods,
}

impl DrawnPaged {
    /// Decode and chunked prefill over 1 to 8 sequences of 1 to 2000 keys, every page size from
    /// 16 to 256, GQA, head dims, causal modes, layouts and score modifiers at random; at most
    /// 2^28 multiply-adds per product (the CPU oracle stays fast).
    fn draw(rng: &mut Rng) -> DrawnPaged {
        let (lengths, seq_q, hk, hq, d) = loop {
            let lengths: Vec<usize> = (0..1 + rng.below(8)).map(|_| 1 + rng.below(2000)).collect();
            let seq_q = [1, 1 + rng.below(64)][rng.below(2)];
            let hk = [1, 2, 4, 8][rng.below(4)];
            let hq = hk * [1, 4, 8][rng.below(3)];
            let d = [64, 128, 256, 8 * (1 + rng.below(32))][rng.below(4)];
            if lengths.iter().sum::<usize>() * seq_q * hq * d <= 1 << 28 {
                break (lengths, seq_q, hk, hq, d);
            }
        };
        let page = 16 << rng.below(5);
        let mods = random_mods(rng, hq, (600, 8));
        let case = Case {
            sk: *lengths.iter().max().unwrap(),
            hk,
            causal: [Causal::None, Causal::TopLeft, Causal::BottomRight][rng.below(3)],
            layout: [Layout::Bshd, Layout::Bhsd][rng.below(2)],
            lse: rng.below(2) == 0,
            ..case(lengths.len(), hq, seq_q, d)
        };
        let bf16 = rng.below(2) == 0;
        DrawnPaged {
            bf16,
            page,
            lengths,
            case,
            mods,
        }
    }
}

/// What a family may do with a fuzz call besides running it and matching the CPU.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Refusal {
    Never,
    /// Refuse with `BackendUnavailable`, or run and match.
    May,
    /// Refuse with `BackendUnavailable` (a feature or tile rows the family lacks).
    Must,
}

/// What a fuzz call must give: the reference's output and, where asked for, logsumexp (in
/// logical order), or a refusal the predicate accepts.
enum Expected {
    Values(Vec<f64>, Option<Vec<f64>>),
    Refused(Box<dyn Fn(&Error) -> bool>),
}

impl Expected {
    /// The CPU backend's answer to a call, as the GPU must give it.
    fn from_cpu<T: AttentionElement>(
        cpu: flashcore::Result<flashcore::AttentionOutput<T>>,
    ) -> Self {
        match cpu {
            Ok(want) => Expected::Values(logical(&want.out), want.lse.as_ref().map(lse_values)),
            Err(w) => {
                let kind = std::mem::discriminant(&w);
                Expected::Refused(Box::new(move |e| std::mem::discriminant(e) == kind))
            }
        }
    }
}

/// Runs one fuzz call through `call` (the output, the logsumexp, the options) on Auto and every
/// family of `fuzz`, each with NaN-poisoned outputs of `c`'s shape, against `expected`. A family
/// may or must refuse with `BackendUnavailable` as `refusal` says; a refusal must leave the
/// outputs as they were (nothing launched); every other call must match, on the forced family
/// and, where `c` forces a class, on its tile rows.
#[allow(clippy::too_many_arguments)]
fn check_families<T: AttentionElement>(
    s: &Stream,
    what: &str,
    c: &Case,
    expected: &Expected,
    opts: &AttentionOptions,
    fuzz: &mut Fuzz,
    refusal: impl Fn(Kernel) -> Refusal,
    call: impl Fn(
        &mut Tensor<T>,
        Option<&mut Tensor<f32>>,
        &AttentionOptions,
    ) -> flashcore::Result<Execution>,
) {
    let backends = std::iter::once(None).chain(fuzz.families.iter().copied().map(Some));
    for (slot, forced) in backends.enumerate() {
        let name = forced.map_or("auto", Kernel::name);
        let what = format!("{:?} {what} on {name}", T::DTYPE);
        let (mut out, mut lse) = poisoned_outputs::<T>(s, c);
        let opts = forced.map_or(opts.clone(), |k| opts.clone().backend(Backend::Kernel(k)));
        let result = call(&mut out, lse.as_mut(), &opts);
        let got = logical(&out.to_host().unwrap());
        let got_lse = lse.map(|l| lse_values(&l.to_host().unwrap()));
        let untouched =
            got.iter().all(|x| x.is_nan()) && got_lse.iter().flatten().all(|x| x.is_nan());
        let refusal = forced.map_or(Refusal::Never, &refusal);
        let (tally, failures) = (&mut fuzz.tallies[slot], &mut fuzz.failures);
        match (result, expected) {
            (Err(e), Expected::Refused(accepts)) if accepts(&e) => {
                if untouched {
                    tally.refused += 1;
                } else {
                    failures.push(format!("{what}: refused ({e}) but wrote its outputs"));
                }
            }
            (Err(Error::BackendUnavailable { .. }), _)
                if refusal != Refusal::Never && untouched =>
            {
                tally.refused += 1
            }
            (Err(e), _) => failures.push(format!("{what}: {e} (outputs untouched: {untouched})")),
            (Ok(_), Expected::Refused(_)) => {
                failures.push(format!("{what}: ran, but must be refused"))
            }
            (Ok(_), _) if refusal == Refusal::Must => {
                failures.push(format!("{what}: ran, but must refuse"))
            }
            (Ok(exec), Expected::Values(want, want_lse)) => {
                tally.ran += 1;
                let err = rel_l2(&got, want);
                let lse_err = got_lse
                    .zip(want_lse.as_ref())
                    .map_or(0.0, |(g, w)| common::lse_error(&g, w));
                let family = forced.map_or(true, |k| exec.backend == BackendKind::Kernel(k))
                    && c.force
                        .map_or(true, |a| exec.tile.is_some_and(|t| t.arch == a));
                // false for NaN
                if !(err < tolerance::<T>() && lse_err < 1e-4 && family) {
                    failures.push(format!(
                        "{what}: ran {:?}, rel L2 {err:.3e}, lse {lse_err:.3e}",
                        exec.backend
                    ));
                }
            }
        }
    }
}

/// The options of a fuzz call with `mods` for `batch` sequences of `heads_q` heads, for the
/// GPU (ALiBi slopes on `s`'s device) and for the CPU oracle (on the host).
fn fuzz_options(
    s: &Stream,
    c: &Case,
    mods: &common::Mods,
    (batch, heads_q): (usize, usize),
) -> (AttentionOptions, AttentionOptions) {
    let mut opts = modifier_options(s, c.causal, mods, (batch, heads_q));
    opts.return_lse = c.lse;
    let mut cpu = opts.clone();
    cpu.alibi = mods.alibi.clone().map(|a| AlibiSlopes::new(a).unwrap());
    (opts, cpu)
}

/// [`check_families`] for paged call `p`, whose cache's unused slots hold NaN; example 41, which
/// reads no pages, must refuse it.
fn fuzz_paged_one<T: AttentionElement>(s: &Stream, p: &DrawnPaged, fuzz: &mut Fuzz) {
    let mut rng = Rng::fresh();
    let c = &p.case;
    let (table, num_pages) = random_pages(&mut rng, p.page, &p.lengths, 2);
    let seqlens = p.lengths.iter().map(|&n| n as i32).collect();
    let pages = PageTable::new(p.page, table.clone(), seqlens).unwrap();
    let cache = |rng: &mut Rng| {
        let dims = dims(Shape::new(num_pages, p.page, c.hk, c.d), c.layout);
        let t = randn::<T>(rng, &dims, c.layout);
        unused_slots_nan(t, &table, &p.lengths, p.page)
    };
    let (kc, vc) = (cache(&mut rng), cache(&mut rng));
    let q_dims = dims(Shape::new(c.b, c.sq, c.hq, c.d), c.layout);
    let q = randn::<T>(&mut rng, &q_dims, c.layout);
    let (opts, cpu_opts) = fuzz_options(s, c, &p.mods, (c.b, c.hq));
    let expected = Expected::from_cpu(attention_paged(&q, &kc, &vc, &pages, &cpu_opts));
    let (dq, dk, dv) = (
        q.to_device(s).unwrap(),
        kc.to_device(s).unwrap(),
        vc.to_device(s).unwrap(),
    );
    let dpages = pages.to_device(s).unwrap();
    let example41 = |k| match k {
        Kernel::CutlassSm80 => Refusal::Must,
        _ => Refusal::Never,
    };
    let what = format!("paged {p:?}");
    check_families(
        s,
        &what,
        c,
        &expected,
        &opts,
        fuzz,
        example41,
        |out, lse, opts| attention_paged_into(&dq, &dk, &dv, &dpages, out, lse, opts),
    );
}

/// One random variable-length batch of [`random_varlen_batches_match_the_cpu`]: sequences of
/// `lq` queries and `lk` keys, packed (its `case` describes the packed Q: one batch of
/// `sum(lq)` tokens).
#[derive(Debug, Clone)]
struct DrawnVarlen {
    bf16: bool,
    lq: Vec<usize>,
    lk: Vec<usize>,
    case: Case,
    mods: common::Mods,
}

impl DrawnVarlen {
    /// 1 to 12 sequences of 0 to 600 queries (a tenth of them none, a fifth one) and 1 to 1500
    /// keys, GQA, head dims, causal modes, layouts and score modifiers at random; at most 2^28
    /// multiply-adds per product.
    fn draw(rng: &mut Rng) -> DrawnVarlen {
        let (lq, lk, hk, hq, d) = loop {
            let n = 1 + rng.below(12);
            let queries = |rng: &mut Rng| match rng.below(10) {
                0 => 0,
                1..=2 => 1,
                _ => 1 + rng.below(600),
            };
            let lq: Vec<usize> = (0..n).map(|_| queries(rng)).collect();
            let lk: Vec<usize> = (0..n).map(|_| 1 + rng.below(1500)).collect();
            let hk = [1, 2, 4, 8][rng.below(4)];
            let hq = hk * [1, 2, 4][rng.below(3)];
            let d = [64, 128, 256, 8 * (1 + rng.below(32))][rng.below(4)];
            let work: usize = lq.iter().zip(&lk).map(|(q, k)| q * k).sum();
            if work * hq * d <= 1 << 28 {
                break (lq, lk, hk, hq, d);
            }
        };
        let mods = random_mods(rng, hq, (800, 50));
        let tokens = lq.iter().sum();
        let case = Case {
            hk,
            causal: [Causal::None, Causal::TopLeft, Causal::BottomRight][rng.below(3)],
            layout: [Layout::Bshd, Layout::Bhsd][rng.below(2)],
            lse: rng.below(2) == 0,
            ..case(1, hq, tokens, d)
        };
        let bf16 = rng.below(2) == 0;
        DrawnVarlen {
            bf16,
            lq,
            lk,
            case,
            mods,
        }
    }
}

/// [`check_families`] for variable-length batch `p`; example 41 takes such batches but no score
/// modifier, which it may refuse.
fn fuzz_varlen_one<T: AttentionElement>(s: &Stream, p: &DrawnVarlen, fuzz: &mut Fuzz) {
    let mut rng = Rng::fresh();
    let c = &p.case;
    let heads = (c.hq, c.hk);
    let (batch, q, k, v) = varlen_of_lengths::<T>(&mut rng, &p.lq, &p.lk, heads, c.d, c.layout);
    let (opts, cpu_opts) = fuzz_options(s, c, &p.mods, (p.lq.len(), c.hq));
    let expected = Expected::from_cpu(attention_varlen(&q, &k, &v, &batch, &cpu_opts));
    let (dq, dk, dv) = (
        q.to_device(s).unwrap(),
        k.to_device(s).unwrap(),
        v.to_device(s).unwrap(),
    );
    let dbatch = batch.to_device(s).unwrap();
    let m = &p.mods;
    let modified = m.softcap.is_some() || m.window != (None, None) || m.alibi.is_some();
    let refusal = |k| match (k, modified) {
        (Kernel::CutlassSm80, true) => Refusal::May,
        _ => Refusal::Never,
    };
    let what = format!("varlen {p:?}");
    check_families(
        s,
        &what,
        c,
        &expected,
        &opts,
        fuzz,
        refusal,
        |out, lse, opts| attention_varlen_into(&dq, &dk, &dv, &dbatch, out, lse, opts),
    );
}

/// One backward problem of [`backward_matches_the_cpu`]: the forward call's case and modifiers
/// (a bias among them: dims, `[b, sq, hq, sk]` each the call's or 1).
#[derive(Debug)]
struct DrawnBackward {
    bf16: bool,
    /// Force the Hopper kernel where it covers the problem on this GPU (else Auto).
    hopper: bool,
    case: Case,
    mods: common::Mods,
    /// A variable-length batch's query and key lengths (the case is then its packed batch 1).
    lengths: Option<(Vec<usize>, Vec<usize>)>,
}

impl DrawnBackward {
    fn draw(rng: &mut Rng) -> Self {
        let hk = 1 + rng.below(2);
        let (b, sq, sk) = (1 + rng.below(2), 1 + rng.below(300), 1 + rng.below(300));
        let hq = hk * [1, 2, 4][rng.below(3)];
        let d = [64, 128, 256, 8 * (1 + rng.below(32))][rng.below(4)];
        let mut mods = random_mods(rng, hq, (300, 50));
        if rng.below(5) == 0 {
            let dims = [[b, 1][rng.below(2)], sq, [hq, 1][rng.below(2)], sk];
            let layout = [Layout::Bshd, Layout::Bhsd][rng.below(2)];
            let dtype = [DType::F16, DType::BF16, DType::F32][rng.below(3)];
            mods.bias = Some(common::NaiveBias::random(
                rng,
                dims,
                (1.0, 0.1),
                dtype,
                layout,
            ));
        }
        let mut case = Case {
            sq,
            sk,
            hk,
            causal: [Causal::None, Causal::TopLeft, Causal::BottomRight][rng.below(3)],
            layout: [Layout::Bshd, Layout::Bhsd][rng.below(2)],
            // Another class's kernel choice on this GPU: an L4's (the narrow kernel, and the
            // 4-warp row at 256), an A100's.
            force: [None, Some(ArchClass::Sm86Sm89), Some(ArchClass::Sm80)][rng.below(3)],
            ..case(b, hq, sq, d)
        };
        let mut lengths = None;
        if rng.below(3) == 0 {
            let bottom_right = case.causal == Causal::BottomRight;
            let n = 1 + rng.below(4);
            let (lq, lk) = random_lengths(rng, n, 200, 200, bottom_right);
            (case.b, case.sq, case.sk) = (1, lq.iter().sum(), lk.iter().sum());
            mods.bias = None;
            lengths = Some((lq, lk));
        }
        DrawnBackward {
            bf16: rng.below(2) == 0,
            hopper: rng.below(2) == 0,
            case,
            mods,
            lengths,
        }
    }
}

/// The gradients of drawn problem `p` on the GPU (from poisoned outputs) against the CPU
/// backend's, as relative L2 errors of dq, dk, dv; `None` where the CPU refuses the forward call
/// (then the GPU backward must refuse alike).
fn backward_case<T: AttentionElement>(s: &Stream, p: &DrawnBackward) -> Option<[f64; 3]> {
    use flashcore::{attention_backward_into, attention_varlen_backward_into, GradientsMut};
    let c = &p.case;
    let mut rng = Rng::fresh();
    let [q, k, v] = case_inputs::<T>(c);
    let dout = randn::<T>(
        &mut rng,
        &dims(Shape::new(c.b, c.sq, c.hq, c.d), c.layout),
        c.layout,
    );
    let host = p
        .lengths
        .as_ref()
        .map(|(lq, lk)| VarlenBatch::from_lengths(lq, lk).unwrap());
    let device = host.as_ref().map(|b| b.to_device(s).unwrap());
    let sequences = p.lengths.as_ref().map_or(c.b, |(lq, _)| lq.len());
    let (mut opts, mut cpu) = fuzz_options(s, c, &p.mods, (sequences, c.hq));
    opts.return_lse = true;
    opts.force_arch_class = c.force;
    let covered = hopper_backward_covers(p);
    if p.hopper && covered {
        opts.backend = Backend::Kernel(Kernel::CutlassSm90);
    }
    let on_hopper = covered && (p.hopper || hopper_by_auto(c));
    cpu.return_lse = true;
    cpu.bias = p.mods.bias.as_ref().map(|b| b.bias());
    opts.bias = p.mods.bias.as_ref().map(|b| device_bias(b, s));
    // The backward call, dense or over the batch, on these tensors (the GPU's: `device`).
    let backward = |[q, k, v, out, dout]: [&Tensor<T>; 5],
                    lse: &Tensor<f32>,
                    grads: GradientsMut<'_, T>,
                    (batch, opts): (Option<&VarlenBatch>, &AttentionOptions)| {
        let state = AttentionState { out, lse };
        match batch {
            Some(b) => attention_varlen_backward_into(q, k, v, b, state, dout, grads, opts),
            None => attention_backward_into(q, k, v, state, dout, grads, opts),
        }
    };
    let poison = |t: &Tensor<T>| {
        let dims = dims(t.shape(), c.layout);
        Tensor::full(T::from_f64(f64::NAN), &dims, c.layout).unwrap()
    };
    let dev = |t: &Tensor<T>| t.to_device(s).unwrap();
    let forward = match &host {
        Some(b) => attention_varlen(&q, &k, &v, b, &cpu),
        None => attention(&q, &k, &v, &cpu),
    };
    let fwd = match forward {
        Ok(f) => f,
        Err(e) => {
            let inputs = [&q, &k, &v, &dout, &dout].map(dev);
            let [gq, gk, gv] = &mut [&q, &k, &v].map(|t| dev(&poison(t)));
            let lse = Tensor::full(0f32, &[c.b, c.hq, c.sq, 1], Layout::Bhsd).unwrap();
            let grads = GradientsMut {
                dq: gq,
                dk: gk,
                dv: gv,
            };
            let [q_, k_, v_, out_, dout_] = &inputs;
            let lse = lse.to_device(s).unwrap();
            let got = backward(
                [q_, k_, v_, out_, dout_],
                &lse,
                grads,
                (device.as_ref(), &opts),
            );
            let got = got.expect_err("the GPU backward ran a problem the CPU refuses");
            assert_eq!(
                std::mem::discriminant(&got),
                std::mem::discriminant(&e),
                "{p:?}"
            );
            return None;
        }
    };
    let lse = fwd.lse.as_ref().unwrap();
    let [mut wq, mut wk, mut wv] = [&q, &k, &v].map(poison);
    let want = GradientsMut {
        dq: &mut wq,
        dk: &mut wk,
        dv: &mut wv,
    };
    backward(
        [&q, &k, &v, &fwd.out, &dout],
        lse,
        want,
        (host.as_ref(), &cpu),
    )
    .unwrap();
    let inputs = [&q, &k, &v, &fwd.out, &dout].map(dev);
    let [mut gq, mut gk, mut gv] = [&q, &k, &v].map(|t| dev(&poison(t)));
    let grads = GradientsMut {
        dq: &mut gq,
        dk: &mut gk,
        dv: &mut gv,
    };
    let [q_, k_, v_, out_, dout_] = &inputs;
    let lse_ = lse.to_device(s).unwrap();
    let ran = backward(
        [q_, k_, v_, out_, dout_],
        &lse_,
        grads,
        (device.as_ref(), &opts),
    )
    .unwrap_or_else(|e| panic!("{p:?}: {e}"));
    let row = expected_backward_row(c, on_hopper);
    let kernel = match row.kernel {
        BackwardKernel::Hopper => Kernel::CutlassSm90,
        _ => Kernel::Wmma,
    };
    assert_eq!(ran.backend, BackendKind::Kernel(kernel), "{p:?}");
    assert_eq!(ran.backward_tile, Some(row), "{p:?}");
    let got = [&gq, &gk, &gv].map(|t| logical(&t.to_host().unwrap()));
    let want = [&wq, &wk, &wv].map(|t| logical(t));
    Some([0, 1, 2].map(|i| gradient_error(&got[i], &want[i])))
}

/// Whether the Hopper backward kernel covers drawn problem `p` on device 0: it runs here, no
/// other class is forced, and the call is a dense batch without a softcap, ALiBi or bias, at
/// head dims up to 128 (validation gives multiples of 8 and aligned strides).
fn hopper_backward_covers(p: &DrawnBackward) -> bool {
    runs_here(Kernel::CutlassSm90)
        && p.case.force.map_or(true, |f| f == ArchClass::Sm90)
        && p.lengths.is_none()
        && p.mods.softcap.is_none()
        && p.mods.alibi.is_none()
        && p.mods.bias.is_none()
        && p.case.d <= 128
}

/// Whether Auto takes the Hopper backward kernel for case `c` where it covers it: a grid
/// (128-key blocks x batch x kv heads) of a block per SM at least.
fn hopper_by_auto(c: &Case) -> bool {
    let sms = Device::open(0).unwrap().sm_count();
    c.sk.div_ceil(128) * c.b * c.hk >= sms
}

/// The row of the backward tile table that case `c` should run on device 0: the first of its
/// head dim's tier that takes it (a Hopper row where `hopper`) and whose shared memory fits the
/// device and the forced class.
fn expected_backward_row(c: &Case, hopper: bool) -> flashcore::plan::BackwardTileRow {
    let device = Device::open(0).unwrap();
    let budget = c
        .force
        .map_or(device.shared_memory_per_block_optin(), |class| {
            class
                .smem_per_block_optin()
                .min(device.shared_memory_per_block_optin())
        });
    let tier = [64, 128, 256]
        .into_iter()
        .find(|&t| c.d <= t as usize)
        .unwrap();
    *flashcore::plan::backward_tile_table()
        .iter()
        .find(|r| {
            r.max_head_dim == tier
                && r.smem_bytes <= budget
                && (r.kernel == BackwardKernel::Hopper) == hopper
        })
        .expect("a row fits")
}

/// ||got - want|| relative to ||want||, or to an RMS of 0.1 per element where the gradient is
/// smaller: a gradient that cancels to (nearly) 0, as dQ and dK do where a row sees one key
/// (dS = P (dP - D) with P = 1 and dP = D), has only rounding left. Infinite when `got` holds a
/// value that is not finite.
fn gradient_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    if want.is_empty() {
        return 0.0; // an empty gradient (a batch without queries has an empty dq)
    }
    if got.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let norm = |x: &mut dyn Iterator<Item = f64>| x.map(|e| e * e).sum::<f64>().sqrt();
    let diff = norm(&mut got.iter().zip(want).map(|(a, b)| a - b));
    let floor = 0.1 * (want.len() as f64).sqrt();
    diff / norm(&mut want.iter().copied()).max(floor)
}

/// The GPU backward pass against the CPU backend's f64 gradients on random problems: GQA and
/// MQA, head dims 8 to 256, lengths 1 to 300 both ways, variable-length batches of 1 to 4
/// sequences of 0 to 200 queries, causal modes, layouts, softcaps, windows, ALiBi, biases; a
/// third of the problems each with an L4's or an A100's kernel choice forced (on an H200 the
/// narrow kernel and the other rows at 256), half of those the Hopper kernel covers on it
/// (an H100 / H200) forced there (`FLASHCORE_FUZZ_CASES`, `FLASHCORE_FUZZ_SEED` as the fuzz
/// tests).
#[test]
#[ignore = "needs a CUDA device"]
fn backward_matches_the_cpu() {
    let s = stream();
    let (mut rng, cases, _) = fuzz_draws("backward", 60);
    let (mut ran, mut worst) = (0, [[0f64; 3]; 2]);
    let mut failures = Vec::new();
    for _ in 0..cases {
        let p = DrawnBackward::draw(&mut rng);
        let errors = if p.bf16 {
            backward_case::<bf16>(&s, &p)
        } else {
            backward_case::<f16>(&s, &p)
        };
        let Some(errors) = errors else { continue };
        ran += 1;
        // Measured on the H200: see docs/PERFORMANCE.md (session 65).
        let tol = if p.bf16 { 2e-2 } else { 4e-3 };
        let w = &mut worst[usize::from(p.bf16)];
        for (w, e) in w.iter_mut().zip(errors) {
            *w = w.max(e);
        }
        if errors.iter().any(|e| e.is_nan() || *e >= tol) {
            failures.push(format!("{p:?}: {errors:?}"));
        }
    }
    println!("backward: {ran} of {cases} ran (the others refused as the CPU did); worst (dq, dk, dv): f16 {:?}, bf16 {:?}", worst[0], worst[1]);
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The GPU backward pass refuses what it does not take, after validation and without writing
/// the gradients: example 41 forced, the Hopper kernel forced off an H100 / H200, with another
/// class's choice or at head dim 256, a device batch with a sequence that sees no key (checked
/// against the offsets' host copies); head dim 256 runs on this GPU's row and an L4's; Auto and
/// Wmma run the WMMA rows, CutlassSm90 the Hopper one on an H100 / H200; and a problem without
/// queries zeroes dK and dV.
#[test]
#[ignore = "needs a CUDA device"]
fn backward_refusals_and_empty_problems() {
    use flashcore::attention_varlen_backward_into;
    use flashcore::{attention_backward, attention_backward_into, GradientsMut};
    let s = stream();
    let mut rng = Rng::fresh();
    let dev = |t: Tensor<f16>| t.to_device(&s).unwrap();
    let dev32 = |t: Tensor<f32>| t.to_device(&s).unwrap();
    // Refused: example 41 forced; the Hopper kernel forced where it does not run or cover the
    // call. Run: head dim 256, on this GPU's row and an L4's; the rest.
    let hopper = runs_here(Kernel::CutlassSm90);
    let sm90 = Backend::Kernel(Kernel::CutlassSm90);
    let cases = [
        (64, Backend::Kernel(Kernel::CutlassSm80), None, true),
        (64, sm90, None, !hopper),
        (128, sm90, Some(ArchClass::Sm86Sm89), true),
        (256, sm90, None, true),
        (128, Backend::Kernel(Kernel::Wmma), None, false),
        (128, Backend::Auto, None, false),
        (256, Backend::Auto, None, false),
        (256, Backend::Auto, Some(ArchClass::Sm86Sm89), false),
    ];
    for (d, backend, force, refused) in cases {
        let q = dev(randn::<f16>(&mut rng, &[1, 16, 4, d], Layout::Bshd));
        let out = dev(randn::<f16>(&mut rng, &[1, 16, 4, d], Layout::Bshd));
        let kv = dev(randn::<f16>(&mut rng, &[1, 16, 2, d], Layout::Bshd));
        let lse = dev32(Tensor::full(0f32, &[1, 4, 16, 1], Layout::Bhsd).unwrap());
        let state = AttentionState {
            out: &out,
            lse: &lse,
        };
        let poison = |dims: &[usize]| dev(Tensor::full(f16::NAN, dims, Layout::Bshd).unwrap());
        let (mut dq, mut dk, mut dv) = (
            poison(&[1, 16, 4, d]),
            poison(&[1, 16, 2, d]),
            poison(&[1, 16, 2, d]),
        );
        let mut wrong = poison(&[1, 16, 4, d]);
        let opts = AttentionOptions {
            force_arch_class: force,
            ..AttentionOptions::default().backend(backend)
        };
        let grads = GradientsMut {
            dq: &mut dq,
            dk: &mut wrong,
            dv: &mut dv,
        };
        let e = attention_backward_into(&q, &kv, &kv, state, &q, grads, &opts).unwrap_err();
        assert!(
            matches!(
                e,
                Error::ShapeMismatch {
                    operand: Operand::DK,
                    ..
                }
            ),
            "{e:?}"
        );
        let grads = GradientsMut {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        let got = attention_backward_into(&q, &kv, &kv, state, &q, grads, &opts);
        if refused {
            let e = got.unwrap_err();
            assert!(
                matches!(e, Error::BackendUnavailable { .. }),
                "{d} {backend:?}: {e:?}"
            );
            for t in [&dq, &dk, &dv] {
                assert!(
                    logical(&t.to_host().unwrap()).iter().all(|x| x.is_nan()),
                    "written"
                );
            }
        } else {
            let ran = got.unwrap();
            let on_hopper = backend == sm90;
            let (kernel, row) = if on_hopper {
                (Kernel::CutlassSm90, BackwardKernel::Hopper)
            } else {
                (Kernel::Wmma, ran.backward_tile.unwrap().kernel)
            };
            assert_eq!(ran.backend, BackendKind::Kernel(kernel), "{d} {backend:?}");
            assert_eq!(
                ran.backward_tile.map(|r| (r.max_head_dim, r.kernel)),
                Some((d as u32, row))
            );
            assert_ne!(on_hopper, row != BackwardKernel::Hopper, "{d} {backend:?}");
        }
    }
    // Auto on a covered call whose grid fills the GPU: the Hopper kernel on an H100 / H200
    // (else WMMA), its gradients those of WMMA forced.
    let sms = Device::open(0).unwrap().sm_count();
    let heads = sms.div_ceil(8); // 8 key blocks of 1024 keys per head
    let [q, k, v, dout] =
        [0; 4].map(|_| dev(randn::<f16>(&mut rng, &[1, 1024, heads, 128], Layout::Bshd)));
    let forward = AttentionOptions::default()
        .causal(Causal::TopLeft)
        .with_lse();
    let fwd = attention(&q, &k, &v, &forward).unwrap();
    let state = AttentionState {
        out: &fwd.out,
        lse: fwd.lse.as_ref().unwrap(),
    };
    let mut grads = Vec::new();
    for backend in [Backend::Auto, Backend::Kernel(Kernel::Wmma)] {
        let ran = attention_backward(&q, &k, &v, state, &dout, &forward.clone().backend(backend))
            .unwrap();
        let hopper = backend == Backend::Auto && runs_here(Kernel::CutlassSm90);
        let kernel = if hopper {
            Kernel::CutlassSm90
        } else {
            Kernel::Wmma
        };
        assert_eq!(
            ran.execution.backend,
            BackendKind::Kernel(kernel),
            "{backend:?}"
        );
        let row = ran.execution.backward_tile.expect("a row");
        assert_eq!(row.kernel == BackwardKernel::Hopper, hopper, "{row:?}");
        grads.push([ran.dq, ran.dk, ran.dv].map(|t| logical(&t.to_host().unwrap())));
    }
    for (got, want) in grads[0].iter().zip(&grads[1]) {
        let err = rel_l2(got, want);
        assert!(err < 2e-3, "Auto against WMMA: rel L2 {err}");
    }
    // No queries: dK and dV are zero (the CPU backend does the same).
    let q = dev(Tensor::full(f16::ZERO, &[2, 0, 4, 64], Layout::Bshd).unwrap());
    let out = dev(Tensor::full(f16::ZERO, &[2, 0, 4, 64], Layout::Bshd).unwrap());
    let kv = dev(randn::<f16>(&mut rng, &[2, 40, 2, 64], Layout::Bshd));
    let lse = dev32(Tensor::full(0f32, &[2, 4, 0, 1], Layout::Bhsd).unwrap());
    let state = AttentionState {
        out: &out,
        lse: &lse,
    };
    let grads = attention_backward(&q, &kv, &kv, state, &q, &AttentionOptions::default()).unwrap();
    for t in [&grads.dk, &grads.dv] {
        assert!(logical(&t.to_host().unwrap()).iter().all(|x| *x == 0.0));
    }
    // A device batch whose second sequence has queries but no key: refused from the offsets'
    // host copies, as the CPU backend refuses it, and nothing written.
    let batch = VarlenBatch::from_lengths(&[3, 2], &[5, 0]).unwrap();
    let batch = batch.to_device(&s).unwrap();
    let [q, out] = [0; 2].map(|_| dev(randn::<f16>(&mut rng, &[1, 5, 4, 64], Layout::Bshd)));
    let kv = dev(randn::<f16>(&mut rng, &[1, 5, 2, 64], Layout::Bshd));
    let lse = dev32(Tensor::full(0f32, &[1, 4, 5, 1], Layout::Bhsd).unwrap());
    let state = AttentionState {
        out: &out,
        lse: &lse,
    };
    let poison = |dims: &[usize]| dev(Tensor::full(f16::NAN, dims, Layout::Bshd).unwrap());
    let (mut dq, mut dk, mut dv) = (
        poison(&[1, 5, 4, 64]),
        poison(&[1, 5, 2, 64]),
        poison(&[1, 5, 2, 64]),
    );
    let grads = GradientsMut {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    let opts = AttentionOptions::default();
    let e = attention_varlen_backward_into(&q, &kv, &kv, &batch, state, &q, grads, &opts);
    let e = e.unwrap_err();
    assert!(matches!(e, Error::NoVisibleKeys { .. }), "{e:?}");
    for t in [&dq, &dk, &dv] {
        let host = logical(&t.to_host().unwrap());
        assert!(host.iter().all(|x| x.is_nan()), "written");
    }
}

/// The backward pass recorded into a CUDA graph, dense (GQA 4:1; on the WMMA rows and, on an
/// H100 / H200, the Hopper one) and over a variable-length batch (with a sequence without
/// queries): recording runs nothing, and each launch computes
/// the gradients of the tensors' contents at that launch (fresh inputs, forward state and
/// NaN-poisoned gradients before the second), against the CPU backend's. An operand on another
/// stream, or a host operand, is refused and records nothing.
#[test]
#[ignore = "needs a CUDA device"]
fn backward_in_a_cuda_graph() {
    use flashcore::{attention_backward, attention_varlen_backward, GradientsMut};
    let s = stream();
    let mut rng = Rng::fresh();
    let (hq, hk, d) = (8, 2, 128);
    let opts = AttentionOptions::default()
        .causal(Causal::BottomRight)
        .with_lse();
    // Dense on the WMMA rows and, on an H100 / H200, the Hopper one; over the batch on WMMA.
    let hopper = Backend::Kernel(Kernel::CutlassSm90);
    let runs = [(false, Backend::Auto), (true, Backend::Auto)]
        .into_iter()
        .chain(runs_here(Kernel::CutlassSm90).then_some((false, hopper)));
    for (varlen, backend) in runs {
        let gpu_opts = opts.clone().backend(backend);
        let host_batch = VarlenBatch::from_lengths(&[37, 0, 130], &[64, 20, 200]).unwrap();
        let batch = varlen.then(|| host_batch.to_device(&s).unwrap());
        let (sq, sk, b) = if varlen { (167, 284, 1) } else { (100, 150, 2) };
        let (qd, kd) = ([b, sq, hq, d], [b, sk, hk, d]);
        // Fresh inputs, and the CPU backend's forward state and gradients.
        let draw = |rng: &mut Rng| {
            let [q, dout] = [0; 2].map(|_| randn::<f16>(rng, &qd, Layout::Bshd));
            let [k, v] = [0; 2].map(|_| randn::<f16>(rng, &kd, Layout::Bshd));
            let fwd = match varlen {
                true => attention_varlen(&q, &k, &v, &host_batch, &opts).unwrap(),
                false => attention(&q, &k, &v, &opts).unwrap(),
            };
            let lse = fwd.lse.unwrap();
            let state = AttentionState {
                out: &fwd.out,
                lse: &lse,
            };
            let want = match varlen {
                true => attention_varlen_backward(&q, &k, &v, &host_batch, state, &dout, &opts),
                false => attention_backward(&q, &k, &v, state, &dout, &opts),
            };
            let want = want.unwrap();
            ([q, k, v, fwd.out, dout], lse, [want.dq, want.dk, want.dv])
        };
        let (inputs, lse_host, mut want) = draw(&mut rng);
        let dev = |t: &Tensor<f16>| t.to_device(&s).unwrap();
        let [mut q, mut k, mut v, mut out, mut dout] = inputs.each_ref().map(dev);
        let mut lse = lse_host.to_device(&s).unwrap();
        let nan = |dims: &[usize]| Tensor::full(f16::NAN, dims, Layout::Bshd).unwrap();
        let [mut dq, mut dk, mut dv] = [nan(&qd), nan(&kd), nan(&kd)].each_ref().map(dev);
        let state = AttentionState {
            out: &out,
            lse: &lse,
        };
        let mut capture = Capture::begin(&s).unwrap();
        let mut record = |capture: &mut Capture, dout: &Tensor<f16>, q: &Tensor<f16>| {
            let grads = GradientsMut {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            };
            match &batch {
                Some(b) => capture.varlen_backward(q, &k, &v, b, state, dout, grads, &gpu_opts),
                None => capture.backward(q, &k, &v, state, dout, grads, &gpu_opts),
            }
        };
        // Refused, recording nothing: dout on another stream, q on the host.
        let other = Stream::new(s.device()).unwrap();
        let dout_other = inputs[4].to_device(&other).unwrap();
        other.synchronize().unwrap();
        let e = record(&mut capture, &dout_other, &q).unwrap_err();
        assert_eq!(
            e,
            Error::GraphStream {
                operand: Operand::DOut
            }
        );
        let e = record(&mut capture, &dout, &inputs[0]).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e:?}");
        assert_eq!(capture.calls(), 0);
        let ran = record(&mut capture, &dout, &q).unwrap();
        let (kernel, on_hopper) = match backend {
            Backend::Auto => (Kernel::Wmma, false),
            _ => (Kernel::CutlassSm90, true),
        };
        assert_eq!(ran.backend, BackendKind::Kernel(kernel));
        let row = ran.backward_tile.expect("the recorded row");
        assert_eq!(row.kernel == BackwardKernel::Hopper, on_hopper, "{row:?}");
        assert_eq!(capture.calls(), 1);
        let graph = capture.finish().unwrap();
        let is_nan = |t: &Tensor<f16>| logical(&t.to_host().unwrap()).iter().all(|x| x.is_nan());
        assert!(
            is_nan(&dq) && is_nan(&dk) && is_nan(&dv),
            "recording ran nothing"
        );
        for launch in 0..2 {
            if launch == 1 {
                let (inputs, lse_host, fresh) = draw(&mut rng);
                for (dst, src) in [&mut q, &mut k, &mut v, &mut out, &mut dout]
                    .into_iter()
                    .zip(&inputs)
                {
                    dst.copy_from(src).unwrap();
                }
                lse.copy_from(&lse_host).unwrap();
                for (t, dims) in [(&mut dq, qd), (&mut dk, kd), (&mut dv, kd)] {
                    t.copy_from(&nan(&dims)).unwrap();
                }
                want = fresh;
            }
            graph.launch().unwrap();
            for (got, want) in [&dq, &dk, &dv].into_iter().zip(&want) {
                let err = rel_l2(&logical(&got.to_host().unwrap()), &logical(want));
                assert!(
                    err < 2e-3,
                    "varlen {varlen}, {backend:?}, launch {launch}: rel L2 {err}"
                );
            }
        }
    }
}
