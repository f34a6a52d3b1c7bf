//! A monotonic clock on every target. `std::time::Instant` panics on `wasm32-unknown-unknown`
//! (the browser's clock is not std's), so there the wall-clock measurements (the pipeline
//! log's milliseconds, `last_gpu_timing` without timestamps) read zero and `last_gpu_timing`
//! gives `None`.

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use std::time::Instant;

/// No clock: every interval reads zero.
#[cfg(target_arch = "wasm32")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Instant;

#[cfg(target_arch = "wasm32")]
impl Instant {
    pub(crate) fn now() -> Self {
        Instant
    }

    pub(crate) fn elapsed(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}
