//! Blocks of a call (`AttentionConfig::block`): a call cut into blocks of rows and keys, each
//! run as a call of its own that sees the whole call's positions, merged per rows
//! (`merge_host`) and with the backward of each block taken at the whole call's out and lse
//! (dQ summed over key blocks, dK and dV over row blocks), is the whole call, against the f64
//! reference, on the rows and blocks families and the naive path, with the position-aware
//! masks and modifiers: causal and a window, ALiBi, a user's `score_mod` and `mask_mod` that
//! read the indices, dropout keyed by them. What context parallelism (src/distributed/) runs
//! on each rank.

use crate::common;
use common::{assert_close, assert_lse_close, cfg, inputs, score_mods};
use flash_attn_wgpu::unstable::reference;
use flash_attn_wgpu::{
    Algorithm, AttentionConfig, Block, Context, Dropout, Error, HostForward, Tuning, Variant,
    Window,
};

/// Rows `r0..r1` of each batch of a `[batch, seq, width]` tensor.
fn rows(x: &[f32], c: (usize, usize, usize), r0: usize, r1: usize) -> Vec<f32> {
    let (batch, seq, width) = c;
    (0..batch)
        .flat_map(|b| {
            x[(b * seq + r0) * width..(b * seq + r1) * width]
                .iter()
                .copied()
        })
        .collect()
}

/// Adds `part` (rows `r0..r1` of each batch) into `x`.
fn add_rows(x: &mut [f64], part: &[f32], c: (usize, usize, usize), r0: usize, r1: usize) {
    let (batch, seq, width) = c;
    let n = (r1 - r0) * width;
    for b in 0..batch {
        for (k, v) in part[b * n..(b + 1) * n].iter().enumerate() {
            x[(b * seq + r0) * width + k] += *v as f64;
        }
    }
}

/// Rows `r0..r1` of each (batch, head) of an lse `[batch, heads, seq]`.
fn lse_rows(lse: &[f32], (bh, seq): (usize, usize), r0: usize, r1: usize) -> Vec<f32> {
    (0..bh)
        .flat_map(|i| lse[i * seq + r0..i * seq + r1].iter().copied())
        .collect()
}

/// The block of `whole` at rows `q` and keys `k`.
fn block(whole: &AttentionConfig, q: (usize, usize), k: (usize, usize)) -> AttentionConfig {
    AttentionConfig {
        seq_q: q.1 - q.0,
        seq_kv: k.1 - k.0,
        block: Some(Block {
            whole_seq_q: whole.seq_q,
            whole_seq_kv: whole.seq_kv,
            q0: q.0,
            k0: k.0,
        }),
        ..whole.clone()
    }
}

/// `whole` cut at `q_cuts` (rows) and `k_cuts` (keys), run block by block on `ctx`, merged,
/// and its backward block by block, against the reference of the whole call.
fn cut_and_merged(ctx: &Context, whole: &AttentionConfig, q_cuts: &[usize], k_cuts: &[usize]) {
    let data = inputs(whole, 1.0);
    let msg = format!("{} {:?}", common::describe(whole, data.seed), ctx.tuning());
    let want_f = reference::forward(whole, &data.q, &data.k, &data.v);
    let want_g = reference::backward(whole, &data.q, &data.k, &data.v, &data.d_out);
    let (b, hq, hkv, d) = (whole.batch, whole.heads_q, whole.heads_kv, whole.head_dim);
    let ranges = |cuts: &[usize], n: usize| -> Vec<(usize, usize)> {
        let mut at: Vec<usize> = [0].into_iter().chain(cuts.iter().copied()).collect();
        at.push(n);
        at.windows(2).map(|w| (w[0], w[1])).collect()
    };
    let (qr, kr) = (ranges(q_cuts, whole.seq_q), ranges(k_cuts, whole.seq_kv));
    let (qc, kc) = ((b, whole.seq_q, hq * d), (b, whole.seq_kv, hkv * d));
    let k_of = |k: (usize, usize)| (rows(&data.k, kc, k.0, k.1), rows(&data.v, kc, k.0, k.1));
    // forward: each row block's key blocks merged
    let mut out = vec![0.0f64; data.q.len()];
    let mut lse = vec![0.0f32; b * hq * whole.seq_q];
    for &q in &qr {
        let qs = rows(&data.q, qc, q.0, q.1);
        let parts: Vec<HostForward> = kr
            .iter()
            .map(|&k| {
                let (ks, vs) = k_of(k);
                ctx.forward_host(&block(whole, q, k), &qs, &ks, &vs)
                    .unwrap_or_else(|e| panic!("block {q:?} x {k:?}: {e} ({msg})"))
            })
            .collect();
        let shape = [b, q.1 - q.0, hq, d];
        let merged = ctx.merge_host(&shape, &parts).unwrap();
        add_rows(&mut out, &merged.out, qc, q.0, q.1);
        for i in 0..b * hq {
            let n = q.1 - q.0;
            lse[i * whole.seq_q + q.0..i * whole.seq_q + q.1]
                .copy_from_slice(&merged.lse[i * n..(i + 1) * n]);
        }
    }
    let out32: Vec<f32> = out.iter().map(|&x| x as f32).collect();
    assert_close("out", &out32, &want_f.out, &msg);
    assert_lse_close(&lse, &want_f.lse, &msg);
    // backward: each block at the whole call's out and lse
    let (mut dq, mut dk, mut dv) = (
        vec![0.0f64; data.q.len()],
        vec![0.0f64; data.k.len()],
        vec![0.0f64; data.v.len()],
    );
    for &q in &qr {
        let (qs, os, ds) = (
            rows(&data.q, qc, q.0, q.1),
            rows(&out32, qc, q.0, q.1),
            rows(&data.d_out, qc, q.0, q.1),
        );
        let ls = lse_rows(&lse, (b * hq, whole.seq_q), q.0, q.1);
        for &k in &kr {
            let (ks, vs) = k_of(k);
            let g = ctx
                .backward_host(&block(whole, q, k), &qs, &ks, &vs, &os, &ls, &ds)
                .unwrap_or_else(|e| panic!("block {q:?} x {k:?}: {e} ({msg})"));
            add_rows(&mut dq, &g.dq, qc, q.0, q.1);
            add_rows(&mut dk, &g.dk, kc, k.0, k.1);
            add_rows(&mut dv, &g.dv, kc, k.0, k.1);
        }
    }
    let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<_>>();
    assert_close("dq", &f32s(dq), &want_g.dq, &msg);
    assert_close("dk", &f32s(dk), &want_g.dk, &msg);
    assert_close("dv", &f32s(dv), &want_g.dv, &msg);
}

