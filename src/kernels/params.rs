//! The runtime parameter block, bound at slot 0 of every kernel, and grid folding.

/// Declares `Params`, [`PARAMS_WGSL`], its WGSL declaration, and [`PARAMS_C`], its CUDA C
/// declaration, from one list of fields, so that the host and the kernels of both backends
/// cannot disagree on a name, a type or an order (tests/shaders.rs checks the offsets naga
/// lays out against the host's; every field is 4-byte words, so C lays them out as repr(C)).
macro_rules! params_struct {
    ($(#[$meta:meta])* pub struct Params { $($(#[doc = $doc:literal])* pub $f:ident: $t:tt,)* }) => {
        $(#[$meta])*
        pub struct Params {
            $($(#[doc = $doc])* pub $f: $t,)*
        }

        /// The WGSL declaration of [`Params`], which the generated prelude of every kernel
        /// holds.
        pub const PARAMS_WGSL: &str = concat!(
            "struct Params {\n",
            $("    ", stringify!($f), ": ", wgsl_type!($t), ",\n",)*
            "}\n"
        );

        /// The CUDA C declaration of [`Params`], put before every CUDA program (each field's
        /// doc comment carried as a comment).
        pub const PARAMS_C: &str = concat!(
            "// a call's scalars: generated from Params in src/kernels/params.rs\n",
            "struct Params {\n",
            $($("    //", $doc, "\n",)* "    ", c_field!($t, $f), ";\n",)*
            "};\n"
        );
    };
}

/// A `Params` field's CUDA C declaration.
macro_rules! c_field {
    (u32, $f:ident) => {
        concat!("unsigned int ", stringify!($f))
    };
    (i32, $f:ident) => {
        concat!("int ", stringify!($f))
    };
    (f32, $f:ident) => {
        concat!("float ", stringify!($f))
    };
    ([[u32; 4]; 5], $f:ident) => {
        concat!("unsigned int ", stringify!($f), "[5][4]")
    };
}

/// A `Params` field's WGSL type.
macro_rules! wgsl_type {
    (u32) => {
        "u32"
    };
    (i32) => {
        "i32"
    };
    (f32) => {
        "f32"
    };
    ([[u32; 4]; 5]) => {
        "array<vec4<u32>, 5>"
    };
}

params_struct! {
/// Runtime parameters, bound at slot 0 of every wgpu kernel and passed by value to every CUDA
/// kernel. Defined here once: the kernels' WGSL and C declarations are generated from this
/// one ([`PARAMS_WGSL`], [`PARAMS_C`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    pub batch: u32,
    pub seq_q: u32,
    pub seq_kv: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub head_dim: u32,
    pub group: u32,
    pub causal_offset: i32,
    pub scale: f32,
    pub scale_log2: f32,
    pub n_q_tiles: u32,
    pub n_kv_tiles: u32,
    pub total_wg: u32,
    pub slice_base: u32,
    pub slice_count: u32,
    pub total_items: u32,
    /// Element offsets of the bound windows: where element 0 of a q-layout tensor (q, out,
    /// d_out, dq), a kv-layout tensor (k, v, dk, dv) and a row tensor (lse, delta) lies in its
    /// binding. 0 unless a call is split into windows (`plan::split`).
    pub q_shift: u32,
    pub kv_shift: u32,
    pub row_shift: u32,
    /// Row tensors' stride between (batch, head) rows: the whole call's seq_q.
    pub row_stride: u32,
    /// Windowed calls: 0 for the first pass over a window of outputs, 1 for each later pass,
    /// which continues from what the earlier ones stored (forward: the running softmax;
    /// backward: the gradient sums).
    pub resume: u32,
    /// With a window (the WINDOW bit): query i sees key j iff
    /// `i + band_lo <= j <= i + band_hi`, causal folded in, +-2^30 on an unbounded side.
    pub band_lo: i32,
    pub band_hi: i32,
    /// With a softcap (the SOFTCAP bit): c * log2(e), the cap in the exp2 domain.
    pub softcap2: f32,
    /// Windowed calls: the whole call's index of this part's first batch (extras are indexed
    /// by the whole call's batch).
    pub batch_base: u32,
    /// ALiBi: extras words between one batch's slopes and the next (0: one slope per head).
    pub alibi_b_stride: u32,
    /// Sinks: the extras word of query head 0's sink.
    pub sinks_base: u32,
    /// Per-batch key ranges: the extras word of batch 0's (length, first key) pair.
    pub seqlens_base: u32,
    /// Windowed calls: the whole call's index of this part's first key (a batch's length is
    /// counted from the whole call's key 0).
    pub kv_base: u32,
    /// Windowed calls: the whole call's index of this part's first query row (dropout keys
    /// its RNG by the whole call's indices).
    pub q_base: u32,
    /// Dropout: random words below this drop their pair ([`crate::Dropout::threshold`]).
    pub drop_threshold: u32,
    /// Dropout: a kept pair's factor, 1 / (1 - p).
    pub drop_scale: f32,
    /// Dropout: the Philox key (the seed) and the stream offset, low and high words.
    pub seed_lo: u32,
    pub seed_hi: u32,
    pub offset_lo: u32,
    pub offset_hi: u32,
    /// Block mask: the extras word where its bits start, the block sizes, the block columns
    /// of a grid (the whole call's), and the bits between batches' and heads' grids (0 along
    /// a broadcast dimension).
    pub blocks_base: u32,
    pub block_q: u32,
    pub block_kv: u32,
    pub blocks_cols: u32,
    pub blocks_b_stride: u32,
    pub blocks_h_stride: u32,
    /// The block mask's full blocks (`BlockMask::full`, a user mask's): the extras word of
    /// their first bit (after the on bits), 0 without them.
    pub blocks_full: u32,
    /// Where the pair data (`registry::params::pair_words`) starts in the buffer a kernel
    /// reads it from: 0 on wgpu (its own binding); on CUDA the extras' length (the pair words
    /// follow the extras).
    pub pairs_base: u32,
    /// The block mask's block sizes as shifts, where they are powers of two ([`NO_SHIFT`]
    /// where not): a pair's block is found by a shift, not a division, which CPU drivers
    /// cannot vectorize (one scalar division per lane, per pair).
    pub block_q_shift: u32,
    pub block_kv_shift: u32,
    /// Varlen: the extras word of `cu_seqlens_q[0]` (`cu_seqlens_kv` follows it), and the
    /// number of sequences.
    pub varlen_base: u32,
    pub sequences: u32,
    /// Windowed calls: where element 0 of the backward's (lse2, delta) pairs lies in its
    /// binding (a window of its own: its elements are 8 bytes).
    pub pair_shift: u32,
    /// Boolean mask: bits between one batch's grid and the next, one query head's and the
    /// next (0 along a broadcast dimension), and one row's and the next (the whole call's
    /// seq_kv). The kernels index bits in u32 (`BoolMask` holds at most 2^32 - 1).
    pub mask_b_stride: u32,
    pub mask_h_stride: u32,
    pub mask_cols: u32,
    /// Bias: the word of the pair data (`registry::params::pair_words`) where its entries
    /// start (after the boolean mask's bits), and the entries between one batch's grid and the next and one
    /// query head's and the next (0 along a broadcast dimension); its rows are `mask_cols`
    /// entries apart, as the mask's.
    pub bias_base: u32,
    pub bias_b_stride: u32,
    pub bias_h_stride: u32,
    /// Merge (`shaders/merge.wgsl`): 1 on the dispatch of the last shard, which stores the
    /// merged result into the output (half outputs are stored with `atomicOr`: once).
    pub merge_last: u32,
    /// Decode (`shaders/flash_decode.wgsl`): the key splits, and the keys of each (split s
    /// takes keys `[s * split_keys, (s + 1) * split_keys)`).
    pub splits: u32,
    pub split_keys: u32,
    /// Per-batch alignment (`AttentionConfig::align_to_seqlens`): the whole call's seq_kv,
    /// from which batch b's shift `seqlens_kv[b] - align_kv` is counted (0: off), and the
    /// least of those shifts (a bound for the kernels' key loops that cannot name a batch).
    pub align_kv: u32,
    pub align_min_shift: i32,
    /// Paged K/V (`AttentionConfig::paged`): the pair-data word where the block table starts
    /// (after the mask's bits and the bias's entries), rows per page, table entries per batch.
    pub pages_base: u32,
    pub page_size: u32,
    pub pages_per_seq: u32,
    /// Rotary embedding (`shaders/rotary.wgsl`): the dims turned (even, at most head_dim),
    /// 1 for pairs (2f, 2f + 1) (else (f, f + rotary_dim / 2)), and the positions between
    /// consecutive rows (1, or 0: a batch's rows at one position).
    pub rotary_dim: u32,
    pub rotary_interleaved: u32,
    pub rotary_step: u32,
    /// A user score modifier's captured tensors (`ScoreMod::wgsl_with`): the extras word
    /// where the first starts (the others follow it). Also keeps `flags` and `views` where
    /// WGSL lays them out.
    pub captured_base: u32,
    /// The call's modifiers, a bit each ([`super::flags`]; VIEWS set per step at record
    /// time). Also keeps `views` at a 16-byte boundary, as WGSL lays a uniform's array of
    /// vec4s out.
    pub flags: u32,
    /// Strided input views (the VIEWS bit, [`crate::Tensor`] views): for q, k, v, out and
    /// d_out ([`VIEW_SLOTS`] order), where element (b, i, h, d) lies in the binding: element
    /// `x + b * y + i * z + h * w + d` of `[x, y, z, w]`.
    pub views: [[u32; 4]; 5],
}
}

/// The inputs read through `Params::views` (the kernels' binding names), in slot order.
pub const VIEW_SLOTS: [&str; 5] = ["q", "k", "v", "out", "d_out"];

impl Params {
    /// The block mask's block sizes, with the shifts the kernels find a pair's block by.
    pub fn set_block_size(&mut self, block_q: usize, block_kv: usize) {
        self.block_q = block_q as u32;
        self.block_kv = block_kv as u32;
        self.block_q_shift = block_shift(block_q);
        self.block_kv_shift = block_shift(block_kv);
    }

    /// The band shifted for a window of a split call whose rows start at `q0` and keys at
    /// `k0` of the whole call (as `causal_offset` shifts).
    pub fn shift_band(&mut self, q0: usize, k0: usize) {
        let d = q0 as i64 - k0 as i64;
        let shift = |x: i32| (x as i64 + d).clamp(-BAND_UNBOUNDED, BAND_UNBOUNDED) as i32;
        if self.band_lo > -(BAND_UNBOUNDED as i32) {
            self.band_lo = shift(self.band_lo);
        }
        if self.band_hi < BAND_UNBOUNDED as i32 {
            self.band_hi = shift(self.band_hi);
        }
    }
}

/// The call's extras as the kernels read them (`extra(i)` / `extra_u32(i)` in WGSL, the
/// `extras` pointer on CUDA), as 32-bit words, and where each part lies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtrasLayout {
    /// The ALiBi slopes (`[heads_q]` or `[batch, heads_q]`, f32 bits), the sinks (`[heads_q]`,
    /// f32 bits), the per-batch key ranges (`[batch]` pairs of u32: length, first key), the
    /// block mask's bits ([`crate::BlockMask::bits`]), the varlen boundaries (u32), a user
    /// score modifier's captured tensors (f32 bits). Empty when none is on.
    pub words: Vec<u32>,
    /// Words between one batch's slopes and the next (0: one slope per head).
    pub alibi_b_stride: u32,
    /// The first word of the sinks, of the key lengths, of the block mask, and of the varlen
    /// boundaries (`cu_seqlens_q`, then `cu_seqlens_kv`).
    pub sinks_base: u32,
    pub seqlens_base: u32,
    pub blocks_base: u32,
    /// The first word of the block mask's full blocks (0: none).
    pub blocks_full: u32,
    pub varlen_base: u32,
    /// The first word of a user score modifier's captured tensors.
    pub captured_base: u32,
}

/// `Params::block_q_shift` and `block_kv_shift` for a block size that is no power of two:
/// the kernels divide.
pub const NO_SHIFT: u32 = 32;

/// log2 of a power-of-two block size, else [`NO_SHIFT`].
fn block_shift(size: usize) -> u32 {
    if size.is_power_of_two() {
        size.trailing_zeros()
    } else {
        NO_SHIFT
    }
}

/// What stands for an unbounded side of the band: no key offset reaches it (sequences are
/// shorter than 2^30 wherever i32 offsets are used).
pub const BAND_UNBOUNDED: i64 = 1 << 30;

/// A band side as the kernels compare it: causal_offset + side, or the unbounded stand-in
/// (`sign` -1 for the low side, +1 for the high side).
pub(crate) fn band_offset(causal_offset: i64, side: Option<i64>, sign: i64) -> i32 {
    match side {
        Some(x) => (causal_offset + x).clamp(-BAND_UNBOUNDED, BAND_UNBOUNDED) as i32,
        None => (sign * BAND_UNBOUNDED) as i32,
    }
}

/// Splits `total` workgroups into an (x, y) grid under the per-dimension limit.
pub fn fold_grid(total: u32, max_dim: u32) -> (u32, u32) {
    if total == 0 {
        return (0, 0);
    }
    let x = total.min(max_dim.max(1));
    (x, total.div_ceil(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_folding_covers_every_workgroup() {
        for total in [1u32, 5, 65535, 65536, 200_000, 4_000_000] {
            let (x, y) = fold_grid(total, 65535);
            assert!(x <= 65535 && y <= 65535);
            assert!(x as u64 * y as u64 >= total as u64);
            assert!((x as u64) * (y as u64 - 1) < total as u64);
        }
    }
}
