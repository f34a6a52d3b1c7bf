//! What each point should cost by design: FLOPs, global-memory bytes moved, and the tile sizes
//! the bytes model needs.

use flash_attn_wgpu::unstable::kernels::{Kernel, Pass as KernelPass};
use flash_attn_wgpu::{Algorithm, AttentionConfig, Context, DType, Error, Roofline, Variant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    Fwd,
    FwdBwd,
}

impl Pass {
    pub fn name(self) -> &'static str {
        match self {
            Pass::Fwd => "fwd",
            Pass::FwdBwd => "fwdbwd",
        }
    }
}

pub fn alg_name(a: Algorithm) -> &'static str {
    match a {
        Algorithm::Tiled => "tiled",
        Algorithm::Naive => "naive",
    }
}

/// "tiled/<variant>" or "naive": what a record measured.
pub fn alg_label(a: Algorithm, variant: Option<Variant>) -> String {
    match variant {
        Some(v) if a == Algorithm::Tiled => format!("{}/{}", alg_name(a), v.name()),
        _ => alg_name(a).to_string(),
    }
}

/// FLOPs by the convention of the FlashAttention papers: forward 4 * B * H * Sq * Sk * D,
/// halved for causal; with a window, 4 * B * H * D times the pairs the band leaves visible
/// (counted exactly). Forward+backward 3.5x.
pub fn flops(cfg: &AttentionConfig, pass: Pass) -> f64 {
    let f = 4.0 * (cfg.batch * cfg.heads_q) as f64 * cfg.head_dim as f64 * visible_pairs(cfg);
    match pass {
        Pass::Fwd => f,
        Pass::FwdBwd => 3.5 * f,
    }
}

/// (row, key) pairs of one (batch, head) that take part: Sq * Sk, halved for causal (the
/// papers' convention); with a window or per-batch key lengths, counted row by row (the mean
/// over batches); with a block mask, counted block by block (the mean over batches and heads);
/// varlen, summed over its sequences.
pub fn visible_pairs(cfg: &AttentionConfig) -> f64 {
    if let Some(v) = &cfg.varlen {
        // varlen (batch 1): each sequence's pairs as a call of its own
        return (0..v.sequences())
            .map(|s| {
                let (q0, q1, k0, k1) = v.bounds(s);
                let mut one = cfg.clone();
                (one.varlen, one.seq_q, one.seq_kv) = (None, q1 - q0, k1 - k0);
                visible_pairs(&one)
            })
            .sum();
    }
    let all = cfg.seq_q as f64 * cfg.seq_kv as f64;
    if let Some(m) = &cfg.block_mask {
        return block_pairs(cfg, m);
    }
    if !cfg.window.is_active() && cfg.seqlens_kv.is_none() {
        return if cfg.causal { all / 2.0 } else { all };
    }
    let (off, (lo, hi)) = (cfg.causal_offset(), cfg.band());
    let per_batch = |len: usize| -> f64 {
        let last = len as i64 - 1;
        (0..cfg.seq_q as i64)
            .map(|i| {
                let first = lo.map_or(0, |lo| (i + off + lo).max(0));
                let end = hi.map_or(last, |hi| (i + off + hi).min(last));
                (end - first + 1).max(0) as f64
            })
            .sum()
    };
    (0..cfg.batch)
        .map(|b| per_batch(cfg.kv_len(b)))
        .sum::<f64>()
        / cfg.batch as f64
}

/// visible_pairs under a block mask: for each row, the keys of its on blocks that the causal
/// mask, the window and the batch's key length let it see.
fn block_pairs(cfg: &AttentionConfig, m: &flash_attn_wgpu::BlockMask) -> f64 {
    let (off, (lo, hi)) = (cfg.causal_offset(), cfg.band());
    let (_, cols) = m.grid(cfg.seq_q, cfg.seq_kv);
    let mut n = 0.0;
    for b in 0..cfg.batch {
        let last = cfg.kv_len(b) as i64 - 1;
        for h in 0..cfg.heads_q {
            for i in 0..cfg.seq_q as i64 {
                let first = lo.map_or(0, |lo| (i + off + lo).max(0));
                let end = hi.map_or(last, |hi| (i + off + hi).min(last));
                for c in 0..cols as i64 {
                    let (c0, c1) = (c * m.block_kv as i64, (c + 1) * m.block_kv as i64 - 1);
                    if m.allows(cfg.seq_q, cfg.seq_kv, (b, h, i as usize, c0 as usize)) {
                        n += (end.min(c1) - first.max(c0) + 1).max(0) as f64;
                    }
                }
            }
        }
    }
    n / (cfg.batch * cfg.heads_q) as f64
}

