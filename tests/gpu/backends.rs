//! One correctness suite over every backend present: with the `cuda` feature the first CUDA
//! device where one exists (without a driver or device the CUDA half prints why and is
//! skipped; CI has no GPU), run first, then the wgpu `Context` where wgpu finds an adapter (an
//! NVIDIA machine without its Vulkan driver has none: the wgpu half prints why and is skipped,
//! unless `FLASH_ATTN_REQUIRE_WGPU` is set, as CI sets it). Each case runs forward and backward on
//! fresh random data against the f64 reference in f32, f16 and bf16, through the
//! `AttentionBackend` interface, so the same code is the test on each backend. What a backend
//! declares it cannot do (`common::backend::declared_gap`, listed in the README) must come back
//! as `Error::Unsupported` naming that backend.

use crate::common;

use common::backend::check_all_dtypes;
use common::cfg;
use flash_attn_wgpu::dtype::to_f32_vec;
use flash_attn_wgpu::{AttentionBackend, AttentionConfig, DType, Error, Window};

#[cfg(feature = "cuda")]
fn cuda() -> Option<&'static flash_attn_wgpu::cuda::CudaContext> {
    use flash_attn_wgpu::cuda::CudaContext;
    use std::sync::OnceLock;
    static CUDA: OnceLock<Option<CudaContext>> = OnceLock::new();
    CUDA.get_or_init(|| {
        let dir = common::nvrtc::nvrtc_dir();
        match CudaContext::with_nvrtc_dir(0, Some(&dir)) {
            Ok(c) => {
                eprintln!(
                    "CUDA: {} (sm_{}), NVRTC {:?}",
                    c.device_name(),
                    c.arch(),
                    c.nvrtc_version()
                );
                Some(c)
            }
            // no driver, no device or no NVRTC: the CUDA half cannot run here and is skipped
            // with the reason (a missing library is a set-up to report, not a panic), unless
            // the caller knows there is a GPU to test (the GPU run sets
            // FLASH_ATTN_REQUIRE_CUDA=1 where nvidia-smi sees one): then the test fails with it
            Err(Error::CudaUnavailable { missing, .. })
                if std::env::var("FLASH_ATTN_REQUIRE_CUDA").is_err() =>
            {
                eprintln!("CUDA half skipped: the CUDA path cannot run here ({missing})");
                None
            }
            Err(e) => panic!("CUDA device present but unusable: {e}"),
        }
    })
    .as_ref()
}

/// Runs `$body` with `$b` bound to each backend present.
macro_rules! on_every_backend {
    (|$b:ident| $body:block) => {{
        // CUDA first: its half must run whether or not wgpu has an adapter, and whatever the
        // wgpu half does (an NVIDIA machine without its Vulkan driver has CUDA alone)
        #[cfg(feature = "cuda")]
        if let Some($b) = cuda() {
            $body
        }
        if let Some($b) = common::wgpu_half() {
            $body
        }
    }};
}

