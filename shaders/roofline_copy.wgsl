// Roofline probe: global-memory bandwidth. A grid-stride vec4 copy of `total_items` vec4s;
// bytes moved = 2 * 16 * total_items. Grid: slice_count workgroups of 256.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let stride = nwg.x * nwg.y * 256u;
    for (var e = linear_workgroup(wid, nwg) * 256u + t; e < params.total_items; e += stride) {
        dst[e] = src[e];
    }
}
