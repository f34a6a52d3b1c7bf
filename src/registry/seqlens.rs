//! Per-batch key ranges: batch b sees keys `[leftpad_kv[b], seqlens_kv[b])` of a padded batch
//! (`AttentionConfig::seqlens_kv`, `leftpad_kv`), optionally with its causal diagonal, window
//! and ALiBi aligned to its own length (`align_to_seqlens`, a KV cache). The ranges live in
//! the extras; kernels: shaders/modifiers/seqlens.wgsl and `for_batch` in cuda/common.cuh.

use super::modifier::{Modifier, Reference};
use crate::error::{Error, Result};
use crate::kernels::hooks;
use crate::kernels::params::Params;
use crate::AttentionConfig;

pub(crate) const MODIFIER: Modifier = Modifier {
    hooks: &hooks::SEQLENS,
    active: |cfg| cfg.per_batch_keys(),
    check,
    encode,
    reference: Reference::None,
};

fn check(cfg: &AttentionConfig) -> Result<()> {
    if let Some(s) = &cfg.seqlens_kv {
        if s.len() != cfg.batch {
            return Err(Error::invalid(format!(
                "seqlens_kv must hold one key length per batch ([batch] = [{}]), got {}",
                cfg.batch,
                s.len()
            )));
        }
        if let Some((b, n)) = s.iter().enumerate().find(|(_, &n)| n > cfg.seq_kv) {
            return Err(Error::invalid(format!(
                "seqlens_kv[{b}] must be at most seq_kv = {}, got {n}",
                cfg.seq_kv
            )));
        }
    }
    if let Some(s) = &cfg.leftpad_kv {
        if s.len() != cfg.batch {
            return Err(Error::invalid(format!(
                "leftpad_kv must hold one start per batch ([batch] = [{}]), got {}",
                cfg.batch,
                s.len()
            )));
        }
        if let Some((b, &n)) = s.iter().enumerate().find(|&(b, &n)| n > cfg.kv_len(b)) {
            return Err(Error::invalid(format!(
                "leftpad_kv[{b}] must be at most batch {b}'s key length {}, got {n}",
                cfg.kv_len(b)
            )));
        }
    }
    if cfg.align_to_seqlens && cfg.seqlens_kv.is_none() {
        return Err(Error::invalid(
            "align_to_seqlens needs seqlens_kv (the key lengths to align to), got None",
        ));
    }
    Ok(())
}

fn encode(cfg: &AttentionConfig, p: &mut Params) {
    p.align_kv = if cfg.align_to_seqlens && cfg.seqlens_kv.is_some() {
        cfg.seq_kv as u32
    } else {
        0
    };
    p.align_min_shift = (0..cfg.batch)
        .map(|b| cfg.align_shift(b))
        .min()
        .unwrap_or(0)
        .clamp(i32::MIN as i64, 0) as i32;
}
