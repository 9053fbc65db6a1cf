//! CPU suite (runs in CI): the reference against the naive formula, every validation error, the
//! tile table, and device discovery without a GPU.

mod common;

use common::{dims, logical, lse_values, naive, randn, rel_l2, Rng};
use flashcore::plan::{
    auto_kernel, choose_row, decode_table, kv_splits, select_row, tile_table, ArchClass, Kernel,
};
use flashcore::{
    attention, attention_into, attention_varlen, AlibiSlopes, AttentionOptions, BackendKind,
    Causal, Error, Layout, Operand, Shape, Tensor, VarlenBatch,
};
use half::{bf16, f16};

fn check_reference<T: flashcore::AttentionElement>(
    q_shape: Shape,
    kv: (usize, usize),
    causal: Causal,
    layout: Layout,
) {
    let mut rng = Rng::fresh();
    let k_shape = Shape::new(q_shape.batch, kv.0, kv.1, q_shape.head_dim);
    let q = randn::<T>(&mut rng, &dims(q_shape, layout), layout);
    let k = randn::<T>(&mut rng, &dims(k_shape, layout), layout);
    let v = randn::<T>(&mut rng, &dims(k_shape, layout), layout);
    let opts = AttentionOptions::default().causal(causal).with_lse();
    let res = attention(&q, &k, &v, &opts).unwrap();
    assert_eq!(res.execution.backend, BackendKind::Cpu);
    let scale = 1.0 / (q_shape.head_dim as f64).sqrt();
    let (want, want_lse) = naive(&q, &k, &v, scale, causal);
    // The reference accumulates in f64 and rounds once to T.
    let tol = if std::mem::size_of::<T>() == 2 && T::DTYPE == flashcore::DType::BF16 {
        4e-3
    } else {
        5e-4
    };
    let err = rel_l2(&logical(&res.out), &want);
    assert!(
        err < tol,
        "{q_shape:?} {kv:?} {causal:?} {layout:?}: rel L2 {err}"
    );
    let lse_err = rel_l2(&lse_values(res.lse.as_ref().unwrap()), &want_lse);
    assert!(lse_err < 1e-6, "lse rel L2 {lse_err}");
}

#[test]
fn reference_matches_naive_formula() {
    for layout in [Layout::Bshd, Layout::Bhsd] {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            check_reference::<f16>(Shape::new(2, 9, 4, 16), (9, 4), causal, layout);
            check_reference::<bf16>(Shape::new(1, 7, 4, 8), (13, 2), causal, layout); // GQA 2:1
            check_reference::<f16>(Shape::new(1, 5, 3, 24), (11, 1), causal, layout);
            // MQA
        }
        check_reference::<f16>(Shape::new(1, 13, 2, 32), (6, 2), Causal::TopLeft, layout);
    }
}

#[test]
fn reference_is_softmax_weighted_mean_of_values() {
    // With all-equal scores the output is the mean of the visible values, whatever q and k are.
    let q = Tensor::full(f16::ZERO, &[1, 3, 1, 8], Layout::Bshd).unwrap();
    let k = Tensor::full(f16::ONE, &[1, 3, 1, 8], Layout::Bshd).unwrap();
    let vals: Vec<f16> = (0..3)
        .flat_map(|j| [f16::from_f32(j as f32 * 3.0); 8])
        .collect();
    let v = Tensor::from_vec(vals, &[1, 3, 1, 8], Layout::Bshd).unwrap();
    let res = attention(
        &q,
        &k,
        &v,
        &AttentionOptions::default().causal(Causal::TopLeft),
    )
    .unwrap();
    let got: Vec<f32> = (0..3)
        .map(|i| res.out.get(0, i, 0, 5).unwrap().to_f32())
        .collect();
    assert_eq!(got, vec![0.0, 1.5, 3.0]);
}

fn host(dims: &[usize]) -> Tensor<f16> {
    Tensor::full(f16::ONE, dims, Layout::Bshd).unwrap()
}

