//! The fuzz driver (issue 14): arbitrary bytes become calls of the public API on host tensors —
//! shapes, strides, layouts, dtypes, options, offsets, states and the data itself, NaN and
//! infinities included. Every call must return (Ok or a typed error): no panic, abort, hang or
//! UB. When all inputs are finite and the call succeeds, every output must be finite.
//!
//! Shared by the coverage-guided target (`fuzz/fuzz_targets/api.rs`, `cargo +nightly fuzz run
//! api`) and the stable replay test (`tests/fuzz_replay.rs`, in CI). Sizes are small so that one
//! input runs in microseconds; broadcast (stride 0) and huge strides reach the overflow checks.

use flashcore::{
    attention, attention_backward, attention_backward_into, attention_into, attention_varlen,
    merge_states, AttentionElement, AttentionOptions, AttentionPlan, AttentionState, Backend,
    Causal, GradientsMut, Layout, Shape, Tensor, VarlenBatch,
};
use half::{bf16, f16};

/// The input, read a byte at a time (zeros once it runs out).
pub struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes(data)
    }
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn pick(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }
    fn f32(&mut self) -> f32 {
        f32::from_bits(u32::from(self.u16()) | u32::from(self.u16()) << 16)
    }
}

/// Elements a view of `shape` and `strides` addresses, or None beyond `cap`.
fn needed(shape: Shape, strides: [usize; 4], cap: usize) -> Option<usize> {
    let dims = shape.as_array();
    if dims.contains(&0) {
        return Some(0);
    }
    let mut last = 0usize;
    for (n, s) in dims.iter().zip(strides) {
        last = last.checked_add((n - 1).checked_mul(s)?)?;
    }
    (last < cap).then_some(last + 1)
}

/// A host tensor of `shape`: dense in a layout, or with one stride bent (0, +1, doubled or
/// huge); values from the input (raw bit patterns: NaN and infinities included) or normal-sized.
fn tensor<T: AttentionElement>(
    r: &mut Bytes,
    shape: Shape,
    finite: &mut bool,
) -> Option<Tensor<T>> {
    let layout = if r.pick(2) == 0 {
        Layout::Bshd
    } else {
        Layout::Bhsd
    };
    let mut strides = shape.strides(layout).ok()?;
    match r.pick(6) {
        0 => strides[r.pick(4)] = 0,
        1 => strides[r.pick(4)] += 1,
        2 => strides[r.pick(4)] *= 2,
        3 => strides[r.pick(4)] = usize::MAX / 3,
        _ => {}
    }
    let raw_bits = r.pick(4) == 0;
    match needed(shape, strides, 1 << 15) {
        Some(len) => {
            let data = (0..len)
                .map(|i| {
                    let bits = r.u16();
                    let x = if raw_bits {
                        T::from_f64(f64::from(f16::from_bits(bits)))
                    } else {
                        T::from_f64(f64::from(bits % 2001) / 1000.0 - 1.0 + (i % 3) as f64)
                    };
                    *finite &= x.to_f64().is_finite();
                    x
                })
                .collect();
            Tensor::from_vec_strided(data, shape, strides).ok()
        }
        // Too large to hold: the constructor must refuse it (StorageTooSmall / SizeOverflow).
        None => {
            assert!(Tensor::<T>::from_vec_strided(vec![], shape, strides).is_err());
            None
        }
    }
}

fn options(r: &mut Bytes) -> (AttentionOptions, bool) {
    let causal = [Causal::None, Causal::TopLeft, Causal::BottomRight][r.pick(3)];
    let mut opts = AttentionOptions::default().causal(causal);
    let mut finite = true;
    if r.pick(3) == 0 {
        let scale = r.f32();
        finite = scale.is_finite();
        opts.scale = Some(scale);
    }
    if r.pick(2) == 0 {
        opts = opts.with_lse();
    }
    opts = opts.backend(match r.pick(4) {
        0 => Backend::Cpu,
        1 => Backend::Kernel(flashcore::plan::Kernel::Wmma),
        _ => Backend::Auto,
    });
    (opts, finite)
}

