//! Token-by-token generation with a paged KV cache: a small decoder-only transformer with
//! fixed random weights (RMSNorm, GQA attention, a ReLU MLP; sinusoidal positions, or with
//! `--rope` rotary embeddings that the KV-cache call applies to q and the new keys) runs a
//! prefill of each prompt, then greedy decode steps, its attention on the GPU through
//! `forward_with_kvcache` over per-layer paged caches (pages interleaved between the
//! sequences). The matrix products around attention run on the CPU (this example is about the
//! attention calls). Every decode step's attention output is checked against a full
//! recompute without the cache (attention over all the keys so far, from host copies);
//! prints tokens/s and the largest difference. `--kv-cache q8_0|e4m3` keeps the caches in 8
//! bits (`forward_with_quantized_kvcache`: the appends quantize on the GPU); the recompute then
//! reads the caches back dequantized, so it checks the attention over what the cache holds.
//! `--mla` makes the attention MLA-shaped (DeepSeek-V2/V3's absorbed form, scaled down): one
//! latent kv head shared by every query head, keys of 96 dims (the 64-dim latent, then 32
//! decoupled rotary dims: FlashMLA's layout) and values of 64, the latent itself, read from the
//! key rows of one latent cache (`forward_with_latent_cache`, or its 8-bit form): each token
//! stored once. With `--rope` the rotary dims are the keys' last, which the fused rotation
//! (a head's first dims) does not turn: the example turns q's and the new keys' on the host.
//! Prints the cache's bytes a token (from `MemoryStats`) beside the same cache with the values
//! stored apart.
//!
//! cargo run --release --example generate -- [--steps 32] [--batch 2] [--layers 2]
//!     [--dtype f32|f16|bf16] [--page-size 16] [--rope] [--kv-cache q8_0|e4m3] [--mla]
//!     [--seed N]

use std::process::ExitCode;
use std::time::Instant;

#[path = "common/cli.rs"]
mod cli;
use cli::positive;

