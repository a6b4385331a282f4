//! KV pages of the CUDA backend leaving and entering the pool: block-pair checks, swap spans,
//! and the page order (the transfer format's `[offset][kv_head][hd]` per layer's K and V, the
//! pool's `[kv_head][offset][hd]` within a block).

use tandem_engine::backend::BackendError;

use super::CudaBackend;
use crate::CudaError;

impl CudaBackend {
    /// Where the KV pool lies and how its blocks are laid out, for moving pages between GPUs
    /// ([`crate::nccl::PageLink`]).
    pub fn pool_view(&self) -> crate::nccl::PoolView {
        crate::nccl::PoolView {
            base: crate::device::ptr(&self.kv),
            parts: 2 * self.page_layers(),
            num_blocks: self.num_blocks,
            block_elems: self.block_elems(),
        }
    }

    /// This backend's KV pool as an endpoint of the device transport (KV pages to and from
    /// another GPU's pool over NCCL). Valid while the backend lives.
    pub fn device_pool(&self) -> crate::nccl::DevicePool {
        crate::nccl::DevicePool::new(&self.gpu, self.pool_view())
    }

    pub(super) fn check_pairs(
        &self,
        pairs: &[(u32, u32)],
        src: usize,
        dst: usize,
    ) -> Result<(), BackendError> {
        match pairs.iter().find(|(s, d)| *s as usize >= src || *d as usize >= dst) {
            Some(p) => Err(BackendError::InvalidBatch(format!("block pair {p:?} out of range"))),
            None => Ok(()),
        }
    }

    /// (device offset, host offset) of every layer's K and V part of each `(device block, host
    /// block)` pair, in elements.
    pub(super) fn swap_spans(
        &self,
        pairs: impl Iterator<Item = (u32, u32)>,
    ) -> Vec<(usize, usize)> {
        let (e, parts) = (self.block_elems(), 2 * self.page_layers());
        pairs
            .flat_map(|(d, h)| (0..parts).map(move |i| (d as usize, h as usize, i)))
            .map(|(d, h, i)| (self.kv_offset(i / 2, i % 2) + d * e, (h * parts + i) * e))
            .collect()
    }

    /// Elements of one block's rows within one layer's K or V cache.
    pub(super) fn block_elems(&self) -> usize {
        self.block_size * self.cfg.kv_size()
    }

    /// The block's 16-bit page as stored: for each layer, K then V, each `[kv_head][offset][hd]`.
    pub(super) fn read_page_bits(&self, block: usize) -> Result<Vec<u16>, CudaError> {
        crate::nccl::read_page(&self.gpu, &self.kv, &self.pool_view(), block)
    }

    /// Writes a page in the stored order (as [`CudaBackend::read_page_bits`] returns it).
    pub(super) fn write_page_bits(&mut self, block: usize, page: &[u16]) -> Result<(), CudaError> {
        let e = self.block_elems();
        for (i, chunk) in page.chunks_exact(e).enumerate() {
            let off = self.kv_offset(i / 2, i % 2) + block * e;
            let mut dst = self.kv.slice_mut(off..off + e);
            self.gpu.stream.memcpy_htod(chunk, &mut dst).map_err(CudaError::from)?;
        }
        self.gpu.sync()
    }

    /// Reorders one layer-part of a page between the device's `[kv_head][offset][hd]` and the
    /// transfer format's `[offset][kv_head][hd]` (`to_wire` picks the direction).
    pub(super) fn reorder(&self, part: &[u16], to_wire: bool) -> Vec<u16> {
        let (bs, nkv, hd) = (self.block_size, self.cfg.num_kv_heads, self.cfg.head_dim);
        let mut out = vec![0u16; part.len()];
        for off in 0..bs {
            for h in 0..nkv {
                let dev = (h * bs + off) * hd;
                let wire = (off * nkv + h) * hd;
                let (src, dst) = if to_wire { (dev, wire) } else { (wire, dev) };
                out[dst..dst + hd].copy_from_slice(&part[src..src + hd]);
            }
        }
        out
    }
}