fn run(q: &Tensor<f16>, k: &Tensor<f16>, v: &Tensor<f16>, opts: AttentionOptions) -> Error {
    match attention(q, k, v, &opts) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn rank_and_storage_errors() {
    let r = Tensor::from_vec(vec![f16::ZERO; 8], &[1, 8], Layout::Bshd);
    assert!(matches!(
        r,
        Err(Error::Rank {
            expected: 4,
            got: 2
        })
    ));
    let r = Tensor::from_vec(vec![f16::ZERO; 7], &[1, 1, 1, 8], Layout::Bshd);
    assert!(matches!(
        r,
        Err(Error::StorageTooSmall { len: 7, needed: 8 })
    ));
    let huge = usize::MAX / 2;
    let r = Tensor::<f16>::full(f16::ZERO, &[huge, huge, 1, 8], Layout::Bshd);
    assert!(matches!(r, Err(Error::SizeOverflow { .. })), "{r:?}");
    let r = Tensor::from_vec_strided(vec![f16::ZERO; 8], Shape::new(3, 1, 1, 8), [huge, 8, 8, 1]);
    assert!(matches!(r, Err(Error::SizeOverflow { .. })));
}

#[test]
fn shape_errors() {
    let q = host(&[2, 4, 4, 8]);
    let e = run(
        &q,
        &host(&[1, 4, 4, 8]),
        &host(&[1, 4, 4, 8]),
        Default::default(),
    );
    assert!(matches!(
        e,
        Error::ShapeMismatch {
            operand: Operand::K,
            dim: "batch",
            ..
        }
    ));
    let e = run(
        &q,
        &host(&[2, 4, 4, 16]),
        &host(&[2, 4, 4, 16]),
        Default::default(),
    );
    assert!(matches!(
        e,
        Error::ShapeMismatch {
            operand: Operand::K,
            dim: "head_dim",
            ..
        }
    ));
    let e = run(
        &q,
        &host(&[2, 4, 4, 8]),
        &host(&[2, 5, 4, 8]),
        Default::default(),
    );
    assert!(matches!(
        e,
        Error::ShapeMismatch {
            operand: Operand::V,
            dim: "seq",
            ..
        }
    ));
    let e = run(
        &q,
        &host(&[2, 4, 3, 8]),
        &host(&[2, 4, 3, 8]),
        Default::default(),
    );
    assert!(matches!(
        e,
        Error::HeadsNotDivisible {
            q_heads: 4,
            kv_heads: 3
        }
    ));
    let e = run(
        &q,
        &host(&[2, 4, 0, 8]),
        &host(&[2, 4, 0, 8]),
        Default::default(),
    );
    assert!(matches!(
        e,
        Error::HeadsNotDivisible {
            q_heads: 4,
            kv_heads: 0
        }
    ));
    let mut out = host(&[2, 4, 4, 16]);
    let e = attention_into(&q, &q, &q, &mut out, None, &Default::default()).unwrap_err();
    assert!(matches!(
        e,
        Error::ShapeMismatch {
            operand: Operand::Out,
            dim: "head_dim",
            ..
        }
    ));
}

#[test]
fn head_dim_errors() {
    for d in [0, 4, 12, 100, 264, 512] {
        let t = host(&[1, 2, 1, d]);
        assert_eq!(
            run(&t, &t, &t, Default::default()),
            Error::UnsupportedHeadDim(d)
        );
    }
    for d in (8..=256).step_by(8) {
        let t = host(&[1, 2, 1, d]);
        assert!(attention(&t, &t, &t, &Default::default()).is_ok(), "d={d}");
    }
}

#[test]
fn stride_errors() {
    let shape = Shape::new(1, 4, 2, 8);
    // Head dim not contiguous.
    let t = Tensor::from_vec_strided(vec![f16::ONE; 256], shape, [128, 32, 16, 2]).unwrap();
    let ok = host(&[1, 4, 2, 8]);
    let e = run(&t, &ok, &ok, Default::default());
    assert_eq!(
        e,
        Error::NonContiguousHeadDim {
            operand: Operand::Q,
            stride: 2
        }
    );
    // A seq stride that is not a multiple of 8 elements (16 bytes).
    let t = Tensor::from_vec_strided(vec![f16::ONE; 256], shape, [128, 20, 8, 1]).unwrap();
    let e = run(&ok, &t, &ok, Default::default());
    assert_eq!(
        e,
        Error::MisalignedStride {
            operand: Operand::K,
            dim: "seq",
            stride: 20
        }
    );
    // Padded (but aligned) strides are fine, and give the same result as dense ones.
    let mut rng = Rng::fresh();
    let dense = randn::<f16>(&mut rng, &[1, 4, 2, 8], Layout::Bshd);
    let mut padded = vec![f16::NAN; 4 * 48];
    for i in 0..4 {
        for h in 0..2 {
            for x in 0..8 {
                padded[i * 48 + h * 16 + x] = dense.get(0, i, h, x).unwrap();
            }
        }
    }
    let padded = Tensor::from_vec_strided(padded, shape, [192, 48, 16, 1]).unwrap();
    let a = attention(&padded, &padded, &padded, &Default::default()).unwrap();
    let b = attention(&dense, &dense, &dense, &Default::default()).unwrap();
    assert_eq!(logical(&a.out), logical(&b.out));
}

#[test]
fn lse_layout_error() {
    let q = host(&[1, 4, 2, 8]);
    let mut out = host(&[1, 4, 2, 8]);
    let mut lse = Tensor::full(0f32, &[1, 4, 2, 1], Layout::Bshd).unwrap(); // BSHD, not BHSD
    let e = attention_into(&q, &q, &q, &mut out, Some(&mut lse), &Default::default());
    assert_eq!(
        e.unwrap_err(),
        Error::LseLayout {
            operand: Operand::Lse
        }
    );
    let mut lse = Tensor::full(0f32, &[1, 3, 4, 1], Layout::Bhsd).unwrap(); // wrong heads
    let e = attention_into(&q, &q, &q, &mut out, Some(&mut lse), &Default::default());
    assert!(matches!(
        e.unwrap_err(),
        Error::ShapeMismatch {
            operand: Operand::Lse,
            ..
        }
    ));
}

#[test]
fn rows_without_keys_are_refused() {
    let q = host(&[1, 4, 1, 8]);
    let empty = host(&[1, 0, 1, 8]);
    let e = run(&q, &empty, &empty, Default::default());
    assert_eq!(
        e,
        Error::NoVisibleKeys {
            rows: 4,
            seq_q: 4,
            seq_k: 0
        }
    );
    let kv = host(&[1, 3, 1, 8]);
    let e = run(
        &q,
        &kv,
        &kv,
        AttentionOptions::default().causal(Causal::BottomRight),
    );
    assert_eq!(
        e,
        Error::NoVisibleKeys {
            rows: 1,
            seq_q: 4,
            seq_k: 3
        }
    );
    // Top-left with seq_q > seq_k: every row sees key 0.
    assert!(attention(
        &q,
        &kv,
        &kv,
        &AttentionOptions::default().causal(Causal::TopLeft)
    )
    .is_ok());
}

#[test]
fn invalid_scale() {
    let t = host(&[1, 2, 1, 8]);
    for s in [f32::NAN, f32::INFINITY, 0.0, -0.0, -0.5, f32::NEG_INFINITY] {
        assert!(matches!(
            run(&t, &t, &t, AttentionOptions::default().scale(s)),
            Error::InvalidScale(_)
        ));
    }
}

#[test]
fn gpu_backend_on_host_tensors_is_refused() {
    let t = host(&[1, 2, 1, 8]);
    for kernel in Kernel::ALL {
        let e = run(
            &t,
            &t,
            &t,
            AttentionOptions::default().backend(kernel.into()),
        );
        assert!(
            matches!(e, Error::BackendUnavailable { backend, .. } if backend == kernel.name()),
            "{e:?}"
        );
    }
}

#[test]
fn empty_problems_compute_nothing() {
    for (q_dims, kv_dims) in [
        ([0, 4, 2, 8], [0, 4, 2, 8]), // batch 0
        ([1, 0, 2, 8], [1, 4, 2, 8]), // seq_q 0
        ([1, 0, 2, 8], [1, 0, 2, 8]), // seq_q 0 and seq_k 0
        ([1, 4, 0, 8], [1, 4, 0, 8]), // heads 0
    ] {
        let (q, kv) = (host(&q_dims), host(&kv_dims));
        let res = attention(&q, &kv, &kv, &AttentionOptions::default().with_lse()).unwrap();
        assert_eq!(res.out.shape().numel().unwrap(), 0);
        assert_eq!(res.lse.unwrap().shape().numel().unwrap(), 0);
    }
}

#[test]
fn tile_table_choice_per_arch_class() {
    let cases = [
        ((8, 0), ArchClass::Sm80),
        ((8, 6), ArchClass::Sm86Sm89),
        ((8, 7), ArchClass::Sm86Sm89),
        ((8, 9), ArchClass::Sm86Sm89),
        ((9, 0), ArchClass::Sm90),
    ];
    for ((major, minor), class) in cases {
        assert_eq!(
            ArchClass::from_compute_capability(major, minor, class.smem_per_block_optin()),
            Some(class)
        );
        for kernel in [Kernel::CutlassSm80, Kernel::Wmma] {
            for d in (8..=256).step_by(8) {
                let smem = class.smem_per_block_optin();
                let row = choose_row(kernel, d, 4096, (major, minor), smem, None).unwrap();
                assert_eq!(row.arch, class);
                assert!(d <= row.max_head_dim as usize && d <= row.tile.max_head_dim as usize);
                // The tightest tier: the row below (if any) would not serve d.
                let tier = [64, 128, 256].into_iter().find(|&t| d <= t).unwrap();
                assert_eq!(row.max_head_dim as usize, tier, "{kernel:?} d={d}");
            }
        }
    }
    assert_eq!(ArchClass::from_compute_capability(7, 5, 64 * 1024), None);
    // Newer than every SASS: the class by shared memory, never the Hopper kernel's.
    let (b200, rtx50) = (227 * 1024, 99 * 1024);
    let sm80 = Some(ArchClass::Sm80);
    assert_eq!(ArchClass::from_compute_capability(10, 0, b200), sm80);
    assert_eq!(ArchClass::from_compute_capability(10, 0, 163 * 1024), sm80);
    assert_eq!(
        ArchClass::from_compute_capability(12, 0, rtx50),
        Some(ArchClass::Sm86Sm89)
    );
    assert_eq!(ArchClass::from_compute_capability(12, 0, 98 * 1024), None);
    let row = choose_row(Kernel::Wmma, 128, 4096, (10, 0), b200, None).unwrap();
    assert_eq!(row.arch, ArchClass::Sm80);
    assert!(matches!(
        choose_row(Kernel::CutlassSm90, 128, 4096, (10, 0), b200, None),
        Err(Error::BackendUnavailable { .. })
    ));
    assert!(matches!(
        choose_row(Kernel::Wmma, 64, 4096, (7, 5), 64 * 1024, None),
        Err(Error::UnsupportedDevice { major: 7, minor: 5 })
    ));
    // The sm_89 rows are what an L4 gets, and can be forced on an H200.
    for kernel in [Kernel::CutlassSm80, Kernel::Wmma] {
        let l4 = choose_row(kernel, 256, 4096, (8, 9), 99 * 1024, None).unwrap();
        let sm89 = Some(ArchClass::Sm86Sm89);
        let forced = choose_row(kernel, 256, 4096, (9, 0), 227 * 1024, sm89).unwrap();
        assert_eq!(l4, forced);
    }
    // Forcing a class whose tile does not fit the device is an error, not a failed launch.
    assert!(matches!(
        choose_row(
            Kernel::CutlassSm80,
            256,
            4096,
            (8, 9),
            48 * 1024,
            Some(ArchClass::Sm90)
        ),
        Err(Error::SharedMemoryExceeded {
            needed: 69_632,
            available: 49_152
        })
    ));
}

#[test]
fn tile_table_rows_fit_their_class() {
    for kernel in Kernel::ALL {
        let table = tile_table(kernel);
        for class in ArchClass::ALL {
            let rows: Vec<_> = table.iter().filter(|r| r.arch == class).collect();
            // The Hopper kernel's SASS is sm_90a: it has rows for that class only.
            let tiers: &[u32] = if kernel == Kernel::CutlassSm90 && class != ArchClass::Sm90 {
                &[]
            } else {
                &[64, 128, 256]
            };
            assert_eq!(
                rows.iter().map(|r| r.max_head_dim).collect::<Vec<_>>(),
                tiers
            );
            for r in rows {
                assert!(r.smem_bytes <= class.smem_per_block_optin(), "{r:?}");
                if kernel == Kernel::CutlassSm80 {
                    // At least two blocks per SM, so one block's tail overlaps another's work.
                    assert!(2 * r.smem_bytes <= class.smem_per_sm(), "{r:?}");
                }
                assert!(r.tile.max_head_dim >= r.max_head_dim);
                assert!(!r.reason.is_empty());
                let d = r.max_head_dim as usize;
                assert_eq!(select_row(kernel, class, d, 4096), Some(r));
            }
        }
    }
}

#[test]
fn sm90_serves_compute_capability_9_only() {
    for d in (8..=256).step_by(8) {
        let row = choose_row(Kernel::CutlassSm90, d, 4096, (9, 0), 227 * 1024, None).unwrap();
        assert_eq!(row.arch, ArchClass::Sm90);
        assert!(d <= row.max_head_dim as usize);
        // Consumer warpgroups of 64 query rows: three at d <= 64, two above.
        let warpgroups = if d <= 64 { 3 } else { 2 };
        assert_eq!(row.tile.queries_per_block, 64 * warpgroups, "{row:?}");
    }
    // Another GPU, or another class forced on an H200: a typed error naming the backend.
    for (cc, smem, forced) in [
        ((8, 9), 99 * 1024, None),
        ((8, 0), 163 * 1024, None),
        ((9, 0), 227 * 1024, Some(ArchClass::Sm86Sm89)),
        ((8, 0), 227 * 1024, Some(ArchClass::Sm90)),
    ] {
        let e = choose_row(Kernel::CutlassSm90, 128, 4096, cc, smem, forced).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BackendUnavailable {
                    backend: "cutlass-sm90",
                    ..
                }
            ),
            "{cc:?} {forced:?}: {e:?}"
        );
    }
    assert_eq!(Kernel::from_name("cutlass-sm90"), Some(Kernel::CutlassSm90));
    assert_eq!(
        flashcore::Backend::from(Kernel::CutlassSm90),
        flashcore::Backend::Kernel(Kernel::CutlassSm90)
    );
}

