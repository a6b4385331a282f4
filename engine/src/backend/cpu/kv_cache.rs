//! The CPU backend's paged KV cache: one f32 pool for K and one for V, laid out
//! `[layer][block][row in block][kv head][head_dim]` (seed 000's KV cache pool).
//!
//! A block holds `block_size` token rows and, when KV groups share the pool, one spare row: a
//! group's pages may lie a fixed number of blocks apart (a page of every group per logical
//! block), and without the spare row that stride is a multiple of the block size, so the blocks
//! a long-context layer reads map onto part of the cache sets only. Callers address tokens by
//! slot (`block * block_size + offset`); readers index rows ([`CpuKvCache::row`]).

/// K and V storage for every layer and block.
pub struct CpuKvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    num_layers: usize,
    num_blocks: usize,
    block_size: usize,
    /// Rows a block takes in the pool: `block_size`, plus a spare one when padded.
    block_rows: usize,
    /// `kv_heads * head_dim`: floats per token per layer in K (and in V).
    token_width: usize,
    /// Host swap space: one buffer per host block holding all layers' K then V.
    host: Vec<Vec<f32>>,
}

impl CpuKvCache {
    /// Allocates a zeroed pool; `pad` adds a spare row to every block (see the module doc).
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        token_width: usize,
        pad: bool,
    ) -> Self {
        let block_rows = block_size + usize::from(pad);
        let n = num_layers * num_blocks * block_rows * token_width;
        CpuKvCache {
            k: vec![0.0; n],
            v: vec![0.0; n],
            num_layers,
            num_blocks,
            block_size,
            block_rows,
            token_width,
            host: Vec::new(),
        }
    }

    /// Reserves `n` host swap blocks (allocated lazily on first use).
    pub fn with_host_blocks(mut self, n: usize) -> Self {
        self.host = vec![Vec::new(); n];
        self
    }

    /// Number of host swap blocks.
    pub fn num_host_blocks(&self) -> usize {
        self.host.len()
    }

    /// Floats of one block in one layer's K (or V).
    fn block_floats(&self) -> usize {
        self.block_size * self.token_width
    }

    /// Copies block `src` to `dst` in every layer.
    pub fn copy_block(&mut self, src: usize, dst: usize) {
        let bf = self.block_floats();
        for l in 0..self.num_layers {
            let (s, d) =
                (self.offset(l, src * self.block_rows), self.offset(l, dst * self.block_rows));
            self.k.copy_within(s..s + bf, d);
            self.v.copy_within(s..s + bf, d);
        }
    }

    /// Appends block `blk`'s page (per layer: K then V) to `out` as little-endian bytes.
    pub fn read_page(&self, blk: usize, out: &mut Vec<u8>) {
        let bf = self.block_floats();
        for l in 0..self.num_layers {
            let s = self.offset(l, blk * self.block_rows);
            for src in [&self.k[s..s + bf], &self.v[s..s + bf]] {
                out.extend(src.iter().flat_map(|x| x.to_le_bytes()));
            }
        }
    }

    /// Fills block `blk` from a page laid out as [`CpuKvCache::read_page`] writes it.
    pub fn write_page(&mut self, blk: usize, page: &[u8]) {
        let bf = self.block_floats();
        let mut floats = page.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        for l in 0..self.num_layers {
            let s = self.offset(l, blk * self.block_rows);
            for x in &mut self.k[s..s + bf] {
                *x = floats.next().unwrap_or(0.0);
            }
            for x in &mut self.v[s..s + bf] {
                *x = floats.next().unwrap_or(0.0);
            }
        }
    }

    /// Saves device block `dev` into host block `host`.
    pub fn save_to_host(&mut self, dev: usize, host: usize) {
        let bf = self.block_floats();
        let mut buf = std::mem::take(&mut self.host[host]);
        buf.clear();
        for l in 0..self.num_layers {
            let s = self.offset(l, dev * self.block_rows);
            buf.extend_from_slice(&self.k[s..s + bf]);
            buf.extend_from_slice(&self.v[s..s + bf]);
        }
        self.host[host] = buf;
    }

    /// Restores host block `host` into device block `dev`.
    pub fn load_from_host(&mut self, host: usize, dev: usize) {
        let bf = self.block_floats();
        let buf = std::mem::take(&mut self.host[host]);
        for l in 0..self.num_layers {
            let d = self.offset(l, dev * self.block_rows);
            let base = l * 2 * bf;
            self.k[d..d + bf].copy_from_slice(&buf[base..base + bf]);
            self.v[d..d + bf].copy_from_slice(&buf[base + bf..base + 2 * bf]);
        }
        self.host[host] = buf;
    }

    /// Number of physical blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of one block's page over all layers, K and V (as pages travel: no spare row).
    pub fn bytes_per_block(&self) -> usize {
        Self::block_bytes(self.num_layers, self.block_size, self.token_width)
    }

    /// Bytes of one block's page for a pool of this shape (before one exists, to size it).
    pub fn block_bytes(num_layers: usize, block_size: usize, token_width: usize) -> usize {
        2 * num_layers * block_size * token_width * size_of::<f32>()
    }

    /// Number of slots (`num_blocks * block_size`).
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Rows of one layer's pool (`num_blocks * block_rows`).
    fn num_rows(&self) -> usize {
        self.num_blocks * self.block_rows
    }

    /// Rows a block takes (its first row is `block * block_rows()`).
    pub fn block_rows(&self) -> usize {
        self.block_rows
    }

    /// The row of `slot`.
    #[inline]
    pub fn row(&self, slot: usize) -> usize {
        slot / self.block_size * self.block_rows + slot % self.block_size
    }

    #[inline]
    fn offset(&self, layer: usize, row: usize) -> usize {
        (layer * self.num_rows() + row) * self.token_width
    }

    /// Writes one token's K and V for `layer` into `slot`.
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let o = self.offset(layer, self.row(slot));
        self.k[o..o + self.token_width].copy_from_slice(k);
        self.v[o..o + self.token_width].copy_from_slice(v);
    }

    /// A handle that writes tokens' K and V for `layer` from several threads at once (each
    /// into its own slot), for the forward pass's parallel row tasks.
    pub fn layer_writer(&mut self, layer: usize) -> LayerWriter {
        assert!(layer < self.num_layers, "layer {layer} of {}", self.num_layers);
        let base = self.offset(layer, 0);
        LayerWriter {
            // SAFETY: `base` is within both pools (layer < num_layers).
            k: unsafe { self.k.as_mut_ptr().add(base) },
            v: unsafe { self.v.as_mut_ptr().add(base) },
            num_slots: self.num_slots(),
            block_size: self.block_size,
            block_rows: self.block_rows,
            width: self.token_width,
        }
    }

    /// Touches every page of the pool once, on `pool`'s threads, so that the memory is mapped
    /// before the first request rather than page by page inside forward passes (the pool is
    /// allocated zeroed and lazily, and a virtual machine's first touch of a page is slow).
    pub fn prefault(&mut self, pool: &super::pool::ThreadPool) {
        const PAGE: usize = 4096 / size_of::<f32>();
        for buf in [&mut self.k, &mut self.v] {
            let (ptr, n) = (super::pool::OutPtr(buf.as_mut_ptr()), buf.len());
            let per_task = (n / PAGE).div_ceil(pool.num_threads() * 4).max(1) * PAGE;
            pool.run(n.div_ceil(per_task), &|task| {
                for i in (task * per_task..((task + 1) * per_task).min(n)).step_by(PAGE) {
                    // SAFETY: tasks cover disjoint ranges of the buffer; the value is unchanged.
                    unsafe { std::ptr::write_volatile(ptr.get().add(i), 0.0) };
                }
            });
        }
    }

    /// K of all KV heads of the token in `row` ([`CpuKvCache::row`]).
    #[inline]
    pub fn k(&self, layer: usize, row: usize) -> &[f32] {
        let o = self.offset(layer, row);
        &self.k[o..o + self.token_width]
    }

    /// V of all KV heads of the token in `row` ([`CpuKvCache::row`]).
    #[inline]
    pub fn v(&self, layer: usize, row: usize) -> &[f32] {
        let o = self.offset(layer, row);
        &self.v[o..o + self.token_width]
    }
}

