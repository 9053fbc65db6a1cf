//! Every public type is `Send` and `Sync` (the reasons are in the crate docs, "Threads"), but
//! `Graph`, which is `Send` only (CUDA serialises an executable graph's launches; its doc test
//! checks that it is not `Sync`): this file stops compiling if a change takes either away.

use flashcore::{
    AttentionOptions, AttentionOutput, AttentionPlan, AttentionState, Backend, Error, Execution,
    Layout, Shape, Tensor, VarlenBatch,
};
use half::{bf16, f16};

fn send_sync<T: Send + Sync>() {}
#[cfg(feature = "cuda")]
fn send<T: Send>() {}

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Tensor<f16>>();
    send_sync::<Tensor<bf16>>();
    send_sync::<Tensor<f32>>();
    send_sync::<AttentionOutput<f16>>();
    send_sync::<AttentionPlan<bf16>>();
    send_sync::<AttentionState<'static, f16>>();
    send_sync::<VarlenBatch>();
    send_sync::<flashcore::PageTable>();
    send_sync::<AttentionOptions>();
    send_sync::<Backend>();
    send_sync::<Execution>();
    send_sync::<Error>();
    send_sync::<Shape>();
    send_sync::<Layout>();
    #[cfg(feature = "cuda")]
    {
        send_sync::<flashcore::Stream>();
        send_sync::<flashcore::Event>();
        send_sync::<flashcore::Device>();
        send_sync::<flashcore::Capture>();
        send::<flashcore::Graph>();
    }
}

/// A tensor shared by threads is read by all of them (here: the same inputs of several CPU calls
/// on different outputs), with the results of one thread.
#[test]
fn shared_inputs_give_the_same_results_on_every_thread() {
    let data: Vec<f16> = (0..2 * 16 * 2 * 8)
        .map(|i| f16::from_f32(((i * 37) % 11) as f32 / 11.0 - 0.5))
        .collect();
    let x = Tensor::from_vec(data, &[2, 16, 2, 8], Layout::Bshd).unwrap();
    let opts = AttentionOptions::default();
    let single = flashcore::attention(&x, &x, &x, &opts).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| flashcore::attention(&x, &x, &x, &opts).unwrap()))
            .collect();
        for h in handles {
            let res = h.join().unwrap();
            assert_eq!(res.out.host_data(), single.out.host_data());
        }
    });
}