#[test]
fn wmma_rows_are_whole_warps_of_sixteen_rows() {
    for r in tile_table(Kernel::Wmma) {
        let t = r.tile;
        assert_eq!(t.queries_per_block % 16, 0, "{r:?}");
        // Up to 4 warps of 16 rows, or 4 warps of a whole number of 16-row tiles.
        assert!(
            t.queries_per_block <= 64 || t.queries_per_block % 64 == 0,
            "{r:?}"
        );
        assert_eq!(t.keys_per_block % 16, 0, "{r:?}");
        assert_eq!(t.max_head_dim % 16, 0, "{r:?}");
        assert_eq!(r.smem_bytes, flashcore::plan::wmma_smem_bytes(t));
    }
}

#[test]
fn decode_rows_serve_few_query_rows() {
    for class in ArchClass::ALL {
        let smem = class.smem_per_block_optin();
        let cc = match class {
            ArchClass::Sm80 => (8, 0),
            ArchClass::Sm86Sm89 => (8, 9),
            ArchClass::Sm90 => (9, 0),
        };
        let limit = flashcore::plan::decode_max_query_rows();
        assert_eq!(limit, 32);
        for rows in [1, 4, limit] {
            for d in [8, 64, 128] {
                let row = choose_row(Kernel::CutlassSm80, d, rows, cc, smem, None).unwrap();
                let table = decode_table(Kernel::CutlassSm80);
                assert!(table.contains(row), "{class:?} rows={rows} d={d}");
                assert_eq!(row.tile.queries_per_block as usize, 32);
            }
            // Above the CUTLASS decode rows' head dims, the main table serves.
            let row = choose_row(Kernel::CutlassSm80, 256, rows, cc, smem, None).unwrap();
            assert!(tile_table(Kernel::CutlassSm80).contains(row));
            // WMMA's decode rows serve every head dim with one warp of 16 query rows.
            for d in [8, 64, 72, 128, 136, 256] {
                let row = choose_row(Kernel::Wmma, d, rows, cc, smem, None).unwrap();
                assert!(decode_table(Kernel::Wmma).contains(row), "{class:?} d={d}");
                assert_eq!(row.tile.queries_per_block, 16);
                assert_eq!(row.smem_bytes, flashcore::plan::wmma_smem_bytes(row.tile));
            }
            // The Hopper kernel has no decode rows.
            if class == ArchClass::Sm90 {
                let row = choose_row(Kernel::CutlassSm90, 128, rows, cc, smem, None).unwrap();
                assert!(tile_table(Kernel::CutlassSm90).contains(row));
            }
        }
        for kernel in [Kernel::CutlassSm80, Kernel::Wmma] {
            let row = choose_row(kernel, 64, limit + 1, cc, smem, None).unwrap();
            assert!(tile_table(kernel).contains(row), "{kernel:?} {class:?}");
        }
    }
    assert!(decode_table(Kernel::CutlassSm90).is_empty());
}

