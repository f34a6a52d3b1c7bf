// FlashAttention backward (exact) on NVIDIA tensor cores: FlashAttention-2 structure, three
// kernels, deterministic (no atomics: each block owns the gradient rows it writes, as on wgpu).
//
// Compiled at run time by NVRTC (src/cuda/nvrtc.rs), after cuda/common.cuh and cuda/mma.cuh, once per key
// (src/cuda/kernels.rs owns the geometry):
//   -DHEAD_DIM=d     head dimension, a multiple of 16, at most 128
//   -DELEM_KIND=0|1  f16 or bf16 storage, f32 accumulation
//   -DWARPS=w        warps per block: 16 resident keys (dK/dV) or query rows (dQ) each
//   -DBLOCK_Q=m      query rows per streamed Q/dO tile of the dK/dV kernel, a multiple of 16
//   -DBLOCK_N=n      keys per streamed K/V tile of the dQ kernel, a multiple of 16
// Layouts as the forward (cuda/flash_fwd.cu); delta [batch, heads_q, seq_q] f32.
//
// Math (exp2 domain, lse2 = lse * log2(e)): P = exp2(scale_log2 * q.k - lse2), recomputed;
// dP = dO V^T; dS = P * (dP - delta), delta = rowsum(dO * out); dV = P^T dO;
// dK = scale * dS^T Q; dQ = scale * dS K. P and dS are rounded to the element type before
// their products on the tensor cores, as FlashAttention does.
// Dropout (-DDROPOUT=1), Z the pairs' factors (0 dropped, 1 / (1 - p) kept): dV = (P .* Z)^T
// dO (the 0/1 flags in the product, 1 / (1 - p) at the store) and dS = P * (Z dP - delta).
// Blocks (-DBLOCKS=1): a streamed tile whose blocks are all off (for the query head: dK/dV
// takes each head of its group's grid) is skipped before its copies, a tile with some block
// off masked pair by pair. Neither kernel prefetches a tile, so skipping leaves each visited
// tile's barriers and copy waits as they are.

#if !defined(BLOCK_Q) || BLOCK_Q % 16 != 0 || !defined(BLOCK_N) || BLOCK_N % 16 != 0
#error "BLOCK_Q and BLOCK_N (multiples of 16) must be defined"
#endif
#if HEAD_DIM > 128
#error "the backward kernels take head dims up to 128"
#endif
#define BLOCK_RES (WARPS * 16)
#define QTILES (BLOCK_Q / 8)
#define NTILES (BLOCK_N / 8)

// delta[b, h, i] = sum_d dO * out over the row, in f32: one thread a row.
extern "C" __global__ void __launch_bounds__(THREADS) flash_bwd_preprocess(
    const elem_t* __restrict__ out, const elem_t* __restrict__ d_out,
    float* __restrict__ delta, const Params p, unsigned int batch) {
    preprocess_row(out, d_out, delta, p, batch, (size_t)blockIdx.x * THREADS + threadIdx.x);
}

