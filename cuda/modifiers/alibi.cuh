// ALIBI (src/modifiers/alibi.rs); the head's slope is read by head_mods (cuda/common.cuh).
// ALiBi's term for row i and key j in the exp2 domain: -slope * |i + causal_offset - j|
// (with VARLEN the offset of row i's sequence)
__device__ __forceinline__ float alibi_term(const CallShape& p, const HeadMods& hm, unsigned int i,
                                            unsigned int j) {
#if ALIBI
#if VARLEN
    const int shift = band_shift(p, sequence_of(p, min(i, p.seq_q - 1), false));
    return -hm.slope2 * fabsf((float)((int)i + p.causal_offset + shift - (int)j));
#else
    return -hm.slope2 * fabsf((float)((long long)i + p.causal_offset - (long long)j));
#endif
#else
    return 0.f;
#endif
}
