//! Each modifier's rules over a call: when the call has it, its part of
//! [`AttentionConfig::validate`], its scalars in the parameter block, and its f64 reference.
//! One entry per modifier, in bit order ([`ALL`]), each pointing at its kernel side
//! ([`crate::kernels::hooks`]: bit, name, snippets); its public value type, if it has one,
//! lives in [`crate::modifiers`].
//!
//! The layers point one way: the hooks and the value types know nothing of a call, the
//! config holds the values, and this registry reads the config. `Params` is built from the
//! registry here (`params.rs`), and validation runs it (src/validate.rs).

mod alibi;
mod band;
mod bias;
mod block_mask;
mod bool_mask;
mod dropout;
mod latent;
mod mask_mod;
mod modifier;
mod paged;
pub(crate) mod params;
pub(crate) mod positions;
mod score_mod;
mod seqlens;
mod sinks;
mod softcap;
pub(crate) mod user_code;
mod varlen;

use crate::error::Result;
use crate::kernels::hooks;
use crate::kernels::params::Params;
use crate::AttentionConfig;

pub(crate) use mask_mod::reference as mask_mod_reference;
use modifier::{never, no_check, no_params, Modifier, Pair, Reference};

/// Strided input views: a property of the tensors, not of the config (set at record time).
const VIEWS: Modifier = Modifier {
    hooks: &hooks::VIEWS,
    active: never,
    check: no_check,
    encode: no_params,
    reference: Reference::None,
};

/// Every modifier, in bit order (entry i's hooks are `hooks::ALL[i]`).
pub(crate) const ALL: [&Modifier; 16] = [
    &band::CAUSAL,
    &band::WINDOW,
    &softcap::MODIFIER,
    &alibi::MODIFIER,
    &sinks::MODIFIER,
    &seqlens::MODIFIER,
    &dropout::MODIFIER,
    &block_mask::MODIFIER,
    &varlen::MODIFIER,
    &bool_mask::MODIFIER,
    &bias::MODIFIER,
    &paged::MODIFIER,
    &VIEWS,
    &score_mod::MODIFIER,
    &mask_mod::MODIFIER,
    &latent::MODIFIER,
];

/// The modifier bits of a call (VIEWS, which belongs to tensors, is added at record time).
pub(crate) fn bits(cfg: &AttentionConfig) -> u32 {
    ALL.iter()
        .filter(|m| (m.active)(cfg))
        .fold(0, |bits, m| bits | m.hooks.bit)
}

/// Runs every modifier's validation, in bit order.
pub(crate) fn check_all(cfg: &AttentionConfig) -> Result<()> {
    ALL.iter().try_for_each(|m| (m.check)(cfg))
}

/// Writes every modifier's scalars into `p`.
pub(crate) fn encode_all(cfg: &AttentionConfig, p: &mut Params) {
    for m in ALL {
        (m.encode)(cfg, p);
    }
}

/// The f64 reference's score chain for a visible pair from its raw (natural-log) score x:
/// the finished score and d(score)/dx, the modifiers in the kernels' order.
pub(crate) fn reference_chain(cfg: &AttentionConfig, at: Pair, x: f64) -> (f64, f64) {
    let (mut s, mut slope) = (x, 1.0);
    for m in ALL.iter().filter(|m| (m.active)(cfg)) {
        match m.reference {
            Reference::None => {}
            Reference::Transform { value, slope: d } => {
                slope *= d(cfg, at, s);
                s = value(cfg, at, s);
            }
            Reference::Term(term) => s += term(cfg, at),
        }
    }
    (s, slope)
}

/// The score the user's `score_mod` takes at pair `at` from raw score x: the chain before it
/// (it is the chain's last transform), for a trainable tensor's reference gradient.
pub(crate) fn reference_before_score_mod(cfg: &AttentionConfig, at: Pair, x: f64) -> f64 {
    let mut s = x;
    for m in ALL.iter().filter(|m| (m.active)(cfg)) {
        if std::ptr::eq(m.hooks, &hooks::SCORE_MOD) {
            break;
        }
        match m.reference {
            Reference::None => {}
            Reference::Transform { value, .. } => s = value(cfg, at, s),
            Reference::Term(term) => s += term(cfg, at),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::hooks::ScoreHook;

    #[test]
    fn each_entry_is_its_hooks_in_bit_order_with_a_reference_of_the_same_kind() {
        for (i, m) in ALL.iter().enumerate() {
            assert!(std::ptr::eq(m.hooks, hooks::ALL[i]), "{}", m.hooks.name);
            let same = matches!(
                (m.hooks.score, m.reference),
                (ScoreHook::None, Reference::None)
                    | (ScoreHook::Transform { .. }, Reference::Transform { .. })
                    | (ScoreHook::Term { .. }, Reference::Term(_))
            );
            assert!(same, "{}: hook and reference differ in kind", m.hooks.name);
        }
    }

    #[test]
    fn a_call_sets_the_bits_of_its_modifiers() {
        use crate::kernels::flags::{CAUSAL, SOFTCAP};
        let mut cfg = AttentionConfig::new(1, 8, 8, 2, 2, 16);
        assert_eq!(bits(&cfg), 0);
        cfg.causal = true;
        cfg.softcap = Some(5.0);
        assert_eq!(bits(&cfg), CAUSAL | SOFTCAP);
    }
}
