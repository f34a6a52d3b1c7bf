//! User score modifiers (`AttentionConfig::score_mod`, FlexAttention's `score_mod`): the
//! built-in softcap re-expressed as one gives the built-in's results, and one no built-in
//! expresses matches the f64 reference (its host definition) forward and backward, tiled and
//! naive, in every dtype, composed with the built-in score modifiers. The decode path and
//! every kernel family take one in `decode.rs` and `variants.rs`; the snippet checks are the
//! library's unit tests; the CUDA C compiles in `cuda_compile.rs`.

use crate::common;
use common::{assert_close_tol, cfg, check_backward, ctx, inputs, score_mods};
use flash_attn_wgpu::{Algorithm, DType, Window};

#[test]
fn a_user_softcap_gives_the_built_in_softcaps_results() {
    // the shape of backends.rs's softcap case (its built-in pipelines are the suite's already)
    let mut builtin = cfg(1, 77, 93, 4, 2, 64, false);
    builtin.softcap = Some(1.5);
    let mut user = cfg(1, 77, 93, 4, 2, 64, false);
    user.score_mod = Some(score_mods::softcap());
    // against the reference (from the host definition), tiled and naive, forward and backward
    check_backward(&user, 2.0);
    let data = inputs(&user, 2.0);
    let run = |c: &flash_attn_wgpu::AttentionConfig| {
        let f = ctx().forward_host(c, &data.q, &data.k, &data.v).unwrap();
        let g = ctx()
            .backward_host(c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
            .unwrap();
        (f, g)
    };
    let ((fb, gb), (fu, gu)) = (run(&builtin), run(&user));
    let msg = common::describe(&user, data.seed);
    let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    // the same function, computed in another order (natural-log units): f32 rounding apart
    for (what, got, want) in [
        ("out", &fu.out, &fb.out),
        ("lse", &fu.lse, &fb.lse),
        ("dq", &gu.dq, &gb.dq),
        ("dk", &gu.dk, &gb.dk),
        ("dv", &gu.dv, &gb.dv),
    ] {
        assert_close_tol(what, got, &f64s(want), 1e-5, &msg);
    }
}

#[test]
fn a_modifier_no_built_in_expresses_matches_the_reference_in_every_dtype() {
    // with GQA, causal, ALiBi and a bias before it in the chain (the user's acts last)
    let mut c = cfg(2, 70, 90, 4, 2, 32, true);
    c.alibi_slopes = Some(common::random_alibi(&c, true));
    c.bias = Some(common::random_bias(&c, true, false, 0.2, 3));
    c.score_mod = Some(score_mods::rational());
    check_backward(&c, 1.5);
    // and with a window, per-batch key lengths and sinks, in the half dtypes (bf16 in the CI
    // tier: packed storage, every half conversion; a snippet is pipelines of its own per dtype)
    let mut c = cfg(2, 61, 83, 4, 1, 32, false);
    c.window = Window::new(Some(40), Some(7));
    c.seqlens_kv = Some(common::random_seqlens(&c));
    c.sinks = Some(common::random_sinks(&c));
    c.score_mod = Some(score_mods::rational());
    for dtype in common::tier::sample(&[DType::BF16, DType::F16], &[0]) {
        let e = common::check_dtype_dyn(ctx(), dtype, &c, 1.5, "score_mod");
        eprintln!("{dtype:?}: {e:?}");
    }
    c.algorithm = Algorithm::Naive;
    common::check_dtype_dyn(ctx(), DType::F32, &c, 1.5, "score_mod naive");
}

#[test]
fn a_t5_relative_position_table_is_read_from_captured_tensors() {
    // a learned bias per (head, bucket of j - i) in a captured table, the buckets computed in
    // the snippet; with GQA and causal, tiled and naive, forward and backward
    let c0 = cfg(2, 75, 90, 4, 2, 32, true);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(common::fresh_seed());
    let table = common::random(&mut rng, c0.heads_q * 16, 1.0);
    let mut c = c0.clone();
    // trainable: the backward's d_table too (trainable.rs checks it further on this shape)
    c.score_mod = Some(score_mods::t5_trainable(c.heads_q, table.clone()));
    check_backward(&c, 1.0);
    // the table reaches the kernels: another table, another result
    let other: Vec<f32> = table.iter().map(|x| x + 0.5 * (x * 7.0).sin()).collect();
    let mut d = c0.clone();
    d.score_mod = Some(score_mods::t5_trainable(d.heads_q, other));
    let data = inputs(&c, 1.0);
    let a = ctx().forward_host(&c, &data.q, &data.k, &data.v).unwrap();
    let b = ctx().forward_host(&d, &data.q, &data.k, &data.v).unwrap();
    assert!(a.out.iter().zip(&b.out).any(|(x, y)| (x - y).abs() > 1e-3));
}

#[test]
fn bad_captured_tensors_are_user_code_errors() {
    use flash_attn_wgpu::{Error, ScoreMod};
    let src = "
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s + t(i); }
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }";
    for (name, values, expect) in [
        ("t", vec![], "at least one value"),
        ("t", vec![1.0, f32::NAN], "finite"),
        ("2t", vec![1.0], "identifier"),
        ("visible", vec![1.0], "kernels define"),
    ] {
        match ScoreMod::wgsl_with(src, [(name, values)]) {
            Err(Error::UserCode { what, message, .. }) => {
                assert!(what.contains(name), "{what}");
                assert!(message.contains(expect), "{message}");
            }
            other => panic!("{name}: expected UserCode, got {other:?}"),
        }
    }
    // a snippet that reads a tensor it did not capture
    assert!(matches!(
        ScoreMod::wgsl(src),
        Err(Error::UserCode { line: Some(2), .. })
    ));
    assert!(ScoreMod::wgsl_with(src, [("t", vec![0.5; 8])]).is_ok());
}

