//! Decode mode (`--decode`): one attention call per step, `--decode-queries` query rows
//! against KV caches of each `--seq` keys, as an inference engine makes it: the time per call
//! and the KV bytes read per second against the adapter's measured copy roofline, split-KV (the
//! heuristic's split count) next to one split and next to the same keys in a paged cache (pages
//! of [`PAGE_SIZE`] keys in a shuffled block table, vLLM's layout), side by side in one run;
//! first the per-call cost of a decode-size call against an empty submit-and-wait. Uses each
//! `--batch`, the first `--heads`, `--kv-heads`, `--head-dim` and `--dtype`, and `--repeats`
//! (the median is reported, with the min-max of the repeats beside it); `--no-subgroup` turns
//! off the subgroup reads, `--subgroup-both` measures the adapter's default and no subgroup
//! side by side. Peers (llama.cpp's Vulkan flash attention) are measured beside this by
//! scripts/peers/ggml-decode.sh, never quoted here.
//!
//! FLOPs per call: 4 * B * H_q * S_q * S_kv * D. KV bytes per call: 2 * B * S_kv * H_kv * D *
//! (bytes per element): each key and value read once (GQA packing reads a kv head's tile once
//! for all the query heads that share it). `--mla-values Dv` (MLA: the values are the first Dv
//! dims of each key row, one latent cache read through a view): FLOPs
//! 2 * B * H_q * S_q * S_kv * (D + Dv), KV bytes B * S_kv * H_kv * D * (bytes per element),
//! the latent cache once; each point adds the KV-cache calls side by side, the latent cache (`forward_with_latent_cache`)
//! against the values stored apart (`forward_with_kvcache` over k and a v of Dv dims a row).

use std::time::Instant;

use flash_attn_wgpu::{AttentionConfig, Context, DType, Element, Tuning};

use crate::args::Args;
use crate::stats::Stats;

/// What the decode mode measures, from the command line.
struct Decode {
    caches: Vec<usize>,
    batches: Vec<usize>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// --mla-values: the values' head dim, read as the first dims of each key row
    mla_values: Option<usize>,
    queries: usize,
    dtype: DType,
    repeats: usize,
    /// The tuning of each measured column set: the adapter's default, and with
    /// --subgroup-both the same without subgroup reads, and with --q-chunks-both each of
    /// those with the other decode_q_chunks.
    tunings: Vec<Tuning>,
}

/// Keys per page of the paged column (vLLM's default block size).
const PAGE_SIZE: usize = 16;

/// A paged layout of `b` sequences of `s` keys (a multiple of [`PAGE_SIZE`]): every sequence's
/// pages in a pool of exactly as many, in an order shuffled by a fixed seed.
fn shuffled_pages(b: usize, s: usize) -> flash_attn_wgpu::PagedKv {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let pages_per_seq = s / PAGE_SIZE;
    let mut block_table: Vec<u32> = (0..(b * pages_per_seq) as u32).collect();
    block_table.shuffle(&mut rand::rngs::StdRng::seed_from_u64(13));
    flash_attn_wgpu::PagedKv {
        page_size: PAGE_SIZE,
        num_pages: b * pages_per_seq,
        pages_per_seq,
        block_table,
    }
}

/// `n` values in [-1, 1) in a fixed pattern (`salt` shifts it): the benches' K, V and q.
fn pattern(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + salt) % 2003) as f32 / 1001.5) - 1.0)
        .collect()
}

/// Skip the points whose K and V together exceed this many MiB.
const MAX_KV_MIB: usize = 1024;

