//! Where the f64 reference puts a pair: a row and a key in their sequence's own numbering, as
//! the reference's masks (src/reference.rs) and the modifiers' references by position (ALiBi's
//! distance, registry/alibi.rs) both read it; below both, so that neither imports the other.
//! From the definitions, not from the kernels' host code (`AttentionConfig::band`), so that
//! the reference cannot share their bugs.

use crate::config::AttentionConfig;

/// Row i and key j in their sequence's own numbering, i' (bottom-right aligned: i + seq_kv -
/// seq_q, or i + seqlens_kv[b] - seq_q with align_to_seqlens) and j; `None` when they lie in different sequences of a varlen call. Varlen: row i
/// of sequence s is i - cu_q[s] of a call of len_q(s) rows and len_kv(s) keys, key j is
/// j - cu_kv[s].
pub(crate) fn aligned(cfg: &AttentionConfig, b: usize, i: usize, j: usize) -> Option<(i64, i64)> {
    let Some(v) = &cfg.varlen else {
        // with align_to_seqlens, batch b's keys end at seqlens_kv[b]
        let keys = match (&cfg.seqlens_kv, cfg.align_to_seqlens) {
            (Some(n), true) => n[b],
            _ => cfg.seq_kv,
        };
        return Some((i as i64 + keys as i64 - cfg.seq_q as i64, j as i64));
    };
    let s = (0..v.cu_seqlens_q.len() - 1)
        .find(|&s| i < v.cu_seqlens_q[s + 1] as usize && i >= v.cu_seqlens_q[s] as usize)?;
    let (q0, q1) = (v.cu_seqlens_q[s] as i64, v.cu_seqlens_q[s + 1] as i64);
    let (k0, k1) = (v.cu_seqlens_kv[s] as i64, v.cu_seqlens_kv[s + 1] as i64);
    let j = j as i64;
    if j < k0 || j >= k1 {
        return None;
    }
    Some((i as i64 - q0 + (k1 - k0) - (q1 - q0), j - k0))
}