#[test]
fn decode_splits_aim_at_two_blocks_per_sm() {
    let row = |class| {
        decode_table(Kernel::Wmma)
            .iter()
            .find(|r| r.arch == class && r.max_head_dim == 128)
            .unwrap()
    };
    // H200: two blocks per SM x 132 SMs (5 of 39 KB would fit).
    let h200 = row(ArchClass::Sm90);
    for (units, keys, want) in [
        (8, 32768, 33),
        (128, 8192, 2),
        (256, 4096, 1),
        (512, 2048, 1),
    ] {
        assert_eq!(
            kv_splits(Kernel::Wmma, h200, 4, units, keys, 132),
            want,
            "{units}x{keys}"
        );
    }
    assert_eq!(kv_splits(Kernel::Wmma, h200, 4, 8, 1024, 132), 2); // >= 512 keys per split
    assert_eq!(kv_splits(Kernel::Wmma, h200, 33, 8, 32768, 132), 1); // not decode
    assert_eq!(kv_splits(Kernel::CutlassSm80, h200, 4, 8, 32768, 132), 1); // never example 41
                                                                           // The Hopper kernel: one 128-row block per SM.
    let hopper = select_row(Kernel::CutlassSm90, ArchClass::Sm90, 128, 4).unwrap();
    assert_eq!(kv_splits(Kernel::CutlassSm90, hopper, 4, 8, 32768, 132), 16);
    assert_eq!(kv_splits(Kernel::CutlassSm90, hopper, 4, 64, 8192, 132), 2);
    assert_eq!(kv_splits(Kernel::CutlassSm90, hopper, 4, 128, 8192, 132), 1);
    // L4: 2 per SM x 58 SMs = 116 resident blocks.
    assert_eq!(
        kv_splits(Kernel::Wmma, row(ArchClass::Sm86Sm89), 4, 8, 32768, 58),
        14
    );
}

