//! How the naive path splits its (batch, head) slices so that each chunk's seq_q x seq_kv
//! score matrices fit one storage binding. Shared by the forward and backward plans.

use crate::config::AttentionConfig;
use crate::error::{Error, Result};

/// Slices per chunk: a multiple of `unit_slices` (the backward keeps whole GQA groups
/// together, since dK and dV sum over a group's query heads).
pub(super) fn chunk_slices(
    cfg: &AttentionConfig,
    unit_slices: usize,
    max_binding_bytes: u64,
) -> Result<usize> {
    let limit = max_binding_bytes;
    let unit_bytes = (cfg.seq_q as u64)
        .checked_mul(cfg.seq_kv as u64)
        .and_then(|x| x.checked_mul(4 * unit_slices as u64))
        .unwrap_or(u64::MAX);
    if unit_bytes > limit {
        return Err(Error::DeviceLimit {
            what: format!(
                "Algorithm::Naive's seq_q x seq_kv score matrix ({} x {} f32{})",
                cfg.seq_q,
                cfg.seq_kv,
                if unit_slices > 1 {
                    format!(", {unit_slices} query heads of one kv group")
                } else {
                    String::new()
                }
            ),
            needed: unit_bytes,
            limit,
            hint: "Algorithm::Tiled never materializes that matrix and has no such limit".into(),
        });
    }
    Ok(((limit / unit_bytes) as usize).max(1) * unit_slices)
}
