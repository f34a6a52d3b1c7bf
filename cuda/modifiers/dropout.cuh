// Dropout (-DDROPOUT=1) on the attention probabilities, as Dropout::keeps in src/modifiers/dropout.rs
// (the f64 reference's): pair (row i, key j) of head bh = b * heads_q + h (the query head) is
// word j % 4 of the Philox 4x32-10 block at counter (offset + j / 4 as a 64-bit add, i, bh)
// under key (seed lo, seed hi), kept iff that word is at least drop_threshold. i, j and b are
// the whole call's. The kernels draw one block per 4 keys and share its flags across lanes
// (dropout_bits and the kernels' helpers). Without dropout (the default) none of it reaches
// the kernels' code (IF_DROPOUT and the helpers below).
#ifndef DROPOUT
#define DROPOUT 0
#endif
struct Words4 {
    unsigned int x, y, z, w;
};
// the four 32-bit words of Philox 4x32 (Salmon et al., SC 2011), 10 rounds, at counter c
// under key (k0, k1)
__device__ __forceinline__ Words4 philox4x32_10(Words4 c, unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int r = 0; r < 10; r++) {
        const unsigned int hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = Words4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c;
}
// the keep flags of keys 4g..4g+3 in row i of head bh: bit k set when key 4g + k is kept
__device__ __forceinline__ unsigned int dropout_bits(const Params& p, unsigned int bh,
                                                     unsigned int i, unsigned int g) {
    Words4 c;
    c.x = p.offset_lo + g;
    c.y = p.offset_hi + (c.x < g ? 1u : 0u); // the carry of the 64-bit add
    c.z = i;
    c.w = bh;
    const Words4 w = philox4x32_10(c, p.seed_lo, p.seed_hi);
    return (w.x >= p.drop_threshold ? 1u : 0u) | (w.y >= p.drop_threshold ? 2u : 0u) |
           (w.z >= p.drop_threshold ? 4u : 0u) | (w.w >= p.drop_threshold ? 8u : 0u);
}
// The kernels take the pairs' keep flags (bits of a mask) and a kept pair's 1 / (1 - p)
// apart: P V and dV take the kept pairs' P, 1 / (1 - p) joins the forward's normalization and
// dV's store, and dP takes both. Without dropout each helper below returns x, and the masks
// come through IF_DROPOUT, so the kernels compile to what they were without it (even an
// unused reference to the call's scalars, passed to an inlined helper, changes NVVM's code).
#if DROPOUT
#define IF_DROPOUT(expr, otherwise) (expr)
#else
#define IF_DROPOUT(expr, otherwise) (otherwise)
#endif
// x where bit n of `keep` is set, else 0
__device__ __forceinline__ float dropout_keep(float x, unsigned long long keep, unsigned int n) {
#if DROPOUT
    return (keep >> n) & 1ull ? x : 0.f;
#else
    return x;
#endif
}
// x * scale (1 / (1 - p)) where bit n of `keep` is set, else 0: Z dP
__device__ __forceinline__ float dropout_keep_scaled(float x, unsigned long long keep,
                                                     unsigned int n, float scale) {
#if DROPOUT
    return (keep >> n) & 1ull ? x * scale : 0.f;
#else
    return x;
#endif
}
// x * scale (1 / (1 - p))
__device__ __forceinline__ float dropout_rescale(float x, float scale) {
#if DROPOUT
    return x * scale;
#else
    return x;
#endif
}
