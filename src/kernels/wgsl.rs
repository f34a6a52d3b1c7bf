//! WGSL assembly: a pipeline's source is a generated prelude, then `common.wgsl` and the
//! modifiers' snippets (shaders/modifiers/), then the kernel body. The prelude is where everything that varies per pipeline enters:
//!
//! - `struct Params`, from its one definition in `params.rs`;
//! - shape constants (HEAD_DIM, BR, BC, ...) that size register and workgroup arrays;
//! - the modifier functions `CAUSAL()` .. `VIEWS()`: run-time bits or constants (`flags`);
//! - the kernel's bindings, declared from `Kernel::bindings`;
//! - for each element-typed binding, `load_<name>(i: u32) -> f32` and, for outputs,
//!   `store_<name>(i: u32, x: f32)`, written for the call's dtype and storage format (or, in a
//!   windowed call's accumulate mode, f32 outputs carried between passes). Kernel bodies never
//!   see the storage type: adding a dtype touches only this file.

use std::fmt::Write as _;

use super::tiles::PIN_WORDS;
use super::{Access, BindType, Binding, Kernel, Pass, Tiles, Variant};
use crate::dtype::{DType, ElemFormat};
use crate::kv_format::CacheFormat;

/// The shared WGSL every kernel includes (shaders/common.wgsl).
pub const SHARED_WGSL: &str = include_str!("../../shaders/common.wgsl");
const COMMON: &str = SHARED_WGSL;
const BLOCKS: &str = include_str!("../../shaders/blocks.wgsl");
const BLOCKS_BWD: &str = include_str!("../../shaders/blocks_bwd.wgsl");
const COOP: &str = include_str!("../../shaders/coop.wgsl");
const KV_FORMAT: &str = include_str!("../../shaders/kv_format.wgsl");

/// 32-bit words a call's extras hold at most (ALiBi slopes, sinks, per-batch key lengths):
/// 64 KiB, the WebGPU default `maxUniformBufferBindingSize`. Every pipeline with extras binds
/// that many.
pub const EXTRAS_WORDS: u32 = 16384;

/// Entries of a trainable captured tensor that the dQ kernels sum in place at most
/// (`KernelKey::sums_table`: a private f32 each per invocation); a longer tensor's gradient
/// goes through the kept pairs' scratch and `Kernel::FlashBwdTable`.
pub const TABLE_SUM_ENTRIES: usize = 256;

/// The entry point of every element-parallel kernel: 64 invocations per workgroup over a
/// grid folded into (x, y); each invocation below `total_items` runs the kernel's `item`.
pub const ELEMENTWISE_WORKGROUP: u32 = 64;

fn elementwise_entry() -> String {
    let n = ELEMENTWISE_WORKGROUP;
    format!(
        "
@compute @workgroup_size({n})
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {{
    let e = linear_workgroup(wid, nwg) * {n}u + t;
    if (e < params.total_items) {{
        item(e);
    }}
}}
"
    )
}

/// Which shader compiler a WGSL source is generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WgslConsumer {
    /// naga, wgpu's compiler (to SPIR-V, MSL, HLSL).
    Naga,
    /// Tint, the compiler of Dawn and Chrome's WebGPU.
    Tint,
}

/// What a pipeline binding is ([`KernelKey::layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingKind {
    /// A uniform buffer (the `Params` block, the extras).
    Uniform,
    /// A storage buffer, read-only or read-write.
    Storage { read_only: bool },
}

/// A pipeline's identity: kernel, element format, shape constants and the modifier bits it
/// reads at run time or has compiled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelKey {
    pub kernel: Kernel,
    /// How element-typed bindings are stored; `F32` for kernels without any.
    pub elem: ElemFormat,
    pub head_dim: u32,
    /// Elements per value and output row where they differ from `head_dim`
    /// (`AttentionConfig::head_dim_v`); 0: `head_dim` ([`KernelKey::dv`], the prelude's
    /// HEAD_DIM_V), so that a key of equal dims is one key however it was made.
    pub head_dim_v: u32,
    pub tiles: Tiles,
    /// The modifier bits read at run time from `Params::flags` ([`super::flags`]): the bits
    /// the kernel reads ([`Kernel::reads_flags`]) that are not compiled in.
    pub runtime: u32,
    /// The modifier bits compiled in as true (the call's, among the kernel's bits that are
    /// compiled: [`super::flags::COMPILED`] by default). Every bit in neither set is a
    /// constant false in the pipeline.
    pub flags: u32,
    /// The decode kernel reads K and V in 16-byte words (8 halves or 4 floats), this many a
    /// column (0: element reads). On CPU drivers every load in a loop is a per-lane gather,
    /// and a wide one costs about what a scalar one does. Set by the decode plan where every
    /// row starts on a whole word (`plan::decode::wide_words`).
    pub wide: u32,
    /// The kernel stores each pair's gradient at its finished score (`keep_grad`: the dQ
    /// kernels and the naive dS kernel of a call that asks for `d_bias` or `d_table`), into
    /// an f32 scratch bound after the pair data (`kept_grads_slot`); the bias's gradient
    /// reads it there (`KEPT_WORDS` words a pair).
    pub keeps_grads: bool,
    /// Beside each kept gradient, the score the user's `score_mod` took there (natural-log
    /// units), for a trainable captured tensor's gradient (`d_table`): two words a pair
    /// (`KEPT_WORDS`), for the kernels that keep them and those that read them.
    pub keeps_scores: bool,
    /// The dQ kernel sums a trainable captured tensor's gradient itself (`keep_grad` into
    /// per-invocation sums, `table_flush` into a part per workgroup of `kept_grads`), for a
    /// tensor of at most [`TABLE_SUM_ENTRIES`] entries; `score_mod_dt` is in its user code.
    pub sums_table: bool,
    /// A user's score modifier and mask (`AttentionConfig::score_mod`, `mask_mod`): their
    /// WGSL, appended to the source, where the kernel reads their bits and the call has one.
    pub user_code: Option<&'static str>,
    /// Rows kernels: the fixed subgroup size they share tile reads across, or 0 for none.
    pub subgroup: u32,
    /// A windowed call's pass (tiled kernels only): the element outputs are f32 buffers that
    /// later passes continue from (`Params::resume`); a final cast takes them to the dtype.
    pub accumulate: bool,
    /// K and V are an 8-bit cache of this format (a KV-cache call, module
    /// [`kv_format`](crate::kv_format)): the forward and decode kernels read them
    /// as words through its loads; the quantizing append writes one.
    pub kv: Option<CacheFormat>,
}

