//! Test helpers: seeded normal inputs, an independent naive attention in f64, relative L2 error.
#![allow(dead_code)]

use flashcore::{Bias, Causal, DType, Element, Layout, Shape, Tensor, VarlenBatch};
use half::{bf16, f16};
use std::sync::atomic::{AtomicU64, Ordering};

pub mod watchdog;

/// splitmix64: a small deterministic generator, freshly seeded per call site.
pub struct Rng(u64);

static SEED: AtomicU64 = AtomicU64::new(0x5eed_f1a5_c0de_0001);

impl Rng {
    /// A generator with a seed never handed out before in this process.
    pub fn fresh() -> Rng {
        Rng(SEED.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed))
    }

    /// A generator seeded with `seed` (a fuzz run that prints its seed can be replayed).
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Uniform in `0..n` (`n` > 0; the modulo bias is below 2^-40 for the n of the tests).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Elements that one generator fills in `randn`; a larger tensor takes a generator per chunk,
/// seeded from the caller's, and its chunks are filled on every core.
const RANDN_CHUNK: usize = 1 << 18;

/// A host tensor of standard normal values, `dims` in `layout`'s order. Up to `RANDN_CHUNK`
/// elements come from `rng` itself; beyond, chunk c from a generator seeded by `rng`'s c-th draw
/// (the same values whatever the core count), on every core: the bench's rotated inputs reach
/// hundreds of millions of values, tens of seconds for one thread.
pub fn randn<T: Element>(rng: &mut Rng, dims: &[usize], layout: Layout) -> Tensor<T> {
    fn fill<T: Element>(chunk: &mut [T], rng: &mut Rng) {
        chunk
            .iter_mut()
            .for_each(|x| *x = T::from_f64(rng.normal()));
    }
    let n: usize = dims.iter().product();
    let mut data = vec![T::default(); n];
    if n <= RANDN_CHUNK {
        fill(&mut data, rng);
    } else {
        let mut chunks: Vec<(&mut [T], Rng)> = data
            .chunks_mut(RANDN_CHUNK)
            .map(|c| (c, Rng(rng.next_u64())))
            .collect();
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let per_thread = chunks.len().div_ceil(threads);
        std::thread::scope(|s| {
            for group in chunks.chunks_mut(per_thread) {
                s.spawn(move || group.iter_mut().for_each(|(chunk, rng)| fill(chunk, rng)));
            }
        });
    }
    Tensor::from_vec(data, dims, layout).unwrap()
}

/// `dims` of a tensor of `shape` in `layout`'s order.
pub fn dims(shape: Shape, layout: Layout) -> [usize; 4] {
    match layout {
        Layout::Bshd => [shape.batch, shape.seq, shape.heads, shape.head_dim],
        Layout::Bhsd => [shape.batch, shape.heads, shape.seq, shape.head_dim],
    }
}

/// Naive attention in f64, straight from the definition: full score matrix with masked entries
/// at -inf, then softmax and the weighted sum. Returns (out `[b][s][h][d]` flattened, lse
/// `[b][h][s]` flattened). The (batch, head) pairs are spread over the host's cores.
pub fn naive<T: Element>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    scale: f64,
    causal: Causal,
) -> (Vec<f64>, Vec<f64>) {
    naive_mods(q, k, v, scale, causal, Mods::default())
}

/// Score modifiers of [`naive_mods`].
#[derive(Clone, Default, Debug)]
pub struct Mods {
    /// Each unmasked score `s = scale * q.k` becomes `cap * tanh(s / cap)`.
    pub softcap: Option<f64>,
    /// Key `j` is visible to query `i` only within `i + off - left ..= i + off + right`
    /// (`off`: the causal alignment's diagonal, bottom-right without a causal mask).
    pub window: (Option<usize>, Option<usize>),
    /// ALiBi slopes, `[heads_q]` or `[batch, heads_q]`: each score then loses
    /// `slope * |i + off - j|`.
    pub alibi: Option<Vec<f32>>,
    /// An additive bias, added last.
    pub bias: Option<NaiveBias>,
    /// The softmax scale of a GPU case (`mods_case_on` in tests/gpu.rs; `1/sqrt(d)` when
    /// `None`); [`naive_mods`] takes its scale as an argument and ignores this.
    pub scale: Option<f32>,
}

