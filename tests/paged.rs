//! Paged KV caches on the CPU (runs in CI): random caches (shuffled pages, partial last pages,
//! every page size) against the naive formula on each sequence's gathered keys, and every
//! validation error of the page table.

mod common;

use common::{dims, logical, lse_values, naive_paged, randn, random_pages, rel_l2, Rng};
use flashcore::{
    attention_paged, attention_paged_into, AttentionElement, AttentionOptions, Causal, Error,
    Layout, Operand, PageRule, PageTable, Shape, Tensor,
};
use half::{bf16, f16};

/// A random paged problem: `batch` sequences of random lengths (at least `seq_q` keys each) in
/// shuffled pages of `size` keys, against the naive formula per sequence.
fn random_cache<T: AttentionElement>(
    size: usize,
    batch: usize,
    seq_q: usize,
    causal: Causal,
    layout: Layout,
) {
    let mut rng = Rng::fresh();
    let (hq, hk, d) = (4, 2, 16);
    let lengths: Vec<usize> = (0..batch)
        .map(|_| seq_q.max(1) + (rng.normal().abs() * 60.0) as usize % (3 * size))
        .collect();
    let (table, num_pages) = random_pages(&mut rng, size, &lengths, 3);
    let seqlens: Vec<i32> = lengths.iter().map(|&n| n as i32).collect();
    let pages = PageTable::new(size, table.clone(), seqlens).unwrap();
    let at = |b, s, h| dims(Shape::new(b, s, h, d), layout); // dims in the layout's order
    let k = randn::<T>(&mut rng, &at(num_pages, size, hk), layout);
    let v = randn::<T>(&mut rng, &at(num_pages, size, hk), layout);
    let q = randn::<T>(&mut rng, &at(batch, seq_q, hq), layout);
    let opts = AttentionOptions::default().causal(causal).with_lse();
    let res = attention_paged(&q, &k, &v, &pages, &opts).unwrap();
    let (got, got_lse) = (logical(&res.out), lse_values(res.lse.as_ref().unwrap()));
    let scale = 1.0 / (d as f64).sqrt();
    let (want, want_lse) = naive_paged(&q, &k, &v, &table, &lengths, size, scale, causal);
    let (rows, lse_rows) = (seq_q * hq * d, hq * seq_q);
    for b in 0..batch {
        let err = rel_l2(&got[b * rows..][..rows], &want[b * rows..][..rows]);
        let lse_err = rel_l2(
            &got_lse[b * lse_rows..][..lse_rows],
            &want_lse[b * lse_rows..][..lse_rows],
        );
        let what = format!(
            "page size {size}, sequence {b} of {} keys, {causal:?} {layout:?}",
            lengths[b]
        );
        let tol = if T::DTYPE == flashcore::DType::BF16 {
            8e-3
        } else {
            1e-3
        };
        assert!(
            err < tol && lse_err < 1e-6,
            "{what}: out {err:.2e}, lse {lse_err:.2e}"
        );
    }
}

#[test]
fn random_caches_match_the_naive_formula() {
    for size in [16, 32, 64, 128, 256] {
        random_cache::<f16>(size, 3, 1, Causal::BottomRight, Layout::Bshd);
        random_cache::<bf16>(size, 2, 5, Causal::BottomRight, Layout::Bhsd);
    }
    random_cache::<f16>(16, 4, 3, Causal::None, Layout::Bshd);
    random_cache::<f16>(32, 2, 7, Causal::TopLeft, Layout::Bhsd);
}

/// A small valid call: 2 sequences of 40 and 64 keys in 10 pages of 16, one query each.
fn small() -> (Tensor<f16>, Tensor<f16>, PageTable) {
    let mut rng = Rng::fresh();
    let q = randn::<f16>(&mut rng, &[2, 1, 4, 16], Layout::Bshd);
    let k = randn::<f16>(&mut rng, &[10, 16, 2, 16], Layout::Bshd);
    let pages = PageTable::new(16, vec![vec![3, 0, 9], vec![5, 2, 7, 8]], vec![40, 64]).unwrap();
    (q, k, pages)
}

