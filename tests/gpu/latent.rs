//! MLA's latent cache (issue 53; `Context::forward_with_latent_cache`, module
//! `kvcache::latent`): one cache whose values are the first `head_dim_v` dims of each key row,
//! dense and paged (shuffled pages, a shared first page, appends across page boundaries,
//! batches of different lengths), f16, bf16 and f32, q8_0 and E4M3, a prefill on the tiled
//! forward then a decode step, against the f64 reference with NaN in every unused pool row
//! (`common::kv::latent_append_and_attend`); and the inputs it refuses, by name.

use crate::common;
use common::kv::{latent_append_and_attend, random_paged};
use common::{cfg, ctx};
use flash_attn_wgpu::{AttentionConfig, CacheFormat, Error};
use half::{bf16, f16};
use rand::{rngs::StdRng, SeedableRng};

fn latent(mut c: AttentionConfig, dv: usize) -> AttentionConfig {
    c.head_dim_v = Some(dv);
    c
}

/// `c` over a pool of shuffled pages of `page_size` rows (batch 1 sharing batch 0's first
/// page), `pages` a sequence.
fn paged(c: &AttentionConfig, page_size: usize, pages: usize) -> AttentionConfig {
    let mut rng = StdRng::seed_from_u64(common::fresh_seed());
    let mut p = c.clone();
    p.paged = Some(random_paged(&mut rng, c.batch, pages, page_size));
    p.seq_kv = pages * page_size;
    p
}

#[test]
fn a_latent_cache_is_read_as_keys_and_values_dense_and_paged() {
    // the shapes (and pipelines) of head_dims.rs's cache of narrower values: 2 kv heads of 32
    // dims, values their first 16; 4 rows appended (the tiled forward), then 1 (decode)
    let c = latent(cfg(2, 1, 40, 4, 2, 32, true), 16);
    latent_append_and_attend::<_, f16>(ctx(), &c, &[9, 30], 4, None);
    // pages of 8: batch 1's append crosses from its fourth page into its fifth
    latent_append_and_attend::<_, f16>(ctx(), &paged(&c, 8, 5), &[9, 30], 4, None);
    // a chunked prefill of 20 rows: past the decode kernel's queries, on the tiled forward
    let c = latent(cfg(2, 1, 64, 4, 2, 32, true), 16);
    latent_append_and_attend::<_, f16>(ctx(), &paged(&c, 8, 8), &[9, 30], 20, None);
    // and the naive path, whose value products read v through the same v_index
    let naive = AttentionConfig {
        algorithm: flash_attn_wgpu::Algorithm::Naive,
        ..c
    };
    latent_append_and_attend::<_, f16>(ctx(), &naive, &[9, 30], 20, None);
}

#[test]
fn mla_latent_caches_of_576_dims_serve_512_dim_values_in_f16_and_bf16() {
    // DeepSeek's MLA: 16 query heads over one latent head of 576 dims (512 latent, 64 rotary)
    let c = latent(cfg(2, 1, 160, 16, 1, 576, false), 512);
    latent_append_and_attend::<_, f16>(ctx(), &c, &[37, 100], 3, None);
    // 5 new rows: the tiled forward, then a decode step; pages of 32, the append into batch
    // 0's second page and across batch 1's fourth into its fifth
    latent_append_and_attend::<_, bf16>(ctx(), &paged(&c, 32, 5), &[30, 94], 5, None);
}

#[test]
fn eight_bit_latent_caches_read_values_from_the_key_records() {
    // the shapes of head_dims.rs's 8-bit caches: q8_0 (values the first block of each 64-dim
    // row) dense and paged, E4M3 (under each kv head's scale)
    let c = latent(cfg(2, 1, 40, 4, 2, 64, true), 32);
    latent_append_and_attend::<_, f32>(ctx(), &c, &[7, 20], 5, Some(CacheFormat::Q8_0));
    let p = paged(&c, 16, 3);
    latent_append_and_attend::<_, f32>(ctx(), &p, &[7, 20], 5, Some(CacheFormat::Q8_0));
    let c = latent(cfg(1, 1, 50, 8, 1, 96, false), 64);
    latent_append_and_attend::<_, f16>(ctx(), &c, &[30], 2, Some(CacheFormat::E4M3));
}

