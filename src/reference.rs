//! Naive f64 CPU reference: `softmax(scale * Q K^T) V` and its analytic gradients, with the
//! same layouts, causal alignment and GQA mapping as the kernels, and every score modifier
//! (window, key lengths, block mask, softcap, ALiBi, sinks, dropout) from its definition. Deliberately plain (no tiling, no
//! online softmax, no exp2 domain) so that it cannot share the kernels' bugs.

use crate::config::AttentionConfig;

/// Reference forward output. Non-exhaustive: the reference makes it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RefForward {
    /// `[batch, seq_q, heads_q, dv]` (`AttentionConfig::dv`: head_dim unless head_dim_v)
    pub out: Vec<f64>,
    /// `[batch, heads_q, seq_q]`, natural log; `-inf` for rows that see no key.
    pub lse: Vec<f64>,
}

/// Reference gradients. Non-exhaustive: the reference makes them, and a new modifier's
/// gradient is a new field.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RefGradients {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    /// With sinks: `[heads_q]`.
    pub d_sinks: Option<Vec<f64>>,
    /// With a bias that asks for it (`ScoreBias::grad`): the bias's shape.
    pub d_bias: Option<Vec<f64>>,
    /// With a trainable captured tensor (`ScoreMod::with_trainable`): its length; NaN without
    /// the modifier's `with_table_reference`.
    pub d_table: Option<Vec<f64>>,
}

/// Straight from the definitions (not `AttentionConfig::band`, which the kernels' host code
/// uses): i' = i + seq_kv - seq_q (per sequence with varlen, where pairs of different
/// sequences are hidden); causal: j <= i'; window: i' - left <= j <= i' + right; key padding:
/// `leftpad_kv[b] <= j < seqlens_kv[b]`; block mask: the block of (i, j) is on for (b, h);
/// boolean mask: its entry for (b, h, i, j) is true; a user's mask_mod: its host predicate.
/// Public for tests that plant NaN in the key rows no query sees.
pub fn visible(cfg: &AttentionConfig, (b, h, i, j): (usize, usize, usize, usize)) -> bool {
    if let Some(n) = &cfg.seqlens_kv {
        if j >= n[b] {
            return false;
        }
    }
    if let Some(n) = &cfg.leftpad_kv {
        if j < n[b] {
            return false;
        }
    }
    if let Some(m) = &cfg.block_mask {
        if !m.allows(cfg.seq_q, cfg.seq_kv, (b, h, i, j)) {
            return false;
        }
    }
    if let Some(m) = &cfg.mask {
        if !m.allows((b, h, i, j)) {
            return false;
        }
    }
    if !crate::registry::mask_mod_reference(cfg, b, h, i, j) {
        return false;
    }
    let Some((ip, j)) = crate::registry::positions::aligned(cfg, b, i, j) else {
        return false;
    };
    let causal_ok = !cfg.causal || j <= ip;
    let left_ok = cfg.window.left.is_none_or(|l| j >= ip - l as i64);
    let right_ok = cfg.window.right.is_none_or(|r| j <= ip + r as i64);
    causal_ok && left_ok && right_ok
}

// Element 0 of a row: of q (qi), out and d_out (oi: dv wide), k (ki), v (vi: dv wide).
fn qi(cfg: &AttentionConfig, b: usize, i: usize, h: usize) -> usize {
    ((b * cfg.seq_q + i) * cfg.heads_q + h) * cfg.head_dim
}

fn oi(cfg: &AttentionConfig, b: usize, i: usize, h: usize) -> usize {
    ((b * cfg.seq_q + i) * cfg.heads_q + h) * cfg.dv()
}

fn kv_row(cfg: &AttentionConfig, b: usize, j: usize, h: usize) -> usize {
    let row = match &cfg.paged {
        Some(p) => p.row(b, j),
        None => b * cfg.seq_kv + j,
    };
    row * cfg.heads_kv + h
}

fn ki(cfg: &AttentionConfig, b: usize, j: usize, h: usize) -> usize {
    kv_row(cfg, b, j, h) * cfg.head_dim
}

