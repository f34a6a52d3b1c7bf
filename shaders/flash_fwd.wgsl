// FlashAttention forward (exact), one workgroup per (batch, query head, tile of BR rows).
//
// Grid:   n_q_tiles * heads_q * batch workgroups, folded into (x, y).
// Threads: BR rows x TPR lanes. Lane j of row r owns score columns j, j+TPR, ... of each
//          K/V tile and output dims j, j+TPR, ...
// Loop:   over K/V tiles of BC keys; with CAUSAL, tiles wholly above the diagonal are never
//         visited and only tiles crossing it (or the ragged end) evaluate the mask.
// Math (exp2 domain, s = scale * log2(e) * q.k):
//         m_new = max(m_i, rowmax(s)),  alpha = exp2(m_i - m_new),  p = exp2(s - m_new)
//         l_i = alpha * l_i + rowsum(p), acc = alpha * acc + p V (tile summed apart)
// Output: out = acc / l_i and lse = ln(l_i) + m_i ln 2, written once. The seq_q x seq_kv
//         score matrix never leaves workgroup memory.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const SQ: u32 = 0u;                        // Q tile [BR][HEAD_DIM], resident throughout
const SKV: u32 = SQ + BR * HEAD_DIM;       // K tile, then V tile in the same place [BC][HEAD_DIM]
const SS: u32 = SKV + BC * HEAD_DIM;       // scores [BR][BC]
const SP: u32 = SS + BR * BC;              // probabilities [BR][BC]
const SL: u32 = SP + BR * BC;              // row-sum partials [BR][TPR]
var<workgroup> smem: array<f32, SL + BR * TPR>;

fn load_kv_tile(src_is_k: bool, b: u32, hk: u32, kv0: u32, t: u32) {
    for (var e = t; e < BC * HEAD_DIM; e += NT) {
        let c = e / HEAD_DIM;
        let d = e % HEAD_DIM;
        let j = kv0 + c;
        var x = 0.0;
        if (j < params.seq_kv) {
            let g_k = k_at(b, j, hk, d);
            let g_v = v_at(b, j, hk, d);
            if (src_is_k) {
                x = load_k(g_k);
            } else {
                x = load_v(g_v);
            }
        }
        smem[SKV + e] = x;
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
    let r = t / TPR;
    let j = t % TPR;
    let i = q0 + r;

    // q stays in workgroup memory throughout
    for (var e = t; e < BR * HEAD_DIM; e += NT) {
        let qi = q0 + e / HEAD_DIM;
        var x = 0.0;
        if (qi < params.seq_q) {
            x = load_q(q_at(b, qi, h, e % HEAD_DIM));
        }
        smem[SQ + e] = x;
    }

    var m_i = running_max_start();
    var l_i = 0.0; // this lane's share of the row sum; reduced across lanes at the end
    var acc = array<f32, DPT>();
    var s = array<f32, CPT>();
    if (params.resume != 0u && i < params.seq_q) {
        let st = resumed_row(lse[row_index(b, h, i)]);
        m_i = st.m;
        l_i = select(0.0, st.l, j == 0u);
        for (var dd = 0u; dd < DPT; dd++) {
            let d = j + dd * TPR;
            if (d < HEAD_DIM) {
                acc[dd] = load_out(q_index(b, i, h, d));
            }
        }
    }

    let kv_end = kv_end_for_rows(b, q0, q0 + BR);
    for (var kv0 = (kv_begin_for_rows(q0) / BC) * BC; kv0 < kv_end; kv0 += BC) {
        let visit = tile_visit(b, h, q0, BR, kv0, BC);
        if (visit.skip) {
            continue;
        }
        let masked = visit.masked;
        load_kv_tile(true, b, hk, kv0, t);
        workgroupBarrier();

        for (var cc = 0u; cc < CPT; cc++) {
            s[cc] = 0.0;
        }
        for (var d = 0u; d < HEAD_DIM; d++) {
            let qd = smem[SQ + r * HEAD_DIM + d];
            for (var cc = 0u; cc < CPT; cc++) {
                let c = min(j + cc * TPR, BC - 1u);
                s[cc] = fma(qd, smem[SKV + c * HEAD_DIM + d], s[cc]);
            }
        }
        for (var cc = 0u; cc < CPT; cc++) {
            let c = j + cc * TPR;
            // columns past BC belong to no key of this tile
            s[cc] = select(masked_score(), finish_score(s[cc] * params.scale_log2, i, kv0 + c, masked), c < BC);
            if (c < BC) {
                smem[SS + r * BC + c] = s[cc];
            }
        }
        workgroupBarrier();

        var m_tile = running_max_start();
        for (var c = 0u; c < BC; c++) {
            m_tile = max(m_tile, smem[SS + r * BC + c]);
        }
        let om = online_max(m_i, m_tile);
        let m_new = om.m;
        let alpha = om.alpha;
        var l_tile = 0.0;
        for (var cc = 0u; cc < CPT; cc++) {
            let c = j + cc * TPR;
            let p = softmax_weight(s[cc], m_new);
            l_tile += p;
            if (c < BC) {
                smem[SP + r * BC + c] = p * dropout_scale(i, kv0 + c);
            }
        }
        l_i = fma(alpha, l_i, l_tile);
        m_i = m_new;
        // K is dead after the barrier above: V takes its place.
        load_kv_tile(false, b, hk, kv0, t);
        workgroupBarrier();

        // Sum the tile apart, then fold it in: two-level summation keeps f32 error low on
        // rows of millions of keys.
        var o_tile = array<f32, DPT>();
        for (var c = 0u; c < BC; c++) {
            let p = smem[SP + r * BC + c];
            for (var dd = 0u; dd < DPT; dd++) {
                let d = min(j + dd * TPR, HEAD_DIM - 1u);
                o_tile[dd] = add_weighted(o_tile[dd], p, smem[SKV + c * HEAD_DIM + d], masked);
            }
        }
        for (var dd = 0u; dd < DPT; dd++) {
            acc[dd] = fma(alpha, acc[dd], o_tile[dd]);
        }
        workgroupBarrier();
    }

    smem[SL + r * TPR + j] = l_i;
    workgroupBarrier();
    var l = 0.0;
    for (var jj = 0u; jj < TPR; jj++) {
        l += smem[SL + r * TPR + jj];
    }
    if (i < params.seq_q) {
        let inv_l = row_normalizer(m_i, l);
        for (var dd = 0u; dd < DPT; dd++) {
            let d = j + dd * TPR;
            if (d < HEAD_DIM) {
                store_out(q_index(b, i, h, d), acc[dd] * inv_l);
            }
        }
        if (j == 0u) {
            lse[row_index(b, h, i)] = finish_lse(m_i, l);
        }
    }
}
