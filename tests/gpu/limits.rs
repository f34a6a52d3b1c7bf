//! Device limits: the WebGPU defaults are enough, too-small devices get a clear error, and
//! grids past one dispatch dimension are folded.

use crate::common;
use common::{assert_close, assert_lse_close, cfg, inputs};
use flash_attn_wgpu::unstable::kernels::{workgroup_words, Kernel, Pass};
use flash_attn_wgpu::{
    unstable::reference, Algorithm, AttentionConfig, Context, Error, Tuning, Variant,
};

/// A context over a device created with exactly `limits`, through `Context::from_wgpu`.
fn context_with_limits(limits: wgpu::Limits) -> Context {
    let (device, queue) = common::device_with(limits, wgpu::Features::empty());
    Context::from_wgpu(device, queue).expect("context")
}

fn check_both_passes(ctx: &Context, c: &AttentionConfig) {
    let data = inputs(c, 1.0);
    let msg = common::describe(c, data.seed);
    let want = reference::forward(c, &data.q, &data.k, &data.v);
    let f = ctx
        .forward_host(c, &data.q, &data.k, &data.v)
        .unwrap_or_else(|e| panic!("{e} ({msg})"));
    assert_close("out", &f.out, &want.out, &msg);
    assert_lse_close(&f.lse, &want.lse, &msg);
    let wg = reference::backward(c, &data.q, &data.k, &data.v, &data.d_out);
    let g = ctx
        .backward_host(c, &data.q, &data.k, &data.v, &f.out, &f.lse, &data.d_out)
        .unwrap_or_else(|e| panic!("{e} ({msg})"));
    assert_close("dq", &g.dq, &wg.dq, &msg);
    assert_close("dk", &g.dk, &wg.dk, &msg);
    assert_close("dv", &g.dv, &wg.dv, &msg);
    match (&g.d_sinks, &wg.d_sinks) {
        (Some(got), Some(want)) => assert_close("d_sinks", got, want, &msg),
        (None, None) => {}
        (got, _) => panic!("d_sinks: got {got:?} ({msg})"),
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn webgpu_default_limits_run_every_head_dim_with_16k_tiles() {
    let ctx = context_with_limits(wgpu::Limits::default());
    assert_eq!(ctx.adapter_info().max_workgroup_storage_bytes, 16384);
    let default = ctx.tuning();
    // Every variant: the tile chooser picks smaller tiles for each under 16 KiB.
    for variant in Variant::ALL {
        ctx.set_tuning(Tuning { variant, ..default }).unwrap();
        for d in [16, 64, 80, 128, 256] {
            for kernel in [
                Kernel::Flash(variant, Pass::Forward),
                Kernel::Flash(variant, Pass::Dq),
                Kernel::Flash(variant, Pass::DkDv),
            ] {
                let t = ctx.tiles_for(kernel, d).unwrap();
                assert!(
                    workgroup_words(kernel, d as u32, t) * 4 <= 16384,
                    "{kernel:?} d={d}"
                );
            }
            check_both_passes(&ctx, &cfg(1, 53, 71, 2, 1, d, true));
        }
        // every score feature at once: the dK/dV kernels' 8 storage buffers (the default
        // cap) and the extras' uniform binding beside them, of the default 64 KiB
        let mut c = cfg(2, 40, 50, 2, 1, 32, true);
        c.window = flash_attn_wgpu::Window::new(Some(9), None);
        c.softcap = Some(2.0);
        c.alibi_slopes = Some(common::random_alibi(&c, true));
        c.sinks = Some(common::random_sinks(&c));
        c.seqlens_kv = Some(vec![50, 23]);
        c.dropout = Some(common::random_dropout(0.3));
        c.block_mask = Some(common::random_block_mask(&c, (8, 16), true, true, 0.7));
        check_both_passes(&ctx, &c);
    }
}

#[test]
fn device_with_too_little_workgroup_memory_names_the_limit() {
    let limits = wgpu::Limits {
        max_compute_workgroup_storage_size: 1024,
        ..wgpu::Limits::downlevel_defaults()
    };
    let ctx = context_with_limits(limits);
    let c = cfg(1, 8, 8, 1, 1, 256, false);
    let data = inputs(&c, 1.0);
    match ctx.forward_host(&c, &data.q, &data.k, &data.v) {
        Err(Error::DeviceLimit {
            needed,
            limit,
            what,
            ..
        }) => {
            assert_eq!(limit, 1024);
            assert!(needed > 1024);
            assert!(what.contains("head_dim 256"), "{what}");
        }
        other => panic!("expected DeviceLimit, got {other:?}"),
    }
    // The naive path needs no workgroup tiles and still works there.
    let mut c = c;
    c.algorithm = Algorithm::Naive;
    let want = reference::forward(&c, &data.q, &data.k, &data.v);
    let got = ctx.forward_host(&c, &data.q, &data.k, &data.v).unwrap();
    assert_close("out", &got.out, &want.out, "naive on a small device");
}

#[test]
fn device_with_too_few_storage_buffers_names_the_limit() {
    let limits = wgpu::Limits {
        max_storage_buffers_per_shader_stage: 4,
        ..wgpu::Limits::default()
    };
    let ctx = context_with_limits(limits);
    let c = cfg(1, 8, 8, 1, 1, 16, false);
    let data = inputs(&c, 1.0);
    match ctx.forward_host(&c, &data.q, &data.k, &data.v) {
        Err(Error::DeviceLimit {
            needed: 5,
            limit: 4,
            what,
            ..
        }) => {
            assert!(what.contains("storage buffers"), "{what}");
        }
        other => panic!("expected DeviceLimit, got {other:?}"),
    }
}

#[test]
fn device_without_storage_buffers_is_refused_as_such() {
    // A device as WebGL2-class downlevel limits give: no storage buffers in compute at all.
    let limits = wgpu::Limits {
        max_storage_buffers_per_shader_stage: 0,
        ..wgpu::Limits::default()
    };
    let (device, queue) = common::device_with(limits, wgpu::Features::empty());
    let made = Context::from_wgpu(device, queue);
    match made {
        Err(Error::Unsupported { reason, .. }) => {
            assert!(
                reason.contains("max_storage_buffers_per_shader_stage"),
                "{reason}"
            );
            assert!(reason.contains("with 0"), "{reason}");
            assert!(!reason.contains("canary"), "{reason}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn more_than_65535_workgroups_are_folded_into_two_dimensions() {
    // 66,000 query heads of one row each: 66,000 workgroups for the tiled forward and the
    // naive softmax, past the 65,535 per dimension limit.
    let c = cfg(1, 1, 3, 66_000, 1, 2, false);
    let ctx = common::ctx();
    check_both_passes(ctx, &c);
    let mut n = c.clone();
    n.algorithm = Algorithm::Naive;
    check_both_passes(ctx, &n);
}

#[test]
fn f16_works_without_shader_f16_through_packed_storage() {
    // A device made without optional features, as WebGPU core gives: no SHADER_F16.
    let ctx = context_with_limits(wgpu::Limits::default());
    assert!(!ctx.adapter_info().shader_f16);
    assert_eq!(
        ctx.tuning().half_storage,
        flash_attn_wgpu::HalfStorage::Packed
    );
    let c = cfg(1, 21, 19, 2, 1, 24, true);
    common::check_dtype::<_, half::f16>(&ctx, &c, 1.0, "no SHADER_F16");
    let native = Tuning {
        half_storage: flash_attn_wgpu::HalfStorage::Native,
        ..ctx.tuning()
    };
    match ctx.set_tuning(native) {
        Err(Error::Unsupported {
            feature,
            backend,
            reason,
        }) => {
            assert_eq!(backend, flash_attn_wgpu::Backend::Wgpu);
            assert!(feature.contains("native f16"), "{feature}");
            assert!(reason.contains("SHADER_F16"), "{reason}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}
