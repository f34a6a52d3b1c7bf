//! Tiled calls whose tensors do not fit one storage binding.
//!
//! A device binds at most `max_storage_buffer_binding_size` bytes of a buffer at once (128 MiB
//! under WebGPU's defaults and on lavapipe), while a buffer may be larger. A tiled call whose q,
//! k, v (or outputs, or lse) pass that limit is run as a sequence of smaller problems, each
//! binding a window (an aligned byte range) of every tensor:
//!
//! - **Whole batches** when one batch fits: every window holds `batches` full batches and each
//!   part is an ordinary call on them.
//! - **Rows of one batch** otherwise: windows of `q_rows` queries and `kv_rows` keys. The
//!   kernels run in accumulate mode (`KernelKey::accumulate`): outputs are f32 and a part that
//!   continues a window (`Params::resume`) merges exactly with what earlier parts stored. The
//!   forward resumes each row's online softmax from its stored out and lse (the running max set
//!   to the lse makes the row sum exactly 1); dK/dV sum over query windows and dQ over key
//!   windows. Half-precision outputs gather in an f32 scratch window and are cast once.
//!
//! Each part is the original problem restricted to its rows: the causal offset moves with the
//! windows' first query and key, `Params::row_stride` keeps the lse layout of the whole call,
//! and the shifts place element 0 of each window past its aligned start. Parts that no query of
//! the window can see (causal) are skipped, except the first, which initializes the window.

use super::step::{key, tiled_step, TiledPass};
use super::{BufRef, Plan, PlanEnv, ScratchSpec, Step, Window};
use crate::config::AttentionConfig;
use crate::dtype::{DType, ElemFormat};
use crate::error::{Error, Result};
use crate::kernels::wgsl::ELEMENTWISE_WORKGROUP;
use crate::kernels::{Kernel, KernelKey, Params, Tiles};

use BufRef::{Input, Output, Scratch};

/// How a call is cut: batches per part and, within one batch, query and key rows per part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub batches: usize,
    pub q_rows: usize,
    pub kv_rows: usize,
    /// Rows of one batch are split: the kernels run in accumulate mode.
    pub accumulate: bool,
}

/// Bytes a window may hold beyond its elements: the aligned start before them and the
/// rounding of its end to a word.
fn slack(env: &PlanEnv) -> u64 {
    2 * env.offset_align.max(4) + 8
}

/// The split a tiled call needs, or `None` when every tensor fits one binding.
pub fn choose(cfg: &AttentionConfig, dtype: DType, env: &PlanEnv) -> Result<Option<Split>> {
    // a paged call binds its page pools whole (a pool past one binding is a DeviceLimit when
    // the plan's bindings are checked): pages cannot be cut into windows
    if cfg.paged.is_some() {
        return Ok(None);
    }
    let esz = dtype.size_bytes() as u64;
    // the wider of q/k's and v/out's rows (head_dim_v): every tensor's windows then fit
    let d = cfg.head_dim.max(cfg.dv()) as u64;
    let q_row = cfg.heads_q as u64 * d; // elements per query position
    let kv_row = cfg.heads_kv as u64 * d;
    let (sq, skv, b) = (cfg.seq_q as u64, cfg.seq_kv as u64, cfg.batch as u64);
    let limit = env.max_binding_bytes;
    let q_batch = sq * q_row * esz;
    let kv_batch = skv * kv_row * esz;
    // the backward's (lse, delta) pairs: the largest row tensor, 8 bytes per row
    let rows_batch = cfg.heads_q as u64 * sq * 8;
    let whole = [q_batch, kv_batch, rows_batch]
        .iter()
        .all(|x| x.checked_mul(b).is_some_and(|t| t.max(4) <= limit));
    if whole {
        return Ok(None);
    }
    let room = limit.saturating_sub(slack(env));
    let per_batch = q_batch.max(kv_batch).max(rows_batch);
    if per_batch <= room {
        return Ok(Some(Split {
            batches: ((room / per_batch) as usize).clamp(1, cfg.batch),
            q_rows: cfg.seq_q,
            kv_rows: cfg.seq_kv,
            accumulate: false,
        }));
    }
    if rows_batch > room {
        return Err(Error::DeviceLimit {
            what: format!(
                "lse and delta of one batch ({} query heads x {} queries, 2 x f32)",
                cfg.heads_q, cfg.seq_q
            ),
            needed: rows_batch + slack(env),
            limit,
            hint: "split the query heads over several calls (each with fewer heads_q)".into(),
        });
    }
    // Accumulators are f32 whatever the dtype: rows are sized for 4 bytes per element.
    let rows_in = |row: u64, what: &str| -> Result<usize> {
        let n = room / (row * 4);
        if n == 0 {
            return Err(Error::DeviceLimit {
                what: format!("one {what} position ({row} elements as f32)"),
                needed: row * 4 + slack(env),
                limit,
                hint: "use fewer heads per call".into(),
            });
        }
        Ok(n.min(usize::MAX as u64) as usize)
    };
    Ok(Some(Split {
        batches: 1,
        q_rows: balanced(cfg.seq_q, rows_in(q_row, "query")?),
        kv_rows: balanced(cfg.seq_kv, rows_in(kv_row, "key")?),
        accumulate: true,
    }))
}

