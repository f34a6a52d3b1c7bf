//! KV-cache calls checked against the f64 reference over exactly the keys each batch holds.

use super::{assert_close_tol, assert_lse_close, fresh_seed, random, rel_tol};
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::{unstable::reference, AttentionBackend, AttentionConfig, Element, PagedKv};
use rand::seq::SliceRandom;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// `r` is a shape error for `role` with the `expected` and `got` shapes (SEMANTICS.md: a
/// cache of another shape is `Error::Shape`, naming the cache).
pub fn assert_shape_error<X: std::fmt::Debug>(
    r: flash_attn_wgpu::Result<X>,
    role: flash_attn_wgpu::TensorRole,
    expected: &[usize],
    got: &[usize],
) {
    match r {
        Err(flash_attn_wgpu::Error::Shape {
            tensor,
            expected: e,
            got: g,
        }) => assert_eq!((tensor, &e[..], &g[..]), (role, expected, got)),
        other => panic!("expected a shape error for {role:?}, got {other:?}"),
    }
}

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
    // a cache row of k, of v (head_dim_v wide)
    let (row, vrow) = (c.heads_kv * c.head_dim, c.heads_kv * c.dv());
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
    let mut vc = random(&mut rng, c.batch * cap * vrow, 1.0);
    for (bi, &n) in lens.iter().enumerate() {
        let hidden = [
            bi * cap..bi * cap + c.kv_start(bi),
            bi * cap + n..(bi + 1) * cap,
        ];
        for r in hidden.into_iter().flatten() {
            kc[r * row..(r + 1) * row].fill(f32::NAN);
            vc[r * vrow..(r + 1) * vrow].fill(f32::NAN);
        }
    }
    let mut kc: Vec<f32> = to_f32_vec(&from_f32_slice::<T>(&kc));
    let mut vc: Vec<f32> = to_f32_vec(&from_f32_slice::<T>(&vc));
    let mut kd = b.upload(&from_f32_slice::<T>(&kc), &c.kv_shape()).unwrap();
    let mut vd = b.upload(&from_f32_slice::<T>(&vc), &c.v_shape()).unwrap();
    let mut lens = lens.to_vec();
    for (step, rows) in [new, 1].into_iter().enumerate() {
        let mut sc = c.clone();
        sc.seq_q = rows;
        let q = rounded::<T>(&mut rng, c.batch * rows * c.heads_q * c.head_dim, 1.5);
        let kn = rounded::<T>(&mut rng, c.batch * rows * row, 1.5);
        let vn = rounded::<T>(&mut rng, c.batch * rows * vrow, 1.0);
        let new_shape = [c.batch, rows, c.heads_kv, c.head_dim];
        let new_v = [c.batch, rows, c.heads_kv, c.dv()];
        let (qd, knd, vnd) = (
            b.upload(&from_f32_slice::<T>(&q), &sc.q_shape()).unwrap(),
            b.upload(&from_f32_slice::<T>(&kn), &new_shape).unwrap(),
            b.upload(&from_f32_slice::<T>(&vn), &new_v).unwrap(),
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
                host_rotation::<T>(&sc, &lens, (q, kn), (*r, cos, sin), &msg)
            }
        };
        let out = to_f32_vec(&b.download::<T>(&f.out).unwrap());
        let lse = b.download::<f32>(&f.lse).unwrap();
        // the caches now: the new rows at each length
        for (bi, &n) in lens.iter().enumerate() {
            let (at, vat) = ((bi * cap + n) * row, (bi * cap + n) * vrow);
            kc[at..at + rows * row].copy_from_slice(&kn[bi * rows * row..(bi + 1) * rows * row]);
            vc[vat..vat + rows * vrow]
                .copy_from_slice(&vn[bi * rows * vrow..(bi + 1) * rows * vrow]);
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
            let pad = sc.kv_start(bi);
            let held = (
                &kc[(bi * cap + pad) * row..(bi * cap + *n) * row],
                &vc[(bi * cap + pad) * vrow..(bi * cap + *n) * vrow],
            );
            let m = format!("batch {bi} step {step} ({msg})");
            check_batch(&sc, (bi, *n), &q, held, (&out, &lse), T::DTYPE, &m);
        }
    }
}

