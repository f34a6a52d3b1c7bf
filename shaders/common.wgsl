// Shared by every kernel: the runtime parameters, indexing, the score path (masking, score
// finishing, online softmax, the backward's recomputed probabilities), sentinels and element
// conversions. Functions and declarations only; each kernel file holds its entry point.
// Each modifier's own functions are in shaders/modifiers/ (one file per modifier, its home
// src/modifiers/); the functions here compose them at the hooks where modifiers act.
// The Rust side (src/kernels/wgsl.rs) prepends a prelude generated per pipeline: shape
// constants (HEAD_DIM and, for tiled kernels, BR, BC, TPR, NT, RPT, CPT), the kernel's
// bindings 1.., and `load_<name>(i) -> f32` / `store_<name>(i, x)` for its element-typed
// bindings in the call's dtype and storage format.

// `struct Params` (the runtime parameters at binding 0) is generated into the prelude from
// its one definition, `Params` in src/kernels/params.rs, where each field is documented.

@group(0) @binding(0) var<uniform> params: Params;

// The call's modifiers are functions of their names, CAUSAL() .. VIEWS(), that the generated
// prelude defines (src/kernels/flags.rs): a bit of params.flags read at run time (uniform, so
// barriers may sit under them), or a constant where the bit is compiled into the pipeline.
// Where each modifier's values live: the band in params.band_lo / band_hi (WINDOW); the
// softcap in params.softcap2; ALiBi slopes, sinks, key lengths (SEQLENS), the block mask's
// bits (BLOCKS) and varlen's boundaries in the extras (`extra(i)`, a uniform array); dropout's
// seed, offset and threshold in Params; the boolean mask's bits (MASK, `mask_bit`), the bias's
// entries (BIAS, `bias_entry`) and a paged call's block table (PAGED, `page_entry`) in the
// pair data (a storage array); strided input views (VIEWS) in params.views.

const LN2: f32 = 0.6931471805599453;
const LOG2E: f32 = 1.4426950408889634;

// Infinities. WGSL forbids a const-expression whose value is infinite (Tint rejects
// `bitcast<f32>(0xff800000u)`), so the bits take in a runtime zero from the uniform: the
// bitcast is then a runtime expression with the same exact value.
fn runtime_bits(bits: u32) -> u32 {
    return bits | (params.batch & 0u);
}

fn neg_inf() -> f32 {
    return bitcast<f32>(runtime_bits(0xff800000u));
}

// A quiet NaN, for results that must be NaN whatever the driver's exp2, log2, max or division
// make of a NaN operand (WGSL promises nothing there: docs/SEMANTICS.md, "Guarantees").
fn nan_value() -> f32 {
    return bitcast<f32>(runtime_bits(0x7fc00000u));
}

// The head dim as the bound of a loop over a row's elements in global memory. Mesa's NIR
// unrolls every loop whose constant trip count is at most 32, and each element's load or
// store (views, half formats) is dozens of instructions: on lavapipe a rows kernel at
// head_dim 32 took 13 s of LLVM against 0.7 s with this bound, which no compiler can fold
// (docs/PERFORMANCE.md, "Head dims that compile for seconds"). For loops whose body loads or
// stores elements; loops over private arrays alone keep their constant bound. Tiled and
// decode kernels only: it reads 0 where params.total_wg is 0 (the elementwise kernels).
fn row_dims() -> u32 {
    return select(HEAD_DIM, 0u, params.total_wg == 0u);
}

// NaN test on the bits, which no float optimization may fold away.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
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

// Every tensor index goes through these three functions. A call split into windows
// (src/plan/split.rs) runs each part as a smaller problem whose tensors are bound from an
// aligned byte offset: the shifts place its element 0, and row_stride keeps the whole call's
// lse layout.

// q, dq: [batch, seq_q, heads_q, head_dim]; out, d_out: [batch, seq_q, heads_q, head_dim_v]
// (o_index; HEAD_DIM_V is HEAD_DIM but where a call's values are wider or narrower, which
// the naive, blocks and decode kernels run: src/plan/head_dims.rs)
fn q_index(b: u32, i: u32, h: u32, d: u32) -> u32 {
    return ((b * params.seq_q + i) * params.heads_q + h) * HEAD_DIM + d + params.q_shift;
}