/// An additive bias for [`naive_mods`]: dims `[batch, seq_q, heads_q, seq_k]`, each the
/// call's or 1 (broadcast), values row-major in that order (already rounded to `dtype`), and how
/// [`NaiveBias::bias`] lays them out.
#[derive(Clone, Debug)]
pub struct NaiveBias {
    pub dims: [usize; 4],
    pub values: Vec<f64>,
    pub dtype: DType,
    /// `Layout::Bshd`: memory in dims order; `Layout::Bhsd`: PyTorch's `[b, h, sq, sk]`.
    pub layout: Layout,
}

impl NaiveBias {
    /// Random normal values times `scale` (rounded to `dtype`), a `masked` fraction -inf.
    pub fn random(
        rng: &mut Rng,
        dims: [usize; 4],
        (scale, masked): (f64, f64),
        dtype: DType,
        layout: Layout,
    ) -> Self {
        let n = dims.iter().product();
        let round = |x: f64| match dtype {
            DType::F16 => f16::from_f64(x).to_f64(),
            DType::BF16 => bf16::from_f64(x).to_f64(),
            DType::F32 => x as f32 as f64,
        };
        let values = (0..n)
            .map(|_| {
                let x = round(rng.normal() * scale);
                if rng.uniform() < masked {
                    f64::NEG_INFINITY
                } else {
                    x
                }
            })
            .collect();
        NaiveBias {
            dims,
            values,
            dtype,
            layout,
        }
    }

    /// Element `[b, i, h, j]`, broadcast over dims of 1.
    pub fn at(&self, index: [usize; 4]) -> f64 {
        let flat = (0..4).fold(0, |acc, a| {
            acc * self.dims[a] + if self.dims[a] == 1 { 0 } else { index[a] }
        });
        self.values[flat]
    }

    /// The values as a host tensor of `T`, laid out as `layout` says.
    pub fn tensor<T: Element>(&self) -> Tensor<T> {
        let [b, s, h, k] = self.dims;
        let mut data = Vec::with_capacity(self.values.len());
        let dims = match self.layout {
            Layout::Bshd => {
                data.extend(self.values.iter().map(|&x| T::from_f64(x)));
                [b, s, h, k]
            }
            Layout::Bhsd => {
                for (bb, hh, ss, kk) in (0..b).flat_map(|bb| {
                    (0..h).flat_map(move |hh| {
                        (0..s).flat_map(move |ss| (0..k).map(move |kk| (bb, hh, ss, kk)))
                    })
                }) {
                    data.push(T::from_f64(self.at([bb, ss, hh, kk])));
                }
                [b, h, s, k]
            }
        };
        Tensor::from_vec(data, &dims, self.layout).unwrap()
    }

    /// The bias as a flashcore host [`Bias`] of `dtype`.
    pub fn bias(&self) -> Bias {
        match self.dtype {
            DType::F16 => Bias::from(self.tensor::<f16>()),
            DType::BF16 => Bias::from(self.tensor::<bf16>()),
            DType::F32 => Bias::from(self.tensor::<f32>()),
        }
    }
}

/// Relative L2 error of logsumexps that may hold -inf (rows every key of which is masked):
/// infinite where `want` is, exactly; the error over the finite rest.
pub fn lse_error(got: &[f64], want: &[f64]) -> f64 {
    let infinite = |x: &f64| *x == f64::NEG_INFINITY;
    if got.iter().map(infinite).ne(want.iter().map(infinite)) {
        return f64::INFINITY;
    }
    let kept = |v: &[f64]| {
        v.iter()
            .copied()
            .filter(|x| !infinite(x))
            .collect::<Vec<_>>()
    };
    rel_l2(&kept(got), &kept(want))
}

