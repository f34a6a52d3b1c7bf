//! Property test over the score features together (issue 12): random small shapes, dtypes,
//! algorithms and variants, with causal, a sliding window, a softcap, ALiBi (per head or per
//! batch and head), sinks, per-batch key lengths, dropout, a block mask, a boolean mask, an
//! additive bias (with or without d_bias) and packed variable-length sequences each drawn on
//! or off, so that any combination may come up. Every case runs forward and backward on fresh
//! random inputs against the f64 reference (`common::check_dtype_dyn`: out, lse, dq, dk, dv,
//! d_sinks and d_bias). What decides the case's pipelines (algorithm, variant, dtype, head dim,
//! the compiled-in modifiers) is the case's slot, fixed per case number, so that every run
//! compiles the same pipelines (`common::pipelines`); the rest is drawn afresh each run (a
//! failure prints the slot and proptest's minimal case).

use crate::common;

use common::{check_dtype_dyn, pipelines};
use flash_attn_wgpu::{Algorithm, AttentionConfig, DType, Tuning, Variant, Varlen, Window};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    cfg: AttentionConfig,
    dtype: DType,
    variant: flash_attn_wgpu::Variant,
}

/// What decides a case's pipelines: the algorithm and variant, the dtype, the head dim, the
/// compiled-in modifiers (softcap, dropout, the boolean mask, the bias and whether it asks for
/// d_bias) and the sinks (their gradient's kernel). Case `n` of a run takes slot `n`, draws
/// every other feature and all its values afresh, and is redrawn until its pipelines are the
/// slot's fixed case's (`common::pipelines`): every run compiles the same pipelines.
#[derive(Debug, Clone, Copy)]
struct Slot {
    alg: (Algorithm, Variant),
    dtype: DType,
    d: usize,
    softcap: bool,
    dropout: bool,
    mask: bool,
    /// A bias, and whether it asks for d_bias.
    bias: Option<bool>,
    sinks: bool,
}

/// Slot `n`. The CI tier's 3 meet every algorithm and every compiled modifier, on pipelines
/// the other tests mostly compile too (the suite's pipeline budget, docs/TESTING.md); from
/// slot 3 on (the full tier's 12), the choices turn in rotations of different lengths, so
/// that every value of each meets the others.
fn slot(n: usize) -> Slot {
    let algs = common::algorithm_variants();
    // (tiled rows, tiled blocks, naive: algorithm_variants' order)
    let [rows, blocks, naive] = <[_; 3]>::try_from(algs.clone()).expect("three ways to run");
    let plain = Slot {
        alg: naive,
        dtype: DType::F32,
        d: 32,
        softcap: false,
        dropout: false,
        mask: false,
        bias: None,
        sinks: true,
    };
    match n {
        0 => Slot {
            alg: rows,
            d: 64,
            softcap: true,
            ..plain
        },
        1 => Slot {
            alg: blocks,
            dropout: true,
            mask: true,
            bias: Some(true),
            ..plain
        },
        2 => plain,
        _ => Slot {
            alg: algs[n % algs.len()],
            dtype: DType::ALL[(n + n / 3) % 3],
            d: [64, 16, 24, 4][n % 4],
            softcap: n.is_multiple_of(2),
            dropout: n % 3 != 2,
            mask: n % 4 == 1,
            bias: [None, Some(true), Some(false), None, None][n % 5],
            sinks: n % 4 != 3,
        },
    }
}

/// The slot's fixed case, whose pipelines each drawn case must have: causal with key lengths
/// (a modifier read at run time, as nearly every drawn case has one) and the slot's choices.
fn fixed(s: &Slot) -> AttentionConfig {
    let mut c = AttentionConfig::new(2, 33, 45, 4, 2, s.d);
    c.causal = true;
    c.seqlens_kv = Some(vec![45, 20]);
    c.algorithm = s.alg.0;
    let whole = (1, 1, c.seq_q, c.seq_kv);
    c.sinks = s.sinks.then(|| vec![0.5; c.heads_q]);
    c.softcap = s.softcap.then_some(1.5);
    c.dropout = s.dropout.then(|| flash_attn_wgpu::Dropout::new(0.3, 1, 2));
    c.mask = s
        .mask
        .then(|| flash_attn_wgpu::BoolMask::from_fn(whole, |_, _, i, j| (i + j) % 3 != 0));
    c.bias = s.bias.map(|grad| {
        let mut b = flash_attn_wgpu::ScoreBias::from_fn(whole, |_, _, i, j| (i + j) as f32 * 0.01)
            .expect("a finite bias");
        b.grad = grad;
        b
    });
    c
}

fn side() -> impl Strategy<Value = Option<usize>> {
    prop_oneof![2 => Just(None), 3 => (0usize..24).prop_map(Some)]
}

