//! The 8-bit KV cache type (`QuantizedCache`), apart from the wgpu calls that make and read it
//! (`quantized.rs`), so that the `AttentionBackend` trait names it without importing them.

use crate::error::Result;
use crate::kv_format::CacheFormat;
use crate::tensor::Tensor;

/// A KV cache (keys or values) in an 8-bit [`CacheFormat`] on the device: the words of
/// [`CacheFormat::quantize`]'s layout, holding `shape` (`[batch, capacity, heads_kv,
/// head_dim]`, or a paged pool's `[num_pages, page_size, heads_kv, head_dim]`) values. `X` is
/// the backend's tensor type (its words, as f32 bits). Made by
/// [`AttentionBackend::quantized_cache`](crate::AttentionBackend::quantized_cache).
#[derive(Debug)]
pub struct QuantizedCache<X = Tensor> {
    pub(crate) words: X,
    pub(crate) format: CacheFormat,
    pub(crate) shape: [usize; 4],
}

impl<X> QuantizedCache<X> {
    /// Its storage format.
    pub fn format(&self) -> CacheFormat {
        self.format
    }

    /// The shape of the values it holds.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// Bytes it takes on the device (scales and padding included).
    pub fn size_bytes(&self) -> Result<u64> {
        Ok(self.format.cache_words(self.shape)? as u64 * 4)
    }
}
