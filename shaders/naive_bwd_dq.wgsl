// Standard attention backward, step 6: dQ = scale * dS K. One thread per dQ element.
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
    let d = e % HEAD_DIM;
    let row = e / HEAD_DIM;
    let at = slice_row(row);
    let hk = at.h / params.group;
    let sb = row * params.seq_kv;
    var acc = 0.0;
    for (var j = 0u; j < params.seq_kv; j++) {
        acc = fma(ds[sb + j], load_k(kv_index(at.b, j, hk, d)), acc);
    }
    store_dq(q_index(at.b, at.i, at.h, d), acc * params.scale);
}
