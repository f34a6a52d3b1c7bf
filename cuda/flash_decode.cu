// Decode (FlashDecoding) on the CUDA cores: a few query rows against many keys, as
// shaders/flash_decode.wgsl on wgpu. One block serves every query head that shares a kv head
// and every query row of the call, DECODE_ROWS packed rows at a time (GQA packing: each K/V
// row is read once per kv head, not once per query head), over one split of the keys
// (split-KV), so the keys of one head spread over many blocks. f32 arithmetic throughout:
// a decode step moves K and V once and does 4 FLOPs per element moved, far below what the
// CUDA cores sustain, so the tensor cores would buy nothing here.
//
// Compiled at run time by NVRTC (src/cuda/nvrtc.rs), after cuda/common.cuh, once per key
// (src/cuda/kernels.rs owns the geometry):
//   -DHEAD_DIM=d        head dimension, 1..=256
//   -DELEM_KIND=0|1|2   f16, bf16 or f32 storage, widened to f32 exactly on load
//   -DTHREADS=t         threads per block (a multiple of 32)
//   -DDECODE_ROWS=r     packed rows per block (1, 2 or 4)
//   -DKEY_LANES=g       lanes that share one key (8, 16 or 32), PER dims each
//   -DDECODE_VEC=0|1    1: each lane's dims are whole 16-byte words (HEAD_DIM = g * PER and
//                       PER elements a multiple of 16 bytes), read a word at a time
//
// Grid:    (chunks * splits, heads_kv, batch); chunks of DECODE_ROWS packed rows, packed row
//          p (of group * seq_q) being query row p / group of query head hk * group + p % group.
// Split s: keys [s * split_keys, (s + 1) * split_keys), within the keys its rows can see.
// Loop:    the block's THREADS / KEY_LANES lane groups take the split's keys four at a time
//          (group g keys 4g.., then 4(g + GROUPS).., a Philox block of dropout each; a quad no
//          row sees is not read), straight from global memory: lane l reads dims
//          [l PER, (l + 1) PER) of the quad's four K rows (the loads issued together), dots
//          them with its slice of every row's q (registers), and the group's lanes sum the
//          parts by shuffles; each group keeps its own online softmax per row (running max m,
//          sum l, its lanes' slice of the output), rescaled once a quad, then reads the four
//          V rows and adds them. (V is read after the scores: with it beside K, every
//          modifier at once spills on sm_80.)
// Merge:   the groups' states meet exactly at the end, by shuffles within a warp and through
//          shared memory across warps, in a fixed order (deterministic, no atomics).
// Output:  with one split (`direct`), out and lse of the rows, finished as the forward
//          kernels finish them (sinks, dropout's 1 / (1 - p)); else the split's partial result,
//          out normalized over its own keys and their lse (no sink), f32, into
//          part_out [splits, batch, seq_q, heads_q, HEAD_DIM] and part_lse [splits, batch,
//          heads_q, seq_q], which flash_decode_combine merges.
// Math:    exp2 domain, s = scale_log2 q.k finished by finish_score (softcap, ALiBi, bias);
//          a pair that is hidden, or whose score is -inf, takes no part (its V row is not
//          read into the row: NaN or Inf there cannot reach it); a NaN score makes its row NaN.

#if !defined(THREADS) || !defined(DECODE_ROWS) || !defined(KEY_LANES) || !defined(DECODE_VEC)
#error "THREADS, DECODE_ROWS, KEY_LANES and DECODE_VEC must be defined"
#endif
#if VARLEN
#error "packed sequences take the forward kernels, not the decode path"
#endif
#define GROUPS (THREADS / KEY_LANES)
#define WARPS_D (THREADS / 32)
#define PER ((HEAD_DIM + KEY_LANES - 1) / KEY_LANES)
#if DECODE_VEC && (KEY_LANES * PER != HEAD_DIM || (PER * ELEM_BYTES) % 16 != 0)
#error "DECODE_VEC needs whole 16-byte words per lane"
#endif

// this lane's dims of one row (at `row`, offset to its head), widened to f32; 0 past HEAD_DIM
__device__ __forceinline__ void load_slice(float* dst, const elem_t* __restrict__ row, int lane) {
#if DECODE_VEC
    const uint4* src = reinterpret_cast<const uint4*>(row + lane * PER);
#pragma unroll
    for (int w = 0; w < PER * ELEM_BYTES / 16; w++) {
        const uint4 x = __ldg(src + w);
        const unsigned int words[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int u = 0; u < 4; u++) {
#if ELEM_KIND == 2
            dst[w * 4 + u] = __uint_as_float(words[u]);
#else
            // two elements a word, the lower address in the low half
            dst[w * 8 + 2 * u] = to_f32((elem_t)(words[u] & 0xffffu));
            dst[w * 8 + 2 * u + 1] = to_f32((elem_t)(words[u] >> 16));
#endif
        }
    }
#else
#pragma unroll
    for (int c = 0; c < PER; c++) {
        const int d = lane * PER + c;
        dst[c] = d < HEAD_DIM ? to_f32(row[d]) : 0.f;
    }
#endif
}

