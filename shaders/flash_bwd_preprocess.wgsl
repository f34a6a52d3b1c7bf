// Backward preprocess, one thread per (batch, head, query row): delta_i = rowsum(dO_i * O_i),
// stored beside the row's lse in the exp2 domain as the pair the backward kernels read.
// Grid: ceil(batch * heads_q * seq_q / 64) workgroups, folded.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
fn item(e: u32) {
    let i = e % params.seq_q;
    let h = (e / params.seq_q) % params.heads_q;
    let b = e / (params.seq_q * params.heads_q);
    let base_do = dout_at(b, i, h, 0u);
    let base_o = out_at(b, i, h, 0u);
    var acc = 0.0;
    for (var d = 0u; d < HEAD_DIM_V; d++) {
        acc = fma(load_out(base_o + d), load_d_out(base_do + d), acc);
    }
    lse_delta[pair_index(b, h, i)] = vec2<f32>(lse_to_log2(lse[row_index(b, h, i)]), acc);
}
