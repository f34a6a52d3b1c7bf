// SOFTCAP (src/modifiers/softcap.rs): a score x in the exp2 domain becomes C tanh(x / C),
// C = c log2(e), as shaders/modifiers/softcap.wgsl; softcap_slope is its derivative, from the
// capped score t (no second tanh). Compiled in (-DSOFTCAP=1); the score chain calls both only
// under #if SOFTCAP.
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
__device__ __forceinline__ float softcap_score(const CallShape& p, const HeadMods& hm, float x,
                                               unsigned int i, unsigned int j) {
    return p.softcap2 * tanhf(x / p.softcap2);
}
__device__ __forceinline__ float softcap_slope(const CallShape& p, const HeadMods& hm, float x,
                                               float t, unsigned int i, unsigned int j) {
    const float u = t / p.softcap2;
    return 1.f - u * u;
}
