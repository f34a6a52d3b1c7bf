//! Runtime and memory against sequence length, log-log, as SVG (plotters).

use flash_attn_wgpu::{Algorithm, DType, Variant};

use crate::grid::Record;
use crate::model::{alg_label, Pass};

/// Which (B, H, D, causal) the plot shows.
#[derive(Debug, Clone, Copy)]
pub struct Slice {
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub causal: bool,
}

/// One plotted line: its legend name, style and points (N, value).
struct Series {
    name: String,
    algorithm: Algorithm,
    variant: Option<Variant>,
    dtype: DType,
    pass: Pass,
    points: Vec<(f64, f64)>,
}

/// Colour by dtype (hue) and pass (light: fwd, dark: fwdbwd); the naive algorithm is dashed
/// with triangles, tiled solid with circles (blocks), squares (lanes) or crosses (rows).
fn series_color(dtype: DType, pass: Pass) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    match (dtype, pass) {
        (DType::F32, Pass::Fwd) => RGBColor(0x6b, 0xae, 0xd6),
        (DType::F32, Pass::FwdBwd) => RGBColor(0x08, 0x51, 0x9c),
        (DType::F16, Pass::Fwd) => RGBColor(0x74, 0xc4, 0x76),
        (DType::F16, Pass::FwdBwd) => RGBColor(0x00, 0x6d, 0x2c),
        (DType::BF16, Pass::Fwd) => RGBColor(0xfd, 0x8d, 0x3c),
        (DType::BF16, Pass::FwdBwd) => RGBColor(0xa6, 0x36, 0x03),
    }
}

/// 1-2-5 ticks covering `lo..hi` (powers of ten only when that would be too many).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let pick = |mantissas: &[f64]| -> Vec<f64> {
        (e0..=e1)
            .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| *v >= lo && *v <= hi)
            .collect()
    };
    let ticks = pick(&[1.0, 2.0, 5.0]);
    if ticks.len() > 12 {
        pick(&[1.0])
    } else {
        ticks
    }
}