fn o_index(b: u32, i: u32, h: u32, d: u32) -> u32 {
    return ((b * params.seq_q + i) * params.heads_q + h) * HEAD_DIM_V + d + params.q_shift;
}

// k, dk: [batch, seq_kv, heads_kv, head_dim]; v, dv (v_index): head_dim_v wide. With PAGED,
// k and v are page pools [pages, page_size, heads_kv, dim] and batch b's key j lies in the
// page its block-table entry names (a key past seq_kv reads its batch's last page)
fn kv_row(b: u32, j: u32, hk: u32) -> u32 {
    if (PAGED()) {
        let entry = min(j / params.page_size, params.pages_per_seq - 1u);
        let page = page_entry((params.batch_base + b) * params.pages_per_seq + entry);
        return (page * params.page_size + j % params.page_size) * params.heads_kv + hk;
    }
    return (b * params.seq_kv + j) * params.heads_kv + hk;
}

fn kv_index(b: u32, j: u32, hk: u32, d: u32) -> u32 {
    // (a paged call is never cut into windows: its kv_shift is 0)
    return kv_row(b, j, hk) * HEAD_DIM + d + params.kv_shift;
}

fn v_index(b: u32, j: u32, hk: u32, d: u32) -> u32 {
    // an MLA latent cache: v is k's buffer, and a value row the first HEAD_DIM_V dims of its
    // key row
    if (LATENT()) {
        return kv_index(b, j, hk, d);
    }
    return kv_row(b, j, hk) * HEAD_DIM_V + d + params.kv_shift;
}

// Reads of the inputs q, k, v, out and d_out go through these (stores, and reads of what the
// call itself made, through q_index and kv_index). With VIEWS, input n's element (b, i, h, d)
// lies at views[n] = (first element, batch stride, row stride, head stride) . (1, b, i, h) + d
// in its binding: any layout whose head_dim is contiguous (BHSD, a packed QKV buffer).
fn view_index(n: u32, b: u32, i: u32, h: u32, d: u32) -> u32 {
    let v = params.views[n];
    return v.x + b * v.y + i * v.z + h * v.w + d;
}

fn q_at(b: u32, i: u32, h: u32, d: u32) -> u32 {
    if (VIEWS()) {
        return view_index(0u, b, i, h, d);
    }
    return q_index(b, i, h, d);
}

fn k_at(b: u32, j: u32, hk: u32, d: u32) -> u32 {
    if (VIEWS() && !PAGED()) {
        return view_index(1u, b, j, hk, d);
    }
    return kv_index(b, j, hk, d);
}

fn v_at(b: u32, j: u32, hk: u32, d: u32) -> u32 {
    if (VIEWS() && !PAGED()) {
        return view_index(2u, b, j, hk, d);
    }
    return v_index(b, j, hk, d);
}

fn out_at(b: u32, i: u32, h: u32, d: u32) -> u32 {
    if (VIEWS()) {
        return view_index(3u, b, i, h, d);
    }
    return o_index(b, i, h, d);
}

fn dout_at(b: u32, i: u32, h: u32, d: u32) -> u32 {
    if (VIEWS()) {
        return view_index(4u, b, i, h, d);
    }
    return o_index(b, i, h, d);
}

// lse, delta: [batch, heads_q, seq_q]
fn row_index(b: u32, h: u32, i: u32) -> u32 {
    return (b * params.heads_q + h) * params.row_stride + i + params.row_shift;
}

// The backward's (lse2, delta) pair of a row: laid out as lse, in its own binding window.
fn pair_index(b: u32, h: u32, i: u32) -> u32 {
    return (b * params.heads_q + h) * params.row_stride + i + params.pair_shift;
}

// A whole-call boundary as this part's index on the key (or row) axis, clamped to the part.
fn part_key(k: u32) -> u32 {
    return u32(clamp(i32(k) - i32(params.kv_base), 0, i32(params.seq_kv)));
}

fn part_row(r: u32) -> u32 {
    return u32(clamp(i32(r) - i32(params.q_base), 0, i32(params.seq_q)));
}

