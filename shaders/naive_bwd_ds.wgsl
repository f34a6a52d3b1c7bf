// Standard attention backward, step 3: dS = P * (dP - delta), written over dP.
// One thread per element.
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
    let row = e / params.seq_kv;
    let at = slice_row(row);
    ds[e] = score_grad(probs[e], ds[e], delta[row_index(at.b, at.h, at.i)]);
}
