//! Prepared calls on the CPU (runs in CI): a plan runs like `attention_into` on new data, and
//! refuses operands that differ from the plan before running anything.

mod common;

use common::{dims, logical, randn, Rng};
use flashcore::plan::Kernel;
use flashcore::{
    attention_into, attention_paged, attention_varlen, AttentionOptions, AttentionPlan, Backend,
    BackendKind, Causal, Error, Layout, Operand, PageTable, Shape, Tensor, VarlenBatch,
};
use half::{bf16, f16};

#[test]
fn a_plan_runs_like_attention_into_on_new_data() {
    let (qs, ks) = (Shape::new(2, 9, 4, 16), Shape::new(2, 13, 2, 16));
    let opts = AttentionOptions::default()
        .causal(Causal::BottomRight)
        .with_lse();
    let mut rng = Rng::fresh();
    let fresh = |rng: &mut Rng| {
        (
            randn::<bf16>(rng, &dims(qs, Layout::Bhsd), Layout::Bhsd),
            randn::<bf16>(rng, &dims(ks, Layout::Bshd), Layout::Bshd),
            randn::<bf16>(rng, &dims(ks, Layout::Bshd), Layout::Bshd),
        )
    };
    let (q, k, v) = fresh(&mut rng);
    let zeros = |d: [usize; 4], l| Tensor::full(bf16::ZERO, &d, l).unwrap();
    let mut out = zeros(dims(qs, Layout::Bshd), Layout::Bshd);
    let mut lse = Tensor::full(0f32, &[2, 4, 9, 1], Layout::Bhsd).unwrap();
    let plan = AttentionPlan::new(&q, &k, &v, &out, Some(&lse), &opts).unwrap();
    assert_eq!(plan.execution().backend, BackendKind::Cpu);
    for layer in 0..3 {
        let (q, k, v) = fresh(&mut rng); // new data and buffers, the planned dims and strides
        let ran = plan.run(&q, &k, &v, &mut out, Some(&mut lse)).unwrap();
        assert_eq!(ran, plan.execution());
        let mut want = zeros(dims(qs, Layout::Bshd), Layout::Bshd);
        let mut want_lse = Tensor::full(0f32, &[2, 4, 9, 1], Layout::Bhsd).unwrap();
        attention_into(&q, &k, &v, &mut want, Some(&mut want_lse), &opts).unwrap();
        assert_eq!(logical(&out), logical(&want), "layer {layer}");
        assert_eq!(lse.host_data(), want_lse.host_data());
    }
}

#[test]
fn a_plan_refuses_other_operands() {
    let t = |d: &[usize], l| Tensor::full(f16::ZERO, d, l).unwrap();
    let q = t(&[1, 8, 4, 32], Layout::Bshd);
    let mut out = t(&[1, 8, 4, 32], Layout::Bshd);
    let plan = AttentionPlan::new(&q, &q, &q, &out, None, &Default::default()).unwrap();

    let longer = t(&[1, 9, 4, 32], Layout::Bshd);
    let e = plan.run(&longer, &q, &q, &mut out, None).unwrap_err();
    assert_eq!(e, Error::PlanMismatch(Operand::Q));
    let bhsd = t(&[1, 4, 8, 32], Layout::Bhsd); // same dims, other strides
    let e = plan.run(&q, &bhsd, &q, &mut out, None).unwrap_err();
    assert_eq!(e, Error::PlanMismatch(Operand::K));
    let mut lse = Tensor::full(0f32, &[1, 4, 8, 1], Layout::Bhsd).unwrap();
    let e = plan.run(&q, &q, &q, &mut out, Some(&mut lse)).unwrap_err();
    assert_eq!(e, Error::PlanMismatch(Operand::Lse));
    let mut other_out = t(&[1, 8, 4, 32], Layout::Bhsd);
    let e = plan.run(&q, &q, &q, &mut other_out, None).unwrap_err();
    assert_eq!(e, Error::PlanMismatch(Operand::Out));

    // Planning fails as attention_into would, and names the same error.
    let odd = t(&[1, 8, 4, 12], Layout::Bshd);
    let e = AttentionPlan::new(&odd, &odd, &odd, &odd, None, &Default::default()).unwrap_err();
    assert_eq!(e, Error::UnsupportedHeadDim(12));
    let gpu = AttentionOptions::default().backend(Backend::Kernel(Kernel::Wmma));
    let e = AttentionPlan::new(&q, &q, &q, &out, None, &gpu).unwrap_err();
    assert!(matches!(e, Error::BackendUnavailable { .. }), "{e:?}");
}

