//! 8-bit KV-cache storage formats: the layout of a quantized cache's words, and the host's
//! codec (quantize to upload a cache, dequantize to check or read one back). The kernels'
//! codec is `shaders/kv_format.wgsl`, which this file mirrors rule for rule; the two are
//! checked against each other by the GPU tests (tests/gpu/kvcache.rs).
//!
//! A cache is a run of 32-bit words: a header, then one record per (row, kv head) in the
//! order of an f32 cache's `[rows, heads_kv, head_dim]` elements. A record's data word w holds
//! elements 4w .. 4w + 3 of its head, one byte each, element 4w in the low byte.
//!
//! - [`CacheFormat::Q8_0`] (llama.cpp's q8_0): blocks of 32 elements, each a signed byte
//!   times the block's f16 scale `d = amax / 127` (rounded to f16 to nearest even), the byte
//!   `round(x / d)` to nearest even, within ±127. The record's scales follow its data, two
//!   to a word (block 2s in the low half of word s); the record is padded to whole 16-byte
//!   words. No header. 1.125 bytes an element at head_dim 128 (f16: 2).
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
        if d == 0 || !d.is_multiple_of(Q8_BLOCK) {
            return Err(Error::Unsupported {
                feature: format!("a {} KV cache with head_dim {d}", self.name()),
                backend: crate::Backend::Wgpu,
                reason: "8-bit caches need head_dim a multiple of 32 (whole blocks and \
                         16-byte words per record)"
                    .into(),
            });
        }
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

/// One Q8_0 block: its f16 scale and bytes. A block holding NaN keeps a NaN scale (its
/// values read back NaN).
fn q8_block(x: &[f32]) -> (half::f16, Vec<i8>) {
    if x.iter().any(|v| v.is_nan()) {
        return (half::f16::NAN, vec![0; x.len()]);
    }
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = half::f16::from_f32(amax / 127.0);
    let inv = if d.to_f32() > 0.0 {
        1.0 / d.to_f32()
    } else {
        0.0
    };
    let bytes = x
        .iter()
        .map(|&v| (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8)
        .collect();
    (d, bytes)
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

    #[test]
    fn q8_0_keeps_each_value_within_half_a_step_of_its_block() {
        let shape = [1, 3, 2, 64];
        let data: Vec<f32> = (0..384)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let words = CacheFormat::Q8_0.quantize(&data, shape, None).unwrap();
        assert_eq!(words.len(), 6 * CacheFormat::Q8_0.record_words(64));
        let back = CacheFormat::Q8_0.dequantize(&words, shape).unwrap();
        for (blk, (x, y)) in data.chunks(32).zip(back.chunks(32)).enumerate() {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let step = half::f16::from_f32(amax / 127.0).to_f32();
            for (a, b) in x.iter().zip(y) {
                assert!(
                    (a - b).abs() <= step * 0.5001,
                    "block {blk}: {a} -> {b}, step {step}"
                );
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
