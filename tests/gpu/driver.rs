//! The Vulkan driver runs long shader loops to the end (Mesa lavapipe < 25 does not).

use crate::common;
use flash_attn_wgpu::{device::CANARY_ITERATIONS, Error};

#[test]
fn shader_loop_of_200000_iterations_counts_exactly() {
    assert_eq!(CANARY_ITERATIONS, 200_000);
    if let Err(e) = common::ctx().driver_canary() {
        panic!("{e}");
    }
}

/// Vulkan gets our layout-clean SPIR-V where the device has `PASSTHROUGH_SHADERS`
/// (`Context::new` asks for it), and a device without it, passed to `Context::from_wgpu`,
/// gets the WGSL through wgpu's compiler: both routes give the reference's answers, forward
/// and backward, both algorithms, with the same pipelines.
#[test]
fn both_shader_routes_give_the_reference_answers() {
    let ctx = common::ctx();
    let info = ctx.adapter_info();
    if info.backend == "Vulkan" {
        assert!(info.shaders.starts_with("SPIR-V 1."), "{info}");
    }
    // the features Context::new asks for, less PASSTHROUGH_SHADERS
    let wanted =
        wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY;
    let wgsl = common::device_exactly(None, wanted);
    let x = flash_attn_wgpu::Context::from_wgpu(wgsl.0, wgsl.1).expect("context");
    assert_eq!(x.adapter_info().shaders, "WGSL");
    for x in [ctx, &x] {
        common::check_backward_on(x, &common::cfg(1, 77, 61, 4, 1, 64, true), 1.0);
    }
}

#[test]
fn canary_failure_names_the_cause() {
    let msg = Error::DriverCanary {
        expected: 200_000,
        got: 65_535,
    }
    .to_string();
    assert!(
        msg.contains("65535") && msg.contains("Mesa") && msg.contains("25"),
        "{msg}"
    );
}

#[test]
fn no_adapter_error_says_how_to_get_one() {
    let msg = Error::NoAdapter {
        detail: "none".into(),
    }
    .to_string();
    assert!(
        msg.contains("lavapipe") && msg.contains("Mesa >= 25"),
        "{msg}"
    );
}

#[test]
fn roofline_probes_measure_every_ceiling_the_adapter_has() {
    let ctx = common::ctx();
    let r = ctx.measure_roofline(0.05).unwrap();
    assert!(r.fma_gflops.is_finite() && r.fma_gflops > 0.0, "{r:?}");
    assert!(r.copy_gbps.is_finite() && r.copy_gbps > 0.0, "{r:?}");
    // f16 arithmetic is probed exactly where the device has SHADER_F16 (lavapipe has it)
    assert_eq!(
        r.fma_f16_gflops.is_some(),
        ctx.adapter_info().shader_f16,
        "{r:?}"
    );
    if let Some(g) = r.fma_f16_gflops {
        assert!(g.is_finite() && g > 0.0, "{r:?}");
    }
    // cooperative matrices exactly where the coop variant may run (in use on a GPU, offered
    // on lavapipe 26; not on lavapipe 25)
    let coop = ctx.plan_env().caps.coop != 0;
    assert_eq!(r.coop_f16_gflops.is_some(), coop, "{r:?}");
    if let Some(g) = r.coop_f16_gflops {
        assert!(g.is_finite() && g > 0.0, "{r:?}");
    }
}
