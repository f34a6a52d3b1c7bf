//! The modifiers a call has, as bits of `Params::flags`. The kernels read each through a
//! WGSL function of its name (`CAUSAL()`, `ALIBI()`, ...) that the generated prelude defines:
//! at run time from the uniform bit field, where the bit costs nothing measurable when off,
//! so that one pipeline serves every combination (one compile, not one per combination); or
//! compiled in as a constant, for the bits whose per-score work costs when merely tested
//! ([`COMPILED`], decided by measurement: docs/PERFORMANCE.md, "Modifiers as run-time bits").
//! A bit a kernel never reads is compiled in as false; a call whose bits are all compiled or
//! [`SPECIALIZED`] gets a lean pipeline that reads only the [`SPECIALIZED`] bits at run time.

use super::hooks::{self as m, Data};

// Each bit is its modifier's (src/kernels/hooks.rs), named here for the kernels' catalogue.
/// The causal mask (bottom-right aligned).
pub const CAUSAL: u32 = m::CAUSAL.bit;
/// A sliding window (`Params::band_lo`, `band_hi`).
pub const WINDOW: u32 = m::WINDOW.bit;
/// A softcap (`Params::softcap2`): a tanh per score.
pub const SOFTCAP: u32 = m::SOFTCAP.bit;
/// ALiBi slopes (the extras).
pub const ALIBI: u32 = m::ALIBI.bit;
/// Attention sinks (the extras).
pub const SINKS: u32 = m::SINKS.bit;
/// Per-batch key lengths (the extras).
pub const SEQLENS: u32 = m::SEQLENS.bit;
/// Dropout: a Philox block per four pairs.
pub const DROPOUT: u32 = m::DROPOUT.bit;
/// A block mask (the extras).
pub const BLOCKS: u32 = m::BLOCKS.bit;
/// Packed variable-length sequences (the extras).
pub const VARLEN: u32 = m::VARLEN.bit;
/// A boolean mask over pairs (the pair data).
pub const MASK: u32 = m::MASK.bit;
/// An additive bias over pairs (the pair data): a load per score.
pub const BIAS: u32 = m::BIAS.bit;
/// K and V in pages through a block table (the pair data).
pub const PAGED: u32 = m::PAGED.bit;
/// Inputs read through strided views (`Params::views`), set per step at record time.
pub const VIEWS: u32 = m::VIEWS.bit;
/// A user's score modifier (`AttentionConfig::score_mod`): compiled in, its code in the key.
pub const SCORE_MOD: u32 = m::SCORE_MOD.bit;
/// A user's mask (`AttentionConfig::mask_mod`): compiled in, its code in the key.
pub const MASK_MOD: u32 = m::MASK_MOD.bit;
/// An MLA latent cache: the values are read from the key rows
/// (`AttentionConfig::values_in_keys`).
pub const LATENT: u32 = m::LATENT.bit;

/// Every bit with its WGSL name, in bit order.
pub const ALL: [(u32, &str); m::ALL.len()] = {
    let mut all = [(0, ""); m::ALL.len()];
    let mut i = 0;
    while i < all.len() {
        all[i] = (m::ALL[i].bit, m::ALL[i].name);
        i += 1;
    }
    all
};

/// Every bit.
pub const fn every() -> u32 {
    (1 << ALL.len()) - 1
}

/// The bits compiled into pipelines by default: those whose work sits in the per-score path
/// (softcap's tanh, dropout's Philox, the bias's load), and the boolean mask, whose run-time
/// test cost more than 2% switched off on lavapipe (docs/PERFORMANCE.md).
pub const COMPILED: u32 = m::compiled_bits();

/// The bits a call may have and still get the lean pipeline, which reads only these at run
/// time (each costs nothing measurable when off) and compiles every other bit in: a call whose
/// bits are all among these and [`COMPILED`] runs it, so the common calls (plain and causal)
/// share one pipeline and pay nothing for the run-time bits they do not use; a call with any
/// other modifier runs the shared pipeline that reads them all at run time, which costs
/// lavapipe 8-14% over a specialized build when none is set (docs/PERFORMANCE.md, "Modifiers
/// as run-time bits").
pub const SPECIALIZED: u32 = CAUSAL;

