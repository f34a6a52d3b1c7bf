//! What a GPU vendor's shader compiler makes of the kernels (issues 62 and 66): the pipelines
//! the library plans on this adapter, each compiled by the driver, with the statistics it
//! reports read into one vocabulary (`statistics::Summary`: registers, spills, scratch,
//! workgroup memory, occupancy, cycles, instructions; AMD's ACO, NVIDIA's NAK, Apple's AGX,
//! Qualcomm's ir3) and, where it gives the disassembly (ACO, NAK, ir3), the mix of each
//! kernel's inner loop. Written as JSON (raw and mapped) and as a markdown table; `--check`
//! fails on a compile failure, on spills or scratch in a kernel the planner picks, and on
//! occupancy below the vendor's floors of docs/log/compilers.md, save the misses recorded
//! there and in `MISSES` (named on every run, failed where a kernel gets worse).
//!
//! ```text
//! # a vendor's compiler without its GPU (Mesa's no-op DRM shims; scripts/compiler-stats.sh):
//! bash scripts/compiler-stats.sh navi31 --check
//! bash scripts/compiler-stats.sh ga100 --check --planned-only   # also m1, a730, amd26:navi31
//! # any Vulkan GPU (the GPU run): the adapter Context::new would pick
//! cargo run --release --example compiler_stats -- --json stats.json --markdown stats.md
//! ```
//!
//! The context is opened as `Context::new` opens one, without the canary and the coop
//! self-check (`Context::for_compiler_statistics`). The sample (the default) plans forward,
//! backward and decode calls at head dims 64 and 128 in f16 and f32 (B=1, 512 rows, 8 query
//! heads over 2, causal; decode: one row over 4,096 keys, 32 heads over 8), the 8-bit decode
//! (q8_0, E4M3, f16, 128) with the adapter's own tuning (the planner's pick: blocks, or coop
//! where cooperative matrices are offered), and the same calls on the rows family and the
//! blocks family where they are not the pick (reported, not held to the floors: the planner
//! does not use them here). `--all` takes every pipeline the enumeration lists for this
//! adapter's limits (`kernels::enumerate`) instead.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::ExitCode;

use clap::Parser;
use flash_attn_wgpu::device::isa::{
    block_count, inner_loop, ir3_inner_loop, nak_inner_loop, BlockCount, BlockModel, Dialect, Mix,
};
use flash_attn_wgpu::device::statistics::{Compiler, NvidiaSm, PipelineReport, Summary};
use flash_attn_wgpu::unstable::kernels::enumerate::{pipeline_keys, Device};
use flash_attn_wgpu::unstable::kernels::tiles::COOP_THREADS;
use flash_attn_wgpu::unstable::kernels::{Kernel, KernelKey, Pass};
use flash_attn_wgpu::unstable::plan;
use flash_attn_wgpu::{AttentionConfig, CacheFormat, Context, DType, Tuning, Variant};

#[derive(Parser)]
#[command(about = "The driver compiler's statistics for the pipelines planned on this adapter")]
struct Args {
    /// Every enumerated pipeline for this adapter's limits, not the sample.
    #[arg(long)]
    all: bool,
    /// Fail (exit 1) on a compile failure, spills or scratch in a planned kernel, or a planned
    /// attention kernel below its occupancy floor.
    #[arg(long)]
    check: bool,
    /// The chip's name for the report (`navi31`); the adapter's name when not given.
    #[arg(long)]
    chip: Option<String>,
    /// The head dims the sample plans at (the full tier takes 32,64,80,128,256).
    #[arg(long, value_delimiter = ',', default_value = "64,128")]
    head_dims: Vec<usize>,
    /// Write the statistics as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Write the table as markdown here.
    #[arg(long)]
    markdown: Option<String>,
    /// Plan as if the device offered this much workgroup memory (bytes), to see what other
    /// tiles would compile to: an experiment, reported as such.
    #[arg(long)]
    storage_cap: Option<u32>,
    /// Plan with this many private floats an invocation may hold (`DeviceCaps`), likewise.
    #[arg(long)]
    private_floats: Option<u32>,
    /// Only the pipelines the planner picks (the sample without the other families' kernels):
    /// the test command's quick run.
    #[arg(long)]
    planned_only: bool,
    /// Where the driver offers no statistics (`Unsupported`: lavapipe, a driver without
    /// `VK_KHR_pipeline_executable_properties`), say so and succeed: the GPU run's step.
    #[arg(long)]
    or_skip: bool,
    /// Compile every tile candidate of the blocks and coop kernels (forward, dK/dV, dQ) at
    /// head dims 64 and 128 that fits the (capped) workgroup memory, and print what each
    /// compiles to: the data a tile choice for this chip is made from.
    #[arg(long)]
    search: bool,
    /// Print every statistic (name, value, the driver's description) and the names and
    /// sizes of the internal representations of the first N pipelines: what a driver
    /// reports, before any of it is mapped.
    #[arg(long)]
    raw: Option<usize>,
    /// With `--raw`: write each representation's text into this folder too (one file a
    /// pipeline and representation).
    #[arg(long)]
    raw_dir: Option<String>,
    /// Count another program's block loop, per block, as the coop kernels' are counted: an
    /// AMD disassembly (RADV's "Assembly") whose block loop holds no other loop (ggml's
    /// coopmat1 flash attention: ../shared/anchors/ggml-cm1 makes it), with `--asm-shape`.
    /// Prints the count and exits; opens no adapter.
    #[arg(long)]
    asm: Option<String>,
    /// With `--asm`: invocations a workgroup, subgroup size, waves a SIMD (RADV's count).
    #[arg(long, value_delimiter = ',', default_value = "256,64,4")]
    asm_shape: Vec<usize>,
}

