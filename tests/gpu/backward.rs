//! The backward pass of both algorithms matches the f64 reference gradients.

use crate::common;
use common::{cfg, check_backward, ctx, inputs};
use flash_attn_wgpu::{unstable::reference, Algorithm};

#[test]
fn reference_backward_matches_finite_differences() {
    // The analytic f64 gradients against central differences of the f64 forward.
    // plain, causal, softcap (small c: tanh far from linear), a window with causal
    let mut capped = cfg(1, 6, 5, 2, 1, 4, false);
    capped.softcap = Some(0.7);
    let mut windowed = cfg(1, 7, 9, 2, 1, 3, true);
    windowed.window = flash_attn_wgpu::Window::new(Some(2), Some(1));
    // ALiBi (per batch and head) with the softcap and sinks: ALiBi's term inside the softcap's
    // slope would show here, and d_sinks is checked against differences in the sinks below
    let mut modded = cfg(2, 6, 7, 2, 1, 3, true);
    modded.softcap = Some(0.9);
    modded.alibi_slopes = Some(common::random_alibi(&modded, true));
    modded.sinks = Some(common::random_sinks(&modded));
    modded.seqlens_kv = Some(vec![7, 4]);
    // dropout (a fixed mask: the forward is smooth in q, k, v), with GQA and causal
    let mut dropped = cfg(1, 6, 8, 2, 1, 3, true);
    dropped.dropout = Some(common::random_dropout(0.4));
    // a block mask (2 x 3 blocks, one grid per head)
    dropped.block_mask = Some(common::random_block_mask(
        &dropped,
        (2, 3),
        false,
        true,
        0.6,
    ));
    // a user's score modifier after the softcap and ALiBi: its host derivative against
    // differences of its host function
    let mut user = cfg(2, 6, 7, 2, 1, 3, false);
    user.softcap = Some(1.1);
    user.alibi_slopes = Some(common::random_alibi(&user, false));
    user.score_mod = Some(common::score_mods::rational());
    for c in [
        cfg(1, 5, 7, 2, 1, 4, false),
        cfg(1, 7, 5, 2, 2, 3, true),
        user,
        capped,
        windowed,
        modded,
        dropped,
    ] {
        let data = inputs(&c, 1.0);
        let g = reference::backward(&c, &data.q, &data.k, &data.v, &data.d_out);
        let loss = |q: &[f32], k: &[f32], v: &[f32]| loss_of(&c, &data.d_out, q, k, v);
        let h = 1e-3f32;
        for (which, grad) in [(0, &g.dq), (1, &g.dk), (2, &g.dv)] {
            for idx in 0..grad.len() {
                let mut t = [data.q.clone(), data.k.clone(), data.v.clone()];
                let x0 = t[which][idx];
                t[which][idx] = x0 + h;
                let up = loss(&t[0], &t[1], &t[2]);
                t[which][idx] = x0 - h;
                let down = loss(&t[0], &t[1], &t[2]);
                let fd = (up - down) / (2.0 * h as f64);
                assert!(
                    (fd - grad[idx]).abs() <= 1e-3 * (1.0 + fd.abs()),
                    "tensor {which} [{idx}]: analytic {} vs finite difference {fd} (seed {})",
                    grad[idx],
                    data.seed
                );
            }
        }
        // d_sinks against differences of the loss in each sink
        if let (Some(sinks), Some(grad)) = (&c.sinks, &g.d_sinks) {
            for h in 0..sinks.len() {
                let at = |x: f32| {
                    let mut c2 = c.clone();
                    c2.sinks.as_mut().unwrap()[h] = x;
                    loss_of(&c2, &data.d_out, &data.q, &data.k, &data.v)
                };
                let fd =
                    (at(sinks[h] + h_sink()) - at(sinks[h] - h_sink())) / (2.0 * h_sink() as f64);
                assert!(
                    (fd - grad[h]).abs() <= 1e-3 * (1.0 + fd.abs()),
                    "d_sinks[{h}]: analytic {} vs finite difference {fd} (seed {})",
                    grad[h],
                    data.seed
                );
            }
        } else {
            assert!(c.sinks.is_none() && g.d_sinks.is_none());
        }
    }
}

#[test]
fn reference_bias_gradient_matches_finite_differences() {
    // A bias shared by batches (d_bias sums them) under a softcap (the bias joins after it:
    // the softcap's slope must not reach d_bias, and must leave the bias out for dq, dk), with
    // ALiBi, dropout and a hidden (-inf) entry.
    let mut c = cfg(2, 5, 6, 2, 1, 3, true);
    c.softcap = Some(0.8);
    c.alibi_slopes = Some(common::random_alibi(&c, false));
    c.dropout = Some(common::random_dropout(0.3));
    let bias = common::random_bias(&c, false, true, 0.1, 0);
    c.bias = Some(bias.clone());
    let data = inputs(&c, 1.0);
    let g = reference::backward(&c, &data.q, &data.k, &data.v, &data.d_out);
    let loss = |c: &flash_attn_wgpu::AttentionConfig, q: &[f32], k: &[f32], v: &[f32]| {
        loss_of(c, &data.d_out, q, k, v)
    };
    let h = 1e-3f32;
    let d_bias = g.d_bias.as_ref().expect("d_bias asked for");
    assert_eq!(d_bias.len(), bias.len());
    for (idx, &analytic) in d_bias.iter().enumerate() {
        let x0 = bias.value((0, idx / 30, idx / 6 % 5, idx % 6));
        let at = |x: f32| {
            let mut c2 = c.clone();
            let mut n = 0;
            c2.bias = Some(
                flash_attn_wgpu::ScoreBias::from_fn(bias.shape().into(), |b, h, i, j| {
                    n += 1;
                    if n - 1 == idx {
                        x
                    } else {
                        bias.value((b, h, i, j))
                    }
                })
                .unwrap(),
            );
            loss(&c2, &data.q, &data.k, &data.v)
        };
        // a hidden entry stays hidden: its gradient is 0
        let fd = if x0 == f32::NEG_INFINITY {
            0.0
        } else {
            (at(x0 + h) - at(x0 - h)) / (2.0 * h as f64)
        };
        assert!(
            (fd - analytic).abs() <= 1e-3 * (1.0 + fd.abs()),
            "d_bias[{idx}]: analytic {analytic} vs finite difference {fd} (seed {})",
            data.seed
        );
    }
    // dq through the softcap with the bias beside it
    for idx in 0..data.q.len() {
        let mut q = data.q.clone();
        q[idx] += h;
        let up = loss(&c, &q, &data.k, &data.v);
        q[idx] -= 2.0 * h;
        let down = loss(&c, &q, &data.k, &data.v);
        let fd = (up - down) / (2.0 * h as f64);
        assert!(
            (fd - g.dq[idx]).abs() <= 1e-3 * (1.0 + fd.abs()),
            "dq[{idx}]: analytic {} vs finite difference {fd} (seed {})",
            g.dq[idx],
            data.seed
        );
    }
}

