// MASK_MOD (src/modifiers/mask_mod.rs): the user's mask, whose CUDA C the host puts before the
// modifiers' functions (-DMASK_MOD=1), as shaders/modifiers/mask_mod.wgsl: true where the pair
// takes part, at the call's (batch, query head, row, key). pair_visible asks it in the tiles
// tile_blocks marks partial: every tile but those whose blocks are all full
// (BlockMask::full, Params::blocks_full), so a block mask from create_block_mask spares the
// evaluation inside the mask's solid regions.
#ifndef MASK_MOD
#define MASK_MOD 0
#endif
#if MASK_MOD
__device__ __forceinline__ bool mask_mod_on(const HeadMods& hm, unsigned int i, unsigned int j) {
    return mask_mod(hm.b, hm.h, i, j);
}
#endif
