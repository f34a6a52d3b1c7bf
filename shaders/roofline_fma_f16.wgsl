// Roofline probe: f16 FMA throughput, as roofline_fma.wgsl with vec4<f16> chains (64 f16
// FLOPs per iteration). Needs SHADER_F16; the generated prelude enables f16 for it.
// Grid: workgroups of 256. Bindings 1..: declared by the generated prelude from
// Kernel::bindings (src/kernels/mod.rs).

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let id = linear_workgroup(wid, nwg) * 256u + t;
    let x = f16(f32(id & 255u) * 1.0e-4);
    let m = vec4<f16>(0.999h, 0.998h, 0.997h, 0.996h) + x;
    let c = vec4<f16>(0.001h, 0.002h, 0.003h, 0.004h);
    var a0 = vec4<f16>(x);
    var a1 = a0 + 0.1h;
    var a2 = a0 + 0.2h;
    var a3 = a0 + 0.3h;
    var a4 = a0 + 0.4h;
    var a5 = a0 + 0.5h;
    var a6 = a0 + 0.6h;
    var a7 = a0 + 0.7h;
    for (var it = 0u; it < params.total_items; it++) {
        a0 = fma(a0, m, c);
        a1 = fma(a1, m, c);
        a2 = fma(a2, m, c);
        a3 = fma(a3, m, c);
        a4 = fma(a4, m, c);
        a5 = fma(a5, m, c);
        a6 = fma(a6, m, c);
        a7 = fma(a7, m, c);
    }
    let s = vec4<f32>(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
    sink[id] = s.x + s.y + s.z + s.w;
}
