// Shared by every kernel: the runtime parameters, indexing, masking and sentinels.
// Functions and declarations only; each kernel file holds its own bindings 1.. and entry point.
// The Rust side prepends a `const` prelude (HEAD_DIM and, for tiled kernels, BR, BC, TPR, NT,
// DPT, CPT) generated per pipeline.

// Mirrored by `Params` in src/kernels.rs (a test checks the layouts agree).
struct Params {
    batch: u32,
    seq_q: u32,
    seq_kv: u32,
    heads_q: u32,
    heads_kv: u32,
    head_dim: u32,
    group: u32,          // heads_q / heads_kv
    causal_offset: i32,  // seq_kv - seq_q: query i sees key j iff j <= i + causal_offset
    scale: f32,          // softmax_scale
    scale_log2: f32,     // softmax_scale * log2(e): scores live in the exp2 domain
    n_q_tiles: u32,
    n_kv_tiles: u32,
    total_wg: u32,       // workgroups that do work; the grid may be folded and padded
    slice_base: u32,     // naive kernels: first (batch, head) slice of this chunk
    slice_count: u32,    // naive kernels: slices in this chunk
    total_items: u32,    // element-parallel kernels: items in this dispatch
}

@group(0) @binding(0) var<uniform> params: Params;

override CAUSAL: bool = false;

// Finite stand-in for -inf as the initial running max: exp2(m_old - m_new) stays 0 or 1,
// never NaN, for rows whose keys are all masked so far (llama.cpp uses -FLT_MAX/2 alike).
const NEG_SENTINEL: f32 = -1.0e30;
// A masked score: far below NEG_SENTINEL, so exp2(MASKED_SCORE - m) is exactly 0 even while
// m is still the sentinel, and max() never picks it over a real score.
const MASKED_SCORE: f32 = -3.0e38;
const LN2: f32 = 0.6931471805599453;
const LOG2E: f32 = 1.4426950408889634;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u);
}

// Linear workgroup id of a grid folded into (x, y) to stay under 65,535 per dimension.
fn linear_workgroup(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// The query tile a forward or dQ workgroup owns: batch, query head, its kv head, first row.
struct QTile {
    b: u32,
    h: u32,
    hk: u32,
    q0: u32,
}

fn q_tile_of(wg: u32, rows: u32) -> QTile {
    let bh = wg / params.n_q_tiles;
    let h = bh % params.heads_q;
    return QTile(bh / params.heads_q, h, h / params.group, (wg % params.n_q_tiles) * rows);
}

// The key tile a dK/dV workgroup owns: batch, kv head, first key.
struct KvTile {
    b: u32,
    hk: u32,
    kv0: u32,
}

fn kv_tile_of(wg: u32, rows: u32) -> KvTile {
    let bh = wg / params.n_kv_tiles;
    return KvTile(bh / params.heads_kv, bh % params.heads_kv, (wg % params.n_kv_tiles) * rows);
}

// Query row `row` of a naive kernel's chunk, counted from the chunk's first (batch, head)
// slice: its batch, head and row index.
struct SliceRow {
    b: u32,
    h: u32,
    i: u32,
}

fn slice_row(row: u32) -> SliceRow {
    let slice = params.slice_base + row / params.seq_q;
    return SliceRow(slice / params.heads_q, slice % params.heads_q, row % params.seq_q);
}

// q, out, dq: [batch, seq_q, heads_q, head_dim]
fn q_index(b: u32, i: u32, h: u32, d: u32) -> u32 {
    return ((b * params.seq_q + i) * params.heads_q + h) * HEAD_DIM + d;
}

// k, v, dk, dv: [batch, seq_kv, heads_kv, head_dim]
fn kv_index(b: u32, j: u32, hk: u32, d: u32) -> u32 {
    return ((b * params.seq_kv + j) * params.heads_kv + hk) * HEAD_DIM + d;
}

// lse, delta: [batch, heads_q, seq_q]
fn row_index(b: u32, h: u32, i: u32) -> u32 {
    return (b * params.heads_q + h) * params.seq_q + i;
}

// Bottom-right aligned causal mask plus bounds. Non-short-circuit `&` and `|` keep this free
// of branches, so that loops calling it stay simple enough for drivers to unroll.
fn visible(i: u32, j: u32) -> bool {
    let in_range = (i < params.seq_q) & (j < params.seq_kv);
    return in_range & (!CAUSAL | (i32(j) <= i32(i) + params.causal_offset));
}

// Keys [0, end) are the only ones any of query rows [q_begin, q_end) can see.
fn kv_end_for_rows(q_begin: u32, q_end: u32) -> u32 {
    if (!CAUSAL) {
        return params.seq_kv;
    }
    let last = i32(min(q_end, params.seq_q)) - 1 + params.causal_offset + 1;
    return u32(clamp(last, 0, i32(params.seq_kv)));
}

// First query row that can see key `j0` (rows before it are fully masked for keys >= j0).
fn q_begin_for_key(j0: u32) -> u32 {
    if (!CAUSAL) {
        return 0u;
    }
    return u32(clamp(i32(j0) - params.causal_offset, 0, i32(params.seq_q)));
}

// True when some (row, key) pair of the tile needs the mask or a bounds check.
fn tile_needs_mask(q_begin: u32, kv_begin: u32, kv_len: u32) -> bool {
    if (kv_begin + kv_len > params.seq_kv) {
        return true;
    }
    return CAUSAL && i32(kv_begin + kv_len - 1u) > i32(q_begin) + params.causal_offset;
}

// Natural-log LSE from the exp2-domain running max and the row sum.
fn finish_lse(m: f32, l: f32) -> f32 {
    if (l > 0.0) {
        return (m + log2(l)) * LN2;
    }
    return neg_inf();
}

fn pos_inf() -> f32 {
    return bitcast<f32>(0x7f800000u);
}

// lse (natural log) to the exp2 domain. A row that sees no key (lse = -inf) becomes +inf so
// that exp2(s - lse2) is exactly 0 for it, never NaN.
fn lse_to_log2(x: f32) -> f32 {
    return select(x * LOG2E, pos_inf(), x == neg_inf());
}
