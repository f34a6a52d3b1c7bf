//! User score modifiers (`ScoreMod`) the tests share: each as WGSL, CUDA C and host functions
//! for the f64 reference, written three times so that each backend is checked against an
//! independent definition. `softcap` writes its WGSL derivative by hand; `rational` and `t5`
//! leave it to the crate to derive; `t5` and `dilated` leave their CUDA C to the crate's
//! translation of the WGSL.

use flash_attn_wgpu::ScoreMod;

/// The softcap c tanh(s / c), re-expressed as a user modifier (c = 1.5): must give the
/// built-in softcap's results.
pub fn softcap() -> ScoreMod {
    ScoreMod::wgsl(
        "
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return 1.5 * tanh(s / 1.5);
}
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    let t = tanh(s / 1.5);
    return 1.0 - t * t;
}
",
    )
    .unwrap()
    .with_cuda(
        "
__device__ float score_mod(float s, unsigned int b, unsigned int h, unsigned int i,
                           unsigned int j) {
    return 1.5f * tanhf(s / 1.5f);
}
__device__ float score_mod_ds(float s, unsigned int b, unsigned int h, unsigned int i,
                              unsigned int j) {
    const float t = tanhf(s / 1.5f);
    return 1.f - t * t;
}
",
    )
    .unwrap()
    .with_reference(
        |s, _, _, _, _| 1.5 * (s / 1.5).tanh(),
        |s, _, _, _, _| 1.0 - (s / 1.5).tanh().powi(2),
    )
}

/// One no built-in expresses: a rational cap s / (1 + |s| / 3) scaled per (batch, head),
/// plus a term by row and key, so that every argument reaches the function. Its WGSL
/// derivative is derived (no `score_mod_ds`): the backward against the reference's
/// hand-written slope checks the derivation on the GPU; the CUDA C keeps its own. Its
/// constants bear names that generated code has used (issue 61): `a0` was the twins' first
/// argument, which hid the constant inside them; `gen_v3` begins as the derivation's names do
/// now, so that they step to the next prefix.
pub fn rational() -> ScoreMod {
    ScoreMod::wgsl(
        "
const a0: f32 = 1.0;
const gen_v3: f32 = 0.05;
fn my_scale(b: u32, h: u32) -> f32 {
    return a0 + 0.1 * f32(h) + gen_v3 * f32(b);
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return my_scale(b, h) * s / (a0 + abs(s) / 3.0) + 0.05 * f32((i + 2u * j) % 5u);
}
",
    )
    .unwrap()
    .with_cuda(
        "
__device__ __forceinline__ float my_scale(unsigned int b, unsigned int h) {
    return 1.f + 0.1f * h + 0.05f * b;
}
__device__ float score_mod(float s, unsigned int b, unsigned int h, unsigned int i,
                           unsigned int j) {
    return my_scale(b, h) * s / (1.f + fabsf(s) / 3.f) + 0.05f * ((i + 2u * j) % 5u);
}
__device__ float score_mod_ds(float s, unsigned int b, unsigned int h, unsigned int i,
                              unsigned int j) {
    const float d = 1.f + fabsf(s) / 3.f;
    return my_scale(b, h) / (d * d);
}
",
    )
    .unwrap()
    .with_reference(
        |s, b, h, i, j| {
            let c = 1.0 + 0.1 * h as f64 + 0.05 * b as f64;
            c * s / (1.0 + s.abs() / 3.0) + 0.05 * ((i + 2 * j) % 5) as f64
        },
        |s, b, h, _, _| {
            let c = 1.0 + 0.1 * h as f64 + 0.05 * b as f64;
            c / (1.0 + s.abs() / 3.0).powi(2)
        },
    )
}

/// T5's bucketed relative positions: a learned bias per (query head, bucket of j - i), read
/// from a captured table `t5_bias` of `heads * 16` values (8 buckets each side: distances
/// 0-3 exact, then 4-7, 8-15, 16-31, 32 and more). Its WGSL derivative is derived, as
/// `rational`'s, and its CUDA C is the WGSL's translation (src/modifiers/to_cuda.rs): one
/// definition, three backends. Names that generated code has used (issue 61) are the
/// snippet's own: `a0` (the derived twins' first argument, which hid the constant; here it
/// scales the table read, so the trainable partial reads it too) and `fa_a0` (the CUDA
/// translation's, which hid the helper inside a function whose first argument it named).
pub fn t5(heads: usize, table: Vec<f32>) -> ScoreMod {
    assert_eq!(table.len(), heads * 16);
    let host_table = table.clone();
    ScoreMod::wgsl_with(
        "
const a0: f32 = 1.0;
fn fa_a0(n: u32) -> u32 {
    return select(select(select(7u, 6u, n < 32u), 5u, n < 16u), 4u, n < 8u);
}
fn my_bucket(i: u32, j: u32) -> u32 {
    let rel = i32(j) - i32(i);
    let side = select(0u, 8u, rel > 0);
    let n = u32(abs(rel));
    if (n < 4u) {
        return side + n;
    }
    return side + fa_a0(n);
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return s + a0 * t5_bias(h * 16u + my_bucket(i, j));
}
",
        [("t5_bias", table)],
    )
    .unwrap()
    .with_reference(
        move |s, _, h, i, j| {
            let rel = j as i64 - i as i64;
            let side = if rel > 0 { 8 } else { 0 };
            let n = rel.unsigned_abs() as usize;
            let bucket = side
                + match n {
                    0..=3 => n,
                    4..=7 => 4,
                    8..=15 => 5,
                    16..=31 => 6,
                    _ => 7,
                };
            s + host_table[h * 16 + bucket] as f64
        },
        |_, _, _, _, _| 1.0,
    )
}

