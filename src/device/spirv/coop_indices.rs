//! The coop fragments' first elements, unclamped.
//!
//! naga's bounds-check policy `Restrict` clamps every index into a workgroup array to the
//! array's last element (`UMin(i, len - 1)`), the index of each `coopLoad` / `coopStore` base
//! included. For a fragment that clamp guards nothing: it bounds the fragment's first element
//! only, and the load or store reaches CF rows at the stride past it, which no clamp covers.
//! What it does cost is measured (docs/log/compilers.md, "The coop loads, wide"): the driver no
//! longer knows the base's alignment, and loads every A fragment in realigned 32-bit pairs (ACO:
//! `ds_load_2addr_b32` and `v_alignbyte_b32`, where the same bytes are two `ds_load_b128`).
//! The coop kernels' fragment bases are tile offsets bounded by the tile constants
//! (shaders/coop.wgsl); every other index keeps its clamp.

use super::words::{
    instructions, literal, GLSL_UMIN, OP_ACCESS_CHAIN, OP_COOPERATIVE_MATRIX_LOAD_KHR,
    OP_COOPERATIVE_MATRIX_STORE_KHR, OP_EXT_INST, OP_EXT_INST_IMPORT, OP_IN_BOUNDS_ACCESS_CHAIN,
    OP_VARIABLE, STORAGE_CLASS_WORKGROUP,
};

/// `words` (a valid module) with each cooperative-matrix load's and store's pointer into a
/// workgroup array indexed by the clamp's operand instead of the clamp (`UMin(i, c)` becomes
/// `i`); returns how many indices it rewrote, or why `words` is no module. The clamps stay,
/// dead, for the driver to drop.
pub(super) fn unclamp_coop_bases(words: &mut [u32]) -> Result<usize, String> {
    let insts = instructions(words)?;
    let mut glsl = None;
    let mut workgroup_vars = Vec::new();
    let mut clamped = std::collections::HashMap::new();
    let mut coop_pointers = std::collections::HashSet::new();
    for &(at, len) in &insts {
        let w = &words[at..at + len];
        match w[0] & 0xffff {
            OP_EXT_INST_IMPORT if literal(&w[2..]) == "GLSL.std.450" => glsl = Some(w[1]),
            OP_VARIABLE if w.get(3) == Some(&STORAGE_CLASS_WORKGROUP) => workgroup_vars.push(w[2]),
            // [type, result, set, instruction, x, bound]
            OP_EXT_INST if len == 7 && Some(w[3]) == glsl && w[4] == GLSL_UMIN => {
                clamped.insert(w[2], w[5]);
            }
            // [type, result, pointer, ...] and [pointer, object, ...]
            OP_COOPERATIVE_MATRIX_LOAD_KHR if len > 3 => {
                coop_pointers.insert(w[3]);
            }
            OP_COOPERATIVE_MATRIX_STORE_KHR if len > 2 => {
                coop_pointers.insert(w[1]);
            }
            _ => {}
        }
    }
    let mut rewritten = 0;
    for &(at, len) in &insts {
        let op = words[at] & 0xffff;
        // [type, result, base, indices...]
        if (op == OP_ACCESS_CHAIN || op == OP_IN_BOUNDS_ACCESS_CHAIN)
            && len > 4
            && coop_pointers.contains(&words[at + 2])
            && workgroup_vars.contains(&words[at + 3])
        {
            for index in &mut words[at + 4..at + len] {
                if let Some(&x) = clamped.get(index) {
                    *index = x;
                    rewritten += 1;
                }
            }
        }
    }
    Ok(rewritten)
}
