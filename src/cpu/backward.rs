//! The gradients of attention on the CPU, accumulated in f64: for each query row `i` and visible
//! key `j` of a head, with the forward call's logsumexp `lse` and output `O`,
//!
//! ```text
//! P_ij = exp(s_ij - lse_i)          D_i = dO_i . O_i          dP_ij = dO_i . V_j
//! dS_ij = P_ij (dP_ij - D_i) s'_ij  (s'_ij: the score's derivative in the dot product q_i . k_j)
//! dQ_i = sum_j dS_ij K_j            dK_j = sum_i dS_ij Q_i    dV_j = sum_i P_ij dO_i
//! ```
//!
//! summed over the query heads that share a key/value head (GQA). A row whose logsumexp is
//! `-inf` saw no key: its probabilities are 0.

use super::{dot, read_row, varlen_sequences, write_row, At, Head, RowBuffers};
use crate::element::Element;
use crate::error::Result;
use crate::tensor::{host_vec, Tensor};
use crate::validate::Problem;
use crate::varlen::VarlenBatch;

/// The operands of a backward call on host tensors: the forward call's inputs, output and
/// logsumexp, and the gradient of its output.
pub(crate) struct BackwardOperands<'a, T: Element> {
    pub q: &'a Tensor<T>,
    pub k: &'a Tensor<T>,
    pub v: &'a Tensor<T>,
    pub out: &'a Tensor<T>,
    pub lse: &'a Tensor<f32>,
    pub dout: &'a Tensor<T>,
}

/// The f64 rows of one (batch entry, kv head): K and V (in `rows`), and the gradients of K and
/// V summed over its query heads; and one query row's dQ and dO.
struct Buffers {
    rows: RowBuffers,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dq: Vec<f64>,
    dout: Vec<f64>,
}

/// Writes the gradients of attention (`p`, validated, on host tensors; a variable-length batch
/// with `batch`) with respect to Q, K and V into `dq`, `dk` and `dv` (every element). Fails
/// only when the host cannot hold one kv head's K, V and their gradients in f64.
pub(crate) fn attention_backward<T: Element>(
    p: &Problem,
    batch: Option<&VarlenBatch>,
    x: &BackwardOperands<'_, T>,
    grads: [&mut Tensor<T>; 3],
) -> Result<()> {
    match batch {
        Some(b) => each_sequence(p, x, grads, varlen_sequences(p, b)),
        None => each_sequence(p, x, grads, (0..p.batch).map(|b| (p.clone(), At::entry(b)))),
    }
}

/// The gradients of each (sequence's problem, where it starts) of `sequences`, with one set of
/// buffers sized by `p` (whose seq_k is the longest sequence's).
fn each_sequence<'a, T: Element>(
    p: &Problem,
    x: &BackwardOperands<'_, T>,
    [dq, dk, dv]: [&mut Tensor<T>; 3],
    sequences: impl IntoIterator<Item = (Problem, At<'a>)>,
) -> Result<()> {
    let d = p.head_dim;
    let rows = p.seq_k.saturating_mul(d); // an overflowing size saturates, and host_vec fails
    let mut buf = Buffers {
        rows: RowBuffers::new(p.seq_k, d)?,
        dk: host_vec(0.0, rows)?,
        dv: host_vec(0.0, rows)?,
        dq: host_vec(0.0, d)?,
        dout: host_vec(0.0, d)?,
    };
    let group = p.heads_q / p.heads_kv.max(1);
    for (one, at) in sequences {
        for kvh in 0..one.heads_kv {
            buf.rows.load_kv(at, (x.k, x.v), kvh, one.seq_k);
            buf.dk.fill(0.0);
            buf.dv.fill(0.0);
            for h in kvh * group..(kvh + 1) * group {
                let head = Head::new(&one, at, h);
                for i in 0..one.seq_q {
                    query_row(&head, x, i, &mut buf);
                    write_row(dq, (at.b, at.q0 + i, h), &buf.dq);
                }
            }
            for j in 0..one.seq_k {
                let (kb, kj) = at.key(j);
                write_row(dk, (kb, kj, kvh), &buf.dk[j * d..(j + 1) * d]);
                write_row(dv, (kb, kj, kvh), &buf.dv[j * d..(j + 1) * d]);
            }
        }
    }
    Ok(())
}

