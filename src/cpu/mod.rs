//! The CPU reference backend: exact softmax attention accumulated in f64, its gradients
//! (`backward`), and the merge of attention states (`merge`).

mod backward;
mod merge;
pub(crate) use backward::{attention_backward, BackwardOperands};
pub(crate) use merge::{merge, merge_in_place};

use crate::element::Element;
use crate::error::Result;
use crate::paged::PageTable;
use crate::tensor::host_vec;
use crate::tensor::Tensor;
use crate::validate::Problem;
use crate::varlen::VarlenBatch;

/// Where one sequence's tokens start: batch entry `b`, query token `q0`, key token `k0`; with
/// `pages`, its keys are in a paged cache instead (its row of the block table, the page size).
/// `seq`: its position in the batch (its row of ALiBi slopes).
#[derive(Clone, Copy)]
struct At<'a> {
    seq: usize,
    b: usize,
    q0: usize,
    k0: usize,
    pages: Option<(&'a [i32], usize)>,
}

impl At<'_> {
    /// Batch entry `b` of a dense batch, from its first token.
    fn entry(b: usize) -> Self {
        At {
            seq: b,
            b,
            q0: 0,
            k0: 0,
            pages: None,
        }
    }

    /// The (batch entry, token) of K and V that holds the sequence's key `j`.
    fn key(&self, j: usize) -> (usize, usize) {
        match self.pages {
            // Validated: the pages that the sequence's keys reach are in the cache.
            Some((row, size)) => (row[j / size] as usize, j % size),
            None => (self.b, self.k0 + j),
        }
    }
}

/// The scores of one query head `h` of the sequence at `at`: the scaled dot products with the
/// problem's softcap, ALiBi slope and bias applied.
struct Head<'a> {
    p: &'a Problem,
    at: At<'a>,
    h: usize,
    slope: Option<f64>,
}

impl<'a> Head<'a> {
    fn new(p: &'a Problem, at: At<'a>, h: usize) -> Self {
        let slope = p.alibi.as_ref().map(|a| f64::from(a.slope(at.seq, h)));
        Head { p, at, h, slope }
    }

    /// Query row `i`'s score for key `j` whose dot product with it is `dot`, and the score's
    /// derivative in `dot` (the scale, times `1 - tanh^2` under a softcap).
    fn score(&self, i: usize, j: usize, dot: f64) -> (f64, f64) {
        let p = self.p;
        let scale = f64::from(p.scale);
        let (score, derivative) = match p.softcap {
            Some(cap) => {
                let t = (dot * scale / f64::from(cap)).tanh();
                (f64::from(cap) * t, scale * (1.0 - t * t))
            }
            None => (dot * scale, scale),
        };
        // ALiBi's distance from the diagonal (sizes fit in i64: tensor extents).
        let gap = (i as i64 + p.diagonal() - j as i64).unsigned_abs() as f64;
        // The bias is on the host (validated), so `value` finds it.
        let bias = p.bias.as_ref().map_or(0.0, |x| {
            x.value(self.at.seq, i, self.h, j).unwrap_or(f64::NAN)
        });
        (
            score - self.slope.map_or(0.0, |m| m * gap) + bias,
            derivative,
        )
    }
}

