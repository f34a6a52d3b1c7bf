//! KV-cache calls checked against the f64 reference over exactly the keys each batch holds.

use super::{assert_close_tol, assert_lse_close, fresh_seed, random, rel_tol};
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::{unstable::reference, AttentionBackend, AttentionConfig, Element, PagedKv};
use rand::seq::SliceRandom;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Two steps on a dense cache on `b` in `T`: a prefill-like append of `new` rows with as many
/// queries, then a decode step of one row; after each, every batch's out and lse equal the
/// reference over exactly its keys (cache rows then new rows, standard bottom-right
/// alignment), the appended rows sit at each batch's length and no other cache row changed.
/// Cache rows past each batch's length hold NaN, which must never reach a result; so do the
/// rows before each batch's left padding (`base.leftpad_kv`), and the reference attends over
/// the keys after it alone (the padding is as if it were not there).
pub fn append_and_attend<B: AttentionBackend, T: Element>(
    b: &B,
    base: &AttentionConfig,
    lens: &[usize],
    new: usize,
) {
    append_and_attend_with::<B, T>(b, base, lens, new, None)
}

/// A rotary embedding for [`append_and_attend_with`]: the dims it turns and how it pairs them.
#[derive(Debug, Clone, Copy)]
pub struct Rope {
    pub rotary_dim: usize,
    pub interleaved: bool,
}

/// RoPE tables `[rows, rotary_dim / 2]` in `T` (as f32 values): angle `p * 10000^(-2f / rd)`.
pub fn rope_tables<T: Element>(rows: usize, rotary_dim: usize) -> (Vec<f32>, Vec<f32>) {
    let cols = rotary_dim / 2;
    let angle = |p: usize, f: usize| p as f64 * 10000f64.powf(-2.0 * f as f64 / rotary_dim as f64);
    let table = |g: fn(f64) -> f64| -> Vec<f32> {
        let t: Vec<f32> = (0..rows * cols)
            .map(|e| g(angle(e / cols, e % cols)) as f32)
            .collect();
        to_f32_vec(&from_f32_slice::<T>(&t))
    };
    (table(f64::cos), table(f64::sin))
}

