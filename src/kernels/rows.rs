//! The rows family's generated WGSL: its prelude ([`lane_prelude`]: subgroup constants, the
//! staged tiles' vector type, lane sharing, pinned values), the loaders that fill the staged
//! tiles, and each kernel's products over the head dimension.
//!
//! On CPU drivers (llvmpipe) a private array stays in registers, or spills as whole vectors,
//! only while every index into it is a constant; an index left dynamic turns each access into
//! a per-lane load or store (docs/PERFORMANCE.md, "Where the rows kernels' time goes"). NIR
//! unrolls a loop only when its trip count and body are small, which holds for two rows per
//! invocation over head_dim 64 but not for four. So the products are written out, with a
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

/// Elements per workgroup-memory read in the rows kernels (VW): the widest of 4, 2 and 1 that
/// divides DPAD / SG. The staged tiles hold vectors of VW elements (`TileVec`), so a lane's read
/// brings VW elements: llvmpipe pays for a divergent read lane by lane, about the same for a
/// vec4 as for one f32 (docs/PERFORMANCE.md, "Where the rows kernels' time goes").
pub fn vector_width(subgroup: u32, head_dim: u32) -> u32 {
    let sg = subgroup.max(1);
    let per_lane = head_dim.div_ceil(sg);
    [4, 2, 1]
        .into_iter()
        .find(|&w| per_lane.is_multiple_of(w))
        .unwrap_or(1)
}

/// The WGSL type of one staged-tile read: VW f32s.
fn tile_vec_type(vw: u32) -> String {
    if vw == 1 {
        "f32".to_string()
    } else {
        format!("vec{vw}<f32>")
    }
}

/// One function body over the head dimension in chunks of SG x VW dims (one TileVec per lane):
/// `chunk` lines once per chunk, then `row` lines for every element of the chunk and every
/// row (RPT) of the invocation. Tokens: `{i}` chunk number, `{v0}` its first TileVec within a
/// row of a staged tile, `{c}` a name suffix for per-chunk values, `{e}` the element's index
/// into the chunk's `lane_values` (lane, then component), `{d}` its dim, `{rr}` the row.
struct Body<'a> {
    chunk: &'a [&'a str],
    row: &'a [&'a str],
}

struct Shape {
    sg: u32,
    vw: u32,
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
            vw: vector_width(subgroup, head_dim),
            dpad,
            rpt,
            written_out: sg > 1 && dpad * rpt <= WRITTEN_OUT_MAX,
        }
    }

    fn emit(&self, s: &mut String, body: &Body) {
        let fill = |t: &str, i: &str, v0: &str, c: &str, e: &str, d: &str, rr: &str| {
            t.replace("{i}", i)
                .replace("{v0}", v0)
                .replace("{c}", c)
                .replace("{e}", e)
                .replace("{d}", d)
                .replace("{rr}", rr)
        };
        let per_chunk = self.sg * self.vw;
        if self.written_out {
            for (i, d0) in (0..self.dpad).step_by(per_chunk as usize).enumerate() {
                let (i, v0) = (i.to_string(), format!("{}u", i as u32 * self.sg));
                for t in body.chunk {
                    let _ = writeln!(s, "    {}", fill(t, &i, &v0, &i, "", "", ""));
                }
                for l in 0..self.sg {
                    for j in 0..self.vw {
                        let e = if self.vw == 1 {
                            format!("[{l}]")
                        } else {
                            format!("[{l}][{j}]")
                        };
                        let d = (d0 + l * self.vw + j).to_string();
                        for rr in 0..self.rpt {
                            let rrs = rr.to_string();
                            for t in body.row {
                                let _ = writeln!(s, "    {}", fill(t, &i, &v0, &i, &e, &d, &rrs));
                            }
                        }
                    }
                }
            }
        } else {
            let (e, inner) = if self.vw == 1 {
                ("[l]", "        {\n            let j = 0u;\n")
            } else {
                ("[l][j]", "        for (var j = 0u; j < VW; j++) {\n")
            };
            let d = "d0 + l * VW + j";
            s.push_str("    for (var d0 = 0u; d0 < DPAD; d0 += SG * VW) {\n");
            s.push_str("        let i = d0 / (SG * VW);\n");
            for t in body.chunk {
                let _ = writeln!(s, "        {}", fill(t, "i", "i * SG", "", "", "", ""));
            }
            s.push_str("        for (var l = 0u; l < SG; l++) {\n");
            s.push_str(inner);
            s.push_str("            for (var rr = 0u; rr < RPT; rr++) {\n");
            for t in body.row {
                let _ = writeln!(
                    s,
                    "                {}",
                    fill(t, "i", "i * SG", "", e, d, "rr")
                );
            }
            s.push_str("            }\n");
            s.push_str("        }\n        }\n    }\n");
        }
    }
}

