// FlashAttention backward, dQ, "coop" variant: the three products on cooperative matrices
// (coop.wgsl). f16 tensors only; dS is rounded to f16 once for the dS K product.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of NT = 128 invocations, folded.
// Threads: products by subgroup; dS and the dQ fold scalar: invocation t owns row t / TPR, and
//          of it score columns and head dims t % TPR + k * TPR.
// Loop:    Q_i and dO_i stay in workgroup memory while K/V tiles stream through; with CAUSAL
//          tiles wholly above the diagonal are never visited. Per tile: S = Q K^T and
//          dP = dO V^T (f32 to fs), P = exp2(s - lse2) and dS = P * (dP - delta) (scalar, to hs
//          as f16), dQ_tile = dS K folded into each row's registers (guarded_row in tiles with
//          hidden pairs); dQ is scaled once at the end.
// Memory:  hs: Q, dO [BR][DP], K, V [BC][DP], dS [BR][BC] (f16); fs: S, dP [BR][BC], then
//          dQ_tile [BR][DP] (f32).
// No atomics: each workgroup owns its dQ rows. Padding workgroups run no tile (uniform
// control flow for the cooperative operations).
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const CPR: u32 = BC / TPR;          // score columns per invocation
const OQ: u32 = 0u;
const ODO: u32 = OQ + BR * DP;
const OK: u32 = ODO + BR * DP;
const OV: u32 = OK + BC * DP;
const ODS: u32 = OV + BC * DP;
const FDP: u32 = BR * BC;           // dP in fs, after S
var<workgroup> hs: array<f16, ODS + BR * BC>;
var<workgroup> fs: array<f32, BR * max(2u * BC, DP)>;

// a trainable tensor's gradient folds through fs's words once the key loop is done
// (table_flush, from the generated prelude)
const FOLD_WORDS: u32 = BR * max(2u * BC, DP);
fn fold_store(k: u32, x: f32) {
    fs[k] = x;
}
fn fold_load(k: u32) -> f32 {
    return fs[k];
}

@compute @workgroup_size(NT)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let live = linear_workgroup(wid, nwg) < params.total_wg;
    let tile = q_tile_of(min(linear_workgroup(wid, nwg), params.total_wg - 1u), BR);
    let b = tile.b;
    let h = tile.h;
    let hk = tile.hk;
    let q0 = tile.q0;
    begin_head(b, h);
    let r = t / TPR;
    let part = t % TPR;
    let i = q0 + r;

    for (var e = t; e < BR * DP; e += NT) {
        let qi = q0 + e / DP;
        let d = e % DP;
        var qx = 0.0;
        var dox = 0.0;
        if (qi < params.seq_q && d < HEAD_DIM) {
            let g_q = q_at(b, qi, h, d);
            let g_do = dout_at(b, qi, h, d);
            qx = load_q(g_q);
            dox = load_d_out(g_do);
        }
        hs[OQ + e] = f16(qx);
        hs[ODO + e] = f16(dox);
    }
    var lse2 = pos_inf();
    var dl = 0.0;
    if (live && i < params.seq_q) {
        let pair = lse_delta[pair_index(b, h, i)];
        lse2 = pair.x;
        dl = pair.y;
    }

    var acc = array<f32, DPR>();
    let kv_end = select(0u, kv_end_for_rows(b, q0, q0 + BR), live);
    for (var kv0 = (kv_begin_for_rows(b, q0) / BC) * BC; kv0 < kv_end; kv0 += BC) {
        let visit = tile_visit(b, h, q0, BR, kv0, BC);
        if (visit.skip) {
            continue;
        }
        let masked = visit.masked;
        workgroupBarrier(); // the previous tile is done with K, V, dS and fs
        stage_kv(OK, OV, b, hk, kv0, BC, t);
        workgroupBarrier();
        coop_nt(OQ, DP, OK, DP, DP, BR / CF, BC / CF, 0u, BC, sg, nsg);
        coop_nt(ODO, DP, OV, DP, DP, BR / CF, BC / CF, FDP, BC, sg, nsg);
        workgroupBarrier();

        for (var k = 0u; k < CPR; k++) {
            let c = part + k * TPR;
            let sc = finish_pair(fs[r * BC + c] * params.scale_log2, i, kv0 + c, masked);
            hs[ODS + r * BC + c] = f16(pair_grads(sc, lse2, fs[FDP + r * BC + c], dl, i, kv0 + c).ds);
        }
        workgroupBarrier(); // dS is in; S and dP are dead

        coop_nn(ODS, BC, OK, DP, BC, BR / CF, DP / CF, 0u, DP, sg, nsg);
        workgroupBarrier();
        // summed apart, then folded in (f32 error on long rows)
        var dq = product_row(0u, r, part);
        if (masked) {
            dq = guarded_row(ODS, BC, OK, rows_in(kv0, BC, params.seq_kv), r, part);
        }
        for (var k = 0u; k < DPR; k++) {
            acc[k] += dq[k];
        }
    }

    if (live && i < params.seq_q) {
        for (var k = 0u; k < DPR; k++) {
            let d = part + k * TPR;
            if (d < HEAD_DIM) {
                store_dq(q_index(b, i, h, d), acc[k] * params.scale);
            }
        }
    }
    table_flush(linear_workgroup(wid, nwg), t);
}