/// The mask of a point: causal or not, and its window.
pub fn mask_label(cfg: &AttentionConfig) -> String {
    let mut label = if cfg.causal { "causal" } else { "non-causal" }.to_string();
    if cfg.window.is_active() {
        let side = |x: Option<usize>| x.map_or("none".to_string(), |v| v.to_string());
        label += &format!(
            " window({},{})",
            side(cfg.window.left),
            side(cfg.window.right)
        );
    }
    if let Some(c) = cfg.softcap {
        label += &format!(" softcap {c}");
    }
    if cfg.score_mod.is_some() {
        label += " score_mod";
    }
    if cfg.mask_mod.is_some() {
        label += " mask_mod";
    }
    if cfg.alibi_slopes.is_some() {
        label += " alibi";
    }
    if cfg.sinks.is_some() {
        label += " sinks";
    }
    if let Some(d) = cfg.dropout {
        label += &format!(" dropout {}", d.p);
    }
    if let Some(m) = &cfg.block_mask {
        label += &format!(" blocks {} at {:.3}", m.block_q, m.density());
    }
    if let Some(v) = &cfg.varlen {
        label += &format!(" varlen {}", v.sequences());
    }
    if let Some(m) = &cfg.mask {
        label += &format!(" mask at {:.3}", m.density());
    }
    if cfg.bias.is_some() {
        label += " bias";
    }
    label
}

/// Tile sizes the bytes model needs: query rows per forward tile, key rows per dK/dV tile and
/// query rows per dQ tile.
#[derive(Debug, Clone, Copy)]
pub struct ModelTiles {
    fwd_q: u32,
    dkdv_kv: u32,
    dq_q: u32,
}

impl ModelTiles {
    /// The tiles `variant`'s kernels use at head dimension `head_dim` on this adapter.
    pub fn new(ctx: &Context, variant: Variant, head_dim: usize) -> Result<Self, Error> {
        Ok(ModelTiles {
            fwd_q: ctx
                .tiles_for(Kernel::Flash(variant, KernelPass::Forward), head_dim)?
                .br,
            dkdv_kv: ctx
                .tiles_for(Kernel::Flash(variant, KernelPass::DkDv), head_dim)?
                .bc,
            dq_q: ctx
                .tiles_for(Kernel::Flash(variant, KernelPass::Dq), head_dim)?
                .br,
        })
    }
}

/// Global-memory bytes each algorithm moves by design, as in the paper's IO analysis, from the
/// kernels' bindings. Tensors of the call's dtype (q, k, v, out, d_out, dq, dk, dv) count
/// `dtype.size_bytes()` per element; lse, delta and the naive path's score matrices are f32.
/// The naive path writes and rereads the seq_q x seq_kv matrices; the tiled path reads K and V
/// once per Q tile (and Q, dO, lse, delta once per K/V tile in the dK/dV kernel) and nothing
/// quadratic.
pub fn bytes_moved_model(
    cfg: &AttentionConfig,
    dtype: DType,
    alg: Algorithm,
    pass: Pass,
    t: ModelTiles,
) -> f64 {
    let (bh, sq, sk, d) = (
        (cfg.batch * cfg.heads_q) as f64,
        cfg.seq_q as f64,
        cfg.seq_kv as f64,
        cfg.head_dim as f64,
    );
    let vis = visible_pairs(cfg) / (sq * sk);
    let q_tiles = (sq / t.fwd_q as f64).ceil();
    let kv_tiles = (sk / t.dkdv_kv as f64).ceil();
    let dq_tiles = (sq / t.dq_q as f64).ceil();
    // (elements of the call's dtype, f32 elements)
    let fwd = match alg {
        // scores: Q, K -> S; softmax: S -> P, lse; pv: P, V -> O
        Algorithm::Naive => (2.0 * sq * d + 2.0 * sk * d, 4.0 * sq * sk + sq),
        // Q once, K and V once per Q tile (the visible part), O once; lse once
        Algorithm::Tiled => (sq * d + q_tiles * 2.0 * sk * d * vis + sq * d, sq),
    };
    let bwd = match alg {
        // delta: O, dO -> delta; probs: Q, K, lse -> P; dp: dO, V -> dP;
        // ds: P, delta, dP -> dS (over dP); dkdv: P, dS, Q, dO -> dK, dV; dq: dS, K -> dQ
        Algorithm::Naive => (
            2.0 * sq * d
                + (sq * d + sk * d)
                + (sq * d + sk * d)
                + (2.0 * sq * d + 2.0 * sk * d)
                + (sk * d + sq * d),
            sq + (sq + sq * sk) + sq * sk + (3.0 * sq * sk + sq) + 2.0 * sq * sk + sq * sk,
        ),
        // delta: O, dO -> delta; dK/dV: K, V once, Q and dO (and lse, delta) once per K/V
        // tile, dK and dV written once; dQ: Q, dO, lse, delta once, K and V once per Q tile,
        // dQ written once
        Algorithm::Tiled => (
            2.0 * sq * d
                + (4.0 * sk * d + kv_tiles * 2.0 * sq * d * vis)
                + (3.0 * sq * d + dq_tiles * 2.0 * sk * d * vis),
            sq + kv_tiles * 2.0 * sq * vis + 2.0 * sq,
        ),
    };
    let (elems, f32s) = match pass {
        Pass::Fwd => fwd,
        Pass::FwdBwd => (fwd.0 + bwd.0, fwd.1 + bwd.1),
    };
    bh * (elems * dtype.size_bytes() as f64 + f32s * 4.0)
}

/// Modelled bytes over time, as a fraction of the measured copy bandwidth.
pub fn bw_fraction(bytes: f64, ms: f64, roof: &Roofline) -> f64 {
    bytes / (ms * 1e-3) / (roof.copy_gbps * 1e9)
}