fn vi(cfg: &AttentionConfig, b: usize, j: usize, h: usize) -> usize {
    kv_row(cfg, b, j, h) * cfg.dv()
}

/// scale * q_i . k_j of query head h, batch b, in f64.
fn raw_score(
    cfg: &AttentionConfig,
    q: &[f32],
    k: &[f32],
    (b, h, i, j): (usize, usize, usize, usize),
) -> f64 {
    let (qo, ko) = (qi(cfg, b, i, h), ki(cfg, b, j, h / cfg.group()));
    let dot: f64 = (0..cfg.head_dim)
        .map(|x| q[qo + x] as f64 * k[ko + x] as f64)
        .sum();
    dot * cfg.scale() as f64
}

/// The score softmax sees for a visible pair: scaled, then each score modifier in turn
/// (softcap, ALiBi, the bias: `modifiers::reference_chain`).
fn score(cfg: &AttentionConfig, q: &[f32], k: &[f32], at: (usize, usize, usize, usize)) -> f64 {
    crate::registry::reference_chain(cfg, at, raw_score(cfg, q, k, at)).0
}

/// d(score) / d(raw score) of pair (i, j): the score modifiers' slopes (the softcap's).
fn score_slope(
    cfg: &AttentionConfig,
    q: &[f32],
    k: &[f32],
    at: (usize, usize, usize, usize),
) -> f64 {
    crate::registry::reference_chain(cfg, at, raw_score(cfg, q, k, at)).1
}

/// Probabilities of one query row (zeros where masked; all zero when no key is visible),
/// and the row's lse. A sink joins the denominator: p_j = exp(s_j) / (sum exp(s) + exp(sink)).
fn row_probs(
    cfg: &AttentionConfig,
    q: &[f32],
    k: &[f32],
    b: usize,
    h: usize,
    i: usize,
) -> (Vec<f64>, f64) {
    let mut s = vec![f64::NEG_INFINITY; cfg.seq_kv];
    for (j, sj) in s.iter_mut().enumerate() {
        if visible(cfg, (b, h, i, j)) {
            *sj = score(cfg, q, k, (b, h, i, j));
        }
    }
    let sink = cfg.sink(h).map(|x| x as f64);
    if s.iter().all(|&x| x == f64::NEG_INFINITY) {
        return (vec![0.0; cfg.seq_kv], sink.unwrap_or(f64::NEG_INFINITY));
    }
    // NaN scores (a NaN in q or a visible k) are skipped by the max and make the row's sum,
    // every probability and the lse NaN; a -inf score (hidden, or a -inf dot product) weighs 0.
    let m = s
        .iter()
        .cloned()
        .chain(sink)
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s
        .iter()
        .map(|&x| {
            if x == f64::NEG_INFINITY {
                0.0
            } else {
                (x - m).exp()
            }
        })
        .collect();
    let l: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
    (e.iter().map(|x| x / l).collect(), m + l.ln())
}

/// `out = softmax(scale * Q K^T) V` and `lse = log(sum(exp(scale * Q K^T)))` per row.
pub fn forward(cfg: &AttentionConfig, q: &[f32], k: &[f32], v: &[f32]) -> RefForward {
    let d = cfg.dv();
    let mut out = vec![0.0; cfg.batch * cfg.seq_q * cfg.heads_q * d];
    let mut lse = vec![0.0; cfg.batch * cfg.heads_q * cfg.seq_q];
    for b in 0..cfg.batch {
        for h in 0..cfg.heads_q {
            let hk = h / cfg.group();
            for i in 0..cfg.seq_q {
                let (p, row_lse) = row_probs(cfg, q, k, b, h, i);
                lse[(b * cfg.heads_q + h) * cfg.seq_q + i] = row_lse;
                let oo = oi(cfg, b, i, h);
                for (j, &pj) in p.iter().enumerate() {
                    // dropout: a kept pair's weight scales by 1 / (1 - p), a dropped one's is 0
                    let w = pj * cfg.dropout_factor(b, h, i, j);
                    if w != 0.0 {
                        let vo = vi(cfg, b, j, hk);
                        for x in 0..d {
                            out[oo + x] += w * v[vo + x] as f64;
                        }
                    }
                }
            }
        }
    }
    RefForward { out, lse }
}

