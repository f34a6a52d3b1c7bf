// FlashAttention forward (exact), "coop" variant: the two matrix products on cooperative
// matrices (tensor cores on NVIDIA, matrix cores on AMD, XMX on Intel, simdgroup matrices on
// Apple), 16x16x16 with f16 operands and f32 accumulators. For f16 tensors only: q, k, v are
// f16 already, so staging them as f16 loses nothing; P is rounded to f16 once, and the row sum
// adds the rounded values, so out is normalized by exactly the weights it was built from.
//
// Grid:    n_q_tiles * heads_q * batch workgroups of NT = 128 invocations, folded.
// Threads: the matrix products are shared out by subgroup (@builtin(subgroup_id), no subgroup
//          size assumed): subgroup g takes 16x16 output blocks g, g + num_subgroups, ...
//          The softmax and the output fold are scalar: invocation t owns row t / TPR, and of it
//          the score columns and head dims t % TPR + k * TPR.
// Loop:    over K/V tiles of BC keys; with CAUSAL, tiles wholly above the diagonal are never
//          visited. Per tile: S = Q K^T (cooperative, f32 to workgroup memory), the online
//          softmax (scalar, exp2 domain, scale applied in f32), P as f16, O_tile = P V
//          (cooperative) folded into each row's registers: acc = alpha acc + O_tile.
//          Tiles with hidden pairs (the diagonal, the ragged end) take P V from scalar code
//          with add_weighted: the matrix product would carry 0 * NaN from a hidden key's value.
// Memory:  Q, K, V [rows][DP] and P [BR][BC] as f16; one f32 area for S, then O_tile.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const DP: u32 = (HEAD_DIM + 15u) / 16u * 16u;  // head dims padded to whole blocks
const DPR: u32 = DP / TPR;                     // head dims per invocation
const CPR: u32 = BC / TPR;                     // score columns per invocation
const FS: u32 = BR * max(BC, DP);

var<workgroup> qs: array<f16, BR * DP>;
var<workgroup> ks: array<f16, BC * DP>;
var<workgroup> vs: array<f16, BC * DP>;
var<workgroup> ps: array<f16, BR * BC>;
var<workgroup> fs: array<f32, FS>;
var<workgroup> red: array<f32, BR * TPR>;

@compute @workgroup_size(NT)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    // Cooperative-matrix operations need uniform control flow, so padding workgroups of a
    // folded grid run no tile (kv_end = 0) and store nothing, instead of returning early.
    let live = linear_workgroup(wid, nwg) < params.total_wg;
    let wg = min(linear_workgroup(wid, nwg), params.total_wg - 1u);
    let tile = q_tile_of(wg, BR);
    let b = tile.b;
    let h = tile.h;
    let hk = tile.hk;
    let q0 = tile.q0;
    let r = t / TPR;
    let part = t % TPR;
    let i = q0 + r;

    for (var e = t; e < BR * DP; e += NT) {
        let qi = q0 + e / DP;
        let d = e % DP;
        var x = 0.0;
        if (qi < params.seq_q && d < HEAD_DIM) {
            x = load_q(q_index(b, qi, h, d));
        }
        qs[e] = f16(x);
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

    let kv_end = select(0u, kv_end_for_rows(q0, q0 + BR), live);
    for (var kv0 = 0u; kv0 < kv_end; kv0 += BC) {
        let masked = tile_needs_mask(q0, kv0, BC);
        workgroupBarrier(); // the previous tile is done with ks, vs, ps and fs
        for (var e = t; e < BC * DP; e += NT) {
            let j = kv0 + e / DP;
            let d = e % DP;
            var kx = 0.0;
            var vx = 0.0;
            if (j < params.seq_kv && d < HEAD_DIM) {
                let g = kv_index(b, j, hk, d);
                kx = load_k(g);
                vx = load_v(g);
            }
            ks[e] = f16(kx);
            vs[e] = f16(vx);
        }
        workgroupBarrier();

        // S = Q K^T: block (rb, cb) reads Q rows row-major and K rows as the columns of B
        for (var blk = sg; blk < (BR / 16u) * (BC / 16u); blk += nsg) {
            let rb = blk / (BC / 16u);
            let cb = blk % (BC / 16u);
            var c = coop_mat16x16<f32, C>();
            for (var kk = 0u; kk < DP / 16u; kk++) {
                let qa = coopLoadT<coop_mat16x16<f16, A>>(&qs[rb * 16u * DP + kk * 16u], DP);
                let kb = coopLoad<coop_mat16x16<f16, B>>(&ks[cb * 16u * DP + kk * 16u], DP);
                c = coopMultiplyAdd(qa, kb, c);
            }
            coopStoreT(c, &fs[rb * 16u * BC + cb * 16u], BC);
        }
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
            let p = f16(softmax_weight(s[k], om.m));
            ps[r * BC + part + k * TPR] = p;
            l_tile += f32(p);
        }
        l_i = fma(om.alpha, l_i, l_tile);
        m_i = om.m;
        for (var k = 0u; k < DPR; k++) {
            acc[k] *= om.alpha;
        }
        workgroupBarrier(); // P is in; S and the maxima are dead

        // O_tile = P V: block (rb, db) reads P rows and V rows, both row-major. Computed for
        // every tile (cooperative operations need uniform control flow), used where no pair
        // is hidden.
        for (var blk = sg; blk < (BR / 16u) * (DP / 16u); blk += nsg) {
            let rb = blk / (DP / 16u);
            let db = blk % (DP / 16u);
            var c = coop_mat16x16<f32, C>();
            for (var kk = 0u; kk < BC / 16u; kk++) {
                let pa = coopLoadT<coop_mat16x16<f16, A>>(&ps[rb * 16u * BC + kk * 16u], BC);
                let vb = coopLoadT<coop_mat16x16<f16, B>>(&vs[kk * 16u * DP + db * 16u], DP);
                c = coopMultiplyAdd(pa, vb, c);
            }
            coopStoreT(c, &fs[rb * 16u * DP + db * 16u], DP);
        }
        workgroupBarrier();
        // summed apart, then folded in
        var o = array<f32, DPR>();
        if (masked) {
            for (var c = 0u; c < BC; c++) {
                let p = f32(ps[r * BC + c]);
                for (var k = 0u; k < DPR; k++) {
                    o[k] = add_weighted(o[k], p, f32(vs[c * DP + part + k * TPR]), true);
                }
            }
        } else {
            for (var k = 0u; k < DPR; k++) {
                o[k] = fs[r * DP + part + k * TPR];
            }
        }
        for (var k = 0u; k < DPR; k++) {
            acc[k] += o[k];
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
        let inv_l = row_normalizer(l);
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