/// The bits whose values live in the extras (a uniform array the pipeline binds).
pub const IN_EXTRAS: u32 = m::bits_in(Data::Extras);
/// The bits whose values live in the pair data (a storage array the pipeline binds).
pub const IN_PAIRS: u32 = m::bits_in(Data::Pairs);

/// `FLASH_ATTN_COMPILED_FLAGS`: which bits to compile in instead of [`COMPILED`], as a comma
/// list of names (`all`, `none`), for measuring what a run-time bit costs (the bench and
/// docs/PERFORMANCE.md use it); a name it does not know is left out.
pub const COMPILED_ENV: &str = "FLASH_ATTN_COMPILED_FLAGS";

/// [`COMPILED`], or what `COMPILED_ENV` names.
pub fn compiled_from_env() -> u32 {
    std::env::var(COMPILED_ENV)
        .ok()
        .map_or(COMPILED, |v| parse(&v))
}

/// A comma list of bit names (`all`, `none`) as bits.
pub fn parse(list: &str) -> u32 {
    list.split(',')
        .map(str::trim)
        .map(|name| match name.to_ascii_lowercase().as_str() {
            "all" => ALL.iter().fold(0, |m, (b, _)| m | b),
            "none" | "" => 0,
            n => ALL
                .iter()
                .find(|(_, w)| w.eq_ignore_ascii_case(n))
                .map_or(0, |(b, _)| *b),
        })
        .fold(0, |m, b| m | b)
}

/// Names of the set bits, for labels.
pub fn names(bits: u32) -> String {
    ALL.iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| n.to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(",")
}

/// The prelude's flag functions: each bit in `runtime` read from `params.flags`, each other
/// bit a constant, true where `compiled_on` has it.
pub fn wgsl(runtime: u32, compiled_on: u32) -> String {
    let mut s = String::new();
    for (bit, name) in ALL {
        let body = if runtime & bit != 0 {
            format!("(params.flags & {bit}u) != 0u")
        } else {
            (compiled_on & bit != 0).to_string()
        };
        s.push_str(&format!("fn {name}() -> bool {{ return {body}; }}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_gives_the_measured_sets() {
        assert_eq!(
            COMPILED,
            SOFTCAP | DROPOUT | BIAS | MASK | SCORE_MOD | MASK_MOD
        );
        assert_eq!(
            IN_EXTRAS,
            ALIBI | SINKS | SEQLENS | BLOCKS | VARLEN | SCORE_MOD | MASK_MOD
        );
        assert_eq!(IN_PAIRS, MASK | BIAS | PAGED);
        assert_eq!(ALL[12], (VIEWS, "VIEWS"));
    }

    #[test]
    fn names_parse_back_to_their_bits() {
        assert_eq!(
            parse("softcap,DROPOUT, bias,mask,score_mod,mask_mod"),
            COMPILED
        );
        assert_eq!(parse("none"), 0);
        assert_eq!(parse("all"), (1 << ALL.len()) - 1);
        assert_eq!(parse("causal,nonsense"), CAUSAL);
        for (bit, name) in ALL {
            assert_eq!(parse(name), bit);
            assert_eq!(names(bit), name.to_ascii_lowercase());
        }
    }

    #[test]
    fn the_prelude_reads_run_time_bits_and_folds_the_rest() {
        let s = wgsl(CAUSAL, SOFTCAP);
        assert!(s.contains("fn CAUSAL() -> bool { return (params.flags & 1u) != 0u; }"));
        assert!(s.contains("fn SOFTCAP() -> bool { return true; }"));
        assert!(s.contains("fn ALIBI() -> bool { return false; }"));
    }
}