/// One pipeline: its key, whether the planner picks it on this adapter, the report and its
/// summary (`summary`).
struct Row {
    key: KernelKey,
    planned: bool,
    report: Result<PipelineReport, String>,
    sum: Option<Summary>,
    mix: Option<Mix>,
    /// The block loop counted per block (`device::isa::block_count`), without and with hidden
    /// pairs: the coop kernels where the disassembly is read; why not where it cannot be.
    block: Option<Result<(BlockCount, BlockCount), String>>,
}

/// The report's summary, with an NVIDIA chip's occupancy bounded by its SM's shared memory,
/// CTAs and warps too (NAK counts registers only; `NvidiaSm`), where the chip is known.
fn summary(rep: &PipelineReport, chip: &str) -> Summary {
    let mut sum = rep.summary();
    if let (Compiler::Nak, Some(sm), Some(warps), Some((threads, shared))) = (
        sum.compiler,
        NvidiaSm::of_chip(chip),
        sum.occupancy,
        rep.nir_workgroup(),
    ) {
        sum.occupancy = Some(sm.warps(warps, threads, shared));
    }
    sum
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e)
            if args.or_skip
                && matches!(
                    e.downcast_ref::<flash_attn_wgpu::Error>(),
                    Some(flash_attn_wgpu::Error::Unsupported { .. })
                ) =>
        {
            println!("compiler statistics skipped: {e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("compiler_stats: {e}");
            ExitCode::from(2)
        }
    }
}

/// The attention kernels held to the occupancy floor: the tiled passes and decode.
fn attention(k: Kernel) -> bool {
    matches!(k, Kernel::Flash(..)) || k.is_decode()
}

/// The sample's calls, planned with `ctx`'s current tuning (and the experiment's caps).
fn planned_keys(ctx: &Context, a: &Args) -> Result<Vec<KernelKey>, Box<dyn std::error::Error>> {
    let mut env = ctx.plan_env();
    if let Some(b) = a.storage_cap {
        env.caps.max_workgroup_storage_bytes = env.caps.max_workgroup_storage_bytes.min(b);
    }
    if let Some(f) = a.private_floats {
        env.caps.private_floats = f;
    }
    let mut keys = Vec::new();
    for dtype in [DType::F16, DType::F32] {
        for &d in &a.head_dims {
            let mut cfg = AttentionConfig::new(1, 512, 512, 8, 2, d);
            cfg.causal = true;
            keys.extend(
                plan::forward(&cfg, dtype, &env)?
                    .steps
                    .iter()
                    .map(|s| s.key),
            );
            keys.extend(
                plan::backward(&cfg, dtype, &env)?
                    .steps
                    .iter()
                    .map(|s| s.key),
            );
            let decode = AttentionConfig::new(1, 1, 4096, 32, 8, d);
            keys.extend(
                plan::forward(&decode, dtype, &env)?
                    .steps
                    .iter()
                    .map(|s| s.key),
            );
        }
    }
    for &d in a.head_dims.iter().filter(|d| d.is_multiple_of(32)) {
        let decode = AttentionConfig::new(1, 1, 4096, 32, 8, d);
        for f in [CacheFormat::Q8_0, CacheFormat::E4M3] {
            let mut p = plan::forward(&decode, DType::F16, &env)?;
            plan::quantized::read_cache(&mut p, f, &decode, &env)?;
            keys.extend(p.steps.iter().map(|s| s.key));
        }
    }
    Ok(keys)
}

