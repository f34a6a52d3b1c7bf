// Backward preprocess: delta_i = rowsum(dO_i * O_i), one thread per (batch, head, query row).
// Grid: ceil(batch * heads_q * seq_q / 64) workgroups, folded.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let e = linear_workgroup(wid, nwg) * 64u + t;
    if (e >= params.total_items) {
        return;
    }
    let i = e % params.seq_q;
    let h = (e / params.seq_q) % params.heads_q;
    let b = e / (params.seq_q * params.heads_q);
    let base = q_index(b, i, h, 0u);
    var acc = 0.0;
    for (var d = 0u; d < HEAD_DIM; d++) {
        acc = fma(load_out(base + d), load_d_out(base + d), acc);
    }
    delta[e] = acc;
}