// The band of keys a row sees. Query i sees key j iff i + lo <= j <= i + hi, where
// hi = causal_offset with CAUSAL alone, and with WINDOW the host's band_lo / band_hi (the
// window and causal folded together, +-2^30 on an unbounded side). Without either, every key.
fn band_hi() -> i32 {
    if (WINDOW()) {
        return params.band_hi;
    }
    return params.causal_offset;
}

// Keys [0, end) are the only ones any of query rows [q_begin, q_end) of batch b can see.
fn kv_end_for_rows(b: u32, q_begin: u32, q_end: u32) -> u32 {
    if (VARLEN()) {
        // the end of the last row's sequence, or of its band (rows of earlier sequences end
        // at that sequence's first key at the latest)
        let q_last = min(q_end, params.seq_q) - 1u;
        let s = row_sequence(q_last);
        var end = i32(part_key(cu_kv(s + 1u)));
        if (CAUSAL() || WINDOW()) {
            let band_end = i32(q_last) + band_hi() + band_shift(s) + 1;
            end = min(end, max(band_end, i32(part_key(cu_kv(s)))));
        }
        return u32(clamp(end, 0, i32(params.seq_kv)));
    }
    if (!CAUSAL() && !WINDOW()) {
        return kv_len(b);
    }
    let last = i32(min(q_end, params.seq_q)) - 1 + band_hi() + align_shift(b) + 1;
    return u32(clamp(last, 0, i32(kv_len(b))));
}

// Keys before the result are hidden from every query row of batch b at or after `q_begin`
// (the window's left edge, the batch's first key; 0 without either). Tiled kernels start
// their key loop at its tile.
fn kv_begin_for_rows(b: u32, q_begin: u32) -> u32 {
    if (VARLEN()) {
        // the start of the first row's sequence, or of its band (rows of later sequences
        // start at the next sequence's first key at the earliest)
        let s = row_sequence(q_begin);
        var begin = i32(part_key(cu_kv(s)));
        if (WINDOW()) {
            let band_begin = i32(q_begin) + params.band_lo + band_shift(s);
            begin = max(begin, min(band_begin, i32(part_key(cu_kv(s + 1u)))));
        }
        return u32(clamp(begin, 0, i32(params.seq_kv)));
    }
    if (!WINDOW()) {
        return kv_start(b);
    }
    // with per-batch alignment, the leftmost batch's edge (visible() masks the rest)
    let shift = select(0, params.align_min_shift, SEQLENS());
    let edge = clamp(i32(q_begin) + params.band_lo + shift, 0, i32(params.seq_kv));
    return max(kv_start(b), u32(edge));
}

// First query row that can see key `j0` (rows before it are fully masked for keys >= j0).
fn q_begin_for_key(j0: u32) -> u32 {
    if (VARLEN()) {
        // the first row of the key's sequence that its band reaches (keys of later sequences
        // are seen from the next sequence's first row at the earliest)
        let s = sequence_of(params.kv_base + j0, true);
        var begin = i32(part_row(cu_q(s)));
        if (CAUSAL() || WINDOW()) {
            let band_begin = i32(j0) - band_hi() - band_shift(s);
            begin = max(begin, min(band_begin, i32(part_row(cu_q(s + 1u)))));
        }
        return u32(clamp(begin, 0, i32(params.seq_q)));
    }
    if (!CAUSAL() && !WINDOW()) {
        return 0u;
    }
    return u32(clamp(i32(j0) - band_hi(), 0, i32(params.seq_q)));
}

// Rows at or after the result see none of the keys [j0, j_last] of batch b (the window's left
// edge; seq_q without a window; 0 when no key of them takes part: past the batch's length or
// before its first key). The dK/dV kernels end their query loop there.
fn q_end_for_keys(b: u32, j0: u32, j_last: u32) -> u32 {
    if (SEQLENS() && (j0 >= kv_len(b) || j_last < kv_start(b))) {
        return 0u;
    }
    if (VARLEN()) {
        // the end of the last key's sequence, or of the rows its band reaches (keys of
        // earlier sequences are seen up to that sequence's first row at the latest)
        let j = min(j_last, params.seq_kv - 1u);
        let s = sequence_of(params.kv_base + j, true);
        var end = i32(part_row(cu_q(s + 1u)));
        if (WINDOW()) {
            let band_end = i32(j) - params.band_lo - band_shift(s) + 1;
            end = min(end, max(band_end, i32(part_row(cu_q(s)))));
        }
        return u32(clamp(end, 0, i32(params.seq_q)));
    }
    if (!WINDOW()) {
        return params.seq_q;
    }
    return u32(clamp(i32(j_last) - params.band_lo - align_shift(b) + 1, 0, i32(params.seq_q)));
}

