//! What a GPU vendor's shader compiler makes of the kernels (issue 62): the pipelines the
//! library plans on this adapter, each compiled by the driver, with the statistics it reports
//! (registers, spills, scratch, workgroup memory, waves per SIMD, instructions) and, where it
//! gives the disassembly (AMD), the mix of each kernel's inner loop. Written as JSON and as a
//! markdown table; `--check` fails on a compile failure, on spills or scratch in a kernel the
//! planner picks, and on occupancy below the floors of docs/log/compilers.md.
//!
//! ```text
//! # AMD's compiler without an AMD GPU (Mesa's no-op DRM shim; scripts/compiler-stats.sh):
//! bash scripts/compiler-stats.sh navi31 --check
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
use flash_attn_wgpu::device::isa::{inner_loop, Mix};
use flash_attn_wgpu::device::statistics::PipelineReport;
use flash_attn_wgpu::unstable::kernels::enumerate::{pipeline_keys, Device};
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
    /// Where the driver offers no statistics (`Unsupported`: lavapipe, a driver without
    /// `VK_KHR_pipeline_executable_properties`), say so and succeed: the GPU run's step.
    #[arg(long)]
    or_skip: bool,
    /// Compile every tile candidate of the blocks kernels (forward, dK/dV, dQ) at head dims
    /// 64 and 128 that fits the (capped) workgroup memory, and print what each compiles to:
    /// the data a tile choice for this chip is made from.
    #[arg(long)]
    search: bool,
}

/// One pipeline: its key, whether the planner picks it on this adapter, and the report.
struct Row {
    key: KernelKey,
    planned: bool,
    report: Result<PipelineReport, String>,
    mix: Option<Mix>,
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
    let ctx = Context::for_compiler_statistics()?;
    let info = ctx.adapter_info().clone();
    let chip = a.chip.clone().unwrap_or_else(|| info.name.clone());
    eprintln!("compiler_stats: {info}");
    if a.search {
        search(&ctx, a)?;
        return Ok(true);
    }
    let pick = ctx.tuning();
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
            if variant != pick.variant {
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
            let mix = report
                .as_ref()
                .ok()
                .and_then(|r| r.representation("assembly"))
                .map(inner_loop);
            Row {
                key,
                planned,
                report,
                mix,
            }
        })
        .collect();
    let wave64 = info.subgroup_min_size == 64 && info.subgroup_max_size == 64;
    let failures = check(&rows, wave64);
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
    for f in &failures {
        eprintln!("compiler_stats: {chip}: {f}");
    }
    eprintln!(
        "compiler_stats: {chip}: {} pipelines compiled, {} planned, {} failures of the checks",
        rows.len(),
        rows.iter().filter(|r| r.planned).count(),
        failures.len()
    );
    Ok(!a.check || failures.is_empty())
}

/// The waves per SIMD a planned attention kernel must reach (docs/log/compilers.md,
/// "Floors"): what the kernels reach today, so that a change that loses occupancy fails. On a
/// wave64 GPU (GCN, Vega, CDNA: `wave64`) two, but dK/dV past head dim 64 (one: its K and V
/// tiles leave no 16 x 16 tile within the 32 KiB two workgroups a compute unit need); on
/// RDNA two, and four for the coop kernels.
fn floor(wave64: bool, key: &KernelKey) -> u64 {
    match key.kernel {
        Kernel::Flash(_, Pass::DkDv) if wave64 && key.head_dim > 64 => 1,
        Kernel::Flash(Variant::Coop, _) => 4,
        _ => 2,
    }
}

/// What `--check` fails on, one line each.
fn check(rows: &[Row], wave64: bool) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        let label = r.key.label();
        let rep = match &r.report {
            Ok(rep) => rep,
            Err(e) => {
                out.push(format!("{label}: does not compile: {e}"));
                continue;
            }
        };
        if !r.planned {
            continue;
        }
        let stat = |n: &str| rep.get(n).unwrap_or(0.0);
        let (sv, ss, scratch) = (
            stat("Spilled VGPRs"),
            stat("Spilled SGPRs"),
            stat("Scratch size"),
        );
        if sv + ss + scratch > 0.0 {
            out.push(format!(
                "{label}: spills {sv} VGPRs and {ss} SGPRs, {scratch} B of scratch"
            ));
        }
        if attention(r.key.kernel) {
            if let Some(waves) = rep.get("Subgroups per SIMD") {
                let want = floor(wave64, &r.key);
                if (waves as u64) < want {
                    out.push(format!("{label}: {waves} waves per SIMD, floor {want}"));
                }
            }
        }
    }
    out
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

