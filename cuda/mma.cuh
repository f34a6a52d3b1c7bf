// The tensor-core kernels' helpers (flash_fwd.cu, flash_bwd.cu): cp.async staging, ldmatrix,
// mma.sync m16n8k16 and the fragment layouts; put after common.cuh.
//
// Defines expected from the host besides common.cuh's: WARPS (warps per block, 16 rows of the
// block's resident tile each); HEAD_DIM a multiple of 16 and a half ELEM_KIND.
#if !defined(WARPS)
#error "WARPS must be defined"
#endif
#if HEAD_DIM % 16 != 0 || ELEM_KIND == 2
#error "the tensor-core kernels take half elements and head dims that are multiples of 16"
#endif
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

#define THREADS (WARPS * 32)
// shared-memory row stride in elements: 8 more than HEAD_DIM, so the 8 rows an ldmatrix
// reads start 16 bytes apart modulo 128 (no bank conflicts)
#define STRIDE (HEAD_DIM + 8)
#define KSTEPS (HEAD_DIM / 16)
#define DTILES (HEAD_DIM / 8)

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

// A K or V tile of `rows` keys from key row0 of kv head hk (keys past seq_kv as zeros): one
// strided stage_rows, or with PAGED each row found through the block table (kv_row).
__device__ __forceinline__ void stage_kv(elem_t* tile, const elem_t* kv, const Params& p,
                                         const float* __restrict__ extras, unsigned int b,
                                         unsigned int hk, unsigned int row0, int rows) {
#if PAGED
    const int chunks = HEAD_DIM / 8;
    for (int c = threadIdx.x; c < rows * chunks; c += THREADS) {
        int r = c / chunks;
        int d = (c % chunks) * 8;
        unsigned int row = row0 + r;
        bool valid = row < p.seq_kv;
        copy16(tile + r * STRIDE + d, kv + kv_row(p, extras, b, valid ? row : 0, hk) + d, valid);
    }
#else
    stage_rows(tile, kv + kv_row(p, extras, b, 0, hk), row0, rows, p.seq_kv,
               p.heads_kv * HEAD_DIM);
#endif
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

// Dropout's keep flags of this thread's elements of a C-operand block of scores whose rows
// are query rows: bit e for element e, i.e. row_lo (e = 0, 1) and row_lo + 8 (2, 3) x keys j
// and j + 1 (odd e), j = the block's first key + 2 (lane % 4); all set without dropout. j is
// even, so both keys lie in one Philox block (4 keys), and lanes lane and lane ^ 1 hold the
// same key group: each draws the block of one row (even lanes row_lo, odd ones row_lo + 8)
// and they swap its flags, one Philox per lane instead of two.
__device__ __forceinline__ unsigned int dropout_keep_rows(const Params& p, unsigned int bh,
                                                          unsigned int row_lo, unsigned int j) {
#if DROPOUT
    const unsigned int odd = threadIdx.x & 1;
    unsigned int both = dropout_bits(p, bh, row_lo + 8 * odd, j / 4) << (4 * odd);
    // bits 0..3: row_lo's 4 keys, 4..7: row_lo + 8's
    both |= __shfl_xor_sync(0xffffffff, both, 1);
    const unsigned int k = j % 4;
    return ((both >> k) & 3u) | (((both >> (4 + k)) & 3u) << 2);
#else
    return 15u;
#endif
}

// The same for a transposed block, whose rows are keys (dK/dV's S^T): bit e for key j_lo
// (e = 0, 1) and j_lo + 8 (2, 3) x query rows i and i + 1 (odd e), j_lo = the block's first
// key + lane / 4, i = its first row + 2 (lane % 4). The 4 lanes that differ in bits 2 and 3
// of the lane id hold the 4 keys of one Philox block (and of the one 8 keys on) for the same
// rows: each draws one of the 4 blocks they need, element e's for e = its key's word, and
// they gather the 16 flags, one Philox per lane instead of four.
__device__ __forceinline__ unsigned int dropout_keep_keys(const Params& p, unsigned int bh,
                                                          unsigned int j_lo, unsigned int i) {
#if DROPOUT
    const unsigned int m = j_lo % 4; // = (lane / 4) % 4
    // element m's block: row i + m % 2, the key group of j_lo + 8 (m / 2); block e at bits
    // 4e..4e+3
    unsigned int all = dropout_bits(p, bh, i + (m & 1), j_lo / 4 + 2 * (m >> 1)) << (4 * m);
    all |= __shfl_xor_sync(0xffffffff, all, 4);
    all |= __shfl_xor_sync(0xffffffff, all, 8);
    // this thread's key is word m of each block
    return ((all >> m) & 1u) | ((all >> (3 + m)) & 2u) | ((all >> (6 + m)) & 4u) |
           ((all >> (9 + m)) & 8u);
#else
    return 15u;
#endif
}
