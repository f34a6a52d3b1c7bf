//! Paged KV caches (`AttentionConfig::paged`): K and V read through a block table equal the
//! same keys dense, for random tables (permuted pages, pages shared between sequences, unused
//! pages, partly filled last pages) and page sizes, on every path (decode, every tiled variant,
//! naive) and dtype; appends write through the table; bad tables are typed errors.

use crate::common;

use common::kv::{paged_cfg, random_paged};
use common::{assert_close_tol, assert_lse_close, cfg, ctx, fresh_seed, random, rel_tol};
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::{
    unstable::reference, AttentionConfig, Context, Element, Error, PagedKv, Tuning,
};
use rand::{rngs::StdRng, SeedableRng};

/// The dense keys of a paged call: `[batch, seq_kv, heads_kv, head_dim]` gathered through the
/// table.
fn densify(c: &AttentionConfig, pool: &[f32]) -> Vec<f32> {
    let p = c.paged.as_ref().unwrap();
    let row = c.heads_kv * c.head_dim;
    (0..c.batch)
        .flat_map(|b| (0..c.seq_kv).map(move |j| p.row(b, j)))
        .flat_map(|r| pool[r * row..(r + 1) * row].iter().copied())
        .collect()
}

fn paged_equals_dense<T: Element>(x: &Context, c: &AttentionConfig, what: &str) {
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let pool = c.kv_shape().iter().product();
    let q = to_f32_vec(&from_f32_slice::<T>(&random(
        &mut rng,
        c.batch * c.seq_q * c.heads_q * c.head_dim,
        1.5,
    )));
    let k = to_f32_vec(&from_f32_slice::<T>(&random(&mut rng, pool, 1.5)));
    let v = to_f32_vec(&from_f32_slice::<T>(&random(&mut rng, pool, 1.0)));
    let msg = format!("{what} {} {} seed {seed}", T::DTYPE, common::describe(c, 0));
    let f = x
        .forward_host(
            c,
            &from_f32_slice::<T>(&q),
            &from_f32_slice::<T>(&k),
            &from_f32_slice::<T>(&v),
        )
        .unwrap_or_else(|e| panic!("{e} ({msg})"));
    let mut dense = c.clone();
    dense.paged = None;
    let (kd, vd) = (densify(c, &k), densify(c, &v));
    let want = reference::forward(&dense, &q, &kd, &vd);
    assert_close_tol(
        "out",
        &to_f32_vec(&f.out),
        &want.out,
        rel_tol(T::DTYPE),
        &msg,
    );
    assert_lse_close(&f.lse, &want.lse, &msg);
    // and the dense call on the device gives the same
    let g = x
        .forward_host(
            &dense,
            &from_f32_slice::<T>(&q),
            &from_f32_slice::<T>(&kd),
            &from_f32_slice::<T>(&vd),
        )
        .unwrap();
    let dense_out: Vec<f64> = to_f32_vec(&g.out).iter().map(|&v| v as f64).collect();
    assert_close_tol(
        "out against dense",
        &to_f32_vec(&f.out),
        &dense_out,
        rel_tol(T::DTYPE),
        &msg,
    );
}

#[test]
fn paged_keys_equal_the_same_keys_dense_on_every_path() {
    let x = Context::new().unwrap();
    let seed = fresh_seed();
    // decode shapes (1 and 3 rows, split and not), then a prefill shape on every variant
    for (sq, page) in [(1, 16), (3, 7), (1, 1)] {
        let c = paged_cfg(&cfg(3, sq, 100, 8, 2, 32, true), page, seed ^ page as u64);
        paged_equals_dense::<f32>(&x, &c, "decode");
        paged_equals_dense::<half::f16>(&x, &c, "decode");
        let mut split = c.clone();
        split.kv_splits = Some(4);
        paged_equals_dense::<half::bf16>(&x, &split, "decode split");
    }
    let c = paged_cfg(&cfg(2, 21, 70, 4, 2, 24, true), 8, seed);
    for (algorithm, variant) in common::algorithm_variants() {
        x.set_tuning(Tuning {
            variant,
            ..x.tuning()
        })
        .unwrap();
        let mut c = c.clone();
        c.algorithm = algorithm;
        paged_equals_dense::<f32>(&x, &c, &format!("{algorithm:?} {variant:?}"));
    }
    // with the modifiers that read per-key data: ALiBi, a window, sinks, a bias
    let mut m = paged_cfg(&cfg(2, 2, 60, 4, 2, 16, true), 5, seed);
    m.alibi_slopes = Some(common::random_alibi(&m, true));
    m.window = flash_attn_wgpu::Window::new(Some(25), None);
    m.sinks = Some(common::random_sinks(&m));
    m.bias = Some(common::random_bias(&m, true, true, 0.05, 0));
    paged_equals_dense::<f32>(ctx(), &m, "modifiers");
}

