//! Prepared calls on the CPU (runs in CI): a plan runs like `attention_into` on new data, and
//! refuses operands that differ from the plan before running anything.

mod common;

use common::{dims, logical, randn, Rng};
use flashcore::plan::Kernel;
use flashcore::{
    attention_into, AttentionOptions, AttentionPlan, Backend, BackendKind, Causal, Error, Layout,
    Operand, Shape, Tensor,
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