// How a tiled kernel treats a tile of (batch b, query head h): rows [q_begin, q_begin + q_len),
// keys [kv_begin, kv_begin + kv_count), clipped to the call. `skip`: every block it overlaps
// is off (BLOCKS), so nothing in it is visible; `masked`: some pair needs the mask or a
// bounds check (tile_needs_mask, or a block it overlaps is off). Uniform across the workgroup.
struct TileVisit {
    skip: bool,
    masked: bool,
}

fn tile_visit(b: u32, h: u32, q_begin: u32, q_len: u32, kv_begin: u32, kv_count: u32) -> TileVisit {
    let masked = tile_needs_mask(b, q_begin, q_len, kv_begin, kv_count);
    if (VARLEN() && varlen_tile_empty(q_begin, q_len, kv_begin, kv_count)) {
        return TileVisit(true, true);
    }
    if (!BLOCKS()) {
        // a user mask without its block mask: evaluated at every pair
        return TileVisit(false, masked || MASK_MOD());
    }
    let grid = blocks_grid(b, h);
    let r0 = block_row(params.q_base + q_begin);
    let r1 = block_row(params.q_base + min(q_begin + q_len, params.seq_q) - 1u);
    let c0 = block_col(params.kv_base + kv_begin);
    let c1 = block_col(params.kv_base + min(kv_begin + kv_count, params.seq_kv) - 1u);
    var on = 0u;
    // a user mask needs no evaluation in a tile of full blocks (blocks_full: its block mask
    // says every pair passes it)
    var full = 0u;
    let read_full = MASK_MOD() && params.blocks_full != 0u;
    for (var r = r0; r <= r1; r++) {
        let row = grid + r * params.blocks_cols;
        on += blocks_on(params.blocks_base, row + c0, row + c1);
        if (read_full) {
            full += blocks_on(params.blocks_full, row + c0, row + c1);
        }
    }
    let n = (r1 - r0 + 1u) * (c1 - c0 + 1u);
    tile_blocks_on = on == n;
    return TileVisit(on == 0u, masked || on < n || (MASK_MOD() && full < n));
}

// VARLEN: true when no pair of the tile lies within one sequence and its band: the rows'
// sequences hold none of the keys, or (one sequence) every key is past the band's right edge
// or before its left edge for every row.
fn varlen_tile_empty(q_begin: u32, q_len: u32, kv_begin: u32, kv_count: u32) -> bool {
    let q_last = min(q_begin + q_len, params.seq_q) - 1u;
    let kv_last = min(kv_begin + kv_count, params.seq_kv) - 1u;
    let first = row_sequence(q_begin);
    let last = row_sequence(q_last);
    // the rows' sequence for the pairs of this tile (row_context), or none to search per row
    tile_sequence = select(NO_SEQUENCE, first, first == last);
    if (first == last) {
        tile_context = sequence_context(first);
    }
    if (params.kv_base + kv_last < cu_kv(first) || params.kv_base + kv_begin >= cu_kv(last + 1u)) {
        return true;
    }
    if (first != last) {
        return false;
    }
    // band_shift, not tile_context: a private variable's value is non-uniform to WGSL's
    // uniformity analysis, and callers branch to barriers on this result
    let shift = band_shift(first);
    let right = (CAUSAL() || WINDOW()) && i32(kv_begin) > i32(q_last) + band_hi() + shift;
    let left = WINDOW() && i32(kv_last) < i32(q_begin) + params.band_lo + shift;
    return right || left;
}

