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