fn run(a: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    if let Some(path) = &a.asm {
        return count_asm(path, &a.asm_shape);
    }
    let ctx = Context::for_compiler_statistics()?;
    let info = ctx.adapter_info().clone();
    let chip = a.chip.clone().unwrap_or_else(|| info.name.clone());
    eprintln!("compiler_stats: {info}");
    if a.search {
        search(&ctx, a)?;
        return Ok(true);
    }
    let pick = ctx.tuning();
    if let Some(n) = a.raw {
        for key in planned_keys(&ctx, a)?.iter().take(n) {
            raw(&ctx, key, a.raw_dir.as_deref())?;
        }
        return Ok(true);
    }
    // (key, planned) in order, each pipeline once
    let mut keys: Vec<(KernelKey, bool)> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut add = |k: KernelKey, planned: bool, keys: &mut Vec<(KernelKey, bool)>| {
        if seen.insert(k.label()) {
            keys.push((k, planned));
        }
    };
    if a.all {
        let fixed = if info.subgroup_min_size == info.subgroup_max_size {
            info.subgroup_min_size
        } else {
            0
        };
        let device = Device {
            caps: ctx.plan_env().caps,
            subgroup: fixed,
        };
        let planned: BTreeSet<String> = planned_keys(&ctx, a)?.iter().map(|k| k.label()).collect();
        // (kernels that use the f16 type only where the adapter has SHADER_F16: the planner
        // stores f16 packed elsewhere, and probes no f16 roofline)
        for k in pipeline_keys(&[device])
            .into_iter()
            .filter(|k| info.shader_f16 || !k.uses_f16())
        {
            let p = planned.contains(&k.label());
            add(k, p, &mut keys);
        }
    } else {
        for k in planned_keys(&ctx, a)? {
            add(k, true, &mut keys);
        }
        for variant in [Variant::Blocks, Variant::Rows] {
            if variant != pick.variant && !a.planned_only {
                ctx.set_tuning(Tuning { variant, ..pick })?;
                for k in planned_keys(&ctx, a)? {
                    add(k, false, &mut keys);
                }
            }
        }
        ctx.set_tuning(pick)?;
    }
    let rows: Vec<Row> = keys
        .into_iter()
        .map(|(key, planned)| {
            let report = ctx.compiler_statistics(&key).map_err(|e| e.to_string());
            let mix = report.as_ref().ok().and_then(mix_of);
            let sum = report.as_ref().ok().map(|r| summary(r, &chip));
            let block = report.as_ref().ok().and_then(|r| blocks_of(&ctx, &key, r));
            Row {
                key,
                planned,
                report,
                sum,
                mix,
                block,
            }
        })
        .collect();
    let wave64 = info.subgroup_min_size == 64 && info.subgroup_max_size == 64;
    let driver = format!("{} {}", info.driver, info.driver_info);
    let (failures, known) = check(&rows, wave64, &driver);
    let table = markdown(&chip, &info.to_string(), &rows);
    print!("{table}");
    if let Some(path) = &a.markdown {
        std::fs::write(path, &table)?;
    }
    if let Some(path) = &a.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json(&chip, &info.to_string(), &rows))?,
        )?;
    }
    for k in &known {
        eprintln!("compiler_stats: {chip}: known miss: {k}");
    }
    for f in &failures {
        eprintln!("compiler_stats: {chip}: {f}");
    }
    eprintln!(
        "compiler_stats: {chip}: {} pipelines compiled, {} planned, {} failures of the checks, \
         {} known misses",
        rows.len(),
        rows.iter().filter(|r| r.planned).count(),
        failures.len(),
        known.len()
    );
    Ok(!a.check || failures.is_empty())
}

/// The occupancy a planned attention kernel must reach, in its compiler's unit
/// (docs/log/compilers.md, "Floors"). AMD: what the kernels reached on Mesa 25.0.7, so that a
/// change that loses occupancy fails: on a wave64 GPU (GCN, Vega, CDNA: `wave64`) two waves a
/// SIMD, but dK/dV past head dim 64 (one: its K and V tiles leave no 16 x 16 tile within the
/// 32 KiB two workgroups a compute unit need); on RDNA two, and four for the coop kernels. The
/// others: issue 66's goals, eight warps an SM for every attention kernel on NVIDIA and 16 for
/// decode (latency hiding at two and four warps a scheduler), 512 threads a core on Apple, four
/// waves a core on Adreno for forward and decode (two for the backward passes).
fn floor(compiler: Compiler, wave64: bool, key: &KernelKey) -> Option<f64> {
    let decode = key.kernel.is_decode();
    Some(match compiler {
        Compiler::Aco => match key.kernel {
            Kernel::Flash(_, Pass::DkDv) if wave64 && key.head_dim > 64 => 1.0,
            Kernel::Flash(Variant::Coop, _) => 4.0,
            _ => 2.0,
        },
        Compiler::Nak if decode => 16.0,
        Compiler::Nak => 8.0,
        Compiler::Agx => 512.0,
        Compiler::Ir3 if decode || matches!(key.kernel, Kernel::Flash(_, Pass::Forward)) => 4.0,
        Compiler::Ir3 => 2.0,
        Compiler::Other => return None,
    })
}

