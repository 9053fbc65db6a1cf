//! Variable-length batches on the CPU (runs in CI): random batches against the naive formula
//! per sequence, equality with dense calls, and every validation error of the offsets.

mod common;

use common::{logical, lse_values, naive_varlen, randn, random_varlen, rel_l2, Rng};
use flashcore::{
    attention, attention_varlen, attention_varlen_into, AttentionElement, AttentionOptions, Causal,
    Error, Layout, OffsetRule, Operand, Tensor, VarlenBatch,
};
use half::{bf16, f16};

fn tolerance<T: AttentionElement>() -> f64 {
    if T::DTYPE == flashcore::DType::BF16 {
        8e-3
    } else {
        1e-3
    }
}

/// A random batch of `n` sequences against the naive formula, in `layout`.
fn random_batch<T: AttentionElement>(
    n: usize,
    heads: (usize, usize),
    d: usize,
    causal: Causal,
    layout: Layout,
) {
    let mut rng = Rng::fresh();
    let bottom_right = causal == Causal::BottomRight;
    let (batch, q, k, v) =
        random_varlen::<T>(&mut rng, n, (40, 50), heads, d, bottom_right, layout);
    let opts = AttentionOptions::default().causal(causal).with_lse();
    let res = attention_varlen(&q, &k, &v, &batch, &opts).unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let (want, want_lse) = naive_varlen(
        &q,
        &k,
        &v,
        batch.cu_seqlens_q(),
        batch.cu_seqlens_k(),
        scale,
        causal,
    );
    let what = format!(
        "offsets {:?} x {:?}, heads {heads:?}, d {d}, {causal:?}, {layout:?}",
        batch.cu_seqlens_q(),
        batch.cu_seqlens_k()
    );
    let err = rel_l2(&logical(&res.out), &want);
    assert!(err < tolerance::<T>(), "{what}: rel L2 {err:.2e}");
    let lse_err = rel_l2(&lse_values(res.lse.as_ref().unwrap()), &want_lse);
    assert!(lse_err < 1e-6, "{what}: lse rel L2 {lse_err:.2e}");
}

#[test]
fn random_batches_match_the_formula_per_sequence() {
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        for layout in [Layout::Bshd, Layout::Bhsd] {
            random_batch::<f16>(5, (4, 2), 32, causal, layout);
            random_batch::<bf16>(3, (3, 1), 16, causal, layout);
        }
    }
    random_batch::<f16>(1, (2, 2), 64, Causal::None, Layout::Bshd);
}

/// Sequences of equal lengths give exactly what a dense call over the same batch gives.
#[test]
fn equal_lengths_equal_a_dense_batch() {
    let mut rng = Rng::fresh();
    let (b, sq, sk, h, d) = (3, 7, 11, 4, 16);
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        let q: Tensor<f16> = randn(&mut rng, &[b, sq, h, d], Layout::Bshd);
        let k: Tensor<f16> = randn(&mut rng, &[b, sk, 2, d], Layout::Bshd);
        let v: Tensor<f16> = randn(&mut rng, &[b, sk, 2, d], Layout::Bshd);
        let opts = AttentionOptions::default().causal(causal).with_lse();
        let dense = attention(&q, &k, &v, &opts).unwrap();
        // The same memory seen as one packed batch entry (BSHD: batch b is tokens b*s..).
        let pack = |t: &Tensor<f16>, s: usize, heads: usize| {
            Tensor::from_vec(
                t.host_data().unwrap().to_vec(),
                &[1, b * s, heads, d],
                Layout::Bshd,
            )
            .unwrap()
        };
        let batch = VarlenBatch::from_lengths(&[sq; 3], &[sk; 3]).unwrap();
        let res = attention_varlen(
            &pack(&q, sq, h),
            &pack(&k, sk, 2),
            &pack(&v, sk, 2),
            &batch,
            &opts,
        )
        .unwrap();
        assert_eq!(
            res.out.host_data().unwrap(),
            dense.out.host_data().unwrap(),
            "{causal:?}: outputs"
        );
        // Dense lse is [b][h][s]; packed lse is [h][b*s + i].
        let (dl, vl) = (
            lse_values(dense.lse.as_ref().unwrap()),
            lse_values(res.lse.as_ref().unwrap()),
        );
        for bi in 0..b {
            for hi in 0..h {
                for i in 0..sq {
                    assert_eq!(dl[(bi * h + hi) * sq + i], vl[hi * b * sq + bi * sq + i]);
                }
            }
        }
    }
}