// True when some (row, key) pair of batch b's tile (rows [q_begin, q_begin + q_len), keys
// [kv_begin, kv_begin + kv_count)) needs the mask or a bounds check. VARLEN: also when the
// tile's rows span two sequences or its keys leave the rows' sequence. MASK: always (the
// boolean mask is read pair by pair).
fn tile_needs_mask(b: u32, q_begin: u32, q_len: u32, kv_begin: u32, kv_count: u32) -> bool {
    if (MASK() || kv_begin + kv_count > kv_len(b) || kv_begin < kv_start(b)) {
        return true;
    }
    var shift = align_shift(b);
    if (VARLEN()) {
        let s = row_sequence(q_begin);
        let q_last = min(q_begin + q_len, params.seq_q) - 1u;
        let keys_in = params.kv_base + kv_begin >= cu_kv(s)
            && params.kv_base + kv_begin + kv_count <= cu_kv(s + 1u);
        if (row_sequence(q_last) != s || !keys_in) {
            return true;
        }
        shift = band_shift(s);
    }
    let right = (CAUSAL() || WINDOW()) && i32(kv_begin + kv_count - 1u) > i32(q_begin) + band_hi() + shift;
    let left = WINDOW() && i32(kv_begin) < i32(q_begin + q_len - 1u) + params.band_lo + shift;
    return right || left;
}

// ---- Per-head values of the score path, read once per (batch, head) by `begin_head`, which
// every kernel calls before it finishes a score or a row of that head: the ALiBi slope and
// the sink, both scaled into the exp2 domain.
var<private> head_slope2: f32;
var<private> head_sink2: f32;
var<private> head_kv_len: u32;
var<private> head_kv_start: u32;
var<private> head_stream: u32;
var<private> head_blocks: u32;
var<private> head_mask: u32;
var<private> head_bias: u32;
var<private> head_grads: u32;
// with per-batch alignment: the current batch's shift (align_shift)
var<private> head_shift: i32;

fn begin_head(b: u32, h: u32) {
    // for a user's score_mod (its arguments); a dead store elsewhere
    head_b = params.batch_base + b;
    head_h = h;
    if (BLOCKS()) {
        head_blocks = blocks_grid(b, h);
    }
    if (MASK()) {
        head_mask = (params.batch_base + b) * params.mask_b_stride + h * params.mask_h_stride;
    }
    if (BIAS()) {
        head_bias = (params.batch_base + b) * params.bias_b_stride + h * params.bias_h_stride;
    }
    // this head's grid of the kept gradients' scratch (`keep_grad`: for d_bias or d_table)
    head_grads = ((params.batch_base + b) * params.heads_q + h) * params.row_stride
        * params.mask_cols;
    if (DROPOUT()) {
        head_stream = (params.batch_base + b) * params.heads_q + h;
    }
    if (SEQLENS()) {
        head_kv_len = kv_len(b);
        head_kv_start = kv_start(b);
        head_shift = align_shift(b);
    }
    if (ALIBI()) {
        head_slope2 = extra((params.batch_base + b) * params.alibi_b_stride + h) * LOG2E;
    }
    if (SINKS()) {
        head_sink2 = extra(params.sinks_base + h) * LOG2E;
    }
}

// ---- The score path. Every kernel, tiled or naive, forward or backward, decides masking and
// finishes scores through these functions: they are the hooks where window, bias, softcap,
// ALiBi, sinks and dropout enter, once.

// Bounds, the bottom-right aligned causal mask and the window. Non-short-circuit `&` and `|`
// keep this free of branches, so that loops calling it stay simple enough for drivers to
// unroll.
// With SEQLENS, keys outside the batch's range are hidden (`begin_head` read it); with BLOCKS,
// pairs whose block is off; with MASK, pairs whose boolean mask entry is false.
fn visible(i: u32, j: u32) -> bool {
    let in_range = (i < params.seq_q) & (j < select(params.seq_kv, head_kv_len, SEQLENS()))
        & (j >= select(0u, head_kv_start, SEQLENS()));
    var in_sequence = true;
    var shift = select(0, head_shift, SEQLENS());
    if (VARLEN()) {
        let r = row_context(i);
        let jw = params.kv_base + j;
        in_sequence = (jw >= r.kv_lo) & (jw < r.kv_hi);
        shift = r.shift;
    }
    let causal_ok = !CAUSAL() | (i32(j) <= i32(i) + params.causal_offset + shift);
    let band_ok = !WINDOW() | ((i32(j) >= i32(i) + params.band_lo + shift) & (i32(j) <= i32(i) + params.band_hi + shift));
    return in_range & in_sequence & causal_ok & band_ok & block_on(i, j) & pair_on(i, j)
        & mask_mod_on(i, j);
}