/// Runtime and memory against sequence length, log-log, one line per (algorithm, dtype,
/// pass): the paper's Figure 3 on this adapter.
pub fn plot_svg(
    path: &std::path::Path,
    records: &[Record],
    adapter: &str,
    slice: Slice,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let in_slice: Vec<&Record> = records
        .iter()
        .filter(|r| {
            r.cfg.batch == slice.batch
                && r.cfg.heads_q == slice.heads
                && r.cfg.head_dim == slice.head_dim
                && r.cfg.causal == slice.causal
        })
        .collect();
    // Every (algorithm, dtype, pass) in the slice, in measurement order, so both panels and the
    // legend agree.
    let mut names: Vec<(Algorithm, Option<Variant>, DType, Pass)> = Vec::new();
    for r in &in_slice {
        let key = (r.algorithm, r.variant, r.dtype, r.pass);
        if !names.contains(&key) {
            names.push(key);
        }
    }
    let series = |value: &dyn Fn(&Record) -> Option<f64>| -> Vec<Series> {
        names
            .iter()
            .map(|&(algorithm, variant, dtype, pass)| {
                let mut points: Vec<(f64, f64)> = in_slice
                    .iter()
                    .filter(|r| {
                        (r.algorithm, r.variant, r.dtype, r.pass)
                            == (algorithm, variant, dtype, pass)
                    })
                    .filter_map(|r| {
                        value(r)
                            .filter(|v| *v > 0.0 && v.is_finite())
                            .map(|v| (r.cfg.seq_q as f64, v))
                    })
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: format!(
                        "{} {} {}",
                        alg_label(algorithm, variant),
                        dtype,
                        pass.name()
                    ),
                    algorithm,
                    variant,
                    dtype,
                    pass,
                    points,
                }
            })
            .collect()
    };
    let panels: [(&str, &str, Vec<Series>); 2] = [
        ("runtime (median GPU time)", "ms", series(&|r| r.median_ms)),
        (
            "device memory allocated beyond the inputs",
            "MiB",
            series(&|r| r.bytes_allocated.map(|b| b as f64 / 1048576.0)),
        ),
    ];

    let root = SVGBackend::new(path, (1500, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "flash-attn-wgpu on {adapter}: B={} H={} D={} {}",
        slice.batch,
        slice.heads,
        slice.head_dim,
        if slice.causal { "causal" } else { "non-causal" }
    );
    let root = root.titled(&title, ("sans-serif", 22))?;
    let (charts, legend) = root.split_horizontally(1270);
    let areas = charts.split_evenly((1, 2));
    for (area, (title, unit, series)) in areas.iter().zip(panels.iter()) {
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in series.iter().flat_map(|s| s.points.iter()) {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (1.0, 2.0, 1.0, 10.0);
        }
        let mut ns: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        ns.sort_by(|a, b| a.total_cmp(b));
        ns.dedup();
        let (ylo, yhi) = (y0 / 1.5, y1 * 1.5);
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{title}, log-log"), ("sans-serif", 18))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x0 / 1.25..x1 * 1.25).log_scale().with_key_points(ns),
                (ylo..yhi).log_scale().with_key_points(log_ticks(ylo, yhi)),
            )?;
        chart
            .configure_mesh()
            .x_desc("sequence length N")
            .y_desc(*unit)
            .x_label_formatter(&|x| format!("{}", x.round() as u64))
            .y_label_formatter(&|y| short_number(*y))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .bold_line_style(RGBColor(215, 215, 215))
            .light_line_style(TRANSPARENT)
            .draw()?;
        for s in series.iter().filter(|s| !s.points.is_empty()) {
            let color = series_color(s.dtype, s.pass);
            let line = color.stroke_width(2);
            let pts = s.points.iter().copied();
            match (s.algorithm, s.variant) {
                (Algorithm::Tiled, Some(Variant::Coop)) => {
                    chart.draw_series(LineSeries::new(pts.clone(), line))?;
                    chart.draw_series(pts.map(|p| {
                        EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], color.filled())
                    }))?;
                }
                (Algorithm::Tiled, Some(Variant::Rows)) => {
                    chart.draw_series(LineSeries::new(pts.clone(), line))?;
                    chart.draw_series(pts.map(|p| Cross::new(p, 4, color.stroke_width(2))))?;
                }
                (Algorithm::Tiled, _) => {
                    chart.draw_series(LineSeries::new(pts.clone(), line))?;
                    chart.draw_series(pts.map(|p| Circle::new(p, 4, color.filled())))?;
                }
                (Algorithm::Naive, _) => {
                    chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, line))?;
                    chart.draw_series(pts.map(|p| TriangleMarker::new(p, 5, color.filled())))?;
                }
            }
        }
    }
    // One legend for both panels, beside them.
    let legend = legend.margin(70, 10, 5, 5);
    legend.draw(&Text::new(
        "series (algorithm dtype pass)",
        (0, 0),
        ("sans-serif", 14),
    ))?;
    for (i, s) in panels[0].2.iter().enumerate() {
        let y = 28 + 24 * i as i32;
        let color = series_color(s.dtype, s.pass);
        let line = color.stroke_width(2);
        match (s.algorithm, s.variant) {
            (Algorithm::Tiled, Some(Variant::Coop)) => {
                legend.draw(&PathElement::new(vec![(0, y), (36, y)], line))?;
                legend.draw(&Rectangle::new([(14, y - 4), (22, y + 4)], color.filled()))?;
            }
            (Algorithm::Tiled, Some(Variant::Rows)) => {
                legend.draw(&PathElement::new(vec![(0, y), (36, y)], line))?;
                legend.draw(&Cross::new((18, y), 4, color.stroke_width(2)))?;
            }
            (Algorithm::Tiled, _) => {
                legend.draw(&PathElement::new(vec![(0, y), (36, y)], line))?;
                legend.draw(&Circle::new((18, y), 4, color.filled()))?;
            }
            (Algorithm::Naive, _) => {
                legend.draw(&PathElement::new(vec![(0, y), (12, y)], line))?;
                legend.draw(&PathElement::new(vec![(24, y), (36, y)], line))?;
                legend.draw(&TriangleMarker::new((18, y), 5, color.filled()))?;
            }
        }
        legend.draw(&Text::new(s.name.clone(), (46, y - 7), ("sans-serif", 14)))?;
    }
    root.present()?;
    Ok(())
}

/// Tick labels: 0.005, 0.5, 2, 250, 12k ...
fn short_number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 10.0 || (v - v.round()).abs() < 1e-9 * a {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        let digits = (-a.log10() - 1e-9).ceil() as usize;
        format!("{v:.digits$}")
    }
}
