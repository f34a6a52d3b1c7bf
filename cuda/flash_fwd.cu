// FlashAttention forward (exact) on NVIDIA tensor cores: FlashAttention-2 structure.
//
// Compiled at run time by NVRTC (src/cuda/nvrtc.rs), after cuda/common.cuh and cuda/mma.cuh, once per key
// (src/cuda/kernels.rs, which owns the launch geometry and passes it in):
//   -DHEAD_DIM=d     head dimension, a multiple of 16, at most 256
//   -DELEM_KIND=0|1  f16 or bf16 storage (both multiply on tensor cores with f32 accumulation)
//   -DWARPS=w        warps per block, 16 query rows each
//   -DBLOCK_N=n      keys per K/V tile, a multiple of 16
// Layouts as the wgpu path (shaders/common.wgsl): q, out [batch, seq_q, heads_q, HEAD_DIM];
// k, v [batch, seq_kv, heads_kv, HEAD_DIM] (with -DPAGED=1, pages of k and v found through the
// block table: kv_row in common.cuh); lse [batch, heads_q, seq_q] (natural log). Causal is bottom-right aligned: key j is visible to row i when j <= i + causal_offset.
//
// Grid:    (ceil(seq_q / BLOCK_M), heads_q, batch); WARPS warps, each owning 16 query rows.
// Loop:    over K/V tiles of BLOCK_N keys, staged in shared memory with cp.async (the next
//          tile's copy is in flight while this one is used: two stages); with causal, tiles
//          wholly above the diagonal are never loaded.
// Math:    S = Q K^T and O += P V with mma.sync m16n8k16 (operands via ldmatrix), online
//          softmax in registers in the exp2 domain (running max and sum, exact), one write of
//          out and lse. A row that sees no key gets out = 0 and lse = -inf, as on wgpu.
// Dropout (-DDROPOUT=1): P V takes the kept pairs' P (dropped ones 0), the row sum and lse
//          the whole P; the kept pairs' 1 / (1 - p) is applied with the normalization.
// Blocks (-DBLOCKS=1): tiles whose blocks are all off for the block's rows are stepped over
//          before their copies are issued (next_kv_tile), so the two stages alternate over the
//          visited tiles only; a tile with some block off is masked pair by pair.
// Varlen (-DVARLEN=1): packed sequences; the loop runs from the first row's sequence's keys
//          to the last row's, tiles with no pair of one sequence in its band are stepped
//          over as the block mask's (next_kv_tile), and a tile that straddles sequences is
//          masked pair by pair (all in cuda/common.cuh).

#if !defined(BLOCK_N) || BLOCK_N % 16 != 0
#error "BLOCK_N (a multiple of 16) must be defined"
#endif
#define BLOCK_M (WARPS * 16)
#define NTILES (BLOCK_N / 8)

