//! The inner loop of a kernel in a vendor compiler's disassembly, and its instruction mix:
//! what the kernel does each trip through its hottest loop. Two dialects are read:
//!
//! - AMD's (GCN, CDNA and RDNA, as RADV prints it through
//!   `VK_KHR_pipeline_executable_properties`, representation "Assembly": `BBn:` labels, one
//!   instruction a line; [`inner_loop`](crate::device::isa::inner_loop)). A loop is a backward branch (`s_branch` or
//!   `s_cbranch_*` to a label above it).
//! - NVIDIA's as NVK's compiler NAK prints it (representation "NAK assembly": `block N ... [preds]
//!   -> {`, one instruction a line as `dst = op args`, `} -> [succs]`; [`nak_inner_loop`](crate::device::isa::nak_inner_loop)). A
//!   loop is a block with a successor at or above it. NAK keeps its waits in each instruction's
//!   control bits, so a NAK mix has no `waits`.
//! - Qualcomm's as Turnip's compiler ir3 prints it (representation "IR3 Assembly": `lN:`
//!   labels, one instruction a line behind its flags, `(rptN)` repeating it N more times;
//!   [`ir3_inner_loop`](crate::device::isa::ir3_inner_loop)). A loop is a `br` or `jump` to a label above it. Adreno has no matrix
//!   instructions; its `nop`s are where the wave waits for a result, counted as `waits`.
//!
//! The inner loop is the loop holding the most matrix instructions (WMMA, MFMA, HMMA, FMA and
//! dot products, nested loops' counted in), the innermost of equals. A kernel without a loop
//! (every trip unrolled) is measured whole. Pure text: unit-tested on written samples, no GPU.

use std::collections::BTreeMap;

/// What one loop (or a whole program) issues, by kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mix {
    /// The loop's first and last line in the disassembly (1-based), `None` for a whole program.
    pub lines: Option<(usize, usize)>,
    /// Every instruction (VOPD's two halves count as two).
    pub instructions: usize,
    /// Matrix instructions on the matrix cores: RDNA's `v_wmma_*`, CDNA's `v_mfma_*`, NVIDIA's
    /// `hmma`/`imma`.
    pub matrix: usize,
    /// Multiply-adds and dot products on the vector ALUs (`v_fma*`, `v_fmac*`, `v_pk_fma*`,
    /// `v_dot*`, the `v_dual_fmac` half of a VOPD pair; NVIDIA's `ffma`, `hfma2`, `dfma`).
    pub fma: usize,
    /// Of `fma`, the packed 16-bit ones (`v_pk_fma_f16`, `v_dot2*`, `hfma2`): two products a
    /// lane.
    pub packed: usize,
    /// Workgroup-memory (LDS) loads by opcode, without the `ds_load_`/`ds_read_` prefix
    /// (`b128`, `2addr_b32`, `u16_d16`, ...): their widths. NVIDIA's by width (`u16`, `b32`,
    /// `b64`, `b128` of `ld.shared`) and `ldsm.x1`/`.x2`/`.x4` (the matrix loads, `ldmatrix`:
    /// one to four 8 x 8 tiles of 16-bit elements).
    pub lds_loads: BTreeMap<String, usize>,
    /// Workgroup-memory stores.
    pub lds_stores: usize,
    /// Other LDS instructions (atomics, swizzles, permutes).
    pub lds_other: usize,
    /// Loads and stores to memory (`buffer_*`, `global_*`, `flat_*`; NVIDIA's `ld.global`,
    /// `st.global`, `atom.global`).
    pub vmem: usize,
    /// Scratch (private memory spilled or indexed): `scratch_*` and `buffer_*` on the
    /// scratch resource show as this where RADV names them so; NVIDIA's local memory
    /// (`ld.local`, `st.local`).
    pub scratch: usize,
    /// Other vector ALU instructions (conversions, moves, compares, integer math).
    pub other_valu: usize,
    /// Scalar ALU and memory instructions and branches (waits apart); on NVIDIA the uniform
    /// datapath's instructions (an `ur`/`up` destination) and control flow (`bra`, `bssy`,
    /// `bsync`, `nop`, barriers).
    pub salu: usize,
    /// `s_waitcnt*` and `s_wait_*`: where the wave stops for memory.
    pub waits: usize,
}

impl Mix {
    /// LDS load instructions of every width.
    pub fn lds_load_count(&self) -> usize {
        self.lds_loads.values().sum()
    }

    /// The share of issue slots that do matrix work, at one slot an instruction: what the
    /// loop's mix predicts of the chip's peak before occupancy (a crude model, to be checked
    /// on hardware; docs/log/compilers.md says how it is used).
    pub fn math_share(&self) -> f64 {
        let issued = self.instructions - self.waits;
        if issued == 0 {
            return 0.0;
        }
        (self.matrix + self.fma) as f64 / issued as f64
    }

