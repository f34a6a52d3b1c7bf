//! What every modifier's entry in the registry is (`Modifier`) and what the entries share,
//! below both the entries (one file each) and the registry's list of them (mod.rs), so that
//! neither imports the other back.

use crate::error::Result;
use crate::kernels::hooks::Hooks;
use crate::kernels::params::Params;
use crate::AttentionConfig;

/// A pair of a call: (batch, query head, query row, key).
pub(crate) type Pair = (usize, usize, usize, usize);

/// The f64 reference of how a modifier acts on a visible pair's score, at natural-log scores:
/// the same kind as its hook ([`ScoreHook`](crate::kernels::hooks::ScoreHook)).
#[derive(Clone, Copy)]
pub(crate) enum Reference {
    /// It does not touch scores.
    None,
    /// t = value(s), and dt/ds at s.
    Transform {
        value: fn(&AttentionConfig, Pair, f64) -> f64,
        slope: fn(&AttentionConfig, Pair, f64) -> f64,
    },
    /// A term added to the score.
    Term(fn(&AttentionConfig, Pair) -> f64),
}

/// One modifier's rules over a call.
pub(crate) struct Modifier {
    /// Its kernel side.
    pub hooks: &'static Hooks,
    /// The call has it.
    pub active: fn(&AttentionConfig) -> bool,
    /// Its part of `AttentionConfig::validate`: a typed error for a bad value.
    pub check: fn(&AttentionConfig) -> Result<()>,
    /// Its scalars in the parameter block (extras offsets are `params::extras_layout`'s).
    pub encode: fn(&AttentionConfig, &mut Params),
    /// Its f64 reference on scores.
    pub reference: Reference,
}

pub(super) fn never(_: &AttentionConfig) -> bool {
    false
}
pub(super) fn no_check(_: &AttentionConfig) -> Result<()> {
    Ok(())
}
pub(super) fn no_params(_: &AttentionConfig, _: &mut Params) {}
