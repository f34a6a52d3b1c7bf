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
        for (var g = 0u; g < HEAD_DIM / 32u; g++) {
            let b0 = x0 + g * 32u;
            var amax = 0.0;
            for (var k = 0u; k < 32u; k++) {
                amax = max(amax, abs(load_src(b0 + k)));
            }
            // the scale rounded to f16 first, so that the bytes are of the scale stored
            let bits = f32_to_f16_bits(amax / 127.0);
            let d = unpack2x16float(bits).x;
            let inv = select(0.0, 1.0 / d, d > 0.0);
            for (var w = 0u; w < 8u; w++) {
                var word = 0u;
                for (var k = 0u; k < 4u; k++) {
                    let q = i32(clamp(round(load_src(b0 + 4u * w + k) * inv), -127.0, 127.0));
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
