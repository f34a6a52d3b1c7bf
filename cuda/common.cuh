// Shared by every CUDA kernel of this crate, tensor-core and SIMT alike; the host puts this
// text before each kernel's source (src/cuda/kernels.rs), so NVRTC needs no include path.
//
// Defines expected from the host: HEAD_DIM (1..=256), ELEM_KIND (0: f16, 1: bf16, 2: f32).
//
// Half elements are raw 16-bit words: the only arithmetic on them is the f32 <-> 16-bit
// conversion, done with PTX cvt, so no CUDA header is needed (cuda_fp16.h / cuda_bf16.h are
// not part of NVRTC).
#if !defined(HEAD_DIM) || !defined(ELEM_KIND)
#error "HEAD_DIM and ELEM_KIND must be defined"
#endif
#if HEAD_DIM < 1 || HEAD_DIM > 256
#error "HEAD_DIM must be in 1..=256"
#endif
#define ELEM_BF16 (ELEM_KIND == 1)
#if ELEM_KIND == 2
typedef float elem_t;
#else
typedef unsigned short elem_t;
#endif

// one element, exactly, as f32
__device__ __forceinline__ float to_f32(elem_t x) {
#if ELEM_KIND == 2
    return x;
#elif ELEM_KIND == 1
    return __uint_as_float(((unsigned int)x) << 16);
#else
    float r;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(r) : "h"(x));
    return r;
#endif
}

// one f32 rounded to the element type, to nearest even
__device__ __forceinline__ elem_t from_f32(float x) {
#if ELEM_KIND == 2
    return x;
#else
    unsigned short r;
#if ELEM_KIND == 1
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
#else
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
#endif
    return r;
#endif
}

// NVRTC has no <math.h>: infinities from their bits
#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// a call's scalars; mirrored by AttnShape in src/cuda/kernels.rs (60 bytes, 4-aligned)
struct AttnShape {
    unsigned int seq_q;
    unsigned int seq_kv;
    unsigned int heads_q;
    unsigned int heads_kv;
    int causal;
    int causal_offset; // key j is visible to row i when j <= i + causal_offset
    float scale_log2;  // softmax scale * log2(e)
    int window;        // a sliding window: row i sees key j only when
    int band_lo;       //   i + band_lo <= j <= i + band_hi (causal folded in; +-2^30 where
    int band_hi;       //   a side is unbounded), as Params in shaders/common.wgsl
    float softcap2;    // SOFTCAP: the softcap c times log2(e)
    unsigned int alibi_b_stride; // ALIBI: extras between batches' slopes (0: one per head)
    unsigned int sinks_base;     // SINKS: extras index of head 0's sink
    unsigned int seqlens_base;   // SEQLENS: extras index of batch 0's key length
    unsigned int kv_len;         // keys [0, kv_len) take part (for_batch: the batch's own)
};

// A softcap (-DSOFTCAP=1): a score x in the exp2 domain becomes C tanh(x / C), C = c log2(e),
// before masking and softmax, as finish_score in shaders/common.wgsl; softcap_slope is its
// derivative at the finished score s, which dS takes. Without it both are the identity.
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
__device__ __forceinline__ float softcap_score(const AttnShape& p, float x) {
#if SOFTCAP
    return p.softcap2 * tanhf(x / p.softcap2);
#else
    return x;
#endif
}
__device__ __forceinline__ float softcap_slope(const AttnShape& p, float s) {
#if SOFTCAP
    const float t = s / p.softcap2;
    return 1.f - t * t;
#else
    return 1.f;
#endif
}

// ALiBi (-DALIBI=1) and attention sinks (-DSINKS=1): per-head values from the call's extras
// (ALiBi slopes, then sinks, as `plan::Extras` on wgpu), read once per (batch, head) by
// head_mods, as begin_head in shaders/common.wgsl. Without them nothing is read.
#ifndef ALIBI
#define ALIBI 0
#endif
#ifndef SINKS
#define SINKS 0
#endif
#ifndef SEQLENS
#define SEQLENS 0
#endif

