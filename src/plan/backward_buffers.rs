//! The backward plan's buffers: the slots its inputs, outputs and scratch take, shared by the
//! whole-call plan (`backward`) and the split one (`split::backward_steps`), so that neither
//! imports the other for them.

use super::BufRef;
use BufRef::{Input, Output, Scratch};

// Inputs, in order (the order `Context::backward` binds them).
pub(super) const Q: BufRef = Input(0);
pub(super) const K: BufRef = Input(1);
pub(super) const V: BufRef = Input(2);
pub(super) const OUT: BufRef = Input(3);
pub(super) const LSE: BufRef = Input(4);
pub(super) const D_OUT: BufRef = Input(5);
// Outputs and scratch.
pub(super) const DQ: BufRef = Output(0);
pub(super) const DK: BufRef = Output(1);
pub(super) const DV: BufRef = Output(2);
/// Each query row's (lse in the exp2 domain, delta = rowsum(dO * out)): the preprocess writes
/// it, every later kernel reads it.
pub(super) const LSE_DELTA: BufRef = Scratch(0);
pub(super) const D_SINKS: BufRef = Output(3);