pub fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let heads = args.heads[0];
    let ctx = Context::new()?;
    ctx.set_gpu_timing(true);
    // --no-subgroup and --half-storage apply (the decode kernel shares reads across the rows
    // variant's fixed subgroup size)
    let tuning = args.tuning(ctx.tuning());
    ctx.set_tuning(tuning)?;
    let mut tunings = vec![tuning];
    if args.subgroup_both && tuning.rows_subgroup != 0 {
        tunings.push(Tuning {
            rows_subgroup: 0,
            ..tuning
        });
    }
    if args.q_chunks_both {
        let flipped: Vec<Tuning> = tunings
            .iter()
            .map(|t| Tuning {
                decode_q_chunks: !t.decode_q_chunks,
                ..*t
            })
            .collect();
        tunings.extend(flipped);
    }
    let a = Decode {
        caches: args.seqs.clone(),
        batches: args.batch.clone(),
        heads,
        kv_heads: args.kv_heads.unwrap_or(heads),
        head_dim: args.head_dim[0],
        mla_values: args.mla_values,
        queries: args.decode_queries,
        dtype: args.dtype[0],
        repeats: args.repeats.max(1),
        tunings,
    };
    println!("adapter: {}", ctx.adapter_info());
    let roof = ctx.measure_roofline(args.roofline_scale)?;
    println!(
        "measured copy roofline {:.2} GB/s (read + write), FMA {:.1} GFLOP/s",
        roof.copy_gbps, roof.fma_gflops
    );
    overhead(&ctx)?;
    println!(
        "heads {}/{} head_dim {} queries {} dtype {}; FLOPs 4*B*Hq*Sq*Skv*D; KV bytes \
         2*B*Skv*Hkv*D*{}; time per call from GPU timestamps (wall clock around the call in \
         brackets)",
        a.heads,
        a.kv_heads,
        a.head_dim,
        a.queries,
        a.dtype,
        a.dtype.size_bytes()
    );
    if !args.kv_formats.is_empty() {
        return match a.dtype {
            DType::F32 => formats::<f32>(&ctx, &a, &args.kv_formats, roof.copy_gbps),
            DType::F16 => formats::<half::f16>(&ctx, &a, &args.kv_formats, roof.copy_gbps),
            DType::BF16 => formats::<half::bf16>(&ctx, &a, &args.kv_formats, roof.copy_gbps),
        };
    }
    let roofs = (roof.copy_gbps, roof.fma_gflops);
    match a.dtype {
        DType::F32 => points::<f32>(&ctx, &a, roofs),
        DType::F16 => points::<half::f16>(&ctx, &a, roofs),
        DType::BF16 => points::<half::bf16>(&ctx, &a, roofs),
    }
}

/// `--kv-formats`: the --dtype cache and each 8-bit format, every call through the KV-cache
/// entry points (`forward_with_kvcache`, `forward_with_quantized_kvcache`) over full caches,
/// no append, interleaved call by call so that drift hits every column alike. KV bytes per
/// call: 2 * B * S_kv * H_kv * (bytes per record), scales and padding included.
fn formats<T: Element>(
    ctx: &Context,
    a: &Decode,
    formats: &[flash_attn_wgpu::CacheFormat],
    copy_gbps: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let names: Vec<String> = formats.iter().map(|f| f.to_string()).collect();
    println!(
        "8-bit caches: median GPU ms of --repeats interleaved calls [min-max], GB/s of KV bytes          read, and each format's time over the {} cache's",
        a.dtype
    );
    let mut head = format!("| B | cache | {} ms | GB/s |", a.dtype);
    for n in &names {
        head.push_str(&format!(" {n} ms | GB/s | {n}/{} |", a.dtype));
    }
    println!("{head} split/roof ({}) |", a.dtype);
    println!("|{}", "---|".repeat(5 + 3 * names.len()));
    for &b in &a.batches {
        for &s in &a.caches {
            let mut cfg = AttentionConfig::new(b, a.queries, s, a.heads, a.kv_heads, a.head_dim);
            cfg.causal = true;
            cfg.validate()?;
            let shape = cfg.kv_shape();
            let kv_n: usize = shape.iter().product();
            let (kf, vf) = (pattern(kv_n, 2), pattern(kv_n, 3));
            let q = ctx.upload(
                &vec![T::from_f32(0.3); b * a.queries * a.heads * a.head_dim],
                &cfg.q_shape(),
            )?;
            let mut k = ctx.upload(&flash_attn_wgpu::from_f32_slice::<T>(&kf), &shape)?;
            let mut v = ctx.upload(&flash_attn_wgpu::from_f32_slice::<T>(&vf), &shape)?;
            let mut caches = Vec::new();
            for &f in formats {
                let scales = |x: &[f32]| {
                    (f == flash_attn_wgpu::CacheFormat::E4M3)
                        .then(|| flash_attn_wgpu::CacheFormat::e4m3_head_scales(x, shape))
                };
                let (ks, vs) = (scales(&kf), scales(&vf));
                caches.push((
                    ctx.quantized_cache(f, &kf, shape, ks.as_deref())?,
                    ctx.quantized_cache(f, &vf, shape, vs.as_deref())?,
                ));
            }
            let lens = vec![s; b];
            let gpu = || ctx.last_gpu_timing().map_or(f64::NAN, |t| t.seconds);
            // column 0: the dtype's cache; then each format; a warm call each first
            let mut times = vec![Vec::new(); 1 + formats.len()];
            for rep in 0..=a.repeats {
                ctx.forward_with_kvcache(&cfg, &q, &mut k, &mut v, &lens, None)?;
                let t0 = gpu();
                let mut row = vec![t0];
                for (kq, vq) in caches.iter_mut() {
                    ctx.forward_with_quantized_kvcache(&cfg, &q, (kq, vq), &lens, None)?;
                    row.push(gpu());
                }
                if rep > 0 {
                    for (c, t) in times.iter_mut().zip(row) {
                        c.push(t);
                    }
                }
            }
            let stats: Vec<Stats> = times.iter().map(|t| Stats::of(t).scaled(1e3)).collect();
            let bytes = |per: f64| 2.0 * (b * s * a.kv_heads) as f64 * per * a.head_dim as f64;
            let gbps = |by: f64, ms: f64| by / (ms * 1e-3) / 1e9;
            let base_bytes = bytes(a.dtype.size_bytes() as f64);
            let mut line = format!(
                "| {b} | {s} | {:.3} [{}] | {:.2} |",
                stats[0].median,
                stats[0].range(3),
                gbps(base_bytes, stats[0].median)
            );
            for (f, st) in formats.iter().zip(&stats[1..]) {
                let by = bytes(f.bytes_per_element(a.head_dim));
                line.push_str(&format!(
                    " {:.3} [{}] | {:.2} | {:.2} |",
                    st.median,
                    st.range(3),
                    gbps(by, st.median),
                    st.median / stats[0].median
                ));
            }
            println!(
                "{line} {:.0}% |",
                100.0 * gbps(base_bytes, stats[0].median) / copy_gbps
            );
        }
    }
    Ok(())
}

