// FlashAttention backward, dQ, "blocks" variant: register micro-tiles for GPUs.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of NT = NTY x NTX threads, folded.
// Threads: (ty, tx) as in blocks.wgsl: TM query rows x TN keys of each score tile, and TM rows
//          x GPT vec4 groups of dQ, in registers.
// Loop:    Q_i and dO_i stay in workgroup memory while K/V tiles stream through; with CAUSAL
//          tiles wholly above the diagonal are never visited.
// Math:    S = Q K^T and dP = dO V^T (dot_tile), P = exp2(s - lse2), dS = P * (dP - delta) to
//          workgroup memory, dQ += dS K (weighted_rows); dQ is scaled once at the end.
// Memory:  Q [BR][RS], dO [BR][RSV] resident; K [BC][RS], V [BC][RSV]; dS [BR][WS] (vec4
//          units): dO and V rows HEAD_DIM_V wide (blocks.wgsl).
// No atomics: each workgroup owns its dQ rows.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const OQ: u32 = 0u;
const ODO: u32 = OQ + BR * RS;
const OK: u32 = ODO + BR * RSV;
const OV: u32 = OK + BC * RS;
const ODS: u32 = OV + BC * RSV;
var<workgroup> sm: array<vec4<f32>, ODS + BR * WS>;

// a trainable tensor's gradient folds through sm once the key loop is done (table_flush,
// from the generated prelude): a value a vec4, each stored whole (no invocation writes a
// part of a vector another one writes)
const FOLD_WORDS: u32 = ODS + BR * WS;
fn fold_store(k: u32, x: f32) {
    sm[k] = vec4<f32>(x);
}
fn fold_load(k: u32) -> f32 {
    return sm[k].x;
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
    let b = tile.b;
    let h = tile.h;
    let hk = tile.hk;
    let q0 = tile.q0;
    begin_head(b, h);
    let ty = t / NTX;
    let tx = t % NTX;

    stage_q_dout(OQ, ODO, b, h, q0, t, params.scale_log2);
    var lse2 = array<f32, TM>();
    var dl = array<f32, TM>();
    for (var i = 0u; i < TM; i++) {
        let qi = q0 + ty * TM + i;
        lse2[i] = pos_inf();
        if (qi < params.seq_q) {
            let pair = lse_delta[pair_index(b, h, qi)];
            lse2[i] = pair.x;
            dl[i] = pair.y;
        }
    }

    var acc = array<array<vec4<f32>, GPT>, TM>();
    let kv_end = kv_end_for_rows(b, q0, q0 + BR);
    for (var kv0 = (kv_begin_for_rows(b, q0) / BC) * BC; kv0 < kv_end; kv0 += BC) {
        let visit = tile_visit(b, h, q0, BR, kv0, BC);
        if (visit.skip) {
            continue;
        }
        let masked = visit.masked;
        workgroupBarrier(); // the previous tile's dS K is done with K and dS
        stage_kv(OK, OV, b, hk, kv0, BC, t, 1.0);
        workgroupBarrier();

        var ds = dot_tile(OQ, OK, ty, tx);
        let dp = dot_tile_v(ODO, OV, ty, tx);
        for (var i = 0u; i < TM; i++) {
            for (var j = 0u; j < TN; j++) {
                let sc = finish_pair(ds[i][j], q0 + ty * TM + i, kv0 + tx + j * NTX, masked);
                ds[i][j] = pair_grads(sc, lse2[i], dp[i][j], dl[i], q0 + ty * TM + i, kv0 + tx + j * NTX).ds;
            }
        }
        store_weights(ODS, ds, ty, tx);
        workgroupBarrier();

        // summed apart, then folded in (f32 error on long rows)
        var dq = array<array<vec4<f32>, GPT>, TM>();
        weighted_rows(&dq, ODS, OK, ty, tx, masked);
        for (var i = 0u; i < TM; i++) {
            for (var k = 0u; k < GPT; k++) {
                acc[i][k] += dq[i][k];
            }
        }
    }

    for (var i = 0u; i < TM; i++) {
        let qi = q0 + ty * TM + i;
        if (qi < params.seq_q) {
            let base = q_index(b, qi, h, 0u);
            for (var k = 0u; k < GPT; k++) {
                let g = tx + k * NTX;
                for (var c = 0u; c < 4u; c++) {
                    let d = 4u * g + c;
                    if (g < D4 && d < HEAD_DIM) {
                        store_dq(base + d, acc[i][k][c] * params.scale);
                    }
                }
            }
        }
    }
    table_flush(wg, t);
}
