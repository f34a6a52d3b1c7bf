//! What the bench prints: the adapter details (--info), the preamble of a run, and the table of
//! records, as text (one row as each record is made) and as Markdown.

use std::fmt::Write as _;

use flash_attn_wgpu::unstable::kernels::{workgroup_words, Kernel, Pass};
use flash_attn_wgpu::{Context, Error, Roofline, Tuning};

use crate::grid::{Grid, Record};
use crate::model::{alg_label, bw_fraction};

/// --info: the adapter's limits and the default tuning's tiles at D = 64 and 128.
pub fn print_info(ctx: &Context, default_tuning: Tuning) -> Result<(), Error> {
    let info = ctx.adapter_info();
    println!(
        "limits: max buffer {} MiB, storage buffers per stage {}, invocations per workgroup {}, \
         workgroups per dimension {}",
        info.max_buffer_bytes >> 20,
        info.max_storage_buffers_per_stage,
        info.max_invocations_per_workgroup,
        info.max_workgroups_per_dimension
    );
    for d in [64usize, 128] {
        let v = default_tuning.variant;
        let (f, kv, q) = (
            ctx.tiles_for(Kernel::Flash(v, Pass::Forward), d)?,
            ctx.tiles_for(Kernel::Flash(v, Pass::DkDv), d)?,
            ctx.tiles_for(Kernel::Flash(v, Pass::Dq), d)?,
        );
        println!(
            "tiles at D={d}: forward {}x{}, dK/dV {}x{}, dQ {}x{}",
            f.br, f.bc, kv.bc, kv.br, q.br, q.bc
        );
    }
    Ok(())
}

/// Before the rows: the tuning, the tiles at each head dimension, the roofline, the FLOP
/// convention, what the columns mean, and the table header.
pub fn print_preamble(
    ctx: &Context,
    tuning: &Tuning,
    grid: &Grid,
    roof: &Roofline,
) -> Result<(), Error> {
    println!("tuning: {tuning:?}");
    for &variant in &grid.variants {
        let (fwd_kernel, dkdv_kernel, dq_kernel) = (
            Kernel::Flash(variant, Pass::Forward),
            Kernel::Flash(variant, Pass::DkDv),
            Kernel::Flash(variant, Pass::Dq),
        );
        for &d in &grid.head_dims {
            let (tq, tkv, tdq) = (
                ctx.tiles_for(fwd_kernel, d)?,
                ctx.tiles_for(dkdv_kernel, d)?,
                ctx.tiles_for(dq_kernel, d)?,
            );
            println!(
                "{} D={d}: forward tiles {}x{} ({} B workgroup memory), dK/dV {}x{}, dQ {}x{}",
                variant.name(),
                tq.br,
                tq.bc,
                workgroup_words(fwd_kernel, d as u32, tq) * 4,
                tkv.bc,
                tkv.br,
                tdq.br,
                tdq.bc
            );
        }
    }
    println!("roofline (measured): {}", roofline_summary(roof));
    println!("FLOPs: forward 4*B*H*Sq*Sk*D (halved for causal; with a window 4*B*H*D x the visible pairs); backward 2.5x forward; fwdbwd = 3.5x forward");
    println!(
        "repeats={} (median GPU time after one warm-up call, and the min-max of the repeats); %FMA: achieved GFLOP/s over the FMA \
         roofline; %BW: modelled bytes over time over the copy roofline; speedup: naive time over \
         the first variant's tiled time; vs_f32: this dtype's time over f32's",
        grid.repeats
    );
    println!("{}", table_header());
    Ok(())
}

const COLUMNS: [&str; 18] = [
    "pass",
    "causal",
    "B",
    "H",
    "D",
    "seq",
    "alg",
    "dtype",
    "ms",
    "min-max ms",
    "GFLOP/s",
    "%FMA",
    "%BW",
    "speedup",
    "vs_f32",
    "alloc MiB",
    "model MiB",
    "note",
];