/// The loss whose gradients the reference's backward gives: sum(out * d_out), out from the
/// f64 reference forward of `c`.
fn loss_of(
    c: &flash_attn_wgpu::AttentionConfig,
    d_out: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> f64 {
    let f = reference::forward(c, q, k, v);
    f.out.iter().zip(d_out).map(|(o, d)| o * *d as f64).sum()
}

/// The step of the sinks' central differences.
fn h_sink() -> f32 {
    1e-3
}

#[test]
fn odd_lengths() {
    for s in [1, 17, 113] {
        check_backward(&cfg(1, s, s, 2, 2, 32, false), 1.0);
    }
}

#[test]
fn causal_odd_lengths() {
    for s in [17, 113, 203] {
        check_backward(&cfg(1, s, s, 2, 2, 32, true), 1.0);
    }
}

#[test]
fn long_sequence_1000() {
    check_backward(&cfg(1, 1000, 1000, 1, 1, 32, true), 1.0);
}

#[test]
fn seq_q_differs_from_seq_kv_both_ways() {
    for causal in [false, true] {
        check_backward(&cfg(1, 203, 17, 2, 2, 32, causal), 1.0);
        check_backward(&cfg(1, 17, 203, 2, 2, 32, causal), 1.0);
    }
}

#[test]
fn rows_with_no_visible_key_have_zero_gradient() {
    check_backward(&cfg(2, 40, 9, 2, 1, 16, true), 1.0);
}

#[test]
fn grouped_and_multi_query_attention() {
    check_backward(&cfg(2, 77, 77, 8, 2, 32, false), 1.0);
    check_backward(&cfg(1, 77, 61, 4, 1, 64, true), 1.0);
}

#[test]
fn every_listed_head_dim() {
    // (CI: 16 and 256, the smallest and the largest; tier.rs)
    for d in common::tier::sample(&[16, 32, 64, 80, 96, 128, 256], &[0, 6]) {
        check_backward(&cfg(1, 37, 45, 2, 1, d, true), 1.0);
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn odd_head_dims() {
    for d in [1, 7, 33] {
        check_backward(&cfg(1, 29, 23, 1, 1, d, false), 1.0);
    }
}

#[test]
fn batch_greater_than_one() {
    check_backward(&cfg(3, 41, 57, 2, 2, 32, false), 1.0);
}

#[test]
fn large_logits() {
    check_backward(&cfg(1, 113, 113, 2, 2, 64, true), 8.0);
}

#[test]
fn tiled_backward_is_bit_identical_run_to_run() {
    let c = cfg(2, 150, 130, 4, 2, 64, true);
    let data = inputs(&c, 1.0);
    let f = ctx().forward_host(&c, &data.q, &data.k, &data.v).unwrap();
    let a = ctx()
        .backward_host(&c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
        .unwrap();
    let b = ctx()
        .backward_host(&c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
        .unwrap();
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.dq), bits(&b.dq));
    assert_eq!(bits(&a.dk), bits(&b.dk));
    assert_eq!(bits(&a.dv), bits(&b.dv));
}

#[test]
fn device_tensors_chain_forward_into_backward() {
    // The forward's out and lse feed the backward exactly as returned, on the device.
    let mut c = cfg(1, 64, 80, 2, 1, 32, true);
    c.algorithm = Algorithm::Tiled;
    let data = inputs(&c, 1.0);
    let x = ctx();
    let q = x.upload(&data.q, &c.q_shape()).unwrap();
    let k = x.upload(&data.k, &c.kv_shape()).unwrap();
    let v = x.upload(&data.v, &c.kv_shape()).unwrap();
    let d_out = x.upload(&data.d_out, &c.q_shape()).unwrap();
    let f = x.forward(&c, &q, &k, &v).unwrap();
    let g = x.backward(&c, &q, &k, &v, &f.out, &f.lse, &d_out).unwrap();
    let want = reference::backward(&c, &data.q, &data.k, &data.v, &data.d_out);
    let msg = format!("seed {}", data.seed);
    common::assert_close("dq", &x.download(&g.dq).unwrap(), &want.dq, &msg);
    common::assert_close("dk", &x.download(&g.dk).unwrap(), &want.dk, &msg);
    common::assert_close("dv", &x.download(&g.dv).unwrap(), &want.dv, &msg);
}
