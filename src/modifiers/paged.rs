//! Paged KV caches: keys and values in pages of `page_size` rows, `[num_pages, page_size,
//! heads_kv, head_dim]`, and a block table `[batch, pages_per_seq]` (u32) naming the page that
//! holds each batch's rows `[p * page_size, (p + 1) * page_size)`. Attention reads K and V
//! through the table ([`AttentionConfig::paged`](crate::AttentionConfig::paged)); a KV-cache
//! call's append writes through it. Any page size works (the kernels look a key's page up per
//! key); pages may be shared between batches (a common prefix) and left unused.

use crate::error::{Error, Result};

/// A paged layout of a call's K and V (`AttentionConfig::paged`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagedKv {
    /// Rows (keys) per page, at least 1.
    pub page_size: usize,
    /// Pages in the K and V pools.
    pub num_pages: usize,
    /// Table entries per batch: batch b's key j lies in page
    /// `block_table[b * pages_per_seq + j / page_size]`. The call's `seq_kv` is
    /// `pages_per_seq * page_size`.
    pub pages_per_seq: usize,
    /// `[batch, pages_per_seq]` page indices, each below `num_pages`.
    pub block_table: Vec<u32>,
}

impl PagedKv {
    /// flash-attn's `cache_batch_idx` on a dense cache: batch entry b reads (and a KV-cache
    /// call appends to) row `cache_batch_idx[b]` of a cache `[cache_batch, capacity,
    /// heads_kv, head_dim]`, which is a paged layout of one page per sequence, a page being a
    /// whole cache row. Set it as the call's `paged` with `seq_kv = capacity`; entries are
    /// checked against `cache_batch` like any block table, and a call that appends refuses
    /// an index named twice.
    ///
    /// ```
    /// use flash_attn_wgpu::{AttentionConfig, PagedKv};
    /// // batch entries 0 and 1 use cache rows 2 and 0 of a 3-row cache of 64 positions
    /// let mut cfg = AttentionConfig::new(2, 1, 64, 8, 2, 32);
    /// cfg.paged = Some(PagedKv::cache_rows(3, 64, vec![2, 0]));
    /// assert_eq!(cfg.kv_shape(), [3, 64, 2, 32]); // the cache itself
    /// cfg.validate()?;
    /// # Ok::<(), flash_attn_wgpu::Error>(())
    /// ```
    pub fn cache_rows(cache_batch: usize, capacity: usize, cache_batch_idx: Vec<u32>) -> PagedKv {
        PagedKv {
            page_size: capacity,
            num_pages: cache_batch,
            pages_per_seq: 1,
            block_table: cache_batch_idx,
        }
    }

    /// The layout's checks against a call of `batch` sequences of `seq_kv` keys: the table's
    /// size, every entry within the pool, and `seq_kv = pages_per_seq * page_size`.
    pub fn check(&self, batch: usize, seq_kv: usize) -> Result<()> {
        if self.page_size == 0 || self.num_pages == 0 || self.pages_per_seq == 0 {
            return Err(Error::invalid(format!(
                "paged: page_size, num_pages and pages_per_seq must be at least 1, got {}, {} \
                 and {}",
                self.page_size, self.num_pages, self.pages_per_seq
            )));
        }
        if self.block_table.len() != batch * self.pages_per_seq {
            return Err(Error::invalid(format!(
                "paged: block_table must hold batch x pages_per_seq = {} x {} = {} entries, got \
                 {}",
                batch,
                self.pages_per_seq,
                batch * self.pages_per_seq,
                self.block_table.len()
            )));
        }
        if let Some((i, &p)) = self
            .block_table
            .iter()
            .enumerate()
            .find(|(_, &p)| p as usize >= self.num_pages)
        {
            return Err(Error::invalid(format!(
                "paged: block_table[{i}] (batch {}, page {}) is {p}, past the pool's {} pages",
                i / self.pages_per_seq,
                i % self.pages_per_seq,
                self.num_pages
            )));
        }
        if self.pages_per_seq.checked_mul(self.page_size) != Some(seq_kv) {
            return Err(Error::invalid(format!(
                "paged: seq_kv must be pages_per_seq x page_size = {} x {}, got {seq_kv}",
                self.pages_per_seq, self.page_size
            )));
        }
        if self
            .num_pages
            .checked_mul(self.page_size)
            .is_none_or(|r| r > u32::MAX as usize)
        {
            return Err(Error::invalid(format!(
                "paged: the pool's rows (num_pages x page_size = {} x {}) must fit 32 bits",
                self.num_pages, self.page_size
            )));
        }
        Ok(())
    }

    /// Where batch b's key j lies in the pool: its row `page * page_size + j % page_size`.
    pub fn row(&self, b: usize, j: usize) -> usize {
        let page = self.block_table[b * self.pages_per_seq + j / self.page_size] as usize;
        page * self.page_size + j % self.page_size
    }
}
