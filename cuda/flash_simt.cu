// FlashAttention forward and backward (exact) on the CUDA cores, f32 arithmetic throughout:
// the CUDA path's kernels for what the tensor-core ones (flash_fwd.cu, flash_bwd.cu) do not
// take: f32 tensors (an exact f32 path, no TF32), head dims that are not multiples of 16, and
// the backward past head_dim 128. Same layouts, masking, lse and determinism (no atomics: each
// block owns the rows it writes) as the tensor-core kernels and the wgpu path.
//
// Compiled at run time by NVRTC (src/cuda/nvrtc.rs), after cuda/common.cuh, once per key
// (src/cuda/kernels.rs owns the geometry):
//   -DHEAD_DIM=d       head dimension, 1..=256
//   -DELEM_KIND=0|1|2  f16, bf16 or f32 storage; inputs widened to f32 exactly on load
//   -DTHREADS=t        threads per block
//   -DBLOCK_N=n        rows per streamed shared-memory tile (keys, or queries in dK/dV)
//
// Work split: LANES (8) lanes share one resident row (a query row, or a key in dK/dV); lane l
// holds dims l, l + 8, l + 16, ... (PER of them), so a tile row read by the 8 lanes is 8
// consecutive words (no bank conflict) and a dot product is PER FMAs per lane plus 3 shuffles.
// THREADS / LANES rows are resident per block; K/V (or Q/dO) tiles of BLOCK_N rows are staged
// in shared memory as f32, shared by every resident row.
//
// Math (exp2 domain, as the tensor-core kernels): s = scale_log2 * q.k; forward online
// softmax with running max m and sum l, lse = ln(l) + m ln 2; backward P = exp2(s - lse2),
// lse2 = lse log2(e), dP = dO.v, dS = P (dP - delta), dV += P dO, dK += dS q, dQ += dS k, dK
// and dQ times scale at the end. Dropout (-DDROPOUT=1): as the tensor-core kernels, the
// pairs' 0/1 keep flags in the products (P V, dV) and in dP, 1 / (1 - p) with the
// normalization, at dV's store and in dP: dS = P (Z dP - delta). Blocks (-DBLOCKS=1): a tile
// whose blocks are all off for the block's resident rows (keys in dK/dV, whose grids are the
// query heads') is skipped before it is staged (the loops stage synchronously, so nothing is in
// flight), a tile with some block off is masked pair by pair.

#if !defined(THREADS) || !defined(BLOCK_N)
#error "THREADS and BLOCK_N must be defined"
#endif
#define LANES 8
#define ROWS (THREADS / LANES)
#define PER ((HEAD_DIM + LANES - 1) / LANES)

// the sum of x over the 8 lanes of a row (xor partners below 8 stay inside the row's lanes)
__device__ __forceinline__ float row_sum8(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    x += __shfl_xor_sync(0xffffffff, x, 2);
    return x + __shfl_xor_sync(0xffffffff, x, 4);
}

#if DROPOUT && (BLOCK_N % 32 != 0 || BLOCK_N > 64 || LANES * 4 != 32 || ROWS % 4 != 0)
#error "dropout's tile masks take BLOCK_N 32 or 64 and a warp's 4 rows in one key group"
#endif

// Dropout's keep flags of row i (head bh) for the keys kt..kt + BLOCK_N of a tile (kt a
// multiple of 4): bit jj for key kt + jj; all ones without dropout. The row's 8 lanes draw
// its BLOCK_N / 4 Philox blocks between them (lane l the key groups l, l + 8) and gather the
// flags, so no lane draws more than two a tile.
__device__ __forceinline__ unsigned long long dropout_row_mask(const Params& p,
                                                               unsigned int bh, unsigned int i,
                                                               unsigned int kt, int lane) {
#if DROPOUT
    unsigned int half[2] = {0u, 0u}; // keys 0..31, 32..63
#pragma unroll
    for (int t = 0; t < BLOCK_N / 32; t++) {
        unsigned int x = dropout_bits(p, bh, i, kt / 4 + t * LANES + lane) << (4 * lane);
        x |= __shfl_xor_sync(0xffffffff, x, 1);
        x |= __shfl_xor_sync(0xffffffff, x, 2);
        half[t] = x | __shfl_xor_sync(0xffffffff, x, 4);
    }
    return half[0] | ((unsigned long long)half[1] << 32);
#else
    return ~0ull;
#endif
}