    /// The fraction of the chip's peak the loop's mix predicts, before occupancy: the issue
    /// cycles of matrix work over all the loop's issue cycles, counting one cycle an
    /// instruction and `matrix_cycles` a matrix instruction (RDNA3's 16x16x16 f16 WMMA keeps
    /// a SIMD busy 32 cycles a wave: 8,192 FLOPs at 256 a cycle), waits apart. A crude model
    /// that assumes every other instruction issues without overlapping the matrix work and
    /// latency hidden: docs/log/compilers.md compares it with what hardware gives, when it
    /// does.
    pub fn predicted_fraction(&self, matrix_cycles: f64) -> f64 {
        let other = (self.instructions - self.waits - self.matrix) as f64;
        let matrix = self.matrix as f64 * matrix_cycles;
        if matrix + other == 0.0 {
            return 0.0;
        }
        (matrix + self.fma as f64) / (matrix + other)
    }

    /// Counts one AMD opcode.
    fn count(&mut self, op: &str) {
        self.instructions += 1;
        let lds_load = op
            .strip_prefix("ds_load_")
            .or_else(|| op.strip_prefix("ds_read_"))
            .or_else(|| op.strip_prefix("ds_read"));
        if op.starts_with("v_wmma") || op.starts_with("v_mfma") || op.starts_with("v_swmmac") {
            self.matrix += 1;
        } else if op.starts_with("v_fma")
            || op.starts_with("v_fmac")
            || op.starts_with("v_pk_fma")
            || op.starts_with("v_dot")
            || op.starts_with("v_dual_fmac")
            || op.starts_with("v_dual_fma_")
            || op.starts_with("v_mac_")
            || op.starts_with("v_mad_f32")
        {
            self.fma += 1;
            if op.starts_with("v_pk_fma") || op.starts_with("v_dot2") {
                self.packed += 1;
            }
        } else if let Some(width) = lds_load {
            *self.lds_loads.entry(width.to_string()).or_default() += 1;
        } else if op.starts_with("ds_store") || op.starts_with("ds_write") {
            self.lds_stores += 1;
        } else if op.starts_with("ds_") {
            self.lds_other += 1;
        } else if op.starts_with("scratch_") {
            self.scratch += 1;
        } else if op.starts_with("buffer_") || op.starts_with("global_") || op.starts_with("flat_")
        {
            self.vmem += 1;
        } else if op.starts_with("s_waitcnt") || op.starts_with("s_wait_") {
            self.waits += 1;
        } else if op.starts_with("v_") {
            self.other_valu += 1;
        } else if op.starts_with("s_") {
            self.salu += 1;
        }
    }
}

impl Mix {
    /// Counts one NAK instruction: its opcode and its first destination (empty for none).
    fn count_nak(&mut self, op: &str, dst: &str) {
        self.instructions += 1;
        let last = op.rsplit('.').next().unwrap_or(op);
        if op.starts_with("hmma") || op.starts_with("imma") || op.starts_with("dmma") {
            self.matrix += 1;
        } else if op.starts_with("ffma") || op.starts_with("hfma2") || op.starts_with("dfma") {
            self.fma += 1;
            if op.starts_with("hfma2") {
                self.packed += 1;
            }
        } else if op.starts_with("ld.shared") || op.starts_with("lds.") || op == "lds" {
            *self.lds_loads.entry(last.to_string()).or_default() += 1;
        } else if op.starts_with("ldsm") {
            *self.lds_loads.entry(format!("ldsm.{last}")).or_default() += 1;
        } else if op.starts_with("st.shared") || op.starts_with("sts") || op.starts_with("stsm") {
            self.lds_stores += 1;
        } else if op.starts_with("atom.shared") || op.starts_with("atoms") {
            self.lds_other += 1;
        } else if op.starts_with("ld.local") || op.starts_with("st.local") {
            self.scratch += 1;
        } else if op.starts_with("ld.global")
            || op.starts_with("st.global")
            || op.starts_with("atom.global")
            || op.starts_with("ldg")
            || op.starts_with("stg")
        {
            self.vmem += 1;
        } else if dst.starts_with("ur")
            || dst.starts_with("up")
            || [
                "bra", "bssy", "bsync", "bclear", "nop", "exit", "bar", "membar", "warpsync",
            ]
            .iter()
            .any(|c| op == *c || op.starts_with(&format!("{c}.")))
        {
            self.salu += 1;
        } else {
            self.other_valu += 1;
        }
    }
}

/// A NAK line's opcode and first destination (`r1 = ld.shared.b32 [r1]` gives
/// `("ld.shared.b32", "r1")`, `@!p0 bra pT L5` gives `("bra", "")`), or `None` for a block's
/// first or last line, a comment or a blank.
fn nak_instruction(line: &str) -> Option<(&str, &str)> {
    let code = line.split("//").next().unwrap_or("").trim();
    if code.is_empty() || code.starts_with("block") || code.starts_with('}') {
        return None;
    }
    match code.split_once(" = ") {
        Some((dst, rest)) => {
            let op = rest.split_whitespace().next()?;
            Some((op, dst.split_whitespace().next().unwrap_or("")))
        }
        None => {
            let op = code.split_whitespace().find(|w| !w.starts_with('@'))?;
            Some((op, ""))
        }
    }
}

/// The mix of NAK lines `from..=to` (0-based indices into `lines`).
fn nak_mix_of(lines: &[&str], from: usize, to: usize) -> Mix {
    let mut m = Mix {
        lines: Some((from + 1, to + 1)),
        ..Mix::default()
    };
    for line in &lines[from..=to] {
        if let Some((op, dst)) = nak_instruction(line) {
            m.count_nak(op, dst);
        }
    }
    m
}

