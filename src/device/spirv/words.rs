//! SPIR-V at the word level, for the rewrites of the words Vulkan gets (`spirv.rs`'s layout
//! cleaning, `coop_indices`): the instruction walker and the numbers they read.

// Opcodes, storage classes and decorations (SPIR-V 1.6 specification; GLSL.std.450).
pub(super) const OP_EXT_INST_IMPORT: u32 = 11;
pub(super) const OP_EXT_INST: u32 = 12;
pub(super) const OP_VARIABLE: u32 = 59;
pub(super) const OP_ACCESS_CHAIN: u32 = 65;
pub(super) const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
pub(super) const OP_COOPERATIVE_MATRIX_LOAD_KHR: u32 = 4457;
pub(super) const OP_COOPERATIVE_MATRIX_STORE_KHR: u32 = 4458;
pub(super) const STORAGE_CLASS_WORKGROUP: u32 = 4;
/// GLSL.std.450's `UMin`.
pub(super) const GLSL_UMIN: u32 = 38;
pub(super) const OP_TYPE_ARRAY: u32 = 28;
pub(super) const OP_TYPE_RUNTIME_ARRAY: u32 = 29;
pub(super) const OP_TYPE_STRUCT: u32 = 30;
pub(super) const OP_TYPE_POINTER: u32 = 32;
pub(super) const OP_DECORATE: u32 = 71;
pub(super) const OP_MEMBER_DECORATE: u32 = 72;
pub(super) const DECORATION_ARRAY_STRIDE: u32 = 6;
pub(super) const DECORATION_MATRIX_STRIDE: u32 = 7;
pub(super) const DECORATION_OFFSET: u32 = 35;
/// Uniform, PushConstant, StorageBuffer, ShaderRecordBufferKHR, PhysicalStorageBuffer: the
/// storage classes whose types carry an explicit layout.
pub(super) const EXPLICIT_LAYOUT_CLASSES: [u32; 5] = [2, 9, 12, 5343, 5349];

/// (first word, word count) of each instruction of a module, after its header.
pub(super) fn instructions(words: &[u32]) -> Result<Vec<(usize, usize)>, String> {
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err("not a SPIR-V module".into());
    }
    let mut out = Vec::new();
    let mut i = 5;
    while i < words.len() {
        let n = (words[i] >> 16) as usize;
        if n == 0 || i + n > words.len() {
            return Err(format!("malformed instruction at word {i}"));
        }
        out.push((i, n));
        i += n;
    }
    Ok(out)
}

/// A SPIR-V literal string (UTF-8, NUL-terminated, packed four bytes a word).
pub(super) fn literal(words: &[u32]) -> String {
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