/// Query row `i` of `head`: its dQ into `buf.dq`, its share of dK and dV added to `buf.dk` and
/// `buf.dv` (K and V of its kv head are in `buf.rows`).
fn query_row<T: Element>(
    head: &Head<'_>,
    x: &BackwardOperands<'_, T>,
    i: usize,
    buf: &mut Buffers,
) {
    let (p, h) = (head.p, head.h);
    let (b, t) = (head.at.b, head.at.q0 + i); // the row's batch entry and token
    let d = p.head_dim;
    read_row(x.q, (b, t, h), &mut buf.rows.query);
    read_row(x.dout, (b, t, h), &mut buf.dout);
    read_row(x.out, (b, t, h), &mut buf.rows.acc);
    let row_dot = dot(&buf.dout, &buf.rows.acc); // D_i
    let Some(lse) = x.lse.host_data() else {
        unreachable!("validate_backward() checked that all operands are on the host");
    };
    let lse = f64::from(lse[x.lse.offset(b, t, h, 0)]);
    buf.dq.fill(0.0);
    if lse == f64::NEG_INFINITY {
        return; // the row saw no key (a bias of -inf on every visible key)
    }
    for j in p.visible(i) {
        let key = &buf.rows.keys[j * d..(j + 1) * d];
        let value = &buf.rows.values[j * d..(j + 1) * d];
        let (score, derivative) = head.score(i, j, dot(&buf.rows.query, key));
        let prob = (score - lse).exp();
        let ds = prob * (dot(&buf.dout, value) - row_dot) * derivative;
        for (g, k) in buf.dq.iter_mut().zip(key) {
            *g += ds * k;
        }
        for (g, q) in buf.dk[j * d..(j + 1) * d].iter_mut().zip(&buf.rows.query) {
            *g += ds * q;
        }
        for (g, o) in buf.dv[j * d..(j + 1) * d].iter_mut().zip(&buf.dout) {
            *g += prob * o;
        }
    }
}

#[cfg(test)]
mod tests {
    //! The gradients against central finite differences of the CPU forward pass, on f32 tensors
    //! (so that a step of the inputs is exact and the forward's rounding is far below the step).

    use super::*;
    use crate::options::Causal;
    use crate::tensor::Layout;
    use crate::{AlibiSlopes, Bias};

