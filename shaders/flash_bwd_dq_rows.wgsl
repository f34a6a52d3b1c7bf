// FlashAttention backward, dQ, "rows" variant: each invocation owns RPT query rows.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of BR / RPT invocations, folded.
// Threads: invocation t owns query rows q0 + t + rr * NT (rr < RPT): q (pre-scaled), dO and
//          the dQ accumulators live in private arrays; K/V tiles in workgroup memory are read
//          SG TileVecs at a time and shared across the subgroup with `lane_values` (see
//          flash_fwd_rows.wgsl); each element read serves RPT rows.
// Loop:    over K/V tiles of BC keys; with CAUSAL, tiles above the diagonal are skipped.
// Math:    P = exp2(s - lse2), dP = dO V^T, dS = P * (dP - delta), dQ += scale * dS K.
// No atomics: each workgroup owns its dQ rows.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

var<workgroup> sk: array<TileVec, BC * DPAD_V>;
var<workgroup> sv: array<TileVec, BC * DPAD_V>;

// per invocation: its rows' q (pre-scaled), dO, lse (exp2 domain) and delta, and the tile's
// dQ sums
var<private> qr: array<array<f32, DPAD>, RPT>;
var<private> dor: array<array<f32, DPAD>, RPT>;
var<private> lse2: array<f32, RPT>;
var<private> delta_i: array<f32, RPT>;
var<private> dq_tile: array<array<f32, DPAD>, RPT>;
// the lane's elements of the current key's k, read by the generated `dots_rows` and kept for
// `add_dq_rows` (src/kernels/rows.rs)
var<private> kc: array<TileVec, DPAD_V / SG>;

// a trainable tensor's gradient folds through sk once the key loop is done (table_flush,
// from the generated prelude): a value a TileVec, each stored whole (no invocation writes a
// part of a vector another one writes)
const FOLD_WORDS: u32 = BC * DPAD_V;
fn fold_store(k: u32, x: f32) {
    sk[k] = TileVec(x);
}
fn fold_load(k: u32) -> f32 {
    return tile_first(sk[k]);
}

// One K/V tile against this invocation's rows: for each of the tile's keys, the scores and dP
// (q . k and dO . v), dS, then dQ_tile += dS k. Each lane reads one TileVec of the key's k and
// v chunk (`sk`/`sv` reads are per-lane loads, the costly part on CPU drivers) and keeps the k
// TileVec for the fold, so k is read from workgroup memory once, not once for the dots and
// again for the fold. The tile sums are summed apart (f32 error on long rows). `guard` (the
// tile has hidden pairs) is a constant at each call site, so the unmasked tiles' fold is
// plain FMAs.
fn visit_tile(guard: bool, lane: u32, row0: u32, kv0: u32) {
    for (var rr = 0u; rr < RPT; rr++) {
        for (var d0 = 0u; d0 < DPAD; d0 += SG) {
            for (var l = 0u; l < SG; l++) {
                dq_tile[rr][d0 + l] = 0.0;
            }
        }
    }
    for (var c = 0u; c < BC; c++) {
        let x = dots_rows(c, lane);
        var dsc = array<f32, RPT>();
        for (var rr = 0u; rr < RPT; rr++) {
            let sc = finish_pair(x[rr], row0 + rr * NT, kv0 + c, guard);
            dsc[rr] = pair_grads(sc, lse2[rr], x[RPT + rr], delta_i[rr], row0 + rr * NT, kv0 + c).ds;
        }
        add_dq_rows(dsc, guard);
    }
}

@compute @workgroup_size(NT)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= params.total_wg) {
        return;
    }
    let tile = q_tile_of(wg, BR);
    let b = pinned(tile.b, 0u);
    let h = pinned(tile.h, 1u);
    let hk = pinned(tile.hk, 2u);
    let q0 = pinned(tile.q0, 3u);
    begin_head(b, h);
    let lane = t % SG;

    for (var rr = 0u; rr < RPT; rr++) {
        let i = q0 + t + rr * NT;
        for (var d0 = 0u; d0 < DPAD; d0 += SG) {
            for (var l = 0u; l < SG; l++) {
                qr[rr][d0 + l] = 0.0;
                dor[rr][d0 + l] = 0.0;
            }
        }
        delta_i[rr] = 0.0;
        lse2[rr] = pos_inf(); // rows past seq_q get P = 0
        if (i < params.seq_q) {
            let base_q = q_at(b, i, h, 0u);
            let base_do = dout_at(b, i, h, 0u);
            for (var d = 0u; d < row_dims(); d++) {
                qr[rr][d] = load_q(base_q + d) * params.scale_log2;
                dor[rr][d] = load_d_out(base_do + d);
            }
            let pair = lse_delta[pair_index(b, h, i)];
            lse2[rr] = pair.x;
            delta_i[rr] = pair.y;
        }
    }
    var acc = array<array<f32, DPAD>, RPT>();

    let kv_end = kv_end_for_rows(b, q0, q0 + BR);
    for (var kv0 = (kv_begin_for_rows(b, q0) / BC) * BC; kv0 < kv_end; kv0 += BC) {
        let visit = tile_visit(b, h, q0, BR, kv0, BC);
        if (visit.skip) {
            continue;
        }
        let masked = visit.masked;
        workgroupBarrier();
        stage_kv(b, hk, kv0, t);
        workgroupBarrier();

        if (masked) {
            visit_tile(true, lane, q0 + t, kv0);
        } else {
            visit_tile(false, lane, q0 + t, kv0);
        }
        for (var rr = 0u; rr < RPT; rr++) {
            for (var d0 = 0u; d0 < DPAD; d0 += SG) {
                for (var l = 0u; l < SG; l++) {
                    acc[rr][d0 + l] += dq_tile[rr][d0 + l];
                }
            }
        }
    }

    for (var rr = 0u; rr < RPT; rr++) {
        let i = q0 + t + rr * NT;
        if (i < params.seq_q) {
            let base = q_index(b, i, h, 0u);
            for (var d = 0u; d < row_dims(); d++) {
                store_dq(base + d, acc[rr][d] * params.scale);
            }
        }
    }
    table_flush(wg, t);
}
