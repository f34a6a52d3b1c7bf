// DROPOUT: the RNG and the factor each pair's probability takes (src/modifiers/dropout.rs).
// The same function decides in the forward and in the backward (which so regenerates the
// forward's mask), and `Dropout::keeps` defines it for the reference and the CUDA kernels.

// The high 32 bits of the 64-bit product a * b (WGSL has no wide multiply): from 16-bit halves.
fn mul_hi(a: u32, b: u32) -> u32 {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let mid1 = a1 * b0;
    let mid2 = a0 * b1;
    let carry = (((a0 * b0) >> 16u) + (mid1 & 0xffffu) + (mid2 & 0xffffu)) >> 16u;
    return a1 * b1 + (mid1 >> 16u) + (mid2 >> 16u) + carry;
}

// Philox 4x32-10: four random words at counter `ctr` under `key`.
fn philox4x32_10(ctr: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = ctr;
    var k = key;
    for (var round = 0u; round < 10u; round++) {
        let m0 = 0xD2511F53u;
        let m1 = 0xCD9E8D57u;
        c = vec4<u32>(mul_hi(m1, c.z) ^ c.y ^ k.x, m1 * c.z, mul_hi(m0, c.x) ^ c.w ^ k.y, m0 * c.x);
        k += vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

// The factor pair (query row i, key j) of the current head (`begin_head`) takes with DROPOUT:
// 0 when dropped, 1 / (1 - p) when kept; 1 without DROPOUT, which folds away. The pair takes
// word j % 4 of the block at counter (offset + j / 4 as 64 bits, i, batch * heads_q + h) under
// the seed, with the whole call's indices (a windowed call's part adds its bases).
fn dropout_scale(i: u32, j: u32) -> f32 {
    if (!DROPOUT()) {
        return 1.0;
    }
    let gi = params.q_base + i;
    let gj = params.kv_base + j;
    let lo = params.offset_lo + (gj >> 2u);
    let hi = params.offset_hi + select(0u, 1u, lo < params.offset_lo);
    var r = philox4x32_10(vec4<u32>(lo, hi, gi, head_stream), vec2<u32>(params.seed_lo, params.seed_hi));
    return select(0.0, params.drop_scale, r[gj & 3u] >= params.drop_threshold);
}