/// [`append_and_attend`], optionally with a rotary embedding fused into the call
/// (`forward_with_kvcache_rotary`): the reference rotates q and the new keys on the host
/// (`reference::rotary`, rounded to `T` as the call stores them), and the appended cache rows
/// must be the rotated keys to `T`'s rounding.
pub fn append_and_attend_with<B: AttentionBackend, T: Element>(
    b: &B,
    base: &AttentionConfig,
    lens: &[usize],
    new: usize,
    rope: Option<Rope>,
) {
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let c = base;
    let row = c.heads_kv * c.head_dim;
    let cap = c.seq_kv;
    let msg = format!("{} lens {lens:?} new {new} {rope:?} seed {seed}", T::DTYPE);
    // tables for every position of the cache, on the device once
    let tables = rope.map(|r| {
        let (cos, sin) = rope_tables::<T>(cap, r.rotary_dim);
        let shape = [cap, r.rotary_dim / 2];
        let up = |t: &[f32]| b.upload(&from_f32_slice::<T>(t), &shape).unwrap();
        let (cd, sd) = (up(&cos), up(&sin));
        (r, cos, sin, cd, sd)
    });
    // the caches: random rows from each left padding to each length, NaN elsewhere
    let mut kc = random(&mut rng, c.batch * cap * row, 1.5);
    let mut vc = random(&mut rng, c.batch * cap * row, 1.0);
    for (bi, &n) in lens.iter().enumerate() {
        let hidden = [
            bi * cap..bi * cap + c.kv_start(bi),
            bi * cap + n..(bi + 1) * cap,
        ];
        for r in hidden.into_iter().flatten() {
            kc[r * row..(r + 1) * row].fill(f32::NAN);
            vc[r * row..(r + 1) * row].fill(f32::NAN);
        }
    }
    let mut kc: Vec<f32> = to_f32_vec(&from_f32_slice::<T>(&kc));
    let mut vc: Vec<f32> = to_f32_vec(&from_f32_slice::<T>(&vc));
    let mut kd = b.upload(&from_f32_slice::<T>(&kc), &c.kv_shape()).unwrap();
    let mut vd = b.upload(&from_f32_slice::<T>(&vc), &c.kv_shape()).unwrap();
    let mut lens = lens.to_vec();
    for (step, rows) in [new, 1].into_iter().enumerate() {
        let mut sc = c.clone();
        sc.seq_q = rows;
        let q = to_f32_vec(&from_f32_slice::<T>(&random(
            &mut rng,
            c.batch * rows * c.heads_q * c.head_dim,
            1.5,
        )));
        let kn = to_f32_vec(&from_f32_slice::<T>(&random(
            &mut rng,
            c.batch * rows * row,
            1.5,
        )));
        let vn = to_f32_vec(&from_f32_slice::<T>(&random(
            &mut rng,
            c.batch * rows * row,
            1.0,
        )));
        let new_shape = [c.batch, rows, c.heads_kv, c.head_dim];
        let (qd, knd, vnd) = (
            b.upload(&from_f32_slice::<T>(&q), &sc.q_shape()).unwrap(),
            b.upload(&from_f32_slice::<T>(&kn), &new_shape).unwrap(),
            b.upload(&from_f32_slice::<T>(&vn), &new_shape).unwrap(),
        );
        let f = match &tables {
            None => b.forward_with_kvcache(&sc, &qd, &mut kd, &mut vd, &lens, Some((&knd, &vnd))),
            Some((r, _, _, cd, sd)) => b.forward_with_kvcache_rotary(
                &sc,
                &qd,
                &mut kd,
                &mut vd,
                &lens,
                Some((&knd, &vnd)),
                flash_attn_wgpu::Rotary {
                    cos: cd,
                    sin: sd,
                    interleaved: r.interleaved,
                },
            ),
        }
        .unwrap_or_else(|e| panic!("step {step}: {e} ({msg})"));
        // what the call attends with: q and the new keys rotated on the host, in T
        let (q, kn) = match &tables {
            None => (q, kn),
            Some((r, cos, sin, _, _)) => {
                // flash-attn's rule, written out here: new key i of batch b at lens[b] + i;
                // query i there too with a causal mask or a window, else at lens[b]
                let turns = sc.causal || sc.window != flash_attn_wgpu::Window::default();
                let at = |step| flash_attn_wgpu::Positions {
                    start: lens.clone(),
                    step,
                };
                let (qp, kp) = (at(usize::from(turns)), at(1));
                let turn = |x: &[f32], heads: usize, p: &flash_attn_wgpu::Positions| {
                    let y = reference::rotary(
                        x,
                        [c.batch, rows, heads, c.head_dim],
                        (cos, sin, r.rotary_dim / 2),
                        r.interleaved,
                        p,
                    );
                    let y: Vec<f32> = y.iter().map(|&v| v as f32).collect();
                    to_f32_vec(&from_f32_slice::<T>(&y))
                };
                let (qr, kr) = (turn(&q, c.heads_q, &qp), turn(&kn, c.heads_kv, &kp));
                // the rotation changed what it turns (a test that rotates nothing proves
                // nothing) and kept the other dims
                assert!(kr.iter().zip(&kn).any(|(a, b)| a != b), "{msg}");
                (qr, kr)
            }
        };
        let out = to_f32_vec(&b.download::<T>(&f.out).unwrap());
        let lse = b.download::<f32>(&f.lse).unwrap();
        // the caches now: the new rows at each length
        for (bi, &n) in lens.iter().enumerate() {
            let at = (bi * cap + n) * row;
            kc[at..at + rows * row].copy_from_slice(&kn[bi * rows * row..(bi + 1) * rows * row]);
            vc[at..at + rows * row].copy_from_slice(&vn[bi * rows * row..(bi + 1) * rows * row]);
        }
        // exact, but for rotated keys, which the device turns in f32 and the host in f64:
        // one rounding of T apart, or f32's cancellation in `x c - y s` (inputs of size ~1)
        let ulp = match T::DTYPE {
            flash_attn_wgpu::DType::F32 => 1e-6,
            flash_attn_wgpu::DType::F16 => 1.0 / 1024.0,
            flash_attn_wgpu::DType::BF16 => 1.0 / 128.0,
        };
        let slack = if rope.is_some() { ulp } else { 0.0 };
        let same = |got: Vec<f32>, want: &[f32], what: &str| {
            assert!(
                got.iter().zip(want).all(|(g, w)| g == w
                    || (g.is_nan() && w.is_nan())
                    || (g - w).abs() as f64 <= slack * (1.0 + w.abs() as f64)),
                "{what} after step {step} ({msg})"
            )
        };
        same(to_f32_vec(&b.download::<T>(&kd).unwrap()), &kc, "k_cache");
        same(to_f32_vec(&b.download::<T>(&vd).unwrap()), &vc, "v_cache");
        for (bi, n) in lens.iter_mut().enumerate() {
            *n += rows;
            // batch bi alone, over exactly its keys: from its left padding to its length
            let pad = sc.kv_start(bi);
            let mut one = sc.clone();
            one.batch = 1;
            one.seq_kv = *n - pad;
            one.leftpad_kv = None;
            if let Some(s) = &sc.alibi_slopes {
                if s.len() != sc.heads_q {
                    one.alibi_slopes = Some(s[bi * sc.heads_q..(bi + 1) * sc.heads_q].to_vec());
                }
            }
            let qs = rows * c.heads_q * c.head_dim;
            let want = reference::forward(
                &one,
                &q[bi * qs..(bi + 1) * qs],
                &kc[(bi * cap + pad) * row..(bi * cap + *n) * row],
                &vc[(bi * cap + pad) * row..(bi * cap + *n) * row],
            );
            let m = format!("batch {bi} step {step} ({msg})");
            assert_close_tol(
                "out",
                &out[bi * qs..(bi + 1) * qs],
                &want.out,
                rel_tol(T::DTYPE),
                &m,
            );
            let ls = c.heads_q * rows;
            assert_lse_close(&lse[bi * ls..(bi + 1) * ls], &want.lse, &m);
        }
    }
}

