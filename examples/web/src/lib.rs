//! Forward and backward on the WebGPU adapter that the JavaScript host provides
//! (`navigator.gpu`: a browser, or Node.js with Dawn's `webgpu` package), checked against
//! the crate's f64 reference on random inputs: f32 and f16, causal GQA, odd sizes. Every
//! wait is an `await` (`Context::new_async`, `download_async`): nothing blocks the page.

use flash_attn_wgpu::unstable::reference;
use flash_attn_wgpu::{from_f32_slice, to_f32_vec, AttentionConfig, Context, Element, Shape};
use wasm_bindgen::prelude::*;

/// One case's largest relative errors, as the page and the Node check print them.
struct Report {
    name: String,
    errors: [(&'static str, f64); 5],
}

/// A small xorshift generator: fresh inputs from a seed the host passes in.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * amp).collect()
    }
}

/// max |got - want| / max(max |want|, floor), with `floor` the size of the terms a gradient
/// sums (a gradient that cancels to ~0 is judged against them).
fn rel_err(got: &[f32], want: &[f64], floor: f64) -> f64 {
    let scale = want.iter().fold(floor, |m, w| m.max(w.abs()));
    let worst = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((*g as f64 - w).abs()));
    if got.len() != want.len() || got.iter().any(|g| !g.is_finite()) {
        return f64::INFINITY;
    }
    worst / scale.max(f64::MIN_POSITIVE)
}

async fn case<T: Element>(
    ctx: &Context,
    cfg: &AttentionConfig,
    seed: u64,
) -> Result<Report, String> {
    let e = |e: flash_attn_wgpu::Error| e.to_string();
    let mut rng = Rng(seed | 1);
    let nq: usize = cfg.q_shape().iter().product();
    let nk: usize = cfg.kv_shape().iter().product();
    // inputs rounded to T first: the reference sees exactly what the GPU sees
    let round = |x: Vec<f32>| -> (Vec<T>, Vec<f32>) {
        let t = from_f32_slice::<T>(&x);
        let r = to_f32_vec(&t);
        (t, r)
    };
    let (q, qr) = round(rng.vec(nq, 1.5));
    let (k, kr) = round(rng.vec(nk, 1.5));
    let (v, vr) = round(rng.vec(nk, 1.0));
    let (d_out, dor) = round(rng.vec(nq, 1.0));
    let up = |x: &[T], s: [usize; 4]| ctx.upload(x, &s).map_err(e);
    let (qt, kt, vt) = (
        up(&q, cfg.q_shape())?,
        up(&k, cfg.kv_shape())?,
        up(&v, cfg.kv_shape())?,
    );
    let f = ctx.forward(cfg, &qt, &kt, &vt).map_err(e)?;
    let d_out_t = up(&d_out, cfg.q_shape())?;
    let g = ctx
        .backward(cfg, &qt, &kt, &vt, &f.out, &f.lse, &d_out_t)
        .map_err(e)?;
    let out = to_f32_vec(&ctx.download_async::<T>(&f.out).await.map_err(e)?);
    let lse = ctx.download_async::<f32>(&f.lse).await.map_err(e)?;
    let dq = to_f32_vec(&ctx.download_async::<T>(&g.dq).await.map_err(e)?);
    let dk = to_f32_vec(&ctx.download_async::<T>(&g.dk).await.map_err(e)?);
    let dv = to_f32_vec(&ctx.download_async::<T>(&g.dv).await.map_err(e)?);
    let want = reference::forward(cfg, &qr, &kr, &vr);
    // the backward's delta = rowsum(dO * out) uses the stored (rounded) out, as the kernels do
    let wg = reference::backward_with_out(cfg, &qr, &kr, &vr, &out, &dor);
    let max = |x: &[f32]| x.iter().fold(0.0f64, |m, y| m.max(y.abs() as f64));
    let dp = (cfg.head_dim as f64).sqrt() * max(&dor) * max(&vr);
    let s = cfg.scale() as f64;
    let lse_err = lse
        .iter()
        .zip(&want.lse)
        .fold(0.0f64, |m, (g, w)| m.max((*g as f64 - w).abs()));
    Ok(Report {
        name: format!("{} {:?}", T::DTYPE, cfg.shape()),
        errors: [
            ("out", rel_err(&out, &want.out, 0.0)),
            ("lse (abs)", lse_err),
            ("dq", rel_err(&dq, &wg.dq, s * dp * max(&kr))),
            ("dk", rel_err(&dk, &wg.dk, s * dp * max(&qr))),
            ("dv", rel_err(&dv, &wg.dv, max(&dor))),
        ],
    })
}

/// Runs every case and returns one line per case (`ok` or `FAIL`, the adapter first);
/// rejects with the first error a call returns. A case fails past the suite's tolerances:
/// 1e-4 plus the dtype's unit roundoff (twice it for gradients) relative to the largest
/// reference value, and 1e-4 absolute for lse (the limits tests/ hold the kernels to).
#[wasm_bindgen]
pub async fn run_checks(seed: u32) -> Result<String, JsValue> {
    let ctx = Context::new_async()
        .await
        .map_err(|e| JsValue::from_str(&e.to_string()))?;
    let info = ctx.adapter_info();
    let mut lines = vec![format!(
        "adapter: {} ({}, f16 {}, subgroups {})",
        info.name, info.backend, info.shader_f16, info.subgroups
    )];
    let mut cfg = AttentionConfig::from_shape(Shape {
        batch: 2,
        seq_q: 37,
        seq_kv: 45,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 32,
    });
    cfg.causal = true;
    let mut failed = false;
    for (n, report) in [
        case::<f32>(&ctx, &cfg, seed as u64 * 7919 + 1).await,
        case::<half::f16>(&ctx, &cfg, seed as u64 * 7919 + 2).await,
    ]
    .into_iter()
    .enumerate()
    {
        let r = report.map_err(|e| JsValue::from_str(&e))?;
        let u = if n == 0 {
            2f64.powi(-24)
        } else {
            2f64.powi(-11)
        };
        let ok = r.errors.iter().all(|(what, err)| {
            let tol = match *what {
                "lse (abs)" => 1e-4,
                "out" => 1e-4 + u,
                _ => 1e-4 + 2.0 * u,
            };
            *err <= tol
        });
        failed |= !ok;
        let errs: Vec<String> = r
            .errors
            .iter()
            .map(|(w, e)| format!("{w} {e:.2e}"))
            .collect();
        lines.push(format!(
            "{} {}: {}",
            if ok { "ok" } else { "FAIL" },
            r.name,
            errs.join(", ")
        ));
    }
    let text = lines.join("\n");
    if failed {
        return Err(JsValue::from_str(&text));
    }
    Ok(text)
}
