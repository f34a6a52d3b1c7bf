// FlashAttention backward, dK and dV, "coop" variant: the four products on cooperative
// matrices (coop.wgsl). f16 tensors only; P^T and dS^T are rounded to f16 once.
//
// Grid:    n_kv_tiles * heads_kv * batch workgroups of NT = 128 invocations, folded.
// Threads: products by subgroup; P, dS and the folds scalar: invocation t owns key row t / TPR,
//          and of it query columns and head dims t % TPR + k * TPR.
// Loop:    K_j and V_j stay in workgroup memory while the workgroup walks every query head of
//          its GQA group and, for each, the Q tiles that can see these keys (with CAUSAL the
//          tiles wholly above the diagonal are skipped). Per tile: S^T = K Q^T and
//          dP^T = V dO^T (f32 to fs), P^T = exp2(s - lse2) and dS^T = P^T * (dP^T - delta)
//          (scalar, to hs as f16), then dV_tile = P^T dO and dK_tile = dS^T Q, each folded into
//          the key rows' registers (guarded_row in tiles with hidden pairs); dK is scaled once.
// Memory:  hs: K, V [BC][DP], Q, dO [BR][DP], P^T, dS^T [BC][BR] (f16); fs: S^T, dP^T
//          [BC][BR], then dV_tile, then dK_tile [BC][DP] (f32); lse2 and delta of the Q tile.
// No atomics: each workgroup owns its dK/dV rows. 8 storage buffers: the WebGPU default cap.
// Padding workgroups run no tile (uniform control flow for the cooperative operations).
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const RPR: u32 = BR / TPR;          // query columns per invocation
const OK: u32 = 0u;
const OV: u32 = OK + BC * DP;
const OQ: u32 = OV + BC * DP;
const ODO: u32 = OQ + BR * DP;
const OP: u32 = ODO + BR * DP;
const ODS: u32 = OP + BC * BR;
const FDP: u32 = BC * BR;           // dP^T in fs, after S^T
var<workgroup> hs: array<f16, ODS + BC * BR>;
var<workgroup> fs: array<f32, BC * max(2u * BR, DP)>;
var<workgroup> rows: array<f32, 2u * BR>;  // lse2 [BR], then delta [BR]

@compute @workgroup_size(NT)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let live = linear_workgroup(wid, nwg) < params.total_wg;
    let tile = kv_tile_of(min(linear_workgroup(wid, nwg), params.total_wg - 1u), BC);
    let b = tile.b;
    let hk = tile.hk;
    let kv0 = tile.kv0;
    let c = t / TPR;
    let part = t % TPR;
    let key = kv0 + c;

    stage_kv(OK, OV, b, hk, kv0, BC, t);

    var acc_dk = array<f32, DPR>();
    var acc_dv = array<f32, DPR>();
    let q_start = (q_begin_for_key(kv0) / BR) * BR;
    let q_end = select(0u, q_end_for_keys(b, kv0, kv0 + BC - 1u), live);

    for (var g = 0u; g < params.group; g++) {
        let h = hk * params.group + g;
        begin_head(b, h);
        for (var q0 = q_start; q0 < q_end; q0 += BR) {
            let visit = tile_visit(b, h, q0, BR, kv0, BC);
            if (visit.skip) {
                continue;
            }
            let masked = q0 + BR > params.seq_q || visit.masked;
            workgroupBarrier(); // the previous tile is done with Q, dO, P^T, dS^T and fs
            // in chunks of SW dims, as stage_kv
            for (var e = t; e < BR * DC; e += NT) {
                let qi = q0 + e / DC;
                let d0 = (e % DC) * SW;
                var qx = array<f16, SW>();
                var dox = array<f16, SW>();
                if (qi < params.seq_q) {
                    let g2_q = q_at(b, qi, h, d0);
                    let g2_do = dout_at(b, qi, h, d0);
                    if (d0 + SW <= HEAD_DIM) {
                        for (var x = 0u; x < SW; x++) {
                            qx[x] = f16(load_q(g2_q + x));
                            dox[x] = f16(load_d_out(g2_do + x));
                        }
                    } else if (HEAD_DIM % SW != 0u) {
                        for (var x = 0u; x < SW; x++) {
                            if (d0 + x < HEAD_DIM) {
                                qx[x] = f16(load_q(g2_q + x));
                                dox[x] = f16(load_d_out(g2_do + x));
                            }
                        }
                    }
                }
                for (var x = 0u; x < SW; x++) {
                    let at = e * SW + x;
                    hs[OQ + at] = qx[x];
                    hs[ODO + at] = dox[x];
                }
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
                rows[r] = l2;
                rows[BR + r] = dl;
            }
            workgroupBarrier();
            coop_nt(OK, DP, OQ, DP, DP, BC / CF, BR / CF, 0u, BR, sg, nsg);
            coop_nt(OV, DP, ODO, DP, DP, BC / CF, BR / CF, FDP, BR, sg, nsg);
            workgroupBarrier();

            for (var k = 0u; k < RPR; k++) {
                let r = part + k * TPR;
                let sc = finish_pair(fs[c * BR + r] * params.scale_log2, q0 + r, key, masked);
                let g = pair_grads(sc, rows[r], fs[FDP + c * BR + r], rows[BR + r], q0 + r, key);
                hs[OP + c * BR + r] = f16(g.pz);
                hs[ODS + c * BR + r] = f16(g.ds);
            }
            workgroupBarrier(); // P^T and dS^T are in; S^T and dP^T are dead

            // summed apart, then folded in (f32 error on long columns)
            coop_nn(OP, BR, ODO, DP, BR, BC / CF, DP / CF, 0u, DP, sg, nsg);
            workgroupBarrier();
            var dv = product_row(0u, c, part);
            if (masked) {
                dv = guarded_row(OP, BR, ODO, rows_in(q0, BR, params.seq_q), c, part);
            }
            workgroupBarrier(); // every row is read before dK_tile takes fs
            coop_nn(ODS, BR, OQ, DP, BR, BC / CF, DP / CF, 0u, DP, sg, nsg);
            workgroupBarrier();
            var dk = product_row(0u, c, part);
            if (masked) {
                dk = guarded_row(ODS, BR, OQ, rows_in(q0, BR, params.seq_q), c, part);
            }
            for (var k = 0u; k < DPR; k++) {
                acc_dv[k] += dv[k];
                acc_dk[k] += dk[k];
            }
        }
    }

    if (live && key < params.seq_kv) {
        for (var k = 0u; k < DPR; k++) {
            let d = part + k * TPR;
            if (d < HEAD_DIM) {
                let o = kv_index(b, key, hk, d);
                store_dk(o, acc_dk[k] * params.scale);
                store_dv(o, acc_dv[k]);
            }
        }
    }
}
