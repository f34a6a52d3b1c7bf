//! The rows kernels' products over the head dimension, generated.
//!
//! On CPU drivers (llvmpipe) a private array stays in registers, or spills as whole vectors,
//! only while every index into it is a constant; an index left dynamic turns each access into
//! a per-lane load or store (docs/PERFORMANCE.md, "Where the rows kernels' time goes"). NIR
//! unrolls a loop only when its trip count and body are small, which holds for two rows per
//! invocation over head_dim 64 but not for four. So these functions are written out, with a
//! literal index in every access, for any RPT and head_dim.
//!
//! Written-out code costs compile time: LLVM's coroutine splitting (llvmpipe's barriers) is
//! slow on long straight-line bodies, and without subgroups (SG = 1) every element is a
//! separate per-lane load, so the body grows SG-fold. Past [`WRITTEN_OUT_MAX`] products per
//! key, and without subgroups, the same functions are emitted as loops instead.
//!
//! The functions read the kernel's own module-scope names (`qr`, `o`, `dor`, `dq_tile`, `kr`,
//! `vr`, `dk_tile`, `dv_tile`, the chunk arrays `kc`, `qc`, `dc`, and the staged tiles), so
//! each kernel gets its own set.

use std::fmt::Write;

/// The most head-dim x row products per key (DPAD x RPT) that are written out.
pub const WRITTEN_OUT_MAX: u32 = 512;

/// One function body over the head dimension in chunks of SG: `chunk` lines once per chunk,
/// then `each` lines for every element of the chunk, then `row` lines for every row of those.
/// Tokens: `{i}` chunk number, `{d0}` its first dim, `{c}` a name suffix for per-chunk values,
/// `{l}` the element within the chunk, `{d}` its dim, `{rr}` the row.
struct Body<'a> {
    chunk: &'a [&'a str],
    each: &'a [&'a str],
    row: &'a [&'a str],
}

struct Shape {
    sg: u32,
    dpad: u32,
    rpt: u32,
    written_out: bool,
}

impl Shape {
    fn new(subgroup: u32, head_dim: u32, rpt: u32) -> Shape {
        let sg = subgroup.max(1);
        let dpad = head_dim.next_multiple_of(sg);
        let rpt = rpt.max(1);
        Shape {
            sg,
            dpad,
            rpt,
            written_out: sg > 1 && dpad * rpt <= WRITTEN_OUT_MAX,
        }
    }

    fn emit(&self, s: &mut String, body: &Body) {
        let fill = |t: &str, i: &str, d0: &str, c: &str, l: &str, d: &str, rr: &str| {
            t.replace("{i}", i)
                .replace("{d0}", d0)
                .replace("{c}", c)
                .replace("{l}", l)
                .replace("{d}", d)
                .replace("{rr}", rr)
        };
        if self.written_out {
            for (i, d0) in (0..self.dpad).step_by(self.sg as usize).enumerate() {
                let (i, d0s) = (i.to_string(), format!("{d0}u"));
                for t in body.chunk {
                    let _ = writeln!(s, "    {}", fill(t, &i, &d0s, &i, "", "", ""));
                }
                for l in 0..self.sg {
                    let (ls, ds) = (l.to_string(), (d0 + l).to_string());
                    for t in body.each {
                        let _ = writeln!(s, "    {}", fill(t, &i, &d0s, &i, &ls, &ds, ""));
                    }
                    for rr in 0..self.rpt {
                        let rrs = rr.to_string();
                        for t in body.row {
                            let _ = writeln!(s, "    {}", fill(t, &i, &d0s, &i, &ls, &ds, &rrs));
                        }
                    }
                }
            }
        } else {
            s.push_str("    for (var d0 = 0u; d0 < DPAD; d0 += SG) {\n");
            s.push_str("        let i = d0 / SG;\n");
            for t in body.chunk {
                let _ = writeln!(s, "        {}", fill(t, "i", "d0", "", "", "", ""));
            }
            s.push_str("        for (var l = 0u; l < SG; l++) {\n");
            for t in body.each {
                let _ = writeln!(
                    s,
                    "            {}",
                    fill(t, "i", "d0", "", "l", "d0 + l", "")
                );
            }
            if !body.row.is_empty() {
                s.push_str("            for (var rr = 0u; rr < RPT; rr++) {\n");
                for t in body.row {
                    let _ = writeln!(
                        s,
                        "                {}",
                        fill(t, "i", "d0", "", "l", "d0 + l", "rr")
                    );
                }
                s.push_str("            }\n");
            }
            s.push_str("        }\n    }\n");
        }
    }
}