/// Computes attention for host tensors. `lse` receives `max + ln(sum exp)` per query row.
/// Fails only when the host cannot hold one row's scores and one kv head's K and V in f64.
pub(crate) fn attention<T: Element>(
    p: &Problem,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<()> {
    let entries = (0..p.batch).map(|b| (p.clone(), At::entry(b)));
    each_sequence(p, q, k, v, out, lse, entries)
}

/// Attention over a variable-length batch of host tensors (validated: the offsets start at 0,
/// never decrease and end at the token counts; `p` holds the shared sizes and options).
pub(crate) fn attention_varlen<T: Element>(
    p: &Problem,
    batch: &VarlenBatch,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<()> {
    each_sequence(p, q, k, v, out, lse, varlen_sequences(p, batch))
}

/// Each sequence of a variable-length batch (validated offsets: they start at 0, never decrease
/// and end at the token counts) as its own problem (`p`'s options) and where it starts.
fn varlen_sequences<'a>(
    p: &'a Problem,
    batch: &'a VarlenBatch,
) -> impl Iterator<Item = (Problem, At<'a>)> + 'a {
    let (cu_q, cu_k) = batch.host();
    let token = |x: i32| x as usize; // validated: non-negative
    let pairs = cu_q.windows(2).zip(cu_k.windows(2));
    pairs.enumerate().map(move |(seq, (qs, ks))| {
        let one = Problem {
            batch: 1,
            seq_q: token(qs[1]) - token(qs[0]),
            seq_k: token(ks[1]) - token(ks[0]),
            ..p.clone()
        };
        let at = At {
            seq,
            q0: token(qs[0]),
            k0: token(ks[0]),
            ..At::entry(0)
        };
        (one, at)
    })
}

/// Attention over a paged KV cache of host tensors (validated: every page a sequence's keys
/// reach is in the cache; `p.seq_k` is the longest sequence's key count).
pub(crate) fn attention_paged<T: Element>(
    p: &Problem,
    pages: &PageTable,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
) -> Result<()> {
    let (table, seqlens) = pages.host();
    let width = pages.pages_per_seq();
    let sequences = seqlens.iter().enumerate().map(|(b, &keys)| {
        let one = Problem {
            batch: 1,
            seq_k: keys as usize, // validated: non-negative
            ..p.clone()
        };
        let row = &table[b * width..(b + 1) * width];
        let at = At {
            pages: Some((row, pages.page_size())),
            ..At::entry(b)
        };
        (one, at)
    });
    each_sequence(p, q, k, v, out, lse, sequences)
}

/// Runs each (sequence's problem, where it starts) of `sequences` with one set of row buffers,
/// sized by `p` (whose seq_k is the longest sequence's).
fn each_sequence<'a, T: Element>(
    p: &Problem,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    mut lse: Option<&mut Tensor<f32>>,
    sequences: impl IntoIterator<Item = (Problem, At<'a>)>,
) -> Result<()> {
    let mut rows = RowBuffers::new(p.seq_k, p.head_dim)?;
    for (one, at) in sequences {
        sequence(&one, at, q, k, v, out, lse.as_deref_mut(), &mut rows);
    }
    Ok(())
}

/// Buffers allocated once per call: one query row's scores (one per key), query and output
/// accumulator, and the K and V rows of one (sequence, kv head) in f64, converted once for all the
/// query rows that read them (each element's conversion is exact, so the arithmetic is that of
/// converting at every use).
struct RowBuffers {
    scores: Vec<f64>,
    query: Vec<f64>,
    acc: Vec<f64>,
    keys: Vec<f64>,
    values: Vec<f64>,
}

impl RowBuffers {
    fn new(keys: usize, head_dim: usize) -> Result<Self> {
        // An overflowing size saturates, and host_vec then fails to reserve it.
        let rows = keys.saturating_mul(head_dim);
        Ok(RowBuffers {
            scores: host_vec(0.0, keys)?,
            query: host_vec(0.0, head_dim)?,
            acc: host_vec(0.0, head_dim)?,
            keys: host_vec(0.0, rows)?,
            values: host_vec(0.0, rows)?,
        })
    }

    /// Converts kv head `kvh`'s K and V rows of the sequence's first `seq_k` keys into `keys`
    /// and `values`.
    fn load_kv<T: Element>(
        &mut self,
        at: At<'_>,
        (k, v): (&Tensor<T>, &Tensor<T>),
        kvh: usize,
        seq_k: usize,
    ) {
        let d = self.query.len();
        for j in 0..seq_k {
            let (kb, kj) = at.key(j);
            read_row(k, (kb, kj, kvh), &mut self.keys[j * d..(j + 1) * d]);
            read_row(v, (kb, kj, kvh), &mut self.values[j * d..(j + 1) * d]);
        }
    }
}

/// Reads row (batch, token, head) of host tensor `t` into `row` in f64.
fn read_row<T: Element>(t: &Tensor<T>, (b, s, h): (usize, usize, usize), row: &mut [f64]) {
    let Some(data) = t.host_data() else {
        unreachable!("validation checked that all operands are on the host");
    };
    let at = t.offset(b, s, h, 0);
    for (e, x) in row.iter_mut().zip(&data[at..]) {
        *e = x.to_f64();
    }
}

/// Writes `row` to row (batch, token, head) of host tensor `t`, rounded to `T`.
fn write_row<T: Element>(t: &mut Tensor<T>, (b, s, h): (usize, usize, usize), row: &[f64]) {
    let at = t.offset(b, s, h, 0);
    let data = t.host_data_mut().expect("validated host output");
    for (e, x) in data[at..].iter_mut().zip(row) {
        *e = T::from_f64(*x);
    }
}

/// The dot product of two rows.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// One sequence of `p.seq_q` queries on `p.seq_k` keys, starting at `at`.
#[allow(clippy::too_many_arguments)] // the operands of one call, where to start, the buffers
fn sequence<T: Element>(
    p: &Problem,
    at: At<'_>,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    out: &mut Tensor<T>,
    mut lse: Option<&mut Tensor<f32>>,
    rows: &mut RowBuffers,
) {
    let group = p.heads_q / p.heads_kv.max(1);
    let d = p.head_dim;
    let b = at.b;
    for kvh in 0..p.heads_kv {
        rows.load_kv(at, (k, v), kvh, p.seq_k);
        let RowBuffers {
            scores,
            query,
            acc,
            keys,
            values,
        } = &mut *rows;
        for h in kvh * group..(kvh + 1) * group {
            let head = Head::new(p, at, h);
            for i in 0..p.seq_q {
                let visible = p.visible(i);
                let (first, n) = (visible.start, visible.len());
                read_row(q, (b, at.q0 + i, h), query);
                for (j, s) in scores[..n].iter_mut().enumerate() {
                    let key = &keys[(first + j) * d..(first + j + 1) * d];
                    *s = head.score(i, first + j, dot(query, key)).0;
                }
                let max = scores[..n]
                    .iter()
                    .copied()
                    .fold(f64::NEG_INFINITY, f64::max);
                // A row whose every key the bias masks (-inf) gets output 0 and lse -inf.
                let live = max > f64::NEG_INFINITY;
                acc.fill(0.0);
                let mut sum = 0.0;
                for (j, s) in scores[..n].iter().enumerate().filter(|_| live) {
                    let w = (s - max).exp();
                    sum += w;
                    let value = &values[(first + j) * d..(first + j + 1) * d];
                    for (a, e) in acc.iter_mut().zip(value) {
                        *a += w * e;
                    }
                }
                for a in acc.iter_mut() {
                    *a = if live { *a / sum } else { 0.0 };
                }
                write_row(out, (b, at.q0 + i, h), acc);
                if let Some(l) = lse.as_deref_mut() {
                    let l0 = l.offset(b, at.q0 + i, h, 0);
                    let value = if live {
                        max + sum.ln()
                    } else {
                        f64::NEG_INFINITY
                    };
                    l.host_data_mut().expect("validated host lse")[l0] = value as f32;
                }
            }
        }
    }
}