// The call's scalars for batch b: with per-batch key lengths (-DSEQLENS=1), kv_len is the
// batch's (keys past it are hidden, as kv_len in shaders/common.wgsl); else unchanged.
__device__ __forceinline__ AttnShape for_batch(const AttnShape& p, const float* __restrict__ extras,
                                               unsigned int b) {
    AttnShape q = p;
#if SEQLENS
    q.kv_len = min(__float_as_uint(extras[p.seqlens_base + b]), p.seq_kv);
#endif
    return q;
}
struct HeadMods {
    float slope2; // the ALiBi slope times log2(e)
    float sink2;  // the sink times log2(e)
};
__device__ __forceinline__ HeadMods head_mods(const AttnShape& p, const float* __restrict__ extras,
                                              unsigned int b, unsigned int h) {
    HeadMods m;
    m.slope2 = 0.f;
    m.sink2 = 0.f;
#if ALIBI
    m.slope2 = extras[b * p.alibi_b_stride + h] * LOG2E;
#endif
#if SINKS
    m.sink2 = extras[p.sinks_base + h] * LOG2E;
#endif
    return m;
}

// ALiBi's term for row i and key j in the exp2 domain: -slope * |i + causal_offset - j|
__device__ __forceinline__ float alibi_term(const AttnShape& p, const HeadMods& hm, unsigned int i,
                                            unsigned int j) {
#if ALIBI
    return -hm.slope2 * fabsf((float)((long long)i + p.causal_offset - (long long)j));
#else
    return 0.f;
#endif
}

// the score softmax sees, from x = q.k * scale * log2(e): softcapped, then ALiBi's term added
// (finish_score in shaders/common.wgsl, without the mask, which callers apply)
__device__ __forceinline__ float finish_score(const AttnShape& p, const HeadMods& hm, float x,
                                              unsigned int i, unsigned int j) {
    return softcap_score(p, x) + alibi_term(p, hm, i, j);
}

// d(finished score) / dx at finished score s of pair (i, j): the softcap's slope at the
// capped score (ALiBi's term taken out); 1 without a softcap
__device__ __forceinline__ float score_slope(const AttnShape& p, const HeadMods& hm, float s,
                                             unsigned int i, unsigned int j) {
    return softcap_slope(p, s - alibi_term(p, hm, i, j));
}

// bounds, the bottom-right causal mask and the window, as `visible` in shaders/common.wgsl
__device__ __forceinline__ bool visible(const AttnShape& p, unsigned int i, unsigned int j) {
    const long long ii = i, jj = j;
    return i < p.seq_q && j < p.kv_len && (!p.causal || jj <= ii + p.causal_offset) &&
           (!p.window || (jj >= ii + p.band_lo && jj <= ii + p.band_hi));
}

// the highest key offset j - i a row sees (with causal or a window)
__device__ __forceinline__ long long band_hi(const AttnShape& p) {
    return p.window ? p.band_hi : p.causal_offset;
}

// keys [0, end) are the only ones query rows [q0, q0 + rows) can see (all keys without
// causal or a window), as kv_end_for_rows in shaders/common.wgsl
__device__ __forceinline__ unsigned int kv_end_for_rows(const AttnShape& p, unsigned int q0,
                                                        unsigned int rows) {
    if (!p.causal && !p.window) {
        return p.kv_len;
    }
    long long last = (long long)min(q0 + rows, p.seq_q) - 1 + band_hi(p);
    return last < 0 ? 0u : (unsigned int)min((long long)p.kv_len, last + 1);
}

// keys before the result are hidden from rows q0.. (a window's left edge; 0 without one)
__device__ __forceinline__ unsigned int kv_begin_for_rows(const AttnShape& p, unsigned int q0) {
    if (!p.window) {
        return 0;
    }
    long long first = (long long)q0 + p.band_lo;
    return first <= 0 ? 0u : (unsigned int)min((long long)p.seq_kv, first);
}

// the first query row that can see key j0
__device__ __forceinline__ unsigned int q_begin_for_key(const AttnShape& p, unsigned int j0) {
    if (!p.causal && !p.window) {
        return 0;
    }
    long long first = (long long)j0 - band_hi(p);
    return first <= 0 ? 0u : (unsigned int)min((long long)p.seq_q, first);
}

// rows at or after the result see none of the keys [j0, j_last] (a window's left edge; 0 when
// none of them exists: past the batch's length)
__device__ __forceinline__ unsigned int q_end_for_keys(const AttnShape& p, unsigned int j0,
                                                       unsigned int j_last) {
    if (j0 >= p.kv_len) {
        return 0;
    }
    if (!p.window) {
        return p.seq_q;
    }
    long long end = (long long)j_last - p.band_lo + 1;
    return end <= 0 ? 0u : (unsigned int)min((long long)p.seq_q, end);
}