/// A sequence without queries writes nothing; one without keys is fine when it has no queries.
#[test]
fn empty_sequences() {
    let mut rng = Rng::fresh();
    let batch = VarlenBatch::from_lengths(&[0, 3, 0, 2], &[5, 4, 0, 2]).unwrap();
    let q: Tensor<bf16> = randn(&mut rng, &[1, 5, 2, 8], Layout::Bshd);
    let k: Tensor<bf16> = randn(&mut rng, &[1, 11, 2, 8], Layout::Bshd);
    let v: Tensor<bf16> = randn(&mut rng, &[1, 11, 2, 8], Layout::Bshd);
    let opts = AttentionOptions::default().causal(Causal::BottomRight);
    let res = attention_varlen(&q, &k, &v, &batch, &opts).unwrap();
    let (want, _) = naive_varlen(
        &q,
        &k,
        &v,
        batch.cu_seqlens_q(),
        batch.cu_seqlens_k(),
        1.0 / 8f64.sqrt(),
        opts.causal,
    );
    assert!(rel_l2(&logical(&res.out), &want) < 8e-3);
    // No sequences at all: nothing to do.
    let none = VarlenBatch::from_lengths(&[], &[]).unwrap();
    let q0: Tensor<bf16> = Tensor::full(bf16::ZERO, &[1, 0, 2, 8], Layout::Bshd).unwrap();
    let k0: Tensor<bf16> = Tensor::full(bf16::ZERO, &[1, 0, 2, 8], Layout::Bshd).unwrap();
    assert!(attention_varlen(&q0, &k0, &k0, &none, &opts).is_ok());
}

fn tensors(tq: usize, tk: usize) -> (Tensor<f16>, Tensor<f16>, Tensor<f16>, Tensor<f16>) {
    let mut rng = Rng::fresh();
    (
        randn(&mut rng, &[1, tq, 4, 16], Layout::Bshd),
        randn(&mut rng, &[1, tk, 2, 16], Layout::Bshd),
        randn(&mut rng, &[1, tk, 2, 16], Layout::Bshd),
        Tensor::full(f16::ZERO, &[1, tq, 4, 16], Layout::Bshd).unwrap(),
    )
}

fn run(batch: &VarlenBatch, tq: usize, tk: usize, causal: Causal) -> Result<(), Error> {
    let (q, k, v, mut out) = tensors(tq, tk);
    let opts = AttentionOptions::default().causal(causal);
    attention_varlen_into(&q, &k, &v, batch, &mut out, None, &opts).map(|_| ())
}