// A hidden pair's score: -inf, so that any finite score, however negative, outweighs it.
fn masked_score() -> f32 {
    return neg_inf();
}

// The running max before any key: -inf. The online-softmax functions below guard the
// -inf - -inf = NaN cases, so rows whose keys are all hidden so far stay NaN-free, and rows
// whose every score is finite but hugely negative still get the exact softmax (a finite
// stand-in such as -1e30 would drop them).
fn running_max_start() -> f32 {
    return neg_inf();
}

// The score softmax sees, from x = q.k * scale * log2(e) (scores live in the exp2 domain):
// the score modifiers in turn (`score_chain`, generated from src/modifiers/: the softcap,
// then ALiBi's term and the bias), or masked_score() where the pair is hidden. `check` false
// skips the mask for tiles known to be fully visible (tile_needs_mask), so unmasked tiles pay
// nothing for it. `begin_head` must have run for the row's head.
fn finish_score(x: f32, i: u32, j: u32, check: bool) -> f32 {
    return select(masked_score(), score_chain(x, i, j), !check | visible(i, j));
}

// finish_score for the backward: with d(score)/dx, which dS takes (`pair_grads`).
fn finish_pair(x: f32, i: u32, j: u32, check: bool) -> Finished {
    var f = score_chain_slope(x, i, j);
    f.s = select(masked_score(), f.s, !check | visible(i, j));
    return f;
}

// Online softmax: the running max after a tile whose max is m_tile, and the factor alpha that
// rescales the old row sum and accumulator: m_new = max(m, m_tile), alpha = exp2(m - m_new).
struct OnlineMax {
    m: f32,
    alpha: f32,
}

fn online_max(m_old: f32, m_tile: f32) -> OnlineMax {
    // `max` may drop a NaN score (SwiftShader's does): the running max stays an ordinary
    // number and the NaN reaches the row through its weight (softmax_weight)
    let m = max(m_old, m_tile);
    // nothing seen yet (m_old = -inf): the old sum and accumulator are zero, and the factor is
    // 1 rather than exp2(-inf), which a driver need not make exactly 0
    return OnlineMax(m, select(exp2(m_old - m), 1.0, m_old == neg_inf()));
}

// Unnormalized probability of a finished score against the running max: 0 for a hidden pair,
// also while the running max is still -inf. NaN where s - m is NaN: a NaN score, or a +inf
// one (then m is +inf too), whose row is NaN in exact softmax. The NaN is made here on the
// bits, since exp2(NaN) is not promised NaN (SwiftShader's is finite); the row sum then
// carries it to finish_lse and row_normalizer, which test it on the bits.
fn softmax_weight(s: f32, m: f32) -> f32 {
    let x = s - m;
    return select(select(exp2(x), nan_value(), is_nan(x)), 0.0, s == neg_inf());
}

// A windowed forward's later pass (params.resume) continues each row from what the earlier
// passes stored: its normalized out and its lse. With the running max set to the lse (exp2
// domain) the row sum is exactly 1 and the accumulator is out itself, so the merge is exact.
// A row that has seen no key yet (lse = -inf) starts empty; a NaN lse stays NaN.
struct Resumed {
    m: f32,
    l: f32,
}

fn resumed_row(lse: f32) -> Resumed {
    if (is_nan(lse)) {
        // in the sum, where the bit tests look, not in the running max, which `max` may drop
        return Resumed(running_max_start(), nan_value());
    }
    if (lse == neg_inf()) {
        return Resumed(running_max_start(), 0.0);
    }
    return Resumed(lse * LOG2E, 1.0);
}

