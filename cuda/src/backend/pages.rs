//! KV pages of the CUDA backend leaving and entering the pool: copies within it, swap to and
//! from the host, pages read and written in the transfer format, block-pair checks, swap spans,
//! and the page order (the transfer format's `[offset][kv_head][hd]` per layer's K and V, the
//! pool's `[kv_head][offset][hd]` within a block).

use cudarc::driver::sys as dsys;
use tandem_engine::backend::{BackendError, ModelBackend};

use super::{dev, CudaBackend};
use crate::device::ptr;
use crate::CudaError;

impl CudaBackend {
    /// Where the KV pool lies and how its blocks are laid out, for moving pages between GPUs
    /// ([`crate::nccl::PageLink`]).
    pub fn pool_view(&self) -> crate::nccl::PoolView {
        crate::nccl::PoolView {
            base: ptr(&self.kv),
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

    /// Copies whole pages within the pool (copy-on-write of a shared block), queued on the
    /// stream: the next pass, and any read of a page, come after them in stream order, so
    /// nothing waits for the device here (a wait would hold the next launch until the pass in
    /// flight is done).
    pub(super) fn copy_pages(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.check_pairs(pairs, self.num_blocks, self.num_blocks)?;
        self.gpu.bind().map_err(dev)?;
        let e = self.block_elems();
        for &(s, d) in pairs {
            for i in 0..2 * self.page_layers() {
                let base = self.kv_offset(i / 2, i % 2);
                let (so, d_o) = (base + s as usize * e, base + d as usize * e);
                let bytes = 2 * e;
                let (sp, dp) = (ptr(&self.kv) + 2 * so as u64, ptr(&self.kv) + 2 * d_o as u64);
                // SAFETY: both ranges lie inside the KV allocation (pairs checked) and differ.
                let r = unsafe {
                    dsys::cuMemcpyDtoDAsync_v2(dp, sp, bytes, self.gpu.stream.cu_stream())
                };
                if r != dsys::CUresult::CUDA_SUCCESS {
                    return Err(BackendError::Device(format!("block copy: {r:?}")));
                }
            }
        }
        Ok(())
    }

    /// Copies pages to the host swap space, `(device block, host block)` pairs.
    pub(super) fn swap_pages_out(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        // Every step asks, mostly for nothing: no pages, no wait for the stream (the host reads
        // what a swap moved only once it has waited), which would hold the next pass's launch
        // until the one in flight is done.
        if pairs.is_empty() {
            return Ok(());
        }
        self.check_pairs(pairs, self.num_blocks, self.num_host_blocks)?;
        self.gpu.bind().map_err(dev)?;
        let spans = self.swap_spans(pairs.iter().map(|&(d, h)| (d, h)));
        let e = self.block_elems();
        let Some(host) = self.host.as_mut() else { return Ok(()) };
        let host = host.as_mut_slice().map_err(|e| dev(e.into()))?;
        for (d, h) in spans {
            self.gpu
                .stream
                .memcpy_dtoh(&self.kv.slice(d..d + e), &mut host[h..h + e])
                .map_err(|e| dev(e.into()))?;
        }
        self.gpu.sync().map_err(dev)
    }

    /// Copies pages back from the host swap space, `(host block, device block)` pairs.
    pub(super) fn swap_pages_in(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        if pairs.is_empty() {
            return Ok(());
        }
        self.check_pairs(pairs, self.num_host_blocks, self.num_blocks)?;
        self.gpu.bind().map_err(dev)?;
        let spans = self.swap_spans(pairs.iter().map(|&(h, d)| (d, h)));
        let e = self.block_elems();
        let Some(host) = self.host.as_ref() else { return Ok(()) };
        let host = host.as_slice().map_err(|e| dev(e.into()))?;
        for (d, h) in spans {
            let mut view = self.kv.slice_mut(d..d + e);
            self.gpu.stream.memcpy_htod(&host[h..h + e], &mut view).map_err(|e| dev(e.into()))?;
        }
        self.gpu.sync().map_err(dev)
    }

    /// One page in the transfer format: f32, each page layer's K then V, `[offset][kv_head][hd]`.
    pub(super) fn read_page(&self, block: u32) -> Result<Vec<u8>, BackendError> {
        if block as usize >= self.num_blocks {
            return Err(BackendError::InvalidBatch(format!(
                "block {block} outside the pool of {}",
                self.num_blocks
            )));
        }
        let bits = self.read_page_bits(block as usize).map_err(dev)?;
        let bits: Vec<u16> =
            bits.chunks_exact(self.block_elems()).flat_map(|p| self.reorder(p, true)).collect();
        let d = self.gpu.dtype;
        Ok(bits.iter().flat_map(|&b| d.to_f32(b).to_le_bytes()).collect())
    }

    /// Writes a page given in the transfer format ([`CudaBackend::read_page`]).
    pub(super) fn write_page(&mut self, block: u32, page: &[u8]) -> Result<(), BackendError> {
        if block as usize >= self.num_blocks {
            return Err(BackendError::InvalidBatch(format!(
                "block {block} outside the pool of {}",
                self.num_blocks
            )));
        }
        let want = self.kv_cache_spec().bytes_per_block;
        if page.len() != want {
            return Err(BackendError::InvalidBatch(format!(
                "page of {} bytes, blocks hold {want}",
                page.len()
            )));
        }
        let d = self.gpu.dtype;
        let bits: Vec<u16> = page
            .chunks_exact(4)
            .map(|c| d.from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        let bits: Vec<u16> =
            bits.chunks_exact(self.block_elems()).flat_map(|p| self.reorder(p, false)).collect();
        self.write_page_bits(block as usize, &bits).map_err(dev)
    }
}