// dK and dV for WARPS * 16 keys of one KV head: every query head of its group, every Q tile
// that can see these keys. Each warp owns 16 keys: their S^T and dP^T blocks (16 keys x
// BLOCK_Q rows) and dK/dV accumulators (16 x HEAD_DIM) live in registers; K and V stay in
// shared memory for the whole call, Q/dO tiles stream through it.
// (THREADS, 1): registers up to 255 (see flash_fwd).
extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_bwd_dkdv(
    const elem_t* __restrict__ q, const elem_t* __restrict__ k, const elem_t* __restrict__ v,
    const elem_t* __restrict__ d_out, const float* __restrict__ lse,
    const float* __restrict__ delta, elem_t* __restrict__ dk, elem_t* __restrict__ dv,
    const Params p_call, const float* __restrict__ extras) {
    const CallShape p = for_batch(p_call, extras, blockIdx.z);
    // K, V: BLOCK_RES rows each; Q, dO: BLOCK_Q rows each; then lse2 and delta per Q row
    extern __shared__ __align__(16) elem_t smem[];
    elem_t* sk = smem;
    elem_t* sv = sk + BLOCK_RES * STRIDE;
    elem_t* sq = sv + BLOCK_RES * STRIDE;
    elem_t* sdo = sq + BLOCK_Q * STRIDE;
    float* slse = reinterpret_cast<float*>(sdo + BLOCK_Q * STRIDE);
    float* sdelta = slse + BLOCK_Q;

    const unsigned int b = blockIdx.z, hk = blockIdx.y;
    const unsigned int kv0 = blockIdx.x * BLOCK_RES;
    const unsigned int group = p.heads_q / p.heads_kv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned int q_pitch = p.heads_q * HEAD_DIM, kv_pitch = p.heads_kv * HEAD_DIM;
    const size_t kv_off = ((size_t)b * p.seq_kv * p.heads_kv + hk) * HEAD_DIM;

    stage_rows(sk, k + kv_off, kv0, BLOCK_RES, p.seq_kv, kv_pitch);
    stage_rows(sv, v + kv_off, kv0, BLOCK_RES, p.seq_kv, kv_pitch);
    copy_commit();

    float dk_acc[DTILES][4], dv_acc[DTILES][4];
    zero<DTILES>(dk_acc);
    zero<DTILES>(dv_acc);
    // the rows that can see these keys: from the first that sees key kv0 (causal or a
    // window) to the last that sees the block's last key (a window's left edge)
    const unsigned int q_start = (q_begin_for_key(p, kv0) / BLOCK_Q) * BLOCK_Q;
    const unsigned int q_stop = q_end_for_keys(p, kv0, kv0 + BLOCK_RES - 1);
    // this thread's keys (rows of its S^T block): key_lo and key_lo + 8
    const unsigned int key_lo = kv0 + warp * 16 + lane / 4;

    for (unsigned int g = 0; g < group; g++) {
        const unsigned int h = hk * group + g;
        const HeadMods hm = head_mods(p, extras, b, h);
        // dropout's stream: the query head's
        [[maybe_unused]] const unsigned int bh = b * p.heads_q + h;
        const size_t q_off = ((size_t)b * p.seq_q * p.heads_q + h) * HEAD_DIM;
        const size_t row_off = ((size_t)b * p.heads_q + h) * p.seq_q;
        for (unsigned int q0 = q_start; q0 < q_stop; q0 += BLOCK_Q) {
            // uniform: the whole block skips, K/V's copies wait for the next visited tile
            const TileBlocks tb =
                IF_BLOCKS(tile_blocks(p, hm, q0, BLOCK_Q, kv0, BLOCK_RES), TILE_WHOLE);
            if (tb.skip) {
                continue;
            }
            __syncthreads(); // the previous tile's readers are done
            stage_rows(sq, q + q_off, q0, BLOCK_Q, p.seq_q, q_pitch);
            stage_rows(sdo, d_out + q_off, q0, BLOCK_Q, p.seq_q, q_pitch);
            copy_commit();
            for (int r = threadIdx.x; r < BLOCK_Q; r += THREADS) {
                const unsigned int i = q0 + r;
                // rows past the sequence get P = 0
                slse[r] = i < p.seq_q ? lse_to_log2(lse[row_off + i]) : POS_INF;
                sdelta[r] = i < p.seq_q ? delta[row_off + i] : 0.f;
            }
            copy_wait<0>();
            __syncthreads();

            // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys
            float s[QTILES][4], dp[QTILES][4];
            zero<QTILES>(s);
            zero<QTILES>(dp);
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                unsigned int kf[4], vf[4];
                load_a(kf, sk, warp * 16, ks);
                load_a(vf, sv, warp * 16, ks);
#pragma unroll
                for (int nt = 0; nt < QTILES; nt++) {
                    unsigned int qb[2], ob[2];
                    load_b_rows(qb, sq, nt * 8, ks);
                    load_b_rows(ob, sdo, nt * 8, ks);
                    mma(s[nt], kf, qb);
                    mma(dp[nt], vf, ob);
                }
            }

            // (P .* keep)^T and dS^T in place: element e of block nt is key key_lo (+8 for
            // e >= 2), row q0 + nt * 8 + 2 (lane % 4) (+1 for odd e)
#pragma unroll
            for (int nt = 0; nt < QTILES; nt++) {
                const unsigned int keep =
                    IF_DROPOUT(dropout_keep_keys(p, bh, key_lo, q0 + nt * 8 + (lane % 4) * 2), 15u);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = nt * 8 + (lane % 4) * 2 + (e % 2);
                    const unsigned int j = key_lo + (e / 2) * 8;
                    const bool vis = IF_BLOCKS(pair_visible(p, hm, tb.partial, q0 + r, j),
                                               visible(p, q0 + r, j));
                    const Finished sc = score_chain_slope(p, hm, s[nt][e] * p.scale_log2, q0 + r, j);
                    const float pr = vis ? recompute_p(sc.s, slse[r]) : 0.f;
                    const float g =
                        vis ? pr * (dropout_keep_scaled(dp[nt][e], keep, e, p.drop_scale) -
                                    sdelta[r])
                            : 0.f;
                    dp[nt][e] = through_score(g, pr, sc.slope);
                    s[nt][e] = dropout_keep(pr, keep, e);
                }
            }

            // dV += (P .* keep)^T dO and dK += dS^T Q: k runs over the tile's rows
#pragma unroll
            for (int kk = 0; kk < BLOCK_Q / 16; kk++) {
                unsigned int pa[4], da[4];
                c_to_a(pa, s, kk);
                c_to_a(da, dp, kk);
#pragma unroll
                for (int t = 0; t < DTILES; t++) {
                    unsigned int ob[2], qb[2];
                    load_b_cols(ob, sdo, kk * 16, t * 8);
                    load_b_cols(qb, sq, kk * 16, t * 8);
                    mma(dv_acc[t], pa, ob);
                    mma(dk_acc[t], da, qb);
                }
            }
        }
    }

    copy_wait<0>(); // K/V copies still in flight when no Q tile was visited
    // dK = scale * dS^T Q: scale = scale_log2 / log2(e); dV times dropout's 1 / (1 - p)
    const float scale = p.scale_log2 * LN2;
    store_rows(dk + kv_off, kv_pitch, key_lo, p.seq_kv, dk_acc, scale, scale);
    const float dv_scale = dropout_rescale(1.f, p.drop_scale);
    store_rows(dv + kv_off, kv_pitch, key_lo, p.seq_kv, dv_acc, dv_scale, dv_scale);
}

