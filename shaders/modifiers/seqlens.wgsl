// SEQLENS: per-batch key ranges (AttentionConfig::seqlens_kv, leftpad_kv, align_to_seqlens;
// src/modifiers/seqlens.rs).

// Keys [kv_start(b), kv_len(b)) of batch b take part: all seq_kv, or with SEQLENS the batch's
// range, a (length, first key) pair of extras words (counted from the whole call's key 0: a
// windowed call's part starts at params.kv_base). Pure functions of uniform values, so loop
// bounds that use them stay uniform.
// Word 0 (length) or 1 (first key) of batch b's pair, as the host wrote it.
fn key_range_word(b: u32, word: u32) -> u32 {
    return extra_u32(params.seqlens_base + 2u * (params.batch_base + b) + word);
}

// key_range_word in this part's key numbering, clamped to it.
fn batch_key(b: u32, word: u32) -> u32 {
    let n = i32(key_range_word(b, word)) - i32(params.kv_base);
    return u32(clamp(n, 0, i32(params.seq_kv)));
}

fn kv_len(b: u32) -> u32 {
    if (!SEQLENS()) {
        return params.seq_kv;
    }
    return batch_key(b, 0u);
}

// Keys before it are hidden from batch b (AttentionConfig::leftpad_kv); 0 without SEQLENS.
fn kv_start(b: u32) -> u32 {
    if (!SEQLENS()) {
        return 0u;
    }
    return batch_key(b, 1u);
}

// With per-batch alignment (AttentionConfig::align_to_seqlens, a KV cache), batch b's causal
// diagonal, window and ALiBi positions sit seqlens_kv[b] - seq_kv keys left of the padded
// alignment (counted from the whole call's seq_kv, params.align_kv); 0 otherwise. A pure
// function of uniform values (loop bounds may use it).
fn align_shift(b: u32) -> i32 {
    if (!SEQLENS() || params.align_kv == 0u) {
        return 0;
    }
    return i32(key_range_word(b, 0u)) - i32(params.align_kv);
}
