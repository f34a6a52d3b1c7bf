// Standard attention backward, step 4: dV = P^T dO and dK = scale * dS^T Q, each summed over
// the query heads of the kv head's group. One thread per (dK, dV) element pair of the chunk's
// kv slices; P and dS are read back from global memory.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let d = e % HEAD_DIM;
    let jrow = (e / HEAD_DIM) % params.seq_kv;
    let kv_slice = params.slice_base / params.group + e / (HEAD_DIM * params.seq_kv);
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
            let o_do = dout_at(b, i, h, d);
            let o_q = q_at(b, i, h, d);
            let pz = probs[pb + i * params.seq_kv] * dropout_scale(i, jrow);
            acc_dv = add_weighted(acc_dv, pz, load_d_out(o_do), CAUSAL());
            acc_dk = add_weighted(acc_dk, ds[pb + i * params.seq_kv], load_q(o_q), CAUSAL());
        }
    }
    let o = kv_index(b, jrow, hk, d);
    store_dk(o, acc_dk * params.scale);
    store_dv(o, acc_dv);
}