impl KernelKey {
    /// A key for a kernel with no shape (probes, canary).
    pub fn plain(kernel: Kernel) -> KernelKey {
        KernelKey {
            kernel,
            elem: ElemFormat::F32,
            head_dim: 1,
            head_dim_v: 0,
            tiles: Tiles::ONE,
            runtime: 0,
            flags: 0,
            wide: 0,
            keeps_grads: false,
            keeps_scores: false,
            sums_table: false,
            subgroup: 0,
            accumulate: false,
            user_code: None,
            kv: None,
        }
    }

    pub fn label(&self) -> String {
        format!(
            "{} {}{} d={}{} br={} bc={} tpr={} rpt={} runtime=[{}] compiled=[{}]{}{}{} sg={}{}{}",
            self.kernel.name(),
            self.elem.name(),
            self.kv.map_or(String::new(), |f| format!(" kv={f}")),
            self.head_dim,
            if self.head_dim_v != 0 {
                format!(" dv={}", self.head_dim_v)
            } else {
                String::new()
            },
            self.tiles.br,
            self.tiles.bc,
            self.tiles.tpr,
            self.tiles.rpt,
            super::flags::names(self.runtime),
            super::flags::names(self.flags),
            match (self.wide, self.kv.is_some()) {
                (0, _) | (2, true) => "",
                (1, true) => " narrow",
                _ => " wide",
            },
            match (self.keeps_grads, self.keeps_scores) {
                (_, true) => " keeps_grads_scores",
                (true, false) => " keeps_grads",
                _ => "",
            },
            if self.sums_table { " sums_table" } else { "" },
            self.subgroup,
            if self.accumulate { " accumulate" } else { "" },
            self.user_code
                .map_or(String::new(), |t| format!(" user_code={:016x}", {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    t.hash(&mut h);
                    h.finish()
                }))
        )
    }

    /// True when the pipeline reads one of `bits` (at run time or compiled in as true).
    pub fn reads(&self, bits: u32) -> bool {
        (self.runtime | self.flags) & bits != 0
    }

    /// Full WGSL source for naga (wgpu): generated prelude, common code, kernel body.
    pub fn wgsl(&self) -> String {
        self.wgsl_for(WgslConsumer::Naga)
    }

    /// True when the kernel calls subgroup builtins (rows kernels sharing tile reads, coop
    /// kernels sharing out matrix blocks by subgroup id).
    pub fn uses_subgroups(&self) -> bool {
        ((self.kernel.is_rows_variant() || self.kernel.is_decode()) && self.subgroup > 1)
            || self.kernel.is_coop()
    }

    /// True when the pipeline binds the call's extras (ALiBi slopes, sinks, key lengths): a
    /// uniform array
    /// after the storage bindings (`EXTRAS_SLOT` past them), so that no combination of
    /// features takes a storage binding past the WebGPU default of 8 per stage.
    pub fn uses_extras(&self) -> bool {
        self.reads(super::flags::IN_EXTRAS)
    }

    /// The binding slot of the extras: right after the kernel's storage bindings.
    pub fn extras_slot(&self) -> u32 {
        self.kernel.bindings().len() as u32 + 1
    }

    /// True when the pipeline binds the call's pair data (`Plan::pairs`: the boolean mask's
    /// bits, then the bias's entries), one read-only storage array of words whichever of the
    /// two the call has, so that both together take one binding.
    pub fn uses_pairs(&self) -> bool {
        self.reads(super::flags::IN_PAIRS)
    }

    /// The binding slot of the pair data: after the extras where the pipeline has them.
    pub fn pairs_slot(&self) -> u32 {
        self.extras_slot() + self.uses_extras() as u32
    }

    /// The binding slot of the kept gradients' scratch (`keep_grad`): after the pair data.
    pub fn kept_grads_slot(&self) -> u32 {
        self.pairs_slot() + self.uses_pairs() as u32
    }

    /// Storage bindings the pipeline declares: the kernel's, the pair data's and the kept
    /// gradients' scratch.
    pub fn storage_bindings(&self) -> u32 {
        self.kernel.bindings().len() as u32 + self.uses_pairs() as u32 + self.binds_kept() as u32
    }

    /// True when the pipeline binds the kept gradients' scratch at `kept_grads_slot`: it keeps
    /// pairs' gradients there or sums a trainable tensor's gradient into its parts.
    pub fn binds_kept(&self) -> bool {
        self.keeps_grads || self.sums_table
    }

