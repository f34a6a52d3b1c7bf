// FlashAttention backward, dK and dV, "rows" variant: each invocation owns RPT key rows.
//
// Grid:    n_kv_tiles * heads_kv * batch workgroups of BC / RPT invocations, folded.
// Threads: invocation t owns key rows kv0 + t + kk * NT (kk < RPT): their k, v and dK/dV
//          accumulators live in private arrays; Q/dO tiles in workgroup memory are read SG
//          TileVecs at a time and shared across the subgroup with `lane_values` (see
//          flash_fwd_rows.wgsl); each element read serves RPT keys.
// Loop:    every query head of the GQA group, and for each the Q tiles that can see these
//          keys (with CAUSAL, tiles wholly above the diagonal are skipped).
// Math:    P = exp2(s - lse2), dP = dO V^T, dS = P * (dP - delta),
//          dV += P^T dO, dK += scale * dS^T Q.
// No atomics: each workgroup owns its dK/dV rows. 8 storage buffers: the WebGPU default cap.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

var<workgroup> sq: array<TileVec, BR * DPAD_V>;    // Q tile, pre-scaled into the exp2 domain
var<workgroup> sdo: array<TileVec, BR * DPAD_V>;  // dO tile
var<workgroup> slse: array<f32, BR>;         // lse, exp2 domain
var<workgroup> sdelta: array<f32, BR>;
// per invocation: its keys' k and v, and the tile's dK/dV sums
var<private> kr: array<array<f32, DPAD>, RPT>;
var<private> vr: array<array<f32, DPAD>, RPT>;
var<private> dk_tile: array<array<f32, DPAD>, RPT>;
var<private> dv_tile: array<array<f32, DPAD>, RPT>;
// the lane's elements of the current row's q and dO, read by the generated `dots_keys` and kept
// for `add_dkdv` (src/kernels/rows.rs)
var<private> qc: array<TileVec, DPAD_V / SG>;
var<private> dc: array<TileVec, DPAD_V / SG>;

// One Q/dO tile against this invocation's keys: for each of the tile's rows, the scores and dP
// (k . q and v . dO), P and dS, then dV_tile += P dO and dK_tile += dS q. Each lane reads one
// TileVec of a row's q and dO chunk (`sq`/`sdo` reads are per-lane loads, the costly part on
// CPU drivers) and keeps it for the fold, so a row's q and dO are read from workgroup memory
// once, not once for the dots and again for the fold. The tile sums are summed apart (f32
// error on long columns). `guard` (the tile has hidden pairs) is a constant at each call site,
// so the unmasked tiles' fold is plain FMAs.
fn visit_tile(guard: bool, lane: u32, q0: u32, key0: u32) {
    for (var kk = 0u; kk < RPT; kk++) {
        for (var d0 = 0u; d0 < DPAD; d0 += SG) {
            for (var l = 0u; l < SG; l++) {
                dk_tile[kk][d0 + l] = 0.0;
                dv_tile[kk][d0 + l] = 0.0;
            }
        }
    }
    // a row's lse and delta: one per-lane read for SG rows, handed out with lane_value
    for (var r0 = 0u; r0 < BR; r0 += SG) {
        let lse_lanes = slse[min(r0 + lane, BR - 1u)];
        let delta_lanes = sdelta[min(r0 + lane, BR - 1u)];
        for (var r = r0; r < min(r0 + SG, BR); r++) {
            let x = dots_keys(r, lane);
            let lse_r = lane_value(lse_lanes, r - r0);
            let delta_r = lane_value(delta_lanes, r - r0);
            var pr = array<f32, RPT>();
            var dsr = array<f32, RPT>();
            for (var kk = 0u; kk < RPT; kk++) {
                let sc = finish_pair(x[kk], q0 + r, key0 + kk * NT, guard);
                let g = pair_grads(sc, lse_r, x[RPT + kk], delta_r, q0 + r, key0 + kk * NT);
                pr[kk] = g.pz;
                dsr[kk] = g.ds;
            }
            add_dkdv(pr, dsr, guard);
        }
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
    let tile = kv_tile_of(wg, BC);
    let b = pinned(tile.b, 0u);
    let hk = pinned(tile.hk, 1u);
    let kv0 = pinned(tile.kv0, 2u);
    let key0 = kv0 + t;
    let lane = t % SG;

    for (var kk = 0u; kk < RPT; kk++) {
        for (var d0 = 0u; d0 < DPAD; d0 += SG) {
            for (var l = 0u; l < SG; l++) {
                kr[kk][d0 + l] = 0.0;
                vr[kk][d0 + l] = 0.0;
            }
        }
        let key = key0 + kk * NT;
        if (key < params.seq_kv) {
            let base_k = k_at(b, key, hk, 0u);
            let base_v = v_at(b, key, hk, 0u);
            for (var d = 0u; d < row_dims(); d++) {
                kr[kk][d] = load_k(base_k + d);
                vr[kk][d] = load_v(base_v + d);
            }
        }
    }
    var acc_dk = array<array<f32, DPAD>, RPT>();
    var acc_dv = array<array<f32, DPAD>, RPT>();
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
            workgroupBarrier();
            for (var e = t; e < BR * DPAD_V; e += NT) {
                let qi = q0 + e / DPAD_V;
                let d = (e % DPAD_V) * VW;
                var qx = TileVec();
                var dox = TileVec();
                if (qi < params.seq_q && d < HEAD_DIM) {
                    qx = load_tile_q(q_at(b, qi, h, d), d) * params.scale_log2;
                    dox = load_tile_d_out(dout_at(b, qi, h, d), d);
                }
                sq[e] = qx;
                sdo[e] = dox;
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
                slse[r] = l2;
                sdelta[r] = dl;
            }
            workgroupBarrier();

            if (masked) {
                visit_tile(true, lane, q0, key0);
            } else {
                visit_tile(false, lane, q0, key0);
            }
            for (var kk = 0u; kk < RPT; kk++) {
                for (var d0 = 0u; d0 < DPAD; d0 += SG) {
                    for (var l = 0u; l < SG; l++) {
                        acc_dk[kk][d0 + l] += dk_tile[kk][d0 + l];
                        acc_dv[kk][d0 + l] += dv_tile[kk][d0 + l];
                    }
                }
            }
        }
    }

    for (var kk = 0u; kk < RPT; kk++) {
        let key = key0 + kk * NT;
        if (key < params.seq_kv) {
            let base = kv_index(b, key, hk, 0u);
            // sq held scale * log2(e) * q and dK needs scale * q: multiply log2(e) back out
            for (var d = 0u; d < row_dims(); d++) {
                store_dk(base + d, acc_dk[kk][d] * LN2);
                store_dv(base + d, acc_dv[kk][d]);
            }
        }
    }
}
