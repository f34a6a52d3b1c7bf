//! The coop kernels' workgroup indices, unclamped.
//!
//! naga's bounds-check policy `Restrict` clamps every index into a workgroup array to the
//! array's last element (`UMin(i, len - 1)`). In the coop kernels those clamps were a third of
//! a KV block's instructions (ACO's `v_min_u32` beside every LDS access, and the shifts after
//! it), and at a fragment's base they guard nothing (the load reaches CF rows at the stride
//! past the one element the clamp bounds) while they hide the base's alignment, so the driver
//! loads A fragments in realigned 32-bit pairs. Measured (docs/log/compilers.md, "The coop
//! loads, wide" and "The coop kernels per block").
//!
//! So in a module that uses cooperative matrices (the coop kernels), every access into a
//! workgroup array is indexed by the clamp's operand instead of the clamp. Why that is sound
//! there: every workgroup variable of such a module is ours (a user's `score_mod` or
//! `mask_mod` may declare none and name none of ours: `modifiers::user_code`), and the coop
//! kernels index them by tile offsets bounded by the tile constants (shaders/coop.wgsl and its
//! kernels); the coop tests run every coop kernel on lavapipe 26.1 against the f64 reference
//! with lengths off every tile, where an index past its tile would read another tile's data.
//! Every other index (function and private arrays, buffers where the driver does not bound
//! them) keeps its clamp, and modules without cooperative matrices are not touched.

use super::words::{
    instructions, literal, GLSL_UMIN, OP_ACCESS_CHAIN, OP_COOPERATIVE_MATRIX_LOAD_KHR,
    OP_COOPERATIVE_MATRIX_STORE_KHR, OP_EXT_INST, OP_EXT_INST_IMPORT, OP_IN_BOUNDS_ACCESS_CHAIN,
    OP_VARIABLE, STORAGE_CLASS_WORKGROUP,
};

/// `words` (a valid module) with every access chain into a workgroup array indexed by the
/// clamp's operand instead of the clamp (`UMin(i, c)` becomes `i`), where the module has a
/// cooperative-matrix load or store (unchanged otherwise); returns how many indices it
/// rewrote, or why `words` is no module. The clamps stay, dead, for the driver to drop.
pub(super) fn unclamp_workgroup_indices(words: &mut [u32]) -> Result<usize, String> {
    let insts = instructions(words)?;
    let mut glsl = None;
    let mut workgroup_vars = Vec::new();
    let mut clamped = std::collections::HashMap::new();
    let mut coop = false;
    for &(at, len) in &insts {
        let w = &words[at..at + len];
        match w[0] & 0xffff {
            OP_EXT_INST_IMPORT if literal(&w[2..]) == "GLSL.std.450" => glsl = Some(w[1]),
            OP_VARIABLE if w.get(3) == Some(&STORAGE_CLASS_WORKGROUP) => workgroup_vars.push(w[2]),
            // [type, result, set, instruction, x, bound]
            OP_EXT_INST if len == 7 && Some(w[3]) == glsl && w[4] == GLSL_UMIN => {
                clamped.insert(w[2], w[5]);
            }
            OP_COOPERATIVE_MATRIX_LOAD_KHR | OP_COOPERATIVE_MATRIX_STORE_KHR => coop = true,
            _ => {}
        }
    }
    if !coop {
        return Ok(0);
    }
    let mut rewritten = 0;
    for &(at, len) in &insts {
        let op = words[at] & 0xffff;
        // [type, result, base, indices...]
        if (op == OP_ACCESS_CHAIN || op == OP_IN_BOUNDS_ACCESS_CHAIN)
            && len > 4
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