    /// The pipeline's bindings, group 0, in order: the `Params` uniform (0), the kernel's
    /// storage bindings (from 1), then the extras' uniform, the pair data and the kept
    /// gradients where the key uses them. What every backend's pipeline layout declares (the
    /// wgpu pipelines, the compiler-statistics pipelines made on the raw Vulkan device).
    pub fn layout(&self) -> Vec<(u32, BindingKind)> {
        let storage = |read_only| BindingKind::Storage { read_only };
        std::iter::once((0, BindingKind::Uniform))
            .chain(
                self.kernel
                    .bindings()
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (i as u32 + 1, storage(a.access == super::Access::Read))),
            )
            .chain(
                self.uses_extras()
                    .then(|| (self.extras_slot(), BindingKind::Uniform)),
            )
            .chain(
                self.uses_pairs()
                    .then(|| (self.pairs_slot(), storage(true))),
            )
            .chain(
                self.binds_kept()
                    .then(|| (self.kept_grads_slot(), storage(false))),
            )
            .collect()
    }

    /// True when binding `b` is read in whole 16-byte words (`wide`: the decode kernel's k
    /// and v).
    fn reads_wide(&self, b: &Binding) -> bool {
        self.wide > 0 && self.kv.is_none() && self.kernel.is_decode() && matches!(b.name, "k" | "v")
    }

    /// True when binding `b` is K or V in an 8-bit cache format (`kv`).
    fn reads_cache(&self, b: &Binding) -> bool {
        self.kv.is_some() && b.ty == BindType::Elem && matches!(b.name, "k" | "v")
    }

    /// Elements per value and output row: `head_dim_v`, or `head_dim` where it is 0.
    pub fn dv(&self) -> u32 {
        if self.head_dim_v == 0 {
            self.head_dim
        } else {
            self.head_dim_v
        }
    }

    /// The vec4s of f32 a column of the decode kernel's K/V reads holds (its `CW`): `wide`
    /// words of 8 halves (two vec4s each) or 4 floats; one without wide reads.
    pub fn wide_vec4s(&self) -> u32 {
        if self.kv.is_some() {
            return cache_column_vec4s(self.wide);
        }
        column_vec4s(self.wide, self.elem == ElemFormat::F32)
    }

    /// True when the kernel uses the `f16` type (native f16 storage, or f16 arithmetic): it
    /// needs `enable f16;` and an adapter with SHADER_F16.
    pub fn uses_f16(&self) -> bool {
        (self.elem == ElemFormat::F16Native && self.kernel.has_elem_bindings())
            || self.kernel == Kernel::RooflineFmaF16
            || self.kernel.is_coop()
    }

    /// Full WGSL source for one shader compiler. They disagree on directives: Tint (Dawn,
    /// browsers) requires `enable subgroups;` before subgroup builtins, as the WGSL
    /// specification does, while naga 30 rejects that directive and enables subgroups
    /// through the device's features.
    pub fn wgsl_for(&self, consumer: WgslConsumer) -> String {
        let mut s = String::with_capacity(24 * 1024);
        if self.uses_f16() {
            s.push_str("enable f16;\n");
        }
        if consumer == WgslConsumer::Tint && self.uses_subgroups() {
            s.push_str("enable subgroups;\n");
        }
        if self.kernel.is_coop() {
            s.push_str("enable wgpu_cooperative_matrix;\n");
        }
        let _ = writeln!(s, "// generated: {}", self.label());
        s.push_str(super::params::PARAMS_WGSL);
        s.push_str(&self.shape_constants());
        s.push_str(&super::flags::wgsl(self.runtime, self.flags));
        for (i, b) in self.kernel.bindings().iter().enumerate() {
            let slot = i as u32 + 1;
            if self.accumulate && b.ty == BindType::Elem && b.access == Access::ReadWrite {
                s.push_str(&accumulator_wgsl(slot, b.name, self.kernel.sums_outputs()));
            } else if self.reads_wide(b) {
                s.push_str(&wide_wgsl(slot, b.name, self.elem, self.wide));
            } else if self.reads_cache(b) {
                let columns = self.kernel.is_decode().then(|| self.wide_vec4s());
                s.push_str(&cache_wgsl(slot, b.name, columns));
            } else {
                s.push_str(&binding_wgsl(slot, b, self.elem));
            }
        }
        if let Some(f) = self.kv {
            let _ = writeln!(
                s,
                "const KV_Q8: bool = {};\nconst KV_RW: u32 = {}u;\nconst KV_RW_V: u32 = {}u;",
                f == CacheFormat::Q8_0,
                f.record_words(self.head_dim as usize),
                f.record_words(self.dv() as usize)
            );
            s.push_str(KV_FORMAT);
        }
        s.push_str(&self.extras_wgsl());
        s.push_str(&self.pairs_wgsl());
        if self.kernel.is_rows_variant() {
            s.push_str(&super::rows::lane_prelude(
                self.subgroup,
                self.head_dim,
                PIN_WORDS,
            ));
        }
        match self.kernel {
            Kernel::Flash(Variant::Rows, Pass::Forward) => s.push_str(&super::rows::forward_rows(
                self.subgroup,
                self.head_dim,
                self.tiles.rpt,
            )),
            Kernel::Flash(Variant::Rows, Pass::DkDv) => s.push_str(&super::rows::dkdv_rows(
                self.subgroup,
                self.head_dim,
                self.tiles.rpt,
            )),
            Kernel::Flash(Variant::Rows, Pass::Dq) => s.push_str(&super::rows::dq_rows(
                self.subgroup,
                self.head_dim,
                self.tiles.rpt,
            )),
            _ => {}
        }
        if self.kernel.is_blocks_variant() || self.kernel.is_decode() {
            for b in self
                .kernel
                .bindings()
                .iter()
                .filter(|b| b.ty == BindType::Elem && !self.reads_wide(b))
            {
                s.push_str(&load4_wgsl(b.name, dim_of(b.name)));
            }
        }
        if self.kernel.is_decode() {
            let _ = writeln!(s, "const CW: u32 = {}u;", self.wide_vec4s());
            for n in ["k", "v"] {
                if self.kv.is_none() {
                    let _ = writeln!(
                        s,
                        "fn colscale_{n}(base: u32, c: u32) -> f32 {{ return 1.0; }}"
                    );
                }
                if self.wide == 0 && self.kv.is_none() {
                    let _ = writeln!(
                        s,
                        "fn loadc_{n}(base: u32, c: u32) -> array<vec4<f32>, CW> {{ \
                         return array<vec4<f32>, CW>(load4_{n}(base, c)); }}"
                    );
                }
            }
        }
        s.push_str(COMMON);
        s.push('\n');
        for (_, snippet) in super::hooks::wgsl_snippets() {
            s.push_str(snippet);
            s.push('\n');
        }
        s.push_str(&super::hooks::wgsl_score_chain());
        if self.kernel.is_blocks_variant() {
            s.push_str(BLOCKS);
            s.push('\n');
            if self.kernel != Kernel::Flash(Variant::Blocks, Pass::Forward) {
                s.push_str(BLOCKS_BWD);
                s.push('\n');
            }
        }
        if self.kernel.is_coop() && self.kernel.is_tiled() {
            // DPR and CPR as coop.wgsl and the kernels state them
            let (t, cf) = (self.tiles, self.tiles.rpt.max(1));
            let dp = self.head_dim.div_ceil(cf) * cf;
            let counts = [("DPR", dp / t.tpr), ("CPR", t.bc / t.tpr)];
            s.push_str(&write_out_loops(COOP, &counts));
            s.push('\n');
            s.push_str(&write_out_loops(self.kernel.source(), &counts));
        } else {
            s.push_str(self.kernel.source());
        }
        if self.kernel.is_elementwise() {
            s.push_str(&elementwise_entry());
        }
        // last, so that the user's line n is the source's line (lines before) + n
        s.push_str("\n// user code (AttentionConfig::score_mod, mask_mod), or stand-ins\n");
        s.push_str(self.user_code.unwrap_or_else(super::hooks::user_stubs));
        s
    }

    /// `extra_u32(i)` and `extra(i)` (its bits as f32): word i of the call's extras
    /// (`Plan::extras`), from a uniform array of EXTRAS_WORDS words; constant 0 for pipelines
    /// without extras. Words, not floats, so that integers (key lengths) pass unchanged.
    fn extras_wgsl(&self) -> String {
        if !self.uses_extras() {
            return "fn extra_u32(i: u32) -> u32 { return 0u; }\n\
                    fn extra(i: u32) -> f32 { return 0.0; }\n"
                .into();
        }
        format!(
            "@group(0) @binding({}) var<uniform> extras: array<vec4<u32>, {}>;\n\
             fn extra_u32(i: u32) -> u32 {{ return extras[i >> 2u][i & 3u]; }}\n\
             fn extra(i: u32) -> f32 {{ return bitcast<f32>(extra_u32(i)); }}\n",
            self.extras_slot(),
            EXTRAS_WORDS / 4
        )
    }

    /// `mask_bit(k)`: bit k of the call's boolean mask, and `bias_entry(k)`: entry k of its
    /// bias (as f32, from the key's dtype, two entries a word for halves), from the pair data
    /// (`Plan::pairs`), a read-only storage array of words; constant true and 0 for pipelines
    /// without them; `page_entry(k)`: entry k of a paged call's block table (0 without).
    /// `keep_grad(i, j, g, pre)`: with `keeps_grads`, stores pair (i, j)'s gradient g of the
    /// current head (`begin_head`) into the kept gradients' scratch, laid out
    /// `[batch, heads_q, seq_q, seq_kv]` by the whole call's indices, and with `keeps_scores`
    /// beside it the score `pre` that `score_mod` took (exp2 domain, stored in natural-log
    /// units); nothing without.
    fn pairs_wgsl(&self) -> String {
        let mut s = String::new();
        if self.uses_pairs() {
            let _ = writeln!(
                s,
                "@group(0) @binding({}) var<storage, read> pair_data: array<u32>;",
                self.pairs_slot()
            );
        }
        let (mask, bias, paged) = (
            self.reads(super::flags::MASK),
            self.reads(super::flags::BIAS),
            self.reads(super::flags::PAGED),
        );
        s.push_str(if mask {
            "fn mask_bit(k: u32) -> bool { return ((pair_data[k >> 5u] >> (k & 31u)) & 1u) == 1u; }\n"
        } else {
            "fn mask_bit(k: u32) -> bool { return true; }\n"
        });
        s.push_str(match (bias, self.elem.dtype()) {
            (false, _) => "fn bias_entry(k: u32) -> f32 { return 0.0; }\n",
            (true, DType::F32) => {
                "fn bias_entry(k: u32) -> f32 { return bitcast<f32>(pair_data[params.bias_base + k]); }\n"
            }
            (true, DType::F16) => {
                "fn bias_entry(k: u32) -> f32 { return unpack2x16float(pair_data[params.bias_base + (k >> 1u)])[k & 1u]; }\n"
            }
            (true, DType::BF16) => {
                "fn bias_entry(k: u32) -> f32 { return bf16_word_to_f32(pair_data[params.bias_base + (k >> 1u)], k & 1u); }\n"
            }
        });
        s.push_str(if paged {
            "fn page_entry(k: u32) -> u32 { return pair_data[params.pages_base + k]; }\n"
        } else {
            "fn page_entry(k: u32) -> u32 { return 0u; }\n"
        });
        // the bias's gradient reads the kept gradients too (flash_bwd_bias.wgsl)
        let words = if self.keeps_scores { 2 } else { 1 };
        let _ = writeln!(s, "const KEPT_WORDS: u32 = {words}u;");
        if self.binds_kept() {
            let _ = writeln!(
                s,
                "@group(0) @binding({}) var<storage, read_write> kept_grads: array<f32>;",
                self.kept_grads_slot()
            );
        }
        let keep = if self.keeps_grads {
            format!(
                "if (i < params.seq_q && j < params.seq_kv) {{ \
                 let at = (head_grads + (params.q_base + i) * params.mask_cols + params.kv_base + j) * KEPT_WORDS; \
                 kept_grads[at] = g;{} }}",
                if self.keeps_scores {
                    " kept_grads[at + 1u] = pre * LN2;"
                } else {
                    ""
                }
            )
        } else {
            String::new()
        };
        let sum = if self.sums_table {
            // a hidden pair's gradient is exactly 0: skipped before score_mod_dt sees its
            // score, which may be NaN or -inf there
            "if (g != 0.0 && i < params.seq_q && j < params.seq_kv) { \
             let d = score_mod_dt(pre * LN2, head_b, head_h, params.q_base + i, params.kv_base + j); \
             if (score_mod__read != 0xffffffffu) { table_acc[min(score_mod__read, table_len() - 1u)] += g * d; } }"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "fn keep_grad(i: u32, j: u32, g: f32, pre: f32) {{ {keep} {sum} }}"
        );
        s.push_str(&self.table_wgsl());
        s
    }

    /// With `sums_table`: the per-invocation sums of the trainable tensor's gradient
    /// (`table_acc`, which `keep_grad` adds each visible pair's g * d score_mod / d entry to)
    /// and `table_flush(wg, t)`, which the dQ kernels call last: the workgroup's invocations'
    /// sums folded in a fixed tree through the kernel's own workgroup memory (`fold_store`,
    /// `fold_load`, `FOLD_WORDS`: free once the key loop is done), FOLD_WORDS / NT entries a
    /// round, into part `params.splits + wg` of the parts at word `params.slice_base` of
    /// `kept_grads` (the table's length: `params.total_items`). An empty `table_flush`
    /// without.
    fn table_wgsl(&self) -> String {
        if !self.sums_table {
            return "fn table_flush(wg: u32, t: u32) {}\n".into();
        }
        format!(
            "const TABLE_SLOTS: u32 = {TABLE_SUM_ENTRIES}u;
var<private> table_acc: array<f32, TABLE_SLOTS>;
fn table_len() -> u32 {{ return params.total_items; }}
// every invocation folds one entry a round at least
const_assert FOLD_WORDS >= NT;
fn table_flush(wg: u32, t: u32) {{
    let per = FOLD_WORDS / NT;
    var top = 1u;
    while (top * 2u < NT) {{
        top *= 2u;
    }}
    for (var e0 = 0u; e0 < table_len(); e0 += per) {{
        workgroupBarrier(); // the fold's words are free (the key loop's, or the last round's)
        for (var c = 0u; c < per; c++) {{
            fold_store(c * NT + t, table_acc[min(e0 + c, TABLE_SLOTS - 1u)]);
        }}
        workgroupBarrier();
        for (var half = top; half > 0u; half >>= 1u) {{
            if (t < half && t + half < NT) {{
                for (var c = 0u; c < per; c++) {{
                    fold_store(c * NT + t, fold_load(c * NT + t) + fold_load(c * NT + t + half));
                }}
            }}
            workgroupBarrier();
        }}
        // (a small workgroup folds more entries a round than it has invocations)
        for (var c = t; c < per; c += NT) {{
            if (wg < params.total_wg && e0 + c < table_len()) {{
                kept_grads[params.slice_base + (params.splits + wg) * table_len() + e0 + c] = fold_load(c * NT);
            }}
        }}
    }}
}}
"
        )
    }

    fn shape_constants(&self) -> String {
        let (t, d) = (self.tiles, self.head_dim);
        let mut s = String::new();
        let _ = writeln!(s, "const HEAD_DIM: u32 = {d}u;");
        let _ = writeln!(s, "const HEAD_DIM_V: u32 = {}u;", self.dv());
        match self.kernel {
            Kernel::RooflineFma => s.push_str("alias FT = f32;\n"),
            Kernel::RooflineFmaF16 => s.push_str("alias FT = f16;\n"),
            _ => {}
        }
        if self.kernel.is_coop() {
            // the fragment size the adapter offers (Tiles::rpt of a coop kernel): the kernels'
            // text is written once over CF and these three types
            let cf = t.rpt;
            let _ = writeln!(s, "const CF: u32 = {cf}u;");
            for (name, ty, role) in [
                ("CoopA", "f16", "A"),
                ("CoopB", "f16", "B"),
                ("CoopC", "f32", "C"),
            ] {
                let _ = writeln!(s, "alias {name} = coop_mat{cf}x{cf}<{ty}, {role}>;");
            }
        }
        if self.kernel.is_tiled() {
            let cols = if self.kernel.rows_are_keys() {
                t.br
            } else {
                t.bc
            };
            let _ = writeln!(s, "const BR: u32 = {}u;", t.br);
            let _ = writeln!(s, "const BC: u32 = {}u;", t.bc);
            let _ = writeln!(s, "const TPR: u32 = {}u;", t.tpr);
            let _ = writeln!(s, "const NT: u32 = {}u;", t.threads(self.kernel));
            let _ = writeln!(s, "const RPT: u32 = {}u;", t.rpt.max(1));
            // score columns per lane (blocks: streamed rows per thread)
            let _ = writeln!(s, "const CPT: u32 = {}u;", cols.div_ceil(t.tpr));
        }
        if self.kernel.is_decode() {
            // BR packed rows in RG groups, BC keys a tile, one invocation of each group per
            // key of it; QCHUNK vec4s of each row's q held at once (plan: tiles.rs,
            // decode_tiles_for); SG lanes hand each other values (lanes1, lanes4: every
            // lane's x, subgroupBroadcast needs a literal lane), or 1 without subgroups
            let _ = writeln!(s, "const BR: u32 = {}u;", t.br);
            let _ = writeln!(s, "const BC: u32 = {}u;", t.bc);
            let _ = writeln!(s, "const RG: u32 = {}u;", t.tpr.max(1));
            let _ = writeln!(s, "const NT: u32 = {}u;", t.threads(self.kernel));
            let _ = writeln!(s, "const QCHUNK: u32 = {}u;", t.rpt.max(1));
            let sg = self.subgroup.max(1);
            let _ = writeln!(s, "const SG: u32 = {sg}u;");
            let lanes = |x: &str| -> String {
                if sg > 1 {
                    (0..sg)
                        .map(|l| format!("subgroupBroadcast({x}, {l}u)"))
                        .collect::<Vec<_>>()
                        .join(", ")
                } else {
                    x.to_string()
                }
            };
            let _ = writeln!(
                s,
                "fn lanes1(x: f32) -> array<f32, SG> {{ return array<f32, SG>({}); }}
                 fn lanes4(x: vec4<f32>) -> array<vec4<f32>, SG> {{ return array<vec4<f32>, SG>({}); }}",
                lanes("x"),
                lanes("x")
            );
            s.push_str(&decode_results_wgsl(self.kernel));
        }
        s
    }
}