fn small_shape(r: &mut Bytes, heads: usize) -> Shape {
    const DIMS: [usize; 8] = [8, 16, 64, 0, 7, 72, 264, 32];
    Shape::new(r.pick(4), r.pick(24), heads, DIMS[r.pick(8)])
}

fn check_finite<T: AttentionElement>(t: &Tensor<T>) {
    if let Some(data) = t.host_data() {
        let s = t.shape();
        for b in 0..s.batch {
            for i in 0..s.seq {
                for h in 0..s.heads {
                    for x in 0..s.head_dim {
                        let v = data[t.offset(b, i, h, x)].to_f64();
                        assert!(v.is_finite(), "non-finite output from finite inputs");
                    }
                }
            }
        }
    }
}

fn dense<T: AttentionElement>(r: &mut Bytes) {
    let (hq, hk) = (r.pick(5), r.pick(5));
    let qs = small_shape(r, hq);
    let mut ks = small_shape(r, hk);
    if r.pick(4) != 0 {
        ks.batch = qs.batch; // mostly consistent shapes, so the kernels run
        ks.head_dim = qs.head_dim;
    }
    let mut finite = true;
    let (Some(q), Some(k), Some(v)) = (
        tensor::<T>(r, qs, &mut finite),
        tensor::<T>(r, ks, &mut finite),
        tensor::<T>(r, ks, &mut finite),
    ) else {
        return;
    };
    let (opts, scale_ok) = options(r);
    match r.pick(3) {
        0 => {
            if let Ok(res) = attention(&q, &k, &v, &opts) {
                if finite && scale_ok {
                    check_finite(&res.out);
                }
            }
        }
        1 => {
            let mut ignored = true;
            if let Some(mut out) = tensor::<T>(r, qs, &mut ignored) {
                let _ = attention_into(&q, &k, &v, &mut out, None, &opts);
            }
        }
        _ => {
            let Ok(mut out) = Tensor::full(T::from_f64(0.0), &qs.as_array(), Layout::Bshd) else {
                return;
            };
            if let Ok(plan) = AttentionPlan::new(&q, &k, &v, &out, None, &opts) {
                let _ = plan.run(&q, &k, &v, &mut out, None);
                let _ = plan.run(&k, &k, &v, &mut out, None); // other operands: refused
            }
        }
    }
}

fn varlen<T: AttentionElement>(r: &mut Bytes) {
    let n = r.pick(5);
    let offsets = |r: &mut Bytes| -> Vec<i32> {
        let mut v = vec![0i32];
        for _ in 0..n {
            let step = i32::from(r.u8() % 12) - i32::from(r.pick(8) == 0) * 20;
            v.push(v.last().unwrap().saturating_add(step));
        }
        if r.pick(6) == 0 {
            v[0] = i32::from(r.u8()) - 128;
        }
        v
    };
    let (cu_q, cu_k) = (offsets(r), offsets(r));
    let (tq, tk) = (
        cu_q.last().map_or(0, |&x| x.max(0) as usize) + r.pick(2),
        cu_k.last().map_or(0, |&x| x.max(0) as usize) + r.pick(2),
    );
    let Ok(batch) = VarlenBatch::from_offsets(cu_q, cu_k) else {
        return;
    };
    let (hq, hk) = (1 + r.pick(4), 1 + r.pick(2));
    let d = [8, 16, 24][r.pick(3)];
    let mut finite = true;
    let (Some(q), Some(k), Some(v)) = (
        tensor::<T>(r, Shape::new(1, tq, hq, d), &mut finite),
        tensor::<T>(r, Shape::new(1, tk, hk, d), &mut finite),
        tensor::<T>(r, Shape::new(1, tk, hk, d), &mut finite),
    ) else {
        return;
    };
    let (opts, scale_ok) = options(r);
    if let Ok(res) = attention_varlen(&q, &k, &v, &batch, &opts) {
        if finite && scale_ok {
            check_finite(&res.out);
        }
    }
}