/// Rows per window for `total` rows and windows of at most `max`. Windows should fill whole
/// kernel tiles (64 or 128 rows): as few windows as `max` allows, of equal size rounded up to a
/// multiple of 64 where that still fits (1,024 rows in windows of at most 448: 384 + 384 +
/// 256, not 448 + 448 + 128); else the largest multiple of 64 under `max`; only windows under
/// 64 rows are not tile multiples (docs/PERFORMANCE.md measures both).
fn balanced(total: usize, max: usize) -> usize {
    if max >= total {
        return total;
    }
    let rows = total.div_ceil(total.div_ceil(max));
    let tiled = rows.next_multiple_of(64);
    if tiled <= max {
        tiled
    } else if max >= 64 {
        max / 64 * 64
    } else {
        rows
    }
}

/// A window of a `[batch, seq, heads, head_dim]` tensor: `rows` positions from (`b`, `r0`),
/// stored `esz` bytes per element. Returns the window and the shift of its first element.
fn seq_window(
    env: &PlanEnv,
    esz: u64,
    seq: usize,
    row: usize,
    b: usize,
    r0: usize,
    rows: usize,
) -> (Window, u32) {
    let start = ((b * seq + r0) * row) as u64;
    let n = (rows * row) as u64;
    window(env, esz, start, n)
}

/// The aligned window holding elements [start, start + n) of `esz` bytes each.
fn window(env: &PlanEnv, esz: u64, start: u64, n: u64) -> (Window, u32) {
    let align = env.offset_align.max(4);
    let first = start * esz;
    let offset = first / align * align;
    let end = ((start + n) * esz).max(first + 4).next_multiple_of(4);
    (
        Window {
            offset,
            size: end - offset,
        },
        ((first - offset) / esz) as u32,
    )
}

/// The window of a row tensor with `esz`-byte elements (lse: 4; the backward's lse and delta
/// pairs: 8) over `batches` batches from `b`, query rows [q0, q0 + rows).
fn row_window(
    cfg: &AttentionConfig,
    env: &PlanEnv,
    esz: u64,
    (b, batches): (usize, usize),
    q0: usize,
    rows: usize,
) -> (Window, u32) {
    let hq = cfg.heads_q;
    let start = (b * hq * cfg.seq_q + q0) as u64;
    let last = ((b + batches - 1) * hq + hq - 1) * cfg.seq_q + q0 + rows;
    window(env, esz, start, last as u64 - start)
}

