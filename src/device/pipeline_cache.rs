//! The pipeline cache's types: one compiled pipeline per `KernelKey`, and the log of every
//! pipeline a process creates. The context holds the cache; pipelines.rs fills it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::kernels::KernelKey;

/// A compiled pipeline and its bind-group layout.
pub(crate) struct Pipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// Pipelines by key, behind a lock so that one context serves many threads.
#[derive(Default)]
pub(crate) struct PipelineCache {
    pub(super) map: Mutex<HashMap<KernelKey, Arc<Pipeline>>>,
    pub(super) compiled: std::sync::atomic::AtomicUsize,
}

/// `FLASH_ATTN_PIPELINE_LOG=DIR`: every pipeline a process creates is appended to
/// `DIR/pipelines-<pid>.txt` as `<hash of its source>\t<label>\t<milliseconds to create>\t<the
/// creating thread's name>` (a test's name under the test harness), so that a test tier can
/// count the distinct compiles it costs and which test first needs each
/// (scripts/pipeline-count.sh).
/// On lavapipe a test's time is those compiles; they happen at a pipeline's first dispatch,
/// not in the milliseconds logged here (naga's translation and the driver's setup).
pub const PIPELINE_LOG_ENV: &str = "FLASH_ATTN_PIPELINE_LOG";

pub(super) fn log_pipeline(label: &str, wgsl: &str, took: std::time::Duration) {
    use std::hash::{Hash, Hasher};
    use std::io::Write;
    let Some(dir) = std::env::var_os(PIPELINE_LOG_ENV) else {
        return;
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    wgsl.hash(&mut h);
    let path = std::path::Path::new(&dir).join(format!("pipelines-{}.txt", std::process::id()));
    // a diagnostic: a write that fails must not fail the call
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let thread = std::thread::current();
        let _ = writeln!(
            f,
            "{:016x}\t{label}\t{}\t{}",
            h.finish(),
            took.as_millis(),
            thread.name().unwrap_or("-")
        );
    }
}
