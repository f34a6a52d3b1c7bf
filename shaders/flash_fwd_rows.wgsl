// FlashAttention forward (exact), "rows" variant: each invocation owns RPT query rows.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of BR / RPT invocations, folded into (x, y).
// Threads: invocation t owns query rows q0 + t + rr * NT (rr < RPT): their q (pre-scaled),
//          m, l and output accumulators live in private arrays.
// Loop:    over K/V tiles of BC keys held in workgroup memory; with CAUSAL, tiles wholly above
//          the diagonal are never visited and only tiles crossing it are masked.
//          Every invocation needs every K/V element of the tile. The tiles hold TileVecs of
//          VW elements (up to 4; src/kernels/rows.rs). With subgroups (SG > 1) each lane reads
//          a different TileVec and `lane_values` broadcasts it to the others, so a subgroup
//          makes SG times fewer workgroup-memory reads; without, SG = 1 and each invocation
//          reads every TileVec itself. Each element read serves RPT rows.
//          Lane = local_invocation_index % SG: subgroups are consecutive invocations, as on
//          the CPU drivers this variant is picked for (tests/variants.rs checks it there).
// Math:    as flash_fwd.wgsl (exp2 domain, online softmax, one write of out and lse).
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

var<workgroup> sk: array<TileVec, BC * DPAD_V>;
var<workgroup> sv: array<TileVec, BC * DPAD_V>;
// per invocation: its rows' q (scaled into the exp2 domain once) and the tile's output sums,
// read and written by the generated `score_rows` and `add_rows` (src/kernels/rows.rs)
var<private> qr: array<array<f32, DPAD>, RPT>;
var<private> o: array<array<f32, DPAD>, RPT>;

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
    let b = pinned(tile.b, 0u);
    let h = pinned(tile.h, 1u);
    let hk = pinned(tile.hk, 2u);
    let q0 = pinned(tile.q0, 3u);
    begin_head(b, h);
    let lane = t % SG;

    for (var rr = 0u; rr < RPT; rr++) {
        let i = q0 + t + rr * NT;
        if (i < params.seq_q) {
            let base_q = q_at(b, i, h, 0u);
            for (var d = 0u; d < row_dims(); d++) {
                qr[rr][d] = load_q(base_q + d) * params.scale_log2;
            }
        }
    }
    var acc = array<array<f32, DPAD>, RPT>();
    var s = array<array<f32, BC>, RPT>();
    var m_i = array<f32, RPT>();
    var l_i = array<f32, RPT>();
    var m_new = array<f32, RPT>();
    for (var rr = 0u; rr < RPT; rr++) {
        m_i[rr] = running_max_start();
        let i = q0 + t + rr * NT;
        if (params.resume != 0u && i < params.seq_q) {
            let st = resumed_row(lse[row_index(b, h, i)]);
            m_i[rr] = st.m;
            l_i[rr] = st.l;
            let base = q_index(b, i, h, 0u);
            for (var d = 0u; d < row_dims(); d++) {
                acc[rr][d] = load_out(base + d);
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
        workgroupBarrier();
        stage_kv(b, hk, kv0, t);
        workgroupBarrier();

        for (var rr = 0u; rr < RPT; rr++) {
            m_new[rr] = m_i[rr];
        }
        for (var c = 0u; c < BC; c++) {
            let x = score_rows(c, lane);
            for (var rr = 0u; rr < RPT; rr++) {
                let sc = finish_score(x[rr], q0 + t + rr * NT, kv0 + c, masked);
                s[rr][c] = sc;
                m_new[rr] = max(m_new[rr], sc);
            }
        }
        var alpha = array<f32, RPT>();
        var l_tile = array<f32, RPT>();
        for (var rr = 0u; rr < RPT; rr++) {
            alpha[rr] = online_max(m_i[rr], m_new[rr]).alpha;
            m_i[rr] = m_new[rr];
            for (var d0 = 0u; d0 < DPAD; d0 += SG) {
                for (var l = 0u; l < SG; l++) {
                    o[rr][d0 + l] = 0.0;
                }
            }
        }
        for (var c = 0u; c < BC; c++) {
            var p = array<f32, RPT>();
            for (var rr = 0u; rr < RPT; rr++) {
                p[rr] = softmax_weight(s[rr][c], m_new[rr]);
                l_tile[rr] += p[rr];
                p[rr] *= dropout_scale(q0 + t + rr * NT, kv0 + c);
            }
            add_rows(c, lane, p, masked);
        }
        // the tile was summed apart and is folded in here: two-level summation for long rows
        for (var rr = 0u; rr < RPT; rr++) {
            l_i[rr] = fma(alpha[rr], l_i[rr], l_tile[rr]);
            for (var d0 = 0u; d0 < DPAD; d0 += SG) {
                for (var l = 0u; l < SG; l++) {
                    acc[rr][d0 + l] = fma(alpha[rr], acc[rr][d0 + l], o[rr][d0 + l]);
                }
            }
        }
    }

    for (var rr = 0u; rr < RPT; rr++) {
        let i = q0 + t + rr * NT;
        if (i < params.seq_q) {
            let inv_l = row_normalizer(m_i[rr], l_i[rr]);
            let base = q_index(b, i, h, 0u);
            for (var d = 0u; d < row_dims(); d++) {
                store_out(base + d, acc[rr][d] * inv_l);
            }
            lse[row_index(b, h, i)] = finish_lse(m_i[rr], l_i[rr]);
        }
    }
}