/// One part of a split call: its batches and rows, and the windows of its tensors.
#[derive(Debug, Clone, Copy)]
struct Part {
    b: usize,
    batches: usize,
    q0: usize,
    q_rows: usize,
    k0: usize,
    kv_rows: usize,
}

impl Part {
    /// The part as a problem of its own, with the causal offset of its windows.
    fn config(&self, cfg: &AttentionConfig) -> AttentionConfig {
        let mut c = cfg.clone();
        c.batch = self.batches;
        c.seq_q = self.q_rows;
        c.seq_kv = self.kv_rows;
        c
    }

    fn causal_offset(&self, cfg: &AttentionConfig) -> i32 {
        (cfg.causal_offset() + self.q0 as i64 - self.k0 as i64)
            .clamp(i32::MIN as i64, i32::MAX as i64) as i32
    }

    /// The kernels' band (`Params::band_lo`, `band_hi`) in the part's own row and key
    /// numbering.
    fn band(&self, cfg: &AttentionConfig) -> (i32, i32) {
        let mut p = crate::kernels::params::Params::from_config(cfg);
        p.shift_band(self.q0, self.k0);
        (p.band_lo, p.band_hi)
    }

    /// True when some query of the part sees some key of it (causal and window).
    fn visible(&self, cfg: &AttentionConfig) -> bool {
        // varlen aligns each sequence on its own, align_to_seqlens each batch: every part may
        // hold visible pairs
        if cfg.varlen.is_some() || cfg.align_to_seqlens {
            return true;
        }
        let off = cfg.causal_offset();
        let (lo, hi) = cfg.band();
        // key offsets j - i over the part's pairs: [k0 - q_last, k_last - q0]
        let min_d = self.k0 as i64 - (self.q0 + self.q_rows - 1) as i64 - off;
        let max_d = (self.k0 + self.kv_rows - 1) as i64 - self.q0 as i64 - off;
        hi.is_none_or(|hi| min_d <= hi) && lo.is_none_or(|lo| max_d >= lo)
    }

    /// True when every query of the part sees only keys before it: later key windows (in
    /// key order) see nothing either.
    fn past_the_band(&self, cfg: &AttentionConfig) -> bool {
        if cfg.varlen.is_some() || cfg.align_to_seqlens {
            return false;
        }
        let min_d = self.k0 as i64 - (self.q0 + self.q_rows - 1) as i64 - cfg.causal_offset();
        cfg.band().1.is_some_and(|hi| min_d > hi)
    }

    fn q_window(&self, cfg: &AttentionConfig, env: &PlanEnv, esz: u64) -> (Window, u32) {
        let rows = if self.batches > 1 {
            self.batches * cfg.seq_q
        } else {
            self.q_rows
        };
        seq_window(
            env,
            esz,
            cfg.seq_q,
            cfg.heads_q * cfg.head_dim,
            self.b,
            self.q0,
            rows,
        )
    }

    fn kv_window(&self, cfg: &AttentionConfig, env: &PlanEnv, esz: u64) -> (Window, u32) {
        let rows = if self.batches > 1 {
            self.batches * cfg.seq_kv
        } else {
            self.kv_rows
        };
        seq_window(
            env,
            esz,
            cfg.seq_kv,
            cfg.heads_kv * cfg.head_dim,
            self.b,
            self.k0,
            rows,
        )
    }

    fn row_window(&self, cfg: &AttentionConfig, env: &PlanEnv) -> (Window, u32) {
        row_window(cfg, env, 4, (self.b, self.batches), self.q0, self.q_rows)
    }

    fn pair_window(&self, cfg: &AttentionConfig, env: &PlanEnv) -> (Window, u32) {
        row_window(cfg, env, 8, (self.b, self.batches), self.q0, self.q_rows)
    }
}