/// What a floor holds down.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Measure {
    /// Spills (as the compiler counts them; fills are reported beside): floor 0.
    Spills,
    /// Private memory an invocation, bytes: floor 0.
    Scratch,
    /// Occupancy: floor [`floor`].
    Occupancy,
}

/// A floor that planned kernels miss today, measured (docs/log/compilers.md, "What the
/// floors miss"): `--check` names it on every run and fails only where a kernel does worse
/// than the worst measured. A miss is mended by shaping the kernels, then removed here.
struct Miss {
    compiler: Compiler,
    /// The driver it was measured on, as the adapter's driver string has it ("Mesa 26.1").
    driver: &'static str,
    /// The planned kernels it holds for.
    kernels: fn(&KernelKey) -> bool,
    measure: Measure,
    /// The most spills or bytes, or the least occupancy, measured.
    worst: f64,
    why: &'static str,
}

/// The misses measured and not yet mended: none since 2026-12-08 (the last, Adreno's f32 dK/dV
/// at head dim 128 with 9 spills, went with the guarded sums' branch a weight:
/// docs/log/compilers.md, "2026-12-08").
const MISSES: &[Miss] = &[];

/// What `--check` fails on, one line each, and the known misses it met (`MISSES`), one line
/// each. `driver`: the adapter's driver and its version.
fn check(rows: &[Row], wave64: bool, driver: &str) -> (Vec<String>, Vec<String>) {
    let (mut out, mut known) = (Vec::new(), Vec::new());
    for r in rows {
        let label = r.key.label();
        let sum = match (&r.report, &r.sum) {
            (Ok(_), Some(sum)) => sum,
            (Err(e), _) => {
                out.push(format!("{label}: does not compile: {e}"));
                continue;
            }
            _ => continue,
        };
        if !r.planned {
            continue;
        }
        // (a miss that is recorded and no worse is known; anything else fails)
        let mut judge = |measure: Measure, have: f64, line: String| {
            let miss = MISSES.iter().find(|m| {
                m.compiler == sum.compiler
                    && m.measure == measure
                    && driver.contains(m.driver)
                    && (m.kernels)(&r.key)
            });
            match miss {
                Some(m)
                    if (measure == Measure::Occupancy && have >= m.worst)
                        || (measure != Measure::Occupancy && have <= m.worst) =>
                {
                    known.push(format!("{line} ({})", m.why));
                }
                Some(m) => out.push(format!("{line}, worse than the {} recorded", m.worst)),
                None => out.push(line),
            }
        };
        let (spills, fills) = (sum.spills.unwrap_or(0.0), sum.fills.unwrap_or(0.0));
        if spills + fills > 0.0 {
            judge(
                Measure::Spills,
                spills,
                format!("{label}: {spills} spills, {fills} fills"),
            );
        }
        let scratch = sum.scratch_bytes.unwrap_or(0.0);
        if scratch > 0.0 {
            judge(
                Measure::Scratch,
                scratch,
                format!("{label}: {scratch} B of scratch an invocation"),
            );
        }
        if attention(r.key.kernel) {
            if let (Some(have), Some(want)) = (sum.occupancy, floor(sum.compiler, wave64, &r.key)) {
                if have < want {
                    judge(
                        Measure::Occupancy,
                        have,
                        format!(
                            "{label}: {have} {}, floor {want}",
                            sum.compiler.occupancy_unit()
                        ),
                    );
                }
            }
        }
    }
    (out, known)
}

fn pass_name(key: &KernelKey) -> String {
    let kv = key.kv.map_or(String::new(), |f| format!(" ({f})"));
    let name = match key.kernel {
        Kernel::Flash(v, p) => format!(
            "{} {}",
            v.name(),
            match p {
                Pass::Forward => "fwd",
                Pass::DkDv => "dK/dV",
                Pass::Dq => "dQ",
            }
        ),
        other => other.name().to_string(),
    };
    format!("{name}{kv}")
}