/// The coop kernels' per-invocation loops over their private arrays (`for (var k = 0u; k < DPR;
/// k++) { .. }`, and over CPR), written out: one block a trip, `k` a constant in each. NAK
/// (NVIDIA) leaves these 32-trip loops rolled, and a private array indexed in a rolled loop goes
/// to local memory (128-256 B an invocation; docs/log/compilers.md); ACO unrolled them anyway.
/// With every index a constant the arrays are registers on every compiler. The kernel text
/// keeps the loop, as the math reads.
fn write_out_loops(src: &str, counts: &[(&str, u32)]) -> String {
    let mut s = src.to_string();
    for &(bound, n) in counts {
        let head = format!("for (var k = 0u; k < {bound}; k++) {{");
        while let Some(at) = s.find(&head) {
            let open = at + head.len();
            let mut depth = 1;
            let close = open
                + s[open..]
                    .find(|ch| {
                        match ch {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .expect("a written-out loop closes");
            let body = &s[open..close];
            let copies: String = (0..n)
                .map(|k| format!("{{ const k = {k}u;{body}}}"))
                .collect::<Vec<_>>()
                .join(" ");
            s.replace_range(at..close + 1, &copies);
        }
    }
    s
}

/// The declaration of binding `slot` and, for element-typed bindings, its load or store
/// function.
///
/// Packed formats hold elements `2w` and `2w + 1` in the low and high halves of word `w`.
/// Native f16 stores round in integer arithmetic first, so that the final conversion is exact
/// and every adapter rounds to nearest even alike.
/// A packed store ORs its half into the word: every output tensor starts zeroed and every
/// element is stored exactly once, so two invocations that write the two halves of one word
/// (neighbouring rows at an odd head_dim) never clobber each other.
fn binding_wgsl(slot: u32, b: &Binding, elem: ElemFormat) -> String {
    let access = match b.access {
        Access::Read => "read",
        Access::ReadWrite => "read_write",
    };
    let n = b.name;
    let decl =
        |ty: &str| format!("@group(0) @binding({slot}) var<storage, {access}> {n}: array<{ty}>;\n");
    match b.ty {
        BindType::F32 => decl("f32"),
        BindType::U32 => decl("u32"),
        BindType::Vec2F32 => decl("vec2<f32>"),
        BindType::Vec4F32 => decl("vec4<f32>"),
        BindType::Elem => match (elem, b.access) {
            (ElemFormat::F32, Access::Read) => decl("f32")
                + &format!("fn load_{n}(i: u32) -> f32 {{ return {n}[i]; }}\n"),
            (ElemFormat::F32, Access::ReadWrite) => decl("f32")
                + &format!("fn store_{n}(i: u32, x: f32) {{ {n}[i] = x; }}\n")
                + &format!("fn load_{n}(i: u32) -> f32 {{ return {n}[i]; }}\n"),
            (ElemFormat::F16Native, Access::Read) => decl("f16")
                + &format!("fn load_{n}(i: u32) -> f32 {{ return f32({n}[i]); }}\n"),
            (ElemFormat::F16Native, Access::ReadWrite) => decl("f16")
                + &format!(
                    "fn store_{n}(i: u32, x: f32) {{ {n}[i] = f16(unpack2x16float(f32_to_f16_bits(x)).x); }}\n"
                )
                + &format!("fn load_{n}(i: u32) -> f32 {{ return f32({n}[i]); }}\n"),
            (ElemFormat::F16Packed, Access::Read) => decl("u32")
                + &format!("fn load_{n}(i: u32) -> f32 {{ return unpack2x16float({n}[i >> 1u])[i & 1u]; }}\n"),
            (ElemFormat::Bf16Packed, Access::Read) => decl("u32")
                + &format!("fn load_{n}(i: u32) -> f32 {{ return bf16_word_to_f32({n}[i >> 1u], i & 1u); }}\n"),
            (ElemFormat::F16Packed, Access::ReadWrite) => decl("atomic<u32>")
                + &format!(
                    "fn store_{n}(i: u32, x: f32) {{ atomicOr(&{n}[i >> 1u], f32_to_f16_bits(x) << (16u * (i & 1u))); }}\n"
                )
                + &format!("fn load_{n}(i: u32) -> f32 {{ return unpack2x16float(atomicLoad(&{n}[i >> 1u]))[i & 1u]; }}\n"),
            (ElemFormat::Bf16Packed, Access::ReadWrite) => decl("atomic<u32>")
                + &format!(
                    "fn store_{n}(i: u32, x: f32) {{ atomicOr(&{n}[i >> 1u], f32_to_bf16_bits(x) << (16u * (i & 1u))); }}\n"
                )
                + &format!("fn load_{n}(i: u32) -> f32 {{ return bf16_word_to_f32(atomicLoad(&{n}[i >> 1u]), i & 1u); }}\n"),
        },
    }
}

/// An element output in accumulate mode: an f32 array whatever the dtype, read back by
/// `load_<name>`. A summing kernel's store adds to what an earlier pass stored when
/// `params.resume` is set; otherwise the store overwrites.
fn accumulator_wgsl(slot: u32, n: &str, sums: bool) -> String {
    let store = if sums {
        format!("{n}[i] = select(x, {n}[i] + x, params.resume != 0u);")
    } else {
        format!("{n}[i] = x;")
    };
    format!(
        "@group(0) @binding({slot}) var<storage, read_write> {n}: array<f32>;\n\
         fn store_{n}(i: u32, x: f32) {{ {store} }}\n\
         fn load_{n}(i: u32) -> f32 {{ return {n}[i]; }}\n"
    )
}

/// The vec4s of f32 in a column of `wide` 16-byte words (`KernelKey::wide_vec4s`): two a word
/// of halves, one a word of floats; one for element reads (`wide` 0).
pub fn column_vec4s(wide: u32, f32_elems: bool) -> u32 {
    match (wide, f32_elems) {
        (0, _) => 1,
        (w, true) => w,
        (w, false) => 2 * w,
    }
}

/// The decode kernel's k or v read in 16-byte words (`KernelKey::wide`, `words` a column):
/// `loadc_<name>(base, c)` gives column c (CW vec4s of f32: 8 halves of each `vec4<u32>`, or 4
/// floats of each `vec4<f32>`) of the row starting at element `base`, a multiple of the
/// word's elements; `load_<name>(i)` one element. Half formats read the same bytes as the
/// call's storage format would.
fn wide_wgsl(slot: u32, n: &str, elem: ElemFormat, words: u32) -> String {
    let decl =
        |ty: &str| format!("@group(0) @binding({slot}) var<storage, read> {n}: array<{ty}>;\n");
    let word = |k: u32| format!("{n}[(base >> SHIFT) + {words}u * c + {k}u]");
    if elem == ElemFormat::F32 {
        let parts: Vec<String> = (0..words).map(word).collect();
        return decl("vec4<f32>")
            + &format!(
                "fn load_{n}(i: u32) -> f32 {{ return {n}[i >> 2u][i & 3u]; }}\n\
                 fn loadc_{n}(base: u32, c: u32) -> array<vec4<f32>, CW> {{\n\
                 \x20   return array<vec4<f32>, CW>({});\n}}\n",
                parts.join(", ")
            )
            .replace("SHIFT", "2u");
    }
    // the two elements of a word's component x
    let two = |x: &str| {
        if elem == ElemFormat::Bf16Packed {
            format!("vec2<f32>(bf16_word_to_f32({x}, 0u), bf16_word_to_f32({x}, 1u))")
        } else {
            format!("unpack2x16float({x})")
        }
    };
    let one = if elem == ElemFormat::Bf16Packed {
        format!("bf16_word_to_f32({n}[i >> 3u][(i >> 1u) & 3u], i & 1u)")
    } else {
        format!("unpack2x16float({n}[i >> 3u][(i >> 1u) & 3u])[i & 1u]")
    };
    let mut body = String::new();
    let mut vec4s = Vec::new();
    for k in 0..words {
        body.push_str(&format!(
            "    let w{k} = {};\n",
            word(k).replace("SHIFT", "3u")
        ));
        vec4s.push(format!(
            "vec4<f32>({}, {})",
            two(&format!("w{k}.x")),
            two(&format!("w{k}.y"))
        ));
        vec4s.push(format!(
            "vec4<f32>({}, {})",
            two(&format!("w{k}.z")),
            two(&format!("w{k}.w"))
        ));
    }
    decl("vec4<u32>")
        + &format!(
            "fn load_{n}(i: u32) -> f32 {{ return {one}; }}\n\
             fn loadc_{n}(base: u32, c: u32) -> array<vec4<f32>, CW> {{\n{body}\
             \x20   return array<vec4<f32>, CW>({});\n}}\n",
            vec4s.join(", ")
        )
}

/// The vec4s of f32 a column of the decode kernel's reads of an 8-bit cache holds, by
/// `KernelKey::wide`: 16 bytes (4 vec4s: one 16-byte word; `wide` 0 or 2, the default), or 8
/// (2 vec4s: half a word, `wide` 1, on the GPUs whose registers hold only half as many sums
/// a row: `GpuClass::decode_max_words`).
pub fn cache_column_vec4s(wide: u32) -> u32 {
    if wide == 1 {
        2
    } else {
        4
    }
}

/// K or V in an 8-bit cache (`KernelKey::kv`; shaders/kv_format.wgsl) as 16-byte words:
/// `load_<name>(i)` element i of the f32 cache's layout (records of HEAD_DIM elements, the
/// values' of HEAD_DIM_V), its
/// byte times its scale (q8_0: its block's f16 in the record after the data; E4M3: its kv
/// head's f32 in the header); for decode kernels (`columns`: the vec4s a column holds,
/// [`cache_column_vec4s`]) `loadc_<name>(base, c)` column c (4 or 2 words of 4 bytes) of the
/// record starting at element `base`, unscaled, and `colscale_<name>(base, c)` the column's
/// scale, which the kernel applies once per column (a column lies in one q8_0 block of 32).
fn cache_wgsl(slot: u32, n: &str, columns: Option<u32>) -> String {
    // its records: the values' are HEAD_DIM_V elements (KV_RW_V words), the keys' HEAD_DIM;
    // an MLA latent cache's values are read from the keys' records (v is k's buffer)
    let (dim, rw) = match dim_of(n) {
        "HEAD_DIM_V" => (
            "select(HEAD_DIM_V, HEAD_DIM, LATENT())",
            "select(KV_RW_V, KV_RW, LATENT())",
        ),
        _ => ("HEAD_DIM", "KV_RW"),
    };
    let loads = format!(
        "@group(0) @binding({slot}) var<storage, read> {n}: array<vec4<u32>>;
fn kv_word_{n}(i: u32) -> u32 {{ return {n}[i >> 2u][i & 3u]; }}
fn kv_scale_{n}(rec: u32, at: u32, d: u32) -> f32 {{
    if (KV_Q8) {{
        return unpack2x16float(kv_word_{n}(at + {dim} / 4u + d / 64u))[(d / 32u) & 1u];
    }}
    return bitcast<f32>(kv_word_{n}(rec % params.heads_kv));
}}
fn load_{n}(i: u32) -> f32 {{
    let rec = i / {dim};
    let d = i % {dim};
    let at = kv_header() + rec * {rw};
    return kv_bytes(kv_word_{n}(at + d / 4u))[d & 3u] * kv_scale_{n}(rec, at, d);
}}
"
    );
    let Some(cw) = columns else {
        return loads;
    };
    // a record starts on a whole 16-byte word (KV_RW is a multiple of 4 words)
    let read = if cw == 4 {
        format!(
            "    let w = {n}[(at >> 2u) + c];
                 return array<vec4<f32>, CW>(kv_bytes(w.x), kv_bytes(w.y), kv_bytes(w.z), kv_bytes(w.w));
"
        )
    } else {
        format!(
            "    let w = {n}[(at >> 2u) + c / 2u];
                 let h = select(w.xy, w.zw, (c & 1u) == 1u);
                 return array<vec4<f32>, CW>(kv_bytes(h.x), kv_bytes(h.y));
"
        )
    };
    loads
        + &format!(
            "fn loadc_{n}(base: u32, c: u32) -> array<vec4<f32>, CW> {{
    let rec = base / {dim};
    let at = kv_header() + rec * {rw};
{read}}}
fn colscale_{n}(base: u32, c: u32) -> f32 {{
    let rec = base / {dim};
    return kv_scale_{n}(rec, kv_header() + rec * {rw}, {}u * c);
}}
",
            4 * cw
        )
}

/// The shape constant of a binding's rows: HEAD_DIM_V for the values' and the output's (v, out,
/// d_out), HEAD_DIM for the others'.
fn dim_of(name: &str) -> &'static str {
    match name {
        "v" | "out" | "d_out" => "HEAD_DIM_V",
        _ => "HEAD_DIM",
    }
}

