//! cudarc interop on the GPU (feature `cudarc`): cudarc allocates and owns the memory and the
//! stream, flashcore computes on them without copying, and the slice goes back to cudarc.
//! Ignored by default; fails (never passes silently) without a CUDA device.
#![cfg(feature = "cudarc")]

mod common;

use common::{dims, logical, naive, randn, rel_l2, Rng};
use cudarc::driver::CudaContext;
use flashcore::{attention_into, AttentionOptions, Causal, Layout, Shape, Stream, Tensor};
use half::f16;

#[test]
#[ignore = "needs a CUDA device"]
fn cudarc_slices_and_streams_without_copies() {
    common::watchdog::arm();
    let ctx = CudaContext::new(0).expect("this test needs a CUDA device");
    let cu_stream = ctx.new_stream().unwrap();
    let mut rng = Rng::fresh();
    let layout = Layout::Bhsd;
    let (qs, ks) = (Shape::new(2, 96, 8, 64), Shape::new(2, 160, 4, 64));
    let inputs = [qs, ks, ks].map(|s| randn::<f16>(&mut rng, &dims(s, layout), layout));
    let to_tensor = |t: &Tensor<f16>| {
        let slice = cu_stream.clone_htod(t.host_data().unwrap()).unwrap();
        Tensor::from_cudarc(slice, t.shape(), t.strides()).unwrap()
    };
    let [q, k, v] = inputs.each_ref().map(to_tensor);
    let poisoned = vec![f16::NAN; qs.numel().unwrap()];
    let out_slice = cu_stream.clone_htod(&poisoned).unwrap();
    let mut out = Tensor::from_cudarc(out_slice, qs, qs.strides(layout).unwrap()).unwrap();
    // Shapes that address more than the slice holds are refused.
    let short = cu_stream.clone_htod(&poisoned[..10]).unwrap();
    assert!(Tensor::from_cudarc(short, qs, qs.strides(layout).unwrap()).is_err());

    let opts = AttentionOptions::default().causal(Causal::BottomRight);
    attention_into(&q, &k, &v, &mut out, None, &opts).unwrap();
    // The stream is cudarc's: the result is read back by cudarc, after flashcore's kernel.
    assert!(Stream::from_cudarc(&cu_stream)
        .unwrap()
        .same_as(out.stream().unwrap()));
    let out_slice = out
        .into_cudarc()
        .expect("a cudarc tensor gives its slice back");
    let host: Vec<f16> = cu_stream.clone_dtoh(&out_slice).unwrap();
    cu_stream.synchronize().unwrap();
    let got = logical(&Tensor::from_vec_strided(host, qs, qs.strides(layout).unwrap()).unwrap());
    let [hq, hk, hv] = &inputs;
    let (want, _) = naive(hq, hk, hv, 1.0 / 8.0, Causal::BottomRight);
    let err = rel_l2(&got, &want);
    println!("cudarc memory and stream: rel L2 {err:.2e}");
    assert!(err < 2e-3, "rel L2 {err}");
}
