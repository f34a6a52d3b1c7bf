// FlashAttention forward (exact) on NVIDIA tensor cores: FlashAttention-2 structure.
//
// Compiled at run time by NVRTC (src/cuda/nvrtc.rs) once per key (src/cuda/kernels.rs, which
// owns the launch geometry and passes it in):
//   -DHEAD_DIM=d     head dimension, a multiple of 16, at most 256
//   -DELEM_BF16=0|1  f16 or bf16 storage (both multiply on tensor cores with f32 accumulation)
//   -DWARPS=w        warps per block, 16 query rows each
//   -DBLOCK_N=n      keys per K/V tile, a multiple of 16
// Layouts as the wgpu path (shaders/common.wgsl): q, out [batch, seq_q, heads_q, HEAD_DIM];
// k, v [batch, seq_kv, heads_kv, HEAD_DIM]; lse [batch, heads_q, seq_q] (natural log), all
// dense. Causal is bottom-right aligned: key j is visible to row i when j <= i + causal_offset.
//
// Grid:    (ceil(seq_q / BLOCK_M), heads_q, batch); WARPS warps, each owning 16 query rows.
// Loop:    over K/V tiles of BLOCK_N keys, staged in shared memory with cp.async (the next
//          tile's copy is in flight while this one is used: two stages); with causal, tiles
//          wholly above the diagonal are never loaded.
// Math:    S = Q K^T and O += P V with mma.sync m16n8k16 (operands via ldmatrix), online
//          softmax in registers in the exp2 domain (running max and sum, exact), one write of
//          out and lse. A row that sees no key gets out = 0 and lse = -inf, as on wgpu.

// Elements are raw 16-bit words: the tensor cores read them through ldmatrix and the only
// arithmetic on them is the f32 -> 16-bit rounding of P and of out, done with PTX cvt. So no
// CUDA header is needed (cuda_fp16.h / cuda_bf16.h are not part of NVRTC).
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

// NVRTC has no <math.h>: -inf from its bits
#define NEG_INF __int_as_float(0xff800000)

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#if HEAD_DIM % 16 != 0 || HEAD_DIM > 256
#error "HEAD_DIM must be a multiple of 16, at most 256"
#endif

#if !defined(WARPS) || !defined(BLOCK_N) || BLOCK_N % 16 != 0
#error "WARPS and BLOCK_N (a multiple of 16) must be defined"
#endif
#define THREADS (WARPS * 32)
#define BLOCK_M (WARPS * 16)
// shared-memory row stride in elements: 8 more than HEAD_DIM, so the 8 rows an ldmatrix
// reads start 16 bytes apart modulo 128 (no bank conflicts)
#define STRIDE (HEAD_DIM + 8)
#define KSTEPS (HEAD_DIM / 16)
#define DTILES (HEAD_DIM / 8)
#define NTILES (BLOCK_N / 8)

// the call's scalars; mirrored by FwdShape in src/cuda/kernels.rs (28 bytes, 4-aligned)
struct FwdShape {
    unsigned int seq_q;
    unsigned int seq_kv;
    unsigned int heads_q;
    unsigned int heads_kv;
    int causal;
    int causal_offset;
    float scale_log2; // softmax scale * log2(e)
};

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