/// The per-call cost issue 13 bounds: the wall time of a decode-size call (B=1, H_q=32,
/// H_kv=8, D=128, 128 keys, f16; until its results are on the GPU) as a multiple of an empty
/// submit-and-wait on the same device. Medians of 50.
fn overhead(ctx: &Context) -> Result<(), Box<dyn std::error::Error>> {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let wait = || {
        ctx.device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
    };
    let mut empty = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        ctx.queue().submit([]);
        wait()?;
        empty.push(t.elapsed().as_secs_f64());
    }
    let cfg = AttentionConfig::new(1, 1, 128, 32, 8, 128);
    let x = |n: usize| vec![half::f16::from_f32(0.1); n];
    let q = ctx.upload(&x(32 * 128), &cfg.q_shape())?;
    let k = ctx.upload(&x(128 * 8 * 128), &cfg.kv_shape())?;
    let v = ctx.upload(&x(128 * 8 * 128), &cfg.kv_shape())?;
    ctx.forward(&cfg, &q, &k, &v)?;
    // untimed calls, as an engine makes them: the host's part (plan, buffers, recording,
    // submit) until the call returns, and until its work is done
    ctx.set_gpu_timing(false);
    let (mut host, mut call) = (Vec::new(), Vec::new());
    for _ in 0..50 {
        let t = Instant::now();
        let f = ctx.forward(&cfg, &q, &k, &v)?;
        host.push(t.elapsed().as_secs_f64());
        wait()?;
        call.push(t.elapsed().as_secs_f64());
        drop(f);
    }
    ctx.set_gpu_timing(true);
    let (mut gpu, mut per_kernel) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        ctx.forward(&cfg, &q, &k, &v)?;
        let t = ctx.last_gpu_timing();
        gpu.push(t.as_ref().map_or(f64::NAN, |t| t.seconds));
        per_kernel = t.map(|t| t.per_kernel).unwrap_or_default();
    }
    let (e, h, c, g) = (median(empty), median(host), median(call), median(gpu));
    println!(
        "per-call cost: decode-size call (B=1, 32/8 heads, D=128, 128 keys, f16) {:.3} ms to \
         done ({:.3} ms until it returns; its kernels {:.3} ms on the GPU), empty \
         submit-and-wait {:.3} ms: {:.2}x (goal <= 2x); host part {:.2}x",
        c * 1e3,
        h * 1e3,
        g * 1e3,
        e * 1e3,
        c / e,
        h / e
    );
    let kernels: Vec<String> = per_kernel
        .iter()
        .map(|(name, s)| format!("{name} {:.3} ms", s * 1e3))
        .collect();
    println!("  its kernels (last call): {}", kernels.join(", "));
    Ok(())
}