// the sum of x over the KEY_LANES lanes of a group (`mask`: the group's lanes)
__device__ __forceinline__ float group_sum(float x, unsigned int mask) {
#pragma unroll
    for (int o = KEY_LANES / 2; o > 0; o /= 2) {
        x += __shfl_xor_sync(mask, x, o, KEY_LANES);
    }
    return x;
}

// Folds the state (mb, lb, xb[]) of another part of the keys into (m, l, x[]): the exact
// merge of two online softmaxes (running max, sum, unnormalized output). A part that saw
// nothing (m = -inf) adds nothing; a NaN sum stays NaN.
__device__ __forceinline__ void fold_state(float& m, float& l, float* x, float mb, float lb,
                                           const float* xb) {
    const float top = fmaxf(m, mb);
    const float a = m == NEG_INF ? 0.f : exp2f(m - top);
    const float c = mb == NEG_INF ? 0.f : exp2f(mb - top);
    l = l * a + lb * c;
#pragma unroll
    for (int d = 0; d < PER; d++) {
        x[d] = x[d] * a + xb[d] * c;
    }
    m = top;
}

// the block's rows' states, one per warp, where warp 0 merges them
__shared__ float s_m[WARPS_D][DECODE_ROWS];
__shared__ float s_l[WARPS_D][DECODE_ROWS];
__shared__ float s_acc[WARPS_D][DECODE_ROWS][KEY_LANES * PER];