/// The inner loop of NAK's disassembly (NVIDIA, representation "NAK assembly") and its mix,
/// or the whole program's mix (`lines: None`) where it has no loop with matrix work: module
/// docs.
pub fn nak_inner_loop(asm: &str) -> Mix {
    let lines: Vec<&str> = asm.lines().collect();
    let loops = nak_loops(&lines);
    let whole = |lines: &[&str]| {
        let mut m = nak_mix_of(lines, 0, lines.len().saturating_sub(1));
        m.lines = None;
        m
    };
    select(loops.iter().map(|&(f, t)| nak_mix_of(&lines, f, t)), || {
        whole(&lines)
    })
}

/// NAK's loops: (first line of the block an edge goes back to, last line of the block it
/// leaves), 0-based.
fn nak_loops(lines: &[&str]) -> Vec<(usize, usize)> {
    // each block's first line, and (first line of its successor, its own last line) for every
    // edge back to it or above
    let mut starts: BTreeMap<usize, usize> = BTreeMap::new();
    let mut current = None;
    let mut loops = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("block") {
            // "block 12 L22 [11] -> {" or "block.u 0 L3 [] -> {" (a uniform block)
            let rest = match rest.strip_prefix('.') {
                Some(kind) => kind.split_once(' ').map_or("", |(_, r)| r),
                None => rest,
            };
            let n = rest
                .split_whitespace()
                .next()
                .filter(|w| w.chars().all(|c| c.is_ascii_digit()))
                .and_then(|w| w.parse::<usize>().ok());
            if let Some(n) = n {
                starts.insert(n, i);
                current = Some(n);
            }
        } else if let (Some(succs), Some(b)) = (t.strip_prefix("} -> ["), current) {
            for s in succs.trim_end_matches(']').split(',') {
                if let Ok(s) = s.trim().parse::<usize>() {
                    if s <= b {
                        if let Some(&from) = starts.get(&s) {
                            loops.push((from, i));
                        }
                    }
                }
            }
        }
    }
    loops
}

/// Of the loops' mixes, the one with the most matrix work, the innermost (shortest) of equals;
/// `whole()` where none has any.
fn select(loops: impl Iterator<Item = Mix>, whole: impl FnOnce() -> Mix) -> Mix {
    let len = |m: &Mix| m.lines.map_or(0, |(f, t)| t - f);
    let best = loops.max_by(|a, b| {
        (a.matrix + a.fma)
            .cmp(&(b.matrix + b.fma))
            // the innermost of equals: the shorter loop is the greater
            .then(len(b).cmp(&len(a)))
    });
    match best {
        Some(m) if m.matrix + m.fma > 0 => m,
        _ => whole(),
    }
}

impl Mix {
    /// Counts one ir3 instruction `op` (flags stripped) issued `times` times.
    fn count_ir3(&mut self, op: &str, args: &str, times: usize) {
        self.instructions += times;
        let base = op.split('.').next().unwrap_or(op);
        match base {
            "nop" => self.waits += times,
            "mad" if op.starts_with("mad.f") => {
                self.fma += times;
            }
            // workgroup memory; the width is the type and the component count (the last
            // operand): `ldl.u32 r0.x, l[r1.x], 4` is `u32x4`
            "ldl" => {
                let ty = op.split('.').nth(1).unwrap_or("");
                let n = args.rsplit(',').next().map_or("", str::trim);
                *self.lds_loads.entry(format!("{ty}x{n}")).or_default() += times;
            }
            "stl" => self.lds_stores += times,
            "ldp" | "stp" => self.scratch += times,
            "ldg" | "stg" | "ldib" | "stib" | "isam" | "ldc" | "resinfo" | "atomic" => {
                self.vmem += times
            }
            "br" | "jump" | "getone" | "shps" | "shpe" | "prede" | "predt" | "predf" | "end"
            | "ret" | "bar" | "fence" | "kill" | "brac" | "bany" | "ball" => self.salu += times,
            _ => self.other_valu += times,
        }
    }
}

/// An ir3 line's opcode, operands and issue count (`(rpt3)add.u r1.x, r2.x, 1` gives
/// `("add.u", "r1.x, r2.x, 1", 4)`), or `None` for a label, a comment or a blank.
fn ir3_instruction(line: &str) -> Option<(&str, &str, usize)> {
    let mut code = line.split(';').next().unwrap_or("").trim();
    if code.is_empty() || code.ends_with(':') {
        return None;
    }
    let mut times = 1;
    // the flags before the opcode: (ss), (sy), (jp), (nopN), (rptN), ...
    while let Some(rest) = code.strip_prefix('(') {
        let (flag, after) = rest.split_once(')')?;
        if let Some(n) = flag
            .strip_prefix("rpt")
            .and_then(|n| n.parse::<usize>().ok())
        {
            times = n + 1;
        }
        code = after.trim_start();
    }
    let (op, args) = code.split_once(' ').unwrap_or((code, ""));
    Some((op, args.trim(), times))
}

/// The mix of ir3 lines `from..=to` (0-based indices into `lines`).
fn ir3_mix_of(lines: &[&str], from: usize, to: usize) -> Mix {
    let mut m = Mix {
        lines: Some((from + 1, to + 1)),
        ..Mix::default()
    };
    for line in &lines[from..=to] {
        if let Some((op, args, times)) = ir3_instruction(line) {
            m.count_ir3(op, args, times);
        }
    }
    m
}