/// Forward and backward of the tiled algorithm (the adapter's family) against the reference.
fn check_tiled(c: &flash_attn_wgpu::AttentionConfig, amp: f32) {
    use flash_attn_wgpu::unstable::reference;
    let data = inputs(c, amp);
    let msg = common::describe(c, data.seed);
    let want = reference::backward(c, &data.q, &data.k, &data.v, &data.d_out);
    let wf = reference::forward(c, &data.q, &data.k, &data.v);
    let f = ctx().forward_host(c, &data.q, &data.k, &data.v).unwrap();
    common::assert_close("out", &f.out, &wf.out, &msg);
    common::assert_lse_close(&f.lse, &wf.lse, &msg);
    let g = ctx()
        .backward_host(c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
        .unwrap();
    common::assert_close("dq", &g.dq, &want.dq, &msg);
    common::assert_close("dk", &g.dk, &want.dk, &msg);
    common::assert_close("dv", &g.dv, &want.dv, &msg);
}

#[test]
fn a_document_mask_with_its_block_mask_is_the_varlen_call() {
    // four documents of unequal lengths packed into one sequence, causal within each: as a
    // mask_mod over captured document ids, with the block mask create_block_mask gives, it
    // must match the reference and the built-in varlen call on the same documents
    let lens = [37usize, 80, 21, 62];
    let total: usize = lens.iter().sum();
    let ids: Vec<f32> = lens
        .iter()
        .enumerate()
        .flat_map(|(d, &n)| std::iter::repeat_n(d as f32, n))
        .collect();
    let mask = score_mods::documents(ids);
    let blocks = ctx()
        .create_block_mask(&mask, (1, 1, total, total), (16, 32))
        .unwrap();
    // the GPU's block mask is the host predicate's: on where a pair passes, full where all do
    let pairs = |r: usize, c: usize| {
        (r * 16..((r + 1) * 16).min(total))
            .flat_map(move |i| (c * 32..((c + 1) * 32).min(total)).map(move |j| (i, j)))
    };
    let dims = (1, 1, total, total);
    let on = flash_attn_wgpu::BlockMask::from_fn(16, 32, dims, |_, _, r, c| {
        pairs(r, c).any(|(i, j)| mask_allows(&lens, i, j))
    });
    let full = flash_attn_wgpu::BlockMask::from_fn(16, 32, dims, |_, _, r, c| {
        pairs(r, c).all(|(i, j)| mask_allows(&lens, i, j))
    });
    assert_eq!(blocks.blocks, on.blocks);
    assert_eq!(blocks.full, Some(full.blocks.clone()));
    // FlexAttention's form of it (partial and full blocks, both sides) gives it back
    let flex = blocks.to_flex(total, total);
    let back = flash_attn_wgpu::BlockMask::from_flex(16, 32, &flex).unwrap();
    assert_eq!((&back.blocks, &back.full), (&blocks.blocks, &blocks.full));
    assert_eq!(blocks.mask_mod.as_ref(), Some(&mask));
    assert!(full.blocks.iter().any(|&f| f));
    assert!(blocks.blocks.iter().filter(|&&b| !b).count() > blocks.blocks.len() / 3);
    let mut c = cfg(1, total, total, 4, 2, 32, true);
    c.mask_mod = Some(mask);
    c.block_mask = Some(blocks);
    check_tiled(&c, 1.5);
    // the varlen call over the same documents
    let cu: Vec<u32> = std::iter::once(0)
        .chain(lens.iter().scan(0u32, |s, &n| {
            *s += n as u32;
            Some(*s)
        }))
        .collect();
    let mut v = flash_attn_wgpu::AttentionConfig::packed(cu.clone(), cu, 4, 2, 32);
    v.causal = true;
    let data = inputs(&c, 1.5);
    let a = ctx().forward_host(&c, &data.q, &data.k, &data.v).unwrap();
    let b = ctx().forward_host(&v, &data.q, &data.k, &data.v).unwrap();
    let f64s = |x: &[f32]| x.iter().map(|&y| y as f64).collect::<Vec<_>>();
    let msg = common::describe(&c, data.seed);
    assert_close_tol("out vs varlen", &a.out, &f64s(&b.out), 1e-5, &msg);
    assert_close_tol("lse vs varlen", &a.lse, &f64s(&b.lse), 1e-5, &msg);
}

fn mask_allows(lens: &[usize], i: usize, j: usize) -> bool {
    let doc = |x: usize| {
        let mut s = 0;
        lens.iter()
            .position(|&n| {
                s += n;
                x < s
            })
            .unwrap()
    };
    doc(i) == doc(j)
}

#[test]
fn prefix_lm_and_dilated_masks_the_built_ins_cannot_express() {
    // prefix-LM with its block mask (per head: no broadcast), and a dilated mask with a
    // stride per head and no block mask (evaluated at every pair), with GQA and a user score
    // modifier beside it; the naive path too
    let mut c = cfg(2, 70, 70, 4, 2, 32, false);
    let m = score_mods::prefix_lm(23);
    c.block_mask = Some(
        ctx()
            .create_block_mask(&m, (1, 4, 70, 70), (16, 16))
            .unwrap(),
    );
    c.mask_mod = Some(m);
    check_tiled(&c, 1.5);
    let mut c = cfg(2, 61, 77, 4, 2, 32, false);
    c.mask_mod = Some(score_mods::dilated());
    c.score_mod = Some(score_mods::rational());
    check_backward(&c, 1.5);
}

#[test]
fn the_kernels_skip_the_user_mask_in_full_blocks() {
    // a block mask that calls every on block full: the kernels must take its word and not
    // evaluate the mask there, giving the call without the mask (a wrong answer, on purpose)
    // (one block holds the whole call, whose lengths the tiles divide: every tile lies in
    // it and needs no bounds check)
    let m = score_mods::prefix_lm(9);
    let mut lying = ctx()
        .create_block_mask(&m, (1, 1, 256, 256), (256, 256))
        .unwrap();
    assert_eq!(
        (&lying.blocks, &lying.full),
        (&vec![true], &Some(vec![false]))
    );
    lying.full = Some(vec![true]);
    let mut with = cfg(1, 256, 256, 2, 2, 16, false);
    with.block_mask = Some(lying.clone());
    with.mask_mod = Some(m);
    let mut without = with.clone();
    without.mask_mod = None;
    // the block mask knows its mask: without it (or with another) the call is refused; as
    // block sparsity alone, its own mask cleared
    let data = inputs(&with, 1.0);
    for other in [None, Some(score_mods::dilated())] {
        without.mask_mod = other;
        assert!(matches!(
            ctx().forward_host(&without, &data.q, &data.k, &data.v),
            Err(flash_attn_wgpu::Error::InvalidConfig(m)) if m.contains("block_mask was made")
        ));
    }
    without.mask_mod = None;
    without.block_mask.as_mut().unwrap().mask_mod = None;
    let a = ctx()
        .forward_host(&with, &data.q, &data.k, &data.v)
        .unwrap();
    let b = ctx()
        .forward_host(&without, &data.q, &data.k, &data.v)
        .unwrap();
    let msg = common::describe(&with, data.seed);
    let f64s = |x: &[f32]| x.iter().map(|&y| y as f64).collect::<Vec<_>>();
    assert_close_tol("out", &a.out, &f64s(&b.out), 1e-6, &msg);
    // and a full flag on an off block is refused
    let mut bad = ctx()
        .create_block_mask(&score_mods::prefix_lm(9), (1, 1, 256, 256), (32, 32))
        .unwrap();
    let off = bad.blocks.iter().position(|&x| !x).unwrap();
    bad.full.as_mut().unwrap()[off] = true;
    with.block_mask = Some(bad);
    assert!(matches!(
        ctx().forward_host(&with, &data.q, &data.k, &data.v),
        Err(flash_attn_wgpu::Error::InvalidConfig(m)) if m.contains("full")
    ));
}

#[test]
fn bad_block_mask_requests_are_typed_errors() {
    use flash_attn_wgpu::Error;
    let m = score_mods::prefix_lm(3);
    for (dims, block) in [((0, 1, 8, 8), (4, 4)), ((1, 1, 8, 8), (0, 4))] {
        assert!(matches!(
            ctx().create_block_mask(&m, dims, block),
            Err(Error::InvalidConfig(_))
        ));
    }
}
