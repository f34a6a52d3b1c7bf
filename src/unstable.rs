//! Internals with no stability promise: the planner, the kernel catalogue, the f64 reference,
//! plan replay and the roofline probes.
//!
//! They are public only so that this repository's tests, benchmarks, the Dawn runner and the
//! GPU check can reach them; they change without notice between any two versions, and the
//! rustdoc hides them. Use the crate root's API instead.

#[path = "kernels/mod.rs"]
pub mod kernels;
#[path = "plan/mod.rs"]
pub mod plan;
#[path = "reference.rs"]
pub mod reference;
#[path = "replay.rs"]
pub mod replay;
#[path = "roofline.rs"]
pub mod roofline;
/// The SPIR-V Vulkan gets (device/spirv.rs), for the portability test to validate as shipped.
#[cfg(not(target_arch = "wasm32"))]
pub mod spirv {
    pub use crate::device::spirv::{kernel_spirv, without_private_layouts, SpirvTarget};
}
