// FlashAttention backward, dQ: one workgroup per (batch, query head, tile of BR rows).
//
// Grid:    n_q_tiles * heads_q * batch workgroups, folded.
// Threads: BR rows x TPR lanes; lane j of row r owns key columns j, j+TPR, ... of each K/V
//          tile and the dQ dims j, j+TPR, ...
// Loop:    Q_i and dO_i stay in workgroup memory while K/V tiles stream through; with CAUSAL
//          tiles wholly above the diagonal are never visited.
// Math:    P = exp2(s - lse2), dP = dO V^T, dS = P * (dP - delta), dQ += scale * dS K.
// No atomics: each workgroup owns its dQ rows.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const SQ: u32 = 0u;                       // Q tile [BR][HEAD_DIM], resident
const SDO: u32 = SQ + BR * HEAD_DIM;      // dO tile [BR][HEAD_DIM], resident
const SK: u32 = SDO + BR * HEAD_DIM;      // K tile [BC][HEAD_DIM]
const SV: u32 = SK + BC * HEAD_DIM;       // V tile [BC][HEAD_DIM]
const SDS: u32 = SV + BC * HEAD_DIM;      // dS [BR][BC]
const SLSE: u32 = SDS + BR * BC;          // lse, exp2 domain [BR]
const SDELTA: u32 = SLSE + BR;            // delta [BR]
var<workgroup> smem: array<f32, SDELTA + BR>;

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
    let r = t / TPR;
    let j = t % TPR;
    let i = q0 + r;

    for (var e = t; e < BR * HEAD_DIM; e += NT) {
        let qi = q0 + e / HEAD_DIM;
        var qx = 0.0;
        var dox = 0.0;
        if (qi < params.seq_q) {
            let g_q = q_at(b, qi, h, e % HEAD_DIM);
            let g_do = dout_at(b, qi, h, e % HEAD_DIM);
            qx = load_q(g_q);
            dox = load_d_out(g_do);
        }
        smem[SQ + e] = qx;
        smem[SDO + e] = dox;
    }
    for (var rr = t; rr < BR; rr += NT) {
        let qi = q0 + rr;
        var l2 = pos_inf();
        var dl = 0.0;
        if (qi < params.seq_q) {
            let pair = lse_delta[pair_index(b, h, qi)];
            l2 = pair.x;
            dl = pair.y;
        }
        smem[SLSE + rr] = l2;
        smem[SDELTA + rr] = dl;
    }

    var acc = array<f32, DPT>();
    var p = array<f32, CPT>();
    var dp = array<f32, CPT>();
    let kv_end = kv_end_for_rows(b, q0, q0 + BR);
    for (var kv0 = (kv_begin_for_rows(q0) / BC) * BC; kv0 < kv_end; kv0 += BC) {
        let visit = tile_visit(b, h, q0, BR, kv0, BC);
        if (visit.skip) {
            continue;
        }
        let masked = visit.masked;
        for (var e = t; e < BC * HEAD_DIM; e += NT) {
            let jj = kv0 + e / HEAD_DIM;
            var kx = 0.0;
            var vx = 0.0;
            if (jj < params.seq_kv) {
                let g_k = k_at(b, jj, hk, e % HEAD_DIM);
                let g_v = v_at(b, jj, hk, e % HEAD_DIM);
                kx = load_k(g_k);
                vx = load_v(g_v);
            }
            smem[SK + e] = kx;
            smem[SV + e] = vx;
        }
        workgroupBarrier();

        for (var cc = 0u; cc < CPT; cc++) {
            p[cc] = 0.0;
            dp[cc] = 0.0;
        }
        for (var d = 0u; d < HEAD_DIM; d++) {
            let qd = smem[SQ + r * HEAD_DIM + d];
            let dod = smem[SDO + r * HEAD_DIM + d];
            for (var cc = 0u; cc < CPT; cc++) {
                let c = min(j + cc * TPR, BC - 1u);
                p[cc] = fma(qd, smem[SK + c * HEAD_DIM + d], p[cc]);
                dp[cc] = fma(dod, smem[SV + c * HEAD_DIM + d], dp[cc]);
            }
        }
        for (var cc = 0u; cc < CPT; cc++) {
            let c = j + cc * TPR;
            if (c < BC) {
                let sc = finish_score(p[cc] * params.scale_log2, i, kv0 + c, masked);
                smem[SDS + r * BC + c] = pair_grads(sc, smem[SLSE + r], dp[cc], smem[SDELTA + r], i, kv0 + c).ds;
            }
        }
        workgroupBarrier();

        var dq_tile = array<f32, DPT>(); // summed apart, then folded in (f32 error on long rows)
        for (var c = 0u; c < BC; c++) {
            let dsc = smem[SDS + r * BC + c];
            for (var dd = 0u; dd < DPT; dd++) {
                let d = min(j + dd * TPR, HEAD_DIM - 1u);
                dq_tile[dd] = add_weighted(dq_tile[dd], dsc, smem[SK + c * HEAD_DIM + d], masked);
            }
        }
        for (var dd = 0u; dd < DPT; dd++) {
            acc[dd] += dq_tile[dd];
        }
        workgroupBarrier();
    }

    if (i < params.seq_q) {
        for (var dd = 0u; dd < DPT; dd++) {
            let d = j + dd * TPR;
            if (d < HEAD_DIM) {
                store_dq(q_index(b, i, h, d), acc[dd] * params.scale);
            }
        }
    }
}