#[test]
fn auto_picks_by_arch_rows_and_work() {
    let limit = flashcore::plan::decode_max_query_rows();
    for arch in ArchClass::ALL {
        for rows in [1, 4, limit] {
            // Decode: the Hopper kernel (compute capability 9.0; split below one unit per SM),
            // or split-KV WMMA, up to two units per SM, CUTLASS's decode row beyond.
            let middle = if arch == ArchClass::Sm90 {
                Kernel::CutlassSm90
            } else {
                Kernel::Wmma
            };
            for (units, want) in [
                (1, middle),
                (115, middle),
                (116, middle),
                (132, middle),
                (263, middle),
                (265, Kernel::CutlassSm80),
                (4096, Kernel::CutlassSm80),
            ] {
                assert_eq!(
                    auto_kernel(arch, rows, units, 8192, 128, 132),
                    want,
                    "{rows} {units}"
                );
            }
        }
        for rows in [limit + 1, 64, 4096, usize::MAX] {
            let want = if arch == ArchClass::Sm90 {
                Kernel::CutlassSm90
            } else {
                Kernel::Wmma
            };
            assert_eq!(
                auto_kernel(arch, rows, 4096, 4096, 64, 132),
                want,
                "{arch:?} {rows}"
            );
        }
    }
    // On an H200, the Hopper kernel once its 128-row work units fill the 132 SMs, or once the
    // two products take 2^30 flops; WMMA for smaller problems.
    let h200 = |rows, heads, keys, d| auto_kernel(ArchClass::Sm90, rows, heads, keys, d, 132);
    assert_eq!(h200(512, 8, 512, 64), Kernel::Wmma); // 32 units, 2^29 flops
    assert_eq!(h200(256, 32, 256, 64), Kernel::Wmma); // 64 units, 2^29 flops
    assert_eq!(h200(1024, 8, 1024, 64), Kernel::CutlassSm90); // 64 units, 2^31 flops
    assert_eq!(h200(512, 8, 1023, 64), Kernel::Wmma); // just below 2^30 flops
    assert_eq!(h200(512, 8, 1024, 64), Kernel::CutlassSm90); // 2^30 flops
    assert_eq!(h200(129, 66, 16, 8), Kernel::CutlassSm90); // 2 x 66 units
    assert_eq!(h200(129, 65, 16, 8), Kernel::Wmma); // 130 units, 2^22 flops
    assert_eq!(
        auto_kernel(
            ArchClass::Sm90,
            usize::MAX,
            usize::MAX,
            usize::MAX,
            256,
            usize::MAX
        ),
        Kernel::CutlassSm90
    );
}

#[test]
fn device_discovery_never_panics() {
    let n = flashcore::cuda_device_count();
    #[cfg(feature = "cuda")]
    {
        let e = flashcore::Device::open(n).unwrap_err();
        assert!(matches!(e, Error::NoDevice { .. }), "{e:?}");
    }
    let _ = n;
}

/// Host allocations that cannot be satisfied are typed errors, never an abort: a tensor too
/// large for any host, and the CPU backend's per-row scores for 2^59 keys (a broadcast key
/// tensor: every key row is the same 8 values).
#[test]
fn host_out_of_memory_is_an_error() {
    let huge = Tensor::full(half::f16::ZERO, &[1 << 24, 1 << 20, 1, 8], Layout::Bshd);
    assert!(
        matches!(huge, Err(Error::OutOfHostMemory { bytes }) if bytes == 1 << 48),
        "{huge:?}"
    );
    let q = Tensor::full(half::f16::ONE, &[1, 1, 1, 8], Layout::Bshd).unwrap();
    let keys = 1usize << 59;
    let k = Tensor::from_vec_strided(
        vec![half::f16::ONE; 8],
        flashcore::Shape::new(1, keys, 1, 8),
        [0, 0, 0, 1],
    )
    .unwrap();
    let err = attention(&q, &k, &k, &AttentionOptions::default()).unwrap_err();
    assert!(
        matches!(err, Error::OutOfHostMemory { bytes } if bytes == keys * 8),
        "{err}"
    );
}

/// An output whose rows share addresses (seq stride 0, the report) is refused before
/// anything runs, by the C++ core's validation that every backend goes through.
#[test]
fn overlapping_outputs_are_refused() {
    let mut rng = Rng::fresh();
    let q = randn::<f16>(&mut rng, &[1, 4, 2, 8], Layout::Bshd);
    let shape = Shape::new(1, 4, 2, 8);
    let mut out = Tensor::from_vec_strided(vec![f16::ZERO; 16], shape, [16, 0, 8, 1]).unwrap();
    let e = attention_into(&q, &q, &q, &mut out, None, &Default::default()).unwrap_err();
    assert_eq!(
        e,
        Error::OverlappingOutput {
            operand: Operand::Out,
            other: None
        }
    );
    assert!(e.to_string().contains("itself"), "{e}");
    assert!(out.host_data().unwrap().iter().all(|x| *x == f16::ZERO));
    // Heads 8 elements apart in rows of 16: neighbours share half a row.
    let q = randn::<f16>(&mut rng, &[1, 4, 2, 16], Layout::Bshd);
    let shape = Shape::new(1, 4, 2, 16);
    let mut out = Tensor::from_vec_strided(vec![f16::ZERO; 128], shape, [128, 32, 8, 1]).unwrap();
    let e = attention_into(&q, &q, &q, &mut out, None, &Default::default()).unwrap_err();
    assert!(
        matches!(e, Error::OverlappingOutput { other: None, .. }),
        "{e:?}"
    );
    // Padded rows that never collide are fine.
    let mut out = Tensor::from_vec_strided(vec![f16::ZERO; 256], shape, [256, 64, 16, 1]).unwrap();
    attention_into(&q, &q, &q, &mut out, None, &Default::default()).unwrap();
}

/// Logit softcapping on the CPU reference against the naive formula: small caps squash the
/// scores hard, a large one changes almost nothing; with every causal mode and GQA. Bad caps are
/// errors.
#[test]
fn softcap_matches_the_naive_formula() {
    let mut rng = Rng::fresh();
    let (qs, ks) = (Shape::new(2, 9, 4, 16), Shape::new(2, 12, 2, 16));
    let q = randn::<f16>(&mut rng, &dims(qs, Layout::Bshd), Layout::Bshd);
    let k = randn::<f16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
    let v = randn::<f16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
    let scale = 0.9;
    for cap in [0.5f32, 2.0, 50.0] {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            let opts = AttentionOptions::default()
                .causal(causal)
                .scale(scale)
                .softcap(cap)
                .with_lse();
            let res = attention(&q, &k, &v, &opts).unwrap();
            let mods = common::Mods {
                softcap: Some(f64::from(cap)),
                ..Default::default()
            };
            let (want, want_lse) = common::naive_mods(&q, &k, &v, f64::from(scale), causal, mods);
            let err = rel_l2(&logical(&res.out), &want);
            let lse_err = rel_l2(&lse_values(res.lse.as_ref().unwrap()), &want_lse);
            assert!(
                err < 5e-4 && lse_err < 1e-6,
                "cap {cap} {causal:?}: {err:.2e} {lse_err:.2e}"
            );
        }
    }
    // A small cap changes the result, so the comparisons above are not vacuous.
    let plain = attention(&q, &k, &v, &AttentionOptions::default().scale(scale)).unwrap();
    let capped = attention(
        &q,
        &k,
        &v,
        &AttentionOptions::default().scale(scale).softcap(0.5),
    )
    .unwrap();
    assert!(rel_l2(&logical(&plain.out), &logical(&capped.out)) > 1e-2);
    for bad in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let e = attention(&q, &k, &v, &AttentionOptions::default().softcap(bad)).unwrap_err();
        assert!(
            matches!(e, Error::InvalidSoftcap(c) if c.to_bits() == bad.to_bits()),
            "{e:?}"
        );
    }
}

