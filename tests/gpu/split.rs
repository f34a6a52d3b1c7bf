//! Inputs bigger than one storage binding (issue 9, class 4): the tiled algorithm splits the
//! call into windows itself (whole batches, or query and key rows with an exact merge), in
//! both variants, every dtype, forward and backward. Devices created with bindings of a few
//! KiB exercise every kind of split quickly; one test goes just past lavapipe's real 128 MiB.

use crate::common;

use common::{cfg, check_dtype_dyn};
use flash_attn_wgpu::unstable::plan::{self, split};
use flash_attn_wgpu::{Algorithm, AttentionConfig, Context, DType, Error, Tuning, Variant, Window};

/// A context whose device binds at most `binding` bytes of a buffer at once.
fn context_with_binding(binding: u32) -> Context {
    let limits = wgpu::Limits {
        max_storage_buffer_binding_size: binding.into(),
        ..wgpu::Limits::default()
    };
    let (device, queue) = common::device_with(limits, wgpu::Features::SHADER_F16);
    Context::from_wgpu(device, queue).expect("context")
}

/// Forward and backward of every dtype and both variants on `ctx`, against the reference.
fn every_dtype_and_variant(ctx: &Context, c: &AttentionConfig, want: &str) {
    let split = split::choose(c, DType::F32, &ctx.plan_env()).unwrap();
    match (want, split) {
        ("batches", Some(s)) => assert!(!s.accumulate && s.batches < c.batch, "{s:?}"),
        ("rows", Some(s)) => assert!(
            s.accumulate && (s.q_rows < c.seq_q || s.kv_rows < c.seq_kv),
            "{s:?}"
        ),
        (w, s) => panic!("expected a split by {w}, got {s:?}"),
    }
    // each variant in two of the three dtypes (CI: one; tier.rs), rotating with the shape
    let base = ctx.tuning();
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    let salt = c.seq_q + c.seq_kv + c.batch;
    let per_variant = if common::tier::full() { 2 } else { 1 };
    for (n, variant) in Variant::ALL.into_iter().enumerate() {
        ctx.set_tuning(Tuning { variant, ..base }).unwrap();
        for k in 0..per_variant {
            let dtype = dtypes[(n + salt + k) % 3];
            check_dtype_dyn(ctx, dtype, c, 1.0, &format!("{variant:?} split by {want}"));
        }
    }
    ctx.set_tuning(base).unwrap();
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn whole_batches_per_window() {
    let ctx = context_with_binding(4 << 10);
    // 3 batches of 2,560 bytes of q each: one batch per 4 KiB window
    every_dtype_and_variant(&ctx, &cfg(3, 20, 20, 2, 1, 16, true), "batches");
}

#[test]
fn query_and_key_windows_merge_exactly() {
    let ctx = context_with_binding(8 << 10);
    // Causal, GQA, odd lengths: several query windows, several key windows each (skipped
    // where causal hides them), a resumed online softmax, dK/dV and dQ summed over windows.
    every_dtype_and_variant(&ctx, &cfg(1, 150, 130, 2, 1, 16, true), "rows");
    // seq_q < seq_kv, not causal, head_dim not a power of two (the full tier; tier.rs)
    if common::tier::full() {
        every_dtype_and_variant(&ctx, &cfg(2, 37, 140, 1, 1, 24, false), "rows");
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn windowed_calls_split_into_windows_skip_only_what_the_band_hides() {
    let ctx = context_with_binding(8 << 10);
    // A band of 20 keys left of the diagonal (and 5 right): key windows left of a query
    // window's band are skipped and later ones still visited; the first rows see nothing.
    let mut c = cfg(1, 150, 130, 2, 1, 16, false);
    c.window = Window::new(Some(20), Some(5));
    every_dtype_and_variant(&ctx, &c, "rows");
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn packed_sequences_survive_the_split_into_query_and_key_windows() {
    // A varlen call's boundaries are the whole call's rows and keys: a query or key window's
    // part looks its sequences up from its own first row and key (q_base, kv_base), and the
    // causal diagonal of each sequence crosses windows.
    let ctx = context_with_binding(8 << 10);
    let v = flash_attn_wgpu::Varlen::from_lengths(&[41, 0, 66, 30], &[25, 9, 80, 17]);
    let mut c = AttentionConfig::packed(v.cu_seqlens_q, v.cu_seqlens_kv, 2, 1, 16);
    c.causal = true;
    c.alibi_slopes = Some(common::random_alibi(&c, false));
    c.mask = Some(common::random_bool_mask(&c, false, true, 0.8, 1));
    every_dtype_and_variant(&ctx, &c, "rows");
}

#[test]
fn the_bias_gradient_of_a_split_call_is_a_device_limit_naming_its_scratch() {
    // d_bias takes an f32 scratch of batch x heads_q x seq_q x seq_kv bound whole: a call
    // split because its tensors pass one binding has a scratch past it too, and gets a typed
    // error naming it, never a wrong or partial d_bias.
    let ctx = context_with_binding(4 << 10);
    let mut c = cfg(3, 20, 20, 2, 1, 16, true);
    c.bias = Some(common::random_bias(&c, false, false, 0.0, 0));
    let data = common::inputs(&c, 1.0);
    let f = ctx.forward_host(&c, &data.q, &data.k, &data.v).unwrap();
    match ctx.backward_host(&c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out) {
        Err(Error::DeviceLimit { what, .. }) => {
            assert!(what.contains("bias gradients"), "{what}")
        }
        other => panic!("expected DeviceLimit naming the bias gradients, got {other:?}"),
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn alibi_sinks_key_lengths_dropout_block_and_boolean_masks_survive_the_split_into_windows() {
    // Per-(batch, head) slopes index the whole call's batch (a part's batch 0 is not the
    // call's), a resumed row must not count its sink twice, and dropout's RNG takes the whole
    // call's batch, row and key (a part's are not the call's), as the block mask's grids: whole
    // batches per window, then
    // query and key windows, in f32 and bf16 on every variant.
    for (binding, c0, want) in [
        (4 << 10, cfg(3, 20, 20, 2, 1, 16, true), "batches"),
        (8 << 10, cfg(2, 120, 130, 2, 1, 16, false), "rows"),
    ] {
        let ctx = context_with_binding(binding);
        let mut c = c0;
        c.alibi_slopes = Some(common::random_alibi(&c, true));
        c.sinks = Some(common::random_sinks(&c));
        // lengths count from the whole call's key 0 (a key window's part starts past it)
        c.seqlens_kv = Some(common::random_seqlens(&c));
        c.dropout = Some(common::random_dropout(0.3));
        c.block_mask = Some(common::random_block_mask(&c, (9, 13), true, true, 0.7));
        // the boolean mask and the bias are bound whole and indexed by the whole call's rows
        // and keys; the bias, seq_q x seq_kv entries, fits the few KiB of one binding only in
        // the batch split, shared by the batches (the case a split call with a bias meets: a
        // batch past one binding). d_bias is not asked for: its kernel binds q, k, v and
        // d_out whole.
        c.mask = Some(common::random_bool_mask(&c, true, true, 0.8, 1));
        if want == "batches" {
            let mut bias = common::random_bias(&c, false, true, 0.05, 1);
            bias.grad = false;
            c.bias = Some(bias);
        }
        assert!(split::choose(&c, DType::F32, &ctx.plan_env())
            .unwrap()
            .is_some());
        let base = ctx.tuning();
        for variant in Variant::ALL {
            ctx.set_tuning(Tuning { variant, ..base }).unwrap();
            for dtype in [DType::F32, DType::BF16] {
                check_dtype_dyn(
                    &ctx,
                    dtype,
                    &c,
                    2.0,
                    &format!("{variant:?} split by {want}"),
                );
            }
        }
    }
}

#[test]
fn key_lengths_beside_a_block_mask_survive_windows_of_whole_batches() {
    // The kernels read the whole call's extras, whose key lengths are a pair of words per batch
    // of the whole call: a part's offsets must be the whole call's (Params::from_part), or the
    // block mask is read from inside the key lengths and rows see nothing (found by the full
    // tier's test above; 2026-12-05), on the adapter's default variant. The decode kernel's
    // batch windows: tests/gpu/decode.rs::decode_runs_in_windows_of_whole_batches_past_one_binding.
    let ctx = context_with_binding(4 << 10);
    let mut c = cfg(3, 20, 20, 2, 1, 16, true);
    c.seqlens_kv = Some(common::random_seqlens(&c));
    c.block_mask = Some(common::random_block_mask(&c, (128, 128), true, true, 0.8));
    assert!(split::choose(&c, DType::F32, &ctx.plan_env())
        .unwrap()
        .is_some());
    check_dtype_dyn(&ctx, DType::F32, &c, 1.0, "split by batches");
}

#[test]
fn the_naive_algorithm_names_the_tensor_and_points_to_the_tiled_one() {
    let ctx = context_with_binding(4 << 10);
    let mut c = cfg(3, 20, 20, 2, 1, 16, false);
    c.algorithm = Algorithm::Naive;
    let n = 3 * 20 * 2 * 16;
    match ctx.forward_host(
        &c,
        &vec![0.5f32; n],
        &vec![0.5f32; n / 2],
        &vec![0.5f32; n / 2],
    ) {
        Err(Error::DeviceLimit {
            what, limit, hint, ..
        }) => {
            assert!(what.contains('q'), "{what}");
            assert_eq!(limit, 4 << 10);
            assert!(hint.contains("Algorithm::Tiled"), "{hint}");
        }
        other => panic!("expected DeviceLimit, got {other:?}"),
    }
}

#[test]
fn an_lse_past_one_binding_is_a_typed_error_with_a_possible_hint() {
    // 64 query heads x 40 queries of lse = 10 KiB per batch, past a 8 KiB binding
    let ctx = context_with_binding(8 << 10);
    let c = cfg(1, 40, 8, 64, 1, 4, false);
    match plan::forward(&c, DType::F32, &ctx.plan_env()) {
        Err(Error::DeviceLimit { what, hint, .. }) => {
            assert!(what.contains("lse"), "{what}");
            assert!(hint.contains("query heads"), "{hint}");
        }
        other => panic!(
            "expected DeviceLimit, got {:?}",
            other.map(|p| p.steps.len())
        ),
    }
}

#[test]
fn keys_just_past_128_mib_on_the_real_device() {
    // k and v of 524,289 keys x 64 f32 = 128 MiB + 256 B each: past lavapipe's (and WebGPU's
    // default) 128 MiB storage binding. Four causal queries see all of them. An adapter with
    // larger bindings (about 2 GiB on NVIDIA) is asked for a device of FLASH_ATTN_TEST_MAX_BINDING
    // bytes where that is set (the GPU check sets 128 MiB), so the case stays this size. A
    // tensor past one binding must still fit one buffer (a tensor is one buffer: past
    // max_buffer_size it is a DeviceLimit, docs/SEMANTICS.md): where the two limits are equal
    // (SwiftShader's 1 GiB, some GPUs) the binding is capped at 128 MiB too.
    let capped;
    let mut ctx = common::ctx();
    let room = ctx.plan_env().max_binding_bytes + 256 <= ctx.adapter_info().max_buffer_bytes;
    let asked = std::env::var("FLASH_ATTN_TEST_MAX_BINDING")
        .ok()
        .and_then(|v| v.parse::<u32>().ok());
    if let Some(cap) = asked
        .or((!room).then_some(128 << 20))
        .filter(|&cap| (cap as u64) < ctx.plan_env().max_binding_bytes)
    {
        capped = context_with_binding(cap);
        ctx = &capped;
    }
    let limit = ctx.plan_env().max_binding_bytes;
    let c = cfg(1, 4, (limit / 256 + 1) as usize, 1, 1, 64, true);
    assert!(c.seq_kv as u64 * 256 > limit);
    let split = split::choose(&c, DType::F32, &ctx.plan_env())
        .unwrap()
        .unwrap();
    assert!(split.kv_rows < c.seq_kv, "{split:?}");
    check_dtype_dyn(ctx, DType::F32, &c, 1.0, "past 128 MiB");
}
