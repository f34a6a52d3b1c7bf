// Decode (FlashDecoding): a few query rows against many keys. One workgroup serves every
// query head that shares a kv head, and every query row of the call, as BR packed rows (GQA
// packing), over one split of the keys (split-KV), so each K/V tile is read once per kv head
// and the keys of one head spread over many workgroups. Each split writes its partial result,
// normalized over its own keys, with its lse (no sink); flash_decode_combine.wgsl merges the
// splits exactly (and adds the sink). A call of one split (FlashDecodeOne) writes out and lse
// itself, finished as the forward kernels finish a row (decode_scale, decode_lse, decode_out:
// the generated prelude's).
//
// Grid:    splits * n_q_tiles * heads_kv * batch workgroups of NT = BC * RG invocations,
//          folded; n_q_tiles chunks of BR packed rows, in RG groups of RPG. Packed row p (of
//          group * seq_q) is query row p / group of query head hk * group + p % group.
// Split s: keys [s * split_keys, (s + 1) * split_keys), within the keys its rows can see
//          (kv_begin_for_rows, kv_end_for_rows), in tiles of BC keys.
// Phases per tile:
//   scores   invocation t takes key kv0 + t % BC and dots it with the q of every packed row
//            of its group t / BC (scaled into the exp2 domain, in workgroup memory: staged
//            once, or for wide heads at many rows QCW vec4s a row at a time, each tile), then
//            finishes each row's score with its head's modifiers and masks (begin_head);
//   softmax  invocation t < BR owns row t's running max and sum, turns its scores into
//            weights (dropout included) and leaves the rescale factor;
//   P V      each invocation owns one column of the output of PR rows (each value read once
//            per row group and tile), over every KP-th key of the tile; the KP partial sums
//            meet at the end.
// More rows a workgroup means fewer workgroups reading each key: MLA's 128 query heads over
// one latent head are 4 workgroups of 32 rows, each latent row read 4 times a step.
// With subgroups (SG > 1, lane = invocation index % SG), the reads every lane of a subgroup
// would make of one address (q in the scores, the weights in P V) are made once per lane and
// handed over with subgroupBroadcast (lanes1, lanes4: the prelude): on CPU drivers each such
// read is a per-lane gather, the broadcast a register permute.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).
// part_out: f32 [splits, batch, seq_q, heads_q, head_dim_v]; part_lse: f32 [splits, batch,
// heads_q, seq_q]; of this dispatch's batches (a window of whole batches binds q, k, v, out and
// lse from their shifts; the partial results are its own).

// q and k rows of D4 vec4s (HEAD_DIM), v and out rows of D4V (HEAD_DIM_V: the values' head
// dim, HEAD_DIM but where a call's differ, as MLA's 576/512)
const D4: u32 = (HEAD_DIM + 3u) / 4u;
const D4V: u32 = (HEAD_DIM_V + 3u) / 4u;
// K and V are read CW vec4s at a time (`loadc_k`, `loadc_v` from the prelude: one wide load
// where rows start on whole words, CW = 2 for halves; one 16-byte word of an 8-bit cache,
// CW = 4), and a column's scale (`colscale_k`, `colscale_v`: 1 but for an 8-bit cache)
// multiplies its dot product or a key's weight once, not each element; a column is CW vec4s,
// DCK of them a k row, DC a v row
const DCK: u32 = D4 / CW;
const DC: u32 = D4V / CW;
// scores: RPG rows a group; q held QCW vec4s a row at a time (all of it where QRES, staged
// once; else a multiple of 4 vec4s, so of CW, staged each tile)
const RPG: u32 = BR / RG;
const QCW: u32 = min(QCHUNK, D4);
const QRES: bool = QCHUNK >= D4;
// P V: invocation t owns column t % DC (dims 4 CW (t % DC) ..) of the PR rows of row group
// (t / DC) % PG over the keys of parity t / DC / PG, among KP parities. PG: the most row
// groups (a power of two, at most RG) that the NT / DC invocations a column cover.
const PGN: u32 = min(RG, max(NT / DC, 1u));
const PG: u32 = select(select(select(1u, 2u, PGN >= 2u), 4u, PGN >= 4u), 8u, PGN >= 8u);
const PR: u32 = BR / PG;
const KP: u32 = max(NT / (DC * PG), 1u);
// with subgroups of SG lanes (the prelude's SG > 1: DC a multiple of SG, so a subgroup's lanes
// share one key parity; q held whole), each lane holds QH of every group row's q vec4s
const QH: u32 = max(select(1u, D4 / SG, SG > 1u), 1u);