/// T5's buckets of `t5` (the same WGSL, so the same forward pipelines) with the table
/// trainable: the backward also returns `d_table`; the reference's partial is 1 at the entry
/// of the pair's (head, bucket).
pub fn t5_trainable(heads: usize, table: Vec<f32>) -> ScoreMod {
    t5(heads, table)
        .with_trainable("t5_bias")
        .unwrap()
        .with_table_reference(|_, _, h, i, j| (h * 16 + t5_bucket(i, j), 1.0))
}

/// The bucket of `t5`'s WGSL for row i and key j.
pub fn t5_bucket(i: usize, j: usize) -> usize {
    let rel = j as i64 - i as i64;
    let side = if rel > 0 { 8 } else { 0 };
    let n = rel.unsigned_abs() as usize;
    side + match n {
        0..=3 => n,
        4..=7 => 4,
        8..=15 => 5,
        16..=31 => 6,
        _ => 7,
    }
}

/// Learnable ALiBi-style slopes (`[heads]`) and a per-(head, key) gain (`[heads, keys]`), two
/// captured tensors of one WGSL text, so that both share their attention pipelines; `which`
/// ("slope" or "gain") is trainable. The slope's partial is -|j - i| / 8; the gain's is the
/// score itself, so its gradient checks the score the kernels keep for it.
pub fn slope_and_gain(keys: usize, slope: Vec<f32>, gain: Vec<f32>, which: &str) -> ScoreMod {
    assert_eq!(gain.len(), slope.len() * keys);
    let (hs, hg) = (slope.clone(), gain.clone());
    let dg = gain.clone();
    let m = ScoreMod::wgsl_with(
        &format!(
            "
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {{
    let d = f32(abs(i32(j) - i32(i)));
    return s * gain(h * {keys}u + j) - slope(h) * d * 0.125;
}}
"
        ),
        [("slope", slope), ("gain", gain)],
    )
    .unwrap()
    .with_reference(
        move |s, _, h, i, j| {
            s * hg[h * keys + j] as f64 - hs[h] as f64 * (j as f64 - i as f64).abs() * 0.125
        },
        move |_, _, h, _, j| dg[h * keys + j] as f64,
    )
    .with_trainable(which)
    .unwrap();
    match which {
        "slope" => {
            m.with_table_reference(|_, _, h, i, j| (h, -(j as f64 - i as f64).abs() * 0.125))
        }
        _ => m.with_table_reference(move |s, _, h, _, j| (h * keys + j, s)),
    }
}

/// A document mask: pair (i, j) takes part when row i and key j lie in the same document, the
/// documents given as one id per position in a captured tensor `doc_id`.
pub fn documents(doc_id: Vec<f32>) -> flash_attn_wgpu::MaskMod {
    let host = doc_id.clone();
    flash_attn_wgpu::MaskMod::wgsl_with(
        "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return doc_id(i) == doc_id(j); }",
        [("doc_id", doc_id)],
    )
    .unwrap()
    .with_cuda(
        "__device__ bool mask_mod(unsigned int b, unsigned int h, unsigned int i, unsigned int j) \
         { return doc_id(i) == doc_id(j); }",
    )
    .unwrap()
    .with_reference(move |_, _, i, j| host[i] == host[j])
}

/// Prefix-LM: every row sees the first `prefix` keys, and the others causally: FlexAttention's
/// `or_masks(prefix, causal)`, the causal half written with the signed distance
/// `i32(j) - i32(i)` a port of `kv_idx - q_idx` takes (`MaskMod`'s docs).
pub fn prefix_lm(prefix: u32) -> flash_attn_wgpu::MaskMod {
    let keys = flash_attn_wgpu::MaskMod::wgsl(&format!(
        "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {{ return j < {prefix}u; }}"
    ))
    .unwrap()
    .with_cuda(&format!(
        "__device__ bool mask_mod(unsigned int b, unsigned int h, unsigned int i, unsigned int j) \
         {{ return j < {prefix}u; }}"
    ))
    .unwrap()
    .with_reference(move |_, _, _, j| j < prefix as usize);
    flash_attn_wgpu::MaskMod::or_masks(&[&keys, &causal()]).unwrap()
}

/// Causal (top-left aligned: key j seen from row i when j <= i), as a user mask over the
/// signed distance.
pub fn causal() -> flash_attn_wgpu::MaskMod {
    flash_attn_wgpu::MaskMod::wgsl(
        "fn distance(i: u32, j: u32) -> i32 { return i32(j) - i32(i); }
fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return distance(i, j) <= 0; }",
    )
    .unwrap()
    .with_cuda(
        "__device__ int distance(unsigned int i, unsigned int j) { return (int)j - (int)i; }
__device__ bool mask_mod(unsigned int b, unsigned int h, unsigned int i, unsigned int j) \
         { return distance(i, j) <= 0; }",
    )
    .unwrap()
    .with_reference(|_, _, i, j| j <= i)
}

/// A dilated (strided) mask, a different stride per head: key j is seen from row i when
/// i - j is a multiple of h + 2 (j = i included), over the signed distance; as
/// `and_masks(dilated, noop_mask)`, the noop mask being and's identity; its CUDA C is the
/// WGSL's translation.
pub fn dilated() -> flash_attn_wgpu::MaskMod {
    let strided = flash_attn_wgpu::MaskMod::wgsl(
        "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool {
    return (i32(i) - i32(j)) % i32(h + 2u) == 0;
}",
    )
    .unwrap()
    .with_reference(|_, h, i, j| (i as i64 - j as i64) % (h as i64 + 2) == 0);
    flash_attn_wgpu::MaskMod::and_masks(&[&strided, &flash_attn_wgpu::MaskMod::noop_mask()])
        .unwrap()
}