// (THREADS, 1): registers up to 255. Without the 1, ptxas capped some head dims at 128 and
// spilled (head_dim 48: 8 bytes); occupancy against registers is to be tuned on a GPU.
extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_fwd(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
              const elem_t* __restrict__ v, elem_t* __restrict__ out, float* __restrict__ lse,
              const FwdShape p) {
    // Q staged here first, then read into registers; then the two K/V stages. Dynamic, as
    // it passes the 48 KiB of static shared memory at head_dim 128 (size: the host's
    // CudaKey::shared_bytes)
    extern __shared__ __align__(16) elem_t smem[];
    const unsigned int b = blockIdx.z, h = blockIdx.y;
    const unsigned int q0 = blockIdx.x * BLOCK_M;
    const unsigned int hk = h / (p.heads_q / p.heads_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned int q_pitch = p.heads_q * HEAD_DIM, kv_pitch = p.heads_kv * HEAD_DIM;
    const elem_t* q_base = q + ((size_t)b * p.seq_q * p.heads_q + h) * HEAD_DIM;
    const elem_t* k_base = k + ((size_t)b * p.seq_kv * p.heads_kv + hk) * HEAD_DIM;
    const elem_t* v_base = v + ((size_t)b * p.seq_kv * p.heads_kv + hk) * HEAD_DIM;

    // keys [0, kv_end) are the only ones these rows can see
    unsigned int kv_end = p.seq_kv;
    if (p.causal) {
        long long last = (long long)min(q0 + BLOCK_M, p.seq_q) - 1 + p.causal_offset;
        kv_end = last < 0 ? 0u : (unsigned int)min((long long)p.seq_kv, last + 1);
    }

    // Q fragments: this warp's 16 rows, KSTEPS blocks of 16 dims, 4 regs each
    stage_rows(smem, q_base, q0, BLOCK_M, p.seq_q, q_pitch);
    copy_commit();
    copy_wait<0>();
    __syncthreads();
    unsigned int qf[KSTEPS][4];
    {
        const elem_t* w = smem + warp * 16 * STRIDE;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            ldmatrix_x4(qf[ks], w + (lane % 16) * STRIDE + ks * 16 + (lane / 16) * 8);
        }
    }
    __syncthreads();

    // stage s: K at smem + s * 2 * BLOCK_N * STRIDE, V right after it
    if (kv_end > 0) {
        stage_rows(smem, k_base, 0, BLOCK_N, p.seq_kv, kv_pitch);
        stage_rows(smem + BLOCK_N * STRIDE, v_base, 0, BLOCK_N, p.seq_kv, kv_pitch);
    }
    copy_commit();

    // this thread's two rows: r_lo = lane / 4 and r_hi = r_lo + 8 of the warp's 16
    const unsigned int row_lo = q0 + warp * 16 + lane / 4, row_hi = row_lo + 8;
    float o[DTILES][4];
#pragma unroll
    for (int t = 0; t < DTILES; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
    float m_lo = NEG_INF, m_hi = NEG_INF, l_lo = 0.f, l_hi = 0.f;

    int stage = 0;
    for (unsigned int kv0 = 0; kv0 < kv_end; kv0 += BLOCK_N, stage ^= 1) {
        // the next tile's copy goes out before this one is used
        const elem_t* sk = smem + stage * 2 * BLOCK_N * STRIDE;
        const elem_t* sv = sk + BLOCK_N * STRIDE;
        if (kv0 + BLOCK_N < kv_end) {
            elem_t* next = smem + (stage ^ 1) * 2 * BLOCK_N * STRIDE;
            stage_rows(next, k_base, kv0 + BLOCK_N, BLOCK_N, p.seq_kv, kv_pitch);
            stage_rows(next + BLOCK_N * STRIDE, v_base, kv0 + BLOCK_N, BLOCK_N, p.seq_kv, kv_pitch);
        }
        copy_commit();
        copy_wait<1>();
        __syncthreads();

        // S = Q K^T: NTILES blocks of 8 keys
        float s[NTILES][4];
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                unsigned int kf[2];
                // K rows are the B operand's columns: rows nt*8.., dims ks*16 + (0 | 8)
                ldmatrix_x2(kf, sk + (nt * 8 + lane % 8) * STRIDE + ks * 16 +
                                    ((lane / 8) % 2) * 8);
                mma(s[nt], qf[ks], kf);
            }
        }

        // scale into the exp2 domain, mask, and the tile's row max
        const bool need_mask = kv0 + BLOCK_N > p.seq_kv ||
                               (p.causal && (long long)kv0 + BLOCK_N - 1 >
                                                (long long)q0 + p.causal_offset);
        float mt_lo = NEG_INF, mt_hi = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                unsigned int j = kv0 + nt * 8 + (lane % 4) * 2 + (e % 2);
                unsigned int i = e < 2 ? row_lo : row_hi;
                float x = s[nt][e] * p.scale_log2;
                if (need_mask) {
                    bool vis = i < p.seq_q && j < p.seq_kv &&
                               (!p.causal || (long long)j <= (long long)i + p.causal_offset);
                    x = vis ? x : NEG_INF;
                }
                s[nt][e] = x;
            }
            mt_lo = fmaxf(mt_lo, fmaxf(s[nt][0], s[nt][1]));
            mt_hi = fmaxf(mt_hi, fmaxf(s[nt][2], s[nt][3]));
        }
        mt_lo = row_max4(mt_lo);
        mt_hi = row_max4(mt_hi);
        const float mn_lo = fmaxf(m_lo, mt_lo), mn_hi = fmaxf(m_hi, mt_hi);
        // nothing seen yet (max -inf): any factor will do, and exp2(-inf - -inf) is NaN
        const float a_lo = mn_lo == NEG_INF ? 1.f : exp2f(m_lo - mn_lo);
        const float a_hi = mn_hi == NEG_INF ? 1.f : exp2f(m_hi - mn_hi);
        const float base_lo = mn_lo == NEG_INF ? 0.f : mn_lo;
        const float base_hi = mn_hi == NEG_INF ? 0.f : mn_hi;
        m_lo = mn_lo;
        m_hi = mn_hi;
        float ls_lo = 0.f, ls_hi = 0.f;
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++) {
            s[nt][0] = exp2f(s[nt][0] - base_lo);
            s[nt][1] = exp2f(s[nt][1] - base_lo);
            s[nt][2] = exp2f(s[nt][2] - base_hi);
            s[nt][3] = exp2f(s[nt][3] - base_hi);
            ls_lo += s[nt][0] + s[nt][1];
            ls_hi += s[nt][2] + s[nt][3];
        }
        l_lo = a_lo * l_lo + row_sum4(ls_lo);
        l_hi = a_hi * l_hi + row_sum4(ls_hi);
