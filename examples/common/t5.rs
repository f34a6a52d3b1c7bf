//! T5's relative-position buckets as WGSL, and the deterministic inputs the modifier-cost
//! examples time them on. Included by the examples as `mod t5`.

/// `t5_bucket(i, j)`: the bucket of j - i, 8 a side: distances 0-3 exact, then 4-7, 8-15,
/// 16-31, 32 and more.
pub const T5_BUCKET: &str = "
fn t5_bucket(i: u32, j: u32) -> u32 {
    let rel = i32(j) - i32(i);
    let side = select(0u, 8u, rel > 0);
    let n = u32(abs(rel));
    if (n < 4u) {
        return side + n;
    }
    return side + select(select(select(7u, 6u, n < 32u), 5u, n < 16u), 4u, n < 8u);
}";

/// T5's score modifier over a captured `table` of heads x 16 values, its buckets included.
#[allow(dead_code)] // flex.rs writes its own score_mod around the buckets
pub fn t5_score_mod() -> String {
    format!(
        "{T5_BUCKET}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {{
    return s + table(h * 16u + t5_bucket(i, j));
}}
"
    )
}

/// A table of heads x 16 values in [-0.5, 0.5), the same every run.
#[allow(dead_code)]
pub fn t5_table(heads: usize) -> Vec<f32> {
    (0..heads * 16)
        .map(|k| ((k * 7) % 13) as f32 / 13.0 - 0.5)
        .collect()
}

/// `len` values in [-0.5, 0.5], the same every run for a `salt`.
#[allow(dead_code)]
pub fn filled(len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7 + salt) % 23) as f32 - 11.0) / 22.0)
        .collect()
}

/// q, k, v and d_out of `shape` (`[batch, seq, heads, head_dim]`, one shape for all four) on
/// the device, [`filled`] with salts 1 to 4.
#[allow(dead_code)]
pub fn uploaded(
    ctx: &flash_attn_wgpu::Context,
    shape: [usize; 4],
) -> flash_attn_wgpu::Result<[flash_attn_wgpu::Tensor; 4]> {
    let len = shape.iter().product();
    let up = |salt| ctx.upload(&filled(len, salt), &shape);
    Ok([up(1)?, up(2)?, up(3)?, up(4)?])
}