/// A plan made for a batch composition (a variable-length batch, a paged cache's table) runs
/// each layer's operands like the direct call, bit for bit, validating the composition once;
/// a layer whose operands differ from the plan is refused.
#[test]
fn plans_for_varlen_batches_and_paged_caches_run_like_the_direct_calls() {
    let mut rng = Rng::fresh();
    let opts = AttentionOptions::default()
        .causal(Causal::BottomRight)
        .with_lse();
    // Variable-length: two layers of new data on one plan.
    let batch = VarlenBatch::from_lengths(&[3, 0, 7], &[5, 2, 9]).unwrap();
    let packed = |rng: &mut Rng, n, h| randn::<f16>(rng, &[1, n, h, 16], Layout::Bshd);
    let (q0, k0) = (packed(&mut rng, 10, 4), packed(&mut rng, 16, 2));
    let mut out = Tensor::full(f16::ZERO, &[1, 10, 4, 16], Layout::Bshd).unwrap();
    let mut lse = Tensor::full(0f32, &[1, 4, 10, 1], Layout::Bhsd).unwrap();
    let plan = AttentionPlan::new_varlen(&q0, &k0, &k0, &batch, &out, Some(&lse), &opts).unwrap();
    for _layer in 0..2 {
        let (q, k, v) = (
            packed(&mut rng, 10, 4),
            packed(&mut rng, 16, 2),
            packed(&mut rng, 16, 2),
        );
        plan.run(&q, &k, &v, &mut out, Some(&mut lse)).unwrap();
        let want = attention_varlen(&q, &k, &v, &batch, &opts).unwrap();
        assert_eq!(out.host_data(), want.out.host_data());
        assert_eq!(lse.host_data(), want.lse.unwrap().host_data());
    }
    let longer = packed(&mut rng, 17, 2);
    let err = plan.run(&q0, &longer, &longer, &mut out, Some(&mut lse));
    assert_eq!(err.unwrap_err(), Error::PlanMismatch(Operand::K));

    // Paged: two layers' caches through one table.
    let pages = PageTable::new(16, vec![vec![2, 0], vec![1, 3, 4]], vec![20, 40]).unwrap();
    let cache = |rng: &mut Rng| randn::<f16>(rng, &[5, 16, 2, 16], Layout::Bshd);
    let q = randn::<f16>(&mut rng, &[2, 3, 4, 16], Layout::Bshd);
    let mut out = Tensor::full(f16::ZERO, &[2, 3, 4, 16], Layout::Bshd).unwrap();
    let (k, v) = (cache(&mut rng), cache(&mut rng));
    let plan = AttentionPlan::new_paged(&q, &k, &v, &pages, &out, None, &opts).unwrap();
    for _layer in 0..2 {
        let (k, v) = (cache(&mut rng), cache(&mut rng));
        plan.run(&q, &k, &v, &mut out, None).unwrap();
        let want = attention_paged(&q, &k, &v, &pages, &opts).unwrap();
        assert_eq!(out.host_data(), want.out.host_data());
    }
    // A bad table is refused when planning, like the direct call refuses it.
    let bad = PageTable::new(16, vec![vec![2, 0], vec![1, 3, 9]], vec![20, 40]).unwrap();
    let err = AttentionPlan::new_paged(&q, &k, &v, &bad, &out, None, &opts).unwrap_err();
    assert!(matches!(err, Error::InvalidPageTable { .. }), "{err}");
}
