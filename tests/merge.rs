//! Merging attention states on the CPU (runs in CI): states of key splits merge into attention
//! over all keys (against the independent naive formula), the edge rows of the formula, and
//! every validation error.

mod common;

use common::{dims, logical, lse_values, naive, randn, rel_l2, Rng};
use flashcore::{
    attention, max_merge_states, merge_state_into, merge_states, AttentionElement,
    AttentionOptions, AttentionState, Causal, DType, Error, Layout, Operand, Shape, Tensor,
};
use half::{bf16, f16};

/// Keys `range` of a host `[b, s, h, d]` tensor, as a dense tensor in `layout`.
fn keys<T: AttentionElement>(
    t: &Tensor<T>,
    range: std::ops::Range<usize>,
    layout: Layout,
) -> Tensor<T> {
    let s = t.shape();
    let sub = Shape::new(s.batch, range.len(), s.heads, s.head_dim);
    let mut out = Tensor::full(T::from_f64(0.0), &dims(sub, layout), layout).unwrap();
    let mut data = Vec::new();
    for b in 0..s.batch {
        for j in range.clone() {
            for h in 0..s.heads {
                for x in 0..s.head_dim {
                    data.push(t.get(b, j, h, x).unwrap());
                }
            }
        }
    }
    let dense = Tensor::from_vec(
        data,
        &[s.batch, range.len(), s.heads, s.head_dim],
        Layout::Bshd,
    )
    .unwrap();
    if layout == Layout::Bshd {
        return dense;
    }
    // Re-lay out through a merge of one state with lse 0: the identity.
    let zero = Tensor::full(0f32, &[s.batch, s.heads, range.len(), 1], Layout::Bhsd).unwrap();
    let one = [AttentionState {
        out: &dense,
        lse: &zero,
    }];
    merge_states(&one, &mut out, None).unwrap();
    out
}

fn tolerance<T: AttentionElement>() -> f64 {
    if T::DTYPE == DType::BF16 {
        8e-3
    } else {
        1e-3
    }
}

/// Splits the keys at `cuts`, attends to each split, merges (all at once and one by one) and
/// compares with the naive formula over all keys.
fn check_splits<T: AttentionElement>(
    q_shape: Shape,
    kv: (usize, usize),
    cuts: &[usize],
    layout: Layout,
) {
    let mut rng = Rng::fresh();
    let k_shape = Shape::new(q_shape.batch, kv.0, kv.1, q_shape.head_dim);
    let q = randn::<T>(&mut rng, &dims(q_shape, Layout::Bshd), Layout::Bshd);
    let k = randn::<T>(&mut rng, &dims(k_shape, Layout::Bshd), Layout::Bshd);
    let v = randn::<T>(&mut rng, &dims(k_shape, Layout::Bshd), Layout::Bshd);
    let opts = AttentionOptions::default().with_lse();
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(kv.0);
    let parts: Vec<_> = bounds
        .windows(2)
        .map(|w| {
            let (ks, vs) = (keys(&k, w[0]..w[1], layout), keys(&v, w[0]..w[1], layout));
            attention(&q, &ks, &vs, &opts).unwrap()
        })
        .collect();
    let states: Vec<_> = parts
        .iter()
        .map(|p| AttentionState {
            out: &p.out,
            lse: p.lse.as_ref().unwrap(),
        })
        .collect();
    let (want, want_lse) = naive(
        &q,
        &k,
        &v,
        1.0 / (q_shape.head_dim as f64).sqrt(),
        Causal::None,
    );

    let lse_dims = [q_shape.batch, q_shape.heads, q_shape.seq, 1];
    let mut out = Tensor::full(T::from_f64(f64::NAN), &dims(q_shape, layout), layout).unwrap();
    let mut lse = Tensor::full(f32::NAN, &lse_dims, Layout::Bhsd).unwrap();
    merge_states(&states, &mut out, Some(&mut lse)).unwrap();
    let err = rel_l2(&logical(&out), &want);
    assert!(
        err < tolerance::<T>(),
        "{q_shape:?} {cuts:?} {layout:?}: rel L2 {err}"
    );
    let lse_err = rel_l2(&lse_values(&lse), &want_lse);
    assert!(lse_err < 1e-6, "lse rel L2 {lse_err}");

    // One by one, in place, from the first state.
    let mut running = keys(&parts[0].out, 0..q_shape.seq, Layout::Bshd);
    let mut running_lse = Tensor::from_vec(
        parts[0].lse.as_ref().unwrap().host_data().unwrap().to_vec(),
        &lse_dims,
        Layout::Bhsd,
    )
    .unwrap();
    for s in &states[1..] {
        merge_state_into(&mut running, &mut running_lse, *s).unwrap();
    }
    let err = rel_l2(&logical(&running), &want);
    assert!(
        err < tolerance::<T>(),
        "in place {q_shape:?} {cuts:?}: rel L2 {err}"
    );
    assert!(rel_l2(&lse_values(&running_lse), &want_lse) < 1e-6);
}

#[test]
fn merged_key_splits_equal_attention_over_all_keys() {
    for layout in [Layout::Bshd, Layout::Bhsd] {
        check_splits::<f16>(Shape::new(2, 5, 4, 16), (16, 2), &[7], layout);
        check_splits::<bf16>(Shape::new(1, 3, 2, 8), (23, 2), &[1, 9, 10, 20], layout);
        check_splits::<f16>(Shape::new(1, 1, 8, 64), (40, 1), &[13, 26], layout);
        // MQA decode
    }
}

