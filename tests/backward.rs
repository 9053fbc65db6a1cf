//! The backward pass through the public API (runs in CI, on the CPU backend): the gradients
//! against a naive f64 computation from the definition (GQA, MQA, causal modes, layouts, head
//! dims), the validation errors of its own operands, and where it runs. Finite-difference checks of
//! every score modifier are the unit tests of `src/cpu/backward.rs`.

mod common;

use common::{dims, logical, randn, random_lengths, rel_l2, tokens, Rng};
use flashcore::plan::Kernel;
use flashcore::{
    attention, attention_backward, attention_backward_into, attention_varlen,
    attention_varlen_backward, AttentionOptions, AttentionState, Backend, BackendKind, Causal,
    Error, GradientsMut, Layout, Operand, Shape, Tensor, VarlenBatch,
};
use half::{bf16, f16};

/// Gradients of attention from the definition, in f64 and full matrices: (dq, dk, dv), each in
/// logical `[b][s][h][d]` order.
fn naive_backward<T: flashcore::Element>(
    [q, k, v, dout]: [&Tensor<T>; 4],
    scale: f64,
    causal: Causal,
) -> [Vec<f64>; 3] {
    let (qs, ks) = (q.shape(), k.shape());
    let (sq, sk, hq, hk, d) = (qs.seq, ks.seq, qs.heads, ks.heads, qs.head_dim);
    let at = |t: &Tensor<T>, b, s, h, x| t.get(b, s, h, x).unwrap().to_f64();
    let mut dq = vec![0.0; qs.batch * sq * hq * d];
    let mut dk = vec![0.0; ks.batch * sk * hk * d];
    let mut dv = dk.clone();
    for b in 0..qs.batch {
        for h in 0..hq {
            let kh = h / (hq / hk);
            for i in 0..sq {
                let visible = |j: usize| match causal {
                    Causal::None => true,
                    Causal::TopLeft => j <= i,
                    Causal::BottomRight => j + sq <= i + sk,
                };
                let s: Vec<f64> = (0..sk)
                    .map(|j| match visible(j) {
                        true => {
                            (0..d)
                                .map(|x| at(q, b, i, h, x) * at(k, b, j, kh, x))
                                .sum::<f64>()
                                * scale
                        }
                        false => f64::NEG_INFINITY,
                    })
                    .collect();
                let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|x| x / sum).collect();
                let dp: Vec<f64> = (0..sk)
                    .map(|j| {
                        (0..d)
                            .map(|x| at(dout, b, i, h, x) * at(v, b, j, kh, x))
                            .sum()
                    })
                    .collect();
                let row: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..sk {
                    let ds = p[j] * (dp[j] - row) * scale;
                    for x in 0..d {
                        dq[((b * sq + i) * hq + h) * d + x] += ds * at(k, b, j, kh, x);
                        dk[((b * sk + j) * hk + kh) * d + x] += ds * at(q, b, i, h, x);
                        dv[((b * sk + j) * hk + kh) * d + x] += p[j] * at(dout, b, i, h, x);
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

/// Random Q, K, V and dO (`[b, sq, hq, d]` and `[b, sk, hk, d]` in `layout`), the forward
/// call with its logsumexp, and the backward call's gradients beside the naive ones: the
/// relative L2 errors of dq, dk, dv.
fn errors<T: flashcore::AttentionElement>(
    q_shape: Shape,
    (sk, hk): (usize, usize),
    causal: Causal,
    layout: Layout,
) -> [f64; 3] {
    let mut rng = Rng::fresh();
    let k_shape = Shape::new(q_shape.batch, sk, hk, q_shape.head_dim);
    let q = randn::<T>(&mut rng, &dims(q_shape, layout), layout);
    let k = randn::<T>(&mut rng, &dims(k_shape, layout), layout);
    let v = randn::<T>(&mut rng, &dims(k_shape, layout), layout);
    let dout = randn::<T>(&mut rng, &dims(q_shape, layout), layout);
    let opts = AttentionOptions::default().causal(causal).with_lse();
    let fwd = attention(&q, &k, &v, &opts).unwrap();
    let state = AttentionState {
        out: &fwd.out,
        lse: fwd.lse.as_ref().unwrap(),
    };
    let grads = attention_backward(&q, &k, &v, state, &dout, &opts).unwrap();
    assert_eq!(grads.execution.backend, BackendKind::Cpu);
    let scale = 1.0 / (q_shape.head_dim as f64).sqrt();
    let want = naive_backward([&q, &k, &v, &dout], scale, causal);
    let got = [&grads.dq, &grads.dk, &grads.dv].map(|t| logical(t));
    [0, 1, 2].map(|i| rel_l2(&got[i], &want[i]))
}

#[test]
fn gradients_match_the_definition() {
    let cases = [
        (
            Shape::new(2, 17, 4, 32),
            (23, 4),
            Causal::None,
            Layout::Bshd,
        ),
        (
            Shape::new(1, 33, 8, 64),
            (33, 2),
            Causal::TopLeft,
            Layout::Bhsd,
        ),
        (
            Shape::new(2, 9, 6, 16),
            (40, 1),
            Causal::BottomRight,
            Layout::Bshd,
        ),
        (
            Shape::new(1, 20, 2, 128),
            (12, 2),
            Causal::TopLeft,
            Layout::Bshd,
        ),
    ];
    for (q, kv, causal, layout) in cases {
        // The gradients come from the forward's f16 (bf16) output and are rounded once more:
        // measured 2.0-2.7e-4 (f16) and 1.7-2.1e-3 (bf16).
        let f = errors::<f16>(q, kv, causal, layout);
        assert!(
            f.iter().all(|e| *e < 1e-3),
            "f16 {q:?} {kv:?} {causal:?} {layout:?}: {f:?}"
        );
        let b = errors::<bf16>(q, kv, causal, layout);
        assert!(
            b.iter().all(|e| *e < 8e-3),
            "bf16 {q:?} {kv:?} {causal:?} {layout:?}: {b:?}"
        );
    }
}

/// Host f16 tensors of `dims` (BSHD), zero.
fn host(dims: &[usize]) -> Tensor<f16> {
    Tensor::full(f16::ZERO, dims, Layout::Bshd).unwrap()
}

/// The backward call's error for these operands: Q [2, 5, 4, 8], K and V [2, 7, 2, 8], the
/// forward output and its logsumexp, with `edit` changing one of them first.
fn refused(edit: impl FnOnce(&mut [Tensor<f16>; 7], &mut Tensor<f32>)) -> Error {
    let mut t = [
        host(&[2, 5, 4, 8]), // q
        host(&[2, 7, 2, 8]), // k
        host(&[2, 7, 2, 8]), // v
        host(&[2, 5, 4, 8]), // out
        host(&[2, 5, 4, 8]), // dout
        host(&[2, 5, 4, 8]), // dq
        host(&[2, 7, 2, 8]), // dk
    ];
    let mut lse = Tensor::full(0.0f32, &[2, 4, 5, 1], Layout::Bhsd).unwrap();
    edit(&mut t, &mut lse);
    let mut dv = host(&[2, 7, 2, 8]);
    let [q, k, v, out, dout, dq, dk] = &mut t;
    let state = AttentionState { out, lse: &lse };
    let grads = GradientsMut {
        dq,
        dk,
        dv: &mut dv,
    };
    let opts = AttentionOptions::default();
    attention_backward_into(q, k, v, state, dout, grads, &opts).unwrap_err()
}

#[test]
fn each_bad_operand_has_its_own_error() {
    let shape = |operand, dim, got, expected| Error::ShapeMismatch {
        operand,
        dim,
        got,
        expected,
    };
    let strided_dq = |t: &mut [Tensor<f16>; 7], _: &mut Tensor<f32>| {
        let data = vec![f16::ZERO; 2 * 5 * 4 * 16];
        let strides = [320, 64, 16, 2];
        t[5] = Tensor::from_vec_strided(data, Shape::new(2, 5, 4, 8), strides).unwrap();
    };
    let cases = [
        (
            "dout of 3 heads",
            refused(|t, _| t[4] = host(&[2, 5, 3, 8])),
            shape(Operand::DOut, "heads", 3, 4),
        ),
        (
            "dq of 6 queries",
            refused(|t, _| t[5] = host(&[2, 6, 4, 8])),
            shape(Operand::DQ, "seq", 6, 5),
        ),
        (
            "dk shaped like q",
            refused(|t, _| t[6] = host(&[2, 5, 4, 8])),
            shape(Operand::DK, "seq", 5, 7),
        ),
        (
            "out of head dim 16",
            refused(|t, _| t[3] = host(&[2, 5, 4, 16])),
            shape(Operand::Out, "head_dim", 16, 8),
        ),
        (
            "a logsumexp in BSHD",
            refused(|_, l| *l = Tensor::full(0.0, &[2, 5, 4, 1], Layout::Bshd).unwrap()),
            Error::LseLayout {
                operand: Operand::Lse,
            },
        ),
        (
            "a strided dq head dim",
            refused(strided_dq),
            Error::NonContiguousHeadDim {
                operand: Operand::DQ,
                stride: 2,
            },
        ),
    ];
    for (what, got, expected) in cases {
        assert_eq!(got, expected, "{what}");
    }
}

#[test]
fn host_tensors_run_on_the_cpu_only() {
    let mut rng = Rng::fresh();
    let q = randn::<f16>(&mut rng, &[1, 3, 2, 8], Layout::Bshd);
    let opts = AttentionOptions::default().with_lse();
    let fwd = attention(&q, &q, &q, &opts).unwrap();
    let state = AttentionState {
        out: &fwd.out,
        lse: fwd.lse.as_ref().unwrap(),
    };
    for kernel in Kernel::ALL {
        let forced = opts.clone().backend(Backend::Kernel(kernel));
        let e = attention_backward(&q, &q, &q, state, &q, &forced).unwrap_err();
        assert!(
            matches!(e, Error::BackendUnavailable { .. }),
            "{kernel:?}: {e:?}"
        );
    }
    let cpu = opts.backend(Backend::Cpu);
    let grads = attention_backward(&q, &q, &q, state, &q, &cpu).unwrap();
    assert_eq!(grads.execution.backend, BackendKind::Cpu);
}

#[test]
fn an_empty_problem_zeroes_dk_and_dv() {
    let mut rng = Rng::fresh();
    let q = host(&[1, 0, 2, 8]);
    let k = randn::<f16>(&mut rng, &[1, 4, 2, 8], Layout::Bshd);
    let lse = Tensor::full(0.0f32, &[1, 2, 0, 1], Layout::Bhsd).unwrap();
    let state = AttentionState { out: &q, lse: &lse };
    let (mut dq, mut dk, mut dv) = (
        host(&[1, 0, 2, 8]),
        randn::<f16>(&mut rng, &[1, 4, 2, 8], Layout::Bshd),
        randn::<f16>(&mut rng, &[1, 4, 2, 8], Layout::Bshd),
    );
    let grads = GradientsMut {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    attention_backward_into(&q, &k, &k, state, &q, grads, &AttentionOptions::default()).unwrap();
    assert!(logical(&dk).iter().chain(&logical(&dv)).all(|x| *x == 0.0));
}

/// A variable-length batch's gradients are, sequence by sequence, those of its own attention
/// (the naive definition on each sequence's tokens); a sequence without queries gets zero dK
/// and dV.
#[test]
fn variable_length_gradients_are_each_sequences() {
    let mut rng = Rng::fresh();
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        let (mut lq, lk) = random_lengths(&mut rng, 5, 40, 50, causal == Causal::BottomRight);
        lq[1] = 0;
        let (hq, hk, d) = (4, 2, 16);
        let batch = VarlenBatch::from_lengths(&lq, &lk).unwrap();
        let (tq, tk) = (lq.iter().sum::<usize>(), lk.iter().sum::<usize>());
        let q = randn::<f16>(&mut rng, &[1, tq, hq, d], Layout::Bshd);
        let k = randn::<f16>(&mut rng, &[1, tk, hk, d], Layout::Bshd);
        let v = randn::<f16>(&mut rng, &[1, tk, hk, d], Layout::Bshd);
        let dout = randn::<f16>(&mut rng, &[1, tq, hq, d], Layout::Bshd);
        let opts = AttentionOptions::default().causal(causal).with_lse();
        let fwd = match attention_varlen(&q, &k, &v, &batch, &opts) {
            Ok(f) => f,
            Err(Error::NoVisibleKeys { .. }) => continue, // top-left rows beyond a short sequence
            Err(e) => panic!("{e}"),
        };
        let state = AttentionState {
            out: &fwd.out,
            lse: fwd.lse.as_ref().unwrap(),
        };
        let grads = attention_varlen_backward(&q, &k, &v, &batch, state, &dout, &opts).unwrap();
        let (mut q0, mut k0) = (0, 0);
        for (&nq, &nk) in lq.iter().zip(&lk) {
            let (qr, kr) = (q0..q0 + nq, k0..k0 + nk);
            let slices = [&q, &k, &v, &dout].map(|t| {
                let r = if t.shape().heads == hq {
                    qr.clone()
                } else {
                    kr.clone()
                };
                tokens(t, r)
            });
            let [sq, sk, sv, sd] = &slices;
            let want = naive_backward([sq, sk, sv, sd], 1.0 / (d as f64).sqrt(), causal);
            let got = [
                tokens(&grads.dq, qr.clone()),
                tokens(&grads.dk, kr.clone()),
                tokens(&grads.dv, kr.clone()),
            ];
            for (name, (g, w)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                let g = logical(g);
                if w.iter().all(|x| *x == 0.0) {
                    assert!(
                        g.iter().all(|x| *x == 0.0),
                        "{causal:?} {lq:?} {lk:?}: {name}"
                    );
                } else {
                    let e = rel_l2(&g, w);
                    assert!(e < 1e-3, "{causal:?} {lq:?} {lk:?}: {name} {e}");
                }
            }
            (q0, k0) = (q0 + nq, k0 + nk);
        }
    }
}