/// Rotary embedding (module [`rotary`](crate::rotary)) of `x`, `[batch, rows, heads,
/// head_dim]` (`shape`), from its definition in f64: each pair of the first `2 * cols` dims
/// (`cos`, `sin`: `[table_rows, cols]`) turned by the angle at its row's position.
pub fn rotary(
    x: &[f32],
    shape: [usize; 4],
    (cos, sin, cols): (&[f32], &[f32], usize),
    interleaved: bool,
    positions: &crate::rotary::Positions,
) -> Vec<f64> {
    let [batch, rows, heads, d] = shape;
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for b in 0..batch {
        for i in 0..rows {
            let p = positions.at(b, i);
            for h in 0..heads {
                let base = ((b * rows + i) * heads + h) * d;
                for f in 0..cols {
                    let (a, z) = if interleaved {
                        (base + 2 * f, base + 2 * f + 1)
                    } else {
                        (base + f, base + f + cols)
                    };
                    let (c, s) = (cos[p * cols + f] as f64, sin[p * cols + f] as f64);
                    let (x0, x1) = (x[a] as f64, x[z] as f64);
                    out[a] = x0 * c - x1 * s;
                    out[z] = x1 * c + x0 * s;
                }
            }
        }
    }
    out
}

/// The exact merge of partial results over disjoint key shards (module
/// [`merge`](crate::merge)), in f64: each shard's out laid out `out_shape` (`[batch, seq_q,
/// heads_q, head_dim]`), its lse `[batch, heads_q, seq_q]`. A row whose every shard has lse
/// -inf comes out with lse -inf and out 0.
pub fn merge(out_shape: [usize; 4], shards: &[(&[f64], &[f64])]) -> RefForward {
    let [batch, seq_q, heads, d] = out_shape;
    let mut out = vec![0.0; batch * seq_q * heads * d];
    let mut lse = vec![f64::NEG_INFINITY; batch * heads * seq_q];
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..seq_q {
                let r = (b * heads + h) * seq_q + i;
                let m = shards
                    .iter()
                    .map(|s| s.1[r])
                    .fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let total: f64 = shards.iter().map(|s| (s.1[r] - m).exp()).sum();
                lse[r] = m + total.ln();
                let o = ((b * seq_q + i) * heads + h) * d;
                for s in shards {
                    let w = (s.1[r] - lse[r]).exp();
                    for x in 0..d {
                        out[o + x] += w * s.0[o + x];
                    }
                }
            }
        }
    }
    RefForward { out, lse }
}

/// Analytic gradients of `sum(out * d_out)`:
/// `dV = (Z P)^T dO`, `dP = Z dO V^T`, `dS = P * (dP - rowsum(dO * O))` (Z: the dropout
/// factors, 0 or 1 / (1 - p), elementwise; all 1 without dropout), `dQ = scale dS K`,
/// `dK = scale dS^T Q`, summed over the query heads that share a kv head (through the
/// softcap: times its slope; ALiBi's bias has slope 1). With sinks, `d_sink[h] = -sum over
/// rows of P_sink * rowsum(dO * O)`, P_sink = exp(sink - lse). With a bias that asks for it,
/// `d_bias = P * (dP - rowsum(dO * O))` (the gradient at the finished score, after the
/// softcap), summed over the dimensions the bias broadcasts. With a trainable captured tensor,
/// `d_table[e]` sums that gradient times d score_mod / d entry over the pairs that read entry e
/// (the modifier's `with_table_reference`).
pub fn backward(
    cfg: &AttentionConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_out: &[f32],
) -> RefGradients {
    backward_impl(cfg, q, k, v, None, d_out)
}

/// The gradients as the backward pass defines them when it is handed a stored `out`:
/// `delta = rowsum(dO * out)` uses that `out` (for half dtypes, the rounded forward output)
/// rather than the exact one. Everything else is as [`backward`].
pub fn backward_with_out(
    cfg: &AttentionConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    d_out: &[f32],
) -> RefGradients {
    backward_impl(cfg, q, k, v, Some(out), d_out)
}

