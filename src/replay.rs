//! A plan as portable data, for replay on another WebGPU implementation.
//!
//! [`Plan::replay`] turns what a call dispatches into plain data: the WGSL of every step for a
//! given shader compiler, its bindings, the `Params` words and the folded
//! grid, and the buffers with their initial contents. Serialized as JSON, a small runner on
//! any WebGPU implementation can execute it exactly as `record` does on wgpu
//! (`dawn/runner.mjs` does so on Dawn), and compare against expected outputs in
//! [`ReplayCheck`]s, so the two paths cannot drift.

use serde::Serialize;

use crate::dtype::Element;
use crate::kernels::{fold_grid, Access, WgslConsumer};
use crate::plan::{BufRef, Plan};

/// One buffer of a replayed call, zero-filled unless `words` gives its contents.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayBuffer {
    pub label: String,
    pub bytes: u64,
    /// Little-endian 32-bit words (half-precision tensors: two elements per word).
    pub words: Option<Vec<u32>>,
    /// Bound as a uniform buffer (the extras), not a storage one.
    pub uniform: bool,
}

/// A binding (slot 1 + its index): which buffer, and whether the kernel only reads it; the
/// extras are a uniform binding after the storage ones.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayBinding {
    pub buffer: usize,
    pub read_only: bool,
    pub uniform: bool,
    /// The bound byte range when not the whole buffer (a split call's window).
    pub offset: Option<u64>,
    pub size: Option<u64>,
}

/// One dispatch, self-contained.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayStep {
    pub label: String,
    pub wgsl: String,
    pub bindings: Vec<ReplayBinding>,
    /// The `Params` uniform (binding 0) as 32-bit words.
    pub params: Vec<u32>,
    /// Workgroups in x and y (the grid folded under the per-dimension limit).
    pub grid: [u32; 2],
    pub uses_f16: bool,
    pub uses_subgroups: bool,
}

/// What one output buffer must hold after the steps ran.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayCheck {
    pub label: String,
    pub buffer: usize,
    pub dtype: &'static str,
    /// `"tensor"`: max |got - expected| <= tol * max |expected|. `"lse"`: per element,
    /// |got - expected| <= tol * max(1, |expected|), and `null` means exactly -inf.
    pub kind: &'static str,
    pub expected: Vec<Option<f64>>,
    pub tol: f64,
    /// Elements that must be NaN (rows that see a NaN); their `expected` is ignored and they
    /// do not count in max |expected|.
    pub nan: Vec<usize>,
}

/// A replayable call: buffers (inputs, then outputs, then scratch), steps and checks.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayCase {
    pub name: String,
    pub buffers: Vec<ReplayBuffer>,
    pub steps: Vec<ReplayStep>,
    pub checks: Vec<ReplayCheck>,
}

impl ReplayCase {
    /// The case as JSON (what `dawn/runner.mjs` reads).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A tensor's device bytes as little-endian words, padded to a whole word.
pub fn to_words<T: Element>(x: &[T]) -> Vec<u32> {
    let mut bytes: Vec<u8> = bytemuck::cast_slice(x).to_vec();
    bytes.resize(bytes.len().next_multiple_of(4).max(4), 0);
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Plan {
    /// This plan as replay data. `inputs` gives each input's words (in `Plan::inputs`
    /// order); `max_workgroups_per_dimension` folds the grids as `record` does.
    pub fn replay(
        &self,
        name: &str,
        consumer: WgslConsumer,
        inputs: Vec<Vec<u32>>,
        max_workgroups_per_dimension: u32,
    ) -> ReplayCase {
        let mut buffers: Vec<ReplayBuffer> = self
            .inputs
            .iter()
            .zip(inputs)
            .map(|(role, words)| ReplayBuffer {
                label: role.to_string(),
                bytes: words.len() as u64 * 4,
                words: Some(words),
                uniform: false,
            })
            .collect();
        let first_output = buffers.len();
        buffers.extend(self.outputs.iter().map(|o| {
            ReplayBuffer {
                label: o.role.to_string(),
                bytes: o
                    .dtype
                    .buffer_bytes(o.shape.iter().product::<usize>() as u64)
                    .unwrap_or(4),
                words: None,
                uniform: false,
            }
        }));
        let first_scratch = buffers.len();
        buffers.extend(self.scratch.iter().map(|s| ReplayBuffer {
            label: s.label.to_string(),
            bytes: s.bytes.max(4).next_multiple_of(4),
            words: None,
            uniform: false,
        }));
        let extras = buffers.len();
        if !self.extras.is_empty() {
            let n = crate::kernels::wgsl::EXTRAS_WORDS as usize;
            let mut words = self.extras.clone();
            words.resize(n, 0);
            buffers.push(ReplayBuffer {
                label: "extras".into(),
                bytes: n as u64 * 4,
                words: Some(words),
                uniform: true,
            });
        }
        let pairs = buffers.len();
        if !self.pairs.is_empty() {
            buffers.push(ReplayBuffer {
                label: "pair data".into(),
                bytes: self.pairs.len() as u64 * 4,
                words: Some(self.pairs.clone()),
                uniform: false,
            });
        }
        let index = |r: &BufRef| match *r {
            BufRef::Input(i) => i,
            BufRef::Output(i) => first_output + i,
            BufRef::Scratch(i) => first_scratch + i,
            BufRef::Extras => extras,
            BufRef::Pairs => pairs,
        };
        let steps = self
            .steps
            .iter()
            .map(|s| {
                let (x, y) = fold_grid(s.workgroups, max_workgroups_per_dimension);
                ReplayStep {
                    label: s.key.label(),
                    wgsl: s.key.wgsl_for(consumer),
                    bindings: s
                        .buffers
                        .iter()
                        .enumerate()
                        .map(|(i, r)| ReplayBinding {
                            buffer: index(r),
                            // past the kernel's own: the extras and the pair data (read), then
                            // the kept gradients' scratch (written)
                            read_only: match s.key.kernel.bindings().get(i) {
                                Some(b) => b.access == Access::Read,
                                None => !(s.key.binds_kept() && i + 1 == s.buffers.len()),
                            },
                            uniform: *r == BufRef::Extras,
                            offset: s.window(i).map(|w| w.offset),
                            size: s.window(i).map(|w| w.size),
                        })
                        .collect(),
                    params: bytemuck::cast_slice(std::slice::from_ref(&s.params)).to_vec(),
                    grid: [x, y],
                    uses_f16: s.key.uses_f16(),
                    uses_subgroups: s.key.uses_subgroups(),
                }
            })
            .collect();
        ReplayCase {
            name: name.to_string(),
            buffers,
            steps,
            checks: Vec::new(),
        }
    }

    /// The replay buffer index of output `i`.
    pub fn replay_output_buffer(&self, i: usize) -> usize {
        self.inputs.len() + i
    }
}