/// The inner loop of ir3's disassembly (Qualcomm Adreno, representation "IR3 Assembly") and
/// its mix, or the whole program's mix (`lines: None`) where it has no loop with math: module
/// docs.
pub fn ir3_inner_loop(asm: &str) -> Mix {
    let lines: Vec<&str> = asm.lines().collect();
    let loops = ir3_loops(&lines);
    select(loops.iter().map(|&(f, t)| ir3_mix_of(&lines, f, t)), || {
        let mut m = ir3_mix_of(&lines, 0, lines.len().saturating_sub(1));
        m.lines = None;
        m
    })
}

/// ir3's loops: (label line, `br`/`jump` line), 0-based.
fn ir3_loops(lines: &[&str]) -> Vec<(usize, usize)> {
    let labels: BTreeMap<&str, usize> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let t = l.trim();
            let name = t.strip_suffix(':')?;
            (name.starts_with('l') && name[1..].chars().all(|c| c.is_ascii_digit()))
                .then_some((name, i))
        })
        .collect();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let (op, args, _) = ir3_instruction(l)?;
            if op != "br" && op != "jump" {
                return None;
            }
            let target = args
                .split(|c: char| c == ',' || c.is_whitespace())
                .find_map(|w| w.strip_prefix('#'))?;
            let at = *labels.get(target)?;
            (at < i).then_some((at, i))
        })
        .collect()
}

/// One line's opcodes: a VOPD pair (`v_dual_a ... :: v_dual_b ...`) gives two; a label,
/// a comment or a blank line none.
fn opcodes(line: &str) -> Vec<&str> {
    let code = line.split(';').next().unwrap_or("").trim();
    if code.is_empty() || code.ends_with(':') {
        return Vec::new();
    }
    code.split("::")
        .filter_map(|half| half.split_whitespace().next())
        .collect()
}

/// The label a line defines (`BB12:` gives `BB12`).
fn label(line: &str) -> Option<&str> {
    let t = line.trim();
    t.strip_suffix(':').filter(|l| !l.contains(' '))
}

/// The label a branch on this line jumps to.
fn branch_target(line: &str) -> Option<&str> {
    let code = line.split(';').next().unwrap_or("").trim();
    let mut words = code.split_whitespace();
    let op = words.next()?;
    (op == "s_branch" || op.starts_with("s_cbranch")).then(|| words.next())?
}

/// The mix of lines `from..=to` (0-based indices into `lines`).
fn mix_of(lines: &[&str], from: usize, to: usize) -> Mix {
    let mut m = Mix {
        lines: Some((from + 1, to + 1)),
        ..Mix::default()
    };
    for line in &lines[from..=to] {
        for op in opcodes(line) {
            m.count(op);
        }
    }
    m
}

/// AMD's loops: (label line, backward branch line), 0-based.
fn aco_loops(lines: &[&str]) -> Vec<(usize, usize)> {
    let labels: BTreeMap<&str, usize> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| label(l).map(|name| (name, i)))
        .collect();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let target = *labels.get(branch_target(l)?)?;
            (target < i).then_some((target, i))
        })
        .collect()
}

/// The inner loop of AMD's disassembly `asm` (RADV's "Assembly") and its mix (module docs),
/// or the whole program's mix (`lines: None`) where it has no loop with matrix work.
pub fn inner_loop(asm: &str) -> Mix {
    let lines: Vec<&str> = asm.lines().collect();
    let loops = aco_loops(&lines);
    select(
        loops.iter().map(|&(from, to)| mix_of(&lines, from, to)),
        || {
            let mut whole = mix_of(&lines, 0, lines.len().saturating_sub(1));
            whole.lines = None;
            whole
        },
    )
}

/// The three dialects this module reads (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// AMD's, as RADV prints it (ACO's "Assembly").
    Aco,
    /// NVIDIA's, as NVK prints it ("NAK assembly").
    Nak,
    /// Qualcomm's, as Turnip prints it ("IR3 Assembly").
    Ir3,
}

impl Dialect {
    /// The loops of `lines` as (first, last) line, 0-based.
    fn loops(self, lines: &[&str]) -> Vec<(usize, usize)> {
        match self {
            Dialect::Aco => aco_loops(lines),
            Dialect::Nak => nak_loops(lines),
            Dialect::Ir3 => ir3_loops(lines),
        }
    }

    /// The mix of lines `from..=to`.
    fn mix_of(self, lines: &[&str], from: usize, to: usize) -> Mix {
        match self {
            Dialect::Aco => mix_of(lines, from, to),
            Dialect::Nak => nak_mix_of(lines, from, to),
            Dialect::Ir3 => ir3_mix_of(lines, from, to),
        }
    }
}

impl Mix {
    /// Each count of `self` combined with `other`'s by `f(mine, theirs)` (the lines aside):
    /// the one list of the counts that `add_times` and `take_away` walk.
    fn combine(&mut self, other: &Mix, f: impl Fn(usize, usize) -> usize) {
        for (mine, theirs) in [
            (&mut self.instructions, other.instructions),
            (&mut self.matrix, other.matrix),
            (&mut self.fma, other.fma),
            (&mut self.packed, other.packed),
            (&mut self.lds_stores, other.lds_stores),
            (&mut self.lds_other, other.lds_other),
            (&mut self.vmem, other.vmem),
            (&mut self.scratch, other.scratch),
            (&mut self.other_valu, other.other_valu),
            (&mut self.salu, other.salu),
            (&mut self.waits, other.waits),
        ] {
            *mine = f(*mine, theirs);
        }
        for (w, &n) in &other.lds_loads {
            let have = self.lds_loads.entry(w.clone()).or_default();
            *have = f(*have, n);
            if *have == 0 {
                self.lds_loads.remove(w);
            }
        }
    }

