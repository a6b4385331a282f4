//! KV pages between two GPUs over NCCL: the device transport of `kv-transfer`
//! ([`tandem_kv_transfer::device`]).
//!
//! A [`PageLink`] joins this process's GPU to one peer (a two-rank communicator created from an
//! NCCL unique id that the peers exchange over the control plane). Pages leave the sender's pool
//! through a gather kernel into one of a few staging buffers and cross in chunks of many pages per
//! NCCL call; the receiver scatters each chunk into its own blocks. Gathers and scatters run on a
//! copy stream of the link, NCCL on a high-priority stream of its own, so chunk `k + 1` is
//! gathered (or chunk `k − 1` scattered) while chunk `k` is on the wire, and the backend's own
//! stream never waits for a peer. The copy kernels add up each page's checksum as they move it.
//!
//! The host waits for a link's work by polling events against a deadline; a link that misses
//! one aborts its communicator (which ends the NCCL kernels still waiting) and drains its
//! streams before it reports the error, so no kernel of it touches the pool afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nccl::{Comm, Id};
use tandem_kv_transfer::device::{
    compare_checksums, DeviceKv, DeviceKvInfo, DeviceLink, LinkRole, Received, SendOptions,
    TransferHeader, HEADER_BYTES,
};
use tandem_kv_transfer::TransferError;

