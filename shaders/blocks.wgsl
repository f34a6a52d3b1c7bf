// Shared by the "blocks" kernels (register micro-tiles for GPUs): the thread layout, the
// workgroup-memory row layout, and the two micro-tile products every attention matmul is made
// of. Each blocks kernel declares `sm`, its vec4 workgroup array, and places its tiles in it
// at offsets (in vec4 units); the functions here read it.
//
// Threads: NT = NTY x NTX, thread t = (ty, tx) = (t / NTX, t % NTX). Of the workgroup's
//          resident rows (queries, or keys for dK/dV) a thread owns TM consecutive ones,
//          ty * TM + i. Of each streamed tile's rows it owns TN interleaved ones, tx + j * NTX,
//          and of the head dims the vec4 groups tx + k * NTX (GPT of them).
// Rows:    a tile of rows is stored row-major in vec4 units with row stride RS = D4 | 1, odd, so
//          the eight 16-byte reads a quarter-warp issues (eight consecutive rows at one group,
//          or eight consecutive groups of one row) fall in eight different bank quads.
// Weights: a [resident][streamed] tile of P or dS is stored row-major in vec4 units, WS per row.
// Reuse:   `dot_tile` reads TM + TN vec4s per 4 * TM * TN FMAs; `weighted_rows` reads TM + 4 GPT
//          vec4s per 16 * TM * GPT FMAs (docs/PERFORMANCE.md has the model).

const NTX: u32 = TPR;               // threads across the streamed rows and the head dims
const NTY: u32 = NT / TPR;          // threads down the resident rows
const TM: u32 = RPT;                // resident rows per thread
const TN: u32 = CPT;                // streamed rows per thread
const NS: u32 = TN * NTX;           // streamed rows per tile
const D4: u32 = (HEAD_DIM + 3u) / 4u;
const RS: u32 = D4 | 1u;
const GPT: u32 = (D4 + NTX - 1u) / NTX;
const WS: u32 = (NS + 3u) / 4u;
// the same for rows of values, outputs and their gradients, HEAD_DIM_V wide (HEAD_DIM but where
// a call's values have a head dim of their own)
const D4V: u32 = (HEAD_DIM_V + 3u) / 4u;
const RSV: u32 = D4V | 1u;
const GPTV: u32 = (D4V + NTX - 1u) / NTX;

// acc + a . b summed in order of the head dims, one fma each, as every kernel sums dot
// products: dP = dO . v then equals delta = dO . out bit for bit where out is a single key's v
// (a one-hot softmax), so dS = P (dP - delta) is exactly 0 there, as it is in exact arithmetic
// (`dot` may sum in any order; at a huge softmax_scale the difference would overflow dq).
fn fma_chain4(a: vec4<f32>, b: vec4<f32>, acc: f32) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
}

// s[i][j] = row (ty * TM + i) of the tile at `a` . row (tx + j * NTX) of the tile at `b`: rows
// of q and k (D4 groups at stride RS).
fn dot_tile(a: u32, b: u32, ty: u32, tx: u32) -> array<array<f32, TN>, TM> {
    return dot_rows(a, b, ty, tx, D4, RS);
}

// dot_tile over rows of values and output gradients (D4V groups at stride RSV).
fn dot_tile_v(a: u32, b: u32, ty: u32, tx: u32) -> array<array<f32, TN>, TM> {
    return dot_rows(a, b, ty, tx, D4V, RSV);
}

fn dot_rows(a: u32, b: u32, ty: u32, tx: u32, d4: u32, rs: u32) -> array<array<f32, TN>, TM> {
    var s = array<array<f32, TN>, TM>();
    for (var g = 0u; g < d4; g++) {
        var av = array<vec4<f32>, TM>();
        for (var i = 0u; i < TM; i++) {
            av[i] = sm[a + (ty * TM + i) * rs + g];
        }
        for (var j = 0u; j < TN; j++) {
            let bv = sm[b + (tx + j * NTX) * rs + g];
            for (var i = 0u; i < TM; i++) {
                s[i][j] = fma_chain4(av[i], bv, s[i][j]);
            }
        }
    }
    return s;
}

// Stores a thread's micro-tile w[i][j] into the weight tile at `w`.
fn store_weights(w: u32, x: array<array<f32, TN>, TM>, ty: u32, tx: u32) {
    for (var i = 0u; i < TM; i++) {
        for (var j = 0u; j < TN; j++) {
            let c = tx + j * NTX;
            sm[w + (ty * TM + i) * WS + c / 4u][c % 4u] = x[i][j];
        }
    }
}

