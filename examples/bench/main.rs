//! Tiled (FlashAttention) vs naive attention, in f32, f16 and bf16, side by side in one run on
//! this adapter, over a grid of batch x heads x head_dim x sequence length x causal.
//!
//! FLOPs: forward 4 * B * H * Sq * Sk * D (halved for causal); backward 2.5x forward.
//!
//! ```text
//! cargo run --release --example bench -- --seq 256,512,1024 --dtype f32,f16,bf16 \
//!     --pass both --json out.json --plot out.svg
//! cargo run --release --example bench -- --help
//! ```
//!
//! Inputs are random f32 in [-1, 1), generated once per shape and rounded to each dtype.
//! When both passes are asked for, one loop of calls measures them: each call runs the forward
//! (its GPU time and peak memory are the `fwd` point) and then the backward (`fwdbwd` is the
//! sum of the two GPU times). Every point gets one warm-up call (pipeline compilation) and
//! then `--repeats` timed calls; the median is reported.
//!
//! `--decode` measures decode steps instead (module `decode`: KV-cache lengths, split-KV against
//! one split, the per-call cost).
//!
//! Modules: `args` (the command line), `grid` (the points, walked under the budget, and their
//! records), `measure` (inputs and the timed calls of one point), `model` (FLOPs and bytes
//! moved by design), `report` (the printed preamble and table, Markdown), `json`, `plot` (SVG).

mod args;
mod decode;
mod grid;
mod json;
mod measure;
mod model;
mod plot;
mod report;
#[path = "../common/stats.rs"]
mod stats;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use flash_attn_wgpu::{Context, Roofline, Tuning};

use args::Args;
use grid::Grid;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    if a.decode {
        return decode::run(&a);
    }
    // Everything the user asked for is checked before the GPU is touched.
    let mut grid = Grid::from_args(&a)?;

    let ctx = Context::new()?;
    ctx.set_gpu_timing(true);
    // the first build is the context's (FLASH_ATTN_COMPILED_FLAGS where set)
    grid.builds[0] = ctx.compiled_flags();
    let default_tuning = ctx.tuning();
    // Variants this adapter cannot run (coop without cooperative matrices) are named and
    // left out; the rest are measured side by side.
    let base = a.tuning(default_tuning);
    grid.variants = a
        .variants(default_tuning.variant)
        .into_iter()
        .filter(
            |&variant| match ctx.set_tuning(Tuning { variant, ..base }) {
                Ok(()) => true,
                Err(e) => {
                    println!("variant {} left out: {e}", variant.name());
                    false
                }
            },
        )
        .collect();
    if grid.variants.is_empty() {
        return Err("no requested variant runs on this adapter".into());
    }
    let tuning = Tuning {
        variant: grid.variants[0],
        ..base
    };
    ctx.set_tuning(tuning)?;
    let adapter = ctx.adapter_info().name.clone();
    println!("adapter: {}", ctx.adapter_info());
    println!("default tuning: {default_tuning:?}");
    if a.info {
        report::print_info(&ctx, default_tuning)?;
        return Ok(());
    }

    eprintln!("measuring the adapter's roofline...");
    let roof: Roofline = ctx.measure_roofline(a.roofline_scale)?;
    report::print_preamble(&ctx, &tuning, &grid, &roof)?;
    // the records so far rewrite the JSON and Markdown after every point: a run killed at its
    // limit (the GPU run's steps) leaves what it measured
    let write_records = |records: &[grid::Record]| -> Result<(), Box<dyn std::error::Error>> {
        if let Some(path) = &a.json {
            write_file(path, &json::to_json(records, &adapter, &roof, &tuning)?)?;
        }
        if let Some(path) = &a.markdown {
            let mut md = format!(
                "Adapter: {}\n\nTuning: {tuning:?}; roofline (measured): {}; \
                 repeats {} (median GPU time after one warm-up call)\n\n",
                ctx.adapter_info(),
                report::roofline_summary(&roof),
                grid.repeats
            );
            md.push_str(&report::to_markdown(records, &roof));
            write_file(path, &md)?;
        }
        Ok(())
    };
    let mut write_failed = None;
    let outcome = grid::run(&ctx, &grid, tuning, |so_far| {
        let Some(rec) = so_far.last() else { return };
        println!("{}", report::table_row(rec, &roof));
        if a.per_kernel && !rec.kernels_ms.is_empty() {
            println!("{}", report::kernels_line(rec));
        }
        if write_failed.is_none() {
            write_failed = write_records(so_far).err();
        }
    })?;
    if let Some(e) = write_failed {
        return Err(e);
    }
    let records = &outcome.records;
    write_records(records)?;
    for path in a.json.iter().chain(&a.markdown) {
        println!("wrote {}", path.display());
    }
    if let Some(path) = &a.plot {
        let slice = plot::Slice {
            batch: first(&a.batch),
            heads: first(&a.heads),
            head_dim: first(&a.head_dim),
            causal: grid.causals[0],
        };
        plot::plot_svg(path, records, &adapter, slice)
            .map_err(|e| format!("plot {}: {e}", path.display()))?;
        println!(
            "wrote {} (B={} H={} D={} {})",
            path.display(),
            slice.batch,
            slice.heads,
            slice.head_dim,
            if slice.causal { "causal" } else { "non-causal" }
        );
    }
    if outcome.failures > 0 {
        return Err(format!("{} points failed (their notes say why)", outcome.failures).into());
    }
    Ok(())
}

/// The first value of a comma list (the plotted slice).
fn first(v: &[usize]) -> usize {
    v.first().copied().unwrap_or(1)
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