extern "C" __global__ void __launch_bounds__(THREADS, 1) flash_decode(
    const elem_t* __restrict__ q, const elem_t* __restrict__ k, const elem_t* __restrict__ v,
    float* __restrict__ part_out, float* __restrict__ part_lse, elem_t* __restrict__ out,
    float* __restrict__ lse, const Params p_call, unsigned int splits,
    unsigned int split_keys, unsigned int direct, const float* __restrict__ extras) {
    const unsigned int b = blockIdx.z, hk = blockIdx.y;
    const unsigned int split = blockIdx.x % splits, chunk = blockIdx.x / splits;
    const CallShape p = for_batch(p_call, extras, b);
    const unsigned int group = p.heads_q / p.heads_kv, rows = group * p.seq_q;
    const unsigned int p0 = chunk * DECODE_ROWS;
    const int lane = threadIdx.x % KEY_LANES, g = threadIdx.x / KEY_LANES;
    const unsigned int warp_lane = threadIdx.x % 32;
    const unsigned int gmask = KEY_LANES == 32
                                   ? 0xffffffffu
                                   : ((1u << KEY_LANES) - 1u) << (warp_lane / KEY_LANES * KEY_LANES);

    // the packed rows: query row, head, modifiers, q slice (0 past the call's rows)
    unsigned int ri[DECODE_ROWS], rh[DECODE_ROWS];
    bool live[DECODE_ROWS];
    HeadMods hm[DECODE_ROWS];
    float qv[DECODE_ROWS][PER], acc[DECODE_ROWS][PER], m[DECODE_ROWS], l[DECODE_ROWS];
#pragma unroll
    for (int r = 0; r < DECODE_ROWS; r++) {
        const unsigned int pr = min(p0 + r, rows - 1);
        live[r] = p0 + r < rows;
        ri[r] = pr / group;
        rh[r] = hk * group + pr % group;
        hm[r] = head_mods(p, extras, b, rh[r]);
        load_slice(qv[r], q + (((size_t)b * p.seq_q + ri[r]) * p.heads_q + rh[r]) * HEAD_DIM,
                   lane);
#pragma unroll
        for (int c = 0; c < PER; c++) {
            qv[r][c] *= p.scale_log2;
            acc[r][c] = 0.f;
        }
        m[r] = NEG_INF;
        l[r] = 0.f;
    }

    // the keys the chunk's rows can see, cut to this split
    const unsigned int i_first = ri[0], i_last = ri[DECODE_ROWS - 1];
    const unsigned int split_lo = split * split_keys;
    const unsigned int lo = max(kv_begin_for_rows(p, i_first), split_lo);
    const unsigned int hi =
        min(kv_end_for_rows(p, i_first, i_last - i_first + 1), split_lo + split_keys);
    for (unsigned int j0 = (lo / 4) * 4 + 4 * g; j0 < hi; j0 += 4 * GROUPS) {
        // which rows see each of the four keys (the same answer in every lane of the group);
        // a quad no row sees is not read
        bool vis[4][DECODE_ROWS], any = false;
#pragma unroll
        for (unsigned int u = 0; u < 4; u++) {
            const unsigned int j = j0 + u;
#pragma unroll
            for (int r = 0; r < DECODE_ROWS; r++) {
                vis[u][r] = live[r] && j >= lo && j < hi &&
                            IF_BLOCKS(pair_visible(p, hm[r], true, ri[r], j), visible(p, ri[r], j));
                any = any || vis[u][r];
            }
        }
        if (!any) {
            continue;
        }
        // the quad's K rows, all four loads issued before they are used (keys outside
        // [lo, hi) read an edge key's rows, which no row takes)
        size_t at[4];
        float kf[4][PER];
#pragma unroll
        for (unsigned int u = 0; u < 4; u++) {
            at[u] = kv_row(p, extras, b, min(max(j0 + u, lo), hi - 1), hk);
            load_slice(kf[u], k + at[u], lane);
        }
        // dropout's keep flags of the four keys, row r's drawn by lane r of the group
        [[maybe_unused]] unsigned int kept[DECODE_ROWS];
#if DROPOUT
        unsigned int mine = 0;
#pragma unroll
        for (int r = 0; r < DECODE_ROWS; r++) {
            if (lane == r) {
                mine = dropout_bits(p, b * p.heads_q + rh[r], ri[r], j0 / 4);
            }
        }
#pragma unroll
        for (int r = 0; r < DECODE_ROWS; r++) {
            kept[r] = __shfl_sync(gmask, mine, r, KEY_LANES);
        }
#endif
        // the rows' scores, their running max and sum, the rescale of what they summed
        float w[4][DECODE_ROWS];
#pragma unroll
        for (int r = 0; r < DECODE_ROWS; r++) {
            // the row's four scores, their max beside the running one
            float s[4], top = m[r];
#pragma unroll
            for (unsigned int u = 0; u < 4; u++) {
                float x = 0.f;
#pragma unroll
                for (int c = 0; c < PER; c++) {
                    x = fmaf(qv[r][c], kf[u][c], x);
                }
                s[u] = finish_score(p, hm[r], group_sum(x, gmask), ri[r], j0 + u);
                vis[u][r] = vis[u][r] && s[u] != NEG_INF;
                top = vis[u][r] ? fmaxf(top, s[u]) : top;
            }
            if (top > m[r]) {
                // a new running max: rescale what was summed under the old one (none yet
                // when m is -inf)
                const float a = m[r] == NEG_INF ? 0.f : exp2f(m[r] - top);
                l[r] *= a;
#pragma unroll
                for (int c = 0; c < PER; c++) {
                    acc[r][c] *= a;
                }
                m[r] = top;
            }
#pragma unroll
            for (unsigned int u = 0; u < 4; u++) {
                // NaN where s is: the row comes out NaN; 0 for a pair that takes no part
                const float p_u = vis[u][r] ? exp2f(s[u] - m[r]) : 0.f;
                l[r] += p_u; // the whole P (dropout's dropped pairs too), as the lse
                w[u][r] = IF_DROPOUT((kept[r] >> u) & 1u ? p_u : 0.f, p_u);
            }
        }
        // P V: the quad's V rows (loads issued together), into the rows that see each key
        float vf[4][PER];
#pragma unroll
        for (unsigned int u = 0; u < 4; u++) {
            load_slice(vf[u], v + at[u], lane);
        }
#pragma unroll
        for (unsigned int u = 0; u < 4; u++) {
#pragma unroll
            for (int r = 0; r < DECODE_ROWS; r++) {
                if (vis[u][r]) {
#pragma unroll
                    for (int c = 0; c < PER; c++) {
                        acc[r][c] = fmaf(w[u][r], vf[u][c], acc[r][c]);
                    }
                }
            }
        }
    }

    // the groups of a warp meet by shuffles (lanes KEY_LANES apart hold the same dims), in a
    // fixed order
#pragma unroll
    for (int o = KEY_LANES; o < 32; o *= 2) {
#pragma unroll
        for (int r = 0; r < DECODE_ROWS; r++) {
            float xb[PER];
#pragma unroll
            for (int c = 0; c < PER; c++) {
                xb[c] = __shfl_xor_sync(0xffffffffu, acc[r][c], o);
            }
            const float mb = __shfl_xor_sync(0xffffffffu, m[r], o);
            const float lb = __shfl_xor_sync(0xffffffffu, l[r], o);
            fold_state(m[r], l[r], acc[r], mb, lb, xb);
        }
    }
    const unsigned int warp = threadIdx.x / 32;
    if (warp_lane < KEY_LANES) {
#pragma unroll
        for (int r = 0; r < DECODE_ROWS; r++) {
#pragma unroll
            for (int c = 0; c < PER; c++) {
                s_acc[warp][r][lane * PER + c] = acc[r][c];
            }
            if (lane == 0) {
                s_m[warp][r] = m[r];
                s_l[warp][r] = l[r];
            }
        }
    }
    __syncthreads();
    if (warp != 0 || warp_lane >= KEY_LANES) {
        return;
    }
    for (unsigned int w = 1; w < WARPS_D; w++) {
#pragma unroll
        for (int r = 0; r < DECODE_ROWS; r++) {
            float xb[PER];
#pragma unroll
            for (int c = 0; c < PER; c++) {
                xb[c] = s_acc[w][r][lane * PER + c];
            }
            fold_state(m[r], l[r], acc[r], s_m[w][r], s_l[w][r], xb);
        }
    }

    // the rows' results: finished (one split) or the split's partial
    const unsigned int batch = gridDim.z;
#pragma unroll
    for (int r = 0; r < DECODE_ROWS; r++) {
        if (!live[r]) {
            continue;
        }
        const size_t row = ((size_t)b * p.seq_q + ri[r]) * p.heads_q + rh[r];
        const size_t lse_row = ((size_t)b * p.heads_q + rh[r]) * p.seq_q + ri[r];
        if (direct != 0) {
            const float f = dropout_rescale(row_inv(l[r], m[r], hm[r]), p.drop_scale);
#pragma unroll
            for (int c = 0; c < PER; c++) {
                const int d = lane * PER + c;
                if (d < HEAD_DIM) {
                    out[row * HEAD_DIM + d] = from_f32(acc[r][c] * f);
                }
            }
            if (lane == 0) {
                lse[lse_row] = row_lse(l[r], m[r], hm[r]);
            }
        } else {
            // normalized over this split's keys; 0 and -inf where it saw none, NaN stays NaN
            const float f = dropout_rescale(l[r] == 0.f ? 0.f : 1.f / l[r], p.drop_scale);
            const size_t split_rows = (size_t)split * batch * p.seq_q * p.heads_q;
#pragma unroll
            for (int c = 0; c < PER; c++) {
                const int d = lane * PER + c;
                if (d < HEAD_DIM) {
                    part_out[(split_rows + row) * HEAD_DIM + d] = acc[r][c] * f;
                }
            }
            if (lane == 0) {
                part_lse[split_rows + lse_row] = l[r] == 0.f ? NEG_INF : (m[r] + log2f(l[r])) * LN2;
            }
        }
    }
}

