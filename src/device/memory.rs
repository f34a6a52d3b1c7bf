//! What the device's memory accounting is: the tracker a context holds, the buffers it
//! counts and the statistics it reports. Below the context (mod.rs) that holds a tracker and
//! the calls that allocate through it (buffers.rs), so that neither imports the other back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of device memory held by buffers this library created.
#[derive(Debug, Default)]
pub(crate) struct MemTracker {
    pub(super) live: AtomicU64,
    pub(super) peak: AtomicU64,
}

impl MemTracker {
    pub(crate) fn alloc(&self, bytes: u64) {
        let now = self.live.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    pub(crate) fn free(&self, bytes: u64) {
        self.live.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// Device memory held by storage and readback buffers the library created: tensors, scratch
/// and staging copies. Per-call uniform and timestamp buffers (a few hundred bytes) are not
/// counted. Non-exhaustive: the library makes it, and may count more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Bytes held now.
    pub live_bytes: u64,
    /// Most bytes held at once since the context was made or `reset_peak_memory` was called.
    pub peak_bytes: u64,
}

/// A buffer whose bytes count in the context's `MemoryStats` while it lives.
#[derive(Debug)]
pub(crate) struct TrackedBuffer {
    pub(crate) buffer: wgpu::Buffer,
    pub(super) mem: Arc<MemTracker>,
    /// Destroy the buffer when dropped (its memory is freed once submitted work using it is
    /// done); false for scratch a caller's encoder still holds (`keep_for_encoder`).
    pub(super) destroy: bool,
}

impl TrackedBuffer {
    /// True when this buffer was made by the context that owns `mem`.
    pub(crate) fn belongs_to(&self, mem: &Arc<MemTracker>) -> bool {
        Arc::ptr_eq(&self.mem, mem)
    }

    /// Dropped without `destroy`: commands recorded into a caller's encoder, not yet
    /// submitted, still bind it (a destroyed buffer would fail their submit); wgpu frees it
    /// when the last of them is done. It stops counting in the memory statistics when dropped.
    pub(crate) fn keep_for_encoder(&mut self) {
        self.destroy = false;
    }
}

impl Drop for TrackedBuffer {
    fn drop(&mut self) {
        self.mem.free(self.buffer.size());
        if self.destroy {
            self.buffer.destroy();
        }
    }
}