/// The windows of batches [b, b + nb) of a call split by whole batches: q-layout, kv-layout
/// and lse (f32) tensors, each with the shift of its first element in the window.
pub(crate) fn batch_windows(
    cfg: &AttentionConfig,
    env: &PlanEnv,
    esz: u64,
    (b, nb): (usize, usize),
) -> [(Window, u32); 3] {
    [
        seq_window(
            env,
            esz,
            cfg.seq_q,
            cfg.heads_q * cfg.head_dim,
            b,
            0,
            nb * cfg.seq_q,
        ),
        seq_window(
            env,
            esz,
            cfg.seq_kv,
            cfg.heads_kv * cfg.head_dim,
            b,
            0,
            nb * cfg.seq_kv,
        ),
        row_window(cfg, env, 4, (b, nb), 0, cfg.seq_q),
    ]
}

/// Ranges [start, start + len) of `total` in steps of `step`.
pub(crate) fn ranges(total: usize, step: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..total)
        .step_by(step.max(1))
        .map(move |s| (s, step.min(total - s)))
}

/// Every (batches, query rows) block of the call, in order.
fn q_blocks(cfg: &AttentionConfig, split: &Split) -> Vec<(usize, usize, usize, usize)> {
    let mut v = Vec::new();
    for (b, nb) in ranges(cfg.batch, split.batches) {
        for (q0, qn) in ranges(cfg.seq_q, split.q_rows) {
            v.push((b, nb, q0, qn));
        }
    }
    v
}

/// The parts of query block (`b`, `nb`, `q0`, `qn`) in key order: the first always (it
/// initializes the block's outputs), then each key window some query of the block sees
/// (causal or a window's right edge: the later ones end at the first that none sees; key
/// windows left of a window's band are left out).
fn key_parts(
    cfg: &AttentionConfig,
    split: &Split,
    block: (usize, usize, usize, usize),
) -> Vec<Part> {
    let (b, batches, q0, q_rows) = block;
    let mut parts = Vec::new();
    for (k0, kv_rows) in ranges(cfg.seq_kv, split.kv_rows) {
        let part = Part {
            b,
            batches,
            q0,
            q_rows,
            k0,
            kv_rows,
        };
        if !parts.is_empty() && !part.visible(cfg) {
            if part.past_the_band(cfg) {
                break;
            }
            // left of a window's band: later key windows may be seen
            continue;
        }
        parts.push(part);
    }
    parts
}

/// The parts of key block (`b`, `nb`, `k0`, `kn`) in query order that see it, or the last
/// query window if none does (it initializes the block's outputs).
fn query_parts(
    cfg: &AttentionConfig,
    split: &Split,
    b: usize,
    batches: usize,
    k0: usize,
    kv_rows: usize,
) -> Vec<Part> {
    let all: Vec<Part> = ranges(cfg.seq_q, split.q_rows)
        .map(|(q0, q_rows)| Part {
            b,
            batches,
            q0,
            q_rows,
            k0,
            kv_rows,
        })
        .collect();
    let mut seen: Vec<Part> = all.iter().copied().filter(|p| p.visible(cfg)).collect();
    if seen.is_empty() {
        seen.extend(all.last().copied());
    }
    seen
}

/// The windows of a part's q-layout, kv-layout and row tensors (lse; the backward's lse and
/// delta pairs), with their shifts.
struct Windows {
    q: Window,
    kv: Window,
    rows: Window,
    pairs: Window,
    shifts: Shifts,
}

/// A part's element shifts: `Params::q_shift`, `kv_shift`, `row_shift` and `pair_shift`.
#[derive(Debug, Clone, Copy)]
struct Shifts {
    q: u32,
    kv: u32,
    rows: u32,
    pairs: u32,
}

/// Which window of a part an output lies in: its queries (out, dq) or its keys (dk, dv).
#[derive(Debug, Clone, Copy)]
enum Side {
    Queries,
    Keys,
}