// Natural-log LSE from the exp2-domain running max and the row sum: -inf for a row that sees
// no key, NaN for a row that sees a NaN (its sum is NaN), never -inf for it.
// With a sink (sink_on), the sink's exp joins the sum: lse = ln(sum_j exp(s_j) + exp(sink)),
// and a row that sees no key gets the sink's lse.
fn finish_lse(m: f32, l: f32) -> f32 {
    if (is_nan(l)) {
        return nan_value();
    }
    if (sink_on()) {
        if (l > 0.0) {
            let top = max(m, head_sink2);
            return (top + log2(l * exp2(m - top) + exp2(head_sink2 - top))) * LN2;
        }
        return head_sink2 * LN2;
    }
    return keys_lse(m, l);
}

// finish_lse over the keys alone, without a sink: what a part of a row's keys gives (a split
// of the decode kernel), the sink joining when the parts merge (merge_fold).
fn keys_lse(m: f32, l: f32) -> f32 {
    if (is_nan(l)) {
        return nan_value();
    }
    if (l > 0.0) {
        return (m + log2(l)) * LN2;
    }
    return neg_inf();
}

// ---- Merging partial results over disjoint sets of keys (merge.wgsl, flash_decode_combine):
// a row's lse and one element of its out from two key sets, folded into those over both,
// exactly: lse = log(exp(la) + exp(lb)), x = exp(la - lse) xa + exp(lb - lse) xb. A side that
// saw no key (lse -inf) adds nothing; both: (-inf, 0). A NaN lse (a row that saw a NaN) makes
// the row NaN (max may drop a NaN operand, so it is tested first). A sink merges as a side of
// lse = sink and out 0.
struct Merged {
    lse: f32,
    x: f32,
}

fn merge_fold(la: f32, xa: f32, lb: f32, xb: f32) -> Merged {
    if (is_nan(la) || is_nan(lb)) {
        return Merged(nan_value(), nan_value());
    }
    let m = max(la, lb);
    if (m == neg_inf()) {
        return Merged(m, 0.0);
    }
    // one of the two weights is 1, so their sum lies in [1, 2]: no overflow, no 0 / 0
    let wa = exp(la - m);
    let wb = exp(lb - m);
    let s = wa + wb;
    return Merged(m + log(s), (wa * xa + wb * xb) / s);
}

// The factor that normalizes a row's accumulator (running max m, row sum l): 1 / l; 0 for a
// row that sees no key (its accumulator is 0), NaN for a row whose sum is NaN, so that the
// NaN reaches every output element. With a sink (sink_on) the sink's weight, exp2(sink - m)
// in the accumulator's units, joins the sum (it carries no value).
fn row_normalizer(m: f32, l: f32) -> f32 {
    if (sink_on() && l > 0.0) {
        return 1.0 / (l + exp2(head_sink2 - m));
    }
    if (is_nan(l)) {
        return nan_value();
    }
    return select(0.0, 1.0 / l, l > 0.0);
}

// acc + w * x, skipped when `guard` is set and the weight w is exactly 0. A hidden pair's
// weight (P, or dS = P * ...) is exactly 0, and 0 * NaN or 0 * Inf would carry a value the row
// never sees into it; a visible NaN still propagates (its weight is NaN, or x is NaN with
// w != 0). Every P V, P^T dO, dS K and dS^T Q product goes through this. Tiled kernels pass
// the tile's `masked` flag: tiles without hidden in-range pairs (out-of-range rows and keys are
// loaded as 0) skip the compare and select, which cost the backward 2x on lavapipe when applied
// to every product (docs/PERFORMANCE.md). The naive kernels have no tiles and pass `true`: any
// pair may be hidden, by any mask (padding, key lengths, a window, a boolean, block or user
// mask, not only causal).
fn add_weighted(acc: f32, w: f32, x: f32, guard: bool) -> f32 {
    // `w == 0.0` rather than `w != 0.0`: compilers may lower `!=` to an ordered compare,
    // false for a NaN weight, which would drop the NaN
    return select(fma(w, x, acc), acc, guard & (w == 0.0));
}

// add_weighted for a vec4 of values sharing one weight.
fn add_weighted4(acc: vec4<f32>, w: f32, x: vec4<f32>, guard: bool) -> vec4<f32> {
    return select(fma(vec4<f32>(w), x, acc), acc, guard & (w == 0.0));
}

