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

// a call's scalars; mirrored by AttnShape in src/cuda/kernels.rs (40 bytes, 4-aligned)
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

// bounds, the bottom-right causal mask and the window, as `visible` in shaders/common.wgsl
__device__ __forceinline__ bool visible(const AttnShape& p, unsigned int i, unsigned int j) {
    const long long ii = i, jj = j;
    return i < p.seq_q && j < p.seq_kv && (!p.causal || jj <= ii + p.causal_offset) &&
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
        return p.seq_kv;
    }
    long long last = (long long)min(q0 + rows, p.seq_q) - 1 + band_hi(p);
    return last < 0 ? 0u : (unsigned int)min((long long)p.seq_kv, last + 1);
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

// rows at or after the result see none of the keys up to j_last (a window's left edge)
__device__ __forceinline__ unsigned int q_end_for_key(const AttnShape& p, unsigned int j_last) {
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
    if (kv0 + keys > p.seq_kv) {
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
// factor out = O * row_inv(l) and lse = row_lse(l, m) (natural log). A row that saw nothing
// (l = 0) gets 0 and -inf; a row that saw a NaN (l NaN) gets NaN for both, as on wgpu.
__device__ __forceinline__ float row_inv(float l) { return l == 0.f ? 0.f : 1.f / l; }
__device__ __forceinline__ float row_lse(float l, float m) {
    return l == 0.f ? NEG_INF : logf(l) + m * LN2;
}