/// [`naive`] with score modifiers, straight from their definitions.
pub fn naive_mods<T: Element>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    scale: f64,
    causal: Causal,
    mods: Mods,
) -> (Vec<f64>, Vec<f64>) {
    let softcap = mods.softcap;
    let (qs, ks) = (q.shape(), k.shape());
    let (b_n, sq, sk, hq, hk, d) = (qs.batch, qs.seq, ks.seq, qs.heads, ks.heads, qs.head_dim);
    let (qv, kv, vv) = (logical(q), logical(k), logical(v));
    let q_at = |b: usize, i: usize, h: usize| &qv[((b * sq + i) * hq + h) * d..][..d];
    let k_at = |b: usize, j: usize, h: usize| &kv[((b * sk + j) * hk + h) * d..][..d];
    let v_at = |b: usize, j: usize, h: usize| &vv[((b * sk + j) * hk + h) * d..][..d];
    // One (batch, head): out rows [sq][d] and lse [sq].
    let head = |b: usize, h: usize| -> (Vec<f64>, Vec<f64>) {
        let kh = h * hk / hq;
        let mut out = vec![0.0; sq * d];
        let mut lse = vec![0.0; sq];
        for i in 0..sq {
            let scores: Vec<f64> = (0..sk)
                .map(|j| {
                    let (row, key) = (i as i64, j as i64);
                    let off = match causal {
                        Causal::TopLeft => 0,
                        _ => sk as i64 - sq as i64,
                    };
                    let masked = match causal {
                        Causal::None => false,
                        _ => key > row + off,
                    } || mods.window.0.is_some_and(|l| key < row + off - l as i64)
                        || mods.window.1.is_some_and(|r| key > row + off + r as i64);
                    if masked {
                        f64::NEG_INFINITY
                    } else {
                        let (qr, kr) = (q_at(b, i, h), k_at(b, j, kh));
                        let s = scale * qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>();
                        let s = softcap.map_or(s, |cap| cap * (s / cap).tanh());
                        let slope = mods.alibi.as_ref().map_or(0.0, |a| {
                            f64::from(a[if a.len() == hq { h } else { b * hq + h }])
                        });
                        let bias = mods.bias.as_ref().map_or(0.0, |x| x.at([b, i, h, j]));
                        s - slope * (row + off - key).abs() as f64 + bias
                    }
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                // Every key masked (by the bias): output 0, lse -inf.
                lse[i] = m;
                continue;
            }
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = w.iter().sum();
            lse[i] = m + z.ln();
            let row = &mut out[i * d..][..d];
            for (j, wj) in w.iter().enumerate() {
                for (o, x) in row.iter_mut().zip(v_at(b, j, kh)) {
                    *o += wj * x;
                }
            }
            row.iter_mut().for_each(|o| *o /= z);
        }
        (out, lse)
    };
    let pairs: Vec<(usize, usize)> = (0..b_n)
        .flat_map(|b| (0..hq).map(move |h| (b, h)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = pairs.len().div_ceil(threads).max(1);
    let results: Vec<Vec<(Vec<f64>, Vec<f64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = pairs
            .chunks(chunk)
            .map(|c| s.spawn(|| c.iter().map(|&(b, h)| head(b, h)).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut out = vec![0.0; b_n * sq * hq * d];
    let mut lse = vec![0.0; b_n * hq * sq];
    for (&(b, h), (o, l)) in pairs.iter().zip(results.into_iter().flatten()) {
        for i in 0..sq {
            out[((b * sq + i) * hq + h) * d..][..d].copy_from_slice(&o[i * d..][..d]);
        }
        lse[(b * hq + h) * sq..][..sq].copy_from_slice(&l);
    }
    (out, lse)
}

/// Values of a host tensor in logical `[b][s][h][d]` order.
pub fn logical<T: Element>(t: &Tensor<T>) -> Vec<f64> {
    let s = t.shape();
    let mut v = Vec::with_capacity(s.numel().unwrap());
    for b in 0..s.batch {
        for i in 0..s.seq {
            for h in 0..s.heads {
                for x in 0..s.head_dim {
                    v.push(t.get(b, i, h, x).unwrap().to_f64());
                }
            }
        }
    }
    v
}

/// Values of an lse tensor (`[b, s, h, 1]` logical) in `[b][h][s]` order.
pub fn lse_values(t: &Tensor<f32>) -> Vec<f64> {
    let s = t.shape();
    let mut v = Vec::new();
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.seq {
                v.push(f64::from(t.get(b, i, h, 0).unwrap()));
            }
        }
    }
    v
}

/// ||got - want|| / ||want||; infinite when any value of `got` is not finite.
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    if got.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Tokens `range` of a packed batch-1 tensor `[1, tokens, h, d]`, as a dense BSHD tensor
/// `[1, range.len(), h, d]`.
pub fn tokens<T: Element>(t: &Tensor<T>, range: std::ops::Range<usize>) -> Tensor<T> {
    let s = t.shape();
    let mut data = Vec::with_capacity(range.len() * s.heads * s.head_dim);
    for i in range.clone() {
        for h in 0..s.heads {
            for x in 0..s.head_dim {
                data.push(t.get(0, i, h, x).unwrap());
            }
        }
    }
    Tensor::from_vec(data, &[1, range.len(), s.heads, s.head_dim], Layout::Bshd).unwrap()
}

/// [`naive`] per sequence of a variable-length batch (offsets `cu_q`, `cu_k` into packed
/// batch-1 tensors). Returns (out `[total_q][h][d]`, lse `[h][total_q]`), flattened.
pub fn naive_varlen<T: Element>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    cu_q: &[i32],
    cu_k: &[i32],
    scale: f64,
    causal: Causal,
) -> (Vec<f64>, Vec<f64>) {
    let (total, h, d) = (q.shape().seq, q.shape().heads, q.shape().head_dim);
    let mut out = vec![0.0; total * h * d];
    let mut lse = vec![0.0; h * total];
    for (qs, ks) in cu_q.windows(2).zip(cu_k.windows(2)) {
        let (q0, q1) = (qs[0] as usize, qs[1] as usize);
        let (k0, k1) = (ks[0] as usize, ks[1] as usize);
        if q1 == q0 {
            continue;
        }
        let (o, l) = naive(
            &tokens(q, q0..q1),
            &tokens(k, k0..k1),
            &tokens(v, k0..k1),
            scale,
            causal,
        );
        out[q0 * h * d..q1 * h * d].copy_from_slice(&o);
        for head in 0..h {
            lse[head * total + q0..head * total + q1]
                .copy_from_slice(&l[head * (q1 - q0)..][..q1 - q0]);
        }
    }
    (out, lse)
}

/// Random sequence lengths for a variable-length batch of `n` sequences: queries in
/// `0..=max_q` and keys in `1..=max_k`; with `bottom_right`, each sequence gets at least as many
/// keys as queries (else its rows would see no key).
pub fn random_lengths(
    rng: &mut Rng,
    n: usize,
    max_q: usize,
    max_k: usize,
    bottom_right: bool,
) -> (Vec<usize>, Vec<usize>) {
    let mut pick = |hi: usize| ((rng.uniform() * (hi + 1) as f64) as usize).min(hi);
    let mut lq = Vec::with_capacity(n);
    let mut lk = Vec::with_capacity(n);
    for _ in 0..n {
        let q = pick(max_q);
        let mut k = pick(max_k).max(1);
        if bottom_right {
            k = k.max(q);
        }
        lq.push(q);
        lk.push(k);
    }
    (lq, lk)
}

/// A random variable-length batch of `n` sequences ([`random_lengths`]) and its packed host
/// Q, K and V (`heads` = (query, key/value) heads, head dim `d`, in `layout`), normal values.
#[allow(clippy::too_many_arguments)]
pub fn random_varlen<T: Element>(
    rng: &mut Rng,
    n: usize,
    (max_q, max_k): (usize, usize),
    heads: (usize, usize),
    d: usize,
    bottom_right: bool,
    layout: Layout,
) -> (VarlenBatch, Tensor<T>, Tensor<T>, Tensor<T>) {
    let (lq, lk) = random_lengths(rng, n, max_q, max_k, bottom_right);
    varlen_of_lengths(rng, &lq, &lk, heads, d, layout)
}

/// A variable-length batch of sequences with `lq` queries and `lk` keys, and its packed host Q,
/// K and V (`heads` = (query, key/value) heads, head dim `d`, in `layout`), normal values.
pub fn varlen_of_lengths<T: Element>(
    rng: &mut Rng,
    lq: &[usize],
    lk: &[usize],
    heads: (usize, usize),
    d: usize,
    layout: Layout,
) -> (VarlenBatch, Tensor<T>, Tensor<T>, Tensor<T>) {
    let batch = VarlenBatch::from_lengths(lq, lk).unwrap();
    let (tq, tk) = (lq.iter().sum::<usize>(), lk.iter().sum::<usize>());
    let mut packed =
        |tokens: usize, h: usize| randn(rng, &dims(Shape::new(1, tokens, h, d), layout), layout);
    let q = packed(tq, heads.0);
    let k = packed(tk, heads.1);
    let v = packed(tk, heads.1);
    (batch, q, k, v)
}

/// Sequence `b`'s first `keys` keys of a paged cache `[num_pages, size, h, d]` whose pages are
/// `pages`, gathered into a dense `[1, keys, h, d]`.
pub fn gather_pages<T: Element>(
    cache: &Tensor<T>,
    pages: &[i32],
    size: usize,
    keys: usize,
) -> Tensor<T> {
    let s = cache.shape();
    let mut data = Vec::with_capacity(keys * s.heads * s.head_dim);
    for j in 0..keys {
        let page = pages[j / size] as usize;
        for h in 0..s.heads {
            for x in 0..s.head_dim {
                data.push(cache.get(page, j % size, h, x).unwrap());
            }
        }
    }
    Tensor::from_vec(data, &[1, keys, s.heads, s.head_dim], Layout::Bshd).unwrap()
}

/// Batch entry `b` of a dense `[batch, seq, h, d]` tensor as `[1, seq, h, d]`.
pub fn batch_entry<T: Element>(t: &Tensor<T>, b: usize) -> Tensor<T> {
    let s = t.shape();
    let data = (0..s.seq)
        .flat_map(|i| (0..s.heads).flat_map(move |h| (0..s.head_dim).map(move |x| (i, h, x))))
        .map(|(i, h, x)| t.get(b, i, h, x).unwrap())
        .collect();
    Tensor::from_vec(data, &[1, s.seq, s.heads, s.head_dim], Layout::Bshd).unwrap()
}

/// Pages for sequences of `lengths` keys in pages of `size`: a shuffled permutation of a cache
/// with `spare` pages no sequence uses, dealt out in order. Returns (block table rows, pages).
pub fn random_pages(
    rng: &mut Rng,
    size: usize,
    lengths: &[usize],
    spare: usize,
) -> (Vec<Vec<i32>>, usize) {
    let used: Vec<usize> = lengths.iter().map(|n| n.div_ceil(size)).collect();
    let num_pages = used.iter().sum::<usize>() + spare;
    let mut order: Vec<i32> = (0..num_pages as i32).collect();
    for i in (1..order.len()).rev() {
        let j = ((rng.uniform() * (i + 1) as f64) as usize).min(i);
        order.swap(i, j);
    }
    let mut next = order.into_iter();
    let table = used
        .iter()
        .map(|&n| next.by_ref().take(n).collect())
        .collect();
    (table, num_pages)
}

/// [`naive`] per sequence of a paged call: batch entry `b` of `q` against its first
/// `lengths[b]` keys, gathered through `table[b]`. Returns (out `[b][s][h][d]`, lse `[b][h][s]`),
/// flattened.
#[allow(clippy::too_many_arguments)]
pub fn naive_paged<T: Element>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    table: &[Vec<i32>],
    lengths: &[usize],
    size: usize,
    scale: f64,
    causal: Causal,
) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut lse) = (Vec::new(), Vec::new());
    for (b, (pages, &keys)) in table.iter().zip(lengths).enumerate() {
        let (o, l) = naive(
            &batch_entry(q, b),
            &gather_pages(k, pages, size, keys),
            &gather_pages(v, pages, size, keys),
            scale,
            causal,
        );
        out.extend(o);
        lse.extend(l);
    }
    (out, lse)
}
