// FlashAttention forward (exact), "rows" variant: one invocation per query row.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of BR invocations, folded into (x, y).
// Threads: invocation r owns query row q0 + r: its q (pre-scaled), m, l and output
//          accumulator live in private arrays.
// Loop:    over K/V tiles of BC keys held in workgroup memory; with CAUSAL, tiles wholly above
//          the diagonal are never visited and only tiles crossing it are masked.
//          Every invocation needs every K/V element of the tile. With subgroups (SG > 1) each
//          lane reads a different element and `lane_value` broadcasts it to the others, so a
//          subgroup makes SG times fewer workgroup-memory reads; without, SG = 1 and each
//          invocation reads every element itself.
// Math:    as flash_fwd.wgsl (exp2 domain, online softmax, one write of out and lse).

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;

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

    // q stays in registers throughout, scaled into the exp2 domain once
    var qr: array<f32, DPAD>;
    if (i < params.seq_q) {
        let base = q_index(b, i, h, 0u);
        for (var d = 0u; d < HEAD_DIM; d++) {
            qr[d] = q[base + d] * params.scale_log2;
        }
    }
    var acc: array<f32, DPAD>;
    var o: array<f32, DPAD>;
    var s: array<f32, BC>;
    var m_i = NEG_SENTINEL;
    var l_i = 0.0;

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

        var m_new = m_i;
        for (var c = 0u; c < BC; c++) {
            var x = 0.0;
            for (var d0 = 0u; d0 < DPAD; d0 += SG) {
                let mine = sk[c * DPAD + d0 + lane];
                for (var l = 0u; l < SG; l++) {
                    x = fma(qr[d0 + l], lane_value(mine, l), x);
                }
            }
            x = select(MASKED_SCORE, x, !masked | visible(i, kv0 + c));
            s[c] = x;
            m_new = max(m_new, x);
        }
        let alpha = exp2(m_i - m_new);
        m_i = m_new;
        var l_tile = 0.0;
        for (var d = 0u; d < DPAD; d++) {
            o[d] = 0.0;
        }
        for (var c = 0u; c < BC; c++) {
            let p = exp2(s[c] - m_new);
            l_tile += p;
            for (var d0 = 0u; d0 < DPAD; d0 += SG) {
                let mine = sv[c * DPAD + d0 + lane];
                for (var l = 0u; l < SG; l++) {
                    o[d0 + l] = fma(p, lane_value(mine, l), o[d0 + l]);
                }
            }
        }
        // the tile was summed apart and is folded in here: two-level summation for long rows
        l_i = fma(alpha, l_i, l_tile);
        for (var d = 0u; d < DPAD; d++) {
            acc[d] = fma(alpha, acc[d], o[d]);
        }
    }

    if (i < params.seq_q) {
        let inv_l = select(0.0, 1.0 / l_i, l_i > 0.0);
        let base = q_index(b, i, h, 0u);
        for (var d = 0u; d < HEAD_DIM; d++) {
            out[base + d] = acc[d] * inv_l;
        }
        lse[row_index(b, h, i)] = finish_lse(m_i, l_i);
    }
}
