use flash_attn_wgpu::*;
use std::time::Instant;
fn main() {
    let ctx = Context::new().unwrap();
    let d: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let mut tu = ctx.tuning();
    tu.variant = match std::env::args().nth(2).as_deref() { Some("lanes") => Variant::Lanes, Some("rows") => Variant::Rows, _ => Variant::Blocks };
    ctx.set_tuning(tu).unwrap();
    let c = AttentionConfig::new(1, 33, 33, 2, 2, d);
    let q = vec![0.5f32; 33 * 2 * d];
    let t0 = Instant::now();
    let f = ctx.forward_host(&c, &q, &q, &q).unwrap();
    let t1 = t0.elapsed();
    let t0 = Instant::now();
    let _ = ctx.backward_host(&c, &q, &q, &q, &f.out, &f.lse, &q).unwrap();
    println!("d={d}: fwd {:?} bwd {:?}", t1, t0.elapsed());
}