/// A random block table for `batch` sequences of `pages_per_seq` pages over a pool with a few
/// spare pages: pages permuted, and batch 1 sharing batch 0's first page (a common prefix).
pub fn random_paged(
    rng: &mut StdRng,
    batch: usize,
    pages_per_seq: usize,
    page_size: usize,
) -> PagedKv {
    let num_pages = batch * pages_per_seq + 3;
    let mut pages: Vec<u32> = (0..num_pages as u32).collect();
    pages.shuffle(rng);
    let mut block_table: Vec<u32> = pages[..batch * pages_per_seq].to_vec();
    if batch > 1 {
        block_table[pages_per_seq] = block_table[0];
    }
    PagedKv {
        page_size,
        num_pages,
        pages_per_seq,
        block_table,
    }
}

/// A paged call's config: `base` with its keys in pages of `page_size`, each batch holding a
/// random length (partly filled last pages), aligned per batch as a KV cache.
pub fn paged_cfg(base: &AttentionConfig, page_size: usize, seed: u64) -> AttentionConfig {
    let mut rng = StdRng::seed_from_u64(seed);
    let pages_per_seq = base.seq_kv.div_ceil(page_size);
    let mut c = base.clone();
    c.seq_kv = pages_per_seq * page_size;
    c.paged = Some(random_paged(&mut rng, c.batch, pages_per_seq, page_size));
    c.seqlens_kv = Some(
        (0..c.batch)
            .map(|_| rng.random_range(1..=c.seq_kv))
            .collect(),
    );
    c.align_to_seqlens = true;
    c
}
