//! 8-bit KV-cache storage formats: the layout of a quantized cache's words, and the host's
//! codec (quantize to upload a cache, dequantize to check or read one back). The kernels'
//! codec is `shaders/kv_format.wgsl` and the append's `shaders/kv_quantize.wgsl`, which this
//! file mirrors rule for rule; the two are checked against each other by the GPU tests
//! (tests/gpu/kvcache.rs; q8_0's bytes bit for bit).
//!
//! A cache is a run of 32-bit words: a header, then one record per (row, kv head) in the
//! order of an f32 cache's `[rows, heads_kv, head_dim]` elements. A record's data word w holds
//! elements 4w .. 4w + 3 of its head, one byte each, element 4w in the low byte.
//!
//! - [`CacheFormat::Q8_0`] (llama.cpp's q8_0, by ggml's `quantize_row_q8_0_ref`): blocks of
//!   32 elements, each a signed byte times the block's f16 scale. `d = amax / 127` in f32, the
//!   scale is `f16(d)` (nearest even), the byte `roundf(x * (1 / d))` with the f32 `d` (not
//!   its f16), half away from zero (C's `roundf`), within ±127. Values below f32's smallest
//!   normal count as 0 and a block whose amax is below 127 x 2^-126 is zeros (ggml divides
//!   by a subnormal there; both only where `f16(d)` is 0). The record's scales follow its
//!   data, two to a word (block 2s in the low half of word s); the record is padded to whole
//!   16-byte words. No header. 1.125 bytes an element at head_dim 128 (f16: 2).
//! - [`CacheFormat::E4M3`] (OCP fp8 E4M3, as vLLM's fp8 caches): each element is
//!   `x / scale` of its kv head rounded to nearest even on E4M3's grid (3 mantissa bits,
//!   subnormals down to 2^-9), saturated at ±448; 0x7F/0xFF are NaN. The header holds the
//!   kv heads' f32 scales (padded to 4 words); records are data only. 1 byte an element.
//!
//! Both need head_dim a multiple of 32, so that records and columns are whole 16-byte words.

use crate::error::{Error, Result};

/// How a KV cache stores its elements in 8 bits (module docs: layouts and rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheFormat {
    /// Signed bytes with one f16 scale per block of 32 (llama.cpp's q8_0).
    Q8_0,
    /// OCP fp8 E4M3 bytes with one f32 scale per kv head (vLLM's fp8 cache).
    E4M3,
}

/// The largest magnitude E4M3 holds (1.75 x 2^8); larger values saturate to it.
pub const E4M3_MAX: f32 = 448.0;

/// Elements per Q8_0 block (one scale each).
pub const Q8_BLOCK: usize = 32;

impl CacheFormat {
    /// Both formats.
    pub const ALL: [CacheFormat; 2] = [CacheFormat::Q8_0, CacheFormat::E4M3];