// true when some pair of rows [q0, q0 + rows) x keys [kv0, kv0 + keys) is hidden or out of
// bounds (the key side; rows past seq_q are the caller's)
__device__ __forceinline__ bool tile_needs_mask(const AttnShape& p, unsigned int q0,
                                                unsigned int rows, unsigned int kv0,
                                                unsigned int keys) {
    if (kv0 + keys > p.kv_len) {
        return true;
    }
    const bool right = (p.causal || p.window) && (long long)kv0 + keys - 1 > (long long)q0 + band_hi(p);
    const bool left = p.window && (long long)kv0 < (long long)q0 + rows - 1 + p.band_lo;
    return right || left;
}

// The backward's preprocess for row r of [batch, heads_q, seq_q]: delta[r] = sum_d dO * out,
// in f32 (one thread a row; rows past the end do nothing).
__device__ __forceinline__ void preprocess_row(const elem_t* __restrict__ out,
                                               const elem_t* __restrict__ d_out,
                                               float* __restrict__ delta, const AttnShape& p,
                                               unsigned int batch, size_t r) {
    const size_t rows = (size_t)batch * p.heads_q * p.seq_q;
    if (r >= rows) {
        return;
    }
    const size_t i = r % p.seq_q, h = (r / p.seq_q) % p.heads_q, b = r / ((size_t)p.seq_q * p.heads_q);
    const size_t base = ((b * p.seq_q + i) * p.heads_q + h) * HEAD_DIM;
    float acc = 0.f;
    for (int d = 0; d < HEAD_DIM; d++) {
        acc = fmaf(to_f32(d_out[base + d]), to_f32(out[base + d]), acc);
    }
    delta[r] = acc;
}

// the end of a row's online softmax (running sum l, running max m in the exp2 domain): the
// factor out = O * row_inv(l, m, hm) and lse = row_lse(l, m, hm) (natural log). A row that saw
// nothing (l = 0) gets 0 and -inf; a row that saw a NaN (l NaN) gets NaN for both, as on wgpu.
// With sinks the head's sink joins the sum (it carries no value): a row that saw nothing gets
// lse = sink, as row_normalizer and finish_lse in shaders/common.wgsl.
__device__ __forceinline__ float row_inv(float l, float m, const HeadMods& hm) {
#if SINKS
    if (l > 0.f) {
        return 1.f / (l + exp2f(hm.sink2 - m));
    }
#endif
    return l == 0.f ? 0.f : 1.f / l;
}
__device__ __forceinline__ float row_lse(float l, float m, const HeadMods& hm) {
#if SINKS
    if (l == 0.f) {
        return hm.sink2 * LN2;
    }
    const float top = fmaxf(m, hm.sink2);
    return (top + log2f(l * exp2f(m - top) + exp2f(hm.sink2 - top))) * LN2;
#else
    return l == 0.f ? NEG_INF : logf(l) + m * LN2;
#endif
}

#if SINKS
// The sinks' gradient (shaders/flash_bwd_sinks.wgsl): d_sinks[h] = -sum over (batch, row) of
// exp(sink - lse) * delta. One block of 256 threads per query head, a fixed-order tree sum:
// deterministic.
extern "C" __global__ void __launch_bounds__(256) flash_sinks_grad(
    const float* __restrict__ lse, const float* __restrict__ delta, float* __restrict__ d_sinks,
    const AttnShape p, unsigned int batch, const float* __restrict__ extras) {
    __shared__ float red[256];
    const unsigned int h = blockIdx.x, t = threadIdx.x;
    const HeadMods hm = head_mods(p, extras, 0, h);
    float acc = 0.f;
    for (size_t e = t; e < (size_t)batch * p.seq_q; e += 256) {
        const size_t r = ((e / p.seq_q) * p.heads_q + h) * p.seq_q + e % p.seq_q;
        acc += exp2f(hm.sink2 - lse[r] * LOG2E) * delta[r];
    }
    red[t] = acc;
    __syncthreads();
    for (unsigned int w = 128; w > 0; w >>= 1) {
        if (t < w) {
            red[t] += red[t + w];
        }
        __syncthreads();
    }
    if (t == 0) {
        d_sinks[h] = -red[0];
    }
}
#endif
