//! Key shards: one call's keys cut into disjoint shards with a mask under which some rows see
//! none of a shard's keys (and some rows no key at all); each shard's forward, merged, must
//! equal attention over all the keys.

use super::{assert_close_tol, assert_lse_close, fresh_seed, random, rel_tol};
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::{
    unstable::reference, AttentionBackend, AttentionConfig, BoolMask, Element, Forward,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Keys [j0, j1) of every batch of a `[batch, seq_kv, heads_kv, head_dim]` tensor.
pub fn key_range<T: Copy>(cfg: &AttentionConfig, x: &[T], (j0, j1): (usize, usize)) -> Vec<T> {
    let row = cfg.heads_kv * cfg.head_dim;
    (0..cfg.batch)
        .flat_map(|b| {
            let base = b * cfg.seq_kv * row;
            x[base + j0 * row..base + j1 * row].iter().copied()
        })
        .collect()
}

/// Random cut points splitting `n` keys into `parts` non-empty shards (one of a single key
/// where n allows).
fn random_shards(rng: &mut StdRng, n: usize, parts: usize) -> Vec<(usize, usize)> {
    let mut cuts = vec![0, 1];
    while cuts.len() < parts {
        let c = rng.random_range(2..n);
        if !cuts.contains(&c) {
            cuts.push(c);
        }
    }
    cuts.push(n);
    cuts.sort();
    cuts.windows(2).map(|w| (w[0], w[1])).collect()
}

pub struct Case {
    pub cfg: AttentionConfig,
    /// entry (b, h, i, j) of the full mask
    visible: Vec<bool>,
    pub shards: Vec<(usize, usize)>,
    pub seed: u64,
}

/// A config with a per-(batch, head) mask where, for each shard, some rows see none of its
/// keys, and two rows see no key at all.
pub fn case(parts: usize) -> Case {
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let cfg = AttentionConfig::new(2, 9, 41, 4, 2, 24);
    let shards = random_shards(&mut rng, cfg.seq_kv, parts);
    let (b, h, sq, skv) = (cfg.batch, cfg.heads_q, cfg.seq_q, cfg.seq_kv);
    let mut visible: Vec<bool> = (0..b * h * sq * skv)
        .map(|_| rng.random_bool(0.7))
        .collect();
    for g in 0..b * h {
        for i in 0..sq {
            let row = &mut visible[(g * sq + i) * skv..(g * sq + i + 1) * skv];
            if i < 2 {
                row.fill(false);
            } else {
                // the row sees nothing of one shard
                let (j0, j1) = shards[rng.random_range(0..shards.len())];
                row[j0..j1].fill(false);
            }
        }
    }
    Case {
        cfg,
        visible,
        shards,
        seed,
    }
}

impl Case {
    pub fn mask(&self, (j0, j1): (usize, usize)) -> BoolMask {
        let c = &self.cfg;
        BoolMask::from_fn((c.batch, c.heads_q, c.seq_q, j1 - j0), |b, h, i, j| {
            self.visible[((b * c.heads_q + h) * c.seq_q + i) * c.seq_kv + j0 + j]
        })
    }

    pub fn full_cfg(&self) -> AttentionConfig {
        let mut c = self.cfg.clone();
        c.mask = Some(self.mask((0, c.seq_kv)));
        c
    }

    pub fn shard_cfg(&self, s: (usize, usize)) -> AttentionConfig {
        let mut c = self.cfg.clone();
        c.seq_kv = s.1 - s.0;
        c.mask = Some(self.mask(s));
        c
    }

    pub fn describe(&self) -> String {
        format!("shards {:?}, seed {}", self.shards, self.seed)
    }
}

/// Each shard's forward on `b` in `T`, merged, against the f64 reference over all the keys.
pub fn merged_equals_full<B: AttentionBackend, T: Element>(b: &B, parts: usize) {
    let case = case(parts);
    let c = &case.cfg;
    let msg = format!("{} {}", T::DTYPE, case.describe());
    let mut rng = StdRng::seed_from_u64(case.seed ^ 1);
    let q = from_f32_slice::<T>(&random(
        &mut rng,
        c.batch * c.seq_q * c.heads_q * c.head_dim,
        1.5,
    ));
    let k = from_f32_slice::<T>(&random(
        &mut rng,
        c.batch * c.seq_kv * c.heads_kv * c.head_dim,
        1.5,
    ));
    let v = from_f32_slice::<T>(&random(
        &mut rng,
        c.batch * c.seq_kv * c.heads_kv * c.head_dim,
        1.0,
    ));
    let qd = b.upload(&q, &c.q_shape()).unwrap();
    let shards: Vec<Forward<B::Tensor>> = case
        .shards
        .iter()
        .map(|&s| {
            let sc = case.shard_cfg(s);
            let kd = b.upload(&key_range(c, &k, s), &sc.kv_shape()).unwrap();
            let vd = b.upload(&key_range(c, &v, s), &sc.kv_shape()).unwrap();
            b.forward(&sc, &qd, &kd, &vd).unwrap()
        })
        .collect();
    let m = b.merge(&shards).unwrap();
    let out = to_f32_vec(&b.download::<T>(&m.out).unwrap());
    let lse = b.download::<f32>(&m.lse).unwrap();
    let want = reference::forward(
        &case.full_cfg(),
        &to_f32_vec(&q),
        &to_f32_vec(&k),
        &to_f32_vec(&v),
    );
    // each shard's out is rounded to the dtype, then the merged one again
    let tol = rel_tol(T::DTYPE) + T::DTYPE.unit_roundoff();
    assert_close_tol("merged out", &out, &want.out, tol, &msg);
    assert_lse_close(&lse, &want.lse, &msg);
    // the rows no shard lets see a key: out exactly 0
    for (i, w) in want.lse.iter().enumerate() {
        if *w == f64::NEG_INFINITY {
            let (bh, row) = (i / c.seq_q, i % c.seq_q);
            let (bb, h) = (bh / c.heads_q, bh % c.heads_q);
            let o = ((bb * c.seq_q + row) * c.heads_q + h) * c.head_dim;
            assert!(
                out[o..o + c.head_dim].iter().all(|x| *x == 0.0),
                "row {i} ({msg})"
            );
        }
    }
}