    /// Its name in errors, labels and on command lines: `q8_0`, `e4m3`.
    pub fn name(self) -> &'static str {
        match self {
            CacheFormat::Q8_0 => "q8_0",
            CacheFormat::E4M3 => "e4m3",
        }
    }

    /// Words a record (one row of one kv head) takes at `head_dim`, whole 16-byte words.
    pub fn record_words(self, head_dim: usize) -> usize {
        match self {
            CacheFormat::Q8_0 => {
                (head_dim / 4 + head_dim.div_ceil(2 * Q8_BLOCK)).next_multiple_of(4)
            }
            CacheFormat::E4M3 => head_dim / 4,
        }
    }

    /// Words before the first record: E4M3's per-head scales, padded to a 16-byte word.
    pub fn header_words(self, heads_kv: usize) -> usize {
        match self {
            CacheFormat::Q8_0 => 0,
            CacheFormat::E4M3 => heads_kv.next_multiple_of(4),
        }
    }

    /// The words of a cache of `shape` (`[batch or pages, rows, heads_kv, head_dim]`), after
    /// checking head_dim is a multiple of 32; a typed error where it overflows.
    pub fn cache_words(self, shape: [usize; 4]) -> Result<usize> {
        let [b, s, h, d] = shape;
        self.check_dim("head_dim", d)?;
        b.checked_mul(s)
            .and_then(|r| r.checked_mul(h))
            .and_then(|r| r.checked_mul(self.record_words(d)))
            .and_then(|w| w.checked_add(self.header_words(h)))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "a {} cache of shape {shape:?} overflows",
                    self.name()
                ))
            })
    }

    /// A typed `Unsupported` where a record's dims `d` (the config's field `name`: head_dim,
    /// or head_dim_v for the values) are not a whole number of 32-element blocks.
    pub(crate) fn check_dim(self, name: &str, d: usize) -> Result<()> {
        if d == 0 || !d.is_multiple_of(Q8_BLOCK) {
            return Err(Error::Unsupported {
                feature: format!("a {} KV cache with {name} {d}", self.name()),
                backend: crate::Backend::Wgpu,
                reason: format!(
                    "8-bit caches need {name} a multiple of 32 (whole blocks and 16-byte \
                     words per record)"
                ),
            });
        }
        Ok(())
    }

    /// Bytes a cache element takes on average at `head_dim` (scales and padding included):
    /// what a decode step reads per cached element.
    pub fn bytes_per_element(self, head_dim: usize) -> f64 {
        (self.record_words(head_dim) * 4) as f64 / head_dim as f64
    }

    /// Per-head E4M3 scales for `data` (`shape` as [`cache_words`](Self::cache_words)): each
    /// kv head's largest finite magnitude over 448 (1 for a head of zeros), so that nothing
    /// saturates. A static scale for a cache that later appends: calibrate on a prefill.
    pub fn e4m3_head_scales(data: &[f32], shape: [usize; 4]) -> Vec<f32> {
        let [_, _, h, d] = shape;
        let mut amax = vec![0f32; h];
        for (e, &x) in data.iter().enumerate() {
            if x.is_finite() {
                let a = &mut amax[(e / d.max(1)) % h.max(1)];
                *a = a.max(x.abs());
            }
        }
        amax.into_iter()
            .map(|a| if a > 0.0 { a / E4M3_MAX } else { 1.0 })
            .collect()
    }

    /// The cache's words for `data` (f32, `shape`'s elements in row-major order), quantized on
    /// the host by the kernels' rules; `head_scales` are E4M3's per-kv-head scales (finite,
    /// positive) and must be `None` for Q8_0. Typed errors for a wrong length or scales.
    pub fn quantize(
        self,
        data: &[f32],
        shape: [usize; 4],
        head_scales: Option<&[f32]>,
    ) -> Result<Vec<u32>> {
        let words = self.cache_words(shape)?;
        let [_, _, h, d] = shape;
        let n: usize = shape.iter().product();
        if data.len() != n {
            return Err(Error::invalid(format!(
                "a {} cache of shape {shape:?} quantizes {n} values, got {}",
                self.name(),
                data.len()
            )));
        }
        let scales = self.check_scales(h, head_scales)?;
        let mut out = vec![0u32; words];
        let (hw, rw) = (self.header_words(h), self.record_words(d));
        for (i, s) in scales.iter().enumerate() {
            out[i] = s.to_bits();
        }
        for (r, x) in data.chunks(d).enumerate() {
            let rec = &mut out[hw + r * rw..hw + (r + 1) * rw];
            match self {
                CacheFormat::Q8_0 => {
                    for (g, block) in x.chunks(Q8_BLOCK).enumerate() {
                        let (scale, bytes) = q8_block(block);
                        rec[d / 4 + g / 2] |= u32::from(scale.to_bits()) << (16 * (g % 2));
                        for (k, &b) in bytes.iter().enumerate() {
                            let e = g * Q8_BLOCK + k;
                            rec[e / 4] |= u32::from(b as u8) << (8 * (e % 4));
                        }
                    }
                }
                CacheFormat::E4M3 => {
                    let s = scales[r % h];
                    for (e, &v) in x.iter().enumerate() {
                        rec[e / 4] |= u32::from(e4m3_encode(v / s)) << (8 * (e % 4));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The f32 values of a cache's `words` (`shape` as [`quantize`](Self::quantize)): each
    /// byte times its scale, in f32 as the kernels compute it.
    pub fn dequantize(self, words: &[u32], shape: [usize; 4]) -> Result<Vec<f32>> {
        let expected = self.cache_words(shape)?;
        if words.len() != expected {
            return Err(Error::invalid(format!(
                "a {} cache of shape {shape:?} has {expected} words, got {}",
                self.name(),
                words.len()
            )));
        }
        let [_, _, h, d] = shape;
        let (hw, rw) = (self.header_words(h), self.record_words(d));
        let records = shape.iter().product::<usize>() / d;
        let byte = |rec: &[u32], e: usize| (rec[e / 4] >> (8 * (e % 4))) as u8;
        let mut out = Vec::with_capacity(records * d);
        for r in 0..records {
            let rec = &words[hw + r * rw..hw + (r + 1) * rw];
            for e in 0..d {
                out.push(match self {
                    CacheFormat::Q8_0 => {
                        let g = e / Q8_BLOCK;
                        let bits = (rec[d / 4 + g / 2] >> (16 * (g % 2))) as u16;
                        half::f16::from_bits(bits).to_f32() * f32::from(byte(rec, e) as i8)
                    }
                    CacheFormat::E4M3 => e4m3_decode(byte(rec, e)) * f32::from_bits(words[r % h]),
                });
            }
        }
        Ok(out)
    }

    /// The per-head scales a cache of `heads` kv heads takes: E4M3's, `heads` finite positive
    /// values; none for Q8_0.
    fn check_scales(self, heads: usize, scales: Option<&[f32]>) -> Result<Vec<f32>> {
        match (self, scales) {
            (CacheFormat::Q8_0, None) => Ok(Vec::new()),
            (CacheFormat::Q8_0, Some(_)) => Err(Error::invalid(
                "a q8_0 cache keeps a scale per block of 32 values: head_scales must be None",
            )),
            (CacheFormat::E4M3, None) => Err(Error::invalid(format!(
                "an e4m3 cache needs a scale per kv head ({heads}); see \
                 CacheFormat::e4m3_head_scales"
            ))),
            (CacheFormat::E4M3, Some(s)) => {
                if s.len() != heads || !s.iter().all(|x| x.is_finite() && *x > 0.0) {
                    return Err(Error::invalid(format!(
                        "an e4m3 cache needs {heads} finite positive scales (one per kv head), \
                         got {s:?}"
                    )));
                }
                Ok(s.to_vec())
            }
        }
    }
}

impl std::fmt::Display for CacheFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CacheFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "q8_0" | "q8" => Ok(CacheFormat::Q8_0),
            "e4m3" | "fp8" => Ok(CacheFormat::E4M3),
            other => Err(format!(
                "unknown cache format {other:?}: expected q8_0 or e4m3"
            )),
        }
    }
}

/// The smallest block amax that q8_0 does not write as zeros: 127 x 2^-126, where d = amax /
/// 127 is f32's smallest normal (below it d is subnormal, which a GPU may flush to zero).
const Q8_MIN_AMAX: f32 = 127.0 * f32::MIN_POSITIVE;

/// One Q8_0 block: its f16 scale and bytes, by ggml's `quantize_row_q8_0_ref`: `d = amax /
/// 127` in f32, `id = 1 / d`, the scale `f16(d)` (nearest even) and each byte `round(x * id)`
/// half away from zero (C's `roundf`), with the f32 `d`, not its f16. Where ggml divides by a
/// subnormal the kernels could flush, this codec (and the kernel) count values below f32's
/// smallest normal as 0 and write a block of amax below [`Q8_MIN_AMAX`] as zeros: both only
/// in blocks whose f16 scale is 0 anyway. A block holding NaN keeps a NaN scale (its values
/// read back NaN).
fn q8_block(x: &[f32]) -> (half::f16, Vec<i8>) {
    if x.iter().any(|v| v.is_nan()) {
        return (half::f16::NAN, vec![0; x.len()]);
    }
    let flush = |v: f32| if v.abs() < f32::MIN_POSITIVE { 0.0 } else { v };
    let amax = x.iter().fold(0f32, |a, &v| a.max(flush(v).abs()));
    if amax < Q8_MIN_AMAX {
        return (half::f16::ZERO, vec![0; x.len()]);
    }
    let d = amax / 127.0;
    let id = 1.0 / d;
    let bytes = x
        .iter()
        .map(|&v| (flush(v) * id).round().clamp(-127.0, 127.0) as i8)
        .collect();
    (half::f16::from_f32(d), bytes)
}

/// E4M3's byte for `x`: nearest even on its grid, saturated at ±448, NaN as 0x7F.
pub fn e4m3_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let mag = if a < 2f32.powi(-6) {
        // subnormals: multiples of 2^-9 (8 x 2^-9 is the smallest normal, byte 8)
        (a * 512.0).round_ties_even() as u32
    } else {
        // round f32's mantissa to 3 bits (nearest even), carrying into the exponent, then
        // rebias 127 -> 7; saturate at 0x7E (448)
        let b = a.min(E4M3_MAX * 2.0).to_bits();
        let r = (b + 0x7FFFF + ((b >> 20) & 1)) >> 20;
        (r - (120 << 3)).min(0x7E)
    };
    sign | mag as u8
}

