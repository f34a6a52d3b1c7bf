// Standard attention backward, step 4: dV = P^T dO and dK = scale * dS^T Q, each summed over
// the query heads of the kv head's group. One thread per (dK, dV) element pair of the chunk's
// kv slices (DW of them a key: dK's dims and dV's, the wider of the two rows where the values'
// head dim differs); P and dS are read back from global memory.

const DW: u32 = max(HEAD_DIM, HEAD_DIM_V);
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let d = e % DW;
    let jrow = (e / DW) % params.seq_kv;
    let kv_slice = params.slice_base / params.group + e / (DW * params.seq_kv);
    let has_k = d < HEAD_DIM;
    let has_v = d < HEAD_DIM_V;
    let hk = kv_slice % params.heads_kv;
    let b = kv_slice / params.heads_kv;
    var acc_dk = 0.0;
    var acc_dv = 0.0;
    for (var g = 0u; g < params.group; g++) {
        let h = hk * params.group + g;
        begin_head(b, h);
        let local = b * params.heads_q + h - params.slice_base;
        let pb = local * params.seq_q * params.seq_kv + jrow;
        for (var i = 0u; i < params.seq_q; i++) {
            if (has_v) {
                let pz = probs[pb + i * params.seq_kv] * dropout_scale(i, jrow);
                acc_dv = add_weighted(acc_dv, pz, load_d_out(dout_at(b, i, h, d)), true);
            }
            if (has_k) {
                let g = ds[pb + i * params.seq_kv];
                acc_dk = add_weighted(acc_dk, g, load_q(q_at(b, i, h, d)), true);
            }
        }
    }
    if (has_k) {
        store_dk(kv_index(b, jrow, hk, d), acc_dk * params.scale);
    }
    if (has_v) {
        store_dv(v_index(b, jrow, hk, d), acc_dv);
    }
}