/// `load_tile_<name>(g, d)`: the TileVec of dims d .. d + VW of a row whose dim d is element g
/// of binding `name` (d < HEAD_DIM, d a multiple of VW), with the dims past HEAD_DIM as 0: what
/// the staging loops store into a tile.
fn tile_loader(s: &mut String, name: &str, subgroup: u32, head_dim: u32) {
    let vw = vector_width(subgroup, head_dim);
    let _ = writeln!(s, "fn load_tile_{name}(g: u32, d: u32) -> TileVec {{");
    if vw == 1 {
        let _ = writeln!(s, "    return load_{name}(g);");
    } else {
        s.push_str("    var x = TileVec();\n");
        for j in 0..vw {
            if head_dim.is_multiple_of(vw) {
                let _ = writeln!(s, "    x[{j}] = load_{name}(g + {j}u);");
            } else {
                let _ = writeln!(
                    s,
                    "    if (d + {j}u < HEAD_DIM) {{ x[{j}] = load_{name}(g + {j}u); }}"
                );
            }
        }
        s.push_str("    return x;\n");
    }
    s.push_str("}\n");
}

/// The rows family's prelude: SG and DPAD (head_dim rounded up to a multiple of SG; the padding
/// holds zeros), VW and `TileVec` (see [`vector_width`]), and `lane_values` / `lane_value`,
/// which share lanes' values across the subgroup. With no subgroup size to rely on, SG = 1 and
/// both are the identity. Also `pinned`, which keeps a workgroup-uniform value in workgroup
/// memory.
pub fn lane_prelude(subgroup: u32, head_dim: u32, pin_words: u32) -> String {
    let sg = subgroup.max(1);
    let vw = vector_width(subgroup, head_dim);
    // subgroupBroadcast needs a literal lane, so the SG calls are written out here.
    let lanes: Vec<String> = if sg > 1 {
        (0..sg)
            .map(|l| format!("subgroupBroadcast(x, {l}u)"))
            .collect()
    } else {
        vec!["x".to_string()]
    };
    let one_lane = if sg > 1 { "subgroupShuffle(x, l)" } else { "x" };
    format!(
        "const SG: u32 = {sg}u;\nconst DPAD: u32 = {}u;\n\
         const VW: u32 = {vw}u;\nconst DPAD_V: u32 = DPAD / VW;\nalias TileVec = {};\n\
         // a TileVec's first component (f32 sums folded through a tile: table_flush)\n\
         fn tile_first(v: TileVec) -> f32 {{\n    return {first};\n}}\n\
         // lane l's x, for every l < SG\n\
         fn lane_values(x: TileVec) -> array<TileVec, SG> {{\n    return array<TileVec, SG>({});\n}}\n\
         // lane l's x, for one l < SG known only at run time\n\
         fn lane_value(x: f32, l: u32) -> f32 {{\n    return {one_lane};\n}}\n\
         // x, the same in every invocation, passed through workgroup memory so that it is\n\
         // kept rather than recomputed: llvmpipe recomputes integer arithmetic lane by lane\n\
         // after each barrier (its divisions too), but not a load. One slot per value.\n\
         var<workgroup> pins: array<u32, {pin_words}>;\n\
         fn pinned(x: u32, slot: u32) -> u32 {{\n    pins[slot] = x;\n    \
         return workgroupUniformLoad(&pins[slot]);\n}}\n",
        head_dim.next_multiple_of(sg),
        tile_vec_type(vw),
        lanes.join(", "),
        first = if vw == 1 { "v" } else { "v.x" },
    )
}