// Dropout's keep flags of key j (head bh) for the rows qt..qt + BLOCK_N of a tile: bit ii for
// row qt + ii; all ones without dropout. A warp's 4 keys (4 rows of 8 lanes, from a block's
// first key, a multiple of ROWS) are one key group, whose pairs with a row share one Philox
// block: the warp's lanes draw the tile's BLOCK_N blocks between them (lane l rows l, l + 32),
// and each key takes its word's flags by ballot.
__device__ __forceinline__ unsigned long long dropout_key_mask(const Params& p,
                                                               unsigned int bh, unsigned int j,
                                                               unsigned int qt) {
#if DROPOUT
    const unsigned int wl = threadIdx.x % 32;
    unsigned int half[2] = {0u, 0u}; // rows 0..31, 32..63
#pragma unroll
    for (int t = 0; t < BLOCK_N / 32; t++) {
        const unsigned int bits = dropout_bits(p, bh, qt + 32 * t + wl, j / 4);
#pragma unroll
        for (unsigned int k = 0; k < 4; k++) {
            const unsigned int rows = __ballot_sync(0xffffffff, (bits >> k) & 1u);
            half[t] = k == j % 4 ? rows : half[t];
        }
    }
    return half[0] | ((unsigned long long)half[1] << 32);
#else
    return ~0ull;
#endif
}

// this lane's dims of one row of a [.., seq, heads, HEAD_DIM] tensor (at `row`, already
// offset to its head), widened to f32 and times `scale`; zeros past HEAD_DIM or past the
// sequence
__device__ __forceinline__ void load_row(float* dst, const elem_t* row, bool valid, int lane,
                                         float scale) {
#pragma unroll
    for (int c = 0; c < PER; c++) {
        const int d = lane + c * LANES;
        dst[c] = (valid && d < HEAD_DIM) ? to_f32(row[d]) * scale : 0.f;
    }
}

// dot product of this lane's dims with a staged f32 tile row, summed over the row's lanes
__device__ __forceinline__ float dot_row(const float* x, const float* tile_row, int lane) {
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < PER; c++) {
        const int d = lane + c * LANES;
        if (d < HEAD_DIM) {
            acc = fmaf(x[c], tile_row[d], acc);
        }
    }
    return row_sum8(acc);
}

// acc += w * tile_row, this lane's dims
__device__ __forceinline__ void axpy_row(float* acc, float w, const float* tile_row, int lane) {
#pragma unroll
    for (int c = 0; c < PER; c++) {
        const int d = lane + c * LANES;
        if (d < HEAD_DIM) {
            acc[c] = fmaf(w, tile_row[d], acc[c]);
        }
    }
}

// this lane's dims of acc times `scale`, rounded to the element type, into a row
__device__ __forceinline__ void store_row(elem_t* row, const float* acc, int lane, float scale) {
#pragma unroll
    for (int c = 0; c < PER; c++) {
        const int d = lane + c * LANES;
        if (d < HEAD_DIM) {
            row[d] = from_f32(acc[c] * scale);
        }
    }
}

// rows [row0, row0 + BLOCK_N) of a [.., seq, heads, HEAD_DIM] tensor at one (batch, head)
// into a shared f32 tile of BLOCK_N x HEAD_DIM (coalesced: consecutive threads, consecutive
// dims); rows past `seq` become zeros
__device__ __forceinline__ void stage_f32(float* tile, const elem_t* base, unsigned int row0,
                                          unsigned int seq, unsigned int row_pitch) {
    for (int e = threadIdx.x; e < BLOCK_N * HEAD_DIM; e += THREADS) {
        const int r = e / HEAD_DIM, d = e % HEAD_DIM;
        const unsigned int row = row0 + r;
        tile[e] = row < seq ? to_f32(base[(size_t)row * row_pitch + d]) : 0.f;
    }
}

