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
#define ELEM_BYTES (ELEM_KIND == 2 ? 4 : 2)
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

// struct Params, a call's scalars (the wgpu kernels' parameter block), is generated from its
// Rust definition (src/kernels/params.rs, PARAMS_C) and put before this file in every
// program, with FLAG_CAUSAL and FLAG_WINDOW, its flags' bits the kernels read at run time.

// K and V in pages through a block table (-DPAGED=1, AttentionConfig::paged; the forward
// kernels only: a paged backward is refused by the host).
#ifndef PAGED
#define PAGED 0
#endif

// Element offset of key j's row, kv head hk, of batch b in k or v: dense
// [batch, seq_kv, heads_kv, head_dim], or with PAGED page pools [pages, page_size, heads_kv,
// head_dim] through the block table (u32 entries in the extras; a key past the table's pages
// reads the batch's last page), as kv_index in shaders/common.wgsl.
__device__ __forceinline__ size_t kv_row(const Params& p, const float* __restrict__ extras,
                                         unsigned int b, unsigned int j, unsigned int hk) {
#if PAGED
    const unsigned int* table = reinterpret_cast<const unsigned int*>(extras) + p.pairs_base + p.pages_base;
    const unsigned int entry = min(j / p.page_size, p.pages_per_seq - 1u);
    const size_t row =
        (size_t)table[b * p.pages_per_seq + entry] * p.page_size + j % p.page_size;
    return (row * p.heads_kv + hk) * HEAD_DIM;
#else
    (void)extras;
    return (((size_t)b * p.seq_kv + j) * p.heads_kv + hk) * HEAD_DIM;
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
#ifndef BLOCKS
#define BLOCKS 0
#endif
#ifndef VARLEN
#define VARLEN 0
#endif
// A boolean mask over pairs (-DMASK=1): its bits in the extras from pairs_base (the pair data follows
// the extras on CUDA), one grid of
// seq_q x seq_kv bits per (batch, query head), as pair_on in shaders/common.wgsl.
#ifndef MASK
#define MASK 0
#endif
// An additive bias over pairs (-DBIAS=1): its entries, in the element type, in the extras from
// pairs_base + bias_base (after the boolean mask's words), one grid of seq_q x seq_kv per (batch, query
// head) or shared along a broadcast dimension, added to finished scores, as pair_bias in
// shaders/modifiers/bias.wgsl.
#ifndef BIAS
#define BIAS 0
#endif

// The call's scalars as the kernels and the masking helpers below see them (for_batch builds
// it): Params, the batch's key range, the run-time bits of Params::flags as bools, and with
// packed sequences (-DVARLEN=1) the extras, where the helpers read the sequences' boundaries.
struct CallShape : Params {
    // keys [kv_start, kv_len) take part: the batch's own with SEQLENS, else [0, seq_kv)
    unsigned int kv_len;
    unsigned int kv_start;
    bool causal;
    bool window;
#if VARLEN
    const float* extras;
#endif
};

// The call's scalars for batch b: with per-batch key ranges (-DSEQLENS=1), kv_start and kv_len
// are the batch's (keys outside them are hidden, as kv_start and kv_len in
// shaders/common.wgsl); else all keys.
__device__ __forceinline__ CallShape for_batch(const Params& p, const float* __restrict__ extras,
                                               unsigned int b) {
    CallShape q;
    static_cast<Params&>(q) = p;
    q.kv_len = p.seq_kv;
    q.kv_start = 0;
    q.causal = (p.flags & FLAG_CAUSAL) != 0;
    q.window = (p.flags & FLAG_WINDOW) != 0;
#if VARLEN
    q.extras = extras;
#endif
#if SEQLENS
    q.kv_len = min(__float_as_uint(extras[p.seqlens_base + 2 * b]), p.seq_kv);
    q.kv_start = min(__float_as_uint(extras[p.seqlens_base + 2 * b + 1]), q.kv_len);
    // per-batch alignment (a KV cache): the batch's diagonal, window and ALiBi positions
    // follow its own key length, seqlens_kv[b] - seq_kv keys left of the padded alignment
    if (p.align_kv != 0) {
        const int shift = (int)q.kv_len - (int)p.align_kv;
        q.causal_offset += shift;
        q.band_lo += shift;
        q.band_hi += shift;
    }
#else
    (void)b;
#endif
    return q;
}

// Variable-length sequences packed into batch 1 (-DVARLEN=1), as the Varlen functions in
// shaders/common.wgsl: sequence s holds rows [cu_q(s), cu_q(s + 1)) and keys
// [cu_kv(s), cu_kv(s + 1)) (the extras from varlen_base: cu_seqlens_q, then cu_seqlens_kv);
// pairs of two sequences are hidden and the causal mask, the window and ALiBi are aligned
// bottom-right within each sequence. The helpers below (visible, alibi_term, the tile bounds,
// tile_needs_mask, tile_blocks) take it in; without VARLEN none of this is compiled.
#if VARLEN
__device__ __forceinline__ unsigned int cu_q(const CallShape& p, unsigned int s) {
    return __float_as_uint(__ldg(p.extras + p.varlen_base + s));
}
__device__ __forceinline__ unsigned int cu_kv(const CallShape& p, unsigned int s) {
    return __float_as_uint(__ldg(p.extras + p.varlen_base + p.sequences + 1 + s));
}

// the sequence holding row (or key, `keys`) r: the last s whose start is at most r, so empty
// sequences are passed over; a binary search of the boundaries
__device__ __forceinline__ unsigned int sequence_of(const CallShape& p, unsigned int r, bool keys) {
    const float* cu = p.extras + p.varlen_base + (keys ? p.sequences + 1 : 0);
    unsigned int lo = 0, hi = p.sequences - 1;
    while (lo < hi) {
        const unsigned int mid = (lo + hi + 1) / 2;
        if (__float_as_uint(__ldg(cu + mid)) <= r) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// How far sequence s moves the causal diagonal and the window from the whole call's
// (causal_offset, band_lo, band_hi): its diagonal is j = i + cu_kv(s + 1) - cu_q(s + 1).
// The totals stay below 2^28 (varlen::MAX_TOTAL), so |shift| < 2^28 ((cu_kv(s + 1) - seq_kv)
// + (seq_q - cu_q(s + 1))) and a row or key plus a band edge (at most 2^30) plus the shift
// fits an int: the VARLEN comparisons below stay 32-bit.
__device__ __forceinline__ int band_shift(const CallShape& p, unsigned int s) {
    return (int)cu_kv(p, s + 1) - (int)cu_q(p, s + 1) - p.causal_offset;
}
#endif

#ifndef SCORE_MOD
#define SCORE_MOD 0
#endif
struct HeadMods {
    float slope2; // the ALiBi slope times log2(e)
    float sink2;  // the sink times log2(e)
#if SCORE_MOD || MASK_MOD
    unsigned int b, h; // the batch and query head, which a user's score_mod and mask_mod take
#endif
#if BLOCKS
    const float* blocks; // the block mask's words (the extras from blocks_base)
    unsigned int grid;   // the bit of block (0, 0) of this (batch, query head)'s grid
#endif
#if BLOCKS && MASK_MOD
    const float* full; // its full blocks' words (extras from blocks_full), or null without
#endif
#if MASK
    const float* mask;      // the boolean mask's words (the extras from pairs_base)
    unsigned int mask_grid; // the bit of pair (0, 0) of this (batch, query head)'s grid
#endif
#if BIAS
    const elem_t* bias;     // the bias's entries (from pairs_base + bias_base)
    unsigned int bias_grid; // the entry of pair (0, 0) of this (batch, query head)'s grid
#endif
};
__device__ __forceinline__ HeadMods head_mods(const Params& p, const float* __restrict__ extras,
                                              unsigned int b, unsigned int h) {
    HeadMods m;
    m.slope2 = 0.f;
    m.sink2 = 0.f;
#if SCORE_MOD || MASK_MOD
    m.b = b;
    m.h = h;
#endif
#if ALIBI
    m.slope2 = extras[b * p.alibi_b_stride + h] * LOG2E;
#endif
#if SINKS
    m.sink2 = extras[p.sinks_base + h] * LOG2E;
#endif
#if BLOCKS
    m.blocks = extras + p.blocks_base;
    m.grid = b * p.blocks_b_stride + h * p.blocks_h_stride;
#endif
#if BLOCKS && MASK_MOD
    m.full = p.blocks_full != 0 ? extras + p.blocks_full : nullptr;
#endif
#if MASK
    m.mask = extras + p.pairs_base;
    m.mask_grid = b * p.mask_b_stride + h * p.mask_h_stride;
#endif
#if BIAS
    m.bias = reinterpret_cast<const elem_t*>(extras + p.pairs_base + p.bias_base);
    m.bias_grid = b * p.bias_b_stride + h * p.bias_h_stride;
#endif
    return m;
}

// @modifiers: each modifier's CUDA functions (cuda/modifiers/, from the registry in
// src/modifiers/) are put here by the host; the functions below compose them.

// the score softmax sees, from x = q.k * scale * log2(e): the generated score chain (the
// softcap, then ALiBi's term and the bias; finish_score in shaders/common.wgsl, without the
// mask, which callers apply)
__device__ __forceinline__ float finish_score(const CallShape& p, const HeadMods& hm, float x,
                                              unsigned int i, unsigned int j) {
    return score_chain(p, hm, x, i, j);
}

// The backward's three rules for a recomputed pair, as shaders/common.wgsl (lse_to_log2,
// recompute_p, through_score) and the f64 reference:
// - a row whose lse is -inf (every visible score -inf) is staged as +inf, so each P it
//   recomputes is 0 rather than exp2(-inf - -inf) = NaN;
// - P is 0 where the finished score is -inf, and at most 1 (s above lse2 by rounding alone);
// - P = 0 gives a zero gradient: the slope at an -inf score (an -inf bias entry) is NaN.
__device__ __forceinline__ float lse_to_log2(float lse) {
    return lse == NEG_INF ? POS_INF : lse * LOG2E;
}
__device__ __forceinline__ float recompute_p(float s, float lse2) {
    const float x = s - lse2;
    return s == NEG_INF ? 0.f : (x > 0.f ? 1.f : exp2f(x));
}
// dS from the gradient g at the finished score and d(score)/dx (Finished::slope)
__device__ __forceinline__ float through_score(float g, float pr, float slope) {
    return pr == 0.f ? 0.f : g * slope;
}

// the highest key offset j - i a row sees (with causal or a window)
__device__ __forceinline__ long long band_hi(const CallShape& p) {
    return p.window ? p.band_hi : p.causal_offset;
}

// bounds, the bottom-right causal mask and the window, as `visible` in shaders/common.wgsl;
// with VARLEN also the pair in one sequence, the mask and window aligned to it
__device__ __forceinline__ bool visible(const CallShape& p, unsigned int i, unsigned int j) {
#if VARLEN
    if (i >= p.seq_q) {
        return false;
    }
    const unsigned int s = sequence_of(p, i, false);
    const int ii = i, jj = j, shift = band_shift(p, s);
    return j >= cu_kv(p, s) && j < cu_kv(p, s + 1) && j < p.kv_len && j >= p.kv_start &&
           (!p.causal || jj <= ii + p.causal_offset + shift) &&
           (!p.window || (jj >= ii + p.band_lo + shift && jj <= ii + p.band_hi + shift));
#else
    const long long ii = i, jj = j;
    return i < p.seq_q && j < p.kv_len && j >= p.kv_start &&
           (!p.causal || jj <= ii + p.causal_offset) &&
           (!p.window || (jj >= ii + p.band_lo && jj <= ii + p.band_hi));
#endif
}

#if VARLEN
// true when no pair of rows [q0, q_last] x keys [k0, k_last] lies within one sequence and its
// band: the rows' sequences hold none of the keys, or (one sequence) every key is right of the
// band for every row or left of it (varlen_tile_empty in shaders/common.wgsl)
__device__ __forceinline__ bool varlen_tile_empty(const CallShape& p, unsigned int q0,
                                                  unsigned int q_last, unsigned int k0,
                                                  unsigned int k_last) {
    const unsigned int first = sequence_of(p, q0, false), last = sequence_of(p, q_last, false);
    if (k_last < cu_kv(p, first) || k0 >= cu_kv(p, last + 1)) {
        return true;
    }
    if (first != last) {
        return false;
    }
    const int shift = band_shift(p, first);
    const int hi = p.window ? p.band_hi : p.causal_offset;
    const bool right = (p.causal || p.window) && (int)k0 > (int)q_last + hi + shift;
    const bool left = p.window && (int)k_last < (int)q0 + p.band_lo + shift;
    return right || left;
}
#endif

// Block-sparse attention (-DBLOCKS=1), as block_on and tile_visit in shaders/common.wgsl:
// the block mask's bits (BlockMask::bits) lie in the extras from blocks_base, one grid of
// ceil(seq_q / block_q) x blocks_cols bits per (batch, query head), from HeadMods::grid, and
// pair (i, j) takes part only when bit (i / block_q, j / block_kv) of its grid is set. The
// kernels skip a tile whose blocks are all off (tile_blocks, next_kv_tile: no loads, no math)
// and test pairs only in a tile with some block off (pair_visible). They reach all of it
// through IF_BLOCKS, as dropout through IF_DROPOUT: without BLOCKS their code is what it was
// (an inlined helper that only returns a constant, or passes HeadMods on to visible(), still
// changes NVVM's loops with the score modifiers on).
// Packed sequences (-DVARLEN=1) skip tiles through the same helpers (a tile with no pair of
// one sequence inside its band: varlen_tile_empty), so IF_BLOCKS takes them in with VARLEN
// too; with VARLEN alone pair_visible is visible(). A boolean mask (-DMASK=1) makes every
// visited tile partial, and pair_visible reads its bit for every pair; a user mask
// (-DMASK_MOD=1) every visited tile whose blocks are not all full, and pair_visible asks it
// for the pairs of those.
#if BLOCKS || VARLEN || MASK || MASK_MOD
#define IF_BLOCKS(expr, otherwise) (expr)
#else
#define IF_BLOCKS(expr, otherwise) (otherwise)
#endif

struct TileBlocks {
    bool skip;    // every block the tile overlaps is off: none of its pairs is visible
    bool partial; // some block it overlaps is off: its pairs need pair_visible's block test
};
// a tile without BLOCKS or VARLEN: visited whole (IF_BLOCKS(tile_blocks(..), TILE_WHOLE))
#define TILE_WHOLE (TileBlocks{false, false})

#if BLOCKS
// the block row of row i and the block column of key j: a shift where the block sizes are
// powers of two (Params::block_q_shift, block_kv_shift), else a division
__device__ __forceinline__ unsigned int block_row(const Params& p, unsigned int i) {
    return p.block_q_shift < 32 ? i >> p.block_q_shift : i / p.block_q;
}
__device__ __forceinline__ unsigned int block_col(const Params& p, unsigned int j) {
    return p.block_kv_shift < 32 ? j >> p.block_kv_shift : j / p.block_kv;
}

// word w of the block mask
__device__ __forceinline__ unsigned int blocks_word(const HeadMods& hm, unsigned int w) {
    return __float_as_uint(__ldg(hm.blocks + w));
}

// set bits among bits [first, last] of a bit plane (the block mask's on bits, hm.blocks, or
// its full ones), a word at a time
__device__ __forceinline__ unsigned int blocks_on(const float* plane, unsigned int first,
                                                  unsigned int last) {
    unsigned int n = 0;
    for (unsigned int w = first / 32; w <= last / 32; w++) {
        unsigned int x = __float_as_uint(__ldg(plane + w));
        if (w == first / 32) {
            x &= 0xffffffffu << (first % 32);
        }
        if (w == last / 32) {
            x &= 0xffffffffu >> (31 - last % 32);
        }
        n += __popc(x);
    }
    return n;
}
#endif

#if BLOCKS || VARLEN || MASK || MASK_MOD

// How the block mask treats the tile of rows [q0, q0 + rows) x keys [k0, k0 + keys) of the
// head of hm, clipped to the call (rows to seq_q, keys to kv_len; an empty tile is skipped).
// With VARLEN a tile with no pair of one sequence inside its band is skipped too.
// Uniform across a thread block when its arguments are.
__device__ __forceinline__ TileBlocks tile_blocks(const CallShape& p, const HeadMods& hm,
                                                  unsigned int q0, unsigned int rows,
                                                  unsigned int k0, unsigned int keys) {
    const unsigned int q_end = min(q0 + rows, p.seq_q), k_end = min(k0 + keys, p.kv_len);
    if (q0 >= q_end || k0 >= k_end) {
        return TileBlocks{true, false};
    }
#if VARLEN
    if (varlen_tile_empty(p, q0, q_end - 1, k0, k_end - 1)) {
        return TileBlocks{true, false};
    }
#endif
#if BLOCKS
    const unsigned int r0 = block_row(p, q0), r1 = block_row(p, q_end - 1);
    const unsigned int c0 = block_col(p, k0), c1 = block_col(p, k_end - 1);
    unsigned int on = 0, full = 0;
    for (unsigned int r = r0; r <= r1; r++) {
        const unsigned int row = hm.grid + r * p.blocks_cols;
        on += blocks_on(hm.blocks, row + c0, row + c1);
#if MASK_MOD
        if (hm.full != nullptr) {
            full += blocks_on(hm.full, row + c0, row + c1);
        }
#endif
    }
    // a user mask needs evaluating in a tile unless its blocks are all full
    const unsigned int n = (r1 - r0 + 1) * (c1 - c0 + 1);
    return TileBlocks{on == 0, MASK || on < n || (MASK_MOD && full < n)};
#else
    return TileBlocks{false, MASK || MASK_MOD};
#endif
}

// visible(), and in a tile with some block off (`partial`) the pair's block on (and the
// user's mask, which `partial` also asks for). The bounds come first: no bit past the grid
// is read.
__device__ __forceinline__ bool pair_visible(const CallShape& p, const HeadMods& hm,
                                             bool partial, unsigned int i, unsigned int j) {
    if (!visible(p, i, j)) {
        return false;
    }
#if BLOCKS
    if (partial) {
        const unsigned int bit = hm.grid + block_row(p, i) * p.blocks_cols + block_col(p, j);
        if (!((blocks_word(hm, bit / 32) >> (bit % 32)) & 1u)) {
            return false;
        }
    }
#endif
#if MASK
    const unsigned int bit = hm.mask_grid + i * p.mask_cols + j;
    if (!((__float_as_uint(__ldg(hm.mask + bit / 32)) >> (bit % 32)) & 1u)) {
        return false;
    }
#endif
#if MASK_MOD
    if (partial && !mask_mod_on(hm, i, j)) {
        return false;
    }
#endif
    return true; // VARLEN alone: no block or mask bit is ever off
}

// The first of the key tiles kv0, kv0 + keys, ... below kv_end (rows [q0, q0 + rows)) that
// tile_blocks does not skip, or kv_end when none is; `partial` its flag. For a loop that
// issues a tile's copies before the tile is used (flash_fwd's prefetch), so that it steps
// from visited tile to visited tile and never issues a skipped tile's copies.
__device__ __forceinline__ unsigned int next_kv_tile(const CallShape& p, const HeadMods& hm,
                                                     unsigned int q0, unsigned int rows,
                                                     unsigned int kv0, unsigned int keys,
                                                     unsigned int kv_end, bool& partial) {
    for (; kv0 < kv_end; kv0 += keys) {
        const TileBlocks t = tile_blocks(p, hm, q0, rows, kv0, keys);
        if (!t.skip) {
            partial = t.partial;
            return kv0;
        }
    }
    partial = false;
    return kv_end;
}
#endif

// keys [0, end) are the only ones query rows [q0, q0 + rows) can see (all keys without
// causal or a window), as kv_end_for_rows in shaders/common.wgsl; with VARLEN the end of the
// last row's sequence (tile_blocks skips the tiles past its band)
__device__ __forceinline__ unsigned int kv_end_for_rows(const CallShape& p, unsigned int q0,
                                                        unsigned int rows) {
#if VARLEN
    if (q0 >= p.seq_q) {
        return 0;
    }
    return cu_kv(p, sequence_of(p, min(q0 + rows, p.seq_q) - 1, false) + 1);
#else
    if (!p.causal && !p.window) {
        return p.kv_len;
    }
    long long last = (long long)min(q0 + rows, p.seq_q) - 1 + band_hi(p);
    return last < 0 ? 0u : (unsigned int)min((long long)p.kv_len, last + 1);
#endif
}

// keys before the result are hidden from rows q0.. (a window's left edge, the batch's first
// key; 0 without either; with VARLEN the start of row q0's sequence)
__device__ __forceinline__ unsigned int kv_begin_for_rows(const CallShape& p, unsigned int q0) {
#if VARLEN
    return cu_kv(p, sequence_of(p, min(q0, p.seq_q - 1), false));
#else
    if (!p.window) {
        return p.kv_start;
    }
    long long first = (long long)q0 + p.band_lo;
    return max(p.kv_start, first <= 0 ? 0u : (unsigned int)min((long long)p.seq_kv, first));
#endif
}

// the first query row that can see key j0 (with VARLEN the start of its sequence's rows)
__device__ __forceinline__ unsigned int q_begin_for_key(const CallShape& p, unsigned int j0) {
#if VARLEN
    return cu_q(p, sequence_of(p, j0, true));
#else
    if (!p.causal && !p.window) {
        return 0;
    }
    long long first = (long long)j0 - band_hi(p);
    return first <= 0 ? 0u : (unsigned int)min((long long)p.seq_q, first);
#endif
}

// rows at or after the result see none of the keys [j0, j_last] (a window's left edge; 0 when
// none of them exists: past the batch's length; with VARLEN the end of the rows of j_last's
// sequence)
__device__ __forceinline__ unsigned int q_end_for_keys(const CallShape& p, unsigned int j0,
                                                       unsigned int j_last) {
    if (j0 >= p.kv_len || j_last < p.kv_start) {
        return 0;
    }
#if VARLEN
    return cu_q(p, sequence_of(p, min(j_last, p.seq_kv - 1), true) + 1);
#else
    if (!p.window) {
        return p.seq_q;
    }
    long long end = (long long)j_last - p.band_lo + 1;
    return end <= 0 ? 0u : (unsigned int)min((long long)p.seq_q, end);
#endif
}

// true when some pair of rows [q0, q0 + rows) x keys [kv0, kv0 + keys) is hidden or out of
// bounds (the key side; rows past seq_q are the caller's); with VARLEN also when the rows span
// two sequences or the keys leave the rows' sequence
__device__ __forceinline__ bool tile_needs_mask(const CallShape& p, unsigned int q0,
                                                unsigned int rows, unsigned int kv0,
                                                unsigned int keys) {
    if (kv0 + keys > p.kv_len || kv0 < p.kv_start) {
        return true;
    }
#if VARLEN
    const unsigned int s = sequence_of(p, q0, false);
    if (sequence_of(p, min(q0 + rows, p.seq_q) - 1, false) != s || kv0 < cu_kv(p, s) ||
        kv0 + keys > cu_kv(p, s + 1)) {
        return true;
    }
    const int shift = band_shift(p, s);
    const int hi = p.window ? p.band_hi : p.causal_offset;
    const bool right = (p.causal || p.window) && (int)(kv0 + keys - 1) > (int)q0 + hi + shift;
    const bool left = p.window && (int)kv0 < (int)(q0 + rows - 1) + p.band_lo + shift;
#else
    const bool right = (p.causal || p.window) && (long long)kv0 + keys - 1 > (long long)q0 + band_hi(p);
    const bool left = p.window && (long long)kv0 < (long long)q0 + rows - 1 + p.band_lo;
#endif
    return right || left;
}

// The backward's preprocess for row r of [batch, heads_q, seq_q]: delta[r] = sum_d dO * out,
// in f32 (one thread a row; rows past the end do nothing).
__device__ __forceinline__ void preprocess_row(const elem_t* __restrict__ out,
                                               const elem_t* __restrict__ d_out,
                                               float* __restrict__ delta, const Params& p,
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
    const Params p, unsigned int batch, const float* __restrict__ extras) {
    __shared__ float red[256];
    const unsigned int h = blockIdx.x, t = threadIdx.x;
    const HeadMods hm = head_mods(p, extras, 0, h);
    float acc = 0.f;
    for (size_t e = t; e < (size_t)batch * p.seq_q; e += 256) {
        const size_t r = ((e / p.seq_q) * p.heads_q + h) * p.seq_q + e % p.seq_q;
        acc += recompute_p(hm.sink2, lse_to_log2(lse[r])) * delta[r];
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

// The bias's gradient, as on wgpu (keep_bias_grad in shaders/common.wgsl): the dQ kernels
// keep each visited pair's gradient at its finished score, g = P * (Z dP - delta), in an f32
// scratch [batch, heads_q, seq_q, seq_kv] (`bias_grads`, zero-filled; null where d_bias is
// not asked for), and flash_bias_reduce sums the slices each bias entry reaches.
__device__ __forceinline__ void keep_bias_grad(float* __restrict__ bias_grads, const Params& p,
                                               unsigned int b, unsigned int h, unsigned int i,
                                               unsigned int j, float g) {
#if BIAS
    if (bias_grads != nullptr && i < p.seq_q && j < p.seq_kv) {
        bias_grads[(((size_t)b * p.heads_q + h) * p.seq_q + i) * p.seq_kv + j] = g;
    }
#endif
}

#if BIAS
// d_bias (shaders/flash_bwd_bias.wgsl): entry e of the bias's shape sums, over the (batch,
// query head) slices it reaches (its own, or all along a broadcast dimension, in a fixed
// order), the kept gradients of pair (i, j). One thread per entry: deterministic, no atomics.
extern "C" __global__ void __launch_bounds__(256) flash_bias_reduce(
    const float* __restrict__ bias_grads, elem_t* __restrict__ d_bias, const Params p,
    unsigned int batch, unsigned int entries) {
    const unsigned int e = blockIdx.x * 256 + threadIdx.x;
    if (e >= entries) {
        return;
    }
    const size_t grid_len = (size_t)p.seq_q * p.seq_kv;
    const size_t pair = e % grid_len;
    const unsigned int grid = (unsigned int)(e / grid_len);
    const unsigned int bias_heads = p.bias_h_stride != 0 ? p.heads_q : 1;
    unsigned int b_lo = grid / bias_heads, b_hi = b_lo + 1;
    unsigned int h_lo = grid % bias_heads, h_hi = h_lo + 1;
    if (p.bias_b_stride == 0) {
        b_lo = 0;
        b_hi = batch;
    }
    if (p.bias_h_stride == 0) {
        h_lo = 0;
        h_hi = p.heads_q;
    }
    float acc = 0.f;
    for (unsigned int b = b_lo; b < b_hi; b++) {
        for (unsigned int h = h_lo; h < h_hi; h++) {
            acc += bias_grads[((size_t)b * p.heads_q + h) * grid_len + pair];
        }
    }
    d_bias[e] = from_f32(acc);
}
#endif

// One exact merge step over disjoint key shards (merge_fold in shaders/common.wgsl): folds a
// part (lse lb, output xb: normalized over its own keys) into the running (l, x), with
// l = log(exp(l) + exp(lb)) and x the weighted sum. (-inf, 0) is "nothing yet": a part
// that saw no key adds nothing (both: (-inf, 0)), and a NaN lse makes the result NaN.
__device__ __forceinline__ void merge_fold(float& l, float& x, float lb, float xb) {
    const float la = l, m = fmaxf(la, lb);
    if (la != la || lb != lb) {
        // fmaxf drops a NaN operand; the row stays NaN
        l = __int_as_float(0x7fc00000);
        x = l;
    } else if (m != NEG_INF) {
        // one weight is 1, so their sum lies in [1, 2]
        const float wa = expf(la - m), wb = expf(lb - m), s = wa + wb;
        l = m + logf(s);
        x = (wa * x + wb * xb) / s;
    } else {
        x = 0.f; // neither side saw a key
    }
}

// The exact merge of partial results over disjoint key shards (shaders/merge.wgsl, module
// `merge`): folds one shard (shard_out, shard_lse) into the running f32 result
// (acc, lse_in) -> (acc, lse_out) by merge_fold, and stores it rounded into out; `resume` 0
// starts from nothing (lse -inf, out 0). A row no shard lets see a key keeps lse -inf and
// out 0; a NaN lse stays NaN. out-layout tensors are [batch, seq_q, heads, HEAD_DIM], lse
// [batch, heads, seq_q]. One thread per element of out.
extern "C" __global__ void __launch_bounds__(256) flash_merge(
    const elem_t* __restrict__ shard_out, const float* __restrict__ shard_lse,
    const float* __restrict__ lse_in, float* __restrict__ acc, float* __restrict__ lse_out,
    elem_t* __restrict__ out, unsigned int seq_q, unsigned int heads, unsigned int elements,
    unsigned int resume) {
    const unsigned int e = blockIdx.x * 256 + threadIdx.x;
    if (e >= elements) {
        return;
    }
    const unsigned int row = e / HEAD_DIM;
    const unsigned int h = row % heads;
    const unsigned int bs = row / heads;
    const unsigned int r = ((bs / seq_q) * heads + h) * seq_q + bs % seq_q;
    float l = NEG_INF, x = 0.f;
    if (resume != 0) {
        l = lse_in[r];
        x = acc[e];
    }
    merge_fold(l, x, shard_lse[r], to_f32(shard_out[e]));
    acc[e] = x;
    out[e] = from_f32(x);
    if (e % HEAD_DIM == 0) {
        lse_out[r] = l;
    }
}

// Rotary embedding (shaders/rotary.wgsl, module `rotary`): dst is src, [batch, rows, heads,
// head_dim], with the first rotary_dim dims of every head turned in pairs by the angle at the
// row's position (row i of batch b at positions[b] + i * step), read as cos and sin from
// tables [table_rows, rotary_dim / 2]: pairs (2f, 2f + 1) when interleaved, else
// (f, f + rotary_dim / 2). One thread per element; each reads its pair's partner.
extern "C" __global__ void __launch_bounds__(256) flash_rotary(
    const elem_t* __restrict__ src, const elem_t* __restrict__ cos_t,
    const elem_t* __restrict__ sin_t, const unsigned int* __restrict__ positions,
    elem_t* __restrict__ dst, unsigned int elements, unsigned int rows, unsigned int heads,
    unsigned int head_dim, unsigned int rotary_dim, unsigned int interleaved,
    unsigned int step) {
    const unsigned int e = blockIdx.x * 256 + threadIdx.x;
    if (e >= elements) {
        return;
    }
    const unsigned int d = e % head_dim;
    if (d >= rotary_dim) {
        dst[e] = src[e];
        return;
    }
    const unsigned int half = rotary_dim / 2;
    const unsigned int row = e / (head_dim * heads);
    const unsigned int b = row / rows, i = row % rows;
    unsigned int f = d % half;
    bool first = d < half;
    unsigned int partner = first ? e + half : e - half;
    if (interleaved != 0) {
        f = d / 2;
        first = (d & 1u) == 0;
        partner = first ? e + 1 : e - 1;
    }
    const unsigned int at = (positions[b] + i * step) * half + f;
    const float c = to_f32(cos_t[at]), s = to_f32(sin_t[at]);
    const float x = to_f32(src[e]), y = to_f32(src[partner]);
    // (x0, x1) -> (x0 c - x1 s, x1 c + x0 s)
    dst[e] = from_f32(first ? x * c - y * s : x * c + y * s);
}