/// The inner loop's mix where the compiler's disassembly is read (`device::isa`): ACO's
/// "Assembly", NAK's "NAK assembly", ir3's "IR3 Assembly". AGX (Honeykrisp) gives no
/// representation at all.
fn mix_of(rep: &PipelineReport) -> Option<Mix> {
    match rep.summary().compiler {
        Compiler::Aco => rep.representation("assembly").map(inner_loop),
        Compiler::Nak => rep.representation("nak assembly").map(nak_inner_loop),
        Compiler::Ir3 => rep.representation("ir3 assembly").map(ir3_inner_loop),
        _ => None,
    }
}

/// The coop kernels' block loops as their shaders write them (shaders/flash_fwd_coop.wgsl,
/// flash_bwd_dkdv_coop.wgsl, flash_bwd_dq_coop.wgsl, coop.wgsl), for `block_count`: each
/// product (`coop_nt`, `coop_nn`) shares out its CF x CF output blocks by subgroup; the
/// forward and dQ stage a K/V tile a block, dK/dV a Q/dO tile, in chunks of `SW` (8) head dims
/// (BC x DP / 8 chunks, BR x DP / 8), and dK/dV the tile's lse and delta (BR); `guarded_row`
/// sums BC (BR in dK/dV) weights in a block with hidden pairs. `None` for other kernels.
fn block_model(key: &KernelKey, subgroup_size: u32) -> Option<BlockModel> {
    let Kernel::Flash(Variant::Coop, pass) = key.kernel else {
        return None;
    };
    let t = key.tiles;
    let (br, bc, cf) = (t.br as usize, t.bc as usize, t.rpt as usize);
    let dp = (key.head_dim as usize).div_ceil(cf) * cf;
    let (scores, rows_out, keys_out) = (
        br / cf * (bc / cf),
        br / cf * (dp / cf),
        bc / cf * (dp / cf),
    );
    // coop.wgsl's SW: head dims a staging trip
    const SW: usize = 8;
    let (products, staging, guarded) = match pass {
        Pass::Forward => (vec![scores, rows_out], vec![bc * dp / SW], vec![bc]),
        Pass::DkDv => (
            vec![scores, scores, keys_out, keys_out],
            vec![br * dp / SW, br],
            vec![br, br],
        ),
        Pass::Dq => (vec![scores, scores, rows_out], vec![bc * dp / SW], vec![bc]),
    };
    Some(BlockModel {
        threads: COOP_THREADS as usize,
        subgroup_size: subgroup_size as usize,
        products,
        staging,
        guarded,
    })
}

/// The block loop of a coop kernel counted per block, without and with hidden pairs, where
/// the compiler's disassembly is read. With hidden pairs: `rep`, the kernel as planned. Without:
/// the kernel compiled again with its hidden-pair path taken out (each `if (masked) {` made
/// `if (false) {`), because compilers unroll that path's loop into the block's code (ACO at
/// head dim 64), where at run time a uniform branch skips it in a block without hidden pairs.
fn blocks_of(
    ctx: &Context,
    key: &KernelKey,
    rep: &PipelineReport,
) -> Option<Result<(BlockCount, BlockCount), String>> {
    let model = block_model(key, rep.subgroup_size)?;
    let (dialect, name) = match rep.summary().compiler {
        Compiler::Aco => (Dialect::Aco, "assembly"),
        Compiler::Nak => (Dialect::Nak, "nak assembly"),
        _ => return None,
    };
    let masked = block_count(dialect, rep.representation(name)?, &model, true);
    let wgsl = key.wgsl();
    const PATH: &str = "if (masked) {";
    if !wgsl.contains(PATH) {
        return Some(Err(format!("the kernel has no `{PATH}` to take out")));
    }
    let open = ctx
        .compiler_statistics_of(key, &wgsl.replace(PATH, "if (false) {"))
        .map_err(|e| e.to_string())
        .and_then(|r| {
            let asm = r
                .representation(name)
                .ok_or_else(|| format!("no {name} without the hidden-pair path"))?;
            block_count(dialect, asm, &model, false)
        });
    Some(open.and_then(|open| Ok((open, masked?))))
}

/// `--asm`: another program's block loop counted per block, printed (ACO's model constants).
fn count_asm(path: &str, shape: &[usize]) -> Result<bool, Box<dyn std::error::Error>> {
    let &[threads, subgroup_size, waves] = shape else {
        return Err(format!(
            "--asm-shape takes invocations,subgroup size,waves (three numbers), given {shape:?}"
        )
        .into());
    };
    let asm = std::fs::read_to_string(path).map_err(|e| format!("--asm {path}: {e}"))?;
    let model = BlockModel {
        threads,
        subgroup_size,
        ..BlockModel::default()
    };
    let b =
        block_count(Dialect::Aco, &asm, &model, false).map_err(|e| format!("--asm {path}: {e}"))?;
    let m = &b.mix;
    println!(
        "{path}: block loop at lines {}: {} subgroups, {:.0} instructions a subgroup ({} waits), \
         {} matrix, {} fma-class, {} LDS loads; predicted fraction {:.2}",
        m.lines.map_or("-".into(), |(f, t)| format!("{f}-{t}")),
        b.subgroups,
        b.per_subgroup(),
        m.waits / b.subgroups,
        m.matrix,
        m.fma,
        m.lds_load_count(),
        predicted_at(m, Compiler::Aco, Some(waves as f64)).expect("ACO has a model")
    );
    Ok(true)
}