// (THREADS, 1): registers up to 255. Without the 1, ptxas capped some head dims at 128 and
// spilled (head_dim 48: 8 bytes); occupancy against registers is to be tuned on a GPU.
extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_fwd(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
              const elem_t* __restrict__ v, elem_t* __restrict__ out, float* __restrict__ lse,
              const Params p_call, const float* __restrict__ extras) {
    const CallShape p = for_batch(p_call, extras, blockIdx.z);
    // Q staged here first, then read into registers; then the two K/V stages. Dynamic, as
    // it passes the 48 KiB of static shared memory at head_dim 128 (size: the host's
    // CudaKey::shared_bytes)
    extern __shared__ __align__(16) elem_t smem[];
    const unsigned int b = blockIdx.z, h = blockIdx.y;
    const unsigned int q0 = blockIdx.x * BLOCK_M;
    const unsigned int hk = h / (p.heads_q / p.heads_kv);
    const HeadMods hm = head_mods(p, extras, b, h);
    [[maybe_unused]] const unsigned int bh = b * p.heads_q + h; // dropout's stream
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned int q_pitch = p.heads_q * HEAD_DIM;
    const elem_t* q_base = q + ((size_t)b * p.seq_q * p.heads_q + h) * HEAD_DIM;

    const unsigned int kv_end = kv_end_for_rows(p, q0, BLOCK_M);
    // the first tile a row of the block sees (a window's left edge)
    const unsigned int kv_first = (kv_begin_for_rows(p, q0) / BLOCK_N) * BLOCK_N;

    // Q fragments: this warp's 16 rows, KSTEPS blocks of 16 dims, 4 regs each
    stage_rows(smem, q_base, q0, BLOCK_M, p.seq_q, q_pitch);
    copy_commit();
    copy_wait<0>();
    __syncthreads();
    unsigned int qf[KSTEPS][4];
    {
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
            load_a(qf[ks], smem, warp * 16, ks);
        }
    }
    __syncthreads();

    // stage s: K at smem + s * 2 * BLOCK_N * STRIDE, V right after it; the first tile the
    // block mask lets through (with it, `partial`: some of its blocks are off)
    bool partial = false;
    const unsigned int kv_start = IF_BLOCKS(
        next_kv_tile(p, hm, q0, BLOCK_M, kv_first, BLOCK_N, kv_end, partial), kv_first);
    if (kv_end > kv_start) {
        stage_kv(smem, k, p, extras, b, hk, kv_start, BLOCK_N);
        stage_kv(smem + BLOCK_N * STRIDE, v, p, extras, b, hk, kv_start, BLOCK_N);
    }
    copy_commit();

    // this thread's two rows: r_lo = lane / 4 and r_hi = r_lo + 8 of the warp's 16
    const unsigned int row_lo = q0 + warp * 16 + lane / 4, row_hi = row_lo + 8;
    float o[DTILES][4];
    zero<DTILES>(o);
    float m_lo = NEG_INF, m_hi = NEG_INF, l_lo = 0.f, l_hi = 0.f;

    int stage = 0;
    for (unsigned int kv0 = kv_start, kv_next; kv0 < kv_end; kv0 = kv_next, stage ^= 1) {
        // the next visited tile's copy goes out before this one is used
        const elem_t* sk = smem + stage * 2 * BLOCK_N * STRIDE;
        const elem_t* sv = sk + BLOCK_N * STRIDE;
        bool next_partial = false;
        kv_next = IF_BLOCKS(
            next_kv_tile(p, hm, q0, BLOCK_M, kv0 + BLOCK_N, BLOCK_N, kv_end, next_partial),
            kv0 + BLOCK_N);
        if (kv_next < kv_end) {
            elem_t* next = smem + (stage ^ 1) * 2 * BLOCK_N * STRIDE;
            stage_kv(next, k, p, extras, b, hk, kv_next, BLOCK_N);
            stage_kv(next + BLOCK_N * STRIDE, v, p, extras, b, hk, kv_next, BLOCK_N);
        }
        copy_commit();
        copy_wait<1>();
        __syncthreads();

        // S = Q K^T: NTILES blocks of 8 keys
        float s[NTILES][4];
        zero<NTILES>(s);
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                unsigned int kf[2];
                load_b_rows(kf, sk, nt * 8, ks);
                mma(s[nt], qf[ks], kf);
            }
        }

        // scale into the exp2 domain, mask, and the tile's row max
        const bool need_mask = tile_needs_mask(p, q0, BLOCK_M, kv0, BLOCK_N) || partial;
        float mt_lo = NEG_INF, mt_hi = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                unsigned int j = kv0 + nt * 8 + (lane % 4) * 2 + (e % 2);
                unsigned int i = e < 2 ? row_lo : row_hi;
                float x = finish_score(p, hm, s[nt][e] * p.scale_log2, i, j);
                if (need_mask) {
                    const bool vis =
                        IF_BLOCKS(pair_visible(p, hm, partial, i, j), visible(p, i, j));
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
            const unsigned int keep =
                IF_DROPOUT(dropout_keep_rows(p, bh, row_lo, kv0 + nt * 8 + (lane % 4) * 2), 15u);
            s[nt][0] = dropout_keep(s[nt][0], keep, 0);
            s[nt][1] = dropout_keep(s[nt][1], keep, 1);
            s[nt][2] = dropout_keep(s[nt][2], keep, 2);
            s[nt][3] = dropout_keep(s[nt][3], keep, 3);
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
            unsigned int pf[4];
            c_to_a(pf, s, kk);
#pragma unroll
            for (int t = 0; t < DTILES; t++) {
                unsigned int vf[2];
                load_b_cols(vf, sv, kk * 16, t * 8);
                mma(o[t], pf, vf);
            }
        }
        __syncthreads(); // this stage is refilled two tiles on
        partial = next_partial;
    }

    // out = O / l (times dropout's 1 / (1 - p)), lse = ln(l) + m ln 2 (natural log); rows
    // that saw nothing: 0 and -inf
    const float inv_lo = dropout_rescale(row_inv(l_lo, m_lo, hm), p.drop_scale);
    const float inv_hi = dropout_rescale(row_inv(l_hi, m_hi, hm), p.drop_scale);
    store_rows(out + ((size_t)b * p.seq_q * p.heads_q + h) * HEAD_DIM, q_pitch, row_lo, p.seq_q,
               o, inv_lo, inv_hi);
    if (lane % 4 == 0) {
        if (row_lo < p.seq_q) {
            lse[((size_t)b * p.heads_q + h) * p.seq_q + row_lo] =
                row_lse(l_lo, m_lo, hm);
        }
        if (row_hi < p.seq_q) {
            lse[((size_t)b * p.heads_q + h) * p.seq_q + row_hi] =
                row_lse(l_hi, m_hi, hm);
        }
    }
}