// Backward: P recomputed from a finished score and the row's lse in the exp2 domain.
// A hidden pair gets exactly 0, also for a row whose lse is NaN (it saw a NaN). P <= 1 holds
// exactly (s <= lse), but for huge scores (|s| ~ 1e19) the f32 rounding of lse can put s - lse2
// far above 0, and exp2 of it at infinity: such a P is 1. A NaN x (a NaN score,
// or the lse of a row that saw one) gives NaN, made on the bits as in softmax_weight.
fn recompute_p(s: f32, lse2: f32) -> f32 {
    let x = s - lse2;
    let p = select(select(exp2(x), 1.0, x > 0.0), nan_value(), is_nan(x));
    return select(p, 0.0, s == neg_inf());
}

// Backward: P * (dP - delta), the gradient at the finished score (delta = rowsum(dO * O)), which
// is the bias's gradient. A hidden pair (P exactly 0) gets exactly 0, whatever dP holds
// (dP = dO . v sees the pair's v).
fn finished_grad(p: f32, dp: f32, delta: f32) -> f32 {
    return select(p * (dp - delta), 0.0, p == 0.0);
}

// Backward: dS, the gradient at the scaled score q.k * scale, from g = finished_grad and
// d(score)/dx (`Finished::slope`: the softcap's, 1 without a score transform).
fn through_score(g: f32, p: f32, slope: f32) -> f32 {
    // a hidden pair's slope may be NaN (an -inf score), which would turn its 0 into NaN
    return select(g * slope, 0.0, p == 0.0);
}

// Backward, one pair from its finished score and slope (`finish_pair`), the row's lse (exp2
// domain), dP = dO . v and delta: the weight of the row's dO in dV (P, times the dropout factor Z) and dS, whose dP
// takes Z too (out used P Z). Every tiled backward kernel goes through this; the dQ kernels
// of a call that asks for d_bias or d_table also keep the gradient at the finished score
// (and for d_table the score score_mod took) there
// (`keep_grad`, from the generated prelude; nothing elsewhere).
struct PairGrads {
    pz: f32,
    ds: f32,
}

fn pair_grads(f: Finished, lse2: f32, dp: f32, delta: f32, i: u32, j: u32) -> PairGrads {
    let p = recompute_p(f.s, lse2);
    let z = dropout_scale(i, j);
    let g = finished_grad(p, dp * z, delta);
    keep_grad(i, j, g, f.pre);
    return PairGrads(p * z, through_score(g, p, f.slope));
}

fn pos_inf() -> f32 {
    return bitcast<f32>(runtime_bits(0x7f800000u));
}

// lse (natural log) to the exp2 domain. A row that sees no key (lse = -inf) becomes +inf so
// that exp2(s - lse2) is exactly 0 for it, never NaN.
fn lse_to_log2(x: f32) -> f32 {
    return select(x * LOG2E, pos_inf(), x == neg_inf());
}

// ---- Element conversions for half-precision storage. Loads are exact; stores round once, to
// nearest even, in integer arithmetic, so every adapter rounds alike.

// bf16 element `half` (0 low, 1 high) of a packed word, as f32: bf16 is the top 16 bits of f32.
fn bf16_word_to_f32(w: u32, half: u32) -> f32 {
    return bitcast<f32>(select(w << 16u, w & 0xffff0000u, half == 1u));
}

// f32 to bf16 bits (low 16 bits of the result), round to nearest even; NaN stays NaN.
fn f32_to_bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// f32 to IEEE binary16 bits (low 16 bits of the result), round to nearest even: overflow gives
// inf, tiny values give subnormals or zero, NaN stays NaN.
fn f32_to_f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    // 65520 = 65504 + half an ulp rounds (to even) up to infinity
    if (a >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    // normal binary16 range (>= 2^-14): rebias the exponent, round at bit 13
    if (a >= 0x38800000u) {
        let r = a - 0x38000000u;
        return sign | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
    }
    // below 2^-25 (and exactly 2^-25, a tie with 0) rounds to zero
    if (a <= 0x33000000u) {
        return sign;
    }
    // subnormal: the value in units of 2^-24 is m * 2^(e - 126) with e the f32 exponent
    let e = a >> 23u;
    let m = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - e;
    var q = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u) == 1u)) {
        q += 1u;
    }
    return sign | q;
}
