//! KV pages between two GPUs over NCCL: the GPU path of `kv-transfer`.
//!
//! A [`PageLink`] joins this process's GPU to one peer (a two-rank communicator created from an
//! NCCL unique id that the peers exchange out of band, as the control plane does). Pages leave
//! the sender's pool through a gather kernel into one of two staging buffers and cross in chunks
//! of many pages per NCCL call; the receiver scatters each chunk into its own blocks. Gathers and
//! scatters run on the backend's stream, NCCL on a stream of its own, so chunk `k + 1` is
//! gathered (or chunk `k − 1` scattered) while chunk `k` is on the wire.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig};
use cudarc::nccl::{Comm, Id};

use crate::device::{ptr, Gpu};
use crate::CudaError;

impl From<cudarc::nccl::result::NcclError> for CudaError {
    fn from(e: cudarc::nccl::result::NcclError) -> CudaError {
        CudaError::Driver(format!("NCCL: {:?}", e.0))
    }
}

/// Where a KV pool lies on the device and how its blocks are laid out: `parts` layer-parts (K and
/// V of each layer), each `num_blocks` blocks of `block_elems` 16-bit values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolView {
    /// Device address of the pool.
    pub base: u64,
    /// Layer-parts (2 × layers).
    pub parts: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// 16-bit values of one block within one part.
    pub block_elems: usize,
}

impl PoolView {
    /// Bytes of one page (one block across every part).
    pub fn page_bytes(&self) -> usize {
        2 * self.parts * self.block_elems
    }
}

/// One page of the pool `pool` (laid out as `view` says) as stored, `parts` chunks of
/// `block_elems`, read back to the host.
pub fn read_page(g: &Gpu, pool: &CudaSlice<u16>, view: &PoolView, block: usize) -> Result<Vec<u16>, CudaError> {
    let mut out = vec![0u16; view.parts * view.block_elems];
    for (p, chunk) in out.chunks_exact_mut(view.block_elems).enumerate() {
        let off = (p * view.num_blocks + block) * view.block_elems;
        g.stream.memcpy_dtoh(&pool.slice(off..off + view.block_elems), chunk)?;
    }
    g.sync()?;
    Ok(out)
}