/// `stage_kv(b, hk, kv0, t)`: the forward's and dQ kernel's K/V tile of BC keys from key kv0
/// into `sk` and `sv` (declared by the kernel), keys past seq_kv and dims past HEAD_DIM as 0.
const STAGE_KV: &str = "fn stage_kv(b: u32, hk: u32, kv0: u32, t: u32) {
    for (var e = t; e < BC * DPAD_V; e += NT) {
        let j = kv0 + e / DPAD_V;
        let d = (e % DPAD_V) * VW;
        var kx = TileVec();
        var vx = TileVec();
        if (j < params.seq_kv && d < HEAD_DIM) {
            kx = load_tile_k(k_at(b, j, hk, d), d);
            vx = load_tile_v(v_at(b, j, hk, d), d);
        }
        sk[e] = kx;
        sv[e] = vx;
    }
}
";

/// The forward: `score_rows(c, lane)`: q . k for the invocation's RPT rows against key c of
/// the staged K tile; `add_rows(c, lane, p, guard)`: o += p v for key c of the staged V tile
/// (a weight of exactly 0 adds nothing where `guard`). SG elements are read per chunk, one per
/// lane, and shared with `lane_values`.
pub fn forward_rows(subgroup: u32, head_dim: u32, rpt: u32) -> String {
    let shape = Shape::new(subgroup, head_dim, rpt);
    let mut s = String::new();
    tile_loader(&mut s, "k", subgroup, head_dim);
    tile_loader(&mut s, "v", subgroup, head_dim);
    s.push_str(STAGE_KV);
    s.push_str("fn score_rows(c: u32, lane: u32) -> array<f32, RPT> {\n");
    s.push_str("    var x = array<f32, RPT>();\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &["let k{c} = lane_values(sk[c * DPAD_V + {v0} + lane]);"],
            row: &["x[{rr}] = fma(qr[{rr}][{d}], k{c}{e}, x[{rr}]);"],
        },
    );
    s.push_str("    return x;\n}\n");
    s.push_str("fn add_rows(c: u32, lane: u32, p: array<f32, RPT>, guard: bool) {\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &["let v{c} = lane_values(sv[c * DPAD_V + {v0} + lane]);"],
            row: &["o[{rr}][{d}] = add_weighted(o[{rr}][{d}], p[{rr}], v{c}{e}, guard);"],
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
    tile_loader(&mut s, "k", subgroup, head_dim);
    tile_loader(&mut s, "v", subgroup, head_dim);
    s.push_str(STAGE_KV);
    s.push_str("fn dots_rows(c: u32, lane: u32) -> array<f32, 2 * RPT> {\n");
    s.push_str("    var x = array<f32, 2 * RPT>();\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &[
                "kc[{i}] = sk[c * DPAD_V + {v0} + lane];",
                "let k{c} = lane_values(kc[{i}]);",
                "let v{c} = lane_values(sv[c * DPAD_V + {v0} + lane]);",
            ],
            row: &[
                "x[{rr}] = fma(qr[{rr}][{d}], k{c}{e}, x[{rr}]);",
                "x[RPT + {rr}] = fma(dor[{rr}][{d}], v{c}{e}, x[RPT + {rr}]);",
            ],
        },
    );
    s.push_str("    return x;\n}\n");
    s.push_str("fn add_dq_rows(ds: array<f32, RPT>, guard: bool) {\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &["let k{c} = lane_values(kc[{i}]);"],
            row: &[
                "dq_tile[{rr}][{d}] = add_weighted(dq_tile[{rr}][{d}], ds[{rr}], k{c}{e}, guard);",
            ],
        },
    );
    s.push_str("}\n");
    s
}

