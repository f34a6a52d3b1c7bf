// Roofline probe: cooperative-matrix multiply-add throughput, CF x CF x CF (16 or 8, the
// prelude's) with f16 operands and f32 accumulators (what the coop kernels use). Each subgroup
// runs `total_items` iterations of 4 independent coopMultiplyAdd chains (4 x 2 x CF^3 FLOPs
// per iteration: 32,768 at 16, 4,096 at 8), each with
// an A operand of its own, so that no compiler can fold equal chains into one; the
// invocation 0 of workgroup 0 writes the number of subgroups a workgroup has into sink[0], so
// that the host counts FLOPs without assuming a subgroup size. Grid: workgroups of 128.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

var<workgroup> ta: array<f16, 1024>;
var<workgroup> tb: array<f16, 256>;
var<workgroup> tc: array<f32, 2048>;

@compute @workgroup_size(128)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let w = linear_workgroup(wid, nwg);
    for (var e = t; e < 1024u; e += 128u) {
        // small values: the chains stay finite over any iteration count
        ta[e] = f16(f32((e + w) % 7u) * 1.0e-3);
    }
    for (var e = t; e < 256u; e += 128u) {
        tb[e] = f16(f32(e % 5u) * 1.0e-3);
    }
    workgroupBarrier();
    let a0 = coopLoadT<CoopA>(&ta[0], CF);
    let a1 = coopLoadT<CoopA>(&ta[CF * CF], CF);
    let a2 = coopLoadT<CoopA>(&ta[2u * CF * CF], CF);
    let a3 = coopLoadT<CoopA>(&ta[3u * CF * CF], CF);
    let b = coopLoadT<CoopB>(&tb[0], CF);
    var c0 = CoopC();
    var c1 = CoopC();
    var c2 = CoopC();
    var c3 = CoopC();
    for (var i = 0u; i < params.total_items; i++) {
        c0 = coopMultiplyAdd(a0, b, c0);
        c1 = coopMultiplyAdd(a1, b, c1);
        c2 = coopMultiplyAdd(a2, b, c2);
        c3 = coopMultiplyAdd(a3, b, c3);
    }
    coopStoreT(c0 + c1 + c2 + c3, &tc[(sg % 8u) * CF * CF], CF);
    workgroupBarrier();
    sink[1u + w * 128u + t] = tc[t];
    if (w == 0u && t == 0u) {
        sink[0] = f32(nsg);
    }
}