#[test]
fn appends_write_through_the_block_table() {
    // prefill of 6 rows then a decode step, pages of 4: appends cross page boundaries; batch 1
    // shares batch 0's first page (a common prefix of 4 rows) and appends go past it
    let seed = fresh_seed();
    let mut c = cfg(2, 1, 40, 4, 2, 16, true);
    c.paged = Some(random_paged(&mut StdRng::seed_from_u64(seed), 2, 10, 4));
    append_through_the_table(&c, &[4, 4], seed);
}

/// A prefill of 6 rows then a decode step through `c`'s table from the lengths `lens`: the
/// pools after each step equal the host's copy with the new rows written at `PagedKv::row`
/// (every other row untouched), and each batch's out equals the reference over its keys.
fn append_through_the_table(c: &AttentionConfig, lens: &[usize], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let x = ctx();
    let p = c.paged.clone().unwrap();
    let (bn, row) = (c.batch, c.heads_kv * c.head_dim);
    let pool_n: usize = c.kv_shape().iter().product();
    let mut k = random(&mut rng, pool_n, 1.5);
    let mut v = random(&mut rng, pool_n, 1.0);
    let mut kd = x.upload(&k, &c.kv_shape()).unwrap();
    let mut vd = x.upload(&v, &c.kv_shape()).unwrap();
    let mut lens = lens.to_vec();
    for (step, rows) in [6usize, 1].into_iter().enumerate() {
        let mut sc = c.clone();
        sc.seq_q = rows;
        let q = random(&mut rng, bn * rows * c.heads_q * c.head_dim, 1.5);
        let kn = random(&mut rng, bn * rows * row, 1.5);
        let vn = random(&mut rng, bn * rows * row, 1.0);
        let shape = [bn, rows, c.heads_kv, c.head_dim];
        let f = x
            .forward_with_kvcache(
                &sc,
                &x.upload(&q, &sc.q_shape()).unwrap(),
                &mut kd,
                &mut vd,
                &lens,
                Some((
                    &x.upload(&kn, &shape).unwrap(),
                    &x.upload(&vn, &shape).unwrap(),
                )),
            )
            .unwrap();
        let out: Vec<f32> = x.download(&f.out).unwrap();
        for b in 0..bn {
            for r in 0..rows {
                let at = p.row(b, lens[b] + r) * row;
                k[at..at + row]
                    .copy_from_slice(&kn[(b * rows + r) * row..(b * rows + r + 1) * row]);
                v[at..at + row]
                    .copy_from_slice(&vn[(b * rows + r) * row..(b * rows + r + 1) * row]);
            }
        }
        assert_eq!(
            x.download::<f32>(&kd).unwrap(),
            k,
            "k pool after step {step} (seed {seed})"
        );
        assert_eq!(
            x.download::<f32>(&vd).unwrap(),
            v,
            "v pool after step {step} (seed {seed})"
        );
        for (b, n) in lens.iter_mut().enumerate() {
            *n += rows;
            let mut one = sc.clone();
            one.batch = 1;
            one.seq_kv = *n;
            one.paged = None;
            let keys: Vec<f32> = (0..*n)
                .flat_map(|j| k[p.row(b, j) * row..(p.row(b, j) + 1) * row].to_vec())
                .collect();
            let vals: Vec<f32> = (0..*n)
                .flat_map(|j| v[p.row(b, j) * row..(p.row(b, j) + 1) * row].to_vec())
                .collect();
            let qs = rows * c.heads_q * c.head_dim;
            let want = reference::forward(&one, &q[b * qs..(b + 1) * qs], &keys, &vals);
            let msg = format!("batch {b} step {step} seed {seed}");
            assert_close_tol("out", &out[b * qs..(b + 1) * qs], &want.out, 1e-4, &msg);
        }
    }
}

