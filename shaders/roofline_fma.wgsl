// Roofline probe: FMA throughput in FT (f32, or f16 where the device has SHADER_F16; the
// generated prelude defines FT per kernel). Each invocation runs `total_items` iterations of 8
// independent vec4 FMA chains (64 FLOPs per iteration), so latency is hidden and the loop
// overhead is small next to the arithmetic. Grid: workgroups of 256.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let id = linear_workgroup(wid, nwg) * 256u + t;
    // the constants are f32 and converted once: the f32 probe is exactly the original one
    let x = f32(id) * 1.0e-7;
    let m = vec4<FT>(vec4<f32>(0.999999, 0.999998, 0.999997, 0.999996) + x);
    let c = vec4<FT>(vec4<f32>(1.0e-6, 2.0e-6, 3.0e-6, 4.0e-6));
    var a0 = vec4<FT>(FT(x));
    var a1 = a0 + FT(0.1);
    var a2 = a0 + FT(0.2);
    var a3 = a0 + FT(0.3);
    var a4 = a0 + FT(0.4);
    var a5 = a0 + FT(0.5);
    var a6 = a0 + FT(0.6);
    var a7 = a0 + FT(0.7);
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