use crate::device::{ptr, Dtype, Gpu};
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
pub fn read_page(
    g: &Gpu,
    pool: &CudaSlice<u16>,
    view: &PoolView,
    block: usize,
) -> Result<Vec<u16>, CudaError> {
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

/// A KV pool as the device transport sees it: where it lies, the copy kernels, and the stream
/// of the backend that writes it. Cheap to clone; shared with link threads.
#[derive(Clone)]
pub struct DevicePool {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    gather: CudaFunction,
    scatter: CudaFunction,
    view: PoolView,
    dtype: Dtype,
    chunk_pages: usize,
    stages: usize,
}

impl DevicePool {
    /// The pool `view` of `g`'s device (the backend's stream is `g.stream`).
    pub fn new(g: &Gpu, view: PoolView) -> DevicePool {
        DevicePool {
            ctx: g.ctx.clone(),
            compute: g.stream.clone(),
            gather: g.k.gather_pages.clone(),
            scatter: g.k.scatter_pages.clone(),
            view,
            dtype: g.dtype,
            chunk_pages: 64,
            stages: 3,
        }
    }

    /// Where the pool lies.
    pub fn view(&self) -> &PoolView {
        &self.view
    }
}

fn transfer_err(e: CudaError) -> TransferError {
    TransferError::Protocol(format!("device transport: {e}"))
}

impl DeviceKv for DevicePool {
    fn info(&self) -> DeviceKvInfo {
        DeviceKvInfo {
            page_bytes: self.view.page_bytes() as u64,
            dtype: self.dtype.name().to_string(),
        }
    }

    fn new_link_id(&self) -> Result<[u8; 128], TransferError> {
        Ok(id_bytes(&new_id().map_err(transfer_err)?))
    }

    fn connect(
        &self,
        role: LinkRole,
        id: &[u8; 128],
    ) -> Result<Box<dyn DeviceLink>, TransferError> {
        let rank = if role == LinkRole::Sender { 0 } else { 1 };
        let link = PageLink::connect(
            self,
            rank,
            id_from_bytes(id),
            self.chunk_pages,
            self.stages,
            self.view.num_blocks,
        )
        .map_err(transfer_err)?;
        Ok(Box::new(link))
    }
}

/// How often a waiting host thread looks at a link's events.
const POLL: Duration = Duration::from_micros(50);

/// One end of a GPU-to-GPU page link.
pub struct PageLink {
    /// Dropped (aborted) first, before the buffers its kernels use.
    comm: Option<Comm>,
    pool: DevicePool,
    net: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    peer: i32,
    staging: Vec<CudaSlice<u8>>,
    blocks: CudaSlice<i32>,
    sums: CudaSlice<u32>,
    peer_sums: CudaSlice<u32>,
    header: CudaSlice<u8>,
    /// The posted receive of the next transfer's header.
    header_posted: Option<CudaEvent>,
    chunk_pages: usize,
    page_bytes: usize,
    copy_ctas: usize,
    /// Why the link is unusable.
    dead: Option<String>,
}

impl PageLink {
    /// Joins the two-rank communicator of `id` as `rank` (0 sends, 1 receives) on `pool`'s
    /// device, with `stages` staging buffers of `chunk_pages` pages and room for `max_pages` pages per
    /// transfer. Both ranks must call this at the same time; it returns when both have joined.
    pub fn connect(
        pool: &DevicePool,
        rank: usize,
        id: Id,
        chunk_pages: usize,
        stages: usize,
        max_pages: usize,
    ) -> Result<PageLink, CudaError> {
        let page_bytes = pool.view.page_bytes();
        if rank > 1 || !page_bytes.is_multiple_of(16) || chunk_pages == 0 || stages < 2 {
            return Err(CudaError::Unsupported(format!(
                "page link rank {rank}, page of {page_bytes} bytes, {chunk_pages} pages per chunk"
            )));
        }
        pool.ctx.bind_to_thread()?;
        // NCCL's stream first in line, so its kernels are not queued behind a gather.
        let net = pool.ctx.new_stream_with_priority(-5)?;
        let copy = pool.ctx.new_stream()?;
        let comm = Comm::from_rank(net.clone(), rank, 2, id)?;
        let max_pages = max_pages.max(1);
        let staging = (0..stages)
            .map(|_| copy.alloc_zeros::<u8>(chunk_pages * page_bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let link = PageLink {
            blocks: copy.alloc_zeros::<i32>(max_pages)?,
            sums: copy.alloc_zeros::<u32>(max_pages)?,
            peer_sums: copy.alloc_zeros::<u32>(max_pages)?,
            header: copy.alloc_zeros::<u8>(HEADER_BYTES)?,
            comm: Some(comm),
            pool: pool.clone(),
            net,
            copy,
            peer: 1 - rank as i32,
            staging,
            header_posted: None,
            chunk_pages,
            page_bytes,
            copy_ctas: 96,
            dead: None,
        };
        link.copy.synchronize()?;
        Ok(link)
    }

    /// CTAs the gather and scatter kernels use (0: one per page piece, every SM).
    pub fn set_copy_ctas(&mut self, n: usize) {
        self.copy_ctas = n;
    }

    fn check(&self, n: usize) -> Result<(), CudaError> {
        if n > self.blocks.len() {
            return Err(CudaError::Unsupported(format!(
                "{n} pages in one transfer (at most {})",
                self.blocks.len()
            )));
        }
        Ok(())
    }

    /// Uploads a transfer's block ids (negative: receive into nowhere) and zeroes its checksums,
    /// once the backend's stream has finished what it queued so far.
    fn prepare(&mut self, ids: &[i32]) -> Result<(), CudaError> {
        self.check(ids.len())?;
        if let Some(b) = ids.iter().find(|&&b| b >= self.pool.view.num_blocks as i32) {
            return Err(CudaError::Unsupported(format!(
                "block {b} outside a pool of {}",
                self.pool.view.num_blocks
            )));
        }
        self.pool.ctx.bind_to_thread()?;
        self.copy.wait(&self.pool.compute.record_event(None)?)?;
        if !ids.is_empty() {
            self.copy.memcpy_htod(ids, &mut self.blocks.slice_mut(..ids.len()))?;
            self.copy.memset_zeros(&mut self.sums.slice_mut(..ids.len()))?;
        }
        Ok(())
    }

    /// Launches the gather (or scatter) of pages `first..first + n` of the uploaded block list
    /// between the pool and staging buffer `buf`, on the copy stream.
    fn copy_kernel(
        &self,
        gather: bool,
        first: usize,
        n: usize,
        buf: usize,
    ) -> Result<(), CudaError> {
        let v = &self.pool.view;
        let chunk = (2 * v.block_elems / 16) as i32;
        let parts = v.parts as i32;
        let stride = (2 * v.num_blocks * v.block_elems / 16) as i64;
        let blocks = ptr(&self.blocks) + 4 * first as u64;
        let sums = ptr(&self.sums) + 4 * first as u64;
        let staging = ptr(&self.staging[buf]);
        let pieces = (n * v.parts) as i32;
        let ctas =
            if self.copy_ctas == 0 { n * v.parts } else { (n * v.parts).min(self.copy_ctas) };
        let cfg = LaunchConfig {
            grid_dim: (ctas as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (f, a, c) = if gather {
            (&self.pool.gather, v.base, staging)
        } else {
            (&self.pool.scatter, staging, v.base)
        };
        let mut b = self.copy.launch_builder(f);
        b.arg(&a).arg(&blocks).arg(&c).arg(&pieces).arg(&parts).arg(&stride).arg(&chunk).arg(&sums);
        // SAFETY: gather/scatter_pages(src, blocks, dst, pieces, parts, part_stride, chunk, sums)
        // over n pages whose block ids were checked against the pool (negative ones are not
        // stored); the staging buffer holds chunk_pages ≥ n pages, `sums` has room for them.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Queues the gather and send of the uploaded pages (`n` of them); `stall_after` stops
    /// queueing (fault injection) once that many pages are on their way.
    fn queue_send(&mut self, n: usize, stall_after: Option<u32>) -> Result<(), CudaError> {
        let mut sent: Vec<Option<CudaEvent>> = (0..self.staging.len()).map(|_| None).collect();
        for (c, (first, k)) in chunk_plan(n, self.chunk_pages).into_iter().enumerate() {
            if stall_after.is_some_and(|s| first >= s as usize) {
                tracing::warn!(pages = first, "fault injection: the page link stalls");
                std::thread::sleep(Duration::from_secs(3600));
            }
            let buf = c % self.staging.len();
            if let Some(e) = &sent[buf] {
                self.copy.wait(e)?; // the buffer's previous chunk has left
            }
            self.copy_kernel(true, first, k, buf)?;
            self.net.wait(&self.copy.record_event(None)?)?;
            live(&self.comm)?.send(&self.staging[buf].slice(..k * self.page_bytes), self.peer)?;
            sent[buf] = Some(self.net.record_event(None)?);
        }
        Ok(())
    }

    /// Queues the receive and scatter of `n` pages into the uploaded block list.
    fn queue_recv(&mut self, n: usize) -> Result<(), CudaError> {
        let mut scattered: Vec<Option<CudaEvent>> = (0..self.staging.len()).map(|_| None).collect();
        for (c, (first, k)) in chunk_plan(n, self.chunk_pages).into_iter().enumerate() {
            let buf = c % self.staging.len();
            if let Some(e) = &scattered[buf] {
                self.net.wait(e)?; // the buffer's previous chunk is in the pool
            }
            live(&self.comm)?
                .recv(&mut self.staging[buf].slice_mut(..k * self.page_bytes), self.peer)?;
            self.copy.wait(&self.net.record_event(None)?)?;
            self.copy_kernel(false, first, k, buf)?;
            scattered[buf] = Some(self.copy.record_event(None)?);
        }
        Ok(())
    }

    /// Waits until `events` are complete, `deadline` passes (an error), or `keep_waiting` says
    /// to stop (`Ok(false)`).
    fn wait(
        &self,
        events: &[&CudaEvent],
        deadline: Option<Instant>,
        keep_waiting: &dyn Fn() -> bool,
        what: &str,
    ) -> Result<bool, CudaError> {
        loop {
            let mut done = true;
            for e in events {
                done &= e.try_is_complete()?;
            }
            if done {
                return Ok(true);
            }
            if !keep_waiting() {
                return Ok(false);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(CudaError::Stalled(format!("no {what} within the transfer timeout")));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Closes the link after an error: aborts the communicator (its waiting kernels end) and
    /// waits for both streams, so nothing of this link touches the pool any more.
    fn fail(&mut self, e: CudaError) -> CudaError {
        abort(self.comm.take());
        let _ = self.net.synchronize();
        let _ = self.copy.synchronize();
        self.header_posted = None;
        let msg = e.to_string();
        tracing::warn!(error = %msg, "page link closed");
        self.dead.get_or_insert(msg);
        e
    }

    /// Sends the pages of `blocks` (in order) to the peer and returns when they have left: the
    /// bare page stream, without header or checksums (the transfer benchmark's paged path).
    pub fn send_blocks(&mut self, blocks: &[u32]) -> Result<(), CudaError> {
        self.prepare(&block_ids(blocks))?;
        self.queue_send(blocks.len(), None)?;
        Ok(self.net.synchronize()?)
    }

    /// Receives pages from the peer into `blocks` (the peer's [`PageLink::send_blocks`]);
    /// returns when they are in the pool.
    pub fn recv_blocks(&mut self, blocks: &[u32]) -> Result<(), CudaError> {
        self.prepare(&block_ids(blocks))?;
        self.queue_recv(blocks.len())?;
        self.net.synchronize()?;
        Ok(self.copy.synchronize()?)
    }

    /// The checksums of the last transfer's pages as this side computed them.
    pub fn checksums(&self, n: usize) -> Result<Vec<u32>, CudaError> {
        let mut out = vec![0u32; n];
        if n > 0 {
            self.copy.memcpy_dtoh(&self.sums.slice(..n), &mut out)?;
        }
        self.copy.synchronize()?;
        Ok(out)
    }

    /// Sends `bytes` of `src` in one NCCL call (the raw baseline).
    pub fn send_raw(&self, src: &CudaSlice<u8>, bytes: usize) -> Result<(), CudaError> {
        live(&self.comm)?.send(&src.slice(..bytes), self.peer)?;
        Ok(self.net.synchronize()?)
    }

    /// Receives `bytes` into `dst` in one NCCL call (the raw baseline).
    pub fn recv_raw(&self, dst: &mut CudaSlice<u8>, bytes: usize) -> Result<(), CudaError> {
        let mut d = dst.slice_mut(..bytes);
        live(&self.comm)?.recv(&mut d, self.peer)?;
        Ok(self.net.synchronize()?)
    }

    fn send_transfer(
        &mut self,
        h: &TransferHeader,
        blocks: &[u32],
        opts: SendOptions,
    ) -> Result<u64, CudaError> {
        let deadline = Instant::now() + opts.timeout;
        let n = blocks.len();
        self.prepare(&block_ids(blocks))?;
        let bytes = h.encode();
        self.copy.memcpy_htod(&bytes, &mut self.header.slice_mut(..))?;
        self.net.wait(&self.copy.record_event(None)?)?;
        live(&self.comm)?.send(&self.header, self.peer)?;
        self.queue_send(n, opts.stall_after_pages)?;
        // The trailer: this side's checksums, complete once the last gather is.
        self.net.wait(&self.copy.record_event(None)?)?;
        if n > 0 {
            live(&self.comm)?.send(&self.sums.slice(..n), self.peer)?;
        }
        let done = self.net.record_event(None)?;
        self.wait(&[&done], Some(deadline), &|| true, "acceptance of the pages by the peer")?;
        Ok((n * self.page_bytes) as u64)
    }

    fn recv_transfer(
        &mut self,
        route: &mut dyn FnMut(&TransferHeader) -> Option<Vec<u32>>,
        keep_waiting: &dyn Fn() -> bool,
        timeout: Duration,
    ) -> Result<Option<Received>, CudaError> {
        self.pool.ctx.bind_to_thread()?;
        if self.header_posted.is_none() {
            live(&self.comm)?.recv(&mut self.header, self.peer)?;
            self.header_posted = Some(self.net.record_event(None)?);
        }
        let posted = self.header_posted.as_ref().expect("posted above");
        if !self.wait(&[posted], None, keep_waiting, "header")? {
            return Ok(None);
        }
        self.header_posted = None;
        let deadline = Instant::now() + timeout;
        let mut raw = [0u8; HEADER_BYTES];
        self.net.memcpy_dtoh(&self.header, &mut raw)?;
        self.net.synchronize()?;
        let h = TransferHeader::decode(&raw).map_err(|e| CudaError::Unsupported(e.to_string()))?;
        if h.page_bytes != self.page_bytes as u64 {
            return Err(CudaError::Unsupported(format!(
                "peer sends pages of {} bytes, this pool's are {}",
                h.page_bytes, self.page_bytes
            )));
        }
        let n = h.pages as usize;
        self.check(n)?;
        let target = route(&h).filter(|b| b.len() == n);
        let stored = target.is_some();
        let ids = target.as_deref().map_or_else(|| vec![-1; n], block_ids);
        self.prepare(&ids)?;
        self.queue_recv(n)?;
        if n > 0 {
            live(&self.comm)?.recv(&mut self.peer_sums.slice_mut(..n), self.peer)?;
        }
        let (net_done, copy_done) = (self.net.record_event(None)?, self.copy.record_event(None)?);
        if !self.wait(&[&net_done, &copy_done], Some(deadline), keep_waiting, "pages")? {
            return Err(CudaError::Unsupported(
                "the link was closed while pages were landing".into(),
            ));
        }
        let mine = self.checksums(n)?;
        let mut theirs = vec![0u32; n];
        if n > 0 {
            self.copy.memcpy_dtoh(&self.peer_sums.slice(..n), &mut theirs)?;
            self.copy.synchronize()?;
        }
        Ok(Some(Received { header: h, stored, verdict: compare_checksums(&h, &theirs, &mine) }))
    }
}

// SAFETY: an NCCL communicator may be used from any thread as long as no two calls on it run
// at once; every call goes through `&mut self` or `&self` of one PageLink, which its owner keeps
// on one thread at a time (it is Send, not Sync).
unsafe impl Send for PageLink {}

impl DeviceLink for PageLink {
    fn send(
        &mut self,
        transfer_id: u64,
        first_index: u32,
        blocks: &[u32],
        opts: SendOptions,
    ) -> Result<u64, TransferError> {
        if let Some(d) = &self.dead {
            return Err(TransferError::Protocol(format!("the page link is closed: {d}")));
        }
        let h = TransferHeader {
            transfer_id,
            first_index,
            pages: blocks.len() as u32,
            page_bytes: self.page_bytes as u64,
        };
        match self.send_transfer(&h, blocks, opts) {
            Ok(b) => Ok(b),
            Err(e) => Err(link_err(self.fail(e), opts.timeout)),
        }
    }

    fn recv(
        &mut self,
        route: &mut dyn FnMut(&TransferHeader) -> Option<Vec<u32>>,
        keep_waiting: &dyn Fn() -> bool,
        timeout: Duration,
    ) -> Result<Option<Received>, TransferError> {
        if let Some(d) = &self.dead {
            return Err(TransferError::Protocol(format!("the page link is closed: {d}")));
        }
        match self.recv_transfer(route, keep_waiting, timeout) {
            Ok(r) => Ok(r),
            Err(e) => Err(link_err(self.fail(e), timeout)),
        }
    }
}

fn link_err(e: CudaError, timeout: Duration) -> TransferError {
    match e {
        CudaError::Stalled(_) => TransferError::Timeout(timeout),
        other => transfer_err(other),
    }
}

/// The communicator of a link that has not been closed.
fn live(comm: &Option<Comm>) -> Result<&Comm, CudaError> {
    comm.as_ref().ok_or_else(|| CudaError::Unsupported("the page link is closed".into()))
}

/// Block ids as the copy kernels take them (a negative id: receive into nowhere).
fn block_ids(blocks: &[u32]) -> Vec<i32> {
    blocks.iter().map(|&b| b as i32).collect()
}

/// Aborts a communicator (cudarc's drop aborts it, and panics if NCCL reports an error then: a
/// link being torn down has no use for that panic).
fn abort(comm: Option<Comm>) {
    if let Some(c) = comm {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(c))).is_err() {
            tracing::warn!("NCCL reported an error while aborting a page link's communicator");
        }
    }
}

impl Drop for PageLink {
    fn drop(&mut self) {
        // Abort first: a kernel still waiting for the peer ends, then the streams drain before
        // the buffers they use are freed.
        abort(self.comm.take());
        let _ = self.pool.ctx.bind_to_thread();
        let _ = self.net.synchronize();
        let _ = self.copy.synchronize();
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
                assert!((1..=32).contains(&size));
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
