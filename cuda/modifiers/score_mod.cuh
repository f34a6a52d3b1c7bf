// SCORE_MOD (src/modifiers/score_mod.rs): the user's score modifier, whose CUDA C the host
// puts before the modifiers' functions (-DSCORE_MOD=1), as shaders/modifiers/score_mod.wgsl:
// natural-log scores in and out, the batch and query head from head_mods.
#ifndef SCORE_MOD
#define SCORE_MOD 0
#endif
#if SCORE_MOD
__device__ __forceinline__ float score_mod_apply(const CallShape& p, const HeadMods& hm, float x,
                                                 unsigned int i, unsigned int j) {
    // a pair hidden by an -inf score (a bias entry) stays hidden
    return x == NEG_INF ? x : score_mod(x * LN2, hm.b, hm.h, i, j) * LOG2E;
}
__device__ __forceinline__ float score_mod_slope(const CallShape& p, const HeadMods& hm, float x,
                                                 float t, unsigned int i, unsigned int j) {
    return score_mod_ds(x * LN2, hm.b, hm.h, i, j);
}
#endif