// acc[i][k] += sum over streamed rows c of W[ty * TM + i][c] * X[c][group tx + k * NTX], from
// the weight tile at `w` and the row tile at `x`. With `guard` (a tile with hidden pairs), a zero
// weight skips its row's products, so a hidden pair never carries its value in (0 * NaN): a
// branch a weight, the row's X groups read again for each resident row (TM times the reads, in
// those tiles only). Without, plain FMAs: a select an element kept both values live and cost
// Adreno's ir3 spills (docs/log/compilers.md, "2026-12-08"). A NaN weight is no zero and carries
// its NaN in: `!(w == 0.0)`, as `w != 0.0` may compile to an ordered compare that drops it.
fn weighted_rows(acc: ptr<function, array<array<vec4<f32>, GPT>, TM>>, w: u32, x: u32, ty: u32, tx: u32, guard: bool) {
    if (guard) {
        for (var c4 = 0u; c4 < WS; c4++) {
            for (var i = 0u; i < TM; i++) {
                let wv = sm[w + (ty * TM + i) * WS + c4];
                for (var cc = 0u; cc < 4u; cc++) {
                    let c = c4 * 4u + cc;
                    if (c < NS && !(wv[cc] == 0.0)) {
                        for (var k = 0u; k < GPT; k++) {
                            let xv = sm[x + c * RS + min(tx + k * NTX, D4 - 1u)];
                            (*acc)[i][k] = fma(vec4<f32>(wv[cc]), xv, (*acc)[i][k]);
                        }
                    }
                }
            }
        }
        return;
    }
    for (var c4 = 0u; c4 < WS; c4++) {
        var wv = array<vec4<f32>, TM>();
        for (var i = 0u; i < TM; i++) {
            wv[i] = sm[w + (ty * TM + i) * WS + c4];
        }
        for (var cc = 0u; cc < 4u; cc++) {
            let c = c4 * 4u + cc;
            if (c < NS) {
                for (var k = 0u; k < GPT; k++) {
                    let xv = sm[x + c * RS + min(tx + k * NTX, D4 - 1u)];
                    for (var i = 0u; i < TM; i++) {
                        (*acc)[i][k] = fma(vec4<f32>(wv[i][cc]), xv, (*acc)[i][k]);
                    }
                }
            }
        }
    }
}

// weighted_rows over a tile of value rows (D4V groups at stride RSV) into GPTV groups a row.
fn weighted_rows_v(acc: ptr<function, array<array<vec4<f32>, GPTV>, TM>>, w: u32, x: u32, ty: u32, tx: u32, guard: bool) {
    if (guard) {
        for (var c4 = 0u; c4 < WS; c4++) {
            for (var i = 0u; i < TM; i++) {
                let wv = sm[w + (ty * TM + i) * WS + c4];
                for (var cc = 0u; cc < 4u; cc++) {
                    let c = c4 * 4u + cc;
                    if (c < NS && !(wv[cc] == 0.0)) {
                        for (var k = 0u; k < GPTV; k++) {
                            let xv = sm[x + c * RSV + min(tx + k * NTX, D4V - 1u)];
                            (*acc)[i][k] = fma(vec4<f32>(wv[cc]), xv, (*acc)[i][k]);
                        }
                    }
                }
            }
        }
        return;
    }
    for (var c4 = 0u; c4 < WS; c4++) {
        var wv = array<vec4<f32>, TM>();
        for (var i = 0u; i < TM; i++) {
            wv[i] = sm[w + (ty * TM + i) * WS + c4];
        }
        for (var cc = 0u; cc < 4u; cc++) {
            let c = c4 * 4u + cc;
            if (c < NS) {
                for (var k = 0u; k < GPTV; k++) {
                    let xv = sm[x + c * RSV + min(tx + k * NTX, D4V - 1u)];
                    for (var i = 0u; i < TM; i++) {
                        (*acc)[i][k] = fma(vec4<f32>(wv[i][cc]), xv, (*acc)[i][k]);
                    }
                }
            }
        }
    }
}

// Stages keys [kv0, kv0 + n) of k (times k_scale) and v (batch b, kv head hk) as rows at
// sm[ok] (stride RS) and sm[ov] (stride RSV): zeros past seq_kv (load4 zeroes the dims past
// each row's). Where the values' dims differ, k and v are staged one after the other.
fn stage_kv(ok: u32, ov: u32, b: u32, hk: u32, kv0: u32, n: u32, t: u32, k_scale: f32) {
    if (D4 != D4V) {
        for (var e = t; e < n * D4; e += NT) {
            let j = kv0 + e / D4;
            var kx = vec4<f32>();
            if (j < params.seq_kv) {
                kx = load4_k(k_at(b, j, hk, 0u), e % D4) * k_scale;
            }
            sm[ok + (e / D4) * RS + e % D4] = kx;
        }
        for (var e = t; e < n * D4V; e += NT) {
            let j = kv0 + e / D4V;
            var vx = vec4<f32>();
            if (j < params.seq_kv) {
                vx = load4_v(v_at(b, j, hk, 0u), e % D4V);
            }
            sm[ov + (e / D4V) * RSV + e % D4V] = vx;
        }
        return;
    }
    for (var e = t; e < n * D4; e += NT) {
        let c = e / D4;
        let g = e % D4;
        let j = kv0 + c;
        var kx = vec4<f32>();
        var vx = vec4<f32>();
        if (j < params.seq_kv) {
            let base_k = k_at(b, j, hk, 0u);
            let base_v = v_at(b, j, hk, 0u);
            kx = load4_k(base_k, g) * k_scale;
            vx = load4_v(base_v, g);
        }
        sm[ok + c * RS + g] = kx;
        sm[ov + c * RS + g] = vx;
    }
}
