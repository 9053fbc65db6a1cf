//! The CPU reference of merging attention states, in f64 (the formula is in `crate::merge`).

use crate::element::Element;
use crate::merge::AttentionState;
use crate::tensor::Tensor;

/// One row's merge: `(lse_i, row_i)` pairs into `dst`; returns the merged logsumexp.
fn merge_row<'a>(parts: impl Iterator<Item = (f64, &'a [f64])> + Clone, dst: &mut [f64]) -> f64 {
    let nan = parts.clone().any(|(l, _)| l.is_nan());
    let m = parts
        .clone()
        .map(|(l, _)| l)
        .fold(f64::NEG_INFINITY, f64::max);
    dst.fill(0.0);
    if nan {
        dst.fill(f64::NAN);
        return f64::NAN;
    }
    if m == f64::NEG_INFINITY {
        return m; // no state covers a key: out 0
    }
    let mut total = 0.0;
    for (l, row) in parts {
        let w = (l - m).exp();
        total += w;
        if w != 0.0 {
            for (d, x) in dst.iter_mut().zip(row) {
                *d += w * x;
            }
        }
    }
    for d in dst.iter_mut() {
        *d /= total;
    }
    m + total.ln()
}

/// Every (batch, seq, head) row of a validated merge, in output order.
fn rows(shape: crate::Shape) -> impl Iterator<Item = (usize, usize, usize)> {
    let (b, s, h) = (shape.batch, shape.seq, shape.heads);
    (0..b).flat_map(move |bi| (0..s).flat_map(move |si| (0..h).map(move |hi| (bi, si, hi))))
}

fn read_row<T: Element>(t: &Tensor<T>, (b, s, h): (usize, usize, usize), row: &mut [f64]) {
    let data = t.host_data().expect("validated host state");
    let o = t.offset(b, s, h, 0);
    for (x, r) in row.iter_mut().enumerate() {
        *r = data[o + x].to_f64();
    }
}

fn read_lse(t: &Tensor<f32>, (b, s, h): (usize, usize, usize)) -> f64 {
    f64::from(t.host_data().expect("validated host lse")[t.offset(b, s, h, 0)])
}

fn write_row<T: Element>(
    out: &mut Tensor<T>,
    lse: Option<&mut Tensor<f32>>,
    at: (usize, usize, usize),
    row: &[f64],
    merged: f64,
) {
    let (b, s, h) = at;
    let o = out.offset(b, s, h, 0);
    let data = out.host_data_mut().expect("validated host output");
    for (x, r) in row.iter().enumerate() {
        data[o + x] = T::from_f64(*r);
    }
    if let Some(l) = lse {
        let o = l.offset(b, s, h, 0);
        l.host_data_mut().expect("validated host lse")[o] = merged as f32;
    }
}

/// Merges host `states` into `out` (and `lse`).
pub(crate) fn merge<T: Element>(
    states: &[AttentionState<'_, T>],
    out: &mut Tensor<T>,
    mut lse: Option<&mut Tensor<f32>>,
) {
    let d = out.shape().head_dim;
    let mut values = vec![0f64; states.len() * d];
    let mut lses = vec![0f64; states.len()];
    let mut dst = vec![0f64; d];
    for at in rows(out.shape()) {
        for (i, st) in states.iter().enumerate() {
            read_row(st.out, at, &mut values[i * d..(i + 1) * d]);
            lses[i] = read_lse(st.lse, at);
        }
        let parts = lses.iter().copied().zip(values.chunks(d.max(1)));
        let merged = merge_row(parts, &mut dst);
        write_row(out, lse.as_deref_mut(), at, &dst, merged);
    }
}

/// Merges host `other` into `(out, lse)` in place.
pub(crate) fn merge_in_place<T: Element>(
    out: &mut Tensor<T>,
    lse: &mut Tensor<f32>,
    other: AttentionState<'_, T>,
) {
    let d = out.shape().head_dim;
    let (mut mine, mut theirs, mut dst) = (vec![0f64; d], vec![0f64; d], vec![0f64; d]);
    for at in rows(out.shape()) {
        read_row(out, at, &mut mine);
        read_row(other.out, at, &mut theirs);
        let parts = [
            (read_lse(lse, at), mine.as_slice()),
            (read_lse(other.lse, at), theirs.as_slice()),
        ];
        let merged = merge_row(parts.into_iter(), &mut dst);
        write_row(out, Some(&mut *lse), at, &dst, merged);
    }
}
