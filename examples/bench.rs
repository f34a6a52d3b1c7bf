//! Tiled (FlashAttention) vs naive attention, side by side in one run, on this adapter.
//!
//! FLOPs: forward 4 * B * H * Sq * Sk * D (halved for causal); backward 2.5x forward.
//!
//! cargo run --release --example bench -- [--seq 256,512,...] [--batch 1] [--heads 8]
//!     [--kv-heads H] [--head-dim 64] [--causal] [--pass fwd|fwdbwd|both]
//!     [--algorithms tiled,naive] [--repeats 5] [--json FILE] [--plot FILE.svg]
//!     [--variant lanes|rows] [--no-subgroup] [--roofline-scale 1.0]

use std::fmt::Write as _;
use std::io::Write as _;

use flash_attn_wgpu::kernels::workgroup_words;
use flash_attn_wgpu::{Algorithm, AttentionConfig, Context, Error, Roofline, Variant};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Pass {
    Fwd,
    FwdBwd,
}

struct Args {
    seqs: Vec<usize>,
    batch: usize,
    heads: usize,
    kv_heads: Option<usize>,
    head_dim: usize,
    causal: bool,
    passes: Vec<Pass>,
    algorithms: Vec<Algorithm>,
    repeats: usize,
    json: Option<String>,
    plot: Option<String>,
    variant: Option<Variant>,
    no_subgroup: bool,
    roofline_scale: f64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        seqs: (8..=14).map(|p| 1usize << p).collect(),
        batch: 1,
        heads: 8,
        kv_heads: None,
        head_dim: 64,
        causal: false,
        passes: vec![Pass::Fwd, Pass::FwdBwd],
        algorithms: vec![Algorithm::Tiled, Algorithm::Naive],
        repeats: 5,
        json: None,
        plot: None,
        variant: None,
        no_subgroup: false,
        roofline_scale: 1.0,
    };
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>, name: &str| -> Result<usize, String> {
        v.ok_or(format!("{name} needs a value"))?
            .parse::<usize>()
            .map_err(|e| format!("{name}: {e}"))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--seq" => {
                a.seqs = it
                    .next()
                    .ok_or("--seq needs a comma list")?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>().map_err(|e| format!("--seq: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--batch" => a.batch = num(it.next(), "--batch")?,
            "--heads" => a.heads = num(it.next(), "--heads")?,
            "--kv-heads" => a.kv_heads = Some(num(it.next(), "--kv-heads")?),
            "--head-dim" => a.head_dim = num(it.next(), "--head-dim")?,
            "--repeats" => a.repeats = num(it.next(), "--repeats")?.max(1),
            "--causal" => a.causal = true,
            "--no-subgroup" => a.no_subgroup = true,
            "--json" => a.json = Some(it.next().ok_or("--json needs a file")?),
            "--plot" => a.plot = Some(it.next().ok_or("--plot needs a file")?),
            "--roofline-scale" => {
                a.roofline_scale = it
                    .next()
                    .ok_or("--roofline-scale needs a value")?
                    .parse()
                    .map_err(|e| format!("--roofline-scale: {e}"))?
            }
            "--pass" => {
                a.passes = match it.next().as_deref() {
                    Some("fwd") => vec![Pass::Fwd],
                    Some("fwdbwd") => vec![Pass::FwdBwd],
                    Some("both") => vec![Pass::Fwd, Pass::FwdBwd],
                    other => return Err(format!("--pass fwd|fwdbwd|both, got {other:?}")),
                }
            }
            "--algorithms" => {
                a.algorithms = it
                    .next()
                    .ok_or("--algorithms needs a list")?
                    .split(',')
                    .map(|s| match s.trim() {
                        "tiled" => Ok(Algorithm::Tiled),
                        "naive" => Ok(Algorithm::Naive),
                        o => Err(format!("unknown algorithm {o}; use tiled,naive")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--variant" => {
                a.variant = match it.next().as_deref() {
                    Some("lanes") => Some(Variant::Lanes),
                    Some("rows") => Some(Variant::Rows),
                    other => return Err(format!("--variant lanes|rows, got {other:?}")),
                }
            }
            "--help" | "-h" => {
                return Err("see the header of examples/bench.rs for the flags".into())
            }
            other => return Err(format!("unknown flag {other}; try --help")),
        }
    }
    Ok(a)
}

/// FLOPs by the convention of the FlashAttention papers.
fn flops(cfg: &AttentionConfig, pass: Pass) -> f64 {
    let f = 4.0
        * (cfg.batch * cfg.heads_q) as f64
        * cfg.seq_q as f64
        * cfg.seq_kv as f64
        * cfg.head_dim as f64;
    let f = if cfg.causal { f / 2.0 } else { f };
    match pass {
        Pass::Fwd => f,
        Pass::FwdBwd => 3.5 * f,
    }
}

/// Global-memory bytes each algorithm moves by design (f32), as in the paper's IO analysis:
/// the naive path writes and rereads the seq_q x seq_kv matrices; the tiled path reads K and V
/// once per Q tile (and Q, dO once per K/V tile in the dK/dV kernel) and nothing quadratic.
fn bytes_moved_model(
    cfg: &AttentionConfig,
    alg: Algorithm,
    pass: Pass,
    tiles_q: u32,
    tiles_kv: u32,
) -> f64 {
    let (bh, sq, sk, d) = (
        (cfg.batch * cfg.heads_q) as f64,
        cfg.seq_q as f64,
        cfg.seq_kv as f64,
        cfg.head_dim as f64,
    );
    let vis = if cfg.causal { 0.5 } else { 1.0 };
    let fwd = match alg {
        // S = QK^T: read Q, K, write S; softmax: read S, write P; O = PV: read P, V, write O
        Algorithm::Naive => {
            sq * d + sk * d + sq * sk + sq * sk + sq * sk + sq * sk + sk * d + sq * d
        }
        // Q once, K and V once per Q tile (the visible part), O and lse once
        Algorithm::Tiled => {
            sq * d + (sq / tiles_q as f64).ceil() * 2.0 * sk * d * vis + sq * d + sq
        }
    };
    let bwd = match alg {
        // delta; P from Q, K, lse; dP from dO, V; dS from P, dP; dK, dV from P, dS, Q, dO; dQ
        Algorithm::Naive => {
            3.0 * sq * d
                + (2.0 * sq * d + sq * sk)
                + (sq * d + sk * d + sq * sk)
                + 3.0 * sq * sk
                + (2.0 * sq * sk + 2.0 * sq * d + 2.0 * sk * d)
                + (sq * sk + sk * d + sq * d)
        }
        Algorithm::Tiled => {
            3.0 * sq * d
                + 4.0 * sk * d
                + (sk / tiles_kv as f64).ceil() * (2.0 * sq * d + 2.0 * sq) * vis
                + 3.0 * sq * d
                + 2.0 * sq
                + (sq / tiles_q as f64).ceil() * 2.0 * sk * d * vis
        }
    };
    4.0 * bh
        * match pass {
            Pass::Fwd => fwd,
            Pass::FwdBwd => fwd + bwd,
        }
}

struct Record {
    algorithm: Algorithm,
    pass: Pass,
    cfg: AttentionConfig,
    median_ms: Option<f64>,
    gflops: Option<f64>,
    bytes_allocated: Option<u64>,
    bytes_moved_model: f64,
    note: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs one (algorithm, pass, size) point: warm-up, then `repeats` timed calls. Returns the
/// median GPU seconds and the device bytes the call allocated beyond its inputs.
fn measure(
    ctx: &Context,
    cfg: &AttentionConfig,
    pass: Pass,
    repeats: usize,
    seed: u64,
) -> Result<(f64, u64), Error> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut random =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let q = ctx.upload(
        &random(cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim),
        &cfg.q_shape(),
    )?;
    let k = ctx.upload(
        &random(cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim),
        &cfg.kv_shape(),
    )?;
    let v = ctx.upload(
        &random(cfg.batch * cfg.seq_kv * cfg.heads_kv * cfg.head_dim),
        &cfg.kv_shape(),
    )?;
    let d_out = ctx.upload(
        &random(cfg.batch * cfg.seq_q * cfg.heads_q * cfg.head_dim),
        &cfg.q_shape(),
    )?;
    let inputs = ctx.memory_stats().live_bytes;
    let mut times = Vec::with_capacity(repeats);
    let mut allocated = 0;
    for rep in 0..=repeats {
        ctx.reset_peak_memory();
        let f = ctx.forward(cfg, &q, &k, &v)?;
        let mut t = ctx.last_gpu_timing().map_or(0.0, |t| t.seconds);
        if pass == Pass::FwdBwd {
            let g = ctx.backward(cfg, &q, &k, &v, &f.out, &f.lse, &d_out)?;
            t += ctx.last_gpu_timing().map_or(0.0, |t| t.seconds);
            drop(g);
        }
        allocated = ctx.memory_stats().peak_bytes.saturating_sub(inputs);
        if rep > 0 {
            times.push(t);
        }
    }
    Ok((median(times), allocated))
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse_args()?;
    let ctx = Context::new()?;
    let mut tuning = ctx.tuning();
    if let Some(v) = a.variant {
        tuning.variant = v;
    }
    if a.no_subgroup {
        tuning.rows_subgroup = 0;
    }
    ctx.set_tuning(tuning)?;
    eprintln!("measuring the adapter's roofline...");
    let roof: Roofline = ctx.measure_roofline(a.roofline_scale)?;
    let kv_heads = a.kv_heads.unwrap_or(a.heads);
    let fwd_kernel = tuning.variant.forward();
    let dq_kernel = tuning.variant.backward_dq();
    let dkdv_kernel = tuning.variant.backward_dkdv();
    let tq = ctx.tiles_for(fwd_kernel, a.head_dim)?;
    let tkv = ctx.tiles_for(dkdv_kernel, a.head_dim)?;
    let tdq = ctx.tiles_for(dq_kernel, a.head_dim)?;
    let adapter = ctx.adapter_info().name.clone();

    println!("adapter: {}", ctx.adapter_info());
    println!(
        "tuning: {tuning:?}; forward tiles {}x{} ({} B workgroup memory), dK/dV {}x{}, dQ {}x{}",
        tq.br,
        tq.bc,
        workgroup_words(fwd_kernel, a.head_dim as u32, tq) * 4,
        tkv.bc,
        tkv.br,
        tdq.br,
        tdq.bc
    );
    println!(
        "roofline (measured): FMA {:.1} GFLOP/s, copy {:.2} GB/s",
        roof.fma_gflops, roof.copy_gbps
    );
    println!("FLOPs: forward 4*B*H*Sq*Sk*D (halved for causal); backward 2.5x forward; fwdbwd = 3.5x forward");
    println!(
        "B={} H={}/{} D={} causal={} repeats={} (median GPU time)",
        a.batch, a.heads, kv_heads, a.head_dim, a.causal, a.repeats
    );
    println!(
        "{:>6} {:>6} {:>7} {:>11} {:>9} {:>7} {:>7} {:>8} {:>12} {:>12}  note",
        "pass", "seq", "alg", "ms", "GFLOP/s", "%FMA", "%BW", "speedup", "alloc MiB", "model MiB"
    );
    println!("%FMA: achieved GFLOP/s over the FMA roofline; %BW: modelled bytes over time over the copy roofline");

    let total = a.seqs.len() * a.passes.len() * a.algorithms.len();
    let mut done = 0;
    let mut records: Vec<Record> = Vec::new();
    for &pass in &a.passes {
        for &seq in &a.seqs {
            let mut tiled_ms = None;
            for &alg in &a.algorithms {
                done += 1;
                eprint!("\r[{done}/{total}] {pass:?} seq {seq} {alg:?}...          ");
                let _ = std::io::stderr().flush();
                let mut cfg =
                    AttentionConfig::new(a.batch, seq, seq, a.heads, kv_heads, a.head_dim);
                cfg.causal = a.causal;
                cfg.algorithm = alg;
                let (tile_q, tile_kv) = (tq.br, tkv.bc);
                let model = bytes_moved_model(&cfg, alg, pass, tile_q, tile_kv);
                let mut rec = Record {
                    algorithm: alg,
                    pass,
                    cfg: cfg.clone(),
                    median_ms: None,
                    gflops: None,
                    bytes_allocated: None,
                    bytes_moved_model: model,
                    note: String::new(),
                };
                match measure(&ctx, &cfg, pass, a.repeats, seq as u64) {
                    Ok((secs, alloc)) => {
                        rec.median_ms = Some(secs * 1e3);
                        rec.gflops = Some(flops(&cfg, pass) / secs / 1e9);
                        rec.bytes_allocated = Some(alloc);
                        if alg == Algorithm::Tiled {
                            tiled_ms = Some(secs * 1e3);
                        }
                    }
                    Err(Error::DeviceLimit {
                        what,
                        needed,
                        limit,
                        ..
                    }) => {
                        rec.note = format!("device limit: {what} needs {needed} B > {limit} B");
                    }
                    Err(e) => return Err(e.into()),
                }
                let speedup = match (alg, tiled_ms, rec.median_ms) {
                    (Algorithm::Naive, Some(t), Some(n)) => format!("{:.2}x", n / t),
                    _ => String::new(),
                };
                eprint!("\r");
                println!(
                    "{:>6} {:>6} {:>7} {:>11} {:>9} {:>7} {:>7} {:>8} {:>12} {:>12.1}  {}",
                    format!("{pass:?}").to_lowercase(),
                    seq,
                    format!("{alg:?}").to_lowercase(),
                    rec.median_ms.map_or("-".into(), |v| format!("{v:.2}")),
                    rec.gflops.map_or("-".into(), |v| format!("{v:.2}")),
                    rec.gflops.map_or("-".into(), |v| format!(
                        "{:.1}",
                        100.0 * v / roof.fma_gflops
                    )),
                    rec.median_ms.map_or("-".into(), |ms| format!(
                        "{:.1}",
                        100.0 * bw_fraction(model, ms, &roof)
                    )),
                    speedup,
                    rec.bytes_allocated
                        .map_or("-".into(), |v| format!("{:.2}", v as f64 / 1048576.0)),
                    model / 1048576.0,
                    rec.note
                );
                records.push(rec);
            }
        }
    }
    eprintln!();

    if let Some(path) = &a.json {
        std::fs::write(path, to_json(&records, &adapter, &roof))?;
        println!("wrote {path}");
    }
    if let Some(path) = &a.plot {
        std::fs::write(path, to_svg(&records, &adapter))?;
        println!("wrote {path}");
    }
    Ok(())
}

/// Modelled bytes over time, as a fraction of the measured copy bandwidth.
fn bw_fraction(bytes: f64, ms: f64, roof: &Roofline) -> f64 {
    bytes / (ms * 1e-3) / (roof.copy_gbps * 1e9)
}

fn json_num(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or("null".into(), |x| format!("{x}"))
}

fn to_json(records: &[Record], adapter: &str, roof: &Roofline) -> String {
    let mut s = String::from("[\n");
    for (n, r) in records.iter().enumerate() {
        let c = &r.cfg;
        let _ = write!(
            s,
            "  {{\"algorithm\": \"{}\", \"pass\": \"{}\", \"batch\": {}, \"heads_q\": {}, \"heads_kv\": {}, \
             \"seq_q\": {}, \"seq_kv\": {}, \"head_dim\": {}, \"causal\": {}, \"median_ms\": {}, \
             \"gflops\": {}, \"fma_roofline_fraction\": {}, \"bandwidth_roofline_fraction\": {}, \"bytes_allocated\": {}, \"bytes_moved_model\": {}, \
             \"roofline_fma_gflops\": {}, \"roofline_copy_gbps\": {}, \"adapter\": {:?}, \"note\": {:?}}}{}\n",
            format!("{:?}", r.algorithm).to_lowercase(),
            if r.pass == Pass::Fwd { "fwd" } else { "fwdbwd" },
            c.batch,
            c.heads_q,
            c.heads_kv,
            c.seq_q,
            c.seq_kv,
            c.head_dim,
            c.causal,
            json_num(r.median_ms),
            json_num(r.gflops),
            json_num(r.gflops.map(|g| g / roof.fma_gflops)),
            json_num(r.median_ms.map(|ms| bw_fraction(r.bytes_moved_model, ms, roof))),
            r.bytes_allocated.map_or("null".into(), |b| b.to_string()),
            r.bytes_moved_model,
            roof.fma_gflops,
            roof.copy_gbps,
            adapter,
            r.note,
            if n + 1 < records.len() { "," } else { "" }
        );
    }
    s.push_str("]\n");
    s
}

/// Runtime and memory against sequence length, log-log, one line per (algorithm, pass): the
/// paper's Figure 3 on this adapter.
fn to_svg(records: &[Record], adapter: &str) -> String {
    let (w, h, pad) = (1000.0, 420.0, 60.0);
    let panel_w = (w - 3.0 * pad) / 2.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{pad}\" y=\"20\" font-size=\"14\">flash-attn-wgpu on {}: tiled vs naive</text>\n",
        xml(adapter)
    );
    let panels: [(&str, fn(&Record) -> Option<f64>); 2] = [
        ("runtime (ms)", |r| r.median_ms),
        ("memory allocated (MiB)", |r| {
            r.bytes_allocated.map(|b| b as f64 / 1048576.0)
        }),
    ];
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"];
    for (pi, (title, value)) in panels.iter().enumerate() {
        let x0 = pad + pi as f64 * (panel_w + pad);
        let (y0, y1) = (h - pad, 50.0);
        let pts: Vec<(f64, f64)> = records
            .iter()
            .filter_map(|r| {
                value(r)
                    .filter(|v| *v > 0.0)
                    .map(|v| (r.cfg.seq_q as f64, v))
            })
            .collect();
        if pts.is_empty() {
            continue;
        }
        let (xmin, xmax) = pts
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (vmin, vmax) = pts
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let lx = |x: f64| {
            x0 + (x.log2() - xmin.log2()) / (xmax.log2() - xmin.log2()).max(1e-9) * panel_w
        };
        let ly = |v: f64| {
            y0 - (v.log10() - vmin.log10()) / (vmax.log10() - vmin.log10()).max(1e-9) * (y0 - y1)
        };
        let _ = writeln!(s, "<rect x=\"{x0}\" y=\"{y1}\" width=\"{panel_w}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>", y0 - y1);
        let _ = writeln!(
            s,
            "<text x=\"{x0}\" y=\"{}\">{title}, log scale</text>",
            y1 - 8.0
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\">sequence length (log2)</text>",
            x0 + panel_w / 2.0 - 60.0,
            h - 15.0
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\">{vmax:.3}</text><text x=\"{}\" y=\"{}\">{vmin:.3}</text>",
            x0 + 4.0,
            y1 + 14.0,
            x0 + 4.0,
            y0 - 4.0
        );
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for r in records {
            if let Some(v) = value(r).filter(|v| *v > 0.0) {
                let name = format!("{:?} {:?}", r.algorithm, r.pass).to_lowercase();
                match series.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, p)) => p.push((r.cfg.seq_q as f64, v)),
                    None => series.push((name, vec![(r.cfg.seq_q as f64, v)])),
                }
            }
        }
        for (si, (name, p)) in series.iter().enumerate() {
            let color = colors[si % colors.len()];
            let line: Vec<String> = p
                .iter()
                .map(|&(x, v)| format!("{:.1},{:.1}", lx(x), ly(v)))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                line.join(" ")
            );
            for &(x, v) in p {
                let _ = writeln!(
                    s,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>",
                    lx(x),
                    ly(v)
                );
            }
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{name}</text>",
                x0 + 10.0,
                y1 + 30.0 + 16.0 * si as f64
            );
        }
        let mut ticks: Vec<f64> = pts.iter().map(|p| p.0).collect();
        ticks.sort_by(|a, b| a.total_cmp(b));
        ticks.dedup();
        for x in ticks {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" font-size=\"9\">{}</text>",
                lx(x) - 8.0,
                y0 + 14.0,
                x as u64
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
