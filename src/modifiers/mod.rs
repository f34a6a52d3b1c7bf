//! The modifiers' public value types: masks (block-sparse, boolean, varlen, a user's
//! `mask_mod`), score terms (a bias, a user's `score_mod`), dropout, and paged K/V layouts,
//! each checked against the call's shape by its own `validate`. The config holds them
//! (`AttentionConfig`); what the kernels make of each is in two other places, which sit
//! above and below: its kernel side (bit, name, WGSL and CUDA snippets) in
//! `kernels/hooks.rs`, and its rules over a call (when it is on, its checks, its parameters,
//! its f64 reference) in `registry/`. The built-in modifiers that are plain config fields
//! (causal, window, softcap, ALiBi, sinks, key ranges) have no type here.
//! docs/ARCHITECTURE.md lists what a new modifier touches.

pub mod bias;
pub mod block_mask;
pub mod bool_mask;
#[cfg(not(target_arch = "wasm32"))]
mod derive;
pub mod dropout;
pub mod flex_blocks;
#[cfg(not(target_arch = "wasm32"))]
mod ir_walk;
pub mod mask_mod;
pub(crate) mod names;
pub mod paged;
pub mod score_mod;
#[cfg(not(target_arch = "wasm32"))]
mod to_cuda;
pub(crate) mod user_code;
pub mod varlen;

use crate::error::{Error, Result};

/// Entries between one grid of a `[batch, heads, ...]` tensor of `grid`-entry grids and the
/// next batch's, and the next head's: 0 along a broadcast dimension (a size of 1). The masks'
/// and the bias's strides.
pub(crate) fn broadcast_strides(batch: usize, heads: usize, grid: u64) -> (u64, u64) {
    let h = if heads > 1 { grid } else { 0 };
    let b = if batch > 1 { heads as u64 * grid } else { 0 };
    (b, h)
}

/// A mask's leading dimensions `(batch, heads)` (field names `{field}.batch`, `{field}.heads`)
/// against the call's `(batch, heads_q)`: each 1 (broadcast) or the call's.
pub(crate) fn check_broadcast(
    field: &str,
    (batch, heads): (usize, usize),
    (call_batch, heads_q): (usize, usize),
) -> Result<()> {
    for (name, v, full, what) in [
        ("batch", batch, call_batch, "batch"),
        ("heads", heads, heads_q, "heads_q"),
    ] {
        if v != 1 && v != full {
            return Err(Error::invalid(format!(
                "{field}.{name} must be 1 (broadcast) or the call's {what} = {full}, got {v}"
            )));
        }
    }
    Ok(())
}

/// A per-pair tensor's shape `(batch, heads, seq_q, seq_kv)` (a boolean mask's, a bias's;
/// field names `{field}.batch` and so on) against the call's: batch and heads 1 (broadcast)
/// or the call's, seq_q and seq_kv the call's.
pub(crate) fn check_pair_shape(
    field: &str,
    (batch, heads, seq_q, seq_kv): (usize, usize, usize, usize),
    call: (usize, usize, usize, usize),
) -> Result<()> {
    check_broadcast(field, (batch, heads), (call.0, call.1))?;
    for (name, v, full) in [("seq_q", seq_q, call.2), ("seq_kv", seq_kv, call.3)] {
        if v != full {
            return Err(Error::invalid(format!(
                "{field}.{name} must be the call's {name} = {full} ({field} broadcasts over \
                 batch and heads only), got {v}"
            )));
        }
    }
    Ok(())
}

/// Most entries a per-pair tensor (a boolean mask, a bias) may hold: the kernels index them
/// in 32 bits.
pub const MAX_PAIR_ENTRIES: u64 = u32::MAX as u64;

/// A per-pair tensor (`field`: a boolean mask, a bias) of shape `dims` against the call's
/// (`check_pair_shape`), with at most [`MAX_PAIR_ENTRIES`] entries stored `per_word` to a
/// 32-bit word in `words` words.
pub(crate) fn check_pair_tensor(
    field: &str,
    dims: (usize, usize, usize, usize),
    call: (usize, usize, usize, usize),
    words: usize,
    per_word: u64,
) -> Result<()> {
    check_pair_shape(field, dims, call)?;
    let (batch, heads, seq_q, seq_kv) = dims;
    let limit = MAX_PAIR_ENTRIES;
    let n = [batch, heads, seq_q, seq_kv]
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64));
    match n {
        Some(n) if n <= limit && words as u64 == n.div_ceil(per_word) => Ok(()),
        Some(n) if n <= limit => Err(Error::invalid(format!(
            "{field} holds {words} words for {n} entries, expected {}",
            n.div_ceil(per_word)
        ))),
        _ => Err(Error::invalid(format!(
            "{field} [{batch}, {heads}, {seq_q}, {seq_kv}] has more than {limit} entries, the \
             most the kernels address; broadcast it over batch or heads, or split the call"
        ))),
    }
}
