// BIAS (src/modifiers/bias.rs); the head's grid is found by head_mods (cuda/common.cuh).
// the bias's entry for row i and key j in the exp2 domain (rows and keys past the end read
// their last one: the mask hides them); 0 without a bias
__device__ __forceinline__ float pair_bias(const CallShape& p, const HeadMods& hm, unsigned int i,
                                           unsigned int j) {
#if BIAS
    const unsigned int e = hm.bias_grid + min(i, p.seq_q - 1) * p.mask_cols + min(j, p.seq_kv - 1);
    return to_f32(hm.bias[e]) * LOG2E;
#else
    return 0.f;
#endif
}