#[test]
fn bad_block_tables_and_paged_backward_are_typed_errors() {
    let mut c = cfg(2, 1, 8, 2, 1, 8, false);
    let table = |t: Vec<u32>| PagedKv {
        page_size: 4,
        num_pages: 3,
        pages_per_seq: 2,
        block_table: t,
    };
    let invalid = |c: &AttentionConfig, want: &str| match c.validate() {
        Err(Error::InvalidConfig(m)) => assert!(m.contains(want), "{m}"),
        other => panic!("expected InvalidConfig with {want:?}, got {other:?}"),
    };
    c.paged = Some(table(vec![0, 1, 2, 3]));
    invalid(
        &c,
        "block_table[3] (batch 1, page 1) is 3, past the pool's 3 pages",
    );
    c.paged = Some(table(vec![0, 1, 2]));
    invalid(
        &c,
        "block_table must hold batch x pages_per_seq = 2 x 2 = 4 entries, got 3",
    );
    c.paged = Some(table(vec![0, 1, 2, 0]));
    c.seq_kv = 9;
    invalid(&c, "seq_kv must be pages_per_seq x page_size");
    c.seq_kv = 8;
    c.validate().unwrap();
    // the pools, not [batch, seq_kv, ...], are what k and v must be
    assert_eq!(c.kv_shape(), [3, 4, 1, 8]);
    let q = vec![0.5f32; 2 * 2 * 8];
    let dense = vec![0.5f32; 2 * 8 * 8];
    assert!(matches!(
        ctx().forward_host(&c, &q, &dense, &dense),
        Err(Error::SliceLength { .. })
    ));
    let pool = vec![0.25f32; 3 * 4 * 8];
    let f = ctx().forward_host(&c, &q, &pool, &pool).unwrap();
    match ctx().backward_host(&c, &q, &pool, &pool, &f.out, &f.lse, &q) {
        Err(Error::Unsupported { feature, .. }) => assert!(feature.contains("paged")),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn cache_batch_idx_reads_and_appends_the_cache_rows_it_names() {
    // flash-attn's cache_batch_idx as a one-page-per-sequence table: batch entries 0 and 1
    // use rows 2 and 0 of a 3-row dense cache; row 1 is never written (the pool checks)
    let cap = 20;
    let mut c = cfg(2, 1, cap, 4, 2, 16, true);
    c.paged = Some(PagedKv::cache_rows(3, cap, vec![2, 0]));
    assert_eq!(c.kv_shape(), [3, cap, 2, 16]);
    append_through_the_table(&c, &[5, 12], fresh_seed());
    // an index past the cache, and one row named twice whose appends meet: typed errors
    let x = ctx();
    let mut kd = x.zeros(&c.kv_shape()).unwrap();
    let mut vd = x.zeros(&c.kv_shape()).unwrap();
    let (q, kn) = (
        x.zeros(&c.q_shape()).unwrap(),
        x.zeros(&[2, 1, 2, 16]).unwrap(),
    );
    let cases = [
        (vec![3, 0], [5, 12], "past the pool's 3 pages"),
        (
            vec![1, 1],
            [6, 6],
            "batches 0 and 1 would both write page 1, row 6",
        ),
    ];
    for (idx, lens, want) in cases {
        let mut bad = c.clone();
        bad.paged = Some(PagedKv::cache_rows(3, cap, idx));
        match x.forward_with_kvcache(&bad, &q, &mut kd, &mut vd, &lens, Some((&kn, &kn))) {
            Err(Error::InvalidConfig(m)) => assert!(m.contains(want), "{m}"),
            other => panic!("expected InvalidConfig with {want:?}, got {other:?}"),
        }
    }
}
