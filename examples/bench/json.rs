//! Every record as JSON (serde): an array with one object per line, `"key": value` pairs
//! separated by `, `, a layout a line-oriented tool can grep (`"median_ms": [0-9]`,
//! `"note": "skipped`). Values that are missing or not finite are null.

use std::io;

use flash_attn_wgpu::{Roofline, Tuning};
use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};

use crate::grid::Record;
use crate::model::{alg_name, bw_fraction};

/// One record as written; the field order is the key order.
#[derive(Serialize)]
struct JsonRecord<'a> {
    algorithm: &'static str,
    dtype: &'static str,
    pass: &'static str,
    batch: usize,
    heads_q: usize,
    heads_kv: usize,
    seq_q: usize,
    seq_kv: usize,
    head_dim: usize,
    causal: bool,
    /// the window's sides (null: unbounded, or no window)
    window_left: Option<usize>,
    window_right: Option<usize>,
    softcap: Option<f32>,
    /// a user score modifier (`ScoreMod`) on the point
    score_mod: bool,
    alibi: bool,
    sinks: bool,
    /// the dropout probability (null: off)
    dropout: Option<f32>,
    /// the block mask's block size and fraction of blocks on (null: off)
    block_size: Option<usize>,
    block_density: Option<f64>,
    /// the boolean mask's fraction of pairs on (null: off)
    mask_density: Option<f64>,
    median_ms: Option<f64>,
    min_ms: Option<f64>,
    max_ms: Option<f64>,
    gflops: Option<f64>,
    fma_roofline_fraction: Option<f64>,
    bandwidth_roofline_fraction: Option<f64>,
    speedup_naive_over_tiled: Option<f64>,
    vs_f32: Option<f64>,
    bytes_allocated: Option<u64>,
    bytes_allocated_plan: Option<u64>,
    bytes_moved_model: f64,
    timestamps: Option<bool>,
    /// [kernel name, median ms] for each kernel of the pass
    kernels_ms: &'a [(&'static str, f64)],
    variant: &'static str,
    half_storage: String,
    roofline_fma_gflops: f64,
    roofline_fma_f16_gflops: Option<f64>,
    roofline_coop_f16_gflops: Option<f64>,
    coop_roofline_fraction: Option<f64>,
    roofline_copy_gbps: f64,
    adapter: &'a str,
    note: &'a str,
}

impl<'a> JsonRecord<'a> {
    fn new(r: &'a Record, adapter: &'a str, roof: &Roofline, tuning: &Tuning) -> Self {
        let c = &r.cfg;
        JsonRecord {
            algorithm: alg_name(r.algorithm),
            dtype: r.dtype.name(),
            pass: r.pass.name(),
            batch: c.batch,
            heads_q: c.heads_q,
            heads_kv: c.heads_kv,
            seq_q: c.seq_q,
            seq_kv: c.seq_kv,
            head_dim: c.head_dim,
            causal: c.causal,
            window_left: c.window.left,
            window_right: c.window.right,
            softcap: c.softcap,
            score_mod: c.score_mod.is_some(),
            alibi: c.alibi_slopes.is_some(),
            sinks: c.sinks.is_some(),
            dropout: c.dropout.map(|d| d.p),
            block_size: c.block_mask.as_ref().map(|m| m.block_q),
            block_density: c.block_mask.as_ref().map(|m| m.density()),
            mask_density: c.mask.as_ref().map(|m| m.density()),
            median_ms: r.median_ms,
            min_ms: r.min_ms,
            max_ms: r.max_ms,
            gflops: r.gflops,
            fma_roofline_fraction: r.gflops.map(|g| g / roof.fma_gflops),
            bandwidth_roofline_fraction: r
                .median_ms
                .map(|ms| bw_fraction(r.bytes_moved_model, ms, roof)),
            speedup_naive_over_tiled: r.speedup,
            vs_f32: r.vs_f32,
            bytes_allocated: r.bytes_allocated,
            bytes_allocated_plan: r.bytes_allocated_plan,
            bytes_moved_model: r.bytes_moved_model,
            timestamps: r.timestamps,
            kernels_ms: &r.kernels_ms,
            variant: r.variant.map_or("none", |v| v.name()),
            half_storage: format!("{:?}", tuning.half_storage),
            roofline_fma_gflops: roof.fma_gflops,
            roofline_fma_f16_gflops: roof.fma_f16_gflops,
            roofline_coop_f16_gflops: roof.coop_f16_gflops,
            coop_roofline_fraction: r
                .gflops
                .zip(roof.coop_f16_gflops)
                .filter(|_| r.variant == Some(flash_attn_wgpu::Variant::Coop))
                .map(|(g, peak)| g / peak),
            roofline_copy_gbps: roof.copy_gbps,
            adapter,
            note: &r.note,
        }
    }
}

pub fn to_json(
    records: &[Record],
    adapter: &str,
    roof: &Roofline,
    tuning: &Tuning,
) -> serde_json::Result<String> {
    let rows: Vec<JsonRecord> = records
        .iter()
        .map(|r| JsonRecord::new(r, adapter, roof, tuning))
        .collect();
    let mut out = Vec::new();
    rows.serialize(&mut Serializer::with_formatter(&mut out, OneRecordPerLine))?;
    out.push(b'\n');
    Ok(String::from_utf8(out).expect("serde_json writes UTF-8"))
}

/// serde_json's compact layout with a line per array element and a space after `:` and `,`;
/// numbers as Rust's `Display` writes them (shortest round trip, no exponent, `3` not `3.0`).
struct OneRecordPerLine;

impl Formatter for OneRecordPerLine {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        w.write_all(if first { b"\n  " } else { b",\n  " })
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b"\n]")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        write!(w, "{value}")
    }
}