/// q and the new keys of a KV-cache step (`sc`: the step's config, `lens` each batch's rows
/// before it) rotated on the host as the call rotates them, rounded to `T`: flash-attn's rule,
/// written out here, new key i of batch b at lens[b] + i, query i there too with a causal mask
/// or a window, else at lens[b]. Asserts the rotation changed the keys (a test that rotates
/// nothing proves nothing).
fn host_rotation<T: Element>(
    sc: &AttentionConfig,
    lens: &[usize],
    (q, kn): (Vec<f32>, Vec<f32>),
    (r, cos, sin): (Rope, &[f32], &[f32]),
    msg: &str,
) -> (Vec<f32>, Vec<f32>) {
    let turns = sc.causal || sc.window != flash_attn_wgpu::Window::default();
    let at = |step| flash_attn_wgpu::Positions {
        start: lens.to_vec(),
        step,
    };
    let turn = |x: &[f32], heads: usize, p: &flash_attn_wgpu::Positions| {
        let y = reference::rotary(
            x,
            [sc.batch, sc.seq_q, heads, sc.head_dim],
            (cos, sin, r.rotary_dim / 2),
            r.interleaved,
            p,
        );
        let y: Vec<f32> = y.iter().map(|&v| v as f32).collect();
        to_f32_vec(&from_f32_slice::<T>(&y))
    };
    let (qr, kr) = (
        turn(&q, sc.heads_q, &at(usize::from(turns))),
        turn(&kn, sc.heads_kv, &at(1)),
    );
    assert!(kr.iter().zip(&kn).any(|(a, b)| a != b), "{msg}");
    (qr, kr)
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

/// [`append_and_attend`] over 8-bit caches (`forward_with_quantized_kvcache`, or `_rotary`
/// with `rope`: q and the new keys rotated on the host for the reference) in `format`, dense or
/// paged (`base.paged`: `lens` are then the rows each batch's table holds):
/// two steps (an append of `new` rows with as many queries, then a decode step); after each,
/// the cache is downloaded and dequantized on the host and
/// - rows the call did not append read back exactly as before (NaN where they were NaN: the
///   rows past each length and before each left padding, never read into a result);
/// - each appended value lies within the format's rounding of the new key or value (q8_0: half
///   its block's step, plus 127 times the f16 rounding of the step, as ggml quantizes with the
///   f32 step and stores the f16 one; E4M3: 2^-4 relative, or half a subnormal step of its
///   head's scale);
/// - out and lse equal the f64 reference over the dequantized keys each batch holds, to `T`'s
///   rounding (the kernels scale the same bytes by the same scales, in f32).
///
/// Returns the largest error of out against the reference over the unquantized keys and values,
/// relative to the largest |out| of its batch (what 8 bits cost, reported in
/// docs/PRECISION.md).
pub fn quantized_append_and_attend<B: AttentionBackend, T: Element>(
    x: &B,
    base: &AttentionConfig,
    lens: &[usize],
    new: usize,
    (format, rope): (flash_attn_wgpu::CacheFormat, Option<Rope>),
) -> f64 {
    use flash_attn_wgpu::CacheFormat;
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let c = base;
    // a cache row of k, of v (head_dim_v wide)
    let (row, vrow) = (c.heads_kv * c.head_dim, c.heads_kv * c.dv());
    let (shape, vshape) = (c.kv_shape(), c.v_shape());
    let msg = format!("{} {format} lens {lens:?} new {new} seed {seed}", T::DTYPE);
    // cache row of (batch, position)
    let at = |b: usize, pos: usize| match &c.paged {
        Some(p) => p.row(b, pos),
        None => b * c.seq_kv + pos,
    };
    // every pool row NaN but those from each left padding to each length
    let pool_rows = shape[0] * shape[1];
    let mut kc = vec![f32::NAN; pool_rows * row];
    let mut vc = vec![f32::NAN; pool_rows * vrow];
    for (bi, &n) in lens.iter().enumerate() {
        for pos in c.kv_start(bi)..n {
            let r = at(bi, pos);
            kc[r * row..(r + 1) * row].copy_from_slice(&random(&mut rng, row, 1.5));
            vc[r * vrow..(r + 1) * vrow].copy_from_slice(&random(&mut rng, vrow, 1.0));
        }
    }
    let scales = |t: &[f32], s: [usize; 4]| {
        (format == CacheFormat::E4M3).then(|| CacheFormat::e4m3_head_scales(t, s))
    };
    let (ks, vs) = (scales(&kc, shape), scales(&vc, vshape));
    let mut kd = x
        .quantized_cache(format, &kc, shape, ks.as_deref())
        .unwrap();
    let mut vd = x
        .quantized_cache(format, &vc, vshape, vs.as_deref())
        .unwrap();
    let mut kq = x.dequantize_cache(&kd).unwrap();
    let mut vq = x.dequantize_cache(&vd).unwrap();
    let mut lens = lens.to_vec();
    let mut worst = 0f64;
    // rotary tables for every position, on the device once
    let positions = lens.iter().max().unwrap_or(&0) + new + 1;
    let tables = rope.map(|r| {
        let (cos, sin) = rope_tables::<T>(positions, r.rotary_dim);
        let shape = [positions, r.rotary_dim / 2];
        let up = |t: &[f32]| x.upload(&from_f32_slice::<T>(t), &shape).unwrap();
        let (cd, sd) = (up(&cos), up(&sin));
        (r, cos, sin, cd, sd)
    });
    for (step, rows) in [new, 1].into_iter().enumerate() {
        let mut sc = c.clone();
        sc.seq_q = rows;
        let q = rounded::<T>(&mut rng, c.batch * rows * c.heads_q * c.head_dim, 1.5);
        let kn = rounded::<T>(&mut rng, c.batch * rows * row, 1.5);
        let vn = rounded::<T>(&mut rng, c.batch * rows * vrow, 1.0);
        let new_shape = [c.batch, rows, c.heads_kv, c.head_dim];
        let new_v = [c.batch, rows, c.heads_kv, c.dv()];
        let up = |t: &[f32], s: &[usize]| x.upload(&from_f32_slice::<T>(t), s).unwrap();
        let (qd, knd, vnd) = (up(&q, &sc.q_shape()), up(&kn, &new_shape), up(&vn, &new_v));
        let caches = (&mut kd, &mut vd);
        let f = match &tables {
            None => x.forward_with_quantized_kvcache(&sc, &qd, caches, &lens, Some((&knd, &vnd))),
            Some((r, _, _, cd, sd)) => x.forward_with_quantized_kvcache_rotary(
                &sc,
                &qd,
                caches,
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
                host_rotation::<T>(&sc, &lens, (q, kn), (*r, cos, sin), &msg)
            }
        };
        // the device rotates in f32 and the host in f64, each rounding to T: an ulp apart
        let slack = if rope.is_some() {
            2.0 * T::DTYPE.unit_roundoff() as f32
        } else {
            0.0
        };
        let out = to_f32_vec(&x.download::<T>(&f.out).unwrap());
        let lse = x.download::<f32>(&f.lse).unwrap();
        let (k_now, v_now) = (
            x.dequantize_cache(&kd).unwrap(),
            x.dequantize_cache(&vd).unwrap(),
        );
        // the appended rows' records, and the unquantized keys and values each batch holds
        let mut appended = vec![false; pool_rows];
        let (mut k_exact, mut v_exact) = (kc.clone(), vc.clone());
        for (bi, &n) in lens.iter().enumerate() {
            for i in 0..rows {
                let r = at(bi, n + i);
                appended[r] = true;
                let src = (bi * rows + i) * row;
                k_exact[r * row..(r + 1) * row].copy_from_slice(&kn[src..src + row]);
                let vsrc = (bi * rows + i) * vrow;
                v_exact[r * vrow..(r + 1) * vrow].copy_from_slice(&vn[vsrc..vsrc + vrow]);
            }
        }
        for (what, now, before, exact, sc_, (row, dim)) in [
            ("k", &k_now, &kq, &k_exact, &ks, (row, c.head_dim)),
            ("v", &v_now, &vq, &v_exact, &vs, (vrow, c.dv())),
        ] {
            for (r, &appended) in appended.iter().enumerate() {
                let span = r * row..(r + 1) * row;
                if !appended {
                    let same = now[span.clone()]
                        .iter()
                        .zip(&before[span])
                        .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
                    assert!(same, "{what} cache row {r} changed at step {step} ({msg})");
                    continue;
                }
                for (e, (&got, &want)) in now[span.clone()].iter().zip(&exact[span]).enumerate() {
                    let head_scale = sc_.as_ref().map_or(0.0, |s| s[(e / dim) % c.heads_kv]);
                    let block = &exact[r * row + e / 32 * 32..][..32];
                    let bound = stored_bound(format, want, block, head_scale, slack);
                    assert!(
                        (got - want).abs() <= bound,
                        "{what} cache row {r} elem {e}: {want} stored as {got} (bound {bound}) at step {step} ({msg})"
                    );
                }
            }
        }
        (kq, vq, kc, vc) = (k_now, v_now, k_exact, v_exact);
        for (bi, n) in lens.iter_mut().enumerate() {
            *n += rows;
            let pad = sc.kv_start(bi);
            let gather = |t: &[f32], row: usize| -> Vec<f32> {
                (pad..*n)
                    .flat_map(|pos| t[at(bi, pos) * row..(at(bi, pos) + 1) * row].to_vec())
                    .collect()
            };
            let m = format!("batch {bi} step {step} ({msg})");
            let held = (&gather(&kq, row)[..], &gather(&vq, vrow)[..]);
            let one = check_batch(&sc, (bi, *n), &q, held, (&out, &lse), T::DTYPE, &m);
            let (qs, os) = (rows * c.heads_q * c.head_dim, rows * c.heads_q * c.dv());
            let qb = &q[bi * qs..(bi + 1) * qs];
            let exact = reference::forward(&one, qb, &gather(&kc, row), &gather(&vc, vrow));
            let scale = exact.out.iter().fold(1e-30f64, |m, w| m.max(w.abs()));
            for (g, w) in out[bi * os..(bi + 1) * os].iter().zip(&exact.out) {
                worst = worst.max((*g as f64 - w).abs() / scale);
            }
        }
    }
    worst
}

/// How far an 8-bit cache may store `want` from itself: q8_0 by its block of 32 (`block`),
/// E4M3 by its kv head's scale; `slack` a relative allowance beside (rotated keys).
fn stored_bound(
    format: flash_attn_wgpu::CacheFormat,
    want: f32,
    block: &[f32],
    head_scale: f32,
    slack: f32,
) -> f32 {
    match format {
        flash_attn_wgpu::CacheFormat::Q8_0 => {
            let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
            // ggml's rule: q = round(x / d) with d in f32, stored as f16(d): half a step, plus
            // |q| <= 127 times the scale's rounding
            let d = amax / 127.0;
            let d16 = half::f16::from_f32(d).to_f32();
            0.51 * d16 + 127.0 * (d - d16).abs() + slack * amax
        }
        flash_attn_wgpu::CacheFormat::E4M3 => {
            want.abs() / 15.9 + head_scale / 1000.0 + slack * want.abs()
        }
    }
}

/// The cache of [`latent_append_and_attend`]: f32/f16/bf16 or 8-bit.
enum Latent<B: AttentionBackend> {
    Plain(B::Tensor),
    Eight(flash_attn_wgpu::QuantizedCache<B::Tensor>),
}

/// Two steps (`new` rows, then 1) on an MLA latent cache (`forward_with_latent_cache`, or its
/// 8-bit form with `format`): one cache `base.kv_shape()` (dense, or the pool of `base.paged`),
/// whose values are the first `head_dim_v` dims of each key row. Every pool row but those from
/// each left padding to each length holds NaN, which must never reach a result. After each
/// step: the new rows sit at each batch's length (exactly, or within the format's rounding),
/// written once; no other row changed; every batch's out and lse equal the f64 reference over
/// exactly its keys, its values cut from them.
pub fn latent_append_and_attend<B: AttentionBackend, T: Element>(
    x: &B,
    base: &AttentionConfig,
    lens: &[usize],
    new: usize,
    format: Option<flash_attn_wgpu::CacheFormat>,
) {
    use flash_attn_wgpu::CacheFormat;
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let c = base;
    let (row, dv) = (c.heads_kv * c.head_dim, c.dv());
    let shape = c.kv_shape();
    let msg = format!(
        "latent {} {format:?} lens {lens:?} new {new} seed {seed}",
        T::DTYPE
    );
    let at = |b: usize, pos: usize| match &c.paged {
        Some(p) => p.row(b, pos),
        None => b * c.seq_kv + pos,
    };
    let pool_rows = shape[0] * shape[1];
    let mut kc = vec![f32::NAN; pool_rows * row];
    for (bi, &n) in lens.iter().enumerate() {
        for pos in c.kv_start(bi)..n {
            let r = at(bi, pos);
            kc[r * row..(r + 1) * row].copy_from_slice(&rounded::<T>(&mut rng, row, 1.5));
        }
    }
    let scales = format
        .filter(|&f| f == CacheFormat::E4M3)
        .map(|_| CacheFormat::e4m3_head_scales(&kc, shape));
    let mut cache: Latent<B> = match format {
        None => Latent::Plain(x.upload(&from_f32_slice::<T>(&kc), &shape).unwrap()),
        Some(f) => Latent::Eight(x.quantized_cache(f, &kc, shape, scales.as_deref()).unwrap()),
    };
    let read = |cache: &Latent<B>| match cache {
        Latent::Plain(t) => to_f32_vec(&x.download::<T>(t).unwrap()),
        Latent::Eight(q) => x.dequantize_cache(q).unwrap(),
    };
    let mut held = read(&cache);
    let mut lens = lens.to_vec();
    for (step, rows) in [new, 1].into_iter().enumerate() {
        let mut sc = c.clone();
        sc.seq_q = rows;
        let q = rounded::<T>(&mut rng, c.batch * rows * c.heads_q * c.head_dim, 1.5);
        let kn = rounded::<T>(&mut rng, c.batch * rows * row, 1.5);
        let up = |t: &[f32], s: &[usize]| x.upload(&from_f32_slice::<T>(t), s).unwrap();
        let (qd, knd) = (
            up(&q, &sc.q_shape()),
            up(&kn, &[c.batch, rows, c.heads_kv, c.head_dim]),
        );
        let f = match &mut cache {
            Latent::Plain(t) => x.forward_with_latent_cache(&sc, &qd, t, &lens, Some(&knd)),
            Latent::Eight(q8) => {
                x.forward_with_quantized_latent_cache(&sc, &qd, q8, &lens, Some(&knd))
            }
        }
        .unwrap_or_else(|e| panic!("step {step}: {e} ({msg})"));
        let out = to_f32_vec(&x.download::<T>(&f.out).unwrap());
        let lse = x.download::<f32>(&f.lse).unwrap();
        let now = read(&cache);
        let mut appended = vec![None; pool_rows];
        for (bi, &n) in lens.iter().enumerate() {
            for i in 0..rows {
                appended[at(bi, n + i)] = Some((bi * rows + i) * row);
            }
        }
        for (r, src) in appended.iter().enumerate() {
            let span = r * row..(r + 1) * row;
            let Some(src) = *src else {
                let same = now[span.clone()]
                    .iter()
                    .zip(&held[span])
                    .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
                assert!(same, "cache row {r} changed at step {step} ({msg})");
                continue;
            };
            let want = &kn[src..src + row];
            for (e, (&got, &w)) in now[span].iter().zip(want).enumerate() {
                let bound = match format {
                    None => 0.0,
                    Some(f) => {
                        let hs = scales.as_ref().map_or(0.0, |s| s[e / c.head_dim]);
                        stored_bound(f, w, &want[e / 32 * 32..][..32], hs, 0.0)
                    }
                };
                assert!(
                    (got - w).abs() <= bound,
                    "cache row {r} elem {e}: {w} stored as {got} at step {step} ({msg})"
                );
            }
        }
        held = now;
        for (bi, n) in lens.iter_mut().enumerate() {
            *n += rows;
            let keys: Vec<f32> = (sc.kv_start(bi)..*n)
                .flat_map(|pos| held[at(bi, pos) * row..(at(bi, pos) + 1) * row].to_vec())
                .collect();
            // each key head's values: the first dv dims of its row
            let values: Vec<f32> = keys
                .chunks(c.head_dim)
                .flat_map(|h| h[..dv].to_vec())
                .collect();
            let m = format!("batch {bi} step {step} ({msg})");
            check_batch(
                &sc,
                (bi, *n),
                &q,
                (&keys, &values),
                (&out, &lse),
                T::DTYPE,
                &m,
            );
        }
    }
}

/// `n` random values of amplitude `amp`, rounded to `T` (as f32).
fn rounded<T: Element>(rng: &mut StdRng, n: usize, amp: f32) -> Vec<f32> {
    to_f32_vec(&from_f32_slice::<T>(&random(rng, n, amp)))
}

/// Batch `bi` of a KV-cache step `sc`, holding `n` keys after it: its out and lse (in `out`,
/// `lse`: the whole step's) against the f64 reference of the batch alone over exactly its keys
/// and values (from its left padding to `n`, standard bottom-right alignment), q its rows of
/// `q`. Returns that one-batch config.
fn check_batch(
    sc: &AttentionConfig,
    (bi, n): (usize, usize),
    q: &[f32],
    (keys, values): (&[f32], &[f32]),
    (out, lse): (&[f32], &[f32]),
    dtype: flash_attn_wgpu::DType,
    msg: &str,
) -> AttentionConfig {
    let mut one = sc.clone();
    one.batch = 1;
    one.seq_kv = n - sc.kv_start(bi);
    one.leftpad_kv = None;
    one.paged = None;
    if let Some(s) = &sc.alibi_slopes {
        if s.len() != sc.heads_q {
            one.alibi_slopes = Some(s[bi * sc.heads_q..(bi + 1) * sc.heads_q].to_vec());
        }
    }
    let rows = sc.seq_q * sc.heads_q;
    let (qs, os) = (rows * sc.head_dim, rows * sc.dv());
    let want = reference::forward(&one, &q[bi * qs..(bi + 1) * qs], keys, values);
    assert_close_tol(
        "out",
        &out[bi * os..(bi + 1) * os],
        &want.out,
        rel_tol(dtype),
        msg,
    );
    assert_lse_close(&lse[bi * rows..(bi + 1) * rows], &want.lse, msg);
    one
}