    /// Adds `other`'s counts `times` times.
    fn add_times(&mut self, other: &Mix, times: usize) {
        self.combine(other, |a, b| a + b * times);
    }

    /// Takes `other`'s counts away (a nested loop's, from the loop that holds it).
    fn take_away(&mut self, other: &Mix) {
        self.combine(other, |a, b| a - b);
    }
}

/// What a nested loop of a block loop is, by what it holds (`BlockModel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nested {
    /// Matrix instructions: a product.
    Product,
    /// Memory loads or stores and no matrix work: staging.
    Staging,
    /// Neither: the scalar guarded sums.
    Guarded,
}

impl Nested {
    fn of(m: &Mix) -> Nested {
        match (m.matrix > 0, m.vmem > 0) {
            (true, _) => Nested::Product,
            (false, true) => Nested::Staging,
            (false, false) => Nested::Guarded,
        }
    }
}

/// What a kernel's block loop (one KV block of a forward or dQ kernel, one query block of a
/// dK/dV kernel) leaves to run time, for [`block_count`]: the trips of the loops nested in it,
/// which the disassembly shows once each. They follow from the kernel's constants and each
/// subgroup's place in the workgroup, which only the kernel's source says (the coop kernels'
/// model: `block_model` in `examples/compiler_stats.rs`). Each nested loop is told apart by
/// what it holds: matrix instructions (a product), memory loads or stores (staging), neither
/// (the scalar guarded sums).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockModel {
    /// Invocations a workgroup runs.
    pub threads: usize,
    /// The subgroup size the pipeline runs at.
    pub subgroup_size: usize,
    /// Each product loop's output blocks, in the disassembly's order: subgroup `s` of `S` takes
    /// blocks `s, s + S, ...`.
    pub products: Vec<usize>,
    /// Each staging loop's elements, in order: invocation `t` takes `t, t + threads, ...`, so a
    /// subgroup makes as many trips as its first invocation.
    pub staging: Vec<usize>,
    /// Each remaining loop's trips in a block with hidden pairs, in order (none in a block
    /// without: the scalar sums that keep a hidden key's NaN out run only there).
    pub guarded: Vec<usize>,
}

impl BlockModel {
    /// The subgroups a workgroup runs.
    pub fn subgroups(&self) -> usize {
        self.threads.div_ceil(self.subgroup_size.max(1)).max(1)
    }
}

/// What one trip of a kernel's block loop issues, summed over a workgroup's subgroups
/// ([`block_count`]): the count that compares kernels of different tiles, and ours with a
/// kernel whose loop body is one whole block already (ggml's coopmat1 flash attention, where
/// every loop inside the block is unrolled: `BlockModel` with no nested loops).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockCount {
    /// The block loop's lines, and every instruction the workgroup's subgroups issue for one
    /// block: the loop's own once a subgroup, each nested loop times its trips there.
    pub mix: Mix,
    /// The subgroups summed.
    pub subgroups: usize,
    /// The compiler unrolled the model's staging loops: their copies are in the block loop's
    /// own count, once a subgroup.
    pub staging_unrolled: bool,
    /// The compiler unrolled the model's guarded loops: their copies are in the own count, so
    /// a block without hidden pairs is counted with them too (an overcount: a uniform branch
    /// skips them there).
    pub guarded_unrolled: bool,
}

impl BlockCount {
    /// Instructions a subgroup issues for one block, on average.
    pub fn per_subgroup(&self) -> f64 {
        self.mix.instructions as f64 / self.subgroups as f64
    }
}