// A K or V tile of BLOCK_N keys from key row0 of kv head hk, in f32 (keys past seq_kv as
// zeros); each row found by kv_row (dense, or through a paged call's block table).
__device__ __forceinline__ void stage_kv_f32(float* tile, const elem_t* kv, const Params& p,
                                             const float* __restrict__ extras, unsigned int b,
                                             unsigned int hk, unsigned int row0) {
    for (int e = threadIdx.x; e < BLOCK_N * HEAD_DIM; e += THREADS) {
        const int r = e / HEAD_DIM, d = e % HEAD_DIM;
        const unsigned int row = row0 + r;
        tile[e] = row < p.seq_kv ? to_f32(kv[kv_row(p, extras, b, row, hk) + d]) : 0.f;
    }
}

// Forward: ROWS query rows of one (batch, head) per block; K/V tiles streamed.
// (THREADS, 1) on the three main kernels: without it ptxas spills some head dims at 48
// registers (dK/dV at head_dim 13) while far more are free.
extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_simt_fwd(
    const elem_t* __restrict__ q, const elem_t* __restrict__ k, const elem_t* __restrict__ v,
    elem_t* __restrict__ out, float* __restrict__ lse, const Params p_call,
    const float* __restrict__ extras) {
    const CallShape p = for_batch(p_call, extras, blockIdx.z);
    extern __shared__ float smem_f[];
    float* sk = smem_f;
    float* sv = sk + BLOCK_N * HEAD_DIM;
    const unsigned int b = blockIdx.z, h = blockIdx.y, hk = h / (p.heads_q / p.heads_kv);
    const HeadMods hm = head_mods(p, extras, b, h);
    [[maybe_unused]] const unsigned int bh = b * p.heads_q + h; // dropout's stream
    const unsigned int q0 = blockIdx.x * ROWS;
    const unsigned int i = q0 + threadIdx.x / LANES;
    const int lane = threadIdx.x % LANES;
    const bool row_ok = i < p.seq_q;
    const size_t q_row = (((size_t)b * p.seq_q + (row_ok ? i : 0)) * p.heads_q + h) * HEAD_DIM;

    float qv[PER], o[PER];
    load_row(qv, q + q_row, row_ok, lane, p.scale_log2);
#pragma unroll
    for (int c = 0; c < PER; c++) {
        o[c] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    const unsigned int kv_end = kv_end_for_rows(p, q0, ROWS);
    for (unsigned int kt = (kv_begin_for_rows(p, q0) / BLOCK_N) * BLOCK_N; kt < kv_end;
         kt += BLOCK_N) {
        const TileBlocks tb = IF_BLOCKS(tile_blocks(p, hm, q0, ROWS, kt, BLOCK_N), TILE_WHOLE);
        if (tb.skip) {
            continue; // uniform: the whole block skips
        }
        __syncthreads();
        stage_kv_f32(sk, k, p, extras, b, hk, kt);
        stage_kv_f32(sv, v, p, extras, b, hk, kt);
        __syncthreads();
        const unsigned long long kept =
            IF_DROPOUT(dropout_row_mask(p, bh, i, kt, lane), ~0ull);
        const int n = min((unsigned int)BLOCK_N, kv_end - kt);
        for (int jj = 0; jj < n; jj++) {
            const float s = finish_score(p, hm, dot_row(qv, sk + jj * HEAD_DIM, lane), i, kt + jj);
            const bool vis = IF_BLOCKS(pair_visible(p, hm, tb.partial, i, kt + jj),
                                       visible(p, i, kt + jj));
            if (!vis || s == NEG_INF) {
                continue;
            }
            if (s > m) {
                // a new running max: rescale what was summed under the old one (none yet
                // when m is -inf)
                const float a = m == NEG_INF ? 0.f : exp2f(m - s);
                l *= a;
#pragma unroll
                for (int c = 0; c < PER; c++) {
                    o[c] *= a;
                }
                m = s;
            }
            const float w = exp2f(s - m); // NaN where s or m is NaN: the row comes out NaN
            l += w; // the whole P (dropout's dropped pairs too), as the lse
            axpy_row(o, dropout_keep(w, kept, jj), sv + jj * HEAD_DIM, lane);
        }
    }
    if (row_ok) {
        store_row(out + q_row, o, lane, dropout_rescale(row_inv(l, m, hm), p.drop_scale));
        if (lane == 0) {
            lse[((size_t)b * p.heads_q + h) * p.seq_q + i] = row_lse(l, m, hm);
        }
    }
}

// delta[b, h, i] = sum_d dO * out over the row, in f32: one thread a row.
extern "C" __global__ void __launch_bounds__(THREADS) flash_simt_bwd_preprocess(
    const elem_t* __restrict__ out, const elem_t* __restrict__ d_out,
    float* __restrict__ delta, const Params p, unsigned int batch) {
    preprocess_row(out, d_out, delta, p, batch, (size_t)blockIdx.x * THREADS + threadIdx.x);
}

// dK and dV for ROWS keys of one KV head per block: every query head of its group, every
// Q/dO tile whose rows can see these keys; lse2 and delta staged beside each tile.
extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_simt_dkdv(
    const elem_t* __restrict__ q, const elem_t* __restrict__ k, const elem_t* __restrict__ v,
    const elem_t* __restrict__ d_out, const float* __restrict__ lse,
    const float* __restrict__ delta, elem_t* __restrict__ dk, elem_t* __restrict__ dv,
    const Params p_call, const float* __restrict__ extras) {
    const CallShape p = for_batch(p_call, extras, blockIdx.z);
    extern __shared__ float smem_f[];
    float* sq = smem_f;
    float* sdo = sq + BLOCK_N * HEAD_DIM;
    float* slse = sdo + BLOCK_N * HEAD_DIM;
    float* sdelta = slse + BLOCK_N;
    const unsigned int b = blockIdx.z, hk = blockIdx.y, group = p.heads_q / p.heads_kv;
    const unsigned int kv0 = blockIdx.x * ROWS;
    const unsigned int j = kv0 + threadIdx.x / LANES;
    const int lane = threadIdx.x % LANES;
    const bool key_ok = j < p.seq_kv;
    const size_t kv_row = (((size_t)b * p.seq_kv + (key_ok ? j : 0)) * p.heads_kv + hk) * HEAD_DIM;
    const unsigned int q_pitch = p.heads_q * HEAD_DIM;

    float kv[PER], vv[PER], dk_acc[PER], dv_acc[PER];
    load_row(kv, k + kv_row, key_ok, lane, 1.f);
    load_row(vv, v + kv_row, key_ok, lane, 1.f);
#pragma unroll
    for (int c = 0; c < PER; c++) {
        dk_acc[c] = dv_acc[c] = 0.f;
    }
    // the rows that can see these keys (causal, a window)
    const unsigned int q_begin = q_begin_for_key(p, kv0);
    const unsigned int q_stop = q_end_for_keys(p, kv0, kv0 + ROWS - 1);
    for (unsigned int hq = hk * group; hq < (hk + 1) * group; hq++) {
        const HeadMods hm = head_mods(p, extras, b, hq);
        // dropout's stream: the query head's
        [[maybe_unused]] const unsigned int bh = b * p.heads_q + hq;
        const size_t q_off = ((size_t)b * p.seq_q * p.heads_q + hq) * HEAD_DIM;
        const size_t row_off = ((size_t)b * p.heads_q + hq) * p.seq_q;
        for (unsigned int qt = q_begin; qt < q_stop; qt += BLOCK_N) {
            const TileBlocks tb = IF_BLOCKS(tile_blocks(p, hm, qt, BLOCK_N, kv0, ROWS), TILE_WHOLE);
            if (tb.skip) {
                continue; // uniform: the whole block skips
            }
            __syncthreads();
            stage_f32(sq, q + q_off, qt, p.seq_q, q_pitch);
            stage_f32(sdo, d_out + q_off, qt, p.seq_q, q_pitch);
            for (int r = threadIdx.x; r < BLOCK_N; r += THREADS) {
                const unsigned int i = qt + r;
                slse[r] = i < p.seq_q ? lse_to_log2(lse[row_off + i]) : POS_INF;
                sdelta[r] = i < p.seq_q ? delta[row_off + i] : 0.f;
            }
            __syncthreads();
            const unsigned long long kept =
                IF_DROPOUT(dropout_key_mask(p, bh, j, qt), ~0ull);
            const int n = min((unsigned int)BLOCK_N, q_stop - qt);
            for (int ii = 0; ii < n; ii++) {
                const float* qi = sq + ii * HEAD_DIM;
                const float* doi = sdo + ii * HEAD_DIM;
                const Finished f =
                    score_chain_slope(p, hm, dot_row(kv, qi, lane) * p.scale_log2, qt + ii, j);
                const float dp = dot_row(vv, doi, lane);
                const bool vis = IF_BLOCKS(pair_visible(p, hm, tb.partial, qt + ii, j),
                                           visible(p, qt + ii, j));
                if (!vis) {
                    continue;
                }
                const float pr = recompute_p(f.s, slse[ii]);
                const float zdp = dropout_keep_scaled(dp, kept, ii, p.drop_scale);
                const float ds = through_score(pr * (zdp - sdelta[ii]), pr, f.slope);
                axpy_row(dv_acc, dropout_keep(pr, kept, ii), doi, lane);
                axpy_row(dk_acc, ds, qi, lane);
            }
        }
    }
    if (key_ok) {
        store_row(dk + kv_row, dk_acc, lane, p.scale_log2 * LN2);
        store_row(dv + kv_row, dv_acc, lane, dropout_rescale(1.f, p.drop_scale));
    }
}

// dQ for ROWS query rows of one (batch, head) per block; K/V tiles streamed.
extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_simt_dq(
    const elem_t* __restrict__ q, const elem_t* __restrict__ k, const elem_t* __restrict__ v,
    const elem_t* __restrict__ d_out, const float* __restrict__ lse,
    const float* __restrict__ delta, elem_t* __restrict__ dq, float* __restrict__ bias_grads,
    const Params p_call, const float* __restrict__ extras) {
    const CallShape p = for_batch(p_call, extras, blockIdx.z);
    extern __shared__ float smem_f[];
    float* sk = smem_f;
    float* sv = sk + BLOCK_N * HEAD_DIM;
    const unsigned int b = blockIdx.z, h = blockIdx.y, hk = h / (p.heads_q / p.heads_kv);
    const HeadMods hm = head_mods(p, extras, b, h);
    [[maybe_unused]] const unsigned int bh = b * p.heads_q + h; // dropout's stream
    const unsigned int q0 = blockIdx.x * ROWS;
    const unsigned int i = q0 + threadIdx.x / LANES;
    const int lane = threadIdx.x % LANES;
    const bool row_ok = i < p.seq_q;
    const size_t q_row = (((size_t)b * p.seq_q + (row_ok ? i : 0)) * p.heads_q + h) * HEAD_DIM;
    const size_t kv_off = ((size_t)b * p.seq_kv * p.heads_kv + hk) * HEAD_DIM;
    const unsigned int kv_pitch = p.heads_kv * HEAD_DIM;
    const size_t r = ((size_t)b * p.heads_q + h) * p.seq_q + (row_ok ? i : 0);
    const float lse2 = lse_to_log2(lse[r]), delta_i = delta[r];

    float qv[PER], dov[PER], dq_acc[PER];
    load_row(qv, q + q_row, row_ok, lane, p.scale_log2);
    load_row(dov, d_out + q_row, row_ok, lane, 1.f);
#pragma unroll
    for (int c = 0; c < PER; c++) {
        dq_acc[c] = 0.f;
    }
    const unsigned int kv_end = kv_end_for_rows(p, q0, ROWS);
    for (unsigned int kt = (kv_begin_for_rows(p, q0) / BLOCK_N) * BLOCK_N; kt < kv_end;
         kt += BLOCK_N) {
        const TileBlocks tb = IF_BLOCKS(tile_blocks(p, hm, q0, ROWS, kt, BLOCK_N), TILE_WHOLE);
        if (tb.skip) {
            continue; // uniform: the whole block skips
        }
        __syncthreads();
        stage_f32(sk, k + kv_off, kt, p.seq_kv, kv_pitch);
        stage_f32(sv, v + kv_off, kt, p.seq_kv, kv_pitch);
        __syncthreads();
        const unsigned long long kept =
            IF_DROPOUT(dropout_row_mask(p, bh, i, kt, lane), ~0ull);
        const int n = min((unsigned int)BLOCK_N, kv_end - kt);
        for (int jj = 0; jj < n; jj++) {
            const float* kj = sk + jj * HEAD_DIM;
            const Finished f = score_chain_slope(p, hm, dot_row(qv, kj, lane), i, kt + jj);
            const float dp = dot_row(dov, sv + jj * HEAD_DIM, lane);
            const bool vis = IF_BLOCKS(pair_visible(p, hm, tb.partial, i, kt + jj),
                                       visible(p, i, kt + jj));
            if (!vis) {
                continue;
            }
            const float zdp = dropout_keep_scaled(dp, kept, jj, p.drop_scale);
            // the gradient at the finished score (kept for d_bias by one lane of the row),
            // then through the softcap
            const float pr = recompute_p(f.s, lse2);
            const float g = pr * (zdp - delta_i);
            if (lane == 0) {
                keep_bias_grad(bias_grads, p, b, h, i, kt + jj, g);
            }
            const float ds = through_score(g, pr, f.slope);
            axpy_row(dq_acc, ds, kj, lane);
        }
    }
    if (row_ok) {
        store_row(dq + q_row, dq_acc, lane, p.scale_log2 * LN2);
    }
}

#if MASK_MOD
// A user mask's block mask (CudaContext::create_block_mask, FlexAttention's create_block_mask),
// as shaders/mask_blocks.wgsl: thread e takes block (b, h, r, c) of [batch, heads, rows, cols]
// (blocks of p.block_q x p.block_kv over p.seq_q x p.seq_kv, p.blocks_cols a row, heads in
// p.heads_q) and writes 2 where mask_mod passes every pair of it, 1 where it passes some,
// else 0, evaluating its pairs in turn until both are decided.
extern "C" __global__ void __launch_bounds__(256)
    flash_mask_blocks(float* __restrict__ blocks, const Params p, unsigned int n) {
    const unsigned int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) {
        return;
    }
    const unsigned int cols = p.blocks_cols, rows = (p.seq_q + p.block_q - 1) / p.block_q;
    const unsigned int c = e % cols, r = (e / cols) % rows, bh = e / (cols * rows);
    const unsigned int b = bh / p.heads_q, h = bh % p.heads_q;
    const unsigned int i_end = min((r + 1) * p.block_q, p.seq_q);
    const unsigned int j_end = min((c + 1) * p.block_kv, p.seq_kv);
    bool any = false, all = true;
    for (unsigned int i = r * p.block_q; i < i_end && !(any && !all); i++) {
        for (unsigned int j = c * p.block_kv; j < j_end; j++) {
            const bool seen = mask_mod(b, h, i, j);
            any = any || seen;
            all = all && seen;
        }
    }
    blocks[e] = all ? 2.f : (any ? 1.f : 0.f);
}
#endif