/// A logsumexp for `shape`'s rows: dense BHSD, values from the input (-inf and raw bit patterns
/// among them).
fn lse(r: &mut Bytes, shape: Shape) -> Option<Tensor<f32>> {
    let dims = [shape.batch, shape.heads, shape.seq, 1];
    let values = (0..dims.iter().product::<usize>())
        .map(|_| match r.pick(8) {
            0 => f32::NEG_INFINITY,
            1 => r.f32(),
            _ => f32::from(r.u8()) / 16.0 - 8.0,
        })
        .collect();
    Tensor::from_vec(values, &dims, Layout::Bhsd).ok()
}

/// The backward pass (the bytes left after the call `run` chose): the forward call's own state
/// or an arbitrary one, the output's gradient, allocated or bent gradient tensors.
fn backward<T: AttentionElement>(r: &mut Bytes) {
    let (hq, hk) = (r.pick(5), r.pick(5));
    let qs = small_shape(r, hq);
    let mut ks = small_shape(r, hk);
    if r.pick(4) != 0 {
        ks.batch = qs.batch;
        ks.head_dim = qs.head_dim;
    }
    let mut finite = true;
    let (Some(q), Some(k), Some(v), Some(dout)) = (
        tensor::<T>(r, qs, &mut finite),
        tensor::<T>(r, ks, &mut finite),
        tensor::<T>(r, ks, &mut finite),
        tensor::<T>(r, qs, &mut finite),
    ) else {
        return;
    };
    let opts = options(r).0.with_lse();
    let (out, lse) = match attention(&q, &k, &v, &opts) {
        Ok(f) if r.pick(3) != 0 => match f.lse {
            Some(l) => (f.out, l),
            None => return,
        },
        _ => match (tensor::<T>(r, qs, &mut finite), lse(r, qs)) {
            (Some(o), Some(l)) => (o, l),
            _ => return,
        },
    };
    let state = AttentionState {
        out: &out,
        lse: &lse,
    };
    if r.pick(2) == 0 {
        let _ = attention_backward(&q, &k, &v, state, &dout, &opts);
    } else if let (Some(mut dq), Some(mut dk), Some(mut dv)) = (
        tensor::<T>(r, qs, &mut finite),
        tensor::<T>(r, ks, &mut finite),
        tensor::<T>(r, ks, &mut finite),
    ) {
        let grads = GradientsMut {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        let _ = attention_backward_into(&q, &k, &v, state, &dout, grads, &opts);
    }
}

fn merge<T: AttentionElement>(r: &mut Bytes) {
    let count = [1, 2, 3, 0, 65][r.pick(5)];
    let heads = 1 + r.pick(3);
    let shape = small_shape(r, heads);
    let mut finite = true;
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    for _ in 0..count.min(3) {
        let Some(o) = tensor::<T>(r, shape, &mut finite) else {
            return;
        };
        let Some(l) = lse(r, shape) else {
            return;
        };
        outs.push(o);
        lses.push(l);
    }
    let mut states: Vec<AttentionState<'_, T>> = outs
        .iter()
        .zip(&lses)
        .map(|(out, lse)| AttentionState { out, lse })
        .collect();
    if count == 65 {
        let first = states[0];
        states.resize(65, first);
    } else if count == 0 {
        states.clear();
    }
    let Ok(mut out) = Tensor::full(T::from_f64(0.0), &shape.as_array(), Layout::Bshd) else {
        return;
    };
    let _ = merge_states(&states, &mut out, None);
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut r = Bytes::new(data);
    let bf = r.pick(2) == 0;
    match (r.pick(3), bf) {
        (0, false) => dense::<f16>(&mut r),
        (0, true) => dense::<bf16>(&mut r),
        (1, false) => varlen::<f16>(&mut r),
        (1, true) => varlen::<bf16>(&mut r),
        (_, false) => merge::<f16>(&mut r),
        (_, true) => merge::<bf16>(&mut r),
    }
    // The bytes left (zeros once they run out) drive a backward call, so that the corpus keeps
    // reaching what it reached before.
    if bf {
        backward::<bf16>(&mut r);
    } else {
        backward::<f16>(&mut r);
    }
}