/// Whether NCCL can be loaded on this machine.
pub fn nccl_present() -> bool {
    // SAFETY: only probes for the shared library.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// A new NCCL unique id (rank 0 makes it; the peer receives its 128 bytes).
pub fn new_id() -> Result<Id, CudaError> {
    Ok(Id::new()?)
}

/// An id received from the peer.
pub fn id_from_bytes(bytes: &[u8; 128]) -> Id {
    Id::uninit(bytes.map(|b| b as core::ffi::c_char))
}

/// The 128 bytes of an id, to send to the peer.
pub fn id_bytes(id: &Id) -> [u8; 128] {
    id.internal().map(|c| c as u8)
}

/// The chunks `(first page, pages)` a transfer of `n` pages goes in: full chunks of `chunk`
/// pages, the first and last ones ramped (a quarter, then a half) so that the first gather and
/// the last scatter, which nothing overlaps, are short.
pub fn chunk_plan(n: usize, chunk: usize) -> Vec<(usize, usize)> {
    let chunk = chunk.max(1);
    let (quarter, half) = (chunk.div_ceil(4), chunk.div_ceil(2));
    // Ramps only where at least two full chunks remain between them.
    let ramp: &[usize] = if n > 2 * (quarter + half + chunk) { &[quarter, half] } else { &[] };
    let body = n - 2 * ramp.iter().sum::<usize>();
    let full = (0..body.div_ceil(chunk)).map(|i| (body - i * chunk).min(chunk));
    let sizes = ramp.iter().copied().chain(full).chain(ramp.iter().rev().copied());
    sizes
        .scan(0, |first, s| {
            let c = (*first, s);
            *first += s;
            Some(c)
        })
        .collect()
}

/// One end of a GPU-to-GPU page link.
pub struct PageLink {
    comm: Comm,
    net: Arc<CudaStream>,
    peer: i32,
    staging: [CudaSlice<u8>; 2],
    blocks: CudaSlice<i32>,
    chunk_pages: usize,
    page_bytes: usize,
    copy_ctas: usize,
}

impl PageLink {
    /// Joins the two-rank communicator of `id` as `rank` (0 or 1) on `g`'s device, with staging
    /// for `chunk_pages` pages of `page_bytes` (twice) and room for `max_pages` block ids per
    /// transfer. Both ranks must call this at the same time.
    pub fn connect(g: &Gpu, rank: usize, id: Id, page_bytes: usize, chunk_pages: usize, max_pages: usize) -> Result<PageLink, CudaError> {
        if rank > 1 || page_bytes % 16 != 0 || chunk_pages == 0 {
            return Err(CudaError::Unsupported(format!("page link rank {rank}, page of {page_bytes} bytes, {chunk_pages} pages per chunk")));
        }
        g.bind()?;
        // NCCL's stream first in line, so its kernels are not queued behind a gather.
        let net = g.ctx.new_stream_with_priority(-5)?;
        let comm = Comm::from_rank(net.clone(), rank, 2, id)?;
        let staging = [g.zeros::<u8>(chunk_pages * page_bytes)?, g.zeros::<u8>(chunk_pages * page_bytes)?];
        let blocks = g.zeros::<i32>(max_pages)?;
        Ok(PageLink { comm, net, peer: 1 - rank as i32, staging, blocks, chunk_pages, page_bytes, copy_ctas: 64 })
    }

    /// CTAs the gather and scatter kernels use (0: one per page piece, every SM).
    pub fn set_copy_ctas(&mut self, n: usize) {
        self.copy_ctas = n;
    }

    fn check(&self, pool: &PoolView, blocks: &[u32]) -> Result<(), CudaError> {
        if pool.page_bytes() != self.page_bytes {
            return Err(CudaError::Unsupported(format!("pool pages of {} bytes on a link of {}", pool.page_bytes(), self.page_bytes)));
        }
        if blocks.len() > self.blocks.len() {
            return Err(CudaError::Unsupported(format!("{} pages in one transfer (at most {})", blocks.len(), self.blocks.len())));
        }
        if let Some(b) = blocks.iter().find(|&&b| b as usize >= pool.num_blocks) {
            return Err(CudaError::Unsupported(format!("block {b} outside a pool of {}", pool.num_blocks)));
        }
        Ok(())
    }

    /// Launches `kernel` (gather or scatter) over pages `first..first + n` of the uploaded block
    /// list, between the pool and staging buffer `buf`.
    fn copy(&self, g: &Gpu, gather: bool, pool: &PoolView, first: usize, n: usize, buf: usize) -> Result<(), CudaError> {
        let chunk = (2 * pool.block_elems / 16) as i32;
        let parts = pool.parts as i32;
        let stride = (2 * pool.num_blocks * pool.block_elems / 16) as i64;
        let blocks = ptr(&self.blocks) + 4 * first as u64;
        let staging = ptr(&self.staging[buf]);
        let pieces = n * pool.parts;
        let ctas = if self.copy_ctas == 0 { pieces } else { pieces.min(self.copy_ctas) };
        let cfg = LaunchConfig { grid_dim: (ctas as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (f, a, c) = if gather { (&g.k.gather_pages, pool.base, staging) } else { (&g.k.scatter_pages, staging, pool.base) };
        let pi = pieces as i32;
        // SAFETY: gather/scatter_pages(src, blocks, dst, pieces, parts, part_stride, chunk) over
        // n pages whose block ids were checked against the pool; the staging buffer holds
        // chunk_pages ≥ n.
        unsafe { g.launch(f, cfg, &[&a, &blocks, &c, &pi, &parts, &stride, &chunk]) }
    }

    /// Sends the pages of `blocks` (in order) to the peer; returns when they have left.
    pub fn send(&mut self, g: &Gpu, pool: &PoolView, blocks: &[u32]) -> Result<(), CudaError> {
        self.check(pool, blocks)?;
        let ids: Vec<i32> = blocks.iter().map(|&b| b as i32).collect();
        g.write(&mut self.blocks, &ids)?;
        let mut sent: [Option<cudarc::driver::CudaEvent>; 2] = [None, None];
        for (c, (first, n)) in chunk_plan(blocks.len(), self.chunk_pages).into_iter().enumerate() {
            let buf = c % 2;
            if let Some(e) = &sent[buf] {
                g.stream.wait(e)?; // the buffer's previous chunk has left
            }
            self.copy(g, true, pool, first, n, buf)?;
            self.net.wait(&g.stream.record_event(None)?)?;
            self.comm.send(&self.staging[buf].slice(..n * self.page_bytes), self.peer)?;
            sent[buf] = Some(self.net.record_event(None)?);
        }
        self.net.synchronize()?;
        Ok(())
    }

    /// Receives pages from the peer into `blocks` (in the order the peer sent them); returns
    /// when they are in the pool.
    pub fn recv(&mut self, g: &Gpu, pool: &PoolView, blocks: &[u32]) -> Result<(), CudaError> {
        self.check(pool, blocks)?;
        let ids: Vec<i32> = blocks.iter().map(|&b| b as i32).collect();
        g.write(&mut self.blocks, &ids)?;
        let mut scattered: [Option<cudarc::driver::CudaEvent>; 2] = [None, None];
        for (c, (first, n)) in chunk_plan(blocks.len(), self.chunk_pages).into_iter().enumerate() {
            let buf = c % 2;
            if let Some(e) = &scattered[buf] {
                self.net.wait(e)?; // the buffer's previous chunk is in the pool
            }
            let bytes = n * self.page_bytes;
            let mut dst = self.staging[buf].slice_mut(..bytes);
            self.comm.recv(&mut dst, self.peer)?;
            g.stream.wait(&self.net.record_event(None)?)?;
            self.copy(g, false, pool, first, n, buf)?;
            scattered[buf] = Some(g.stream.record_event(None)?);
        }
        g.sync()
    }

    /// Sends `bytes` of `src` in one NCCL call (the raw baseline).
    pub fn send_raw(&self, src: &CudaSlice<u8>, bytes: usize) -> Result<(), CudaError> {
        self.comm.send(&src.slice(..bytes), self.peer)?;
        Ok(self.net.synchronize()?)
    }

    /// Receives `bytes` into `dst` in one NCCL call (the raw baseline).
    pub fn recv_raw(&self, dst: &mut CudaSlice<u8>, bytes: usize) -> Result<(), CudaError> {
        let mut d = dst.slice_mut(..bytes);
        self.comm.recv(&mut d, self.peer)?;
        Ok(self.net.synchronize()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_page_once_and_ramp_at_both_ends() {
        for n in [0, 1, 5, 31, 32, 33, 64, 65, 100, 256, 4096] {
            let plan = chunk_plan(n, 32);
            let mut next = 0;
            for &(first, size) in &plan {
                assert_eq!(first, next, "n = {n}");
                assert!(size >= 1 && size <= 32);
                next += size;
            }
            assert_eq!(next, n);
        }
        let sizes: Vec<usize> = chunk_plan(256, 32).iter().map(|c| c.1).collect();
        assert_eq!(&sizes[..2], &[8, 16]);
        assert_eq!(&sizes[sizes.len() - 2..], &[16, 8]);
        assert_eq!(chunk_plan(40, 32).iter().map(|c| c.1).collect::<Vec<_>>(), vec![32, 8]);
    }

    #[test]
    fn ids_round_trip_through_bytes() {
        let mut raw = [0u8; 128];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = (i * 37 % 256) as u8;
        }
        assert_eq!(id_bytes(&id_from_bytes(&raw)), raw);
    }
}
