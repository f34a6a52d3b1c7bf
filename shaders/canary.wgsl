// Driver canary: runs a loop of `total_items` iterations in one invocation, counting and
// hashing (an LCG the compiler cannot fold away). Mesa lavapipe before 25 silently stops
// loops after about 65,535 iterations, which would corrupt long attention rows.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

@compute @workgroup_size(1)
fn main() {
    var n = 0u;
    var hash = params.slice_base;
    for (var it = 0u; it < params.total_items; it++) {
        n += 1u;
        hash = hash * 1664525u + 1013904223u;
    }
    counter[0] = n;
    counter[1] = hash;
}
