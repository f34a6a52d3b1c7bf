// Cast: dst = src rounded to the element type, one thread per element. The one kernel whose
// whole job is the prelude's store function; tests compare its bits with the host's rounding.
// Grid: ceil(total_items / 64) workgroups, folded.

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
    store_dst(e, src[e]);
}