#[test]
fn every_backend_matches_the_reference_at_odd_lengths_causal_and_not() {
    on_every_backend!(|b| {
        // (CI: head dim 64 on wgpu; tier.rs)
        let dims = match common::tier::whole_on(b.backend()) {
            true => vec![64, 128],
            false => vec![64],
        };
        for head_dim in dims {
            for causal in [false, true] {
                for (seq_q, seq_kv) in [(1, 1), (77, 133), (133, 77), (200, 200)] {
                    let e =
                        check_all_dtypes(b, &cfg(2, seq_q, seq_kv, 4, 4, head_dim, causal), 1.0);
                    eprintln!(
                        "{} d={head_dim} causal={causal} {seq_q}x{seq_kv}: {e:?}",
                        b.backend()
                    );
                }
            }
        }
    });
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn every_backend_handles_gqa_mqa_and_every_head_dim_class() {
    // CUDA kernel classes: tensor-core forward 64-key tiles up to 128, 16-key tiles past it;
    // tensor-core backward 64 rows/keys up to 64, 32 past it; the SIMT kernels for head dims
    // that are not multiples of 16 and for the backward past 128. One head dim per class (128
    // is in the odd-lengths test); MQA and GQA (MHA everywhere else).
    on_every_backend!(|b| {
        for head_dim in [16, 40, 96, 160, 256] {
            for heads_kv in [1, 2] {
                let e = check_all_dtypes(b, &cfg(1, 65, 130, 8, heads_kv, head_dim, false), 1.0);
                eprintln!("{} d={head_dim} hkv={heads_kv}: {e:?}", b.backend());
            }
        }
    });
}

#[test]
fn every_backend_matches_the_reference_with_sliding_windows() {
    // (left, right, causal, seq_q, seq_kv, head_dim): bands of a few tiles (tiles outside
    // skipped), one side unbounded, causal folding `right` to 0, the diagonal alone, rows that
    // see nothing; head_dim 40 takes the CUDA SIMT kernels, 64 the tensor cores
    on_every_backend!(|b| {
        for (left, right, causal, sq, skv, d) in [
            (Some(16), Some(0), false, 150, 150, 64),
            (Some(40), None, false, 77, 133, 40),
            (None, Some(8), false, 133, 77, 64),
            (Some(5), Some(7), true, 100, 200, 64),
            (Some(0), Some(0), false, 64, 64, 40),
            (Some(3), Some(2), false, 300, 40, 64),
        ] {
            let mut c = cfg(2, sq, skv, 4, 2, d, causal);
            c.window = Window::new(left, right);
            let e = check_all_dtypes(b, &c, 1.0);
            eprintln!(
                "{} window ({left:?}, {right:?}) causal={causal} {sq}x{skv} d={d}: {e:?}",
                b.backend()
            );
        }
    });
}

#[test]
fn every_backend_matches_the_reference_with_a_softcap() {
    // c small beside the scores (amplitude 2: scaled scores of several units) so that tanh
    // bends them; with causal and a window too; head_dim 40 takes the CUDA SIMT kernels
    on_every_backend!(|b| {
        for (c, causal, window, d) in [
            (1.5, false, Window::default(), 64),
            (3.0, true, Window::new(Some(30), None), 64),
            (0.5, true, Window::default(), 40),
        ] {
            let mut cf = cfg(1, 77, 93, 4, 2, d, causal);
            cf.softcap = Some(c);
            cf.window = window;
            let e = check_all_dtypes(b, &cf, 2.0);
            eprintln!("{} softcap {c} causal={causal} d={d}: {e:?}", b.backend());
        }
    });
}

#[test]
fn every_backend_matches_the_reference_with_alibi_sinks_key_lengths_dropout_and_block_masks() {
    // per-head and per-(batch, head) slopes, sinks, with causal, per-batch key lengths (rows
    // that see no key: lse is the sink's), dropout and a block mask, and with a window and a
    // softcap at once; head_dim 40 takes the CUDA SIMT kernels, 64 the tensor cores
    on_every_backend!(|b| {
        for (per_batch, sinks, causal, d, sq, skv) in [
            (false, false, false, 64, 77, 93),
            (true, true, true, 64, 100, 70),
            (true, true, false, 40, 65, 130),
        ] {
            let mut c = cfg(2, sq, skv, 4, 2, d, causal);
            c.alibi_slopes = Some(common::random_alibi(&c, per_batch));
            c.sinks = sinks.then(|| common::random_sinks(&c));
            if d == 40 {
                c.window = Window::new(Some(30), Some(10));
                c.softcap = Some(2.0);
            }
            if causal {
                c.seqlens_kv = Some(common::random_seqlens(&c));
                c.leftpad_kv = Some(common::random_leftpad(&c));
            }
            if sinks {
                c.dropout = Some(common::random_dropout(0.2));
                // blocks smaller than any tile on one case, larger on the other
                let size = if d == 40 { (7, 9) } else { (70, 100) };
                c.block_mask = Some(common::random_block_mask(&c, size, true, d == 40, 0.6));
            }
            let e = check_all_dtypes(b, &c, 2.0);
            eprintln!("{} {}: {e:?}", b.backend(), common::describe(&c, 0));
        }
    });
}

#[test]
fn every_backend_matches_the_reference_on_packed_sequences_or_refuses_them() {
    // varlen: sequences of odd lengths (one with no keys), causal per sequence, with sinks
    on_every_backend!(|b| {
        let v = flash_attn_wgpu::Varlen::from_lengths(&[29, 40, 3], &[51, 0, 22]);
        let mut c = AttentionConfig::packed(v.cu_seqlens_q, v.cu_seqlens_kv, 4, 2, 64);
        c.causal = true;
        c.sinks = Some(common::random_sinks(&c));
        let e = check_all_dtypes(b, &c, 2.0);
        eprintln!("{} {}: {e:?}", b.backend(), common::describe(&c, 0));
    });
}

#[test]
fn every_backend_matches_the_reference_with_a_boolean_mask() {
    // a mask per (batch, head), two rows of it all false (out 0, lse -inf), causal and GQA
    on_every_backend!(|b| {
        let mut c = cfg(2, 45, 70, 4, 2, 64, true);
        c.mask = Some(common::random_bool_mask(&c, true, true, 0.6, 2));
        let e = check_all_dtypes(b, &c, 2.0);
        eprintln!("{} {}: {e:?}", b.backend(), common::describe(&c, 0));
    });
}

#[test]
fn every_backend_matches_the_reference_with_a_bias() {
    // a bias shared by batches, one row all -inf (lse -inf: the backward must recompute P = 0
    // there, not exp(-inf - -inf)), with d_bias; then with a softcap too, whose slope at an
    // -inf entry is NaN: P = 0 must give a zero gradient on every backend
    on_every_backend!(|b| {
        for softcap in [None, Some(1.5)] {
            let mut c = cfg(2, 45, 70, 4, 2, 64, true);
            c.softcap = softcap;
            c.bias = Some(common::random_bias(&c, false, true, 0.05, 1));
            let e = check_all_dtypes(b, &c, 2.0);
            eprintln!("{} {}: {e:?}", b.backend(), common::describe(&c, 0));
        }
    });
}

#[test]
fn every_backend_splits_decode_steps_over_the_keys_exactly() {
    // decode steps (1 to 4 query rows; 4 and 8 query heads a kv head, and MHA) in one split,
    // the heuristic's, and more splits than keys (empty ones); one with every modifier at once
    // (per-batch ALiBi, sinks, key lengths with a batch of none, dropout, a block mask, a
    // boolean mask and a bias with d_bias, aligned per batch as a KV cache); wgpu's decode
    // kernel, and CUDA's (cuda/flash_decode.cu), against the reference
    on_every_backend!(|b| {
        for (batch, sq, hq, hkv, d, skv, splits, mods) in [
            (2, 1, 8, 2, 64, 300, Some(1), false),
            (1, 1, 8, 1, 128, 1100, None, false),
            (2, 2, 4, 4, 40, 61, Some(70), false),
            (3, 4, 4, 2, 32, 157, Some(3), true),
        ] {
            let mut c = cfg(batch, sq, skv, hq, hkv, d, true);
            c.kv_splits = splits;
            if mods {
                c.alibi_slopes = Some(common::random_alibi(&c, true));
                c.sinks = Some(common::random_sinks(&c));
                c.seqlens_kv = Some(common::random_seqlens(&c));
                c.align_to_seqlens = true;
                c.dropout = Some(common::random_dropout(0.2));
                c.block_mask = Some(common::random_block_mask(&c, (1, 16), true, true, 0.7));
                c.mask = Some(common::random_bool_mask(&c, true, false, 0.8, 1));
                c.bias = Some(common::random_bias(&c, false, true, 0.05, 0));
            }
            let e = check_all_dtypes(b, &c, 2.0);
            eprintln!("{} {}: {e:?}", b.backend(), common::describe(&c, 0));
        }
    });
}

#[test]
fn every_backend_gives_zero_and_neg_inf_lse_for_rows_that_see_no_key_and_keeps_large_logits() {
    on_every_backend!(|b| {
        // causal with seq_q > seq_kv: the first seq_q - seq_kv rows see nothing
        check_all_dtypes(b, &cfg(1, 150, 40, 2, 2, 64, true), 1.0);
        // large logits: the online softmax's running max must keep them exact
        check_all_dtypes(b, &cfg(1, 90, 300, 2, 1, 128, false), 8.0);
    });
}

#[test]
fn every_backend_keeps_masked_nan_and_inf_out_of_rows_that_cannot_see_them() {
    use common::backend::{check_poisoned, isolates_nonfinite};
    fn case<B: AttentionBackend, T: flash_attn_wgpu::Element>(b: &B, c: &AttentionConfig) {
        if isolates_nonfinite(b.backend(), T::DTYPE) {
            check_poisoned(b, c, &common::poisoned_inputs::<T>(c));
        } else {
            eprintln!(
                "{} {}: masked NaN/Inf isolation not promised (README), not checked",
                b.backend(),
                T::DTYPE
            );
        }
    }
    on_every_backend!(|b| {
        // head_dim 32: the tensor-core kernels' shapes on CUDA; 40: the SIMT kernels' for
        // every dtype
        // (every dtype on CUDA and in the full tier; on wgpu in the CI tier f32 at 32 and f16
        // at 40: bf16's poisoned loads run on Dawn, tests/dawn.rs)
        let all = common::tier::whole_on(b.backend());
        for (head_dim, only) in [(32, DType::F32), (40, DType::F16)] {
            let c = cfg(1, 150, 150, 4, 2, head_dim, true);
            let run = |d: DType| all || d == only;
            if run(DType::F32) {
                case::<_, f32>(b, &c);
            }
            if run(DType::F16) {
                case::<_, half::f16>(b, &c);
            }
            if run(DType::BF16) {
                case::<_, half::bf16>(b, &c);
            }
        }
    });
}

/// Device-resident calls chain without host copies and give exactly the host calls' results;
/// tensors of the wrong shape or dtype are typed errors.
fn chains_on_the_device<B: AttentionBackend>(b: &B) {
    type T = half::bf16;
    let c = cfg(2, 37, 53, 4, 2, 64, true);
    let r = common::rounded_inputs::<T>(&c, 1.0);
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    let q = b.upload(&r.q, &qs).unwrap();
    let k = b.upload(&r.k, &kvs).unwrap();
    let v = b.upload(&r.v, &kvs).unwrap();
    let d_out = b.upload(&r.d_out, &qs).unwrap();
    let f = b.forward(&c, &q, &k, &v).unwrap();
    let g = b.backward(&c, &q, &k, &v, &f.out, &f.lse, &d_out).unwrap();
    let host_f = b.forward_host(&c, &r.q, &r.k, &r.v).unwrap();
    let out: Vec<T> = b.download(&f.out).unwrap();
    assert_eq!(
        out,
        host_f.out,
        "{}: device out differs from host out",
        b.backend()
    );
    let host_g = b
        .backward_host(&c, &r.q, &r.k, &r.v, &host_f.out, &host_f.lse, &r.d_out)
        .unwrap();
    assert_eq!(b.download::<T>(&g.dq).unwrap(), host_g.dq);
    assert_eq!(b.download::<T>(&g.dk).unwrap(), host_g.dk);
    assert_eq!(b.download::<T>(&g.dv).unwrap(), host_g.dv);
    let timing = b.last_gpu_timing().expect("a timing for the last call");
    assert!(timing.seconds > 0.0, "{timing:?}");
    // k where q belongs: a shape error naming q; lse read as bf16: a dtype error
    assert!(matches!(
        b.forward(&c, &k, &k, &v),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(b.download::<T>(&f.lse), Err(Error::DType { .. })));
    let q32 = b.upload(&to_f32_vec(&r.q), &qs).unwrap();
    assert!(matches!(
        b.forward(&c, &q32, &k, &v),
        Err(Error::DType { .. })
    ));
}

#[test]
fn every_backend_merges_key_shards_into_attention_over_all_keys() {
    on_every_backend!(|b| {
        common::shards::merged_equals_full::<_, f32>(b, 3);
        common::shards::merged_equals_full::<_, half::f16>(b, 2);
        common::shards::merged_equals_full::<_, half::bf16>(b, 4);
    });
}

#[test]
fn every_backend_appends_to_a_kv_cache_and_attends_aligned_per_batch() {
    on_every_backend!(|b| {
        let c = cfg(2, 1, 80, 4, 2, 64, true);
        common::kv::append_and_attend::<_, f32>(b, &c, &[0, 50], 4);
        // with a rotary embedding fused in (q and the new keys rotated first)
        let rope = common::kv::Rope {
            rotary_dim: 32,
            interleaved: false,
        };
        common::kv::append_and_attend_with::<_, f32>(b, &c, &[7, 40], 3, Some(rope));
        // (on wgpu in the CI tier f32 only: tests/gpu/kvcache.rs appends in every dtype)
        if common::tier::whole_on(b.backend()) {
            common::kv::append_and_attend::<_, half::f16>(b, &c, &[30, 75], 2);
        }
    });
}

#[test]
fn every_backend_reads_a_paged_cache_or_refuses_it() {
    // pages of 8 keys through a permuted table, a decode step and a few rows; every backend
    // reads them (and refuses the backward)
    on_every_backend!(|b| {
        for sq in [1, 6] {
            let c = common::kv::paged_cfg(&cfg(2, sq, 50, 4, 2, 32, true), 8, sq as u64);
            check_all_dtypes(b, &c, 2.0);
        }
    });
}

#[test]
fn every_backend_chains_device_tensors_and_types_its_errors() {
    // Contexts of its own: `last_gpu_timing` is a context's most recent call, which another
    // test's call on a shared context replaces where tests share a process (the GPU run's
    // test steps, the SwiftShader tier: one process, several threads).
    #[cfg(feature = "cuda")]
    if cuda().is_some() {
        let dir = common::nvrtc::nvrtc_dir();
        let own = flash_attn_wgpu::cuda::CudaContext::with_nvrtc_dir(0, Some(&dir)).unwrap();
        chains_on_the_device(&own);
    }
    if common::wgpu_half().is_some() {
        chains_on_the_device(&flash_attn_wgpu::Context::new().unwrap());
    }
}

/// User modifiers on CUDA (where a device is; skipped without): masks as CUDA C with the
/// block masks the CUDA device makes from them (the wgpu ones bit for bit), a document mask
/// and a T5 table read from captured tensors, forward and backward against the reference in
/// every dtype; a mask with WGSL alone refused as `Unsupported`.
#[cfg(feature = "cuda")]
#[test]
fn cuda_uploads_8_bit_caches_and_refuses_to_attend_over_them() {
    // (wgpu reads them: tests/gpu/kvcache.rs) CUDA declares the gap, after its caches upload
    // and read back as the host quantized them
    #[cfg(feature = "cuda")]
    if let Some(b) = cuda() {
        use flash_attn_wgpu::CacheFormat;
        let c = cfg(1, 1, 64, 4, 2, 32, true);
        let data: Vec<f32> = (0..64 * 2 * 32)
            .map(|i| (i % 97) as f32 / 48.0 - 1.0)
            .collect();
        let mut k = b
            .quantized_cache(CacheFormat::Q8_0, &data, c.kv_shape(), None)
            .unwrap();
        let want = CacheFormat::Q8_0
            .dequantize(
                &CacheFormat::Q8_0
                    .quantize(&data, c.kv_shape(), None)
                    .unwrap(),
                c.kv_shape(),
            )
            .unwrap();
        assert_eq!(b.dequantize_cache(&k).unwrap(), want);
        let mut v = b
            .quantized_cache(CacheFormat::Q8_0, &data, c.kv_shape(), None)
            .unwrap();
        let q = b.upload(&vec![0.5f32; 4 * 32], &c.q_shape()).unwrap();
        let e = b.forward_with_quantized_kvcache(&c, &q, (&mut k, &mut v), &[64], None);
        assert!(
            matches!(&e, Err(Error::Unsupported { backend, .. }) if *backend == flash_attn_wgpu::Backend::Cuda),
            "{e:?}"
        );
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_takes_user_masks_captured_tensors_and_makes_block_masks() {
    let Some(b) = cuda() else { return };
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(common::fresh_seed());
    let docs: Vec<f32> = (0..131).map(|j| (j / 29) as f32).collect();
    for (mask, causal, d, blocks) in [
        (common::score_mods::prefix_lm(23), false, 64, (16, 32)),
        (common::score_mods::dilated(), true, 40, (7, 9)),
        (common::score_mods::documents(docs), false, 64, (32, 32)),
    ] {
        let mut c = cfg(2, 131, 131, 4, 2, d, causal);
        let grid = (1, c.heads_q, c.seq_q, c.seq_kv);
        let bm = b.create_block_mask(&mask, grid, blocks).unwrap();
        if let Some(w) = common::wgpu_half() {
            assert_eq!(bm, w.create_block_mask(&mask, grid, blocks).unwrap());
        }
        c.block_mask = Some(bm);
        c.mask_mod = Some(mask);
        if d == 40 {
            let table = common::random(&mut rng, c.heads_q * 16, 1.0);
            c.score_mod = Some(common::score_mods::t5(c.heads_q, table));
        }
        let e = check_all_dtypes(b, &c, 2.0);
        eprintln!("{} {}: {e:?}", b.backend(), common::describe(&c, 0));
    }
    // (the dilated mask and the T5 modifier above run their WGSL's CUDA translation); WGSL
    // the translation does not take is refused
    let untranslated = flash_attn_wgpu::MaskMod::wgsl(
        "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return all(vec2<bool>(j <= i, true)); }",
    )
    .unwrap();
    assert!(untranslated.cuda_missing().is_some());
    assert!(matches!(
        b.create_block_mask(&untranslated, (1, 1, 97, 131), (16, 16)),
        Err(Error::Unsupported { .. })
    ));
}

/// CUDA interop (runs where a CUDA device is; skipped with the reason printed elsewhere): a
/// context on the caller's own stream, tensors wrapping the caller's device memory read in
/// place (a decode step and a tiled call give the bits of the same call on uploaded copies), a
/// KV-cache append written into the caller's cache, the memory still the caller's after the
/// tensors are dropped, bad pointers and views as typed errors, GPU timing opt-in.
#[cfg(feature = "cuda")]
#[test]
fn cuda_calls_queue_on_the_callers_stream_and_read_its_memory_in_place() {
    use cudarc::driver::{CudaContext as Driver, DevicePtr};
    use flash_attn_wgpu::cuda::CudaContext;
    use flash_attn_wgpu::{Backend, DType};
    if cuda().is_none() {
        return;
    }
    let dev = Driver::new(0).unwrap();
    let stream = dev.new_stream().unwrap();
    let c = CudaContext::from_stream(stream.clone(), Some(&common::nvrtc::nvrtc_dir())).unwrap();
    assert!(!c.gpu_timing());
    for (sq, skv) in [(1, 700), (70, 90)] {
        let mut cfg = common::cfg(2, sq, skv, 8, 2, 64, true);
        cfg.kv_splits = (sq == 1).then_some(3);
        let r = common::rounded_inputs::<half::f16>(&cfg, 1.5);
        // the caller's allocations, on its stream
        let mine = |x: &[half::f16]| stream.clone_htod(bytemuck::cast_slice::<_, u8>(x)).unwrap();
        let (qm, km, vm) = (mine(&r.q), mine(&r.k), mine(&r.v));
        let ptr = |s: &cudarc::driver::CudaSlice<u8>| s.device_ptr(&stream).0;
        let wrap = |s: &cudarc::driver::CudaSlice<u8>, shape: &[usize]| unsafe {
            c.tensor_from_device_ptr(ptr(s), s.len(), shape, None, DType::F16)
                .unwrap()
        };
        let (q, k, v) = (
            wrap(&qm, &cfg.q_shape()),
            wrap(&km, &cfg.kv_shape()),
            wrap(&vm, &cfg.kv_shape()),
        );
        assert!(q.is_borrowed());
        let f = c.forward(&cfg, &q, &k, &v).unwrap();
        let want = c.forward_host(&cfg, &r.q, &r.k, &r.v).unwrap();
        assert_eq!(
            c.download::<half::f16>(&f.out).unwrap(),
            want.out,
            "sq {sq}"
        );
        assert_eq!(c.download::<f32>(&f.lse).unwrap(), want.lse, "sq {sq}");
        drop((q, k, v, f));
        // still the caller's, unchanged
        let back: Vec<u8> = stream.clone_dtoh(&qm).unwrap();
        assert_eq!(back, bytemuck::cast_slice::<_, u8>(&r.q));
    }
    // an append into the caller's cache, in place
    let cfg = common::cfg(1, 1, 32, 4, 2, 16, true);
    let zeros = vec![half::f16::ZERO; 32 * 2 * 16];
    let cache = stream
        .clone_htod(bytemuck::cast_slice::<_, u8>(&zeros))
        .unwrap();
    let row: Vec<half::f16> = (0..2 * 16).map(|i| half::f16::from_f32(i as f32)).collect();
    let new = c.upload(&row, &[1, 1, 2, 16]).unwrap();
    let q = c.upload(&row.repeat(2), &cfg.q_shape()).unwrap();
    {
        let p = cache.device_ptr(&stream).0;
        let mut kc =
            unsafe { c.tensor_from_device_ptr(p, cache.len(), &cfg.kv_shape(), None, DType::F16) }
                .unwrap();
        let mut vc = c.upload(&zeros, &cfg.kv_shape()).unwrap();
        c.forward_with_kvcache(&cfg, &q, &mut kc, &mut vc, &[5], Some((&new, &new)))
            .unwrap();
    }
    let got: Vec<u8> = stream.clone_dtoh(&cache).unwrap();
    let got: &[half::f16] = bytemuck::cast_slice(&got);
    assert_eq!(&got[5 * 32..6 * 32], &row[..]);
    assert!(got[..5 * 32]
        .iter()
        .chain(&got[6 * 32..])
        .all(|x| *x == half::f16::ZERO));
    // bad pointers and views: typed errors
    let p = cache.device_ptr(&stream).0;
    let shape = cfg.kv_shape();
    let err = |ptr: u64, bytes: usize, strides: Option<&[usize]>| unsafe {
        c.tensor_from_device_ptr(ptr, bytes, &shape, strides, DType::F16)
            .unwrap_err()
    };
    assert!(
        matches!(err(p + 2, cache.len(), None), Error::Buffer { expected, .. } if expected.contains("16 bytes"))
    );
    assert!(
        matches!(err(p, cache.len() - 2, None), Error::Buffer { expected, .. } if expected.contains("bytes"))
    );
    let bhsd = [32 * 2 * 16, 16, 32 * 16, 1];
    assert!(matches!(
        err(p, cache.len(), Some(&bhsd)),
        Error::Unsupported {
            backend: Backend::Cuda,
            ..
        }
    ));
    // GPU timing: off, the host's wall time; on, the launches' events per kernel
    let t = c.last_gpu_timing().unwrap();
    assert!(!t.from_timestamps && t.per_kernel.is_empty(), "{t:?}");
    c.set_gpu_timing(true);
    c.forward(
        &cfg,
        &q,
        &c.upload(&zeros, &shape).unwrap(),
        &c.upload(&zeros, &shape).unwrap(),
    )
    .unwrap();
    let t = c.last_gpu_timing().unwrap();
    assert!(t.from_timestamps && !t.per_kernel.is_empty(), "{t:?}");
}