fn host_state(rows: &[(f32, [f32; 8])]) -> (Tensor<f16>, Tensor<f32>) {
    let n = rows.len();
    let out = rows
        .iter()
        .flat_map(|(_, r)| r.map(f16::from_f32))
        .collect();
    let lse = rows.iter().map(|(l, _)| *l).collect();
    (
        Tensor::from_vec(out, &[1, n, 1, 8], Layout::Bshd).unwrap(),
        Tensor::from_vec(lse, &[1, 1, n, 1], Layout::Bhsd).unwrap(),
    )
}

#[test]
fn edge_rows_of_the_formula() {
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    // Row 0: state b covers no key (its NaN output is never read). Row 1: neither covers a key.
    // Row 2: a NaN lse. Row 3: equal weights, the mean.
    let (ao, al) = host_state(&[
        (0.5, [1.0; 8]),
        (-inf, [nan; 8]),
        (nan, [1.0; 8]),
        (2.0, [1.0; 8]),
    ]);
    let (bo, bl) = host_state(&[
        (-inf, [nan; 8]),
        (-inf, [5.0; 8]),
        (0.0, [1.0; 8]),
        (2.0, [3.0; 8]),
    ]);
    let states = [
        AttentionState { out: &ao, lse: &al },
        AttentionState { out: &bo, lse: &bl },
    ];
    let mut out = Tensor::full(f16::NAN, &[1, 4, 1, 8], Layout::Bshd).unwrap();
    let mut lse = Tensor::full(nan, &[1, 1, 4, 1], Layout::Bhsd).unwrap();
    merge_states(&states, &mut out, Some(&mut lse)).unwrap();
    let o = |s: usize| out.get(0, s, 0, 3).unwrap().to_f32();
    let l = |s: usize| lse.get(0, s, 0, 0).unwrap();
    assert_eq!((o(0), l(0)), (1.0, 0.5));
    assert_eq!((o(1), l(1)), (0.0, -inf));
    assert!(o(2).is_nan() && l(2).is_nan());
    assert_eq!(o(3), 2.0);
    assert!((l(3) - (2.0 + std::f32::consts::LN_2)).abs() < 1e-6);
    // One state: the identity.
    let mut one = Tensor::full(f16::NAN, &[1, 4, 1, 8], Layout::Bshd).unwrap();
    merge_states(&states[..1], &mut one, None).unwrap();
    assert_eq!(one.get(0, 3, 0, 7), ao.get(0, 3, 0, 7));
}

#[test]
fn merge_validation_errors() {
    let t = |dims: &[usize]| Tensor::full(f16::ZERO, dims, Layout::Bshd).unwrap();
    let l = |dims: &[usize]| Tensor::full(0f32, dims, Layout::Bhsd).unwrap();
    let (a, al) = (t(&[1, 4, 2, 8]), l(&[1, 2, 4, 1]));
    let mut out = t(&[1, 4, 2, 8]);
    assert_eq!(max_merge_states(), 64);

    let none: [AttentionState<'_, f16>; 0] = [];
    let e = merge_states(&none, &mut out, None).unwrap_err();
    assert_eq!(
        e,
        Error::StateCount {
            count: 0,
            min: 1,
            max: 64
        }
    );
    let many = vec![AttentionState { out: &a, lse: &al }; 65];
    let e = merge_states(&many, &mut out, None).unwrap_err();
    assert_eq!(
        e,
        Error::StateCount {
            count: 65,
            min: 1,
            max: 64
        }
    );

    let shorter = t(&[1, 3, 2, 8]);
    let states = [
        AttentionState { out: &a, lse: &al },
        AttentionState {
            out: &shorter,
            lse: &al,
        },
    ];
    let e = merge_states(&states, &mut out, None).unwrap_err();
    assert_eq!(
        e,
        Error::ShapeMismatch {
            operand: Operand::State(1),
            dim: "seq",
            got: 3,
            expected: 4
        }
    );

    let bshd_lse = Tensor::full(0f32, &[1, 4, 2, 1], Layout::Bshd).unwrap();
    let states = [AttentionState {
        out: &a,
        lse: &bshd_lse,
    }];
    let e = merge_states(&states, &mut out, None).unwrap_err();
    assert_eq!(
        e,
        Error::LseLayout {
            operand: Operand::StateLse(0)
        }
    );

    let states = [AttentionState { out: &a, lse: &al }];
    let mut wrong = l(&[1, 3, 4, 1]); // three heads
    let e = merge_states(&states, &mut out, Some(&mut wrong)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShapeMismatch {
                operand: Operand::Lse,
                ..
            }
        ),
        "{e:?}"
    );

    let (odd, mut odd_out) = (t(&[1, 4, 2, 12]), t(&[1, 4, 2, 12]));
    let states = [AttentionState {
        out: &odd,
        lse: &al,
    }];
    let e = merge_states(&states, &mut odd_out, None).unwrap_err();
    assert_eq!(e, Error::UnsupportedHeadDim(12));

    // A state whose heads step by 12 elements (not a multiple of 8).
    let strided =
        Tensor::from_vec_strided(vec![f16::ZERO; 96], Shape::new(1, 4, 2, 8), [96, 24, 12, 1])
            .unwrap();
    let states = [
        AttentionState { out: &a, lse: &al },
        AttentionState {
            out: &strided,
            lse: &al,
        },
    ];
    let e = merge_states(&states, &mut out, None).unwrap_err();
    assert!(
        matches!(
            e,
            Error::MisalignedStride {
                operand: Operand::State(1),
                stride: 12,
                ..
            }
        ),
        "{e:?}"
    );
    let mut lse = l(&[1, 2, 4, 1]);
    let e = merge_state_into(
        &mut out,
        &mut lse,
        AttentionState {
            out: &shorter,
            lse: &al,
        },
    );
    assert!(matches!(
        e,
        Err(Error::ShapeMismatch {
            operand: Operand::State(1),
            ..
        })
    ));
}