impl Windows {
    /// The window and shift of the q-layout (`Queries`) or kv-layout (`Keys`) tensors.
    fn side(&self, side: Side) -> (Window, u32) {
        match side {
            Side::Queries => (self.q, self.shifts.q),
            Side::Keys => (self.kv, self.shifts.kv),
        }
    }
}

impl Part {
    fn windows(&self, cfg: &AttentionConfig, env: &PlanEnv, esz: u64) -> Windows {
        let (q, qs) = self.q_window(cfg, env, esz);
        let (kv, ks) = self.kv_window(cfg, env, esz);
        let (rows, rs) = self.row_window(cfg, env);
        let (pairs, ps) = self.pair_window(cfg, env);
        Windows {
            q,
            kv,
            rows,
            pairs,
            shifts: Shifts {
                q: qs,
                kv: ks,
                rows: rs,
                pairs: ps,
            },
        }
    }
}

/// Where an output of a part is bound: the output itself (f32, or any dtype when the part is
/// not accumulating), or an f32 scratch window that a cast then takes to the dtype.
struct OutputSlot {
    output: BufRef,
    scratch: Option<BufRef>,
}

/// The builder of a split plan's steps.
struct Builder<'a> {
    cfg: &'a AttentionConfig,
    dtype: DType,
    env: &'a PlanEnv,
    split: Split,
    esz: u64,
}

impl<'a> Builder<'a> {
    fn new(cfg: &'a AttentionConfig, dtype: DType, env: &'a PlanEnv, split: Split) -> Self {
        Builder {
            cfg,
            dtype,
            env,
            split,
            esz: dtype.size_bytes() as u64,
        }
    }

    /// One tiled pass over `part` with `buffers` bound through `windows`.
    fn tiled(
        &self,
        pass: TiledPass,
        part: &Part,
        buffers: Vec<BufRef>,
        windows: Vec<Window>,
        shifts: Shifts,
        resume: bool,
    ) -> Result<Step> {
        let sub = part.config(self.cfg);
        let mut step = tiled_step(pass, (&sub, self.cfg), self.dtype, self.env, buffers);
        step.key.accumulate = self.split.accumulate;
        step.params.causal_offset = part.causal_offset(self.cfg);
        step.params.batch_base = part.b as u32;
        step.params.kv_base = part.k0 as u32;
        step.params.q_base = part.q0 as u32;
        step.params = step.params.with_block_grid(self.cfg);
        (step.params.band_lo, step.params.band_hi) = part.band(self.cfg);
        step.params.q_shift = shifts.q;
        step.params.kv_shift = shifts.kv;
        step.params.row_shift = shifts.rows;
        step.params.pair_shift = shifts.pairs;
        step.params.row_stride = self.cfg.seq_q as u32;
        step.params.resume = resume as u32;
        step.windows = windows.into_iter().map(Some).collect();
        Ok(step)
    }

    /// `kernel` over `parts` in order, the first initializing its outputs and each later one
    /// resuming them (continuing the online softmax, or adding to the gradient sums); then
    /// the casts of the outputs' scratch into their dtype (half dtypes). The outputs are `n`
    /// elements on `side` of each part; `bind` lays out a step's buffers and windows from the
    /// part's windows and each output's binding.
    #[allow(clippy::too_many_arguments)]
    fn passes(
        &self,
        plan: &mut Plan,
        pass: TiledPass,
        parts: &[Part],
        outputs: &[&OutputSlot],
        side: Side,
        n: usize,
        bind: impl Fn(&Windows, &[(BufRef, Window)]) -> (Vec<BufRef>, Vec<Window>),
    ) -> Result<()> {
        let mut last = None;
        for (i, part) in parts.iter().enumerate() {
            let w = part.windows(self.cfg, self.env, self.esz);
            let (tensor_win, shift) = w.side(side);
            let outs: Vec<(BufRef, Window)> = outputs
                .iter()
                .map(|slot| self.out_binding(slot, tensor_win, shift, n))
                .collect();
            let (buffers, windows) = bind(&w, &outs);
            plan.steps
                .push(self.tiled(pass, part, buffers, windows, w.shifts, i > 0)?);
            last = Some((tensor_win, shift));
        }
        if let Some((tensor_win, shift)) = last {
            for slot in outputs {
                plan.steps.extend(self.cast(slot, tensor_win, shift, n));
            }
        }
        Ok(())
    }

