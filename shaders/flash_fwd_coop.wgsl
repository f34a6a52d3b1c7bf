// FlashAttention forward (exact), "coop" variant: the two matrix products on cooperative
// matrices (tensor cores on NVIDIA, matrix cores on AMD, XMX on Intel), CF x CF x CF (16 or 8) with f16
// operands and f32 accumulators (coop.wgsl). For f16 tensors only: q, k, v are f16 already,
// so staging them as f16 loses nothing; P is rounded to f16 once, and the row sum adds the
// rounded values, so out is normalized by exactly the weights it was built from.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of NT = 128 invocations, folded.
// Threads: products by subgroup (coop.wgsl); softmax and the output fold scalar: invocation t
//          owns row t / TPR, and of it score columns and head dims t % TPR + k * TPR.
// Loop:    over K/V tiles of BC keys; with CAUSAL, tiles wholly above the diagonal are never
//          visited. Per tile: S = Q K^T (f32 to fs), the online softmax (scalar, exp2 domain,
//          scale applied in f32), P to hs as f16, O_tile = P V folded into each row's
//          registers: acc = alpha acc + O_tile. Tiles with hidden pairs (the diagonal, the
//          ragged end) take O_tile from guarded_row instead (a hidden key's NaN value stays out).
// Memory:  hs: Q [BR][DP], K, V [BC][DP], P [BR][BC] (f16); fs: S, then O_tile (f32).
// Cooperative operations need uniform control flow: padding workgroups of a folded grid run
// no tile and store nothing instead of returning early.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const CPR: u32 = BC / TPR;          // score columns per invocation
const OQ: u32 = 0u;
const OK: u32 = OQ + BR * DP;
const OV: u32 = OK + BC * DP;
const OP: u32 = OV + BC * DP;
var<workgroup> hs: array<f16, OP + BR * BC>;
var<workgroup> fs: array<f32, BR * max(BC, DP)>;
var<workgroup> red: array<f32, BR * TPR>;

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
        var x = 0.0;
        if (qi < params.seq_q && d < HEAD_DIM) {
            x = load_q(q_at(b, qi, h, d));
        }
        hs[OQ + e] = f16(x);
    }

    var m_i = running_max_start();
    var l_i = 0.0; // this invocation's share of the row sum, reduced at the end
    var acc = array<f32, DPR>();
    if (live && params.resume != 0u && i < params.seq_q) {
        let st = resumed_row(lse[row_index(b, h, i)]);
        m_i = st.m;
        l_i = select(0.0, st.l, part == 0u);
        for (var k = 0u; k < DPR; k++) {
            let d = part + k * TPR;
            if (d < HEAD_DIM) {
                acc[k] = load_out(q_index(b, i, h, d));
            }
        }
    }

    let kv_end = select(0u, kv_end_for_rows(b, q0, q0 + BR), live);
    for (var kv0 = (kv_begin_for_rows(b, q0) / BC) * BC; kv0 < kv_end; kv0 += BC) {
        let visit = tile_visit(b, h, q0, BR, kv0, BC);
        if (visit.skip) {
            continue;
        }
        let masked = visit.masked;
        workgroupBarrier(); // the previous tile is done with K, V, P and fs
        stage_kv(OK, OV, b, hk, kv0, BC, t);
        workgroupBarrier();
        coop_nt(OQ, DP, OK, DP, DP, BR / CF, BC / CF, 0u, BC, sg, nsg);
        workgroupBarrier();

        var s = array<f32, CPR>();
        var m = running_max_start();
        for (var k = 0u; k < CPR; k++) {
            let c = part + k * TPR;
            s[k] = finish_score(fs[r * BC + c] * params.scale_log2, i, kv0 + c, masked);
            m = max(m, s[k]);
        }
        red[r * TPR + part] = m;
        workgroupBarrier();
        var m_tile = running_max_start();
        for (var x = 0u; x < TPR; x++) {
            m_tile = max(m_tile, red[r * TPR + x]);
        }
        let om = online_max(m_i, m_tile);
        var l_tile = 0.0;
        for (var k = 0u; k < CPR; k++) {
            let c = part + k * TPR;
            let p = f16(softmax_weight(s[k], om.m));
            hs[OP + r * BC + c] = f16(f32(p) * dropout_scale(i, kv0 + c));
            l_tile += f32(p);
        }
        l_i = fma(om.alpha, l_i, l_tile);
        m_i = om.m;
        workgroupBarrier(); // P is in; S and the maxima are dead

        coop_nn(OP, BC, OV, DP, BC, BR / CF, DP / CF, 0u, DP, sg, nsg);
        workgroupBarrier();
        // the tile was summed apart and is folded in here
        var o = product_row(0u, r, part);
        if (masked) {
            o = guarded_row(OP, BC, OV, rows_in(kv0, BC, params.seq_kv), r, part);
        }
        for (var k = 0u; k < DPR; k++) {
            acc[k] = fma(om.alpha, acc[k], o[k]);
        }
    }

    workgroupBarrier();
    red[r * TPR + part] = l_i;
    workgroupBarrier();
    var l = 0.0;
    for (var x = 0u; x < TPR; x++) {
        l += red[r * TPR + x];
    }
    if (live && i < params.seq_q) {
        let inv_l = row_normalizer(m_i, l);
        for (var k = 0u; k < DPR; k++) {
            let d = part + k * TPR;
            if (d < HEAD_DIM) {
                store_out(q_index(b, i, h, d), acc[k] * inv_l);
            }
        }
        if (part == 0u) {
            lse[row_index(b, h, i)] = finish_lse(m_i, l);
        }
    }
}