// the rows' q (QCW a row), then the parities' partial output columns (QCW a row, a pass at a
// time)
var<workgroup> sq: array<vec4<f32>, BR * QCW>;
var<workgroup> ss: array<f32, BR * BC>;
var<workgroup> s_row: array<f32, BR>;

// The query row and head of packed row p of the call's (batch, kv head).
struct PackedRow {
    i: u32,
    h: u32,
}

fn packed_row(hk: u32, p: u32) -> PackedRow {
    return PackedRow(p / params.group, hk * params.group + p % params.group);
}

// The rows' q vec4s c0 .. c0 + QCW into sq (every invocation's share), scaled into the exp2
// domain; 0 past the call's rows and past D4.
fn stage_q(b: u32, hk: u32, p0: u32, c0: u32, t: u32) {
    let rows = params.group * params.seq_q;
    for (var e = t; e < BR * QCW; e += NT) {
        let p = p0 + e / QCW;
        let c = c0 + e % QCW;
        var x = vec4<f32>();
        if (p < rows && c < D4) {
            let pr = packed_row(hk, p);
            x = load4_q(q_at(b, pr.i, pr.h, 0u), c) * params.scale_log2;
        }
        sq[e] = x;
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
    let hk = wg % params.heads_kv;
    let rest = wg / params.heads_kv;
    let split = rest % params.splits;
    let rest2 = rest / params.splits;
    let chunk = rest2 % params.n_q_tiles;
    let b = rest2 / params.n_q_tiles;
    let rows = params.group * params.seq_q;
    let p0 = chunk * BR;
    let p_end = min(p0 + BR, rows);
    // scores: this invocation's key of each tile and its group's first row (0 where one
    // group: `% RG` lets the compiler see it, so the q reads stay uniform)
    let kk = t % BC;
    let r0 = t / BC % RG * RPG;

    if (QRES) {
        stage_q(b, hk, p0, 0u, t);
    }

    // with subgroups: this lane's share of its group's rows' q, every SG-th vec4 from its
    // lane's
    workgroupBarrier();
    var qh = array<array<vec4<f32>, QH>, RPG>();
    if (SG > 1u && QRES) {
        for (var r = 0u; r < RPG; r++) {
            for (var k = 0u; k < QH; k++) {
                qh[r][k] = sq[(r0 + r) * QCW + k * SG + t % SG];
            }
        }
    }

    // row t's running max and sum (t < BR), and this invocation's column of its PV rows
    var m = running_max_start();
    var l = 0.0;
    var acc = array<array<vec4<f32>, CW>, PR>();
    let col = t % DC + select(DC, 0u, t / DC < PG * KP);
    let pr0 = (t / DC) % PG * PR;
    let kp = t / DC / PG;

    // the keys the chunk's rows can see, cut to this split
    let i_first = p0 / params.group;
    let i_last = (p_end - 1u) / params.group;
    let split_lo = split * params.split_keys;
    let lo = max(kv_begin_for_rows(b, i_first), split_lo);
    let hi = min(kv_end_for_rows(b, i_first, i_last + 1u), split_lo + params.split_keys);
    for (var kv0 = lo; kv0 < hi; kv0 += BC) {
        // the tile as its rows see it: skipped when every row's head skips it (block mask),
        // masked when any row needs the mask, or the tile crosses the split's end
        var skip = true;
        var masked = kv0 + BC > hi;
        var all_on = true;
        for (var p = p0; p < p_end; p++) {
            let pr = packed_row(hk, p);
            let visit = tile_visit(b, pr.h, pr.i, 1u, kv0, BC);
            skip = skip && visit.skip;
            masked = masked || visit.masked;
            all_on = all_on && tile_blocks_on;
        }
        tile_blocks_on = all_on;
        if (skip) {
            continue;
        }
        workgroupBarrier();

        // scores: key kv0 + kk against every row of this invocation's group, over q's chunks
        let j = kv0 + kk;
        var x = array<f32, RPG>();
        for (var c0 = 0u; c0 < D4; c0 += QCW) {
            if (!QRES) {
                workgroupBarrier();
                stage_q(b, hk, p0, c0, t);
                workgroupBarrier();
            }
            if (SG > 1u && QRES) {
                // q from the lanes' registers (lanes4), every lane reading its own key (keys
                // past hi read the last one; finish below hides them); q held whole
                let base_k = k_at(b, min(j, hi - 1u), hk, 0u);
                for (var g0 = 0u; g0 < D4; g0 += SG) {
                    var qs = array<array<vec4<f32>, SG>, RPG>();
                    for (var r = 0u; r < RPG; r++) {
                        qs[r] = lanes4(qh[r][g0 / SG]);
                    }
                    for (var u = 0u; u < SG; u += CW) {
                        let kv = loadc_k(base_k, (g0 + u) / CW);
                        let ks = colscale_k(base_k, (g0 + u) / CW);
                        for (var r = 0u; r < RPG; r++) {
                            var d = 0.0;
                            for (var w = 0u; w < CW; w++) {
                                d += dot(qs[r][u + w], kv[w]);
                            }
                            x[r] = fma(d, ks, x[r]);
                        }
                    }
                }
            } else if (j < hi) {
                let base_k = k_at(b, j, hk, 0u);
                let g_end = min(c0 + QCW, D4) / CW;
                for (var g = c0 / CW; g < g_end; g++) {
                    let kv = loadc_k(base_k, g);
                    let ks = colscale_k(base_k, g);
                    let at = g * CW - c0;
                    for (var r = 0u; r < RPG; r++) {
                        var d = 0.0;
                        for (var w = 0u; w < CW; w++) {
                            d += dot(sq[(r0 + r) * QCW + at + w], kv[w]);
                        }
                        x[r] = fma(d, ks, x[r]);
                    }
                }
            }
        }
        for (var r = 0u; r < RPG; r++) {
            var s = masked_score();
            let p = p0 + r0 + r;
            if (p < rows && j < hi) {
                let pr = packed_row(hk, p);
                begin_head(b, pr.h);
                s = finish_score(x[r], pr.i, j, masked);
            }
            ss[(r0 + r) * BC + kk] = s;
        }
        workgroupBarrier();

        // softmax: row t's weights, its running max and sum, its rescale factor
        if (t < BR) {
            var alpha = 1.0;
            if (p0 + t < rows) {
                let pr = packed_row(hk, p0 + t);
                begin_head(b, pr.h);
                var m_tile = m;
                for (var c = 0u; c < BC; c++) {
                    m_tile = max(m_tile, ss[t * BC + c]);
                }
                let om = online_max(m, m_tile);
                alpha = om.alpha;
                m = om.m;
                var l_tile = 0.0;
                for (var c = 0u; c < BC; c++) {
                    let w = softmax_weight(ss[t * BC + c], m);
                    l_tile += w;
                    ss[t * BC + c] = w * dropout_scale(pr.i, kv0 + c);
                }
                l = fma(alpha, l, l_tile);
            } else {
                for (var c = 0u; c < BC; c++) {
                    ss[t * BC + c] = 0.0;
                }
            }
            s_row[t] = alpha;
        }
        workgroupBarrier();

        // P V: column col of the PV rows, over the tile's keys of this invocation's parity
        let n_keys = min(BC, hi - kv0);
        for (var r = 0u; r < PR; r++) {
            for (var w = 0u; w < CW; w++) {
                acc[r][w] *= s_row[pr0 + r];
            }
        }
        if (SG > 1u) {
            // each lane reads the weights of one key of its parity, and the subgroup's lanes
            // hand them to each other (lanes1): SG keys per read
            for (var c0 = 0u; c0 < n_keys; c0 += KP * SG) {
                let mine = min(c0 + (t % SG) * KP + kp, BC - 1u);
                var ws = array<array<f32, SG>, PR>();
                for (var r = 0u; r < PR; r++) {
                    ws[r] = lanes1(ss[(pr0 + r) * BC + mine]);
                }
                // unguarded reads (a masked load is dearer on CPU drivers): keys past the
                // tile's read its last one with weight 0, columns past DC (never stored) the
                // last column
                for (var u = 0u; u < SG; u++) {
                    let c = c0 + u * KP + kp;
                    let base_v = v_at(b, kv0 + min(c, n_keys - 1u), hk, 0u);
                    let v = loadc_v(base_v, min(col, DC - 1u));
                    let vs = colscale_v(base_v, min(col, DC - 1u));
                    for (var r = 0u; r < PR; r++) {
                        let p = select(0.0, ws[r][u], c < n_keys) * vs;
                        for (var w = 0u; w < CW; w++) {
                            acc[r][w] = add_weighted4(acc[r][w], p, v[w], masked || c >= n_keys);
                        }
                    }
                }
            }
        } else if (col < DC) {
            for (var c = kp; c < n_keys; c += KP) {
                let base_v = v_at(b, kv0 + c, hk, 0u);
                let v = loadc_v(base_v, col);
                let vs = colscale_v(base_v, col);
                for (var r = 0u; r < PR; r++) {
                    for (var w = 0u; w < CW; w++) {
                        acc[r][w] = add_weighted4(
                            acc[r][w],
                            ss[(pr0 + r) * BC + c] * vs,
                            v[w],
                            masked
                        );
                    }
                }
            }
        }
    }

    // the split's partial result: out normalized over its keys, lse over them (no sink).
    // The parities' sums meet in sq (q is no longer needed), QCW vec4s of each row a pass
    // (whole columns: QCW is a multiple of CW), one parity at a time.
    workgroupBarrier();
    if (KP > 1u) {
        for (var c0 = 0u; c0 < D4V; c0 += QCW) {
            let mine = col < DC && col * CW >= c0 && col * CW < c0 + QCW;
            for (var k = 1u; k < KP; k++) {
                if (kp == k && mine) {
                    for (var r = 0u; r < PR; r++) {
                        for (var w = 0u; w < CW; w++) {
                            sq[(pr0 + r) * QCW + col * CW + w - c0] = acc[r][w];
                        }
                    }
                }
                workgroupBarrier();
                if (kp == 0u && mine) {
                    for (var r = 0u; r < PR; r++) {
                        for (var w = 0u; w < CW; w++) {
                            acc[r][w] += sq[(pr0 + r) * QCW + col * CW + w - c0];
                        }
                    }
                }
                workgroupBarrier();
            }
        }
    }
    if (t < BR) {
        var scale = 0.0;
        if (p0 + t < rows) {
            let pr = packed_row(hk, p0 + t);
            begin_head(b, pr.h);
            scale = decode_scale(m, l);
            decode_lse(split, row_index(b, pr.h, pr.i), m, l);
        }
        s_row[t] = scale;
    }
    workgroupBarrier();
    if (kp == 0u && col < DC) {
        for (var r = 0u; r < PR; r++) {
            let p = p0 + pr0 + r;
            if (p < rows) {
                let pr = packed_row(hk, p);
                let base = o_index(b, pr.i, pr.h, 0u);
                for (var w = 0u; w < CW; w++) {
                    let o = acc[r][w] * s_row[pr0 + r];
                    let d0 = 4u * (col * CW + w);
                    for (var c = 0u; c < 4u; c++) {
                        if (d0 + c < HEAD_DIM_V) {
                            decode_out(split, base + d0 + c, o[c]);
                        }
                    }
                }
            }
        }
    }
}