/// A sliding window on the CPU reference against the naive formula: every causal mode, Sq below
/// and above Sk, GQA, windows of 0 and 1 keys, wider than Sk, one side only, with a softcap;
/// rows a window leaves without keys are NoVisibleKeys, counted exactly.
#[test]
fn sliding_window_matches_the_naive_formula() {
    let mut rng = Rng::fresh();
    let mut checked = 0;
    for (sq, sk) in [(9, 12), (12, 9), (1, 20), (16, 16)] {
        let (qs, ks) = (Shape::new(2, sq, 4, 16), Shape::new(2, sk, 2, 16));
        let q = randn::<f16>(&mut rng, &dims(qs, Layout::Bshd), Layout::Bshd);
        let k = randn::<f16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
        let v = randn::<f16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            for window in [
                (Some(0), Some(0)),
                (Some(1), None),
                (Some(3), Some(2)),
                (None, Some(1)),
                (Some(40), Some(40)),
            ] {
                for softcap in [None, Some(5.0f32)] {
                    let mut opts = AttentionOptions::default()
                        .causal(causal)
                        .window(window.0, window.1)
                        .with_lse();
                    opts.softcap = softcap;
                    let mods = common::Mods {
                        softcap: softcap.map(f64::from),
                        window,
                        ..common::Mods::default()
                    };
                    let scale = 1.0 / 4.0;
                    let (want, want_lse) = common::naive_mods(&q, &k, &v, scale, causal, mods);
                    let blind = want_lse
                        .iter()
                        .filter(|l| l.is_nan() || **l == f64::NEG_INFINITY);
                    let blind_rows = blind.count() / (2 * 4);
                    match attention(&q, &k, &v, &opts) {
                        Ok(res) => {
                            assert_eq!(blind_rows, 0, "{sq}x{sk} {causal:?} {window:?}");
                            let err = rel_l2(&logical(&res.out), &want);
                            let lse_err = rel_l2(&lse_values(res.lse.as_ref().unwrap()), &want_lse);
                            assert!(
                                err < 5e-4 && lse_err < 1e-6,
                                "{sq}x{sk} {causal:?} {window:?} {softcap:?}: {err:.2e} {lse_err:.2e}"
                            );
                            checked += 1;
                        }
                        Err(Error::NoVisibleKeys { rows, .. }) => {
                            assert_eq!(rows, blind_rows, "{sq}x{sk} {causal:?} {window:?}");
                            assert!(rows > 0);
                        }
                        Err(e) => panic!("{sq}x{sk} {causal:?} {window:?}: {e}"),
                    }
                }
            }
        }
    }
    assert!(checked > 80, "{checked} windowed calls compared");
    // A window changes the result, so the comparisons are not vacuous.
    let x = randn::<f16>(&mut rng, &[1, 32, 2, 16], Layout::Bshd);
    let full = attention(&x, &x, &x, &AttentionOptions::default()).unwrap();
    let local = attention(
        &x,
        &x,
        &x,
        &AttentionOptions::default().window(Some(2), Some(2)),
    )
    .unwrap();
    assert!(rel_l2(&logical(&full.out), &logical(&local.out)) > 1e-2);
}

/// The CPU reference with `opts` (which ask for the lse) against the naive formula with scale
/// 0.25 and `mods`: out within 5e-4, lse within 1e-6 (relative L2; -inf exactly where the naive
/// lse is).
fn matches_naive(
    [q, k, v]: [&Tensor<f16>; 3],
    opts: &AttentionOptions,
    causal: Causal,
    mods: common::Mods,
    what: &str,
) {
    let (want, want_lse) = common::naive_mods(q, k, v, 0.25, causal, mods);
    let res = attention(q, k, v, opts).unwrap_or_else(|e| panic!("{what}: {e}"));
    let err = rel_l2(&logical(&res.out), &want);
    let lse_err = common::lse_error(&lse_values(res.lse.as_ref().unwrap()), &want_lse);
    assert!(
        err < 5e-4 && lse_err < 1e-6,
        "{what}: {err:.2e} {lse_err:.2e}"
    );
}