// dQ for WARPS * 16 query rows of one head: Q and dO fragments, lse2 and delta of the thread's
// two rows and the dQ accumulator in registers; K/V tiles of BLOCK_N keys stream through
// shared memory (with causal, tiles wholly above the diagonal are never loaded).
extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_bwd_dq(
    const elem_t* __restrict__ q, const elem_t* __restrict__ k, const elem_t* __restrict__ v,
    const elem_t* __restrict__ d_out, const float* __restrict__ lse,
    const float* __restrict__ delta, elem_t* __restrict__ dq, float* __restrict__ bias_grads,
    const Params p_call, const float* __restrict__ extras) {
    const CallShape p = for_batch(p_call, extras, blockIdx.z);
    // Q and dO staged first (BLOCK_RES rows each), then the K and V tiles in the same space
    extern __shared__ __align__(16) elem_t smem[];
    const unsigned int b = blockIdx.z, h = blockIdx.y;
    const unsigned int q0 = blockIdx.x * BLOCK_RES;
    const unsigned int hk = h / (p.heads_q / p.heads_kv);
    const HeadMods hm = head_mods(p, extras, b, h);
    [[maybe_unused]] const unsigned int bh = b * p.heads_q + h; // dropout's stream
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned int q_pitch = p.heads_q * HEAD_DIM, kv_pitch = p.heads_kv * HEAD_DIM;
    const size_t q_off = ((size_t)b * p.seq_q * p.heads_q + h) * HEAD_DIM;
    const size_t kv_off = ((size_t)b * p.seq_kv * p.heads_kv + hk) * HEAD_DIM;
    const size_t row_off = ((size_t)b * p.heads_q + h) * p.seq_q;

    const unsigned int kv_end = kv_end_for_rows(p, q0, BLOCK_RES);

    stage_rows(smem, q + q_off, q0, BLOCK_RES, p.seq_q, q_pitch);
    stage_rows(smem + BLOCK_RES * STRIDE, d_out + q_off, q0, BLOCK_RES, p.seq_q, q_pitch);
    copy_commit();
    copy_wait<0>();
    __syncthreads();
    unsigned int qf[KSTEPS][4], of[KSTEPS][4];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
        load_a(qf[ks], smem, warp * 16, ks);
        load_a(of[ks], smem + BLOCK_RES * STRIDE, warp * 16, ks);
    }
    const unsigned int row_lo = q0 + warp * 16 + lane / 4, row_hi = row_lo + 8;
    // rows past the sequence get P = 0
    const float lse_lo = row_lo < p.seq_q ? lse_to_log2(lse[row_off + row_lo]) : POS_INF;
    const float lse_hi = row_hi < p.seq_q ? lse_to_log2(lse[row_off + row_hi]) : POS_INF;
    const float delta_lo = row_lo < p.seq_q ? delta[row_off + row_lo] : 0.f;
    const float delta_hi = row_hi < p.seq_q ? delta[row_off + row_hi] : 0.f;

    float dq_acc[DTILES][4];
    zero<DTILES>(dq_acc);
    elem_t* sk = smem;
    elem_t* sv = smem + BLOCK_N * STRIDE;
    for (unsigned int kv0 = (kv_begin_for_rows(p, q0) / BLOCK_N) * BLOCK_N; kv0 < kv_end;
         kv0 += BLOCK_N) {
        const TileBlocks tb =
            IF_BLOCKS(tile_blocks(p, hm, q0, BLOCK_RES, kv0, BLOCK_N), TILE_WHOLE);
        if (tb.skip) {
            continue; // uniform: the whole block skips
        }
        __syncthreads(); // Q/dO fragments read, or the previous tile's readers done
        stage_rows(sk, k + kv_off, kv0, BLOCK_N, p.seq_kv, kv_pitch);
        stage_rows(sv, v + kv_off, kv0, BLOCK_N, p.seq_kv, kv_pitch);
        copy_commit();
        copy_wait<0>();
        __syncthreads();

        // S = Q K^T and dP = dO V^T
        float s[NTILES][4], dp[NTILES][4];
        zero<NTILES>(s);
        zero<NTILES>(dp);
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                unsigned int kb[2], vb[2];
                load_b_rows(kb, sk, nt * 8, ks);
                load_b_rows(vb, sv, nt * 8, ks);
                mma(s[nt], qf[ks], kb);
                mma(dp[nt], of[ks], vb);
            }
        }
        // dS in place of dP: element e of block nt is row row_lo (+8 for e >= 2), key
        // kv0 + nt * 8 + 2 (lane % 4) (+1 for odd e)
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++) {
            const unsigned int keep =
                IF_DROPOUT(dropout_keep_rows(p, bh, row_lo, kv0 + nt * 8 + (lane % 4) * 2), 15u);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned int i = e < 2 ? row_lo : row_hi;
                const unsigned int j = kv0 + nt * 8 + (lane % 4) * 2 + (e % 2);
                const bool vis =
                    IF_BLOCKS(pair_visible(p, hm, tb.partial, i, j), visible(p, i, j));
                const Finished sc = score_chain_slope(p, hm, s[nt][e] * p.scale_log2, i, j);
                const float pr = vis ? recompute_p(sc.s, e < 2 ? lse_lo : lse_hi) : 0.f;
                // the gradient at the finished score (kept for d_bias), then through the
                // score transforms (the softcap)
                const float g = vis ? pr * (dropout_keep_scaled(dp[nt][e], keep, e, p.drop_scale) -
                                            (e < 2 ? delta_lo : delta_hi))
                                    : 0.f;
                keep_bias_grad(bias_grads, p, b, h, i, j, g);
                dp[nt][e] = through_score(g, pr, sc.slope);
            }
        }
        // dQ += dS K: k runs over the tile's keys
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; kk++) {
            unsigned int da[4];
            c_to_a(da, dp, kk);
#pragma unroll
            for (int t = 0; t < DTILES; t++) {
                unsigned int kb[2];
                load_b_cols(kb, sk, kk * 16, t * 8);
                mma(dq_acc[t], da, kb);
            }
        }
    }
    const float scale = p.scale_log2 * LN2;
    store_rows(dq + q_off, q_pitch, row_lo, p.seq_q, dq_acc, scale, scale);
}
