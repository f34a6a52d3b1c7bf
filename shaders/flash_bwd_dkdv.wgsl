// FlashAttention backward, dK and dV: one workgroup per (batch, kv head, tile of BC keys).
//
// Grid:    n_kv_tiles * heads_kv * batch workgroups, folded.
// Threads: BC keys x TPR lanes. Lane j of key c owns query columns j, j+TPR, ... of each Q
//          tile and the dK/dV dims j, j+TPR, ...
// Loop:    K_j and V_j stay in workgroup memory while the workgroup walks every query head of
//          its GQA group and, for each, the Q tiles that can see these keys (with CAUSAL the
//          tiles wholly above the diagonal are skipped).
// Math:    P = exp2(s - lse2) recomputed from Q, K and the saved lse (s = scale log2(e) q.k),
//          dP = dO V^T, dS = P * (dP - delta),
//          dV += P^T dO, dK += scale * dS^T Q.
// No atomics: each workgroup owns its dK/dV rows, so results are bit-identical run to run.
// Bindings: 8 storage buffers, exactly the WebGPU default per-stage cap.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const SK: u32 = 0u;                       // K tile [BC][HEAD_DIM], resident
const SV: u32 = SK + BC * HEAD_DIM;       // V tile [BC][HEAD_DIM], resident
const SQ: u32 = SV + BC * HEAD_DIM;       // Q tile [BR][HEAD_DIM]
const SDO: u32 = SQ + BR * HEAD_DIM;      // dO tile [BR][HEAD_DIM]
const SP: u32 = SDO + BR * HEAD_DIM;      // P [BC][BR]
const SDS: u32 = SP + BC * BR;            // dS [BC][BR]
const SLSE: u32 = SDS + BC * BR;          // lse of the Q tile, exp2 domain [BR]
const SDELTA: u32 = SLSE + BR;            // delta of the Q tile [BR]
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
    let tile = kv_tile_of(wg, BC);
    let b = tile.b;
    let hk = tile.hk;
    let kv0 = tile.kv0;
    let c = t / TPR;
    let j = t % TPR;
    let key = kv0 + c;

    // K and V stay in workgroup memory throughout
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

    var acc_dk = array<f32, DPT>();
    var acc_dv = array<f32, DPT>();
    var p = array<f32, CPT>();
    var ds = array<f32, CPT>();
    let q_start = (q_begin_for_key(kv0) / BR) * BR;
    let q_stop = q_end_for_keys(b, kv0, kv0 + BC - 1u);

    for (var g = 0u; g < params.group; g++) {
        let h = hk * params.group + g;
        begin_head(b, h);
        for (var q0 = q_start; q0 < q_stop; q0 += BR) {
            let visit = tile_visit(b, h, q0, BR, kv0, BC);
            if (visit.skip) {
                continue;
            }
            let masked = q0 + BR > params.seq_q || visit.masked;
            for (var e = t; e < BR * HEAD_DIM; e += NT) {
                let qi = q0 + e / HEAD_DIM;
                var qx = 0.0;
                var dox = 0.0;
                if (qi < params.seq_q) {
                    let g2_q = q_at(b, qi, h, e % HEAD_DIM);
                    let g2_do = dout_at(b, qi, h, e % HEAD_DIM);
                    qx = load_q(g2_q);
                    dox = load_d_out(g2_do);
                }
                smem[SQ + e] = qx;
                smem[SDO + e] = dox;
            }
            for (var r = t; r < BR; r += NT) {
                let qi = q0 + r;
                var l2 = pos_inf();
                var dl = 0.0;
                if (qi < params.seq_q) {
                    let pair = lse_delta[pair_index(b, h, qi)];
                    l2 = pair.x;
                    dl = pair.y;
                }
                smem[SLSE + r] = l2;
                smem[SDELTA + r] = dl;
            }
            workgroupBarrier();

            for (var rr = 0u; rr < CPT; rr++) {
                p[rr] = 0.0;
                ds[rr] = 0.0;
            }
            for (var d = 0u; d < HEAD_DIM; d++) {
                let kd = smem[SK + c * HEAD_DIM + d];
                let vd = smem[SV + c * HEAD_DIM + d];
                for (var rr = 0u; rr < CPT; rr++) {
                    let r = min(j + rr * TPR, BR - 1u);
                    p[rr] = fma(kd, smem[SQ + r * HEAD_DIM + d], p[rr]);
                    ds[rr] = fma(vd, smem[SDO + r * HEAD_DIM + d], ds[rr]);
                }
            }
            for (var rr = 0u; rr < CPT; rr++) {
                let r = j + rr * TPR;
                if (r < BR) {
                    let sc = finish_score(p[rr] * params.scale_log2, q0 + r, key, masked);
                    let g = pair_grads(sc, smem[SLSE + r], ds[rr], smem[SDELTA + r], q0 + r, key);
                    smem[SP + c * BR + r] = g.pz;
                    smem[SDS + c * BR + r] = g.ds;
                }
            }
            workgroupBarrier();

            // summed apart, then folded in (f32 error on long columns)
            var dk_tile = array<f32, DPT>();
            var dv_tile = array<f32, DPT>();
            for (var r = 0u; r < BR; r++) {
                let pr = smem[SP + c * BR + r];
                let dsr = smem[SDS + c * BR + r];
                for (var dd = 0u; dd < DPT; dd++) {
                    let d = min(j + dd * TPR, HEAD_DIM - 1u);
                    dv_tile[dd] = add_weighted(dv_tile[dd], pr, smem[SDO + r * HEAD_DIM + d], masked);
                    dk_tile[dd] = add_weighted(dk_tile[dd], dsr, smem[SQ + r * HEAD_DIM + d], masked);
                }
            }
            for (var dd = 0u; dd < DPT; dd++) {
                acc_dv[dd] += dv_tile[dd];
                acc_dk[dd] += dk_tile[dd];
            }
            workgroupBarrier();
        }
    }

    if (key < params.seq_kv) {
        for (var dd = 0u; dd < DPT; dd++) {
            let d = j + dd * TPR;
            if (d < HEAD_DIM) {
                let o = kv_index(b, key, hk, d);
                store_dk(o, acc_dk[dd] * params.scale);
                store_dv(o, acc_dv[dd]);
            }
        }
    }
}
