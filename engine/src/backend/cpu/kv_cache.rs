//! The CPU backend's paged KV cache: one pool for K and one for V, laid out
//! `[layer][block][row in block][kv head][head_dim]` (seed 000's KV cache pool), of f32 (the
//! exact path) or IEEE half (the fast path: half the memory and the bandwidth attention reads;
//! [`KvElem`]). Pages travel as f32 whatever the pool holds.
//!
//! A block holds `block_size` token rows and, when KV groups share the pool, one spare row: a
//! group's pages may lie a fixed number of blocks apart (a page of every group per logical
//! block), and without the spare row that stride is a multiple of the block size, so the blocks
//! a long-context layer reads map onto part of the cache sets only. Callers address tokens by
//! slot (`block * block_size + offset`); readers index rows ([`CpuKvCache::row`]).

/// An element type of the KV pool.
pub trait KvElem: Copy + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    /// Rounds an f32 to this type.
    fn from_f32(x: f32) -> Self;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
    /// `n` zeros from a zeroed allocation: the operating system hands over zero pages as they
    /// are first touched, so a pool costs memory and start-up time only for the blocks used.
    fn zeroed(n: usize) -> Vec<Self>;
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn zeroed(n: usize) -> Vec<Self> {
        vec![0.0; n]
    }
}

impl KvElem for half::f16 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn zeroed(n: usize) -> Vec<Self> {
        // Zero bits are +0.0; `vec![f16::ZERO; n]` would write every element (f16 is not one of
        // the types the standard library knows to allocate zeroed).
        use half::vec::HalfBitsVecExt;
        vec![0u16; n].reinterpret_into()
    }
}

/// K and V storage for every layer and block, of elements `E`.
pub struct CpuKvCache<E: KvElem = f32> {
    k: Vec<E>,
    v: Vec<E>,
    num_layers: usize,
    num_blocks: usize,
    block_size: usize,
    /// Rows a block takes in the pool: `block_size`, plus a spare one when padded.
    block_rows: usize,
    /// `kv_heads * head_dim`: floats per token per layer in K (and in V).
    token_width: usize,
    /// Host swap space: one buffer per host block holding all layers' K then V.
    host: Vec<Vec<E>>,
}

impl<E: KvElem> CpuKvCache<E> {
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
            k: E::zeroed(n),
            v: E::zeroed(n),
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
                out.extend(src.iter().flat_map(|x| x.to_f32().to_le_bytes()));
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
                *x = E::from_f32(floats.next().unwrap_or(0.0));
            }
            for x in &mut self.v[s..s + bf] {
                *x = E::from_f32(floats.next().unwrap_or(0.0));
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

    /// Bytes of one block's page over all layers, K and V, as pages travel: f32, no spare row.
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers * self.block_size * self.token_width * size_of::<f32>()
    }

    /// Bytes one block takes in this pool (spare row included).
    pub fn pool_bytes_per_block(&self) -> usize {
        Self::block_bytes(self.num_layers, self.block_rows, self.token_width)
    }

    /// Bytes one block takes in a pool of this shape (`rows` per block, spare row included),
    /// before one exists, to size it.
    pub fn block_bytes(num_layers: usize, rows: usize, token_width: usize) -> usize {
        2 * num_layers * rows * token_width * size_of::<E>()
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
        for (dst, src) in [(&mut self.k, k), (&mut self.v, v)] {
            for (d, &x) in dst[o..o + self.token_width].iter_mut().zip(src) {
                *d = E::from_f32(x);
            }
        }
    }

    /// A handle that writes tokens' K and V for `layer` from several threads at once (each
    /// into its own slot), for the forward pass's parallel row tasks.
    pub fn layer_writer(&mut self, layer: usize) -> LayerWriter<E> {
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
        let page = 4096 / size_of::<E>();
        for buf in [&mut self.k, &mut self.v] {
            let (ptr, n) = (super::pool::OutPtr(buf.as_mut_ptr()), buf.len());
            let per_task = (n / page).div_ceil(pool.num_threads() * 4).max(1) * page;
            pool.run(n.div_ceil(per_task), &|task| {
                for i in (task * per_task..((task + 1) * per_task).min(n)).step_by(page) {
                    // SAFETY: tasks cover disjoint ranges of the buffer; the value is unchanged.
                    unsafe { std::ptr::write_volatile(ptr.get().add(i), E::default()) };
                }
            });
        }
    }

    /// K of all KV heads of the token in `row` ([`CpuKvCache::row`]).
    #[inline]
    pub fn k(&self, layer: usize, row: usize) -> &[E] {
        let o = self.offset(layer, row);
        &self.k[o..o + self.token_width]
    }

    /// V of all KV heads of the token in `row` ([`CpuKvCache::row`]).
    #[inline]
    pub fn v(&self, layer: usize, row: usize) -> &[E] {
        let o = self.offset(layer, row);
        &self.v[o..o + self.token_width]
    }
}

