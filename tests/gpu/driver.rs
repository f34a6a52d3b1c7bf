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
    // cooperative matrices exactly where the coop variant runs (not on lavapipe)
    assert_eq!(
        r.coop_f16_gflops.is_some(),
        ctx.adapter_info().cooperative_matrices.contains("in use"),
        "{r:?}"
    );
    if let Some(g) = r.coop_f16_gflops {
        assert!(g.is_finite() && g > 0.0, "{r:?}");
    }
}
