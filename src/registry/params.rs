//! A call's parameter block and data words, built from its config through the registry: the
//! shape and scale, every modifier's bits and scalars ([`super::encode_all`]), and where each
//! part of the extras and the pair data lies. `Params` itself (kernels/params.rs) is the
//! kernels' layout and imports none of this.

use crate::kernels::params::{ExtrasLayout, Params};
use crate::AttentionConfig;

impl Params {
    /// The parameter block of a call: its shape and scale, its modifier bits, the extras'
    /// offsets and every modifier's scalars.
    pub fn from_config(cfg: &AttentionConfig) -> Params {
        let scale = cfg.scale();
        let x = extras_layout(cfg);
        let mut p = Params {
            batch: cfg.batch as u32,
            seq_q: cfg.seq_q as u32,
            seq_kv: cfg.seq_kv as u32,
            heads_q: cfg.heads_q as u32,
            heads_kv: cfg.heads_kv as u32,
            head_dim: cfg.head_dim as u32,
            group: cfg.group() as u32,
            causal_offset: cfg.causal_offset().clamp(i32::MIN as i64, i32::MAX as i64) as i32,
            scale,
            scale_log2: scale * std::f32::consts::LOG2_E,
            row_stride: cfg.seq_q as u32,
            flags: super::bits(cfg),
            ..Default::default()
        }
        .with_extras(&x);
        // blocks of 1 x 1 until a mask says otherwise (never a division by zero)
        p.set_block_size(1, 1);
        // each modifier's own scalars (src/registry/)
        super::encode_all(cfg, &mut p);
        p.with_block_grid(cfg)
    }

    /// `from_config(part)` for a part of a call cut into windows, with the extras' offsets of
    /// `whole`: the kernels read the whole call's extras (`Plan::attach_extras`), whose key
    /// lengths are one pair per batch of the whole call, so a part's own layout (fewer batches)
    /// would place the block mask, the varlen boundaries and the captured tensors too early.
    pub fn from_part(part: &AttentionConfig, whole: &AttentionConfig) -> Params {
        Params::from_config(part).with_extras(&extras_layout(whole))
    }

    /// Where the kernels find each part of the extras (and the ALiBi slopes' batch stride).
    fn with_extras(self, x: &ExtrasLayout) -> Params {
        Params {
            alibi_b_stride: x.alibi_b_stride,
            sinks_base: x.sinks_base,
            seqlens_base: x.seqlens_base,
            blocks_base: x.blocks_base,
            varlen_base: x.varlen_base,
            blocks_full: x.blocks_full,
            captured_base: x.captured_base,
            ..self
        }
    }

    /// The block mask's geometry (block sizes, grid columns, strides between grids) and the
    /// boolean mask's row length from `whole`: the whole call's config, also for a windowed
    /// call's part, whose own smaller config would give the wrong grids.
    pub fn with_block_grid(mut self, whole: &AttentionConfig) -> Params {
        self.mask_cols = whole.seq_kv as u32;
        let Some(m) = &whole.block_mask else {
            return self;
        };
        let (b_stride, h_stride) = m.strides(whole.seq_q, whole.seq_kv);
        self.set_block_size(m.block_q, m.block_kv);
        self.blocks_cols = m.grid(whole.seq_q, whole.seq_kv).1 as u32;
        self.blocks_b_stride = b_stride as u32;
        self.blocks_h_stride = h_stride as u32;
        self
    }
}

/// The one place the extras' layout is decided (`Params` and the CUDA shape read the offsets).
pub(crate) fn extras_layout(cfg: &AttentionConfig) -> ExtrasLayout {
    let bits = |v: &Option<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut words = bits(&cfg.alibi_slopes);
    let sinks_base = words.len() as u32;
    words.extend(bits(&cfg.sinks));
    let seqlens_base = words.len() as u32;
    // per batch: its key length, then its first key (the kernels read both or neither)
    if cfg.per_batch_keys() {
        words.extend((0..cfg.batch).flat_map(|b| [cfg.kv_len(b) as u32, cfg.kv_start(b) as u32]));
    }
    let blocks_base = words.len() as u32;
    words.extend(cfg.block_mask.iter().flat_map(|m| m.bits()));
    let blocks_full = match cfg.block_mask.as_ref().map(|m| m.full_bits()) {
        Some(full) if !full.is_empty() && cfg.mask_mod.is_some() => {
            let at = words.len() as u32;
            words.extend(full);
            at
        }
        _ => 0,
    };
    let varlen_base = words.len() as u32;
    if let Some(v) = &cfg.varlen {
        words.extend(v.cu_seqlens_q.iter().chain(&v.cu_seqlens_kv));
    }
    let captured_base = words.len() as u32;
    words.extend(super::user_code::captured_words(cfg));
    ExtrasLayout {
        words,
        alibi_b_stride: match &cfg.alibi_slopes {
            Some(s) if s.len() != cfg.heads_q => cfg.heads_q as u32,
            _ => 0,
        },
        sinks_base,
        seqlens_base,
        blocks_base,
        blocks_full,
        varlen_base,
        captured_base,
    }
}

/// The call's pair data as the kernels read it (the wgpu pair-data binding, `Plan::pairs`; on
/// CUDA the words after the extras): the boolean mask's bits, then the bias's entries from
/// word `Params::bias_base`, then a paged call's block table from `Params::pages_base`. Empty
/// without any.
pub(crate) fn pair_words(cfg: &AttentionConfig) -> Vec<u32> {
    let mask = cfg.mask.iter().flat_map(|m| m.words());
    mask.chain(cfg.bias.iter().flat_map(|b| b.words()))
        .chain(cfg.paged.iter().flat_map(|p| p.block_table.iter()))
        .copied()
        .collect()
}

/// The call's extras words ([`ExtrasLayout::words`]).
pub(crate) fn extras(cfg: &AttentionConfig) -> Vec<u32> {
    extras_layout(cfg).words
}