/// Writes one layer's K and V rows into the pool from several threads; see
/// [`CpuKvCache::layer_writer`]. It borrows nothing: the caller keeps the cache alive and
/// unread while writers are in use.
#[derive(Clone, Copy)]
pub struct LayerWriter {
    k: *mut f32,
    v: *mut f32,
    num_slots: usize,
    block_size: usize,
    block_rows: usize,
    width: usize,
}

// SAFETY: writers write disjoint slots (see `write`).
unsafe impl Send for LayerWriter {}
unsafe impl Sync for LayerWriter {}

impl LayerWriter {
    /// Writes one token's K and V into `slot`.
    ///
    /// # Safety
    /// The cache the writer came from must be alive and not otherwise accessed while writers
    /// run, and no two concurrent calls may name the same slot.
    pub unsafe fn write(&self, slot: usize, k: &[f32], v: &[f32]) {
        assert!(slot < self.num_slots && k.len() == self.width && v.len() == self.width);
        let row = slot / self.block_size * self.block_rows + slot % self.block_size;
        std::ptr::copy_nonoverlapping(k.as_ptr(), self.k.add(row * self.width), self.width);
        std::ptr::copy_nonoverlapping(v.as_ptr(), self.v.add(row * self.width), self.width);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefault_keeps_zeros_and_parallel_writes_land_where_write_puts_them() {
        for pad in [false, true] {
            check_writes(pad);
        }
    }

    fn check_writes(pad: bool) {
        let (layers, blocks, bs, width) = (3, 5, 4, 6);
        let pool = crate::backend::cpu::pool::ThreadPool::new(3);
        let mut a = CpuKvCache::new(layers, blocks, bs, width, pad);
        a.prefault(&pool);
        assert!(a.k.iter().chain(a.v.iter()).all(|&x| x == 0.0));
        let mut b = CpuKvCache::new(layers, blocks, bs, width, pad);
        let row = |l: usize, s: usize, kind: f32| -> Vec<f32> {
            (0..width).map(|i| kind + (l * 1000 + s * 10 + i) as f32).collect()
        };
        let slots: Vec<usize> = (0..blocks * bs).step_by(3).collect();
        for l in 0..layers {
            let w = a.layer_writer(l);
            pool.run(slots.len(), &|i| {
                let s = slots[i];
                // SAFETY: one task per slot, each slot once; `a` is not otherwise used meanwhile.
                unsafe { w.write(s, &row(l, s, 0.25), &row(l, s, 0.5)) };
            });
            for &s in &slots {
                b.write(l, s, &row(l, s, 0.25), &row(l, s, 0.5));
            }
        }
        assert_eq!(&a.k[..], &b.k[..]);
        assert_eq!(&a.v[..], &b.v[..]);
        assert_eq!(a.k(2, a.row(9)), &row(2, 9, 0.25)[..]);
        assert_eq!(a.v(1, a.row(0)), &row(1, 0, 0.5)[..]);
        // A page holds a block's token rows only, whatever the padding; copies move them.
        let mut page = Vec::new();
        a.read_page(2, &mut page);
        assert_eq!(page.len(), a.bytes_per_block());
        a.copy_block(2, 4);
        let mut copied = Vec::new();
        a.read_page(4, &mut copied);
        assert_eq!(page, copied);
        assert_eq!(a.k(0, a.row(4 * bs + 1)), &row(0, 2 * bs + 1, 0.25)[..]);
    }
}