fn points<T: Element>(
    ctx: &Context,
    a: &Decode,
    (copy_gbps, fma_gflops): (f64, f64),
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dv) = a.mla_values {
        println!(
            "MLA: values = the first {dv} dims of each {}-dim key row (one latent cache, read \
             through a view); FLOPs 2*B*Hq*Sq*Skv*(D+Dv); KV bytes B*Skv*Hkv*D*{}; compute \
             floor = FLOPs / the measured FMA rate",
            a.head_dim,
            a.dtype.size_bytes()
        );
    }
    println!(
        "per point: ms are the median GPU time of --repeats calls [min-max]; wall: the median \
         wall time around a call; GB/s from the median; speedup: one split over split-KV; \
         paged: the same keys in shuffled pages of {PAGE_SIZE}; rows a workgroup: the packed \
         rows (query heads of a kv head) each decode workgroup serves, q held a chunk at a \
         time where marked \"chunks\" (Tuning::decode_q_chunks)"
    );
    println!(
        "| subgroup / rows a workgroup | B | cache | splits | split ms [min-max] | (wall) | GB/s | 1 split ms \
         [min-max] | (wall) | GB/s | speedup | split/roof | paged ms [min-max] | paged/dense |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &b in &a.batches {
        for &s in &a.caches {
            let mut cfg = AttentionConfig::new(b, a.queries, s, a.heads, a.kv_heads, a.head_dim);
            cfg.causal = true;
            cfg.head_dim_v = a.mla_values;
            cfg.validate()?;
            // the latent cache once (MLA), or K and V
            let caches = if a.mla_values.is_some() { 1.0 } else { 2.0 };
            let kv_bytes = caches * (b * s * a.kv_heads * a.head_dim * a.dtype.size_bytes()) as f64;
            let flops = 2.0 * (b * a.heads * a.queries * s) as f64 * (a.head_dim + cfg.dv()) as f64;
            if kv_bytes > (MAX_KV_MIB << 20) as f64 {
                println!("| - | {b} | {s} | skipped: K and V take more than {MAX_KV_MIB} MiB |");
                continue;
            }
            let fill = |n: usize, salt: usize| -> Vec<T> {
                pattern(n, salt).into_iter().map(T::from_f32).collect()
            };
            let q = ctx.upload(
                &fill(b * a.queries * a.heads * a.head_dim, 1),
                &cfg.q_shape(),
            )?;
            let kv_n = b * s * a.kv_heads * a.head_dim;
            let mut k = ctx.upload(&fill(kv_n, 2), &cfg.kv_shape())?;
            let v = match a.mla_values {
                // the first dims of each key row, in place
                Some(_) => ctx.tensor_from_buffer(
                    k.buffer(),
                    k.offset(),
                    &cfg.v_shape(),
                    Some(&[
                        s * a.kv_heads * a.head_dim,
                        a.kv_heads * a.head_dim,
                        a.head_dim,
                        1,
                    ]),
                    a.dtype,
                )?,
                None => ctx.upload(&fill(kv_n, 3), &cfg.kv_shape())?,
            };
            // the same keys in pages (the pools hold the dense caches' bytes, reordered by
            // the table), split by the heuristic; not for MLA's view
            let paged =
                (s.is_multiple_of(PAGE_SIZE) && a.mla_values.is_none()).then(|| AttentionConfig {
                    paged: Some(shuffled_pages(b, s)),
                    ..cfg.clone()
                });
            let pools = match &paged {
                Some(p) => Some((
                    ctx.upload(&fill(kv_n, 2), &p.kv_shape())?,
                    ctx.upload(&fill(kv_n, 3), &p.kv_shape())?,
                )),
                None => None,
            };
            let time =
                |c: &AttentionConfig,
                 (k, v): (&flash_attn_wgpu::Tensor, &flash_attn_wgpu::Tensor)| {
                    repeats_ms(ctx, a.repeats, || ctx.forward(c, &q, k, v))
                };
            for &tuning in &a.tunings {
                ctx.set_tuning(tuning)?;
                let shape = flash_attn_wgpu::unstable::plan::decode::shape(&cfg, &ctx.plan_env())?;
                let splits = shape.splits;
                let chunked =
                    !flash_attn_wgpu::unstable::plan::decode::holds_q_whole(&cfg, shape.tiles);
                let rows = format!(
                    "{} / {}{}",
                    tuning.rows_subgroup,
                    shape.tiles.br,
                    if chunked { " chunks" } else { "" }
                );
                let (split, split_wall) = time(&cfg, (&k, &v))?;
                let one = AttentionConfig {
                    kv_splits: Some(1),
                    ..cfg.clone()
                };
                let (one_gpu, one_wall) = time(&one, (&k, &v))?;
                let paged_gpu = match (&paged, &pools) {
                    (Some(p), Some((kp, vp))) => match time(p, (kp, vp)) {
                        Ok((gpu, _)) => Some(gpu),
                        // a pool binds whole: past one binding, no paged point
                        Err(flash_attn_wgpu::Error::DeviceLimit { .. }) => None,
                        Err(e) => return Err(e.into()),
                    },
                    _ => None,
                };
                let gbps = |ms: f64| kv_bytes / (ms * 1e-3) / 1e9;
                let (paged_cell, paged_ratio) = match paged_gpu {
                    Some(p) => (
                        format!("{:.3} [{}]", p.median, p.range(3)),
                        format!("{:.2}", p.median / split.median),
                    ),
                    None => ("-".into(), "-".into()),
                };
                println!(
                    "| {rows} | {b} | {s} | {splits} | {:.3} [{}] | ({:.3}) | {:.2} | {:.3} [{}] | \
                     ({:.3}) | {:.2} | {:.2} | {:.0}% | {paged_cell} | {paged_ratio} |",
                    split.median,
                    split.range(3),
                    split_wall.median,
                    gbps(split.median),
                    one_gpu.median,
                    one_gpu.range(3),
                    one_wall.median,
                    gbps(one_gpu.median),
                    one_gpu.median / split.median,
                    100.0 * gbps(split.median) / copy_gbps,
                );
                if let Some(dv) = a.mla_values {
                    // the KV-cache calls: the latent cache (each row once) against the values
                    // stored apart (k 576 and v 512 dims a row), one split count
                    let lens = vec![s; b];
                    let mut apart =
                        ctx.upload(&fill(b * s * a.kv_heads * dv, 3), &cfg.v_shape())?;
                    let (sep, _) = repeats_ms(ctx, a.repeats, || {
                        ctx.forward_with_kvcache(&cfg, &q, &mut k, &mut apart, &lens, None)
                    })?;
                    let (lat, _) = repeats_ms(ctx, a.repeats, || {
                        ctx.forward_with_latent_cache(&cfg, &q, &mut k, &lens, None)
                    })?;
                    println!(
                        "|   | KV-cache calls: values apart {:.3} ms [{}], latent cache {:.3} ms \
                         [{}]: latent/apart {:.3} ({} vs {} bytes a token) |",
                        sep.median,
                        sep.range(3),
                        lat.median,
                        lat.range(3),
                        lat.median / sep.median,
                        cfg.cache_bytes_per_token(a.dtype, None, false),
                        cfg.cache_bytes_per_token(a.dtype, None, true)
                    );
                    let floor = flops / (fma_gflops * 1e9) * 1e3;
                    println!(
                        "|   | compute floor {floor:.3} ms ({:.1} GFLOP at {fma_gflops:.1} \
                         GFLOP/s): split-KV at {:.0}% of it |",
                        flops / 1e9,
                        100.0 * floor / split.median
                    );
                }
            }
            ctx.set_tuning(a.tunings[0])?;
        }
    }
    Ok(())
}

/// (GPU ms, wall ms) of `repeats` calls of `call`, after one that compiles and warms.
fn repeats_ms(
    ctx: &Context,
    repeats: usize,
    mut call: impl FnMut() -> flash_attn_wgpu::Result<flash_attn_wgpu::Forward>,
) -> flash_attn_wgpu::Result<(Stats, Stats)> {
    call()?;
    let (mut gpu, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let t = Instant::now();
        let f = call()?;
        wall.push(t.elapsed().as_secs_f64());
        gpu.push(ctx.last_gpu_timing().map_or(f64::NAN, |t| t.seconds));
        drop(f);
    }
    Ok((Stats::of(&gpu).scaled(1e3), Stats::of(&wall).scaled(1e3)))
}