/// The value of an E4M3 byte.
pub fn e4m3_decode(b: u8) -> f32 {
    let mag = u32::from(b & 0x7F);
    let v = if mag == 0x7F {
        f32::NAN
    } else if mag >= 8 {
        f32::from_bits((mag << 20) + (120 << 23))
    } else {
        mag as f32 / 512.0
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        // every byte decodes and encodes back (but NaN and negative zero's sign)
        for b in 0..=255u8 {
            let v = e4m3_decode(b);
            if b & 0x7F == 0x7F {
                assert!(v.is_nan());
                continue;
            }
            assert_eq!(e4m3_encode(v), b, "byte {b:#x} = {v}");
        }
        assert_eq!(e4m3_decode(0x7E), 448.0);
        assert_eq!(e4m3_encode(1e6), 0x7E);
        assert_eq!(e4m3_encode(f32::NEG_INFINITY), 0xFE);
        // halfway between 1 and 1.125 goes to the even (1), between 1.125 and 1.25 to 1.25
        assert_eq!(e4m3_decode(e4m3_encode(1.0625)), 1.0);
        assert_eq!(e4m3_decode(e4m3_encode(1.1875)), 1.25);
        // subnormal ties: 1.5 x 2^-9 to 2 x 2^-9, 2.5 x 2^-9 to 2 x 2^-9
        assert_eq!(e4m3_encode(1.5 / 512.0), 2);
        assert_eq!(e4m3_encode(2.5 / 512.0), 2);
        // the largest subnormal rounds up into the normals
        assert_eq!(e4m3_decode(e4m3_encode(7.75 / 512.0)), 8.0 / 512.0);
    }

    /// ggml's q8_0 (`quantize_row_q8_0_ref`): d = amax / 127 in f32, stored as f16(d), each
    /// byte round(x * (1 / d)) half away from zero with the f32 d; f32 subnormals count as
    /// 0 and a block of amax below 127 x 2^-126 is zeros. The expected bytes and scales are
    /// written out (worked by hand, checked by a separate f32 calculation), not computed by
    /// the codec.
    #[test]
    fn q8_0_rounds_ties_away_from_zero_with_the_f32_scale_as_ggml() {
        #[rustfmt::skip]
        let cases: [(&[f32], u16, [i8; 32]); 7] = [
            // d = 1: the values' own ties go away from zero (not to even: 2.5 -> 3, 0.5 -> 1),
            // 0.49999997 to 0, the ends to +-127
            (
                &[
                    127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5, -126.5, 0.49999997,
                    -0.49999997, 3.5, -3.5, 64.5, -64.5, 0.0, -0.0, 1.0, 100.49999, 100.50001,
                    -127.0, 0.25, -0.75, 10.5, -11.5, 12.5, 99.5, -100.5, 0.5000001, 2.4999998,
                    63.5, -63.5,
                ],
                0x3C00,
                [
                    127, 3, -3, 1, -1, 2, -2, 127, -127, 0, 0, 4, -4, 65, -65, 0, 0, 1, 100, 101,
                    -127, 0, -1, 11, -12, 13, 100, -101, 1, 2, 64, -64,
                ],
            ),
            // amax 1: d = f32(1 / 127), 1 / d = 127 exactly, so x = f32((k + 0.5) / 127)
            // gives x * (1 / d) = k + 0.5 exactly (away: k + 1); x = (k + 0.496) / 127 gives
            // k, where 1 / f16(d) = 127.0078 would give k + 1; the scale f16(d) 0x2008
            (
                &[
                    1.0, -1.0, 0.003937008, 0.011811024, 0.01968504, 0.04330709, 0.5, 0.507874,
                    0.79133856, 0.988189, 0.996063, -0.003937008, -0.01968504, -0.5, -0.996063,
                    0.7913071, 0.9487874, 0.9960315, -0.7913071, -0.9960315, 0.0, 0.007874016,
                    0.015748031, 0.023622047, 0.031496063, 0.03937008, 0.047244094, 0.05511811,
                    0.062992126, 0.070866145, 0.07874016, 0.08661418,
                ],
                0x2008,
                [
                    127, -127, 1, 2, 3, 6, 64, 65, 101, 126, 127, -1, -3, -64, -127, 100, 120,
                    126, -100, -126, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                ],
            ),
            // d = f32(0.001 / 127): its f16 is subnormal (132 x 2^-24)
            (
                &[
                    0.001, -0.001, 0.0005, -0.0005, 0.00025, 1e-5, -0.00075, 0.000123,
                    3.937008e-6, -3.937008e-6, 0.0009, 2e-6, -0.0005, -0.00045, -0.0004, -0.00035,
                    -0.0003, -0.00025, -0.0002, -0.00015, -0.0001, -5e-5, 0.0, 5e-5, 0.0001,
                    0.00015, 0.0002, 0.00025, 0.0003, 0.00035, 0.0004, 0.00045,
                ],
                0x0084,
                [
                    127, -127, 64, -64, 32, 1, -95, 16, 1, -1, 114, 0, -64, -57, -51, -44, -38,
                    -32, -25, -19, -13, -6, 0, 6, 13, 19, 25, 32, 38, 44, 51, 57,
                ],
            ),
            // zeros (and negative zeros): scale 0, bytes 0
            (
                &[
                    0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0,
                    0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0,
                    0.0, -0.0, 0.0, -0.0,
                ],
                0x0000,
                [
                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    0, 0, 0, 0, 0, 0,
                ],
            ),
            // amax = 127 x 2^-126: d = 2^-126, 1 / d = 2^126 (f16(d) = 0); the subnormal
            // 2^-127 counts as 0 (ggml's 0.5 -> 1); 2.5 x 2^-126 -> 3
            (
                &[
                    f32::from_bits(0x03FE0000), -f32::from_bits(0x03FE0000),
                    f32::from_bits(0x00400000), -f32::from_bits(0x00400000),
                    f32::from_bits(0x00800000), -f32::from_bits(0x00800000),
                    f32::from_bits(0x01200000), -f32::from_bits(0x01200000),
                    f32::from_bits(0x00000001), f32::from_bits(0x037E0000), 0.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0,
                ],
                0x0000,
                [
                    127, -127, 0, 0, 1, -1, 3, -3, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    0, 0, 0, 0, 0, 0, 0, 0, 0,
                ],
            ),
            // amax just below 127 x 2^-126: a zero block
            (
                &[
                    f32::from_bits(0x03FDFFFF), -f32::from_bits(0x03FDFFFF),
                    f32::from_bits(0x00800000), f32::from_bits(0x03800000), 0.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                ],
                0x0000,
                [
                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    0, 0, 0, 0, 0, 0,
                ],
            ),
            // amax 1e7: f16(d) overflows to infinity, the bytes still of the f32 d
            (
                &[
                    1e7, -1e7, 5e6, -5e6, 2.5e6, 1.0, -9.99e6, 78740.16, -5e6, -4583333.5,
                    -4166666.8, -3.75e6, -3333333.2, -2916666.8, -2.5e6, -2083333.4, -1666666.6,
                    -1.25e6, -833333.3, -416666.66, 0.0, 416666.66, 833333.3, 1.25e6, 1666666.6,
                    2083333.4, 2.5e6, 2916666.8, 3333333.2, 3.75e6, 4166666.8, 4583333.5,
                ],
                0x7C00,
                [
                    127, -127, 64, -64, 32, 0, -127, 1, -64, -58, -53, -48, -42, -37, -32, -26,
                    -21, -16, -11, -5, 0, 5, 11, 16, 21, 26, 32, 37, 42, 48, 53, 58,
                ],
            ),
        ];
        for (n, (x, scale, bytes)) in cases.iter().enumerate() {
            let (s, q) = q8_block(x);
            assert_eq!(
                (s.to_bits(), q.as_slice()),
                (*scale, &bytes[..]),
                "case {n}"
            );
        }
        // a block holding NaN keeps a NaN scale
        let mut nan = [1.0f32; 32];
        nan[7] = f32::NAN;
        assert_eq!(q8_block(&nan).0.to_bits(), 0x7E00);
        assert_eq!(q8_block(&nan).1, vec![0; 32]);
        // the record's layout: data words, then the block's scale in the low half
        let words = CacheFormat::Q8_0
            .quantize(cases[0].0, [1, 1, 1, 32], None)
            .unwrap();
        assert_eq!(words.len(), 12);
        assert_eq!(words[0], u32::from_le_bytes([127, 3, (-3i8) as u8, 1]));
        assert_eq!(words[8], 0x3C00);
    }

    /// A value is within half a step of the f32 d, plus its byte times the f16 scale's rounding
    /// (the bytes are of d, the values read back of f16(d): at most (1/2 + 127 x 2^-11) d
    /// where f16(d) is normal).
    #[test]
    fn q8_0_keeps_each_value_within_half_a_step_and_the_scales_rounding() {
        let shape = [1, 3, 2, 64];
        let data: Vec<f32> = (0..384)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let words = CacheFormat::Q8_0.quantize(&data, shape, None).unwrap();
        assert_eq!(words.len(), 6 * CacheFormat::Q8_0.record_words(64));
        let back = CacheFormat::Q8_0.dequantize(&words, shape).unwrap();
        for (blk, (x, y)) in data.chunks(32).zip(back.chunks(32)).enumerate() {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let scale_error = (half::f16::from_f32(d).to_f32() - d).abs();
            for (a, b) in x.iter().zip(y) {
                let bound = 0.5001 * d + (b.abs() / d).round() * scale_error;
                assert!(
                    (a - b).abs() <= bound,
                    "block {blk}: {a} -> {b}, d {d}, bound {bound}"
                );
                assert!(bound <= (0.5001 + 127.0 / 2048.0) * d);
            }
        }
    }

    #[test]
    fn e4m3_caches_carry_their_head_scales_and_bad_arguments_are_typed_errors() {
        let shape = [2, 2, 3, 32];
        let data: Vec<f32> = (0..384).map(|i| (i as f32 - 190.0) * 0.37).collect();
        let scales = CacheFormat::e4m3_head_scales(&data, shape);
        let words = CacheFormat::E4M3
            .quantize(&data, shape, Some(&scales))
            .unwrap();
        assert_eq!(f32::from_bits(words[2]), scales[2]);
        let back = CacheFormat::E4M3.dequantize(&words, shape).unwrap();
        for (e, (a, b)) in data.iter().zip(&back).enumerate() {
            // 3 mantissa bits: within 2^-4 relative, or half a subnormal step
            let s = scales[(e / 32) % 3];
            assert!(
                (a - b).abs() <= a.abs() / 16.0 + s / 1024.0,
                "{e}: {a} -> {b}"
            );
        }
        assert!(CacheFormat::E4M3.quantize(&data, shape, None).is_err());
        assert!(CacheFormat::Q8_0
            .quantize(&data, shape, Some(&scales))
            .is_err());
        assert!(CacheFormat::E4M3
            .quantize(&data, shape, Some(&[1.0, -1.0, 1.0]))
            .is_err());
        assert!(CacheFormat::Q8_0
            .quantize(&data[..96], [1, 1, 3, 32], None)
            .is_ok());
        assert!(matches!(
            CacheFormat::Q8_0.cache_words([1, 1, 1, 48]),
            Err(Error::Unsupported { .. })
        ));
    }
}