    /// The window and buffer an accumulating output of `n` elements, at `shift` in the
    /// tensor's window `tensor_win`, is bound through.
    fn out_binding(
        &self,
        slot: &OutputSlot,
        tensor_win: Window,
        shift: u32,
        n: usize,
    ) -> (BufRef, Window) {
        match slot.scratch {
            Some(s) => (
                s,
                Window {
                    offset: 0,
                    size: (shift as u64 + n as u64) * 4,
                },
            ),
            None => (slot.output, tensor_win),
        }
    }

    /// The cast of a scratch window into the output's window (half dtypes only).
    fn cast(&self, slot: &OutputSlot, tensor_win: Window, shift: u32, n: usize) -> Option<Step> {
        let scratch = slot.scratch?;
        let key = KernelKey {
            elem: ElemFormat::new(self.dtype, self.env.tuning.half_storage),
            ..KernelKey::plain(Kernel::Cast)
        };
        Some(Step {
            key,
            params: Params {
                total_items: n as u32,
                q_shift: shift,
                ..Default::default()
            },
            buffers: vec![scratch, slot.output],
            windows: vec![
                Some(Window {
                    offset: 0,
                    size: (shift as u64 + n as u64) * 4,
                }),
                Some(tensor_win),
            ],
            workgroups: n.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
        })
    }

    /// Scratch for an accumulating output of up to `elems` elements per window (half dtypes).
    fn scratch_slot(
        &self,
        plan: &mut Plan,
        output: BufRef,
        label: &'static str,
        elems: usize,
    ) -> OutputSlot {
        let scratch = (self.split.accumulate && self.dtype != DType::F32).then(|| {
            plan.scratch.push(ScratchSpec {
                label,
                bytes: (elems as u64 + self.env.offset_align.max(4)) * 4,
            });
            Scratch(plan.scratch.len() - 1)
        });
        OutputSlot { output, scratch }
    }
}

/// The forward's steps for a split call (inputs q, k, v; outputs out, lse): the route's
/// split and forward pass.
pub fn forward_steps(
    cfg: &AttentionConfig,
    dtype: DType,
    env: &PlanEnv,
    (split, kernel): (Split, TiledPass),
    plan: &mut Plan,
) -> Result<()> {
    let bld = Builder::new(cfg, dtype, env, split);
    let q_row = cfg.heads_q * cfg.head_dim;
    let out = bld.scratch_slot(plan, Output(0), "out accumulator", split.q_rows * q_row);
    for block in q_blocks(cfg, &split) {
        let parts = key_parts(cfg, &split, block);
        let n = block.1 * block.3 * q_row;
        bld.passes(plan, kernel, &parts, &[&out], Side::Queries, n, |w, o| {
            (
                vec![Input(0), Input(1), Input(2), o[0].0, Output(1)],
                vec![w.q, w.kv, w.kv, o[0].1, w.rows],
            )
        })?;
    }
    Ok(())
}