/// A context per family (tuning is per context), and the naive path.
fn on_every_path(whole: &AttentionConfig, q_cuts: &[usize], k_cuts: &[usize]) {
    let ctx = Context::new().expect("context");
    for variant in Variant::ALL {
        ctx.set_tuning(Tuning {
            variant,
            ..ctx.tuning()
        })
        .unwrap();
        cut_and_merged(&ctx, whole, q_cuts, k_cuts);
    }
    let mut naive = whole.clone();
    naive.algorithm = Algorithm::Naive;
    cut_and_merged(&ctx, &naive, q_cuts, k_cuts);
}

#[test]
fn a_causal_windowed_call_cut_into_blocks_is_the_whole_call() {
    // the shape of variants.rs's window test (its pipelines): blocks on the diagonal, wholly
    // below it (seen whole), wholly above it and outside the window (seeing nothing), and cut
    // across the band's edge
    let mut c = cfg(1, 100, 200, 2, 1, 32, true);
    c.window = Window::new(Some(5), Some(7));
    on_every_path(&c, &[37, 64], &[50, 101, 150]);
}

#[test]
fn alibi_and_user_code_that_read_the_indices_see_the_whole_calls() {
    // ALiBi's distances and a score_mod's and mask_mod's i and j are the whole call's: a
    // position-dependent score modifier and a document mask whose documents cross the cuts
    let mut c = cfg(2, 70, 90, 4, 2, 32, true);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.score_mod = Some(score_mods::rational());
    let ids: Vec<f32> = (0..90).map(|p| (p / 23) as f32).collect();
    c.mask_mod = Some(score_mods::documents(ids));
    on_every_path(&c, &[33], &[20, 61]);
}

#[test]
fn dropout_in_blocks_drops_the_whole_calls_pairs() {
    // dropout keys its random numbers by the whole call's row and key: the blocks drop what
    // the whole call drops
    let ctx = Context::new().expect("context");
    let mut c = cfg(1, 64, 80, 2, 1, 32, false);
    c.dropout = Some(Dropout::new(0.2, 1234, 0));
    cut_and_merged(&ctx, &c, &[30], &[16, 47]);
}

#[test]
fn blocks_outside_the_whole_call_or_with_what_they_do_not_take_are_typed_errors() {
    let ctx = common::ctx();
    let whole = cfg(1, 40, 40, 2, 1, 16, false);
    let data = inputs(&whole, 1.0);
    let mut c = block(&whole, (30, 45), (0, 10));
    c.seq_q = 15;
    let q = vec![0.5f32; 15 * 2 * 16];
    let kv = vec![0.5f32; 10 * 16];
    match ctx.forward_host(&c, &q, &kv, &kv) {
        Err(Error::InvalidConfig(m)) => {
            assert!(
                m.contains("rows 30..45 lie outside the whole call's 40"),
                "{m}"
            )
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    let mut c = block(&whole, (0, 40), (0, 40));
    c.seqlens_kv = Some(vec![30]);
    match ctx.forward_host(&c, &data.q, &data.k, &data.v) {
        Err(Error::Unsupported { feature, .. }) => {
            assert!(feature.contains("per-batch key lengths"), "{feature}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}
