// Shared by every CUDA kernel of this crate; the host puts this text before each kernel's
// source (src/cuda/kernels.rs), so NVRTC needs no include path.
//
// Defines expected from the host: HEAD_DIM (a multiple of 16), ELEM_BF16 (0: f16, 1: bf16),
// WARPS (warps per block, 16 rows of the block's resident tile each).
//
// Elements are raw 16-bit words: the tensor cores read them through ldmatrix and the only
// arithmetic on them is the f32 <-> 16-bit conversion, done with PTX cvt. So no CUDA header is
// needed (cuda_fp16.h / cuda_bf16.h are not part of NVRTC).
typedef unsigned short elem_t;
#if ELEM_BF16
#define MMA_TYPE "bf16"
#define CVT_PAIR "cvt.rn.bf16x2.f32"
#else
#define MMA_TYPE "f16"
#define CVT_PAIR "cvt.rn.f16x2.f32"
#endif

// two f32 rounded to nearest even and packed, lo in the low half
__device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    unsigned int r;
    asm(CVT_PAIR " %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// one element, exactly, as f32
__device__ __forceinline__ float to_f32(elem_t x) {
#if ELEM_BF16
    return __uint_as_float(((unsigned int)x) << 16);
#else
    float r;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(r) : "h"(x));
    return r;
#endif
}

// NVRTC has no <math.h>: infinities from their bits
#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

#if !defined(HEAD_DIM) || !defined(ELEM_BF16) || !defined(WARPS)
#error "HEAD_DIM, ELEM_BF16 and WARPS must be defined"
#endif
#if HEAD_DIM % 16 != 0 || HEAD_DIM > 256
#error "HEAD_DIM must be a multiple of 16, at most 256"
#endif
#define THREADS (WARPS * 32)
// shared-memory row stride in elements: 8 more than HEAD_DIM, so the 8 rows an ldmatrix
// reads start 16 bytes apart modulo 128 (no bank conflicts)
#define STRIDE (HEAD_DIM + 8)
#define KSTEPS (HEAD_DIM / 16)
#define DTILES (HEAD_DIM / 8)

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

__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, or zeros where `valid` is false (rows past the sequence)
__device__ __forceinline__ void copy16(elem_t* dst, const elem_t* src, bool valid) {
    unsigned int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(n));
}

__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void copy_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// rows [row0, row0 + rows) of a [.., seq, heads, HEAD_DIM] tensor at one (batch, head) into a
// shared tile of `rows` x STRIDE; rows at or past `seq` become zeros
__device__ __forceinline__ void stage_rows(elem_t* tile, const elem_t* base, unsigned int row0,
                                           int rows, unsigned int seq, unsigned int row_pitch) {
    const int chunks = HEAD_DIM / 8; // 16-byte chunks per row
    for (int c = threadIdx.x; c < rows * chunks; c += THREADS) {
        int r = c / chunks;
        int d = (c % chunks) * 8;
        unsigned int row = row0 + r;
        bool valid = row < seq;
        const elem_t* src = base + (size_t)(valid ? row : 0) * row_pitch + d;
        copy16(tile + r * STRIDE + d, src, valid);
    }
}

__device__ __forceinline__ void ldmatrix_x4(unsigned int* r, const elem_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x2(unsigned int* r, const elem_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(unsigned int* r, const elem_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}

// c += a b for one m16n8k16 block: a 16x16 (4 regs), b 16x8 (2 regs), c 16x8 f32 (4 regs)
__device__ __forceinline__ void mma(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE
                 ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float row_max4(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

__device__ __forceinline__ float row_sum4(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
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

// N blocks of C operands set to 0
template <int N>
__device__ __forceinline__ void zero(float (*c)[4]) {
#pragma unroll
    for (int t = 0; t < N; t++) {
        c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.f;
    }
}

// A operand of m16n8k16 (16 rows x 16 of k) from a shared tile of STRIDE-element rows: rows
// row0.., k = ks * 16..
__device__ __forceinline__ void load_a(unsigned int* a, const elem_t* tile, int row0, int ks) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (row0 + lane % 16) * STRIDE + ks * 16 + (lane / 16) * 8);
}

// B operand (16 of k x 8 of n) whose n are tile rows n0.. and k the dims ks * 16.. (the tile
// holds B transposed, as K holds the B of Q K^T)
__device__ __forceinline__ void load_b_rows(unsigned int* b, const elem_t* tile, int n0, int ks) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x2(b, tile + (n0 + lane % 8) * STRIDE + ks * 16 + ((lane / 8) % 2) * 8);
}

// B operand whose k are tile rows k0.. and n the dims n0.. (the tile holds B as is, as V holds
// the B of P V): a transposed load
__device__ __forceinline__ void load_b_cols(unsigned int* b, const elem_t* tile, int k0, int n0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x2_trans(b, tile + (k0 + lane % 16) * STRIDE + n0);
}

// The A operand of the next product from a block of scores held as C operands: columns
// 16 kk.. of a 16-row block, rounded to the element type (P for P V, dS for dS K)
__device__ __forceinline__ void c_to_a(unsigned int* a, const float (*c)[4], int kk) {
    a[0] = pack2(c[2 * kk][0], c[2 * kk][1]);
    a[1] = pack2(c[2 * kk][2], c[2 * kk][3]);
    a[2] = pack2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = pack2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// store a 16-row block of C operands (DTILES of 8 dims) times `scale` to rows row_lo and
// row_lo + 8 of a [.., seq, heads, HEAD_DIM] tensor at `base` (a row's dim 0), rows at or past
// `seq` skipped
__device__ __forceinline__ void store_rows(elem_t* base, unsigned int row_pitch,
                                           unsigned int row_lo, unsigned int seq,
                                           const float (*c)[4], float scale_lo, float scale_hi) {
    const int lane = threadIdx.x % 32;
    if (row_lo < seq) {
        elem_t* dst = base + (size_t)row_lo * row_pitch + (lane % 4) * 2;
#pragma unroll
        for (int t = 0; t < DTILES; t++) {
            *reinterpret_cast<unsigned int*>(dst + t * 8) = pack2(c[t][0] * scale_lo, c[t][1] * scale_lo);
        }
    }
    if (row_lo + 8 < seq) {
        elem_t* dst = base + (size_t)(row_lo + 8) * row_pitch + (lane % 4) * 2;
#pragma unroll
        for (int t = 0; t < DTILES; t++) {
            *reinterpret_cast<unsigned int*>(dst + t * 8) = pack2(c[t][2] * scale_hi, c[t][3] * scale_hi);
        }
    }
}