/// The dK/dV kernel (RPT keys per invocation): `dots_keys(r, lane)`: k . q then v . dO for the
/// invocation's keys against row r of the staged Q and dO tiles (scores in 0..RPT, dP in
/// RPT..2 RPT), keeping the lane's q and dO elements in `qc` and `dc`; `add_dkdv(p, ds, guard)`:
/// dv_tile += p dO and dk_tile += ds q from those kept elements.
pub fn dkdv_rows(subgroup: u32, head_dim: u32, rpt: u32) -> String {
    let shape = Shape::new(subgroup, head_dim, rpt);
    let mut s = String::new();
    tile_loader(&mut s, "q", subgroup, head_dim);
    tile_loader(&mut s, "d_out", subgroup, head_dim);
    s.push_str("fn dots_keys(r: u32, lane: u32) -> array<f32, 2 * RPT> {\n");
    s.push_str("    var x = array<f32, 2 * RPT>();\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &[
                "qc[{i}] = sq[r * DPAD_V + {v0} + lane];",
                "dc[{i}] = sdo[r * DPAD_V + {v0} + lane];",
                "let q{c} = lane_values(qc[{i}]);",
                "let o{c} = lane_values(dc[{i}]);",
            ],
            row: &[
                "x[{rr}] = fma(kr[{rr}][{d}], q{c}{e}, x[{rr}]);",
                "x[RPT + {rr}] = fma(vr[{rr}][{d}], o{c}{e}, x[RPT + {rr}]);",
            ],
        },
    );
    s.push_str("    return x;\n}\n");
    s.push_str("fn add_dkdv(p: array<f32, RPT>, ds: array<f32, RPT>, guard: bool) {\n");
    shape.emit(
        &mut s,
        &Body {
            chunk: &[
                "let q{c} = lane_values(qc[{i}]);",
                "let o{c} = lane_values(dc[{i}]);",
            ],
            row: &[
                "dv_tile[{rr}][{d}] = add_weighted(dv_tile[{rr}][{d}], p[{rr}], o{c}{e}, guard);",
                "dk_tile[{rr}][{d}] = add_weighted(dk_tile[{rr}][{d}], ds[{rr}], q{c}{e}, guard);",
            ],
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
        // the products follow the loaders and the staging loop
        let products = &out[out.find("fn score_rows").unwrap()..];
        assert!(!products.contains("for ("));
        // 64 dims as 2 chunks of 8 lanes x vec4: dim 63 is chunk 1, lane 7, component 3
        assert_eq!(vector_width(8, 64), 4);
        assert!(out.contains("let k1 = lane_values(sk[c * DPAD_V + 8u + lane]);"));
        assert!(out.contains("x[3] = fma(qr[3][63], k1[7][3], x[3]);"));
        let looped = forward_rows(1, 64, 4);
        assert!(looped.contains("for (var d0 = 0u; d0 < DPAD; d0 += SG * VW)"));
        assert!(looped.contains("x[rr] = fma(qr[rr][d0 + l * VW + j], k[l][j], x[rr]);"));
        // a head_dim that no vector divides: one f32 per read, and a scalar tile loader
        assert_eq!(vector_width(8, 12), 2);
        assert_eq!(vector_width(1, 7), 1);
        let odd = forward_rows(1, 7, 4);
        assert!(odd.contains("x[rr] = fma(qr[rr][d0 + l * VW + j], k[l], x[rr]);"));
        assert!(odd.contains("return load_k(g);"));
        // a head_dim past the last full vector (61 of 64): its loader guards each component
        let guard = "if (d + 1u < HEAD_DIM) { x[1] = load_v(g + 1u); }";
        assert!(forward_rows(8, 61, 4).contains(guard));
        assert!(!forward_rows(8, 64, 4).contains(guard));
        // past the size bound: loops even with subgroups
        assert!(dq_rows(8, 256, 4).contains("for (var rr = 0u; rr < RPT; rr++)"));
        assert!(!dkdv_rows(8, 256, 1).contains("for ("));
        assert!(dkdv_rows(8, 64, 2)
            .contains("dk_tile[1][63] = add_weighted(dk_tile[1][63], ds[1], q1[7][3], guard);"));
    }
}
