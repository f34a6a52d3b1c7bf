// 8-bit KV-cache formats (src/kv_format.rs: layouts, and the host codec this mirrors).
// A word holds four elements, one byte each, the first in the low byte. The generated
// prelude defines KV_Q8 (q8_0 when true, E4M3 when false), KV_RW (words a record) and the
// cache bindings' loads, which call these.

// The words before the first record: E4M3's per-kv-head f32 scales, padded to 4 words.
fn kv_header() -> u32 {
    return select((params.heads_kv + 3u) & ~3u, 0u, KV_Q8);
}

// q8_0: four signed bytes, sign-extended by shifting each to the top and back.
fn q8_bytes(w: u32) -> vec4<f32> {
    let top = bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u));
    return vec4<f32>(top >> vec4<u32>(24u));
}

// E4M3: magnitudes of 8 and up are normals (exponent rebiased 7 -> 127 by adding 120 to it),
// below that multiples of 2^-9; 0x7f is NaN; bit 7 the sign.
fn e4m3_bytes(w: u32) -> vec4<f32> {
    let b = (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
    let mag = b & vec4<u32>(0x7fu);
    // NaN from its bits at run time (a NaN literal is not valid WGSL)
    let bits = select((mag << vec4<u32>(20u)) + vec4<u32>(120u << 23u), vec4<u32>(0x7fc00000u), mag == vec4<u32>(0x7fu));
    let v = select(vec4<f32>(mag) * (1.0 / 512.0), bitcast<vec4<f32>>(bits), mag >= vec4<u32>(8u));
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) | ((b & vec4<u32>(0x80u)) << vec4<u32>(24u)));
}

fn kv_bytes(w: u32) -> vec4<f32> {
    if (KV_Q8) {
        return q8_bytes(w);
    }
    return e4m3_bytes(w);
}

// E4M3's byte for x: nearest even on its grid, saturated at 448 (0x7e). Subnormals are
// multiples of 2^-9 (round() rounds halves to even); normals round f32's mantissa to 3 bits,
// carrying into the exponent, and rebias 127 -> 7.
fn e4m3_byte(x: f32) -> u32 {
    let sign = (bitcast<u32>(x) >> 24u) & 0x80u;
    let a = abs(x);
    var mag = u32(round(a * 512.0));
    if (a >= 1.0 / 64.0) {
        let b = bitcast<u32>(min(a, 896.0));
        mag = min(((b + 0x7ffffu + ((b >> 20u) & 1u)) >> 20u) - (120u << 3u), 0x7eu);
    }
    return sign | mag;
}