/// The backward's steps for a split call (inputs q, k, v, out, lse, d_out; outputs dq, dk,
/// dv; scratch 0 holds the (lse, delta) pair of every row): the route's split and its dK/dV
/// and dQ passes.
pub fn backward_steps(
    cfg: &AttentionConfig,
    dtype: DType,
    env: &PlanEnv,
    (split, passes): (Split, &[TiledPass]),
    plan: &mut Plan,
) -> Result<()> {
    use super::backward_buffers::{DK, DQ, DV, D_OUT, K, LSE, LSE_DELTA, OUT, Q, V};
    let bld = Builder::new(cfg, dtype, env, split);
    let q_row = cfg.heads_q * cfg.head_dim;
    let kv_row = cfg.heads_kv * cfg.head_dim;
    let dq = bld.scratch_slot(plan, DQ, "dq accumulator", split.q_rows * q_row);
    let dk = bld.scratch_slot(plan, DK, "dk accumulator", split.kv_rows * kv_row);
    let dv = bld.scratch_slot(plan, DV, "dv accumulator", split.kv_rows * kv_row);
    let blocks = q_blocks(cfg, &split);

    // delta = rowsum(dO * out), per block of query rows
    for &(b, nb, q0, qn) in &blocks {
        let part = Part {
            b,
            batches: nb,
            q0,
            q_rows: qn,
            k0: 0,
            kv_rows: cfg.seq_kv,
        };
        let (qw, qs) = part.q_window(cfg, env, bld.esz);
        let (rw, rs) = part.row_window(cfg, env);
        let (pw, ps) = part.pair_window(cfg, env);
        let sub = part.config(cfg);
        let mut params = Params::from_config(&sub);
        let rows = nb * cfg.heads_q * qn;
        params.total_items = rows as u32;
        params.q_shift = qs;
        params.row_shift = rs;
        params.pair_shift = ps;
        params.row_stride = cfg.seq_q as u32;
        plan.steps.push(Step {
            key: key(Kernel::FlashBwdPreprocess, &sub, Tiles::ONE, dtype, env),
            params,
            buffers: vec![OUT, D_OUT, LSE, LSE_DELTA],
            windows: vec![Some(qw), Some(qw), Some(rw), Some(pw)],
            workgroups: rows.div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
        });
    }

    // dK, dV: each key window sums over the query windows that see it
    let (dkdv, dq_kernel) = (passes[0], passes[1]);
    for (b, nb) in ranges(cfg.batch, split.batches) {
        for (k0, kn) in ranges(cfg.seq_kv, split.kv_rows) {
            let parts = query_parts(cfg, &split, b, nb, k0, kn);
            let n = nb * kn * kv_row;
            bld.passes(plan, dkdv, &parts, &[&dk, &dv], Side::Keys, n, |w, o| {
                (
                    vec![Q, K, V, D_OUT, LSE_DELTA, o[0].0, o[1].0],
                    vec![w.q, w.kv, w.kv, w.q, w.pairs, o[0].1, o[1].1],
                )
            })?;
        }
    }

    // dQ: each query window sums over the key windows it sees
    for &block in &blocks {
        let parts = key_parts(cfg, &split, block);
        let n = block.1 * block.3 * q_row;
        bld.passes(plan, dq_kernel, &parts, &[&dq], Side::Queries, n, |w, o| {
            (
                vec![Q, K, V, D_OUT, LSE_DELTA, o[0].0],
                vec![w.q, w.kv, w.kv, w.q, w.pairs, o[0].1],
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::HalfStorage;
    use crate::kernels::Tuning;
    use crate::kernels::{DeviceCaps, Variant};

    fn env(limit: u64) -> PlanEnv {
        PlanEnv {
            caps: DeviceCaps::WEBGPU_DEFAULT,
            tuning: Tuning {
                variant: Variant::Rows,
                rows_subgroup: 0,
                half_storage: HalfStorage::Packed,
                decode_q_chunks: false,
            },
            max_binding_bytes: limit,
            offset_align: 256,
            compiled_flags: crate::kernels::flags::COMPILED,
        }
    }

    #[test]
    fn windows_are_balanced_and_fill_tiles_where_they_can() {
        assert_eq!(balanced(1024, 448), 384); // 384 + 384 + 256, not 448 + 448 + 128
        assert_eq!(balanced(1024, 2000), 1024);
        assert_eq!(balanced(1024, 127), 64); // equal windows of 114 would split tiles
        assert_eq!(balanced(100, 30), 25); // under 64 rows: equal windows, no rounding
        for (total, max) in [(1000, 70), (524_289, 65_000), (7, 1), (130, 64)] {
            let r = balanced(total, max);
            assert!(r >= 1 && r <= max, "{total} {max} -> {r}");
            assert!(r.is_multiple_of(64) || max < 64, "{total} {max} -> {r}");
        }
    }

    #[test]
    fn calls_that_fit_are_not_split() {
        let c = AttentionConfig::new(2, 100, 100, 4, 4, 64);
        assert_eq!(choose(&c, DType::F32, &env(128 << 20)).unwrap(), None);
    }

    #[test]
    fn windows_start_aligned_and_cover_their_elements() {
        let e = env(1 << 20);
        for esz in [2u64, 4] {
            for start in [0u64, 1, 63, 64, 127, 128, 1000, 12345] {
                for n in [1u64, 2, 3, 100, 777] {
                    let (w, shift) = window(&e, esz, start, n);
                    assert_eq!(w.offset % 256, 0);
                    assert_eq!(w.size % 4, 0);
                    assert_eq!(w.offset + shift as u64 * esz, start * esz);
                    assert!(w.offset + w.size >= (start + n) * esz);
                    assert!(w.size <= n * esz + 256 + 4);
                }
            }
        }
    }

    #[test]
    fn every_window_of_a_split_plan_fits_the_binding() {
        for (c, limit) in [
            (AttentionConfig::new(3, 20, 20, 2, 1, 16), 4 << 10),
            (AttentionConfig::new(1, 150, 130, 2, 1, 16), 8 << 10),
            (AttentionConfig::new(2, 37, 140, 1, 1, 24), 8 << 10),
        ] {
            let e = env(limit);
            for dtype in [DType::F32, DType::F16] {
                if choose(&c, dtype, &e).unwrap().is_none() {
                    assert_eq!(dtype, DType::F16, "f32 must split");
                    continue;
                }
                for p in [
                    crate::plan::forward(&c, dtype, &e).unwrap(),
                    crate::plan::backward(&c, dtype, &e).unwrap(),
                ] {
                    assert!(p.steps.len() >= 2);
                    for s in &p.steps {
                        assert_eq!(s.windows.len(), s.buffers.len(), "{:?}", s.key.kernel);
                        for w in s.windows.iter().flatten() {
                            assert!(w.size <= limit && w.offset % 256 == 0, "{w:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn causal_key_windows_no_query_sees_are_skipped_but_every_window_starts_fresh() {
        // 4 query windows x 4 key windows of 64 rows, causal: the forward visits only the key
        // windows at or below the diagonal, 10 of 16, each query window starting unresumed.
        let c = {
            let mut c = AttentionConfig::new(1, 256, 256, 1, 1, 16);
            c.causal = true;
            c
        };
        let split = Split {
            batches: 1,
            q_rows: 64,
            kv_rows: 64,
            accumulate: true,
        };
        let mut p = crate::plan::forward(
            &AttentionConfig::new(1, 1, 1, 1, 1, 16),
            DType::F32,
            &env(1 << 20),
        )
        .unwrap();
        p.steps.clear();
        let e = env(1 << 20);
        let kernel = crate::plan::route::pass_kernel(
            crate::kernels::Pass::Forward,
            false,
            &c,
            DType::F32,
            &e,
        );
        let pass = TiledPass {
            kernel,
            tiles: crate::plan::tiles_for(kernel, &c, &e).unwrap(),
        };
        forward_steps(&c, DType::F32, &e, (split, pass), &mut p).unwrap();
        assert_eq!(p.steps.len(), 10);
        assert_eq!(p.steps.iter().filter(|s| s.params.resume == 0).count(), 4);
        assert!(p.steps.iter().all(|s| s.key.accumulate));
    }
}