/// The backend's pool: f32 on the exact path, IEEE half on the fast path.
pub enum KvPool {
    /// f32 elements.
    F32(CpuKvCache<f32>),
    /// IEEE half elements.
    F16(CpuKvCache<half::f16>),
}

/// `$body` with `$p` bound to the pool of either element type.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            $crate::backend::cpu::kv_cache::KvPool::F32($p) => $body,
            $crate::backend::cpu::kv_cache::KvPool::F16($p) => $body,
        }
    };
}
pub(crate) use on_pool;

impl KvPool {
    /// Allocates a zeroed pool of half (`half`) or f32 elements ([`CpuKvCache::new`]), with
    /// `host_blocks` host swap blocks.
    pub fn new(
        half: bool,
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        token_width: usize,
        pad: bool,
        host_blocks: usize,
    ) -> Self {
        let (l, n, b, w) = (num_layers, num_blocks, block_size, token_width);
        if half {
            KvPool::F16(CpuKvCache::new(l, n, b, w, pad).with_host_blocks(host_blocks))
        } else {
            KvPool::F32(CpuKvCache::new(l, n, b, w, pad).with_host_blocks(host_blocks))
        }
    }

    /// Bytes one block takes in a pool of this shape and element type ([`CpuKvCache::block_bytes`]).
    pub fn block_bytes(half: bool, num_layers: usize, rows: usize, token_width: usize) -> usize {
        if half {
            CpuKvCache::<half::f16>::block_bytes(num_layers, rows, token_width)
        } else {
            CpuKvCache::<f32>::block_bytes(num_layers, rows, token_width)
        }
    }

    /// Number of physical blocks.
    pub fn num_blocks(&self) -> usize {
        on_pool!(self, p => p.num_blocks())
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        on_pool!(self, p => p.block_size())
    }

    /// Number of slots.
    pub fn num_slots(&self) -> usize {
        on_pool!(self, p => p.num_slots())
    }

    /// Number of host swap blocks.
    pub fn num_host_blocks(&self) -> usize {
        on_pool!(self, p => p.num_host_blocks())
    }

    /// Bytes of a page as it travels (f32).
    pub fn bytes_per_block(&self) -> usize {
        on_pool!(self, p => p.bytes_per_block())
    }

    /// Bytes one block takes in the pool.
    pub fn pool_bytes_per_block(&self) -> usize {
        on_pool!(self, p => p.pool_bytes_per_block())
    }

    /// [`CpuKvCache::read_page`].
    pub fn read_page(&self, blk: usize, out: &mut Vec<u8>) {
        on_pool!(self, p => p.read_page(blk, out))
    }

    /// [`CpuKvCache::write_page`].
    pub fn write_page(&mut self, blk: usize, page: &[u8]) {
        on_pool!(self, p => p.write_page(blk, page))
    }

    /// [`CpuKvCache::copy_block`].
    pub fn copy_block(&mut self, src: usize, dst: usize) {
        on_pool!(self, p => p.copy_block(src, dst))
    }

    /// [`CpuKvCache::save_to_host`].
    pub fn save_to_host(&mut self, dev: usize, host: usize) {
        on_pool!(self, p => p.save_to_host(dev, host))
    }

    /// [`CpuKvCache::load_from_host`].
    pub fn load_from_host(&mut self, host: usize, dev: usize) {
        on_pool!(self, p => p.load_from_host(host, dev))
    }

    /// [`CpuKvCache::prefault`].
    pub fn prefault(&mut self, pool: &super::pool::ThreadPool) {
        on_pool!(self, p => p.prefault(pool))
    }

    /// A writer of `layer`'s rows ([`CpuKvCache::layer_writer`]).
    pub fn layer_writer(&mut self, layer: usize) -> AnyLayerWriter {
        match self {
            KvPool::F32(p) => AnyLayerWriter::F32(p.layer_writer(layer)),
            KvPool::F16(p) => AnyLayerWriter::F16(p.layer_writer(layer)),
        }
    }
}