/// The markdown table: a row a pipeline, planned first.
fn markdown(chip: &str, adapter: &str, rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### {chip}\n\n{adapter}\n");
    let _ = writeln!(
        s,
        "| kernel | dtype | d | planned | wave | VGPRs | SGPRs | spills | scratch B | LDS B | waves/SIMD | instr | inner loop: math / LDS loads (widths) / other VALU / SALU / waits | predicted fraction of peak |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
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
                    "{head} compile failed: {} |||||||||",
                    e.replace('|', "/")
                );
            }
            Ok(rep) => {
                let g = |n: &str| rep.get(n).map_or("-".into(), |v| format!("{v}"));
                let (mix, share) = match &r.mix {
                    Some(m) => (
                        format!(
                            "{}{} / {} ({}) / {} / {} / {}",
                            m.matrix + m.fma,
                            if m.matrix > 0 {
                                format!(" ({} WMMA)", m.matrix)
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
                        format!("{:.2}", predicted(m, rep)),
                    ),
                    None => ("-".into(), "-".into()),
                };
                let spills = rep.get("Spilled VGPRs").unwrap_or(0.0)
                    + rep.get("Spilled SGPRs").unwrap_or(0.0);
                let _ = writeln!(
                    s,
                    "{head} {} | {} | {} | {spills} | {} | {} | {} | {} | {mix} | {share} |",
                    rep.subgroup_size,
                    g("VGPRs"),
                    g("SGPRs"),
                    g("Scratch size"),
                    g("LDS size"),
                    g("Subgroups per SIMD"),
                    g("Instructions"),
                );
            }
        }
    }
    s
}

/// Cycles a matrix instruction keeps a SIMD busy, in VALU issue cycles (RDNA3's 16x16x16 f16
/// WMMA: 8,192 FLOPs at 256 a cycle).
const MATRIX_CYCLES: f64 = 32.0;

/// Waves a SIMD needs to hide memory latency, in the model: fewer scale the prediction down.
const WAVES_TO_HIDE_LATENCY: f64 = 4.0;

/// The fraction of the chip's peak a kernel's inner loop and occupancy predict (the model of
/// docs/log/compilers.md): the loop's mix (`Mix::predicted_fraction`) times the share of the
/// waves that latency hiding wants.
fn predicted(m: &Mix, rep: &PipelineReport) -> f64 {
    let waves = rep
        .get("Subgroups per SIMD")
        .unwrap_or(WAVES_TO_HIDE_LATENCY);
    m.predicted_fraction(MATRIX_CYCLES) * (waves / WAVES_TO_HIDE_LATENCY).min(1.0)
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
                    o["statistics"] = rep
                        .statistics
                        .iter()
                        .map(|(n, v)| (n.clone(), serde_json::json!(v.as_f64())))
                        .collect::<serde_json::Map<_, _>>()
                        .into();
                }
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
                    "predicted_fraction": r.report.as_ref().map_or(0.0, |rep| predicted(m, rep)),
                });
            }
            o
        })
        .collect();
    serde_json::json!({ "chip": chip, "adapter": adapter, "pipelines": items })
}

/// `--search`: every fitting tile candidate of the blocks kernels, compiled.
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
        "| kernel | d | br | bc | tpr | rpt | LDS B | VGPRs | spills | waves/SIMD | predicted |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut cfg = AttentionConfig::new(1, 512, 512, 8, 2, 64);
    cfg.causal = true;
    for d in [64u32, 128] {
        cfg.head_dim = d as usize;
        let mut keys = plan::forward(&cfg, DType::F16, &env)?
            .steps
            .iter()
            .map(|s| s.key)
            .collect::<Vec<_>>();
        keys.extend(
            plan::backward(&cfg, DType::F16, &env)?
                .steps
                .iter()
                .map(|s| s.key),
        );
        for key in keys.into_iter().filter(|k| k.kernel.is_blocks_variant()) {
            for t in tile_candidates(key.kernel, d, env.caps)? {
                let words = workgroup_words(key.kernel, d, t);
                if words * 4 > env.caps.max_workgroup_storage_bytes
                    || t.threads(key.kernel) > env.caps.max_invocations_per_workgroup
                {
                    continue;
                }
                let k = KernelKey { tiles: t, ..key };
                let r = ctx.compiler_statistics(&k)?;
                let g = |n: &str| r.get(n).unwrap_or(0.0);
                let share = r
                    .representation("assembly")
                    .map(inner_loop)
                    .map_or(0.0, |m| predicted(&m, &r));
                println!(
                    "| {} | {d} | {} | {} | {} | {} | {} | {} | {} | {} | {share:.2} |",
                    pass_name(&k),
                    t.br,
                    t.bc,
                    t.tpr,
                    t.rpt,
                    g("LDS size"),
                    g("VGPRs"),
                    g("Spilled VGPRs"),
                    g("Subgroups per SIMD")
                );
            }
        }
    }
    Ok(())
}