/// ALiBi on the CPU reference against the naive formula: every causal mode, Sq below, equal to
/// and above Sk, GQA, shared and per-sequence slopes (zero, negative, large), with a softcap and
/// a window; a variable-length batch gives each sequence its own row of slopes; bad slopes are
/// typed errors.
#[test]
fn alibi_matches_the_naive_formula() {
    let mut rng = Rng::fresh();
    let mut checked = 0;
    let shared = vec![0.5, 0.0, -0.25, 16.0];
    let per_sequence: Vec<f32> = (0..8).map(|i| 0.1 * (i as f32 + 1.0)).collect();
    for (sq, sk) in [(9, 12), (12, 9), (1, 20), (16, 16)] {
        let (qs, ks) = (Shape::new(2, sq, 4, 16), Shape::new(2, sk, 2, 16));
        let q = randn::<f16>(&mut rng, &dims(qs, Layout::Bshd), Layout::Bshd);
        let k = randn::<f16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
        let v = randn::<f16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            if causal == Causal::BottomRight && sq > sk {
                continue; // rows without keys
            }
            for (slopes, softcap, window) in [
                (shared.clone(), None, (None, None)),
                (per_sequence.clone(), None, (None, None)),
                (per_sequence.clone(), Some(5.0f32), (Some(3), None)),
            ] {
                let alibi = if slopes.len() == 4 {
                    AlibiSlopes::new(slopes.clone())
                } else {
                    AlibiSlopes::per_sequence(2, slopes.clone())
                };
                let mut opts = AttentionOptions::default()
                    .causal(causal)
                    .window(window.0, window.1)
                    .alibi(alibi.unwrap())
                    .with_lse();
                opts.softcap = softcap;
                let mods = common::Mods {
                    softcap: softcap.map(f64::from),
                    window,
                    alibi: Some(slopes),
                    ..common::Mods::default()
                };
                let what = format!("{sq}x{sk} {causal:?} {softcap:?} {window:?}");
                matches_naive([&q, &k, &v], &opts, causal, mods, &what);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 33, "every ALiBi case ran");

    // A variable-length batch of two equal sequences is the dense batch: per-sequence slopes
    // follow the sequence, not the token.
    let q = randn::<f16>(&mut rng, &[2, 10, 4, 16], Layout::Bshd);
    let k = randn::<f16>(&mut rng, &[2, 14, 2, 16], Layout::Bshd);
    let packed = |t: &Tensor<f16>, s: usize, h: usize| {
        let data = t.host_data().unwrap().to_vec();
        Tensor::from_vec(data, &[1, 2 * s, h, 16], Layout::Bshd).unwrap()
    };
    let opts = AttentionOptions::default()
        .causal(Causal::BottomRight)
        .alibi(AlibiSlopes::per_sequence(2, per_sequence.clone()).unwrap());
    let dense = attention(&q, &k, &k, &opts).unwrap();
    let batch = VarlenBatch::from_lengths(&[10, 10], &[14, 14]).unwrap();
    let (qp, kp) = (packed(&q, 10, 4), packed(&k, 14, 2));
    let varlen = attention_varlen(&qp, &kp, &kp, &batch, &opts).unwrap();
    assert_eq!(
        varlen.out.host_data().unwrap(),
        dense.out.host_data().unwrap(),
        "varlen rows use their sequence's slopes"
    );
    // ALiBi changes the result, so the comparisons are not vacuous.
    let plain = attention(
        &q,
        &k,
        &k,
        &AttentionOptions::default().causal(Causal::BottomRight),
    );
    assert!(rel_l2(&logical(&plain.unwrap().out), &logical(&dense.out)) > 1e-2);

    // Bad slopes: each its own error, before anything runs.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = AlibiSlopes::new(vec![0.5, bad]).unwrap_err();
        assert!(
            matches!(e, Error::InvalidAlibiSlope { index: 1, value } if value.to_bits() == bad.to_bits()),
            "{e:?}"
        );
    }
    let e = AlibiSlopes::per_sequence(3, vec![0.5; 8]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShapeMismatch {
                operand: Operand::AlibiSlopes,
                ..
            }
        ),
        "{e:?}"
    );
    let wrong_heads = AttentionOptions::default().alibi(AlibiSlopes::geometric(2).unwrap());
    let e = attention(&q, &k, &k, &wrong_heads).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShapeMismatch {
                operand: Operand::AlibiSlopes,
                dim: "heads",
                got: 2,
                expected: 4
            }
        ),
        "{e:?}"
    );
    let three = AlibiSlopes::per_sequence(3, vec![0.5; 12]).unwrap();
    let e = attention(&q, &k, &k, &AttentionOptions::default().alibi(three)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShapeMismatch {
                operand: Operand::AlibiSlopes,
                dim: "batch",
                got: 3,
                expected: 2
            }
        ),
        "{e:?}"
    );
    let slopes = AlibiSlopes::geometric(12).unwrap();
    let want = [
        0.5f32,
        0.25,
        0.125,
        0.0625,
        0.03125,
        0.015625,
        0.0078125,
        0.00390625,
        0.70710677,
        0.35355338,
        0.17677669,
        0.088388346,
    ];
    assert_eq!(slopes.values(), &want, "BLOOM's slopes for 12 heads");
}