    /// Uniform values in [-1, 1) from a fixed linear congruential sequence.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn tensor(dims: [usize; 4], seed: u64) -> Tensor<f32> {
        let n = dims.iter().product();
        Tensor::from_vec(values(n, seed), &dims, Layout::Bshd).unwrap()
    }

    /// Forward output and logsumexp of `p` on host tensors.
    fn forward(p: &Problem, [q, k, v]: [&Tensor<f32>; 3]) -> (Tensor<f32>, Tensor<f32>) {
        let (b, s, h, d) = (p.batch, p.seq_q, p.heads_q, p.head_dim);
        let mut out = Tensor::full(0.0, &[b, s, h, d], Layout::Bshd).unwrap();
        let mut lse = Tensor::full(0.0, &[b, h, s, 1], Layout::Bhsd).unwrap();
        crate::cpu::attention(p, q, k, v, &mut out, Some(&mut lse)).unwrap();
        (out, lse)
    }

    /// sum(dout * out): the loss whose gradient in the output is `dout`.
    fn loss(p: &Problem, qkv: [&Tensor<f32>; 3], dout: &Tensor<f32>) -> f64 {
        let (out, _) = forward(p, qkv);
        let (o, g) = (out.host_data().unwrap(), dout.host_data().unwrap());
        o.iter()
            .zip(g)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum()
    }

    /// The forward pass of `p` on `qkv`, then its gradients for `dout`, written over NaN:
    /// (lse, [dq, dk, dv]).
    fn forward_and_backward(
        p: &Problem,
        qkv: [&Tensor<f32>; 3],
        dout: &Tensor<f32>,
    ) -> (Tensor<f32>, [Tensor<f32>; 3]) {
        let (out, lse) = forward(p, qkv);
        let x = BackwardOperands {
            q: qkv[0],
            k: qkv[1],
            v: qkv[2],
            out: &out,
            lse: &lse,
            dout,
        };
        let mut grads = qkv.map(|t| {
            let s = t.shape();
            Tensor::full(
                f32::NAN,
                &[s.batch, s.seq, s.heads, s.head_dim],
                Layout::Bshd,
            )
            .unwrap()
        });
        let [dq, dk, dv] = &mut grads;
        attention_backward(p, None, &x, [dq, dk, dv]).unwrap();
        (lse, grads)
    }

    /// Checks every element of dq, dk and dv of `p` against a central difference of the loss
    /// (the largest error measured was 9e-6 of 1 + |gradient|).
    fn check(p: &Problem, what: &str) {
        let (d, hq, hk) = (p.head_dim, p.heads_q, p.heads_kv);
        let mut qkv = [
            tensor([p.batch, p.seq_q, hq, d], 1),
            tensor([p.batch, p.seq_k, hk, d], 2),
            tensor([p.batch, p.seq_k, hk, d], 3),
        ];
        let dout = tensor([p.batch, p.seq_q, hq, d], 4);
        let (_, grads) = forward_and_backward(p, [&qkv[0], &qkv[1], &qkv[2]], &dout);
        let eps = 1e-2_f32;
        for (which, grad) in grads.iter().enumerate() {
            for e in 0..grad.host_data().unwrap().len() {
                let mut at = |delta: f32| {
                    let data = qkv[which].host_data_mut().unwrap();
                    let was = data[e];
                    data[e] = was + delta;
                    let l = loss(p, [&qkv[0], &qkv[1], &qkv[2]], &dout);
                    qkv[which].host_data_mut().unwrap()[e] = was;
                    l
                };
                let numeric = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
                let analytic = f64::from(grad.host_data().unwrap()[e]);
                assert!(
                    (numeric - analytic).abs() <= 1e-4 * (1.0 + numeric.abs()),
                    "{what}: d{} element {e}: analytic {analytic}, numeric {numeric}",
                    ["q", "k", "v"][which]
                );
            }
        }
    }

    fn problem(seq_q: usize, seq_k: usize, heads: (usize, usize), causal: Causal) -> Problem {
        let d = 8;
        Problem {
            batch: 2,
            seq_q,
            seq_k,
            heads_q: heads.0,
            heads_kv: heads.1,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: None,
            window: (None, None),
            alibi: None,
            bias: None,
            causal,
            location: crate::tensor::Location::Host,
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        check(&problem(5, 7, (2, 2), Causal::None), "plain");
        check(&problem(5, 7, (4, 2), Causal::None), "GQA 4:2");
        check(
            &problem(6, 4, (3, 1), Causal::TopLeft),
            "MQA, top-left causal, seq_q > seq_k",
        );
        check(
            &problem(4, 9, (2, 1), Causal::BottomRight),
            "bottom-right causal",
        );
        let scale = problem(5, 7, (2, 1), Causal::None);
        check(
            &Problem {
                scale: 0.9,
                ..scale
            },
            "scale 0.9",
        );
        let capped = Problem {
            softcap: Some(1.5),
            scale: 0.8,
            ..problem(5, 7, (2, 1), Causal::None)
        };
        check(
            &capped,
            "softcap 1.5 (scores beyond the cap's linear range)",
        );
        let window = Problem {
            window: (Some(2), Some(1)),
            ..problem(6, 6, (2, 2), Causal::None)
        };
        check(&window, "window (2, 1)");
        let alibi = Problem {
            alibi: Some(AlibiSlopes::new(vec![0.5, 0.25]).unwrap()),
            ..problem(5, 7, (2, 1), Causal::BottomRight)
        };
        check(&alibi, "ALiBi, bottom-right causal");
        // A bias [1, seq_q, 1, seq_k] that masks key 2 of every row with -inf.
        let mut bias = values(5 * 7, 9);
        for row in bias.chunks_mut(7) {
            row[2] = f32::NEG_INFINITY;
        }
        let bias = Tensor::from_vec(bias, &[1, 5, 1, 7], Layout::Bshd).unwrap();
        let biased = Problem {
            bias: Some(Bias::from(bias)),
            ..problem(5, 7, (2, 2), Causal::None)
        };
        check(&biased, "a bias with a masked key");
    }

    #[test]
    fn a_row_that_sees_no_key_has_no_gradient() {
        // Every key masked by the bias in query row 1: lse -inf, output 0.
        let p0 = problem(3, 4, (1, 1), Causal::None);
        let mut bias = vec![0.0; 3 * 4];
        bias[4..8].fill(f32::NEG_INFINITY);
        let p = Problem {
            batch: 1,
            bias: Some(Bias::from(
                Tensor::from_vec(bias, &[1, 3, 1, 4], Layout::Bshd).unwrap(),
            )),
            ..p0
        };
        let qkv = [
            tensor([1, 3, 1, 8], 1),
            tensor([1, 4, 1, 8], 2),
            tensor([1, 4, 1, 8], 3),
        ];
        let dout = tensor([1, 3, 1, 8], 4);
        let (lse, [dq, dk, dv]) = forward_and_backward(&p, [&qkv[0], &qkv[1], &qkv[2]], &dout);
        assert_eq!(lse.host_data().unwrap()[1], f32::NEG_INFINITY);
        let dq = dq.host_data().unwrap();
        assert!(dq[8..16].iter().all(|&g| g == 0.0), "row 1's dq: {dq:?}");
        assert!(dq[..8]
            .iter()
            .chain(&dq[16..])
            .all(|g| g.is_finite() && *g != 0.0));
        assert!(dk.host_data().unwrap().iter().all(|g| g.is_finite()));
        assert!(dv.host_data().unwrap().iter().all(|g| g.is_finite()));
    }
}
