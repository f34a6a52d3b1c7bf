// The quantizing append of a KV-cache call into an 8-bit cache (src/kvcache/quantized.rs;
// formats: shaders/kv_format.wgsl): the new keys or values, [batch, new, heads_kv, head_dim]
// in the call's format, each record (a row of one kv head) written at its cache row
// (`rows` from word params.pairs_base: each new row's row in the cache, through the block table of a paged one). One
// invocation per record, so that each writes whole words and no word is shared.
// Grid: ceil(total_items / 64) workgroups, folded; total_items = new rows x heads_kv.

// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

fn item(e: u32) {
    let h = e % params.heads_kv;
    let at = kv_header() + (rows[params.pairs_base + e / params.heads_kv] * params.heads_kv + h) * KV_RW;
    let x0 = e * HEAD_DIM;
    if (KV_Q8) {
        // ggml's quantize_row_q8_0_ref, bit for bit with the host's codec (src/kv_format.rs:
        // q8_block): d = amax / 127 in f32, the scale f16(d), each byte round(x / d) as
        // roundf(x * (1 / d)), half away from zero, with the f32 d; values below f32's
        // smallest normal count as 0, and a block of amax below 127 x 2^-126 is zeros
        for (var g = 0u; g < HEAD_DIM / 32u; g++) {
            let b0 = x0 + g * 32u;
            var amax = 0.0;
            for (var k = 0u; k < 32u; k++) {
                amax = max(amax, abs(q8_input(load_src(b0 + k))));
            }
            var bits = 0u;
            var id = 0.0;
            // 127 x 2^-126, compared as bits (amax is not negative)
            if (bitcast<u32>(amax) >= 0x03fe0000u) {
                let d = q8_div(amax, 127.0);
                bits = f32_to_f16_bits(d);
                id = q8_div(1.0, d);
            }
            for (var w = 0u; w < 8u; w++) {
                var word = 0u;
                for (var k = 0u; k < 4u; k++) {
                    let q = q8_round(q8_input(load_src(b0 + 4u * w + k)) * id);
                    word |= (bitcast<u32>(q) & 0xffu) << (8u * k);
                }
                cache[at + g * 8u + w] = word;
            }
            // two scales a word: an odd block's goes into the high half of its even one's
            let sw = at + HEAD_DIM / 4u + g / 2u;
            if ((g & 1u) == 0u) {
                cache[sw] = bits;
            } else {
                cache[sw] |= bits << 16u;
            }
        }
    } else {
        let s = bitcast<f32>(cache[h]);
        for (var w = 0u; w < HEAD_DIM / 4u; w++) {
            var word = 0u;
            for (var k = 0u; k < 4u; k++) {
                word |= e4m3_byte(load_src(x0 + 4u * w + k) / s) << (8u * k);
            }
            cache[at + w] = word;
        }
    }
}

// q8_0's input: x, or 0 where x is below f32's smallest normal (a subnormal, which some
// GPUs flush and others keep: 0 on every one)
fn q8_input(x: f32) -> f32 {
    return select(x, 0.0, (bitcast<u32>(x) & 0x7f800000u) == 0u);
}

// a / b rounded to nearest even, exactly (WGSL's division may be 2.5 ulps off), for positive
// normal a and b with a normal quotient: 25 bits of the quotient of the significands by long
// division (24 and a rounding bit), the remainder's being 0 breaking ties.
fn q8_div(a: f32, b: f32) -> f32 {
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    var r = (ab & 0x7fffffu) | 0x800000u;
    let m = (bb & 0x7fffffu) | 0x800000u;
    var e = i32(ab >> 23u) - i32(bb >> 23u) + 127;
    if (r < m) {
        r = r << 1u;
        e -= 1;
    }
    var q = 0u;
    for (var i = 0u; i < 25u; i++) {
        q = q << 1u;
        if (r >= m) {
            r -= m;
            q |= 1u;
        }
        r = r << 1u;
    }
    let s = q >> 1u;
    let up = (q & 1u) == 1u && (r != 0u || (s & 1u) == 1u);
    // the carry of a rounding up runs into the exponent
    return bitcast<f32>((u32(e) << 23u) + (s & 0x7fffffu) + select(0u, 1u, up));
}

// roundf(y), half away from zero, clamped to +-127: on y's bits in integers, so that the
// rounded product y is all that is rounded (no float operation to fuse or reassociate)
fn q8_round(y: f32) -> i32 {
    let b = bitcast<u32>(y);
    let e = i32((b >> 23u) & 0xffu) - 127;
    var mag = 127u;
    if (e < -1) {
        mag = 0u;
    } else if (e < 7) {
        // |y| = m 2^(e - 23); adding half of its unit place, then dropping the fraction
        let m = (b & 0x7fffffu) | 0x800000u;
        let s = u32(23 - e);
        mag = min((m + (1u << (s - 1u))) >> s, 127u);
    }
    return select(i32(mag), -i32(mag), (b >> 31u) == 1u);
}