#[test]
fn offsets_that_break_a_rule_are_refused() {
    let k = vec![0, 4, 8];
    let cases = [
        (vec![1, 3, 6], OffsetRule::FirstNotZero, Some(0), 1),
        (vec![0, 4, 3], OffsetRule::Decreasing, Some(2), 3),
        (vec![0, 3, 5], OffsetRule::LastNotTokenCount, Some(2), 5),
    ];
    for (cu_q, rule, index, value) in cases {
        let batch = VarlenBatch::from_offsets(cu_q.clone(), k.clone()).unwrap();
        let err = run(&batch, 6, 8, Causal::None).unwrap_err();
        assert!(
            matches!(err, Error::InvalidOffsets { operand: Operand::CuSeqlensQ, rule: r, index: i, value: x, .. }
                if r == rule && i == index && x == value),
            "{cu_q:?}: {err}"
        );
    }
    let batch = VarlenBatch::from_offsets(vec![0, 3, 6], vec![0, 4, 7]).unwrap();
    let err = run(&batch, 6, 8, Causal::None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOffsets {
                operand: Operand::CuSeqlensK,
                rule: OffsetRule::LastNotTokenCount,
                bound: 8,
                ..
            }
        ),
        "keys short of the token count: {err}"
    );
    let batch = VarlenBatch::from_offsets(vec![0, 3, 6], vec![0, 8]).unwrap();
    let err = run(&batch, 6, 8, Causal::None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ShapeMismatch {
                operand: Operand::CuSeqlensK,
                got: 1,
                expected: 2,
                ..
            }
        ),
        "offsets of other sequence counts: {err}"
    );
    assert!(matches!(
        VarlenBatch::from_offsets(vec![], vec![0]).unwrap_err(),
        Error::ShapeMismatch {
            operand: Operand::CuSeqlensQ,
            ..
        }
    ));
    let err = VarlenBatch::from_lengths(&[usize::MAX / 2, usize::MAX / 2], &[1, 1]).unwrap_err();
    assert!(matches!(err, Error::IndexOverflow { .. }), "{err}");
}

#[test]
fn sequences_whose_queries_see_no_key_are_refused() {
    // Bottom-right: the second sequence has 4 queries on 3 keys.
    let batch = VarlenBatch::from_lengths(&[2, 4], &[5, 3]).unwrap();
    let err = run(&batch, 6, 8, Causal::BottomRight).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NoVisibleKeys {
                rows: 1,
                seq_q: 4,
                seq_k: 3
            }
        ),
        "{err}"
    );
    assert!(
        run(&batch, 6, 8, Causal::TopLeft).is_ok(),
        "top-left: every row sees key 0"
    );
    // Queries on no keys at all.
    let batch = VarlenBatch::from_lengths(&[2, 4], &[8, 0]).unwrap();
    let err = run(&batch, 6, 8, Causal::None).unwrap_err();
    assert!(matches!(err, Error::NoVisibleKeys { rows: 4, .. }), "{err}");
}

#[test]
fn packed_tensors_have_one_batch_entry() {
    let mut rng = Rng::fresh();
    let batch = VarlenBatch::from_lengths(&[2, 2], &[3, 3]).unwrap();
    let q: Tensor<f16> = randn(&mut rng, &[2, 2, 4, 16], Layout::Bshd);
    let k: Tensor<f16> = randn(&mut rng, &[2, 3, 2, 16], Layout::Bshd);
    let err = attention_varlen(&q, &k, &k, &batch, &AttentionOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ShapeMismatch {
                operand: Operand::Q,
                dim: "batch",
                got: 2,
                expected: 1
            }
        ),
        "{err}"
    );
    // The logsumexp is per token: [1, heads, total_q].
    let (q, k, v, mut out) = tensors(4, 6);
    let mut lse = Tensor::full(0f32, &[2, 4, 2, 1], Layout::Bhsd).unwrap();
    let err = attention_varlen_into(
        &q,
        &k,
        &v,
        &batch,
        &mut out,
        Some(&mut lse),
        &AttentionOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ShapeMismatch {
                operand: Operand::Lse,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn forcing_a_gpu_kernel_on_host_tensors_is_refused() {
    let batch = VarlenBatch::from_lengths(&[2, 2], &[3, 3]).unwrap();
    let (q, k, v, mut out) = tensors(4, 6);
    let opts = AttentionOptions::default()
        .backend(flashcore::Backend::Kernel(flashcore::plan::Kernel::Wmma));
    let err = attention_varlen_into(&q, &k, &v, &batch, &mut out, None, &opts).unwrap_err();
    assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
}
