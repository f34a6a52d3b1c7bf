// Shared by the coop kernels (cooperative matrices of CF x CF x CF, f16 operands and f32
// accumulators; the prelude sets CF, 16 or 8, and the fragment types CoopA, CoopB, CoopC from
// the adapter's offer): the matrix products, shared out by subgroup, and the scalar pieces
// around them. Each coop kernel declares `hs` (f16 operands, rows of DP head dims or of a tile's
// columns) and `fs` (f32 products) in workgroup memory and places its tiles there at offsets.
//
// Products: `coop_nt` (A B^T: both operands given as rows, as Q K^T) and `coop_nn` (A B with B
//           row-major, as P V). Subgroup g of the workgroup takes the CF x CF output blocks g,
//           g + num_subgroups, ...: no subgroup size is assumed. Every pointer index is bound
//           to a `let` first (naga 30's SPIR-V writer panics on an inline one beside a
//           runtime stride).
// Scalar:  invocation t owns row t / TPR of the workgroup's resident rows, and of it the head
//          dims (or columns) t % TPR + k * TPR.

const DP: u32 = (HEAD_DIM + CF - 1u) / CF * CF; // head dims padded to whole blocks
const DPR: u32 = DP / TPR;                      // head dims per invocation

// fs[out + m * ldo + n] = sum over k < inner of A[m][k] B[n][k], for the mb x nb blocks; A rows
// at hs[a] (stride lda), B rows at hs[b] (stride ldb).
fn coop_nt(a: u32, lda: u32, b: u32, ldb: u32, inner: u32, mb: u32, nb: u32, out: u32, ldo: u32, sg: u32, nsg: u32) {
    for (var blk = sg; blk < mb * nb; blk += nsg) {
        let i = blk / nb;
        let j = blk % nb;
        var c = CoopC();
        for (var kk = 0u; kk < inner; kk += CF) {
            let ai = a + i * CF * lda + kk;
            let bi = b + j * CF * ldb + kk;
            let x = coopLoadT<CoopA>(&hs[ai], lda);
            let y = coopLoad<CoopB>(&hs[bi], ldb);
            c = coopMultiplyAdd(x, y, c);
        }
        let oi = out + i * CF * ldo + j * CF;
        coopStoreT(c, &fs[oi], ldo);
    }
}

// fs[out + m * ldo + n] = sum over k < inner of A[m][k] B[k][n], for the mb x nb blocks; A rows
// at hs[a] (stride lda), B row-major at hs[b] (stride ldb).
fn coop_nn(a: u32, lda: u32, b: u32, ldb: u32, inner: u32, mb: u32, nb: u32, out: u32, ldo: u32, sg: u32, nsg: u32) {
    for (var blk = sg; blk < mb * nb; blk += nsg) {
        let i = blk / nb;
        let j = blk % nb;
        var c = CoopC();
        for (var kk = 0u; kk < inner; kk += CF) {
            let ai = a + i * CF * lda + kk;
            let bi = b + kk * ldb + j * CF;
            let x = coopLoadT<CoopA>(&hs[ai], lda);
            let y = coopLoadT<CoopB>(&hs[bi], ldb);
            c = coopMultiplyAdd(x, y, c);
        }
        let oi = out + i * CF * ldo + j * CF;
        coopStoreT(c, &fs[oi], ldo);
    }
}

// Staging in chunks: an invocation takes SW consecutive head dims of a row a trip, so the row's
// address is computed once for SW elements (the element-wise loop spent ~50 instructions a
// subgroup on each pair of elements: half a KV block's instructions on ACO), and its SW loads
// are consecutive. DP is a multiple of CF (8 or 16), so of SW too.
const SW: u32 = 8u;
const DC: u32 = DP / SW;                        // chunks a row

// Stages keys [kv0, kv0 + n) of k and v (batch b, kv head hk) as f16 rows of DP dims at
// hs[ok] and hs[ov]: zeros past seq_kv and past HEAD_DIM. Every coop kernel binds k and v.
fn stage_kv(ok: u32, ov: u32, b: u32, hk: u32, kv0: u32, n: u32, t: u32) {
    for (var e = t; e < n * DC; e += NT) {
        let j = kv0 + e / DC;
        let d0 = (e % DC) * SW;
        var kx = array<f16, SW>();
        var vx = array<f16, SW>();
        if (j < params.seq_kv) {
            let g_k = k_at(b, j, hk, d0);
            let g_v = v_at(b, j, hk, d0);
            if (d0 + SW <= HEAD_DIM) {
                // a whole chunk: SW loads without a branch between them
                for (var c = 0u; c < SW; c++) {
                    kx[c] = f16(load_k(g_k + c));
                    vx[c] = f16(load_v(g_v + c));
                }
            } else if (HEAD_DIM % SW != 0u) {
                // the row's last, partial chunk (compiled only where the head dim has one)
                for (var c = 0u; c < SW; c++) {
                    if (d0 + c < HEAD_DIM) {
                        kx[c] = f16(load_k(g_k + c));
                        vx[c] = f16(load_v(g_v + c));
                    }
                }
            }
        }
        for (var c = 0u; c < SW; c++) {
            let at = e * SW + c;
            hs[ok + at] = kx[c];
            hs[ov + at] = vx[c];
        }
    }
}

// This invocation's head dims of row `row` of an f32 product [rows][DP] at fs[out].
fn product_row(out: u32, row: u32, part: u32) -> array<f32, DPR> {
    var o = array<f32, DPR>();
    for (var k = 0u; k < DPR; k++) {
        o[k] = fs[out + row * DP + part + k * TPR];
    }
    return o;
}

// Of the n rows from `first` on, those below `len`.
fn rows_in(first: u32, n: u32, len: u32) -> u32 {
    return min(n, len - min(first, len));
}

// The same product row computed in scalar code, for tiles with hidden pairs: sum over c < n of
// W[row][c] X[c][d] with W at hs[w] (stride ldw) and X rows at hs[x] (stride DP), through
// add_weighted, so a hidden pair's zero weight never carries its row's NaN or Inf in (a matrix
// product would: 0 * NaN). Callers pass n = the tile's rows that exist (`rows_in`): past them
// every weight is 0, and a run-time n keeps this a loop where a tile constant let compilers
// unroll it into every tile's code (ACO 26.1: a third of a KV block's instructions).
fn guarded_row(w: u32, ldw: u32, x: u32, n: u32, row: u32, part: u32) -> array<f32, DPR> {
    var o = array<f32, DPR>();
    for (var c = 0u; c < n; c++) {
        let wc = f32(hs[w + row * ldw + c]);
        for (var k = 0u; k < DPR; k++) {
            o[k] = add_weighted(o[k], wc, f32(hs[x + c * DP + part + k * TPR]), true);
        }
    }
    return o;
}
