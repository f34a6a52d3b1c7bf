// FlashAttention forward (exact), "blocks" variant: register micro-tiles for GPUs.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of NT = NTY x NTX threads, folded.
// Threads: (ty, tx) as in blocks.wgsl: TM query rows x TN keys of each score tile, and the same
//          TM rows x GPT vec4 groups of the output, all in registers.
// Loop:    over K/V tiles of BC keys; with CAUSAL, tiles wholly above the diagonal are never
//          visited and only tiles crossing it are masked. Per tile: S = Q K^T (dot_tile), the
//          row max across the NTX threads of a row (workgroup memory), P = exp2(S - m_new) to
//          workgroup memory, V over K's place, O = alpha O + P V (weighted_rows).
// Math:    as flash_fwd.wgsl (exp2 domain, online softmax, one write of out and lse).
// Memory:  Q [BR][RS] resident, K [BC][RS] then V [BC][RSV], P [BR][WS] (vec4 units), row
//          maxima [BR][NTX]. V and out rows are HEAD_DIM_V wide (D4V groups), q and k rows
//          HEAD_DIM: where a call's values have a head dim of their own, this kernel runs it.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const OQ: u32 = 0u;
const OKV: u32 = OQ + BR * RS;
const OP: u32 = OKV + BC * max(RS, RSV);
var<workgroup> sm: array<vec4<f32>, OP + BR * WS>;
var<workgroup> red: array<f32, BR * NTX>;

// K's rows (D4 groups at stride RS), or V's (D4V at RSV), of keys [kv0, kv0 + BC) at OKV
fn load_kv_tile(is_k: bool, b: u32, hk: u32, kv0: u32, t: u32) {
    let d4 = select(D4V, D4, is_k);
    let rs = select(RSV, RS, is_k);
    for (var e = t; e < BC * d4; e += NT) {
        let c = e / d4;
        let g = e % d4;
        let j = kv0 + c;
        var x = vec4<f32>();
        if (j < params.seq_kv) {
            if (is_k) {
                x = load4_k(k_at(b, j, hk, 0u), g);
            } else {
                x = load4_v(v_at(b, j, hk, 0u), g);
            }
        }
        sm[OKV + c * rs + g] = x;
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
    let b = tile.b;
    let h = tile.h;
    let hk = tile.hk;
    let q0 = tile.q0;
    begin_head(b, h);
    let ty = t / NTX;
    let tx = t % NTX;

    // q stays in workgroup memory throughout, scaled into the exp2 domain once
    for (var e = t; e < BR * D4; e += NT) {
        let r = e / D4;
        let g = e % D4;
        let i = q0 + r;
        var x = vec4<f32>();
        if (i < params.seq_q) {
            x = load4_q(q_at(b, i, h, 0u), g) * params.scale_log2;
        }
        sm[OQ + r * RS + g] = x;
    }

    var m_i = array<f32, TM>();
    var l_i = array<f32, TM>(); // this thread's share of each row sum, reduced at the end
    var acc = array<array<vec4<f32>, GPTV>, TM>();
    for (var i = 0u; i < TM; i++) {
        m_i[i] = running_max_start();
        let qi = q0 + ty * TM + i;
        if (params.resume != 0u && qi < params.seq_q) {
            let st = resumed_row(lse[row_index(b, h, qi)]);
            m_i[i] = st.m;
            l_i[i] = select(0.0, st.l, tx == 0u);
            let base = o_index(b, qi, h, 0u);
            for (var k = 0u; k < GPTV; k++) {
                let g = tx + k * NTX;
                if (g < D4V) {
                    acc[i][k] = load4_out(base, g);
                }
            }
        }
    }

    let kv_end = kv_end_for_rows(b, q0, q0 + BR);
    for (var kv0 = (kv_begin_for_rows(b, q0) / BC) * BC; kv0 < kv_end; kv0 += BC) {
        let visit = tile_visit(b, h, q0, BR, kv0, BC);
        if (visit.skip) {
            continue;
        }
        let masked = visit.masked;
        workgroupBarrier(); // the previous tile's P V is done with V and P
        load_kv_tile(true, b, hk, kv0, t);
        workgroupBarrier();

        var s = dot_tile(OQ, OKV, ty, tx);
        for (var i = 0u; i < TM; i++) {
            var m = running_max_start();
            for (var j = 0u; j < TN; j++) {
                s[i][j] = finish_score(s[i][j], q0 + ty * TM + i, kv0 + tx + j * NTX, masked);
                m = max(m, s[i][j]);
            }
            red[(ty * TM + i) * NTX + tx] = m;
        }
        workgroupBarrier(); // K is dead and the partial maxima are in

        load_kv_tile(false, b, hk, kv0, t);
        var alpha = array<f32, TM>();
        for (var i = 0u; i < TM; i++) {
            var m_tile = running_max_start();
            for (var x = 0u; x < NTX; x++) {
                m_tile = max(m_tile, red[(ty * TM + i) * NTX + x]);
            }
            let om = online_max(m_i[i], m_tile);
            alpha[i] = om.alpha;
            m_i[i] = om.m;
            var l_tile = 0.0;
            for (var j = 0u; j < TN; j++) {
                let p = softmax_weight(s[i][j], om.m);
                l_tile += p;
                s[i][j] = p * dropout_scale(q0 + ty * TM + i, kv0 + tx + j * NTX);
            }
            l_i[i] = fma(alpha[i], l_i[i], l_tile);
        }
        store_weights(OP, s, ty, tx);
        workgroupBarrier();

        // the tile is summed apart, then folded in: two-level summation for long rows
        var o = array<array<vec4<f32>, GPTV>, TM>();
        weighted_rows_v(&o, OP, OKV, ty, tx, masked);
        for (var i = 0u; i < TM; i++) {
            for (var k = 0u; k < GPTV; k++) {
                acc[i][k] = fma(vec4<f32>(alpha[i]), acc[i][k], o[i][k]);
            }
        }
    }

    workgroupBarrier();
    for (var i = 0u; i < TM; i++) {
        red[(ty * TM + i) * NTX + tx] = l_i[i];
    }
    workgroupBarrier();
    for (var i = 0u; i < TM; i++) {
        let qi = q0 + ty * TM + i;
        var l = 0.0;
        for (var x = 0u; x < NTX; x++) {
            l += red[(ty * TM + i) * NTX + x];
        }
        if (qi < params.seq_q) {
            let inv_l = row_normalizer(m_i[i], l);
            let base = o_index(b, qi, h, 0u);
            for (var k = 0u; k < GPTV; k++) {
                let g = tx + k * NTX;
                for (var c = 0u; c < 4u; c++) {
                    let d = 4u * g + c;
                    if (g < D4V && d < HEAD_DIM_V) {
                        store_out(base + d, acc[i][k][c] * inv_l);
                    }
                }
            }
            if (tx == 0u) {
                lse[row_index(b, h, qi)] = finish_lse(m_i[i], l);
            }
        }
    }
}
