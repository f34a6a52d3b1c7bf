// FlashAttention backward, dK and dV, "blocks" variant: register micro-tiles for GPUs.
//
// Grid:    n_kv_tiles * heads_kv * batch workgroups of NT = NTY x NTX threads, folded.
// Threads: (ty, tx) as in blocks.wgsl, with keys as the resident rows: TM keys x TN queries of
//          each transposed score tile, and TM keys x GPT vec4 groups of dK and of dV, in
//          registers.
// Loop:    K_j and V_j stay in workgroup memory while the workgroup walks every query head of
//          its GQA group and, for each, the Q tiles that can see these keys (with CAUSAL the
//          tiles wholly above the diagonal are skipped).
// Math:    S^T = K Q^T and dP^T = V dO^T (dot_tile), P^T = exp2(s - lse2),
//          dS^T = P^T * (dP^T - delta) to workgroup memory,
//          dV += P^T dO, dK += dS^T Q (weighted_rows); dK is scaled once at the end.
// Memory:  K [BC][RS], V [BC][RSV] resident; Q [BR][RS], dO [BR][RSV]; P^T, dS^T [BC][WS]
//          (vec4 units): V, dO and dV rows HEAD_DIM_V wide (blocks.wgsl).
// No atomics: each workgroup owns its dK/dV rows, so results are bit-identical run to run.
// Bindings: 8 storage buffers, exactly the WebGPU default per-stage cap.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const OK: u32 = 0u;
const OV: u32 = OK + BC * RS;
const OQ: u32 = OV + BC * RSV;
const ODO: u32 = OQ + BR * RS;
const OP: u32 = ODO + BR * RSV;
const ODS: u32 = OP + BC * WS;
var<workgroup> sm: array<vec4<f32>, ODS + BC * WS>;

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
    let ty = t / NTX;
    let tx = t % NTX;

    // K (scaled into the exp2 domain) and V stay in workgroup memory throughout
    stage_kv(OK, OV, b, hk, kv0, BC, t, params.scale_log2);

    var acc_dk = array<array<vec4<f32>, GPT>, TM>();
    var acc_dv = array<array<vec4<f32>, GPTV>, TM>();
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
            workgroupBarrier(); // the previous tile's products are done with Q, dO, P and dS
            stage_q_dout(OQ, ODO, b, h, q0, t, 1.0);
            // this thread's queries' lse (exp2 domain) and delta
            var lse2 = array<f32, TN>();
            var dl = array<f32, TN>();
            for (var j = 0u; j < TN; j++) {
                let qi = q0 + tx + j * NTX;
                lse2[j] = pos_inf();
                dl[j] = 0.0;
                if (qi < params.seq_q) {
                    let pair = lse_delta[pair_index(b, h, qi)];
                    lse2[j] = pair.x;
                    dl[j] = pair.y;
                }
            }
            workgroupBarrier();

            var p = dot_tile(OK, OQ, ty, tx);
            var ds = dot_tile_v(OV, ODO, ty, tx);
            for (var i = 0u; i < TM; i++) {
                for (var j = 0u; j < TN; j++) {
                    let sc = finish_pair(p[i][j], q0 + tx + j * NTX, kv0 + ty * TM + i, masked);
                    let g = pair_grads(sc, lse2[j], ds[i][j], dl[j], q0 + tx + j * NTX, kv0 + ty * TM + i);
                    p[i][j] = g.pz;
                    ds[i][j] = g.ds;
                }
            }
            store_weights(OP, p, ty, tx);
            store_weights(ODS, ds, ty, tx);
            workgroupBarrier();

            // summed apart, then folded in (f32 error on long columns)
            var dv = array<array<vec4<f32>, GPTV>, TM>();
            var dk = array<array<vec4<f32>, GPT>, TM>();
            weighted_rows_v(&dv, OP, ODO, ty, tx, masked);
            weighted_rows(&dk, ODS, OQ, ty, tx, masked);
            for (var i = 0u; i < TM; i++) {
                for (var k = 0u; k < GPTV; k++) {
                    acc_dv[i][k] += dv[i][k];
                }
                for (var k = 0u; k < GPT; k++) {
                    acc_dk[i][k] += dk[i][k];
                }
            }
        }
    }

    for (var i = 0u; i < TM; i++) {
        let key = kv0 + ty * TM + i;
        if (key < params.seq_kv) {
            let base = kv_index(b, key, hk, 0u);
            let base_v = v_index(b, key, hk, 0u);
            for (var k = 0u; k < GPT; k++) {
                let g = tx + k * NTX;
                for (var c = 0u; c < 4u; c++) {
                    let d = 4u * g + c;
                    if (g < D4 && d < HEAD_DIM) {
                        store_dk(base + d, acc_dk[i][k][c] * params.scale);
                    }
                }
            }
            for (var k = 0u; k < GPTV; k++) {
                let g = tx + k * NTX;
                for (var c = 0u; c < 4u; c++) {
                    let d = 4u * g + c;
                    if (g < D4V && d < HEAD_DIM_V) {
                        store_dv(base_v + d, acc_dv[i][k][c]);
                    }
                }
            }
        }
    }
}