/// The per-block cell: `instructions, MMA, fraction` without and with hidden pairs, `-` where
/// not counted, the reason where the disassembly is not the model's.
fn block_cell(block: Option<&Result<(BlockCount, BlockCount), String>>, sum: &Summary) -> String {
    let one = |b: &BlockCount| {
        format!(
            "{:.0}, {}, {}",
            b.per_subgroup(),
            b.mix.matrix,
            predicted(&b.mix, sum).map_or("-".into(), |p| format!("{p:.2}"))
        )
    };
    let unrolled = |b: &BlockCount| match (b.staging_unrolled, b.guarded_unrolled) {
        (false, false) => "",
        (true, false) => " (staging unrolled)",
        (false, true) => " (guarded sums unrolled)",
        (true, true) => " (staging and guarded sums unrolled)",
    };
    match block {
        None => "-".into(),
        Some(Ok((open, masked))) => format!("{} / {}{}", one(open), one(masked), unrolled(masked)),
        Some(Err(e)) => format!("not counted: {}", e.replace('|', "/")),
    }
}

/// A value for the table: `-` where the compiler does not report it.
fn cell(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v}"))
}

/// The markdown table: a row a pipeline, planned first.
fn markdown(chip: &str, adapter: &str, rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### {chip}\n\n{adapter}\n");
    let compiler = rows
        .iter()
        .find_map(|r| r.report.as_ref().ok())
        .map_or(Compiler::Other, |r| r.summary().compiler);
    let unit = match compiler {
        Compiler::Nak => "warps/SM (NAK's count of registers, bounded by the SM's shared memory, CTAs and warps where the chip is known)",
        c => c.occupancy_unit(),
    };
    let _ = writeln!(
        s,
        "Compiler: {}; regs: 32-bit registers an invocation; spills / fills: as the compiler \
         counts them; scratch: private bytes an invocation; occupancy in {}.\n",
        compiler.name(),
        unit
    );
    let _ = writeln!(
        s,
        "| kernel | dtype | d | planned | wave | regs | spills / fills | scratch B | LDS B | occupancy | cycles | instr | inner loop: math / LDS loads (widths) / other ALU / scalar, uniform, control / waits | predicted fraction of peak | per block, no mask / mask: instructions a subgroup, MMA, predicted fraction |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut order: Vec<&Row> = rows.iter().collect();
    order.sort_by_key(|r| !r.planned);
    for r in order {
        let k = &r.key;
        let head = format!(
            "| {} | {:?} | {} | {} |",
            pass_name(k),
            k.elem,
            k.head_dim,
            if r.planned { "yes" } else { "no" }
        );
        match &r.report {
            Err(e) => {
                let _ = writeln!(
                    s,
                    "{head} compile failed: {} ||||||||||",
                    e.replace('|', "/")
                );
            }
            Ok(rep) => {
                let sum = r.sum.unwrap_or_else(|| rep.summary());
                let (mix, share) = match &r.mix {
                    Some(m) => (
                        format!(
                            "{}{} / {} ({}) / {} / {} / {}",
                            m.matrix + m.fma,
                            if m.matrix > 0 {
                                format!(" ({} MMA)", m.matrix)
                            } else {
                                String::new()
                            },
                            m.lds_load_count(),
                            m.lds_loads
                                .iter()
                                .map(|(w, n)| format!("{n} {w}"))
                                .collect::<Vec<_>>()
                                .join(", "),
                            m.other_valu,
                            m.salu,
                            m.waits
                        ),
                        predicted(m, &sum).map_or("-".into(), |p| format!("{p:.2}")),
                    ),
                    None => ("-".into(), "-".into()),
                };
                let spills = match (sum.spills, sum.fills) {
                    (s, None) => cell(s),
                    (s, f) => format!("{} / {}", cell(s), cell(f)),
                };
                let block = block_cell(r.block.as_ref(), &sum);
                let _ = writeln!(
                    s,
                    "{head} {} | {} | {spills} | {} | {} | {} | {} | {} | {mix} | {share} | {block} |",
                    rep.subgroup_size,
                    cell(sum.registers),
                    cell(sum.scratch_bytes),
                    cell(sum.workgroup_bytes),
                    cell(sum.occupancy),
                    cell(sum.cycles),
                    cell(sum.instructions),
                );
            }
        }
    }
    s
}

/// The model's constants per compiler (docs/log/compilers.md): issue cycles a matrix
/// instruction keeps its unit busy, and the occupancy at which the model takes latency as
/// hidden. ACO: RDNA3's 16x16x16 f16 WMMA is 8,192 FLOPs at 256 a cycle a SIMD (32), four
/// waves a SIMD. NAK: an A100 sub-partition's tensor core does 512 f16 FLOPs a cycle, so an
/// m16n8k16 HMMA (4,096) takes 8; eight warps an SM (two a scheduler, what FlashAttention-2
/// runs at).
fn model_constants(c: Compiler) -> Option<(f64, f64)> {
    match c {
        Compiler::Aco => Some((32.0, 4.0)),
        Compiler::Nak => Some((8.0, 8.0)),
        _ => None,
    }
}

/// The fraction of the chip's peak a kernel's inner loop and occupancy predict (the model of
/// docs/log/compilers.md): the loop's mix (`Mix::predicted_fraction`) times the share of the
/// occupancy that latency hiding wants. `None` where the compiler has no model.
fn predicted(m: &Mix, sum: &Summary) -> Option<f64> {
    predicted_at(m, sum.compiler, sum.occupancy)
}

/// [`predicted`] for a compiler and an occupancy in its unit (latency taken as hidden where
/// none is known).
fn predicted_at(m: &Mix, compiler: Compiler, occupancy: Option<f64>) -> Option<f64> {
    let (matrix_cycles, hide) = model_constants(compiler)?;
    let occupancy = occupancy.unwrap_or(hide);
    Some(m.predicted_fraction(matrix_cycles) * (occupancy / hide).min(1.0))
}

fn json(chip: &str, adapter: &str, rows: &[Row]) -> serde_json::Value {
    let items: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut o = serde_json::json!({
                "label": r.key.label(),
                "kernel": pass_name(&r.key),
                "head_dim": r.key.head_dim,
                "elem": format!("{:?}", r.key.elem),
                "planned": r.planned,
            });
            match &r.report {
                Err(e) => o["error"] = e.clone().into(),
                Ok(rep) => {
                    o["subgroup_size"] = rep.subgroup_size.into();
                    let sum = r.sum.unwrap_or_else(|| rep.summary());
                    o["summary"] = serde_json::json!({
                        "compiler": sum.compiler.name(),
                        "registers": sum.registers,
                        "spills": sum.spills,
                        "fills": sum.fills,
                        "scratch_bytes": sum.scratch_bytes,
                        "workgroup_bytes": sum.workgroup_bytes,
                        "occupancy": sum.occupancy,
                        "occupancy_unit": sum.compiler.occupancy_unit(),
                        "cycles": sum.cycles,
                        "instructions": sum.instructions,
                    });
                    o["statistics"] = rep
                        .statistics
                        .iter()
                        .map(|(n, v)| (n.clone(), serde_json::json!(v.as_f64())))
                        .collect::<serde_json::Map<_, _>>()
                        .into();
                }
            }
            match &r.block {
                Some(Ok((open, masked))) => {
                    let one = |b: &BlockCount| {
                        serde_json::json!({
                            "lines": b.mix.lines,
                            "subgroups": b.subgroups,
                            "instructions": b.mix.instructions,
                            "per_subgroup": b.per_subgroup(),
                            "matrix": b.mix.matrix,
                            "fma": b.mix.fma,
                            "lds_loads": b.mix.lds_loads,
                            "lds_stores": b.mix.lds_stores,
                            "vmem": b.mix.vmem,
                            "other_valu": b.mix.other_valu,
                            "salu": b.mix.salu,
                            "waits": b.mix.waits,
                            "predicted_fraction": r.sum.as_ref().and_then(|sum| predicted(&b.mix, sum)),
                        })
                    };
                    o["block"] = serde_json::json!({ "no_mask": one(open), "mask": one(masked) });
                }
                Some(Err(e)) => o["block_error"] = e.clone().into(),
                None => {}
            }
            if let Some(m) = &r.mix {
                o["inner_loop"] = serde_json::json!({
                    "lines": m.lines,
                    "instructions": m.instructions,
                    "matrix": m.matrix,
                    "fma": m.fma,
                    "packed": m.packed,
                    "lds_loads": m.lds_loads,
                    "lds_stores": m.lds_stores,
                    "vmem": m.vmem,
                    "scratch": m.scratch,
                    "other_valu": m.other_valu,
                    "salu": m.salu,
                    "waits": m.waits,
                    "math_share": m.math_share(),
                    "predicted_fraction": r.sum.as_ref().and_then(|sum| predicted(m, sum)),
                });
            }
            o
        })
        .collect();
    serde_json::json!({ "chip": chip, "adapter": adapter, "pipelines": items })
}

