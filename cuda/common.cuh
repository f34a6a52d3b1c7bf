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

// a call's scalars; mirrored by AttnShape in src/cuda/kernels.rs (28 bytes, 4-aligned)
struct AttnShape {
    unsigned int seq_q;
    unsigned int seq_kv;
    unsigned int heads_q;
    unsigned int heads_kv;
    int causal;
    int causal_offset; // key j is visible to row i when j <= i + causal_offset
    float scale_log2;  // softmax scale * log2(e)
};

// bounds and the bottom-right causal mask, as `visible` in shaders/common.wgsl
__device__ __forceinline__ bool visible(const AttnShape& p, unsigned int i, unsigned int j) {
    return i < p.seq_q && j < p.seq_kv &&
           (!p.causal || (long long)j <= (long long)i + p.causal_offset);
}

// keys [0, end) are the only ones query rows [q0, q0 + rows) can see (all keys without
// causal), as kv_end_for_rows in shaders/common.wgsl
__device__ __forceinline__ unsigned int kv_end_for_rows(const AttnShape& p, unsigned int q0,
                                                        unsigned int rows) {
    if (!p.causal) {
        return p.seq_kv;
    }
    long long last = (long long)min(q0 + rows, p.seq_q) - 1 + p.causal_offset;
    return last < 0 ? 0u : (unsigned int)min((long long)p.seq_kv, last + 1);
}

// the end of a row's online softmax (running sum l, running max m in the exp2 domain): the
// factor out = O * row_inv(l) and lse = row_lse(l, m) (natural log). A row that saw nothing
// (l = 0) gets 0 and -inf; a row that saw a NaN (l NaN) gets NaN for both, as on wgpu.
__device__ __forceinline__ float row_inv(float l) { return l == 0.f ? 0.f : 1.f / l; }
__device__ __forceinline__ float row_lse(float l, float m) {
    return l == 0.f ? NEG_INF : logf(l) + m * LN2;
}