fn case(s: Slot) -> impl Strategy<Value = Case> {
    (
        (1usize..=2, 1usize..=70, 1usize..=70, 1usize..=2, 1usize..=2),
        (any::<bool>(), side(), side()),
        0.5f32..4.0,
        prop::sample::select(vec![0u8, 1, 2]),
        (any::<bool>(), 0.0f32..0.8),
        prop::option::of((1usize..40, 1usize..40, any::<bool>(), any::<bool>())),
        // a packed varlen call instead of the padded batch: (rows, keys) per sequence
        prop::option::of(prop::collection::vec((0usize..30, 0usize..30), 1..=3)),
        // a boolean mask's and a bias's grids: (per batch, per head)
        (
            (any::<bool>(), any::<bool>()),
            (any::<bool>(), any::<bool>()),
        ),
    )
        .prop_map(
            move |(
                (b, sq, skv, hkv, group),
                (causal, left, right),
                softcap,
                alibi,
                (seqlens, dropout),
                blocks,
                packed,
                (mask, bias),
            )| {
                let mut cfg = match packed {
                    // at least one row and one key in all
                    Some(mut lens) => {
                        lens[0] = (lens[0].0 + 1, lens[0].1 + 1);
                        let (q, kv): (Vec<u32>, Vec<u32>) =
                            lens.iter().map(|&(q, kv)| (q as u32, kv as u32)).unzip();
                        let v = Varlen::from_lengths(&q, &kv);
                        AttentionConfig::packed(
                            v.cu_seqlens_q,
                            v.cu_seqlens_kv,
                            hkv * group,
                            hkv,
                            s.d,
                        )
                    }
                    None => AttentionConfig::new(b, sq, skv, hkv * group, hkv, s.d),
                };
                cfg.causal = causal;
                cfg.window = Window::new(left, right);
                cfg.softcap = s.softcap.then_some(softcap);
                // fresh slopes and sinks for every case (the inputs are fresh too)
                cfg.alibi_slopes = match alibi {
                    1 => Some(common::random_alibi(&cfg, false)),
                    2 => Some(common::random_alibi(&cfg, true)),
                    _ => None,
                };
                cfg.sinks = s.sinks.then(|| common::random_sinks(&cfg));
                cfg.seqlens_kv =
                    (seqlens && cfg.varlen.is_none()).then(|| common::random_seqlens(&cfg));
                // left padding with the lengths (the same run-time bit, no other pipeline)
                cfg.leftpad_kv = cfg
                    .seqlens_kv
                    .is_some()
                    .then(|| common::random_leftpad(&cfg));
                cfg.dropout = s.dropout.then(|| common::random_dropout(dropout));
                cfg.block_mask = blocks.map(|(bq, bkv, per_batch, per_head)| {
                    common::random_block_mask(&cfg, (bq, bkv), per_batch, per_head, 0.7)
                });
                cfg.mask = s
                    .mask
                    .then(|| common::random_bool_mask(&cfg, mask.0, mask.1, 0.7, 1));
                cfg.bias = s.bias.map(|grad| {
                    let mut b = common::random_bias(&cfg, bias.0, bias.1, 0.05, 0);
                    b.grad = grad;
                    b
                });
                cfg.algorithm = s.alg.0;
                Case {
                    cfg,
                    dtype: s.dtype,
                    variant: s.alg.1,
                }
            },
        )
}

#[test]
fn any_combination_of_features_matches_the_reference() {
    // a context of its own: each slot sets its variant (common::ctx)
    let ctx = &flash_attn_wgpu::Context::new().expect("context");
    for n in 0..common::prop_cases(3, 12) as usize {
        let s = slot(n);
        pipelines::run_slot(
            ctx,
            (s.alg.1, &fixed(&s), s.dtype),
            case(s),
            |case| &case.cfg,
            |case| {
                let what = format!("{:?}", case.variant);
                check_dtype_dyn(ctx, case.dtype, &case.cfg, 2.0, &what);
                Ok(())
            },
            &format!("slot {n} {s:?}"),
        );
    }
}

/// A case the property test drew: causal with the window (0, 11) leaves each row its
/// diagonal key alone, so P = 1 and dS = dP - delta = 0 exactly, and dq, dk are sums of f32
/// rounding errors in dP; with dropout's factor, softcap and ALiBi on top. The check takes
/// the tolerance against the size of dP (`gradient_floors`), not the near-zero gradients.
#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn rows_that_see_one_key_have_gradients_that_cancel() {
    // a context of its own: the shared one's tuning is the other tests' (common::ctx)
    let ctx = &flash_attn_wgpu::Context::new().expect("context");
    let mut cfg = AttentionConfig::new(1, 33, 17, 1, 1, 24);
    cfg.causal = true;
    cfg.window = Window::new(Some(0), Some(11));
    cfg.softcap = Some(2.96);
    cfg.alibi_slopes = Some(vec![0.3]);
    cfg.dropout = Some(flash_attn_wgpu::Dropout::new(
        0.77,
        0x64fa_4097_9899_641f,
        0xffff_ffe0,
    ));
    for variant in common::algorithm_variants() {
        ctx.set_tuning(Tuning {
            variant: variant.1,
            ..ctx.tuning()
        })
        .unwrap();
        cfg.algorithm = variant.0;
        check_dtype_dyn(ctx, DType::F32, &cfg, 2.0, &format!("{variant:?}"));
    }
}