/// The block loop of `asm` (the innermost loop that holds the most matrix instructions, its
/// nested loops' counted in: every product of the block) counted per block by `model`, in a
/// block with hidden pairs where `masked`. An error, saying what was found, where the nested
/// loops are not the model's. A compiler may unroll every loop of a kind (staging, guarded):
/// the count then holds their copies once a subgroup and says so; the product loops it must
/// keep, one a product.
pub fn block_count(
    dialect: Dialect,
    asm: &str,
    model: &BlockModel,
    masked: bool,
) -> Result<BlockCount, String> {
    let lines: Vec<&str> = asm.lines().collect();
    let loops = dialect.loops(&lines);
    let mixes: Vec<Mix> = loops
        .iter()
        .map(|&(f, t)| dialect.mix_of(&lines, f, t))
        .collect();
    let most = mixes.iter().map(|m| m.matrix).max().unwrap_or(0);
    if most == 0 {
        return Err("no loop holds a matrix instruction".into());
    }
    let inside =
        |(f, t): (usize, usize), (of, ot): (usize, usize)| of <= f && t <= ot && (f, t) != (of, ot);
    // the loops with the most matrix work (indices into `loops`), innermost first: a product
    // loop that holds all of it comes before the block loop around it, and the block loop
    // before a loop over heads
    let mut candidates: Vec<usize> = (0..loops.len())
        .filter(|&i| mixes[i].matrix == most)
        .collect();
    candidates.sort_by_key(|&i| (loops[i].1 - loops[i].0, loops[i]));
    candidates.dedup_by_key(|i| loops[*i]);
    let wanted = [
        model.products.len(),
        model.staging.len(),
        model.guarded.len(),
    ];
    let kinds = [Nested::Product, Nested::Staging, Nested::Guarded];
    let mut found_instead = Vec::new();
    let mut chosen = None;
    for b in candidates {
        let block = loops[b];
        // the loops directly inside, in order, each once
        let mut nested: Vec<usize> = (0..loops.len())
            .filter(|&i| inside(loops[i], block))
            .filter(|&i| {
                !loops
                    .iter()
                    .any(|&o| inside(loops[i], o) && inside(o, block))
            })
            .collect();
        nested.sort_by_key(|&i| loops[i]);
        nested.dedup_by_key(|i| loops[*i]);
        let deeper = nested
            .iter()
            .any(|&n| loops.iter().any(|&o| inside(o, loops[n])));
        let found = kinds.map(|k| {
            nested
                .iter()
                .filter(|&&i| Nested::of(&mixes[i]) == k)
                .count()
        });
        // a kind the compiler unrolled wholly (staging, guarded) is in the block's own count;
        // the products it must keep, one loop each
        let fits = (0..3).all(|k| found[k] == wanted[k] || (k > 0 && found[k] == 0));
        if !deeper && fits {
            chosen = Some((b, nested, found));
            break;
        }
        found_instead.push(format!(
            "lines {}-{}: {} product, {} staging and {} other loops{}",
            block.0 + 1,
            block.1 + 1,
            found[0],
            found[1],
            found[2],
            if deeper { ", one holding another" } else { "" }
        ));
    }
    let Some((b, nested, found)) = chosen else {
        return Err(format!(
            "no loop with the most matrix instructions holds the model's {} product, {} \
             staging and {} other loops ({})",
            wanted[0],
            wanted[1],
            wanted[2],
            found_instead.join("; ")
        ));
    };
    let mut own = mixes[b].clone();
    for &i in &nested {
        own.take_away(&mixes[i]);
    }
    let of_kind = |k: Nested| {
        nested
            .iter()
            .map(|&i| &mixes[i])
            .filter(move |m| Nested::of(m) == k)
    };
    let subgroups = model.subgroups();
    let mut total = Mix {
        lines: Some((loops[b].0 + 1, loops[b].1 + 1)),
        ..Mix::default()
    };
    for s in 0..subgroups {
        total.add_times(&own, 1);
        for (m, &n) in of_kind(Nested::Product).zip(&model.products) {
            // blocks s, s + S, ... below n
            let trips = if s < n {
                (n - 1 - s) / subgroups + 1
            } else {
                0
            };
            total.add_times(m, trips);
        }
        let first = s * model.subgroup_size;
        for (m, &n) in of_kind(Nested::Staging).zip(&model.staging) {
            let trips = if first < n {
                (n - first).div_ceil(model.threads)
            } else {
                0
            };
            total.add_times(m, trips);
        }
        for (m, &n) in of_kind(Nested::Guarded).zip(&model.guarded) {
            total.add_times(m, if masked { n } else { 0 });
        }
    }
    Ok(BlockCount {
        mix: total,
        subgroups,
        staging_unrolled: wanted[1] > 0 && found[1] == 0,
        guarded_unrolled: wanted[2] > 0 && found[2] == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "BB0:
\ts_mov_b32 s0, s3                                            ; be800003
\ts_waitcnt lgkmcnt(0)                                        ; bf89fc07
BB1:
\tds_load_b128 v[4:7], v1                                     ; d8fc0000 04000001
\tds_load_u16_d16 v8, v2                                      ; d8980000 08000002
\tv_wmma_f32_16x16x16_f16 v[10:17], v[4:7], v[20:23], v[10:17] ; cc404010 1c2a0904
\tv_dual_fmac_f32 v1, v2, v3 :: v_dual_mov_b32 v4, v5        ; c8000000 00000000
\ts_waitcnt lgkmcnt(0)                                        ; bf89fc07
\tv_add_nc_u32_e32 v1, 4, v1                                  ; 4a020284
\ts_add_u32 s1, s1, 1                                         ; 80018101
\ts_cmp_lt_u32 s1, s2                                         ; bf0a0201
\ts_cbranch_scc1 BB1                                          ; bfa2fff6
BB2:
\tv_fma_f32 v1, v2, v3, v4                                    ; d6130001 04120702
\tglobal_store_b32 v[0:1], v1, off                            ; dc6a0000 007c0100
\ts_endpgm                                                    ; bfb00000
";

    #[test]
    fn the_loop_with_the_matrix_work_is_found_and_counted_by_kind() {
        let m = inner_loop(SAMPLE);
        assert_eq!(m.lines, Some((4, 13)));
        assert_eq!(m.matrix, 1);
        assert_eq!(m.fma, 1, "the VOPD pair's fmac half");
        assert_eq!(m.lds_loads.get("b128"), Some(&1));
        assert_eq!(m.lds_loads.get("u16_d16"), Some(&1));
        assert_eq!(m.lds_load_count(), 2);
        assert_eq!(m.waits, 1);
        // add_nc and the VOPD's mov half
        assert_eq!(m.other_valu, 2);
        // add, cmp and the branch
        assert_eq!(m.salu, 3);
        assert_eq!(m.instructions, 10);
        assert!((m.math_share() - 2.0 / 9.0).abs() < 1e-12);
        // one WMMA of 32 cycles and one FMA among 8 other cycles
        assert!((m.predicted_fraction(32.0) - 33.0 / 40.0).abs() < 1e-12);
    }

    #[test]
    fn a_program_without_a_loop_is_measured_whole() {
        let flat = "BB0:\n\tv_fma_f32 v1, v2, v3, v4 ; x\n\tbuffer_load_b32 v1, off ; y\n";
        let m = inner_loop(flat);
        assert_eq!(m.lines, None);
        assert_eq!((m.fma, m.vmem, m.instructions), (1, 1, 2));
    }

    #[test]
    fn of_nested_loops_the_innermost_with_the_most_math_wins() {
        let nested = "BB0:
\tv_fma_f32 v1, v2, v3, v4
BB1:
\tv_fma_f32 v1, v2, v3, v4
\tv_fma_f32 v1, v2, v3, v4
\ts_cbranch_scc1 BB1
\ts_cbranch_scc1 BB0
";
        // the outer loop holds 3 FMAs, the inner 2: the outer has more math
        assert_eq!(inner_loop(nested).lines, Some((1, 7)));
        let equal = nested.replacen("\tv_fma_f32 v1, v2, v3, v4\nBB1:", "BB1:", 1);
        // equal math: the inner (shorter) loop
        assert_eq!(inner_loop(&equal).lines, Some((2, 5)));
    }

    const NAK: &str = "block.u 0 L3 [] -> {
      r0       = mov rZ                                        // delay=1
                 st.local.strong.cta.b128 [rZ] r0..4           // delay=2 rd:0
@!p0             bra pT L9                                     // delay=1
} -> [1, 3]
block 1 L6 [0, 2] -> {
      r28..32  = ldsm.16.m8n8.x4 [r21]                         // delay=2 rd:0 wr:1
      r1       = ld.shared.strong.cta.b32 [r1.x4+0x9000], pT   // delay=1 wr:0
      r2       = ld.shared.strong.cta.u16 [r2]                 // delay=1 wr:0
      r36..40  = hmma.m16n8k16.f32 r28..32 r32..34 r24..28     // delay=1 wt=000110
      r3       = ffma.ftz r1 r2 r3                             // delay=1
      ur0      = iadd3 ur0 ur2 rZ                              // delay=3
                 st.shared.strong.cta.b64 [r4] r6..8           // delay=1
} -> [2]
block 2 L7 [1] -> {
      r5       = ld.global.a64.strong.gpu.u16 [r6..8]          // delay=1
      p0       = isetp.lt.u32 r1 r2                            // delay=1
@p0              bra pT L6                                     // delay=1
} -> [1, 3]
block 3 L9 [0, 2] -> {
                 exit                                          // delay=1
} -> []
";

    #[test]
    fn a_nak_loop_is_found_by_its_back_edge_and_counted_by_kind() {
        let m = nak_inner_loop(NAK);
        assert_eq!(
            m.lines,
            Some((6, 19)),
            "blocks 1 and 2: block 2 goes back to 1"
        );
        assert_eq!((m.matrix, m.fma, m.packed), (1, 1, 0));
        assert_eq!(m.lds_loads.get("ldsm.x4"), Some(&1));
        assert_eq!(m.lds_loads.get("b32"), Some(&1));
        assert_eq!(m.lds_loads.get("u16"), Some(&1));
        assert_eq!((m.lds_stores, m.vmem, m.scratch), (1, 1, 0));
        // the uniform iadd3 and the branch
        assert_eq!(m.salu, 2);
        // the compare
        assert_eq!(m.other_valu, 1);
        assert_eq!(m.waits, 0);
        assert_eq!(m.instructions, 10);
    }

    #[test]
    fn a_nak_loop_headed_by_a_uniform_block_is_found() {
        let asm = NAK.replace("block 1 L6 [0, 2]", "block.u 1 L6 [0, 2]");
        let m = nak_inner_loop(&asm);
        assert_eq!(m.lines, Some((6, 19)));
        assert_eq!(m.matrix, 1);
    }

    #[test]
    fn a_nak_program_without_a_loop_is_measured_whole() {
        let flat = "block.u 0 L3 [] -> {\n      r3 = ffma.ftz r1 r2 r3 // d\n                 st.local.strong.cta.b32 [rZ] r3 // d\n} -> []\n";
        let m = nak_inner_loop(flat);
        assert_eq!(m.lines, None);
        assert_eq!((m.fma, m.scratch, m.instructions), (1, 1, 2));
    }

    const IR3: &str = "; a comment
shps #l2
getone #l2
l2:
(ss)(rpt3)mad.f32 r1.x, r2.x, r3.x, (r)r1.x
ldl.u32 r4.x, l[r5.x], 4
(sy)(nop2) add.u r6.x, r6.x, 1
(rpt1)nop
stl.u32 l[r7.x], r8.x, 1
isam.v.base0 (u32)(x)r9.x, r9.z, s#0, t#1
br !p0.x, #l2
end
";

    #[test]
    fn an_ir3_loop_counts_repeats_and_workgroup_loads_by_width() {
        let m = ir3_inner_loop(IR3);
        assert_eq!(m.lines, Some((4, 11)));
        assert_eq!(m.fma, 4, "(rpt3) issues the mad four times");
        assert_eq!(m.lds_loads.get("u32x4"), Some(&1));
        assert_eq!((m.lds_stores, m.vmem, m.waits), (1, 1, 2));
        assert_eq!((m.other_valu, m.salu), (1, 1));
        assert_eq!(m.instructions, 11);
    }

    // A block loop (BB1..BB8) holding a staging loop (a global load), a product loop (two
    // WMMA) and a guarded loop (neither), and one instruction of its own besides its branch.
    const BLOCK: &str = "BB0:
\ts_mov_b32 s0, 0
BB1:
\tv_add_nc_u32_e32 v1, 4, v1
BB2:
\tglobal_load_u16 v2, v[4:5], off
\tds_store_b16 v3, v2
\ts_cbranch_scc1 BB2
BB4:
\tds_load_b128 v[4:7], v1
\tv_wmma_f32_16x16x16_f16 v[10:17], v[4:7], v[20:23], v[10:17]
\tv_wmma_f32_16x16x16_f16 v[10:17], v[4:7], v[20:23], v[10:17]
\ts_cbranch_scc1 BB4
BB6:
\tds_load_u16_d16 v8, v2
\tv_fma_f32 v1, v2, v3, v4
\ts_cbranch_scc1 BB6
BB8:
\ts_waitcnt lgkmcnt(0)
\ts_cbranch_scc0 BB1
BB9:
\ts_endpgm
";

    #[test]
    fn a_block_counts_each_nested_loop_by_its_trips_on_each_subgroup() {
        // 4 subgroups of 32 (128 invocations); 6 product blocks: subgroups 0 and 1 take 2,
        // 2 and 3 take 1; 320 staged elements: trips 3, 3, 2, 2 (the first invocations 0, 32,
        // 64, 96); the guarded loop 16 trips in a masked block, none in another
        let model = BlockModel {
            threads: 128,
            subgroup_size: 32,
            products: vec![6],
            staging: vec![320],
            guarded: vec![16],
        };
        let open = block_count(Dialect::Aco, BLOCK, &model, false).unwrap();
        assert_eq!(open.subgroups, 4);
        assert_eq!(open.mix.lines, Some((3, 20)));
        // own: the add, the wait and the back branch, a subgroup
        assert_eq!(open.mix.matrix, 2 * 6);
        assert_eq!(open.mix.vmem, 3 + 3 + 2 + 2);
        assert_eq!(open.mix.waits, 4);
        assert_eq!(open.mix.fma, 0);
        assert_eq!(open.mix.instructions, 4 * 3 + 6 * 4 + 10 * 3);
        let masked = block_count(Dialect::Aco, BLOCK, &model, true).unwrap();
        assert_eq!(masked.mix.fma, 4 * 16);
        assert_eq!(masked.mix.lds_loads.get("u16_d16"), Some(&(4 * 16)));
        assert_eq!(masked.mix.instructions, open.mix.instructions + 4 * 16 * 3);
        assert!((open.per_subgroup() - open.mix.instructions as f64 / 4.0).abs() < 1e-12);
    }

    #[test]
    fn a_block_whose_loops_are_not_the_models_is_refused_with_what_was_found() {
        let model = BlockModel {
            threads: 128,
            subgroup_size: 64,
            products: vec![1, 1],
            staging: vec![320],
            guarded: vec![16],
        };
        let e = block_count(Dialect::Aco, BLOCK, &model, false).unwrap_err();
        assert!(
            e.contains("lines 3-20: 1 product, 1 staging and 1 other"),
            "{e}"
        );
        assert!(
            e.contains("the model's 2 product, 1 staging and 1 other"),
            "{e}"
        );
        // a block loop without nested loops (ggml's, every inner loop unrolled) is itself
        let flat = "BB1:\n\tv_wmma_f32_16x16x16_f16 v[0:7], v[8:11], v[12:15], v[0:7]\n\ts_cbranch_scc0 BB1\n";
        let model = BlockModel {
            threads: 256,
            subgroup_size: 64,
            ..BlockModel::default()
        };
        let c = block_count(Dialect::Aco, flat, &model, false).unwrap();
        assert_eq!((c.subgroups, c.mix.matrix, c.mix.instructions), (4, 4, 8));
        assert!(!c.staging_unrolled && !c.guarded_unrolled);
        // a model's staging and guarded loops unrolled (every copy in the block's own count)
        let model = BlockModel {
            threads: 128,
            subgroup_size: 64,
            products: vec![],
            staging: vec![1024],
            guarded: vec![16],
        };
        let c = block_count(Dialect::Aco, flat, &model, false).unwrap();
        assert!(c.staging_unrolled && c.guarded_unrolled);
        assert_eq!((c.subgroups, c.mix.instructions), (2, 4));
        let no_matrix = "BB1:\n\tv_fma_f32 v1, v2, v3, v4\n\ts_cbranch_scc0 BB1\n";
        assert!(block_count(Dialect::Aco, no_matrix, &model, false).is_err());
    }
}
