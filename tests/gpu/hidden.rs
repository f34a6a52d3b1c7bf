//! Key rows no query sees are never read into a result (issue 46; docs/SEMANTICS.md,
//! "Guarantees"): NaN planted in the k and v of every key row that every query row of its
//! head group has hidden, by each kind of hiding (left padding, key lengths, a window, a
//! boolean mask, a block mask, a user `mask_mod`, a KV cache's length), causal on and off, on
//! every path (naive, the rows and blocks families, decode), forward and backward. The results
//! must equal the f64 reference over the clean inputs: finite everywhere, hidden rows' dk and
//! dv exactly what the reference gives (0).

use crate::common;

use common::backend::{check_rounded, Gap};
use common::kv::append_and_attend;
use common::{cfg, ctx, rounded_inputs, tier};
use flash_attn_wgpu::unstable::reference;
use flash_attn_wgpu::{
    Algorithm, AttentionConfig, BlockMask, BoolMask, Context, Element, Tuning, Variant, Window,
};

/// How the case hides keys from every row.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    LeftPad,
    KeyLengths,
    Window,
    BoolMask,
    BlockMask,
    MaskMod,
}

const KINDS: [Kind; 6] = [
    Kind::LeftPad,
    Kind::KeyLengths,
    Kind::Window,
    Kind::BoolMask,
    Kind::BlockMask,
    Kind::MaskMod,
];

/// Where the call runs: the naive path, a tiled family, or the decode kernel (two query rows).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    Naive,
    Tiled(Variant),
    Decode,
}

const PATHS: [Path; 4] = [
    Path::Naive,
    Path::Tiled(Variant::Rows),
    Path::Tiled(Variant::Blocks),
    Path::Decode,
];

/// The case's config: batch 2, 9 query rows (2 on the decode path) over 40 keys, 2 query heads
/// over 1 kv head, head_dim 32, with `kind` hiding keys from every row.
fn config(kind: Kind, path: Path, causal: bool) -> AttentionConfig {
    let sq = if path == Path::Decode { 2 } else { 9 };
    let mut c = cfg(2, sq, 40, 2, 1, 32, causal);
    let whole = (1, 1, c.seq_q, c.seq_kv);
    match kind {
        Kind::LeftPad => {
            c.seqlens_kv = Some(vec![40, 33]);
            c.leftpad_kv = Some(vec![5, 11]);
        }
        Kind::KeyLengths => c.seqlens_kv = Some(vec![26, 13]),
        // bottom-right aligned: the last rows see keys from 3 before their diagonal to 1 past it
        Kind::Window => c.window = Window::new(Some(3), Some(1)),
        Kind::BoolMask => c.mask = Some(BoolMask::from_fn(whole, |_, _, _, j| j % 5 != 2)),
        // blocks of the tiles' sizes (no pipeline of its own): keys 0-31 off
        Kind::BlockMask => {
            c.block_mask = Some(BlockMask::from_fn(128, 32, whole, |_, _, _, col| col == 1))
        }
        // every query row lies in document 0 (positions 0-9); keys 10.. in others
        Kind::MaskMod => {
            let ids = (0..c.seq_kv).map(|p| (p / 10) as f32).collect();
            c.mask_mod = Some(common::score_mods::documents(ids));
        }
    }
    c.algorithm = match path {
        Path::Naive => Algorithm::Naive,
        _ => Algorithm::Tiled,
    };
    c
}

/// The (batch, kv head, key) rows every query row of every query head in the kv head's group
/// has hidden, by the reference's own rule.
fn hidden_keys(c: &AttentionConfig) -> Vec<(usize, usize, usize)> {
    let group = c.heads_q / c.heads_kv;
    let mut hidden = Vec::new();
    for b in 0..c.batch {
        for hk in 0..c.heads_kv {
            for j in 0..c.seq_kv {
                let seen = (hk * group..(hk + 1) * group)
                    .any(|h| (0..c.seq_q).any(|i| reference::visible(c, (b, h, i, j))));
                if !seen {
                    hidden.push((b, hk, j));
                }
            }
        }
    }
    hidden
}

/// One case in `T`: forward and backward with NaN in every hidden key row's k and v, against
/// the reference over the clean inputs.
fn check<T: Element>(x: &Context, kind: Kind, path: Path, causal: bool) {
    let c = config(kind, path, causal);
    if let Path::Tiled(variant) = path {
        x.set_tuning(Tuning {
            variant,
            ..x.tuning()
        })
        .unwrap();
    }
    let r = rounded_inputs::<T>(&c, 1.0);
    let hidden = hidden_keys(&c);
    let msg = format!(
        "{kind:?} on {path:?}, causal {causal}, {} rows hidden",
        hidden.len()
    );
    // a case that hides nothing proves nothing; one that hides every key proves little more
    assert!(
        !hidden.is_empty() && hidden.len() < c.batch * c.heads_kv * c.seq_kv,
        "{msg}"
    );
    let (k, v) = common::nan_in_key_rows(&c, &r, &hidden);
    check_rounded(x, &c, &r, (&k, &v), &msg, Gap::None);
}

/// The kinds read at run time (padding, lengths, a window, a block mask: one pipeline serves
/// them all) on every path; the boolean mask and the user mask, which are pipelines of their
/// own, on one path each in the CI tier (every path in the full tier).
fn cases() -> Vec<(Kind, Path)> {
    let compiled = |k: &Kind| matches!(k, Kind::BoolMask | Kind::MaskMod);
    let run_time: Vec<Kind> = KINDS.into_iter().filter(|k| !compiled(k)).collect();
    let own: Vec<Kind> = KINDS.into_iter().filter(compiled).collect();
    // (the naive path and the rows family have them in the full tier)
    let own_paths = if tier::full() {
        &PATHS[..]
    } else {
        &PATHS[2..]
    };
    PATHS
        .iter()
        .flat_map(|&p| run_time.iter().map(move |&k| (k, p)))
        .chain(tier::pairs(&own, own_paths, |_, _| true))
        .collect()
}

/// `cases()`, causal on and off, in f32.
#[test]
fn nan_in_key_rows_no_query_sees_never_reaches_a_result_on_any_path() {
    let x = Context::new().unwrap();
    for (kind, path) in cases() {
        for causal in [false, true] {
            check::<f32>(&x, kind, path, causal);
        }
    }
}

/// The same in f16 on the tiled families, every kind (the full tier).
#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn the_same_in_f16_on_every_tiled_family() {
    let x = Context::new().unwrap();
    for kind in KINDS {
        for variant in Variant::ALL {
            for causal in [false, true] {
                check::<half::f16>(&x, kind, Path::Tiled(variant), causal);
            }
        }
    }
}

/// KV caches: rows past each batch's cache length and before its left padding hold NaN
/// (`append_and_attend`), on the naive path and the tiled ones (a prefill of 5 rows, then a
/// decode step), causal on and off.
#[test]
fn nan_in_a_cache_past_its_length_or_in_its_padding_never_reaches_a_result() {
    for algorithm in [Algorithm::Naive, Algorithm::Tiled] {
        for causal in [false, true] {
            // the shape of kvcache.rs's left-padded caches (their pipelines)
            let mut c = cfg(3, 1, 96, 8, 2, 32, causal);
            c.algorithm = algorithm;
            c.leftpad_kv = Some(vec![17, 0, 40]);
            append_and_attend::<_, f32>(ctx(), &c, &[60, 33, 40], 5);
        }
    }
}
