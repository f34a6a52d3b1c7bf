//! Every record as JSON, one object per line (scripts/gpu-check.sh greps it).

use std::fmt::Write as _;

use flash_attn_wgpu::Roofline;

use crate::grid::Record;
use crate::model::{alg_name, bw_fraction};

fn json_num(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or("null".into(), |x| format!("{x}"))
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn to_json(
    records: &[Record],
    adapter: &str,
    roof: &Roofline,
    tuning: &flash_attn_wgpu::Tuning,
) -> String {
    let mut s = String::from("[\n");
    for (n, r) in records.iter().enumerate() {
        let c = &r.cfg;
        let _ = writeln!(
            s,
            "  {{\"algorithm\": \"{}\", \"dtype\": \"{}\", \"pass\": \"{}\", \"batch\": {}, \"heads_q\": {}, \
             \"heads_kv\": {}, \"seq_q\": {}, \"seq_kv\": {}, \"head_dim\": {}, \"causal\": {}, \
             \"median_ms\": {}, \"gflops\": {}, \"fma_roofline_fraction\": {}, \
             \"bandwidth_roofline_fraction\": {}, \"speedup_naive_over_tiled\": {}, \"vs_f32\": {}, \
             \"bytes_allocated\": {}, \"bytes_allocated_plan\": {}, \"bytes_moved_model\": {}, \
             \"timestamps\": {}, \"variant\": \"{:?}\", \"half_storage\": \"{:?}\", \
             \"roofline_fma_gflops\": {}, \"roofline_copy_gbps\": {}, \"adapter\": {}, \"note\": {}}}{}",
            alg_name(r.algorithm),
            r.dtype.name(),
            r.pass.name(),
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
            json_num(r.speedup),
            json_num(r.vs_f32),
            r.bytes_allocated.map_or("null".into(), |b| b.to_string()),
            r.bytes_allocated_plan.map_or("null".into(), |b| b.to_string()),
            r.bytes_moved_model,
            r.timestamps.map_or("null".into(), |t| t.to_string()),
            tuning.variant,
            tuning.half_storage,
            roof.fma_gflops,
            roof.copy_gbps,
            json_str(adapter),
            json_str(&r.note),
            if n + 1 < records.len() { "," } else { "" }
        );
    }
    s.push_str("]\n");
    s
}