/// A [`LayerWriter`] of either element type.
#[derive(Clone, Copy)]
pub enum AnyLayerWriter {
    /// Into an f32 pool.
    F32(LayerWriter<f32>),
    /// Into a half pool.
    F16(LayerWriter<half::f16>),
}

impl AnyLayerWriter {
    /// [`LayerWriter::write`].
    ///
    /// # Safety
    /// As [`LayerWriter::write`].
    pub unsafe fn write(&self, slot: usize, k: &[f32], v: &[f32]) {
        match self {
            AnyLayerWriter::F32(w) => w.write(slot, k, v),
            AnyLayerWriter::F16(w) => w.write(slot, k, v),
        }
    }
}

/// Writes one layer's K and V rows into the pool from several threads; see
/// [`CpuKvCache::layer_writer`]. It borrows nothing: the caller keeps the cache alive and
/// unread while writers are in use.
#[derive(Clone, Copy)]
pub struct LayerWriter<E: KvElem = f32> {
    k: *mut E,
    v: *mut E,
    num_slots: usize,
    block_size: usize,
    block_rows: usize,
    width: usize,
}

// SAFETY: writers write disjoint slots (see `write`).
unsafe impl<E: KvElem> Send for LayerWriter<E> {}
unsafe impl<E: KvElem> Sync for LayerWriter<E> {}

impl<E: KvElem> LayerWriter<E> {
    /// Writes one token's K and V into `slot`.
    ///
    /// # Safety
    /// The cache the writer came from must be alive and not otherwise accessed while writers
    /// run, and no two concurrent calls may name the same slot.
    pub unsafe fn write(&self, slot: usize, k: &[f32], v: &[f32]) {
        assert!(slot < self.num_slots && k.len() == self.width && v.len() == self.width);
        let row = slot / self.block_size * self.block_rows + slot % self.block_size;
        for (dst, src) in [(self.k, k), (self.v, v)] {
            let dst = std::slice::from_raw_parts_mut(dst.add(row * self.width), self.width);
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = E::from_f32(x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefault_keeps_zeros_and_parallel_writes_land_where_write_puts_them() {
        for pad in [false, true] {
            check_writes::<f32>(pad);
            check_writes::<half::f16>(pad);
        }
    }

    /// A pool large enough to come from fresh pages reads +0.0 everywhere before prefaulting.
    #[test]
    fn a_pool_starts_as_positive_zeros() {
        let a = CpuKvCache::<half::f16>::new(2, 64, 16, 512, true);
        assert_eq!(a.k.len(), 2 * 64 * 17 * 512);
        assert!(a.k.iter().chain(&a.v).all(|x| x.to_bits() == 0));
        let b = CpuKvCache::<f32>::new(2, 64, 16, 512, false);
        assert!(b.k.iter().chain(&b.v).all(|x| x.to_bits() == 0));
    }

    fn check_writes<E: KvElem>(pad: bool) {
        let (layers, blocks, bs, width) = (3, 5, 4, 6);
        let pool = crate::backend::cpu::pool::ThreadPool::new(3);
        let mut a = CpuKvCache::<E>::new(layers, blocks, bs, width, pad);
        a.prefault(&pool);
        assert!(a.k.iter().chain(a.v.iter()).all(|&x| x == E::default()));
        let mut b = CpuKvCache::<E>::new(layers, blocks, bs, width, pad);
        let row = |l: usize, s: usize, kind: f32| -> Vec<f32> {
            // Distinct per (layer, slot, column) and exact in half (below 512, in quarters).
            (0..width).map(|i| kind + (l * 160 + s * 6 + i) as f32).collect()
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
        // Values that both element types hold exactly.
        let f32s = |r: &[E]| r.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
        assert_eq!(f32s(a.k(2, a.row(9))), row(2, 9, 0.25));
        assert_eq!(f32s(a.v(1, a.row(0))), row(1, 0, 0.5));
        // A page holds a block's token rows only, whatever the padding; copies move them.
        let mut page = Vec::new();
        a.read_page(2, &mut page);
        assert_eq!(page.len(), a.bytes_per_block());
        // Pages travel as f32: a page read from one element type loads into the other.
        let floats: Vec<f32> =
            page.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(&floats[width..2 * width], &row(0, 2 * bs + 1, 0.25)[..]);
        a.copy_block(2, 4);
        let mut copied = Vec::new();
        a.read_page(4, &mut copied);
        assert_eq!(page, copied);
        assert_eq!(f32s(a.k(0, a.row(4 * bs + 1))), row(0, 2 * bs + 1, 0.25));
    }
}
