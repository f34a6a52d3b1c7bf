// BLOCKS: block-sparse attention (src/modifiers/block_mask.rs): the block mask's bits (extras from params.blocks_base), one grid of
// ceil(seq_q / block_q) x blocks_cols bits per (batch, query head), indexed by the whole
// call's rows and keys (a windowed call's part adds q_base / kv_base).

// The first bit of (batch b, query head h)'s grid: a pure function of uniform values.
fn blocks_grid(b: u32, h: u32) -> u32 {
    return (params.batch_base + b) * params.blocks_b_stride + h * params.blocks_h_stride;
}

// Set bits among bits [first, last] of the bit plane at extras word `base` (the block mask's
// on bits, params.blocks_base, or its full ones, params.blocks_full), a word at a time.
fn blocks_on(base: u32, first: u32, last: u32) -> u32 {
    var n = 0u;
    for (var w = first / 32u; w <= last / 32u; w++) {
        var word = extra_u32(base + w);
        if (w == first / 32u) {
            word &= 0xffffffffu << (first % 32u);
        }
        if (w == last / 32u) {
            word &= 0xffffffffu >> (31u - last % 32u);
        }
        n += countOneBits(word);
    }
    return n;
}

// With BLOCKS, true when the block of pair (i, j) of the current head (`begin_head`) is on;
// true without.
fn block_on(i: u32, j: u32) -> bool {
    if (!BLOCKS()) {
        return true;
    }
    let bit = head_blocks + ((params.q_base + i) / params.block_q) * params.blocks_cols
        + (params.kv_base + j) / params.block_kv;
    return ((extra_u32(params.blocks_base + bit / 32u) >> (bit % 32u)) & 1u) == 1u;
}