#[test]
fn latent_calls_refuse_bad_inputs_in_the_callers_words() {
    let x = ctx();
    // f16, as the dense test above (its pipelines)
    let c = latent(cfg(1, 1, 16, 2, 1, 32, true), 16);
    let zeros = |shape: &[usize]| x.zeros_of(shape, flash_attn_wgpu::DType::F16).unwrap();
    let q = zeros(&c.q_shape());
    let mut cache = zeros(&c.kv_shape());
    let invalid = |r: Result<flash_attn_wgpu::Forward, Error>, want: &str| match r {
        Err(Error::InvalidConfig(m)) => assert!(m.contains(want), "{m}"),
        other => panic!("expected InvalidConfig naming {want:?}, got {other:?}"),
    };
    // values wider than the keys they are cut from
    let wide = latent(cfg(1, 1, 16, 2, 1, 32, false), 48);
    let mut wide_cache = zeros(&wide.kv_shape());
    let wq = zeros(&wide.q_shape());
    invalid(
        x.forward_with_latent_cache(&wide, &wq, &mut wide_cache, &[3], None),
        "head_dim_v must be at most head_dim (32), got 48",
    );
    // a latent config with a separate v: the call that takes one refuses it
    let mut lc = c.clone();
    lc.values_in_keys = true;
    let mut v = zeros(&c.v_shape());
    invalid(
        x.forward_with_kvcache(&lc, &q, &mut cache, &mut v, &[3], None),
        "values_in_keys",
    );
    let k = zeros(&c.kv_shape());
    invalid(x.forward(&lc, &q, &k, &v), "values_in_keys");
    // a cache of another shape, named
    let mut short = zeros(&[1, 8, 1, 32]);
    match x.forward_with_latent_cache(&c, &q, &mut short, &[3], None) {
        Err(e @ Error::Shape { .. }) => assert!(e.to_string().contains('k'), "{e}"),
        other => panic!("expected a Shape error, got {other:?}"),
    }
    // new values beside the keys have nowhere to go: the append takes k_new alone, so its
    // shape is the keys' (a v-shaped append is a Shape error)
    let v_new = zeros(&[1, 1, 1, 16]);
    match x.forward_with_latent_cache(&c, &q, &mut cache, &[3], Some(&v_new)) {
        // named as the caller passed it (issue 61: it was called "k", the cache's name)
        Err(e @ Error::Shape { .. }) => assert!(e.to_string().starts_with("k_new "), "{e}"),
        other => panic!("expected a Shape error naming k_new, got {other:?}"),
    }
    // an 8-bit latent cache of another shape is a Shape error too, as SEMANTICS.md says
    // (issue 61: it was InvalidConfig), naming the cache and both shapes
    let q8 = |shape: [usize; 4]| {
        let n = shape.iter().product();
        x.quantized_cache(CacheFormat::Q8_0, &vec![0.0; n], shape, None)
            .unwrap()
    };
    let mut short_q8 = q8([1, 8, 1, 32]);
    common::kv::assert_shape_error(
        x.forward_with_quantized_latent_cache(&c, &q, &mut short_q8, &[3], None),
        flash_attn_wgpu::TensorRole::K,
        &c.kv_shape(),
        &[1, 8, 1, 32],
    );
    // q8_0 values 48 wide under 64-dim keys: refused by head_dim_v's name (issue 61: the
    // message said head_dim, which is fine at 64)
    let narrow = latent(cfg(1, 1, 16, 2, 1, 64, true), 48);
    let mut narrow_q8 = q8(narrow.kv_shape());
    let nq = zeros(&narrow.q_shape());
    match x.forward_with_quantized_latent_cache(&narrow, &nq, &mut narrow_q8, &[3], None) {
        Err(Error::Unsupported { feature, .. }) => {
            assert!(feature.contains("with head_dim_v 48"), "{feature}")
        }
        other => panic!("expected Unsupported naming head_dim_v, got {other:?}"),
    }
    // and the call itself runs
    x.forward_with_latent_cache(&c, &q, &mut cache, &[3], None)
        .unwrap();
}

#[test]
fn a_latent_cache_takes_576_x_2_bytes_a_token_and_8_bits_about_half_of_that() {
    // DeepSeek-V3's MLA: one latent head of 576 dims, values its first 512
    let c = latent(cfg(1, 1, 1024, 128, 1, 576, false), 512);
    let f16 = flash_attn_wgpu::DType::F16;
    let latent_f16 = c.cache_bytes_per_token(f16, None, true);
    assert_eq!(latent_f16, 576 * 2);
    assert_eq!(c.cache_bytes_per_token(f16, None, false), 1088 * 2);
    for f in CacheFormat::ALL {
        let b = c.cache_bytes_per_token(f16, Some(f), true);
        assert!(
            b as f64 <= 0.55 * latent_f16 as f64,
            "{f}: {b} bytes a token"
        );
    }
    // what the device holds: a latent cache of 1,024 rows, dense and 8-bit, counted by
    // MemoryStats (no v beside it)
    let x = flash_attn_wgpu::Context::new().unwrap();
    let before = x.memory_stats().live_bytes;
    let cache = x.zeros_of(&c.kv_shape(), f16).unwrap();
    assert_eq!(x.memory_stats().live_bytes - before, 1024 * latent_f16);
    drop(cache);
    let zeros = vec![0f32; c.kv_shape().iter().product()];
    let q8 = x
        .quantized_cache(CacheFormat::Q8_0, &zeros, c.kv_shape(), None)
        .unwrap();
    let per_token = c.cache_bytes_per_token(f16, Some(CacheFormat::Q8_0), true);
    assert_eq!(q8.size_bytes().unwrap(), 1024 * per_token);
    assert_eq!(x.memory_stats().live_bytes - before, 1024 * per_token);
}