// The splits merged: element e of out (and, once per row, its lse) from the splits' partial
// results, folded in split order by merge_fold (as flash_merge), exactly; then the sink joins
// as one more part (lse = sink, out 0). A row no split lets see a key gets out 0 and lse -inf
// (or the sink's lse). One thread per element of out [batch, seq_q, heads_q, HEAD_DIM].
extern "C" __global__ void __launch_bounds__(256) flash_decode_combine(
    const float* __restrict__ part_out, const float* __restrict__ part_lse,
    elem_t* __restrict__ out, float* __restrict__ lse, const Params p, unsigned int splits,
    unsigned int batch, const float* __restrict__ extras) {
    const size_t elements = (size_t)batch * p.seq_q * p.heads_q * HEAD_DIM;
    const size_t e = (size_t)blockIdx.x * 256 + threadIdx.x;
    if (e >= elements) {
        return;
    }
    const size_t row = e / HEAD_DIM;
    const unsigned int h = row % p.heads_q;
    const size_t bi = row / p.heads_q;
    const unsigned int b = bi / p.seq_q, i = bi % p.seq_q;
    const size_t r = ((size_t)b * p.heads_q + h) * p.seq_q + i;
    const size_t rows = (size_t)batch * p.heads_q * p.seq_q;
    float ml = NEG_INF, mx = 0.f;
    for (unsigned int s = 0; s < splits; s++) {
        merge_fold(ml, mx, part_lse[s * rows + r], part_out[s * elements + e]);
    }
#if SINKS
    merge_fold(ml, mx, head_mods(p, extras, b, h).sink2 * LN2, 0.f);
#else
    (void)extras;
#endif
    out[e] = from_f32(mx);
    if (e % HEAD_DIM == 0) {
        lse[r] = ml;
    }
}