/// `load4_<name>(base, g)`: head dims 4g .. 4g + 3 of the row (`dim` elements: its shape
/// constant) starting at element `base`, with the dims past it as 0 (blocks kernels keep rows
/// as vec4s).
fn load4_wgsl(n: &str, dim: &str) -> String {
    format!(
        "fn load4_{n}(base: u32, g: u32) -> vec4<f32> {{\n\
         \x20   var x = vec4<f32>();\n\
         \x20   for (var l = 0u; l < 4u; l++) {{\n\
         \x20       if ({dim} % 4u == 0u || 4u * g + l < {dim}) {{\n\
         \x20           x[l] = load_{n}(base + 4u * g + l);\n\
         \x20       }}\n\
         \x20   }}\n\
         \x20   return x;\n\
         }}\n"
    )
}

/// Where the decode kernel puts a row's result (row `r` = `row_index(b, h, i)`, element `e` =
/// `o_index(b, i, h, d)` of the whole call; the row's head begun): `decode_scale(m, l)` is
/// the factor its accumulator is multiplied by, `decode_lse` and `decode_out` store. For a
/// split (`FlashDecode`): normalized over the split's own keys and their lse without the sink,
/// in f32 at split `split` of the partial results (which hold the dispatch's batches only),
/// for `FlashDecodeCombine` to merge; in one split (`FlashDecodeOne`): finished as the forward
/// kernels finish a row (the sink in the sum), into out and lse.
fn decode_results_wgsl(kernel: Kernel) -> String {
    if kernel == Kernel::FlashDecodeOne {
        return "fn decode_scale(m: f32, l: f32) -> f32 { return row_normalizer(m, l); }\n\
                fn decode_lse(split: u32, r: u32, m: f32, l: f32) { lse[r] = finish_lse(m, l); }\n\
                fn decode_out(split: u32, e: u32, x: f32) { store_out(e, x); }\n"
            .into();
    }
    "fn decode_scale(m: f32, l: f32) -> f32 { return select(0.0, 1.0 / l, l > 0.0 || is_nan(l)); }\n\
     fn decode_lse(split: u32, r: u32, m: f32, l: f32) { \
     part_lse[split * params.batch * params.heads_q * params.seq_q + r - params.row_shift] = keys_lse(m, l); }\n\
     fn decode_out(split: u32, e: u32, x: f32) { \
     part_out[split * params.batch * params.seq_q * params.heads_q * HEAD_DIM_V + e - params.q_shift] = x; }\n"
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trainable tensor's sums are folded in a dQ kernel's workgroup memory once its key
    /// loop is done, which the kernel asserts (`const_assert FOLD_WORDS >= NT`): every dQ tile
    /// the chooser gives, on each kind of device, at head dims across 1..=256, leaves the
    /// room. (AMD's compiler sweep found a wave64 tile at head dim 3 that did not.)
    #[test]
    fn every_dq_tile_leaves_room_to_fold_a_trainable_tensors_sums() {
        use crate::kernels::{
            choose_tiles, DeviceCaps, GpuClass, Kernel, Pass, Variant, CPU_PRIVATE_FLOATS,
        };
        let gpu = DeviceCaps {
            max_workgroup_storage_bytes: 65536,
            max_invocations_per_workgroup: 1024,
            ..DeviceCaps::WEBGPU_DEFAULT
        };
        let devices = [
            DeviceCaps::WEBGPU_DEFAULT,
            gpu,
            DeviceCaps {
                gpu: GpuClass::Wave64Cu,
                ..gpu
            },
            DeviceCaps {
                max_workgroup_storage_bytes: 32768,
                gpu: GpuClass::Apple,
                ..gpu
            },
            DeviceCaps {
                max_workgroup_storage_bytes: 32768,
                gpu: GpuClass::Adreno,
                ..gpu
            },
            DeviceCaps {
                max_workgroup_storage_bytes: 32768,
                private_floats: CPU_PRIVATE_FLOATS,
                ..gpu
            },
        ];
        let dims = [
            1, 2, 3, 4, 5, 7, 8, 12, 16, 20, 24, 31, 32, 33, 40, 48, 64, 65, 80, 96, 128, 160, 192,
            256,
        ];
        let mut seen = std::collections::BTreeSet::new();
        for caps in devices {
            for variant in [Variant::Rows, Variant::Blocks] {
                let kernel = Kernel::Flash(variant, Pass::Dq);
                for d in dims {
                    let key = KernelKey {
                        head_dim: d,
                        tiles: choose_tiles(kernel, d, caps).unwrap(),
                        sums_table: true,
                        ..KernelKey::plain(kernel)
                    };
                    if !seen.insert(key.label()) {
                        continue;
                    }
                    let text = key.wgsl_for(WgslConsumer::Naga);
                    if let Err(e) = naga::front::wgsl::parse_str(&text) {
                        panic!("{} ({caps:?}): {}", key.label(), e.emit_to_string(&text));
                    }
                }
            }
        }
    }

    /// The decode kernel's lane logic (the one subgroup path a GPU plans: NVIDIA's 32-wide
    /// decode) is one text for every width: a key at subgroup 32 or 64 differs from the same
    /// key at 16 (the widest lavapipe runs correctly, `LP_NATIVE_VECTOR_WIDTH=512`, CI's
    /// 16-wide tier) only in the line that states the width (`SG`) and in its broadcast lists,
    /// one entry a lane. So what runs at 16 (and at 8, the suite's default) is what a 32- or
    /// 64-wide GPU runs. (The rows family, which only CPU drivers plan, writes its products
    /// out lane by lane: its text grows with the width.)
    #[test]
    fn wider_subgroups_change_only_the_width_constants_and_broadcast_lists() {
        use crate::kernels::{choose_tiles, DeviceCaps, Kernel};
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: 65536,
            max_invocations_per_workgroup: 1024,
            ..DeviceCaps::WEBGPU_DEFAULT
        };
        // the lines a width states: constants, and the decode kernel's per-lane broadcasts
        let body = |text: String| -> Vec<String> {
            text.lines()
                .filter(|l| {
                    let t = l.trim_start();
                    !(t.starts_with("// generated:")
                        || t.starts_with("const SG:")
                        || t.starts_with("fn lanes1(")
                        || t.starts_with("fn lanes4("))
                })
                .map(String::from)
                .collect()
        };
        for kernel in [Kernel::FlashDecode] {
            let key = |subgroup| KernelKey {
                head_dim: 128,
                tiles: choose_tiles(kernel, 128, caps).unwrap(),
                subgroup,
                ..KernelKey::plain(kernel)
            };
            let at16 = body(key(16).wgsl());
            for wide in [32, 64] {
                let other = body(key(wide).wgsl());
                let differing: Vec<(&String, &String)> =
                    at16.iter().zip(&other).filter(|(a, b)| a != b).collect();
                assert!(
                    at16.len() == other.len() && differing.is_empty(),
                    "{kernel:?} at subgroup {wide}: {} lines differ from 16, first {:?}",
                    differing.len(),
                    differing.first()
                );
            }
        }
    }

    /// NAK keeps a private array indexed in a rolled loop in local memory (compilers.md, issue
    /// 66): the coop kernels' loops over DPR and CPR reach the driver written out.
    #[test]
    fn the_coop_kernels_index_their_private_arrays_with_constants_only() {
        use crate::kernels::{choose_tiles, DeviceCaps, Pass};
        let caps = DeviceCaps {
            max_workgroup_storage_bytes: 32768,
            max_invocations_per_workgroup: 256,
            coop: 16,
            ..DeviceCaps::WEBGPU_DEFAULT
        };
        for pass in [Pass::Forward, Pass::DkDv, Pass::Dq] {
            let kernel = Kernel::Flash(Variant::Coop, pass);
            for head_dim in [64u32, 128] {
                let text = KernelKey {
                    head_dim,
                    elem: crate::dtype::ElemFormat::F16Native,
                    tiles: choose_tiles(kernel, head_dim, caps).unwrap(),
                    ..KernelKey::plain(kernel)
                }
                .wgsl();
                assert!(
                    !text.contains("k < DPR") && !text.contains("k < CPR"),
                    "{kernel:?}"
                );
                assert!(text.contains("const k = 1u;"), "{kernel:?} d={head_dim}");
            }
        }
        let out = write_out_loops(
            "for (var k = 0u; k < DPR; k++) { a[k] = { 1 }; } x",
            &[("DPR", 2)],
        );
        assert_eq!(
            out,
            "{ const k = 0u; a[k] = { 1 }; } { const k = 1u; a[k] = { 1 }; } x"
        );
    }

    /// The coop family is one text over the fragment size (issue 66): a coop kernel at 8x8x8
    /// (Apple GPUs through Metal, lavapipe 26, the coop kernels' CI tier) differs from the
    /// same kernel at 16x16x16 (NVIDIA, AMD) only in the lines that state the size: CF, the
    /// three fragment types, and RPT (the tiles' field that carries it). So what the CI tier
    /// runs at 8 is what a 16-wide GPU runs.
    #[test]
    fn the_coop_kernels_at_8_differ_from_16_only_in_the_fragment_size() {
        use crate::kernels::{choose_tiles, DeviceCaps, Kernel, Pass, Tiles, Variant};
        let size_lines = |text: String| -> (Vec<String>, Vec<String>) {
            text.lines().map(String::from).partition(|l| {
                let t = l.trim_start();
                t.starts_with("// generated:")
                    || t.starts_with("const CF:")
                    || t.starts_with("const RPT:")
                    || t.starts_with("alias Coop")
            })
        };
        let caps = |coop| DeviceCaps {
            max_workgroup_storage_bytes: 32768,
            max_invocations_per_workgroup: 256,
            coop,
            ..DeviceCaps::WEBGPU_DEFAULT
        };
        let kernels = [
            Kernel::Flash(Variant::Coop, Pass::Forward),
            Kernel::Flash(Variant::Coop, Pass::DkDv),
            Kernel::Flash(Variant::Coop, Pass::Dq),
            Kernel::RooflineCoop,
        ];
        for kernel in kernels {
            for head_dim in [64u32, 80] {
                let key = |frag| KernelKey {
                    head_dim,
                    elem: crate::dtype::ElemFormat::F16Native,
                    tiles: if kernel.is_tiled() {
                        // the same tiles at both sizes: only the fragment differs
                        Tiles {
                            rpt: frag,
                            ..choose_tiles(kernel, head_dim, caps(16)).unwrap()
                        }
                    } else {
                        Tiles {
                            rpt: frag,
                            ..Tiles::ONE
                        }
                    },
                    ..KernelKey::plain(kernel)
                };
                let (sizes16, at16) = size_lines(key(16).wgsl());
                let (sizes8, at8) = size_lines(key(8).wgsl());
                assert_eq!(
                    at16, at8,
                    "{kernel:?} d={head_dim}: the text beside the size"
                );
                assert!(sizes8.iter().any(|l| l.contains("coop_mat8x8<f16, A>")));
                assert!(sizes16.iter().any(|l| l.contains("coop_mat16x16<f32, C>")));
                assert!(
                    !at16.iter().any(|l| l.contains("coop_mat")),
                    "{kernel:?}: a fragment type named outside the prelude's aliases"
                );
            }
        }
        // the chooser gives the adapter's size to every coop tile
        for kernel in &kernels[..3] {
            assert_eq!(choose_tiles(*kernel, 64, caps(8)).unwrap().rpt, 8);
            assert_eq!(choose_tiles(*kernel, 64, caps(16)).unwrap().rpt, 16);
        }
    }
}
