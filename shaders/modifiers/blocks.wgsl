// BLOCKS: block-sparse attention (src/modifiers/block_mask.rs): the block mask's bits (extras from params.blocks_base), one grid of
// ceil(seq_q / block_q) x blocks_cols bits per (batch, query head), indexed by the whole
// call's rows and keys (a windowed call's part adds q_base / kv_base).

// True while the pairs being finished lie in a tile every block of which is on (tile_visit
// sets it for the tile it was asked about; the decode kernel, which asks for several rows'
// heads, for all of them): their block bits need no reading, as in the CUDA kernels'
// pair_visible. False outside tiles (the naive kernels test every pair).
var<private> tile_blocks_on: bool;

// The block row of query row i and the block column of key j (whole-call indices): a shift
// where the block size is a power of two (a division costs CPU drivers a scalar division per
// lane), else a division.
fn block_row(i: u32) -> u32 {
    if (params.block_q_shift < 32u) {
        return i >> params.block_q_shift;
    }
    return i / params.block_q;
}
fn block_col(j: u32) -> u32 {
    if (params.block_kv_shift < 32u) {
        return j >> params.block_kv_shift;
    }
    return j / params.block_kv;
}

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
// A tile whose blocks are all on (`tile_blocks_on`, set by tile_visit) reads no bit.
fn block_on(i: u32, j: u32) -> bool {
    if (!BLOCKS() || tile_blocks_on) {
        return true;
    }
    let bit = head_blocks + block_row(params.q_base + i) * params.blocks_cols
        + block_col(params.kv_base + j);
    return ((extra_u32(params.blocks_base + bit / 32u) >> (bit % 32u)) & 1u) == 1u;
}