#pragma unroll
        for (int t = 0; t < DTILES; t++) {
            o[t][0] *= a_lo;
            o[t][1] *= a_lo;
            o[t][2] *= a_hi;
            o[t][3] *= a_hi;
        }

        // O += P V: P's accumulator layout for keys 16kk.. is the A operand's for k = 16kk..
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++) {
            unsigned int pf[4] = {
                pack2(s[2 * kk][0], s[2 * kk][1]),
                pack2(s[2 * kk][2], s[2 * kk][3]),
                pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]),
            };
#pragma unroll
            for (int t = 0; t < DTILES; t++) {
                unsigned int vf[2];
                // V rows are keys (k), its columns dims (n): a transposed load
                ldmatrix_x2_trans(vf, sv + (kk * 16 + (lane % 16)) * STRIDE + t * 8);
                mma(o[t], pf, vf);
            }
        }
        __syncthreads(); // this stage is refilled two tiles on
    }

    // out = O / l, lse = ln(l) + m ln 2 (natural log); rows that saw nothing: 0 and -inf
    const float inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f;
    const float inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
    if (row_lo < p.seq_q) {
        elem_t* dst = out + (((size_t)b * p.seq_q + row_lo) * p.heads_q + h) * HEAD_DIM;
#pragma unroll
        for (int t = 0; t < DTILES; t++) {
            *reinterpret_cast<unsigned int*>(dst + t * 8 + (lane % 4) * 2) =
                pack2(o[t][0] * inv_lo, o[t][1] * inv_lo);
        }
    }
    if (row_hi < p.seq_q) {
        elem_t* dst = out + (((size_t)b * p.seq_q + row_hi) * p.heads_q + h) * HEAD_DIM;
#pragma unroll
        for (int t = 0; t < DTILES; t++) {
            *reinterpret_cast<unsigned int*>(dst + t * 8 + (lane % 4) * 2) =
                pack2(o[t][2] * inv_hi, o[t][3] * inv_hi);
        }
    }
    if (lane % 4 == 0) {
        const float ln2 = 0.6931471805599453f;
        if (row_lo < p.seq_q) {
            lse[((size_t)b * p.heads_q + h) * p.seq_q + row_lo] =
                l_lo > 0.f ? logf(l_lo) + m_lo * ln2 : NEG_INF;
        }
        if (row_hi < p.seq_q) {
            lse[((size_t)b * p.heads_q + h) * p.seq_q + row_hi] =
                l_hi > 0.f ? logf(l_hi) + m_hi * ln2 : NEG_INF;
        }
    }
}