/// An additive bias on the CPU reference against the naive formula: every causal mode, Sq
/// below, equal to and above Sk, GQA, f16 / bf16 / f32 biases, full and broadcast (dims of 1,
/// zero strides), PyTorch's memory order, -inf masks with whole rows masked (output 0, lse
/// -inf), with ALiBi, a softcap and a window; a variable-length batch indexes it per sequence;
/// wrong shapes are typed errors.
#[test]
fn bias_matches_the_naive_formula() {
    use common::{Mods, NaiveBias};
    use flashcore::{Bias, DType};
    let mut rng = Rng::fresh();
    let mut checked = 0;
    for (sq, sk) in [(9, 12), (12, 9), (1, 20), (16, 16)] {
        let (qs, ks) = (Shape::new(2, sq, 4, 16), Shape::new(2, sk, 2, 16));
        let q = randn::<f16>(&mut rng, &dims(qs, Layout::Bshd), Layout::Bshd);
        let k = randn::<f16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
        let v = randn::<f16>(&mut rng, &dims(ks, Layout::Bshd), Layout::Bshd);
        // (dims, dtype, layout, -inf fraction, also ALiBi + softcap + window)
        let cases = [
            ([2, sq, 4, sk], DType::F32, Layout::Bhsd, 0.2, false),
            ([1, sq, 1, sk], DType::F16, Layout::Bshd, 0.0, false),
            ([2, 1, 4, sk], DType::BF16, Layout::Bhsd, 0.3, false),
            ([1, 1, 1, 1], DType::F32, Layout::Bshd, 0.0, false),
            ([2, sq, 4, sk], DType::F16, Layout::Bshd, 0.1, true),
        ];
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            if causal == Causal::BottomRight && sq > sk {
                continue; // rows without keys
            }
            for (bias_dims, dtype, layout, masked, all) in cases {
                let mut nb = NaiveBias::random(&mut rng, bias_dims, (2.0, masked), dtype, layout);
                if sq > 1 && bias_dims[1] > 1 {
                    // Query 1 of every head sees no key through the bias.
                    for (n, x) in nb.values.iter_mut().enumerate() {
                        if n / (bias_dims[2] * bias_dims[3]) % bias_dims[1] == 1 {
                            *x = f64::NEG_INFINITY;
                        }
                    }
                }
                let mut opts = AttentionOptions::default()
                    .causal(causal)
                    .bias(nb.bias())
                    .with_lse();
                let mut mods = Mods {
                    bias: Some(nb.clone()),
                    ..Mods::default()
                };
                if all {
                    let slopes = vec![0.5, 0.0, -0.25, 1.0];
                    opts = opts
                        .alibi(AlibiSlopes::new(slopes.clone()).unwrap())
                        .softcap(5.0)
                        .window(Some(4), None);
                    mods.alibi = Some(slopes);
                    mods.softcap = Some(5.0);
                    mods.window = (Some(4), None);
                }
                let what = format!("{sq}x{sk} {causal:?} {bias_dims:?} {dtype:?} {layout:?}");
                matches_naive([&q, &k, &v], &opts, causal, mods, &what);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 55, "every bias case ran");

    // Zero strides broadcast like dims of 1, and the bias changes the result (the comparisons
    // above are not vacuous).
    let q = randn::<f16>(&mut rng, &[2, 10, 4, 16], Layout::Bshd);
    let k = randn::<f16>(&mut rng, &[2, 14, 2, 16], Layout::Bshd);
    let row: Vec<f32> = (0..14).map(|j| j as f32 * 0.3).collect();
    let strided = Tensor::from_vec_strided(row.clone(), Shape::new(2, 10, 4, 14), [0, 0, 0, 1]);
    let strided = AttentionOptions::default().bias(Bias::from(strided.unwrap()));
    let one = Tensor::from_vec(row, &[1, 1, 1, 14], Layout::Bshd).unwrap();
    let one = AttentionOptions::default().bias(Bias::from(one));
    let a = attention(&q, &k, &k, &strided).unwrap();
    let b = attention(&q, &k, &k, &one).unwrap();
    assert_eq!(a.out.host_data().unwrap(), b.out.host_data().unwrap());
    let plain = attention(&q, &k, &k, &AttentionOptions::default()).unwrap();
    assert!(rel_l2(&logical(&plain.out), &logical(&a.out)) > 1e-2);

    // A variable-length batch of two equal sequences is the dense batch: the bias's batch axis
    // follows the sequence and its rows and keys count from the sequence's start.
    let nb = NaiveBias::random(
        &mut rng,
        [2, 10, 4, 14],
        (1.0, 0.2),
        DType::F32,
        Layout::Bhsd,
    );
    let opts = AttentionOptions::default()
        .causal(Causal::BottomRight)
        .bias(nb.bias());
    let dense = attention(&q, &k, &k, &opts).unwrap();
    let packed = |t: &Tensor<f16>, s: usize, h: usize| {
        let data = t.host_data().unwrap().to_vec();
        Tensor::from_vec(data, &[1, 2 * s, h, 16], Layout::Bshd).unwrap()
    };
    let batch = VarlenBatch::from_lengths(&[10, 10], &[14, 14]).unwrap();
    let (qp, kp) = (packed(&q, 10, 4), packed(&k, 14, 2));
    let varlen = attention_varlen(&qp, &kp, &kp, &batch, &opts).unwrap();
    assert_eq!(
        varlen.out.host_data().unwrap(),
        dense.out.host_data().unwrap(),
        "varlen rows use their sequence's bias"
    );

    // Wrong shapes: each names its dim, before anything runs.
    for (bias_dims, dim) in [
        ([3, 10, 4, 14], "batch"),
        ([2, 9, 4, 14], "seq_q"),
        ([2, 10, 2, 14], "heads"),
        ([2, 10, 4, 15], "seq_k"),
    ] {
        let nb = NaiveBias::random(&mut rng, bias_dims, (1.0, 0.0), DType::F16, Layout::Bshd);
        let opts = AttentionOptions::default().bias(nb.bias());
        let e = attention(&q, &k, &k, &opts).unwrap_err();
        assert!(
            matches!(e, Error::ShapeMismatch { operand: Operand::Bias, dim: d, .. } if d == dim),
            "{dim}: {e:?}"
        );
    }
    // Forcing a family that applies no bias is refused (here: the operands are on the host
    // first of all, so the CPU path's refusal comes from the location).
    let opts = AttentionOptions::default()
        .bias(nb.bias())
        .backend(flashcore::Backend::Kernel(Kernel::CutlassSm80));
    assert!(attention(&q, &k, &k, &opts).is_err());
}

/// `Tensor::copy_from` on the host: the elements are copied in place; other dims, other strides
/// and tensors with gaps between their elements are refused, leaving the destination as it was.
#[cfg(feature = "cuda")]
#[test]
fn copy_from_copies_in_place_and_refuses_other_dims_strides_and_gaps() {
    let mut rng = Rng::fresh();
    let d = [2, 5, 3, 8];
    let src = randn::<f16>(&mut rng, &d, Layout::Bshd);
    let mut dst = Tensor::full(f16::ZERO, &d, Layout::Bshd).unwrap();
    dst.copy_from(&src).unwrap();
    assert_eq!(dst.host_data(), src.host_data());

    let before = dst.host_data().unwrap().to_vec();
    let longer = Tensor::full(f16::ONE, &[2, 6, 3, 8], Layout::Bshd).unwrap();
    let e = dst.copy_from(&longer).unwrap_err();
    assert_eq!(
        e,
        Error::CopyMismatch {
            dims: [2, 5, 3, 8],
            src_dims: [2, 6, 3, 8],
        }
    );
    // The same dims in the other layout: other strides.
    let bhsd = Tensor::full(f16::ONE, &[2, 3, 5, 8], Layout::Bhsd).unwrap();
    assert_eq!(bhsd.shape(), dst.shape());
    assert!(matches!(
        dst.copy_from(&bhsd),
        Err(Error::CopyMismatch { .. })
    ));
    assert_eq!(dst.host_data().unwrap(), &before[..]);
    // Gaps between rows (a view of every other row): refused on both sides.
    let shape = Shape::new(1, 4, 1, 8);
    let strided = |v: f16| Tensor::from_vec_strided(vec![v; 64], shape, [64, 16, 8, 1]).unwrap();
    let mut gapped = strided(f16::ZERO);
    assert!(matches!(
        gapped.copy_from(&strided(f16::ONE)),
        Err(Error::CopyMismatch { .. })
    ));
    assert!(gapped.host_data().unwrap().iter().all(|x| *x == f16::ZERO));
}
