// Backward, the attention sinks' gradient: d_sinks[h] = -sum over (batch, query row) of
// exp(sink_h - lse) * delta, where exp(sink_h - lse) is the share of the row's softmax the sink
// took and delta = rowsum(dO * out) (the sink carries no value, so its dP is 0).
// Grid: one workgroup of 64 per query head (total_wg = heads_q), folded. Each invocation sums
// a fixed stride of rows; a fixed-order tree sums the 64 partials: deterministic, no atomics.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let h = linear_workgroup(wid, nwg);
    if (h >= params.total_wg) {
        return;
    }
    begin_head(0u, h);
    var acc = 0.0;
    let rows = params.batch * params.seq_q;
    for (var e = t; e < rows; e += 64u) {
        let pair = lse_delta[pair_index(e / params.seq_q, h, e % params.seq_q)];
        acc += exp2(head_sink2 - pair.x) * pair.y;
    }
    red[t] = acc;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w >>= 1u) {
        if (t < w) {
            red[t] += red[t + w];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        d_sinks[h] = -red[0];
    }
}