fn cells(r: &Record, roof: &Roofline) -> [String; 18] {
    let c = &r.cfg;
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_string(), f);
    [
        r.pass.name().into(),
        {
            let mut cell = if c.causal { "yes" } else { "no" }.to_string();
            if c.window.is_active() {
                let side = |x: Option<usize>| x.map_or("none".to_string(), |v| v.to_string());
                cell += &format!(" w({},{})", side(c.window.left), side(c.window.right));
            }
            if let Some(cap) = c.softcap {
                cell += &format!(" sc{cap}");
            }
            if c.score_mod.is_some() {
                cell += " score_mod";
            }
            if c.mask_mod.is_some() {
                cell += " mask_mod";
            }
            if c.alibi_slopes.is_some() {
                cell += " alibi";
            }
            if c.sinks.is_some() {
                cell += " sinks";
            }
            if let Some(d) = c.dropout {
                cell += &format!(" drop{}", d.p);
            }
            if let Some(m) = &c.block_mask {
                cell += &format!(" blk{}@{:.2}", m.block_q, m.density());
            }
            if let Some(v) = &c.varlen {
                cell += &format!(" varlen{}", v.sequences());
            }
            cell
        },
        c.batch.to_string(),
        if c.heads_kv == c.heads_q {
            c.heads_q.to_string()
        } else {
            format!("{}/{}", c.heads_q, c.heads_kv)
        },
        c.head_dim.to_string(),
        c.seq_q.to_string(),
        alg_label(r.algorithm, r.variant),
        r.dtype.name().into(),
        opt(r.median_ms, &|v| format!("{v:.3}")),
        match (r.min_ms, r.max_ms) {
            (Some(lo), Some(hi)) => format!("{lo:.3}-{hi:.3}"),
            _ => "-".into(),
        },
        opt(r.gflops, &|v| format!("{v:.1}")),
        opt(r.gflops, &|v| format!("{:.1}", 100.0 * v / roof.fma_gflops)),
        opt(r.median_ms, &|ms| {
            format!("{:.1}", 100.0 * bw_fraction(r.bytes_moved_model, ms, roof))
        }),
        opt(r.speedup, &|v| format!("{v:.2}x")),
        opt(r.vs_f32, &|v| format!("{v:.2}")),
        opt(r.bytes_allocated.map(|b| b as f64), &|v| {
            format!("{:.3}", v / 1048576.0)
        }),
        format!("{:.1}", r.bytes_moved_model / 1048576.0),
        r.note.clone(),
    ]
}

const WIDTHS: [usize; 17] = [6, 6, 3, 5, 4, 6, 12, 5, 11, 15, 9, 6, 6, 8, 6, 10, 10];

fn table_header() -> String {
    aligned(COLUMNS.iter().copied())
}

pub fn table_row(r: &Record, roof: &Roofline) -> String {
    aligned(cells(r, roof).iter().map(String::as_str))
}

/// --per-kernel: where a record's GPU time went, kernel by kernel (median ms of each).
pub fn kernels_line(r: &Record) -> String {
    let parts: Vec<String> = r
        .kernels_ms
        .iter()
        .map(|(name, ms)| format!("{name} {ms:.3}"))
        .collect();
    format!("        kernels (ms): {}", parts.join(", "))
}

/// One line of the text table: cells right-aligned to WIDTHS; cells past them (the note) follow.
fn aligned<'a>(cells: impl Iterator<Item = &'a str>) -> String {
    let mut s = String::new();
    for (i, c) in cells.enumerate() {
        match WIDTHS.get(i) {
            Some(&w) => {
                let _ = write!(s, "{c:>w$} ");
            }
            None => {
                let _ = write!(s, " {c}");
            }
        }
    }
    s.trim_end().to_string()
}

pub fn to_markdown(records: &[Record], roof: &Roofline) -> String {
    let mut s = format!("| {} |\n|", COLUMNS.join(" | "));
    for _ in COLUMNS {
        s.push_str("---|");
    }
    s.push('\n');
    for r in records {
        let row: Vec<String> = cells(r, roof)
            .into_iter()
            .map(|c| c.replace('|', "\\|"))
            .collect();
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    s
}

/// The measured ceilings in one line: f32 FMA (what %FMA divides by), f16 FMA where the
/// adapter has it, cooperative matrices where the coop variant runs, and copy bandwidth.
pub fn roofline_summary(roof: &Roofline) -> String {
    let f16 = roof
        .fma_f16_gflops
        .map_or(String::new(), |g| format!(", FMA f16 {g:.1} GFLOP/s"));
    let coop = roof.coop_f16_gflops.map_or(String::new(), |g| {
        format!(", cooperative matrix f16/f32 {g:.1} GFLOP/s")
    });
    format!(
        "FMA {:.1} GFLOP/s{f16}{coop}, copy {:.2} GB/s",
        roof.fma_gflops, roof.copy_gbps
    )
}
