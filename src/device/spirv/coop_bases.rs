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

use super::{
    instructions, GLSL_UMIN, OP_ACCESS_CHAIN, OP_COOPERATIVE_MATRIX_LOAD_KHR,
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

/// A SPIR-V literal string (UTF-8, NUL-terminated, packed four bytes a word).
fn literal(words: &[u32]) -> String {
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::super::{kernel_spirv, SpirvTarget};
    use super::*;

    const TARGET: SpirvTarget = SpirvTarget {
        lang_version: (1, 6),
        robust_buffers: true,
        f16: true,
        subgroups: true,
        cooperative_matrices: true,
    };

    /// The UMin clamps each coop load and store and each plain access are indexed by.
    fn clamps(words: &[u32]) -> (usize, usize) {
        let insts = instructions(words).unwrap();
        let mut umins = std::collections::HashSet::new();
        let mut coop = std::collections::HashSet::new();
        for &(at, len) in &insts {
            let w = &words[at..at + len];
            match w[0] & 0xffff {
                OP_EXT_INST if len == 7 && w[4] == GLSL_UMIN => {
                    umins.insert(w[2]);
                }
                OP_COOPERATIVE_MATRIX_LOAD_KHR => {
                    coop.insert(w[3]);
                }
                OP_COOPERATIVE_MATRIX_STORE_KHR => {
                    coop.insert(w[1]);
                }
                _ => {}
            }
        }
        let (mut of_coop, mut other) = (0, 0);
        for &(at, len) in &insts {
            let w = &words[at..at + len];
            if w[0] & 0xffff == OP_ACCESS_CHAIN {
                let n = w[4..].iter().filter(|i| umins.contains(i)).count();
                if coop.contains(&w[2]) {
                    of_coop += n;
                } else {
                    other += n;
                }
            }
        }
        (of_coop, other)
    }

    #[test]
    fn coop_bases_lose_their_clamps_and_every_other_index_keeps_its_own() {
        let wgsl = "enable f16;
enable wgpu_cooperative_matrix;
var<workgroup> hs: array<f16, 512>;
var<workgroup> fs: array<f32, 256>;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32) {
    hs[t] = f16(t);
    workgroupBarrier();
    let a = (t / 32u) * 256u;
    let x = coopLoadT<coop_mat16x16<f16, A>>(&hs[a], 16u);
    let y = coopLoad<coop_mat16x16<f16, B>>(&hs[a], 16u);
    let c = coopMultiplyAdd(x, y, coop_mat16x16<f32, C>());
    coopStoreT(c, &fs[0u], 16u);
    workgroupBarrier();
    out[t] = fs[t] + f32(hs[t + 1u]);
}";
        let words = kernel_spirv(wgsl, &TARGET).unwrap();
        let (coop, other) = clamps(&words);
        assert_eq!(coop, 0, "kernel_spirv unclamps the fragments' bases");
        assert!(other >= 2, "the plain accesses keep their clamps: {other}");

        // naga's own words clamp both loads' bases (the store's index is a constant)
        let module = naga::front::wgsl::parse_str(wgsl).unwrap();
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap();
        let mut naga_words =
            naga::back::spv::write_vec(&module, &info, &TARGET.options(), None).unwrap();
        assert_eq!(clamps(&naga_words), (2, other));
        assert_eq!(unclamp_coop_bases(&mut naga_words), Ok(2));
        assert_eq!(clamps(&naga_words), (0, other));
    }
}
