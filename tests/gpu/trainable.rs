//! Trainable captured tensors (`ScoreMod::with_trainable`): the backward's `d_table` against
//! the f64 reference, the reference against central finite differences of its own loss
//! (sum(d_out * out)) in the table's entries, and the same bits run to run. T5's buckets (an
//! additive [heads, 16] table), per-head slopes and a per-(head, key) gain (`[heads, keys]`,
//! whose partial is the score itself), beside a bias's gradient; tensors the dQ kernels sum
//! themselves and a longer one summed from kept pairs. The snippet rules are the library's
//! unit tests.

use crate::common;
use common::{assert_close_floor, cfg, ctx, inputs, score_mods};
use flash_attn_wgpu::unstable::reference;
use flash_attn_wgpu::{AttentionConfig, ScoreMod};

/// The device's d_table for `c` (whose score_mod is `make(table)`), twice (the same bits),
/// against the reference's; and the reference's against central differences of its loss in
/// the entries `probe`.
fn check(c: &AttentionConfig, make: &dyn Fn(Vec<f32>) -> ScoreMod, table: &[f32], probe: &[usize]) {
    let data = inputs(c, 1.0);
    let msg = common::describe(c, data.seed);
    let run = || {
        let f = ctx().forward_host(c, &data.q, &data.k, &data.v).unwrap();
        ctx()
            .backward_host(c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
            .unwrap()
    };
    let run = || {
        let g = run();
        (
            g.d_table
                .expect("a trainable tensor's backward returns d_table"),
            g.d_bias,
        )
    };
    let ((got, d_bias), (again, _)) = (run(), run());
    assert_eq!(got.len(), table.len());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&got),
        bits(&again),
        "d_table differs run to run ({msg})"
    );
    let reference = reference::backward(c, &data.q, &data.k, &data.v, &data.d_out);
    if let (Some(got), Some(want)) = (&d_bias, &reference.d_bias) {
        // kept beside the table's scores (two words a pair)
        let floor = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        assert_close_floor("d_bias", got, want, 2e-4, floor, &msg);
    }
    assert_eq!(d_bias.is_some(), c.bias.as_ref().is_some_and(|b| b.grad));
    let want = reference.d_table.unwrap();
    assert!(
        want.iter().any(|x| x.abs() > 1e-3),
        "a vanishing gradient tests nothing"
    );
    // each entry sums many pairs' terms, which cancel (a row's gradients sum to 0)
    let floor = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    assert_close_floor("d_table", &got, &want, 2e-4, floor, &msg);
    // the reference's gradient is the derivative of its own loss
    let loss = |t: Vec<f32>| {
        let mut c = c.clone();
        c.score_mod = Some(make(t));
        let out = reference::forward(&c, &data.q, &data.k, &data.v).out;
        out.iter()
            .zip(&data.d_out)
            .map(|(o, d)| o * *d as f64)
            .sum::<f64>()
    };
    for &e in probe {
        let (mut up, mut down) = (table.to_vec(), table.to_vec());
        up[e] += 1e-2;
        down[e] -= 1e-2;
        let step = up[e] as f64 - down[e] as f64;
        let fd = (loss(up) - loss(down)) / step;
        assert!(
            (fd - want[e]).abs() <= 1e-4 * (1.0 + fd.abs()) + 1e-3 * floor,
            "d_table[{e}]: reference {}, finite differences {fd} ({msg})",
            want[e]
        );
    }
}

#[test]
fn t5_buckets_learn_their_gradient() {
    // the shape of score_mod.rs's T5 test: its forward and dK/dV pipelines
    let c0 = cfg(2, 75, 90, 4, 2, 32, true);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(common::fresh_seed());
    let table = common::random(&mut rng, c0.heads_q * 16, 1.0);
    let heads = c0.heads_q;
    let make = move |t: Vec<f32>| score_mods::t5_trainable(heads, t);
    let mut c = c0.clone();
    c.score_mod = Some(make(table.clone()));
    // (score_mod.rs checks this call's d_table on the naive path too)
    // buckets near the diagonal, far left, and one no row reaches (causal: j > i never)
    check(&c, &make, &table, &[0, 3, 7, 16 + 5, 3 * 16 + 9]);
}

#[test]
fn per_head_slopes_and_a_per_key_gain_learn_their_gradients() {
    // 80 keys: a gain per (head, key) is 320 entries at 4 heads, past what the dQ kernels sum
    // themselves (TABLE_SUM_ENTRIES, 256), so it comes from kept pairs; at 2 heads (the same
    // snippet and pipelines) 160 entries, summed in the dQ kernels, as the slopes are
    let keys = 80;
    for heads in [4, 2] {
        let c0 = cfg(1, 48, keys, heads, heads / 2, 32, false);
        let mut rng =
            <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(common::fresh_seed());
        let slope = common::random(&mut rng, c0.heads_q, 1.0);
        let gain: Vec<f32> = common::random(&mut rng, c0.heads_q * keys, 0.5)
            .into_iter()
            .map(|x| 1.0 + x)
            .collect();
        let mut c = c0.clone();
        // with a bias that asks for d_bias too (both gradients from one scratch), which hides
        // a fifth of the pairs with -inf: score_mod takes -inf there, so the gain's partial
        // (the score) is -inf, and a hidden pair that reached d_table would make it NaN
        c.bias = Some(common::random_bias(&c, true, false, 0.2, 3));
        let (g, s) = (gain.clone(), slope.clone());
        let slopes = move |t: Vec<f32>| score_mods::slope_and_gain(keys, t, g.clone(), "slope");
        if heads == 4 {
            c.score_mod = Some(slopes(slope.clone()));
            check(&c, &slopes, &slope, &[0, 3]);
        }
        let gains = move |t: Vec<f32>| score_mods::slope_and_gain(keys, s.clone(), t, "gain");
        c.score_mod = Some(gains(gain.clone()));
        check(&c, &gains, &gain, &[5, keys + 17, (heads - 1) * keys + 63]);
    }
}
