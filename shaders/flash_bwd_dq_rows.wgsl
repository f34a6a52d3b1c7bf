// FlashAttention backward, dQ, "rows" variant: one invocation per query row.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of BR invocations, folded.
// Threads: invocation r owns query row q0 + r: q (pre-scaled), dO and the dQ accumulator live
//          in private arrays; K/V tiles in workgroup memory are read SG elements at a time
//          and shared across the subgroup with `lane_value` (see flash_fwd_rows.wgsl).
// Loop:    over K/V tiles of BC keys; with CAUSAL, tiles above the diagonal are skipped.
// Math:    P = exp2(s - lse2), dP = dO V^T, dS = P * (dP - delta), dQ += scale * dS K.
// No atomics: each workgroup owns its dQ rows.

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> d_out: array<f32>;
@group(0) @binding(5) var<storage, read> lse: array<f32>;
@group(0) @binding(6) var<storage, read> delta: array<f32>;
@group(0) @binding(7) var<storage, read_write> dq: array<f32>;

var<workgroup> sk: array<f32, BC * DPAD>;
var<workgroup> sv: array<f32, BC * DPAD>;

@compute @workgroup_size(BR)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= params.total_wg) {
        return;
    }
    let q_tile = wg % params.n_q_tiles;
    let bh = wg / params.n_q_tiles;
    let h = bh % params.heads_q;
    let b = bh / params.heads_q;
    let hk = h / params.group;
    let q0 = q_tile * BR;
    let i = q0 + t;
    let lane = t % SG;

    var qr: array<f32, DPAD>;
    var dor: array<f32, DPAD>;
    var lse2 = pos_inf(); // rows past seq_q get P = 0
    var delta_i = 0.0;
    if (i < params.seq_q) {
        let base = q_index(b, i, h, 0u);
        for (var d = 0u; d < HEAD_DIM; d++) {
            qr[d] = q[base + d] * params.scale_log2;
            dor[d] = d_out[base + d];
        }
        lse2 = lse_to_log2(lse[row_index(b, h, i)]);
        delta_i = delta[row_index(b, h, i)];
    }
    var acc: array<f32, DPAD>;
    var dq_tile: array<f32, DPAD>;
    var ds: array<f32, BC>;

    let kv_end = kv_end_for_rows(q0, q0 + BR);
    for (var kv0 = 0u; kv0 < kv_end; kv0 += BC) {
        let masked = tile_needs_mask(q0, kv0, BC);
        workgroupBarrier();
        for (var e = t; e < BC * DPAD; e += BR) {
            let j = kv0 + e / DPAD;
            let d = e % DPAD;
            var kx = 0.0;
            var vx = 0.0;
            if (j < params.seq_kv && d < HEAD_DIM) {
                let g = kv_index(b, j, hk, d);
                kx = k[g];
                vx = v[g];
            }
            sk[e] = kx;
            sv[e] = vx;
        }
        workgroupBarrier();

        for (var c = 0u; c < BC; c++) {
            var s = 0.0;
            var dp = 0.0;
            for (var d0 = 0u; d0 < DPAD; d0 += SG) {
                let k_mine = sk[c * DPAD + d0 + lane];
                let v_mine = sv[c * DPAD + d0 + lane];
                for (var l = 0u; l < SG; l++) {
                    s = fma(qr[d0 + l], lane_value(k_mine, l), s);
                    dp = fma(dor[d0 + l], lane_value(v_mine, l), dp);
                }
            }
            s = select(MASKED_SCORE, s, !masked | visible(i, kv0 + c));
            ds[c] = exp2(s - lse2) * (dp - delta_i);
        }
        // summed apart, then folded in (f32 error on long rows)
        for (var d = 0u; d < DPAD; d++) {
            dq_tile[d] = 0.0;
        }
        for (var c = 0u; c < BC; c++) {
            let dsc = ds[c];
            for (var d0 = 0u; d0 < DPAD; d0 += SG) {
                let k_mine = sk[c * DPAD + d0 + lane];
                for (var l = 0u; l < SG; l++) {
                    dq_tile[d0 + l] = fma(dsc, lane_value(k_mine, l), dq_tile[d0 + l]);
                }
            }
        }
        for (var d = 0u; d < DPAD; d++) {
            acc[d] += dq_tile[d];
        }
    }

    if (i < params.seq_q) {
        let base = q_index(b, i, h, 0u);
        for (var d = 0u; d < HEAD_DIM; d++) {
            dq[base + d] = acc[d] * params.scale;
        }
    }
}