fn run(
    q: &Tensor<f16>,
    k: &Tensor<f16>,
    pages: &PageTable,
    opts: &AttentionOptions,
) -> Result<(), Error> {
    let mut out = Tensor::full(
        f16::ZERO,
        &[q.shape().batch, q.shape().seq, 4, 16],
        Layout::Bshd,
    )?;
    attention_paged_into(q, k, k, pages, &mut out, None, opts).map(|_| ())
}

#[test]
fn page_table_errors() {
    let (q, k, pages) = small();
    let opts = AttentionOptions::default().causal(Causal::BottomRight);
    run(&q, &k, &pages, &opts).unwrap();
    let rule = |e: Error| match e {
        Error::InvalidPageTable { rule, sequence, .. } => (rule, sequence),
        other => panic!("{other:?}"),
    };
    // Page sizes: powers of two from 16 to 1024 only, and K's dim 1.
    for size in [8, 24, 2048] {
        let bad = PageTable::new(size, vec![vec![0], vec![1]], vec![4, 4]).unwrap();
        assert_eq!(
            rule(run(&q, &k, &bad, &opts).unwrap_err()),
            (PageRule::PageSize, None)
        );
    }
    let bad = PageTable::new(32, vec![vec![0, 1], vec![2, 3]], vec![40, 64]).unwrap();
    assert!(matches!(
        run(&q, &k, &bad, &opts).unwrap_err(),
        Error::ShapeMismatch {
            operand: Operand::K,
            ..
        }
    ));
    // A sequence longer than its pages hold.
    let bad = PageTable::new(16, vec![vec![3, 0, 9], vec![5, 2, 7]], vec![40, 64]).unwrap();
    assert_eq!(
        rule(run(&q, &k, &bad, &opts).unwrap_err()).0,
        PageRule::KeysBeyondPages
    );
    // A page outside the 10-page cache, or negative, where a sequence's keys reach it.
    let bad = PageTable::new(16, vec![vec![3, 0, 10], vec![5, 2, 7, 8]], vec![40, 64]).unwrap();
    let e = run(&q, &k, &bad, &opts).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidPageTable {
            rule: PageRule::PageIndex,
            sequence: Some(0),
            value: 10,
            bound: 10
        }
    );
    let bad = PageTable::new(16, vec![vec![3, 0, 9], vec![5, -1, 7, 8]], vec![40, 64]).unwrap();
    assert_eq!(
        rule(run(&q, &k, &bad, &opts).unwrap_err()),
        (PageRule::PageIndex, Some(1))
    );
    // ... but an entry past a sequence's keys is never read.
    let fine = PageTable::new(16, vec![vec![3, 0, 9, 99], vec![5, 2, 7, 8]], vec![40, 64]).unwrap();
    run(&q, &k, &fine, &opts).unwrap();
    // One row per query batch entry.
    let short = PageTable::new(16, vec![vec![3, 0, 9]], vec![40]).unwrap();
    assert!(matches!(
        run(&q, &k, &short, &opts).unwrap_err(),
        Error::ShapeMismatch {
            operand: Operand::BlockTable,
            ..
        }
    ));
    assert!(matches!(
        PageTable::new(16, vec![vec![0]], vec![1, 2]).unwrap_err(),
        Error::ShapeMismatch {
            operand: Operand::BlockTable,
            ..
        }
    ));
    // A sequence whose query sees no key.
    let empty = PageTable::new(16, vec![vec![3], vec![5]], vec![0, 4]).unwrap();
    assert!(matches!(
        run(&q, &k, &empty, &opts).unwrap_err(),
        Error::NoVisibleKeys { .. }
    ));
    // Nothing ran: the errors above left the output untouched (checked on one of them).
    let mut out = Tensor::full(f16::ONE, &[2, 1, 4, 16], Layout::Bshd).unwrap();
    let bad = PageTable::new(16, vec![vec![3, 0, 10], vec![5, 2, 7, 8]], vec![40, 64]).unwrap();
    assert!(attention_paged_into(&q, &k, &k, &bad, &mut out, None, &opts).is_err());
    assert!(out.host_data().unwrap().iter().all(|x| *x == f16::ONE));
}