/// The forward: `score_rows(c, lane)`: q . k for the invocation's RPT rows against key c of
/// the staged K tile; `add_rows(c, lane, p, guard)`: o += p v for key c of the staged V tile
/// (a weight of exactly 0 adds nothing where `guard`). SG elements are read per chunk, one per
/// lane, and shared with `lane_values`.
pub fn forward_rows(subgroup: u32, head_dim: u32, rpt: u32) -> String {
    let shape = Shape::new(subgroup, head_dim, rpt);
    let mut s = String::new();
    s.push_str("fn score_rows(c: u32, lane: u32) -> array<f32, RPT> {\n");
    s.push_str("    var x = array<f32, RPT>();\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &["let k{c} = lane_values(sk[c * DPAD + {d0} + lane]);"],
            each: &[],
            row: &["x[{rr}] = fma(qr[{rr}][{d}], k{c}[{l}], x[{rr}]);"],
        },
    );
    s.push_str("    return x;\n}\n");
    s.push_str("fn add_rows(c: u32, lane: u32, p: array<f32, RPT>, guard: bool) {\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &["let v{c} = lane_values(sv[c * DPAD + {d0} + lane]);"],
            each: &[],
            row: &["o[{rr}][{d}] = add_weighted(o[{rr}][{d}], p[{rr}], v{c}[{l}], guard);"],
        },
    );
    s.push_str("}\n");
    s
}

/// The dQ kernel: `dots_rows(c, lane)`: q . k then dO . v for the RPT rows against key c of
/// the staged K and V tiles (scores in 0..RPT, dP in RPT..2 RPT), keeping the lane's k
/// elements in `kc`; `add_dq_rows(ds, guard)`: dq_tile += ds k from those kept elements.
pub fn dq_rows(subgroup: u32, head_dim: u32, rpt: u32) -> String {
    let shape = Shape::new(subgroup, head_dim, rpt);
    let mut s = String::new();
    s.push_str("fn dots_rows(c: u32, lane: u32) -> array<f32, 2 * RPT> {\n");
    s.push_str("    var x = array<f32, 2 * RPT>();\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &[
                "kc[{i}] = sk[c * DPAD + {d0} + lane];",
                "let k{c} = lane_values(kc[{i}]);",
                "let v{c} = lane_values(sv[c * DPAD + {d0} + lane]);",
            ],
            each: &[],
            row: &[
                "x[{rr}] = fma(qr[{rr}][{d}], k{c}[{l}], x[{rr}]);",
                "x[RPT + {rr}] = fma(dor[{rr}][{d}], v{c}[{l}], x[RPT + {rr}]);",
            ],
        },
    );
    s.push_str("    return x;\n}\n");
    s.push_str("fn add_dq_rows(ds: array<f32, RPT>, guard: bool) {\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &["let k{c} = lane_values(kc[{i}]);"],
            each: &[],
            row: &["dq_tile[{rr}][{d}] = add_weighted(dq_tile[{rr}][{d}], ds[{rr}], k{c}[{l}], guard);"],
        },
    );
    s.push_str("}\n");
    s
}

/// The dK/dV kernel (one key per invocation): `dots_key(r, lane)`: k . q and v . dO against
/// row r of the staged Q and dO tiles, keeping the lane's q and dO elements in `qc` and `dc`;
/// `add_dkdv(p, ds, guard)`: dv_tile += p dO and dk_tile += ds q from those kept elements.
pub fn dkdv_rows(subgroup: u32, head_dim: u32) -> String {
    let shape = Shape::new(subgroup, head_dim, 1);
    let mut s = String::new();
    s.push_str("fn dots_key(r: u32, lane: u32) -> vec2<f32> {\n");
    s.push_str("    var s = 0.0;\n    var dp = 0.0;\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &[
                "qc[{i}] = sq[r * DPAD + {d0} + lane];",
                "dc[{i}] = sdo[r * DPAD + {d0} + lane];",
                "let q{c} = lane_values(qc[{i}]);",
                "let o{c} = lane_values(dc[{i}]);",
            ],
            each: &[
                "s = fma(kr[{d}], q{c}[{l}], s);",
                "dp = fma(vr[{d}], o{c}[{l}], dp);",
            ],
            row: &[],
        },
    );
    s.push_str("    return vec2<f32>(s, dp);\n}\n");
    s.push_str("fn add_dkdv(p: f32, ds: f32, guard: bool) {\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &[
                "let q{c} = lane_values(qc[{i}]);",
                "let o{c} = lane_values(dc[{i}]);",
            ],
            each: &[
                "dv_tile[{d}] = add_weighted(dv_tile[{d}], p, o{c}[{l}], guard);",
                "dk_tile[{d}] = add_weighted(dk_tile[{d}], ds, q{c}[{l}], guard);",
            ],
            row: &[],
        },
    );
    s.push_str("}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_are_written_out_with_subgroups_and_looped_without() {
        let out = forward_rows(8, 64, 4);
        assert!(!out.contains("for ("));
        assert!(out.contains("x[3] = fma(qr[3][63], k7[7], x[3]);"));
        let looped = forward_rows(1, 64, 4);
        assert!(looped.contains("for (var d0 = 0u; d0 < DPAD; d0 += SG)"));
        assert!(looped.contains("x[rr] = fma(qr[rr][d0 + l], k[l], x[rr]);"));
        // past the size bound: loops even with subgroups
        assert!(dq_rows(8, 256, 4).contains("for (var rr = 0u; rr < RPT; rr++)"));
        assert!(!dkdv_rows(8, 256).contains("for ("));
    }
}