/// `--search`: every fitting tile candidate of the blocks and coop kernels the planner picks at
/// `--head-dims`, in f16 and f32, compiled, in the one vocabulary of every compiler (`Summary`;
/// `cycles` is ACO's latency, NAK's static cycles or AGX's ALU estimate, `predicted` the
/// modelled fraction of peak where the compiler has a model).
fn search(ctx: &Context, a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    use flash_attn_wgpu::unstable::kernels::tiles::{tile_candidates, workgroup_words};
    let mut env = ctx.plan_env();
    if let Some(b) = a.storage_cap {
        env.caps.max_workgroup_storage_bytes = env.caps.max_workgroup_storage_bytes.min(b);
    }
    if let Some(f) = a.private_floats {
        env.caps.private_floats = f;
    }
    println!(
        "| kernel | dtype | d | br | bc | tpr | rpt | shared B | regs | spills | scratch B | \
         occupancy | cycles | predicted | per block (no mask / mask) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for dtype in [DType::F16, DType::F32] {
        for &d in &a.head_dims {
            let mut cfg = AttentionConfig::new(1, 512, 512, 8, 2, d);
            cfg.causal = true;
            let mut keys = plan::forward(&cfg, dtype, &env)?
                .steps
                .iter()
                .map(|s| s.key)
                .collect::<Vec<_>>();
            keys.extend(
                plan::backward(&cfg, dtype, &env)?
                    .steps
                    .iter()
                    .map(|s| s.key),
            );
            let d = d as u32;
            let mut seen = BTreeSet::new();
            let searched = |k: &KernelKey| k.kernel.is_blocks_variant() || k.kernel.is_coop();
            for key in keys.into_iter().filter(searched) {
                for t in tile_candidates(key.kernel, d, env.caps)? {
                    let words = workgroup_words(key.kernel, d, t);
                    if words * 4 > env.caps.max_workgroup_storage_bytes
                        || t.threads(key.kernel) > env.caps.max_invocations_per_workgroup
                        || !seen.insert((key.kernel.name(), t.br, t.bc, t.tpr, t.rpt))
                    {
                        continue;
                    }
                    let k = KernelKey { tiles: t, ..key };
                    let r = ctx.compiler_statistics(&k)?;
                    let sum = r.summary();
                    let share = mix_of(&r)
                        .and_then(|m| predicted(&m, &sum))
                        .map_or("-".into(), |p| format!("{p:.2}"));
                    let block = block_cell(blocks_of(ctx, &k, &r).as_ref(), &sum);
                    println!(
                        "| {} | {:?} | {d} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {share} | {block} |",
                        pass_name(&k),
                        k.elem,
                        t.br,
                        t.bc,
                        t.tpr,
                        t.rpt,
                        words * 4,
                        cell(sum.registers),
                        cell(sum.spills),
                        cell(sum.scratch_bytes),
                        cell(sum.occupancy),
                        cell(sum.cycles),
                    );
                }
            }
        }
    }
    Ok(())
}

/// `--raw`: what the driver reports for `key`, unmapped.
fn raw(ctx: &Context, key: &KernelKey, dir: Option<&str>) -> std::io::Result<()> {
    println!("## {}", key.label());
    match ctx.compiler_statistics(key) {
        Err(e) => println!("compile failed: {e}"),
        Ok(rep) => {
            println!(
                "executable: {} (subgroup {})",
                rep.executable, rep.subgroup_size
            );
            for ((name, value), d) in rep.statistics.iter().zip(&rep.descriptions) {
                println!("  {name:?} = {value:?}  // {d}");
            }
            for (name, text) in &rep.representations {
                println!(
                    "  representation {name:?}: {} lines, {} B",
                    text.lines().count(),
                    text.len()
                );
                if let Some(dir) = dir {
                    let file: String = format!("{} {name}", key.label())
                        .chars()
                        .map(|c| {
                            if c.is_ascii_alphanumeric() || c == '.' {
                                c
                            } else {
                                '_'
                            }
                        })
                        .collect();
                    std::fs::create_dir_all(dir)?;
                    std::fs::write(format!("{dir}/{file}.txt"), text)?;
                }
            }
        }
    }
    Ok(())
}