fn backward_impl(
    cfg: &AttentionConfig,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: Option<&[f32]>,
    d_out: &[f32],
) -> RefGradients {
    let (d, dvw) = (cfg.head_dim, cfg.dv());
    let scale = cfg.scale() as f64;
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    let mut d_sinks = cfg.sinks.as_ref().map(|s| vec![0.0; s.len()]);
    let mut d_bias = match &cfg.bias {
        Some(b) if b.grad => Some(vec![0.0; b.len()]),
        _ => None,
    };
    let table = cfg.score_mod.as_ref().and_then(|m| {
        let t = m.trainable_parts()?;
        Some((m.captured()[t.index].1.len(), t.host.clone()))
    });
    let mut d_table = table.as_ref().map(|(len, host)| match host {
        Some(_) => vec![0.0; *len],
        None => vec![f64::NAN; *len],
    });
    for b in 0..cfg.batch {
        for h in 0..cfg.heads_q {
            let hk = h / cfg.group();
            for i in 0..cfg.seq_q {
                let (p, lse) = row_probs(cfg, q, k, b, h, i);
                let (qo, oo) = (qi(cfg, b, i, h), oi(cfg, b, i, h));
                let z: Vec<f64> = (0..cfg.seq_kv)
                    .map(|j| cfg.dropout_factor(b, h, i, j))
                    .collect();
                let dp: Vec<f64> = (0..cfg.seq_kv)
                    .map(|j| {
                        // a dropped pair's dP is 0, whatever its v holds
                        if z[j] == 0.0 {
                            return 0.0;
                        }
                        let vo = vi(cfg, b, j, hk);
                        z[j] * (0..dvw)
                            .map(|x| d_out[oo + x] as f64 * v[vo + x] as f64)
                            .sum::<f64>()
                    })
                    .collect();
                let delta: f64 = match out {
                    Some(o) => (0..dvw)
                        .map(|x| d_out[oo + x] as f64 * o[oo + x] as f64)
                        .sum(),
                    // hidden keys (p = 0) contribute nothing, whatever their v holds
                    None => p
                        .iter()
                        .zip(&dp)
                        .filter(|(a, _)| **a != 0.0)
                        .map(|(a, b)| a * b)
                        .sum(),
                };
                if let (Some(ds), Some(sink)) = (d_sinks.as_mut(), cfg.sink(h)) {
                    ds[h] -= (sink as f64 - lse).exp() * delta;
                }
                for j in 0..cfg.seq_kv {
                    if p[j] == 0.0 {
                        continue;
                    }
                    let finished = p[j] * (dp[j] - delta);
                    if let (Some(db), Some(bias)) = (d_bias.as_mut(), &cfg.bias) {
                        let (bb, bh) = (b.min(bias.batch - 1), h.min(bias.heads - 1));
                        db[((bb * bias.heads + bh) * cfg.seq_q + i) * cfg.seq_kv + j] += finished;
                    }
                    if let (Some(dt), Some((len, Some(partial)))) = (d_table.as_mut(), &table) {
                        let x = raw_score(cfg, q, k, (b, h, i, j));
                        let pre = crate::registry::reference_before_score_mod(cfg, (b, h, i, j), x);
                        let (e, d) = partial(pre, b, h, i, j);
                        dt[e.min(len - 1)] += finished * d;
                    }
                    let ds = finished * score_slope(cfg, q, k, (b, h, i, j));
                    let (ko, vo) = (ki(cfg, b, j, hk), vi(cfg, b, j, hk));
                    for x in 0..dvw {
                        dv[vo + x] += p[j] * z[j] * d_out[oo + x] as f64;
                    }
                    for x in 0..d {
                        dq[qo + x] += scale * ds * k[ko + x] as f64;
                        dk[ko + x] += scale * ds * q[qo + x] as f64;
                    }
                }
            }
        }
    }
    RefGradients {
        dq,
        dk,
        dv,
        d_sinks,
        d_bias,
        d_table,
    }
}
