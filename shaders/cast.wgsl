// Cast: dst = src rounded to the element type, one thread per element. The one kernel whose
// whole job is the prelude's store function; tests compare its bits with the host's rounding.
// Grid: ceil(total_items / 64) workgroups, folded.

// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Item e of total_items; the generated entry point calls it once per item (64 per workgroup).
// A windowed cast binds src and dst with the same shift (q_shift) to element 0.
fn item(e: u32) {
    store_dst(e + params.q_shift, src[e + params.q_shift]);
}