use clap::Parser;
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec};
use flash_attn_wgpu::unstable::plan::decode::MAX_DECODE_QUERIES;
use flash_attn_wgpu::unstable::reference;
use flash_attn_wgpu::{
    Algorithm, AttentionConfig, CacheFormat, Context, DType, Element, PagedKv, Positions,
    QuantizedCache, Rotary, Tensor,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Prefill then greedy decode of a small random transformer with a paged KV cache on the GPU.
#[derive(Parser, Debug)]
#[command(name = "generate", version)]
struct Args {
    /// Decode steps (new tokens per sequence)
    #[arg(long, default_value_t = 32, value_parser = positive)]
    steps: usize,
    /// Sequences decoded together
    #[arg(long, default_value_t = 2, value_parser = positive)]
    batch: usize,
    /// Transformer layers
    #[arg(long, default_value_t = 2, value_parser = positive)]
    layers: usize,
    /// Element type of the attention's tensors and caches
    #[arg(long, default_value = "f32")]
    dtype: DType,
    /// Keys per page of the KV cache
    #[arg(long, default_value_t = 16, value_parser = positive)]
    page_size: usize,
    /// Rotary position embeddings (GPT-NeoX pairs over the whole head), fused into the
    /// KV-cache call, instead of sinusoidal positions added to the embeddings
    #[arg(long)]
    rope: bool,
    /// Keep the KV caches in 8 bits: q8_0 (a scale per 32 values) or e4m3 (a static scale
    /// per kv head of 16/448: values past 16 saturate)
    #[arg(long)]
    kv_cache: Option<CacheFormat>,
    /// MLA-shaped attention: one latent kv head of 64 latent + 32 rotary dims as keys, the
    /// latent as values (head_dim 96, head_dim_v 64), in one latent cache
    #[arg(long)]
    mla: bool,
    /// Seed of the weights and prompts [default: a fresh random seed, printed]
    #[arg(long)]
    seed: Option<u64>,
}

const VOCAB: usize = 97;
const D_MODEL: usize = 64;
const HEADS_Q: usize = 4;
const D_FF: usize = 128;

/// The attention's shape: GQA (2 kv heads of 32 dims), or with `--mla` one latent head whose
/// keys are `[latent; rotary dims]` and whose values are the latent (its first `dv` dims).
#[derive(Debug, Clone, Copy)]
struct Dims {
    heads_kv: usize,
    head_dim: usize,
    dv: usize,
    /// MLA: the keys' last dims, which alone take the rotary embedding; the values are the
    /// keys' dims before them
    mla_rope: Option<usize>,
}

impl Dims {
    fn of(mla: bool) -> Dims {
        if mla {
            Dims {
                heads_kv: 1,
                head_dim: 96,
                dv: 64,
                mla_rope: Some(32),
            }
        } else {
            Dims {
                heads_kv: 2,
                head_dim: 32,
                dv: 32,
                mla_rope: None,
            }
        }
    }

    /// The dims the rotary embedding turns: MLA's decoupled ones, or the whole head.
    fn rotary_dim(&self) -> usize {
        self.mla_rope.unwrap_or(self.head_dim)
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let r = match a.dtype {
        DType::F32 => run::<f32>(&a),
        DType::F16 => run::<half::f16>(&a),
        DType::BF16 => run::<half::bf16>(&a),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `[rows, n]` = `[rows, k]` x `[k, n]`, row-major.
fn matmul(x: &[f32], w: &[f32], k: usize, n: usize) -> Vec<f32> {
    let rows = x.len() / k;
    let mut y = vec![0.0f32; rows * n];
    for r in 0..rows {
        for (i, &xv) in x[r * k..(r + 1) * k].iter().enumerate() {
            for (o, &wv) in y[r * n..(r + 1) * n].iter_mut().zip(&w[i * n..(i + 1) * n]) {
                *o += xv * wv;
            }
        }
    }
    y
}

fn rms_norm(x: &[f32]) -> Vec<f32> {
    x.chunks(D_MODEL)
        .flat_map(|r| {
            let s = (r.iter().map(|v| v * v).sum::<f32>() / D_MODEL as f32 + 1e-6).sqrt();
            r.iter().map(move |v| v / s)
        })
        .collect()
}

struct Layer {
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    w1: Vec<f32>,
    w2: Vec<f32>,
}

struct Model {
    embed: Vec<f32>,
    /// `[D_MODEL, VOCAB]`: the logits of the last row
    unembed: Vec<f32>,
    layers: Vec<Layer>,
}

impl Model {
    fn random(rng: &mut StdRng, layers: usize, x: Dims) -> Model {
        let mut w = |n: usize, fan_in: usize| -> Vec<f32> {
            let s = (1.0 / fan_in as f32).sqrt() * 1.7;
            (0..n).map(|_| rng.random_range(-s..s)).collect()
        };
        Model {
            embed: w(VOCAB * D_MODEL, 1),
            unembed: w(D_MODEL * VOCAB, D_MODEL),
            layers: (0..layers)
                .map(|_| Layer {
                    wq: w(D_MODEL * HEADS_Q * x.head_dim, D_MODEL),
                    wk: w(D_MODEL * x.heads_kv * x.head_dim, D_MODEL),
                    // MLA: the values are the keys' latent dims, no projection of their own
                    wv: w(D_MODEL * x.heads_kv * x.dv, D_MODEL),
                    wo: w(HEADS_Q * x.dv * D_MODEL, HEADS_Q * x.dv),
                    w1: w(D_MODEL * D_FF, D_MODEL),
                    w2: w(D_FF * D_MODEL, D_FF),
                })
                .collect(),
        }
    }

    /// Token embeddings plus sinusoidal positions (none with rotary embeddings),
    /// `[tokens, D_MODEL]`.
    fn embed(&self, tokens: &[usize], first_pos: usize, rope: bool) -> Vec<f32> {
        tokens
            .iter()
            .enumerate()
            .flat_map(|(i, &t)| {
                let pos = (first_pos + i) as f32;
                (0..D_MODEL).map(move |d| {
                    let f = pos / 10000f32.powf((d / 2 * 2) as f32 / D_MODEL as f32);
                    let p = match (rope, d % 2) {
                        (true, _) => 0.0,
                        (false, 0) => f.sin(),
                        (false, _) => f.cos(),
                    };
                    self.embed[t * D_MODEL + d] + p
                })
            })
            .collect()
    }
}

/// A layer's keys and values on the GPU: in the call's dtype, or in 8 bits; MLA's one latent
/// cache, the values inside the keys.
enum Store {
    Plain(Tensor, Tensor),
    Quantized(QuantizedCache, QuantizedCache),
    Latent(Tensor),
    QuantizedLatent(QuantizedCache),
}

/// One layer's paged caches on the GPU, and their host copies for the recompute check.
struct LayerCache {
    store: Store,
    /// per sequence, its keys and values so far, `[len, heads_kv * head_dim]` and `[len,
    /// heads_kv * dv]` (dtype-rounded)
    host_k: Vec<Vec<f32>>,
    host_v: Vec<Vec<f32>>,
}

fn run<T: Element>(a: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let seed = a.seed.unwrap_or_else(|| rand::rng().random());
    let mut rng = StdRng::seed_from_u64(seed);
    let ctx = Context::new()?;
    println!("adapter: {}", ctx.adapter_info());
    let x = Dims::of(a.mla);
    let model = Model::random(&mut rng, a.layers, x);
    // prompts of different lengths
    let prompts: Vec<Vec<usize>> = (0..a.batch)
        .map(|b| (0..5 + 3 * b).map(|_| rng.random_range(0..VOCAB)).collect())
        .collect();
    // room for the checked steps and 8 timed ones
    let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + a.steps + 8;
    let pages_per_seq = capacity.div_ceil(a.page_size);
    // pages interleaved between the sequences, in reverse: sequence b's page p is pool page
    // (pages_per_seq - 1 - p) * batch + b
    let block_table: Vec<u32> = (0..a.batch)
        .flat_map(|b| {
            (0..pages_per_seq).map(move |p| ((pages_per_seq - 1 - p) * a.batch + b) as u32)
        })
        .collect();
    let paged = PagedKv {
        page_size: a.page_size,
        num_pages: a.batch * pages_per_seq,
        pages_per_seq,
        block_table,
    };
    let mut cfg = AttentionConfig::new(
        a.batch,
        1,
        pages_per_seq * a.page_size,
        HEADS_Q,
        x.heads_kv,
        x.head_dim,
    );
    cfg.causal = true;
    cfg.paged = Some(paged);
    cfg.head_dim_v = Some(x.dv);
    let (pool, pool_v): (usize, usize) = (
        cfg.kv_shape().iter().product(),
        cfg.v_shape().iter().product(),
    );
    // rotary tables for every position a row can take (padded prefill rows included),
    // `[positions, rotary_dim / 2]`: angle p / 10000^(2f / rotary_dim), rounded to T
    let positions = capacity + prompts.iter().map(Vec::len).max().unwrap_or(1);
    let rd = x.rotary_dim();
    let cols = rd / 2;
    let table = |g: fn(f32) -> f32| -> Vec<f32> {
        let t: Vec<f32> = (0..positions * cols)
            .map(|e| g((e / cols) as f32 / 10000f32.powf((2 * (e % cols)) as f32 / rd as f32)))
            .collect();
        to_f32_vec(&from_f32_slice::<T>(&t))
    };
    let (cos, sin) = (table(f32::cos), table(f32::sin));
    let cos_d = ctx.upload(&from_f32_slice::<T>(&cos), &[positions, cols])?;
    let sin_d = ctx.upload(&from_f32_slice::<T>(&sin), &[positions, cols])?;
    // the host's rotation of `v` (`[1, n, heads, head_dim]` at positions first..): each
    // head's first rd dims, or with MLA its last (FlashMLA's layout), rounded to T as the
    // device stores it
    let lead = x.head_dim - rd;
    let rotate = |v: &[f32], heads: usize, first: usize| -> Vec<f32> {
        let at = if x.mla_rope.is_some() { lead } else { 0 };
        let part: Vec<f32> = v
            .chunks(x.head_dim)
            .flat_map(|h| h[at..at + rd].to_vec())
            .collect();
        let y = reference::rotary(
            &part,
            [1, part.len() / (heads * rd), heads, rd],
            (&cos, &sin, cols),
            false,
            &Positions::from_starts(vec![first]),
        );
        let mut out = v.to_vec();
        for (h, turned) in out.chunks_mut(x.head_dim).zip(y.chunks(rd)) {
            for (o, &t) in h[at..at + rd].iter_mut().zip(turned) {
                *o = t as f32;
            }
        }
        to_f32_vec(&from_f32_slice::<T>(&out))
    };
    let before = ctx.memory_stats().live_bytes;
    let mut caches: Vec<LayerCache> = (0..a.layers)
        .map(|_| {
            let zeros = vec![0f32; pool];
            let shape = cfg.kv_shape();
            // an empty 8-bit cache of `s` (the keys' or the values' shape)
            let quantized = |f: CacheFormat, s: [usize; 4]| {
                let scales = (f == CacheFormat::E4M3).then(|| vec![16.0 / 448.0; x.heads_kv]);
                ctx.quantized_cache(f, &zeros[..s.iter().product()], s, scales.as_deref())
            };
            Ok(LayerCache {
                store: match (a.kv_cache, a.mla) {
                    (None, false) => Store::Plain(
                        ctx.upload(&from_f32_slice::<T>(&zeros), &shape)?,
                        ctx.upload(&from_f32_slice::<T>(&zeros[..pool_v]), &cfg.v_shape())?,
                    ),
                    (Some(f), false) => {
                        Store::Quantized(quantized(f, shape)?, quantized(f, cfg.v_shape())?)
                    }
                    (None, true) => {
                        Store::Latent(ctx.upload(&from_f32_slice::<T>(&zeros), &shape)?)
                    }
                    (Some(f), true) => Store::QuantizedLatent(quantized(f, shape)?),
                },
                host_k: vec![Vec::new(); a.batch],
                host_v: vec![Vec::new(); a.batch],
            })
        })
        .collect::<flash_attn_wgpu::Result<_>>()?;
    // what the caches take, counted by MemoryStats, a token (a pool row) a layer, beside the
    // same layout with the values stored apart
    let rows = (a.layers * cfg.kv_shape()[0] * cfg.kv_shape()[1]) as u64;
    let held = ctx.memory_stats().live_bytes - before;
    let apart = cfg.cache_bytes_per_token(T::DTYPE, a.kv_cache, false);
    println!(
        "KV cache: {} bytes a token a layer ({held} bytes for {} layers x {} pool rows, \
         MemoryStats){}; with the values stored apart {apart}",
        held / rows,
        a.layers,
        rows / a.layers as u64,
        if a.mla {
            format!(
                ", one latent cache ({} x {} elements a row, the values inside)",
                x.heads_kv, x.head_dim
            )
        } else {
            String::new()
        }
    );
    println!(
        "model: {} layers, d_model {D_MODEL}, heads {HEADS_Q}/{}, head_dim {}{}, vocab {VOCAB}; \
         {} sequences, prompts of {:?} tokens, {} steps, paged cache of {} pages x {} keys, {} \
         ({} cache), {} positions, seed {seed}",
        a.layers,
        x.heads_kv,
        x.head_dim,
        match x.mla_rope {
            Some(r) => format!(
                " (MLA: {} latent + {r} rotary dims; values the latent, head_dim_v {})",
                x.dv, x.dv
            ),
            None => String::new(),
        },
        a.batch,
        prompts.iter().map(Vec::len).collect::<Vec<_>>(),
        a.steps,
        cfg.paged.as_ref().map_or(0, |p| p.num_pages),
        a.page_size,
        T::DTYPE,
        a.kv_cache.map_or(T::DTYPE.to_string(), |f| f.to_string()),
        if a.rope { "rotary" } else { "sinusoidal" }
    );

    // one step for every sequence: `tokens[b]` new tokens at positions lens[b].. (a prefill
    // when more than one; the sequences' new rows are padded to the longest, the padding rows'
    // keys never seen: the cache lengths advance by each sequence's own count only)
    let mut lens = vec![0usize; a.batch];
    // largest difference of a cached step's attention from the recompute, and from the f64
    // reference, as fractions of the output's scale
    let mut worst = (0.0f64, 0.0f64);
    let mut step = |tokens: &[Vec<usize>],
                    lens: &mut Vec<usize>,
                    check: bool|
     -> Result<Vec<usize>, Box<dyn std::error::Error>> {
        let rows = tokens.iter().map(Vec::len).max().unwrap_or(1);
        let mut h: Vec<Vec<f32>> = tokens
            .iter()
            .zip(lens.iter())
            .map(|(t, &l)| model.embed(t, l, a.rope))
            .collect();
        for (layer, cache) in model.layers.iter().zip(caches.iter_mut()) {
            // q, k, v of every new row, padded to `rows` per sequence
            let (qs, ks, vs) = (
                HEADS_Q * x.head_dim,
                x.heads_kv * x.head_dim,
                x.heads_kv * x.dv,
            );
            let mut q = vec![0.0f32; a.batch * rows * qs];
            let mut kn = vec![0.0f32; a.batch * rows * ks];
            let mut vn = vec![0.0f32; a.batch * rows * vs];
            for (b, hb) in h.iter().enumerate() {
                let xn = rms_norm(hb);
                let n = xn.len() / D_MODEL;
                let mut qb = matmul(&xn, &layer.wq, D_MODEL, qs);
                let kb = to_f32_vec(&from_f32_slice::<T>(&matmul(&xn, &layer.wk, D_MODEL, ks)));
                let vb = match x.mla_rope {
                    // MLA: the values are the latent, the keys' first dims (read from the key
                    // rows of the latent cache: the call gets no values)
                    Some(_) => kb
                        .chunks(x.head_dim)
                        .flat_map(|k| k[..x.dv].to_vec())
                        .collect(),
                    None => to_f32_vec(&from_f32_slice::<T>(&matmul(&xn, &layer.wv, D_MODEL, vs))),
                };
                // the cache holds rotated keys with rotary embeddings
                let kb_cached = if a.rope {
                    rotate(&kb, x.heads_kv, lens[b])
                } else {
                    kb.clone()
                };
                // MLA's rotary dims are the last: q and the new keys turn here, on the host
                let host_turns = a.rope && a.mla;
                if host_turns {
                    qb = rotate(&qb, HEADS_Q, lens[b]);
                }
                let kb = if host_turns { kb_cached.clone() } else { kb };
                q[b * rows * qs..b * rows * qs + n * qs].copy_from_slice(&qb);
                kn[b * rows * ks..b * rows * ks + n * ks].copy_from_slice(&kb);
                vn[b * rows * vs..b * rows * vs + n * vs].copy_from_slice(&vb);
                cache.host_k[b].extend_from_slice(&kb_cached);
                cache.host_v[b].extend_from_slice(&vb);
            }
            let mut c = cfg.clone();
            c.seq_q = rows;
            let new_shape = [a.batch, rows, x.heads_kv, x.head_dim];
            let new_v = [a.batch, rows, x.heads_kv, x.dv];
            let qd = ctx.upload(&from_f32_slice::<T>(&q), &c.q_shape())?;
            let knd = ctx.upload(&from_f32_slice::<T>(&kn), &new_shape)?;
            let vnd = ctx.upload(&from_f32_slice::<T>(&vn), &new_v)?;
            let rope = Rotary {
                cos: &cos_d,
                sin: &sin_d,
                interleaved: false,
            };
            let append = Some((&knd, &vnd));
            let f = match (&mut cache.store, a.rope) {
                (Store::Plain(k, v), true) => {
                    ctx.forward_with_kvcache_rotary(&c, &qd, k, v, lens, append, rope)?
                }
                (Store::Plain(k, v), false) => {
                    ctx.forward_with_kvcache(&c, &qd, k, v, lens, append)?
                }
                (Store::Quantized(k, v), true) => {
                    ctx.forward_with_quantized_kvcache_rotary(&c, &qd, (k, v), lens, append, rope)?
                }
                (Store::Quantized(k, v), false) => {
                    ctx.forward_with_quantized_kvcache(&c, &qd, (k, v), lens, append)?
                }
                // each new row written once, its values inside it
                (Store::Latent(k), _) => {
                    ctx.forward_with_latent_cache(&c, &qd, k, lens, Some(&knd))?
                }
                (Store::QuantizedLatent(k), _) => {
                    ctx.forward_with_quantized_latent_cache(&c, &qd, k, lens, Some(&knd))?
                }
            };
            // what an 8-bit cache holds is what the recompute attends over
            let eight_bit = match &cache.store {
                Store::Quantized(k, v) => Some((k, Some(v))),
                Store::QuantizedLatent(k) => Some((k, None)),
                _ => None,
            };
            if let (true, Some((k, v))) = (check, eight_bit) {
                let kd = ctx.dequantize_cache(k)?;
                // the latent cache's values: its rows' first dv dims
                let vd = match v {
                    Some(v) => ctx.dequantize_cache(v)?,
                    None => kd
                        .chunks(x.head_dim)
                        .flat_map(|r| r[..x.dv].to_vec())
                        .collect(),
                };
                let p = c.paged.as_ref().expect("a paged cache");
                let gather = |t: &[f32], b: usize, keys: usize, dim: usize| -> Vec<f32> {
                    let row = x.heads_kv * dim;
                    (0..keys)
                        .flat_map(|pos| t[p.row(b, pos) * row..(p.row(b, pos) + 1) * row].to_vec())
                        .collect()
                };
                for (b, t) in tokens.iter().enumerate() {
                    let keys = lens[b] + t.len();
                    cache.host_k[b] = gather(&kd, b, keys, x.head_dim);
                    cache.host_v[b] = gather(&vd, b, keys, x.dv);
                }
            }
            let att = to_f32_vec(&ctx.download::<T>(&f.out)?);
            for (b, hb) in h.iter_mut().enumerate() {
                let n = hb.len() / D_MODEL;
                let os = HEADS_Q * x.dv;
                let mine = &att[b * rows * os..b * rows * os + n * os];
                if check {
                    // the recompute: this sequence's new rows (rotated on the host with
                    // rotary embeddings) against all its keys so far, dense, without the
                    // cache (rows aligned to the end of the keys)
                    let keys = lens[b] + tokens[b].len();
                    let q_own = &q[b * rows * qs..b * rows * qs + n * qs];
                    // (MLA's q turned on the host already)
                    let qb = if a.rope && !a.mla {
                        rotate(q_own, HEADS_Q, lens[b])
                    } else {
                        to_f32_vec(&from_f32_slice::<T>(q_own))
                    };
                    let full = AttentionConfig {
                        causal: true,
                        head_dim_v: Some(x.dv),
                        // MLA: the naive path (a recompute of many rows; one head dim tiled)
                        algorithm: if a.mla && n > MAX_DECODE_QUERIES {
                            Algorithm::Naive
                        } else {
                            Algorithm::Tiled
                        },
                        ..AttentionConfig::new(1, n, keys, HEADS_Q, x.heads_kv, x.head_dim)
                    };
                    let r = ctx.forward_host(
                        &full,
                        &from_f32_slice::<T>(&qb),
                        &from_f32_slice::<T>(&cache.host_k[b]),
                        &from_f32_slice::<T>(&cache.host_v[b]),
                    )?;
                    // and the f64 reference over the same (rounded) values
                    let want = reference::forward(&full, &qb, &cache.host_k[b], &cache.host_v[b]);
                    let scale = want.out.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
                    for ((x, y), w) in mine.iter().zip(to_f32_vec(&r.out)).zip(&want.out) {
                        worst.0 = worst.0.max((x - y).abs() as f64 / scale);
                        worst.1 = worst.1.max((*x as f64 - w).abs() / scale);
                    }
                }
                let o = matmul(mine, &layer.wo, os, D_MODEL);
                hb.iter_mut().zip(&o).for_each(|(x, y)| *x += y);
                let ff: Vec<f32> = matmul(&rms_norm(hb), &layer.w1, D_MODEL, D_FF)
                    .into_iter()
                    .map(|x| x.max(0.0))
                    .collect();
                let o = matmul(&ff, &layer.w2, D_FF, D_MODEL);
                hb.iter_mut().zip(&o).for_each(|(x, y)| *x += y);
            }
        }
        // the next token of each sequence: greedy, from its last row
        let next = h
            .iter()
            .map(|hb| {
                let logits = matmul(
                    &rms_norm(&hb[hb.len() - D_MODEL..]),
                    &model.unembed,
                    D_MODEL,
                    VOCAB,
                );
                (0..VOCAB)
                    .max_by(|&x, &y| logits[x].total_cmp(&logits[y]))
                    .unwrap_or(0)
            })
            .collect();
        for (l, t) in lens.iter_mut().zip(tokens) {
            *l += t.len();
        }
        Ok(next)
    };

    let t0 = Instant::now();
    let mut next = step(&prompts, &mut lens, false)?;
    let prefill = t0.elapsed().as_secs_f64();
    let mut generated: Vec<Vec<usize>> = vec![Vec::new(); a.batch];
    let t1 = Instant::now();
    for _ in 0..a.steps {
        for (g, &t) in generated.iter_mut().zip(&next) {
            g.push(t);
        }
        let tokens: Vec<Vec<usize>> = next.iter().map(|&t| vec![t]).collect();
        next = step(&tokens, &mut lens, true)?;
    }
    let decode = t1.elapsed().as_secs_f64();
    // the recompute's own time is part of the loop: time the decode alone
    let mut lens2 = lens.clone();
    let t2 = Instant::now();
    let bench_steps = 8.min(capacity - lens.iter().max().unwrap_or(&0));
    for _ in 0..bench_steps {
        let tokens: Vec<Vec<usize>> = next.iter().map(|&t| vec![t]).collect();
        next = step(&tokens, &mut lens2, false)?;
    }
    let per_step = t2.elapsed().as_secs_f64() / bench_steps.max(1) as f64;
    for (b, g) in generated.iter().enumerate() {
        println!("sequence {b}: prompt {:?} -> {:?}", prompts[b], g);
    }
    // rotary embeddings add a rounding on each side: the device rotates q and the new keys
    // in f32 and the host in f64, each rounds to T, and the two may land an ulp apart
    let tol = match T::DTYPE {
        DType::F32 => 1e-4,
        d => 1e-4 + if a.rope { 4.0 } else { 2.0 } * d.unit_roundoff(),
    };
    let ok = worst.0 <= tol && worst.1 <= tol;
    println!(
        "prefill {:.1} ms (first calls: pipelines compile); {} decode steps with the recompute check {:.1} ms; decode alone {:.2} \
         ms a step = {:.1} tokens/s ({} sequences)",
        prefill * 1e3,
        a.steps,
        decode * 1e3,
        per_step * 1e3,
        a.batch as f64 / per_step,
        a.batch
    );
    println!(
        "every decode step's attention against the full recompute without the cache: max \
         difference {:.2e}, against the f64 reference {:.2e}, of the output's scale (tolerance \
         {tol:.1e}): {}",
        worst.0,
        worst.1,
        if ok { "ok" } else { "FAIL" }
    );
    Ok(ok)
}
