//! Device buffers: allocation with memory tracking, upload and readback.

use std::sync::atomic::Ordering;

use super::memory::{MemoryStats, TrackedBuffer};
use super::Context;
use crate::error::{Error, Result};

impl Context {
    /// Device memory held by this library's buffers now, and the peak.
    pub fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            live_bytes: self.mem.live.load(Ordering::SeqCst),
            peak_bytes: self.mem.peak.load(Ordering::SeqCst),
        }
    }

    /// Restarts peak tracking from the bytes held now.
    pub fn reset_peak_memory(&self) {
        let live = self.mem.live.load(Ordering::SeqCst);
        self.mem.peak.store(live, Ordering::SeqCst);
    }

    /// The largest buffer that can also be bound whole as storage.
    pub(crate) fn binding_limit(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// The largest buffer the device can create. Tensors up to this size are fine: a call
    /// binds windows of them when they pass one binding (`plan::split`).
    pub(crate) fn buffer_limit(&self) -> u64 {
        self.limits.max_buffer_size
    }

    /// Checks a buffer size against the device's buffer limit.
    pub(crate) fn check_buffer_size(&self, bytes: u64, what: &str) -> Result<()> {
        let limit = self.buffer_limit();
        if bytes > limit {
            return Err(Error::DeviceLimit {
                what: format!("{what} buffer"),
                needed: bytes,
                limit,
                hint: "a tensor must fit one buffer (max_buffer_size): request the adapter's \
                       limits (Context::new does), or split the batch, the queries (rows are \
                       independent) or the keys (merge the parts by their lse) over calls"
                    .into(),
            });
        }
        Ok(())
    }

    /// A zeroed storage buffer of `bytes` (rounded up to 4) that can be copied in and out.
    pub(crate) fn create_storage(&self, bytes: u64, label: &str) -> Result<TrackedBuffer> {
        let bytes = bytes.max(4).next_multiple_of(4);
        self.check_buffer_size(bytes, label)?;
        let buffer = self.scoped(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        self.mem.alloc(bytes);
        Ok(TrackedBuffer {
            buffer,
            mem: self.mem.clone(),
            destroy: true,
        })
    }

    /// Copies a tensor-sized slice of host data into a new storage buffer.
    /// Copies `data` into a new storage buffer; a length that is not a multiple of 4 (an odd
    /// number of half-precision elements) is padded with zero bytes.
    pub(crate) fn upload_bytes(&self, data: &[u8], label: &str) -> Result<TrackedBuffer> {
        let buf = self.create_storage(data.len() as u64, label)?;
        let whole = data.len() / 4 * 4;
        self.scoped(|| {
            if whole > 0 {
                self.queue.write_buffer(&buf.buffer, 0, &data[..whole]);
            }
            if whole < data.len() {
                let mut tail = [0u8; 4];
                tail[..data.len() - whole].copy_from_slice(&data[whole..]);
                self.queue.write_buffer(&buf.buffer, whole as u64, &tail);
            }
        })?;
        Ok(buf)
    }

    /// Reads the first `count` elements of a storage buffer back to the host.
    pub(crate) fn read_buffer<T: bytemuck::Pod>(
        &self,
        src: &wgpu::Buffer,
        count: usize,
    ) -> Result<Vec<T>> {
        self.read_buffer_at(src, 0, count)
    }

    /// Reads `count` elements from byte `offset` (a multiple of 4) of a buffer to the host,
    /// waiting for them (native only: `blocking`).
    pub(crate) fn read_buffer_at<T: bytemuck::Pod>(
        &self,
        src: &wgpu::Buffer,
        offset: u64,
        count: usize,
    ) -> Result<Vec<T>> {
        self.blocking("a readback", self.read_buffer_at_async(src, offset, count))?
    }

    /// Runs a future to its end on this thread, where a thread may wait (native). In a browser
    /// nothing may: there the blocking calls are `Unsupported` and name their async form.
    pub(crate) fn blocking<F: std::future::Future>(&self, what: &str, f: F) -> Result<F::Output> {
        if cfg!(target_arch = "wasm32") {
            return Err(Error::Unsupported {
                feature: format!("{what} that waits for the GPU"),
                backend: crate::Backend::Wgpu,
                reason: "a browser cannot block its thread: use the async form \
                         (Context::new_async, download_async)"
                    .into(),
            });
        }
        Ok(pollster::block_on(f))
    }

    /// [`read_buffer_at`](Context::read_buffer_at) as a future: on native it waits for the
    /// device when polled (wgpu finishes a mapping only when the device is polled); in a
    /// browser it waits for the mapping's promise on the event loop and never blocks.
    pub(crate) async fn read_buffer_at_async<T: bytemuck::Pod>(
        &self,
        src: &wgpu::Buffer,
        offset: u64,
        count: usize,
    ) -> Result<Vec<T>> {
        let used = count * std::mem::size_of::<T>();
        let bytes = (used as u64).max(4).next_multiple_of(4);
        let staging = self.scoped(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        self.mem.alloc(bytes);
        let staging = TrackedBuffer {
            buffer: staging,
            mem: self.mem.clone(),
            destroy: true,
        };
        self.scoped(|| {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("readback"),
                });
            enc.copy_buffer_to_buffer(src, offset, &staging.buffer, 0, bytes);
            self.queue.submit([enc.finish()]);
        })?;
        #[cfg(not(target_arch = "wasm32"))]
        self.map_read(&staging.buffer)?;
        #[cfg(target_arch = "wasm32")]
        mapped(&staging.buffer).await?;
        let out = {
            let view = staging
                .buffer
                .get_mapped_range(..)
                .map_err(|e| Error::Device(format!("mapped range: {e}")))?;
            bytemuck::pod_collect_to_vec::<u8, T>(&view[..used])
        };
        staging.buffer.unmap();
        Ok(out)
    }

    /// Maps a whole buffer for reading and blocks until it is mapped. Another thread's poll
    /// may be the one that fires our callback, so poll until the callback has reported.
    pub(crate) fn map_read(&self, buffer: &wgpu::Buffer) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        buffer.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        loop {
            self.wait()?;
            match rx.recv_timeout(std::time::Duration::from_millis(1)) {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => {
                    return Err(Error::Device(format!("mapping a buffer for readback: {e}")))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::Device("buffer mapping was dropped".into()))
                }
            }
        }
    }

    /// Blocks until all submitted work is done.
    pub(crate) fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Device(format!("waiting for the GPU: {e}")))?;
        self.check_alive()
    }
}

/// A buffer's mapping for reading as a future that completes when wgpu calls back: in a
/// browser the callback runs on the event loop, after the mapping promise resolves.
#[cfg(target_arch = "wasm32")]
async fn mapped(buffer: &wgpu::Buffer) -> Result<()> {
    use std::sync::{Arc, Mutex};
    use std::task::{Poll, Waker};
    type Slot = Arc<
        Mutex<(
            Option<std::result::Result<(), wgpu::BufferAsyncError>>,
            Option<Waker>,
        )>,
    >;
    let slot: Slot = Arc::new(Mutex::new((None, None)));
    let cb = slot.clone();
    buffer.map_async(wgpu::MapMode::Read, .., move |r| {
        if let Ok(mut s) = cb.lock() {
            s.0 = Some(r);
            if let Some(w) = s.1.take() {
                w.wake();
            }
        }
    });
    let r = std::future::poll_fn(|cx| match slot.lock() {
        Ok(mut s) => match s.0.take() {
            Some(r) => Poll::Ready(Ok(r)),
            None => {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        },
        Err(_) => Poll::Ready(Err(Error::Device("buffer mapping state poisoned".into()))),
    })
    .await?;
    r.map_err(|e| Error::Device(format!("mapping a buffer for readback: {e}")))
}
