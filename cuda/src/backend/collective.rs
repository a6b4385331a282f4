//! A tensor-parallel rank's share of the backend: the NCCL communicator of its group and the
//! all-reduce that adds the output and down projections' partial products across the group into
//! the f32 residual stream, on the backend's own stream (so decode graphs capture it).
//!
//! Two ways to sum: NCCL's all-reduce in place (rank 0's GEMM adds to the residual, the others'
//! replace it), or — for steps of up to [`PEER_ROWS`] tokens when the GPUs reach each other's
//! memory — [`PeerReduce`]: every rank's GEMM writes its partial product to a buffer of its own
//! and one kernel per rank adds all partials to the residual, reading the peers' buffers across
//! NVLink after a flag barrier (`tp_all_reduce` in kernels/collective.cu; in groups of more than
//! two, in two shots). The same buffers and barriers gather the LM head's logits: each rank
//! computes its slice of the vocabulary ([`CudaBackend::lm_head`]).

use std::sync::Arc;

use cudarc::driver::{sys as dsys, CudaContext, CudaSlice, LaunchConfig};
use cudarc::nccl::{result, sys, Id};

use tandem_engine::backend::ForwardBatch;

use super::CudaBackend;
use crate::tensor_parallel::shard::Shard;
use crate::CudaError;

/// Most tokens of a step whose all-reduces go through peer memory (more go through NCCL;
/// `TANDEM_TP_PEER_ROWS` sets another bound, for comparison). Prefill chunks too: 4 × 2048
/// tokens went 2–6 % faster through peer memory with the norm fused than through NCCL with the
/// norm apart on H200s (TP=2 and 4). Each rank holds two buffers of this many f32 rows (the 70B
/// shape: 537 MB).
pub const PEER_ROWS: usize = 8192;
/// Most blocks of the peer all-reduce kernel (flag slots per rank: this × PEER_MAX_WORLD).
const PEER_BLOCKS: usize = 128;
/// Most ranks the peer all-reduce kernel takes (`TP_MAX_WORLD` in kernels/collective.cu); larger groups
/// sum through NCCL.
pub const PEER_MAX_WORLD: usize = 8;

/// This rank's communicator in its tensor-parallel group.
pub(crate) struct Collective {
    comm: sys::ncclComm_t,
    /// Where this rank sits in the group.
    pub(crate) shard: Shard,
    /// The peer-memory all-reduce, when set up.
    pub(crate) peer: Option<PeerReduce>,
}

/// What one rank of the peer all-reduce gives the others: its partial buffers, its flag slots
/// and its LM-head slice buffer (0 if none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerBuffers {
    partials: [u64; 2],
    flags: u64,
    head: u64,
}

/// One rank's buffers of the peer-memory all-reduce: two partial-product buffers (the output
/// and down projections alternate, so a peer still reading one is never overwritten), flag
/// slots the peers write, per-block epoch counters, and the buffer of this rank's slice of the
/// logits; allocated outside the stream-ordered pool so that peers can address them once peer
/// access is on.
pub(crate) struct PeerReduce {
    ctx: Arc<CudaContext>,
    /// This rank's partial buffers (f32, `PEER_ROWS × hidden` each).
    pub(crate) partials: [u64; 2],
    flags: u64,
    counter: u64,
    /// Every rank's partial buffer `b` at `[b · world + rank]`.
    partial_table: Option<CudaSlice<u64>>,
    /// Every rank's flag slots.
    flag_table: Option<CudaSlice<u64>>,
    /// This rank's logits of its slice of the vocabulary (f32, `head_capacity` values; 0 when
    /// every rank computes the whole LM head).
    pub(crate) head: u64,
    head_capacity: usize,
    /// Every rank's `head` buffer.
    head_table: Option<CudaSlice<u64>>,
    /// Values (f32) each partial holds.
    pub(crate) capacity: usize,
    /// Whether the all-reduce also applies the RMSNorm that reads its sum.
    pub(crate) fuse_norm: bool,
    /// When groups of more than two ranks sum in two shots (`tp_all_reduce_two_shot`).
    pub(crate) two_shot: TwoShot,
}

/// When a group of more than two ranks sums in two shots: each rank then reads
/// `2 (world − 1) / world` partials' worth across NVLink instead of `world − 1`, for one more
/// barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TwoShot {
    /// Steps of at least [`TWO_SHOT_MIN_ROWS`] rows.
    Above,
    /// Never (`TANDEM_TP_ALL_REDUCE=peer-one-shot`, for comparison).
    Never,
    /// Every step (`TANDEM_TP_ALL_REDUCE=peer-two-shot`, for comparison).
    Always,
}

/// Rows from which a group of more than two ranks sums in two shots by default: on four H200s
/// the one-shot form was faster at 16 rows and the two-shot one at 32 (`tandem-gpu
/// bench-decode llama-3-70b.json 1,4,16,32,64,256 1024 4`).
pub const TWO_SHOT_MIN_ROWS: usize = 24;

impl TwoShot {
    /// Whether an all-reduce of `rows` rows over `world` ranks goes in two shots.
    pub(crate) fn applies(self, world: usize, rows: usize) -> bool {
        world > 2
            && match self {
                TwoShot::Above => rows >= TWO_SHOT_MIN_ROWS,
                TwoShot::Never => false,
                TwoShot::Always => true,
            }
    }
}

fn driver(r: dsys::CUresult, what: &str) -> Result<(), CudaError> {
    match r {
        dsys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(CudaError::Driver(format!("{what}: {e:?}"))),
    }
}

impl PeerReduce {
    /// Allocates one rank's buffers for partials of `capacity` f32 values on the device whose
    /// context `ctx` is (and is current on this thread).
    pub(crate) fn alloc(
        ctx: &Arc<CudaContext>,
        capacity: usize,
        fuse_norm: bool,
        two_shot: TwoShot,
        head_capacity: usize,
    ) -> Result<PeerReduce, CudaError> {
        let mut me = PeerReduce {
            ctx: ctx.clone(),
            partials: [0; 2],
            flags: 0,
            counter: 0,
            partial_table: None,
            flag_table: None,
            head: 0,
            head_capacity,
            head_table: None,
            capacity,
            fuse_norm,
            two_shot,
        };
        let words = PEER_BLOCKS * PEER_MAX_WORLD;
        for (slot, bytes) in [
            (0usize, 4 * capacity),
            (1, 4 * capacity),
            (2, 4 * words),
            (3, 4 * PEER_BLOCKS),
            (4, 4 * head_capacity),
        ] {
            if bytes == 0 {
                continue;
            }
            let mut p = 0;
            // SAFETY: a plain device allocation, freed in Drop.
            driver(unsafe { dsys::cuMemAlloc_v2(&mut p, bytes) }, "cuMemAlloc")?;
            match slot {
                0 | 1 => me.partials[slot] = p,
                2 => me.flags = p,
                3 => me.counter = p,
                _ => me.head = p,
            }
            // SAFETY: zeroes the allocation just made.
            driver(unsafe { dsys::cuMemsetD8_v2(p, 0, bytes) }, "cuMemset")?;
        }
        Ok(me)
    }

    /// Gives this rank the addresses of every rank's buffers (`all[r]` is rank `r`'s).
    pub(crate) fn connect(&mut self, g: &crate::Gpu, all: &[PeerBuffers]) -> Result<(), CudaError> {
        let world = all.len();
        let table: Vec<u64> =
            (0..2).flat_map(|b| all.iter().map(move |p| p.partials[b])).collect::<Vec<_>>();
        let flags: Vec<u64> = all.iter().map(|p| p.flags).collect();
        debug_assert_eq!(table.len(), 2 * world);
        self.partial_table = Some(g.upload(&table)?);
        self.flag_table = Some(g.upload(&flags)?);
        if all.iter().all(|p| p.head != 0) {
            let heads: Vec<u64> = all.iter().map(|p| p.head).collect();
            self.head_table = Some(g.upload(&heads)?);
        }
        Ok(())
    }

    /// What the other ranks need of this one.
    pub(crate) fn buffers(&self) -> PeerBuffers {
        PeerBuffers { partials: self.partials, flags: self.flags, head: self.head }
    }
}

impl Drop for PeerReduce {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for p in [self.partials[0], self.partials[1], self.flags, self.counter, self.head] {
            if p != 0 {
                // SAFETY: allocated by cuMemAlloc in `alloc`, freed once; no kernel of this
                // backend runs any more.
                unsafe {
                    let _ = dsys::cuMemFree_v2(p);
                }
            }
        }
    }
}

/// Whether every GPU of `ordinals` can read every other's memory (`cuDeviceCanAccessPeer`),
/// asked before any context is opened: what [`enable_peer_access`] will find.
pub(crate) fn peers_reachable(ordinals: std::ops::Range<usize>) -> Result<bool, CudaError> {
    let mut devs = Vec::with_capacity(ordinals.len());
    for o in ordinals {
        let mut d = 0;
        // SAFETY: asks for the handle of an ordinal below the device count (the caller's).
        driver(unsafe { dsys::cuDeviceGet(&mut d, o as i32) }, "cuDeviceGet")?;
        devs.push(d);
    }
    for &a in &devs {
        for &b in devs.iter().filter(|&&b| b != a) {
            let mut can = 0;
            // SAFETY: queries two valid devices.
            driver(
                unsafe { dsys::cuDeviceCanAccessPeer(&mut can, a, b) },
                "cuDeviceCanAccessPeer",
            )?;
            if can == 0 {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Turns on access from every context of `ctxs` to every other one's memory; false when some
/// pair of devices cannot reach each other.
pub(crate) fn enable_peer_access(ctxs: &[Arc<CudaContext>]) -> Result<bool, CudaError> {
    for a in ctxs {
        for b in ctxs {
            if Arc::ptr_eq(a, b) {
                continue;
            }
            let mut can = 0;
            // SAFETY: queries two valid devices.
            driver(
                unsafe { dsys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()) },
                "cuDeviceCanAccessPeer",
            )?;
            if can == 0 {
                return Ok(false);
            }
        }
    }
    for a in ctxs {
        a.bind_to_thread().map_err(CudaError::from)?;
        for b in ctxs {
            if Arc::ptr_eq(a, b) {
                continue;
            }
            // SAFETY: both contexts are live; enabling twice is reported and ignored.
            let r = unsafe { dsys::cuCtxEnablePeerAccess(b.cu_ctx(), 0) };
            if r != dsys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                driver(r, "cuCtxEnablePeerAccess")?;
            }
        }
    }
    Ok(true)
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time; the backend that
// owns it is used through `&mut self` or from the one thread that drives its rank.
unsafe impl Send for Collective {}

impl Collective {
    /// Joins the group of `shard.size` ranks named by `id` as `shard.rank`, on the device whose
    /// context is current on this thread. Blocks until every rank has joined.
    pub(crate) fn join(id: &Id, shard: Shard) -> Result<Collective, CudaError> {
        let mut comm = std::ptr::null_mut();
        let uid = sys::ncclUniqueId { internal: *id.internal() };
        // SAFETY: `comm` receives the new communicator; ranks and size are in range.
        unsafe { result::comm_init_rank(&mut comm, shard.size as i32, uid, shard.rank as i32)? };
        Ok(Collective { comm, shard, peer: None })
    }

    /// Sums `count` f32 values at device address `buf` across the group, in place, queued on
    /// `stream`.
    fn all_reduce(
        &self,
        buf: u64,
        count: usize,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CudaError> {
        // SAFETY: `buf` holds `count` f32 values on this rank's device; the stream belongs to
        // the same context.
        unsafe {
            result::all_reduce(
                buf as *const std::ffi::c_void,
                buf as *mut std::ffi::c_void,
                count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                stream as sys::cudaStream_t,
            )?
        };
        Ok(())
    }
}

impl Drop for Collective {
    fn drop(&mut self) {
        // SAFETY: the communicator is live and dropped once; abort ends any collective a peer
        // will never join instead of waiting for it.
        unsafe {
            let _ = result::comm_abort(self.comm);
        }
    }
}

impl CudaBackend {
    /// Makes this backend rank `c.shard.rank` of a tensor-parallel group: its weights and KV
    /// cache are that rank's slice, and each layer's projections are summed across the group.
    pub(crate) fn set_collective(&mut self, c: Collective) {
        self.drop_graphs();
        self.tp = Some(c);
    }

    /// The peer all-reduce, when it takes `count` values.
    fn peer_for(&self, count: usize) -> Option<&PeerReduce> {
        self.tp.as_ref()?.peer.as_ref().filter(|p| count <= p.capacity)
    }

    /// Where projection `which` (0: output, 1: down) of a step writes its `count` values, and
    /// whether it adds to what is there: the residual stream (alone, rank 0 of an NCCL group:
    /// adding; the other ranks: replacing), or this rank's partial buffer for the peer
    /// all-reduce.
    pub(super) fn reduce_target(&self, which: usize, count: usize) -> (u64, bool) {
        match (self.peer_for(count), &self.tp) {
            (Some(p), _) => (p.partials[which], false),
            (None, Some(c)) => (crate::device::ptr(&self.a.x), c.shard.leads()),
            (None, None) => (crate::device::ptr(&self.a.x), true),
        }
    }

    /// Sums projection `which`'s products over `rows` rows of the residual stream across the
    /// group (nothing alone). With `norm` (an RMSNorm's weights) the peer all-reduce also
    /// writes the normed rows to the 16-bit activations, in the same launch, and says so by
    /// returning true; otherwise the caller norms.
    pub(super) fn all_reduce(
        &self,
        which: usize,
        rows: usize,
        norm: Option<u64>,
    ) -> Result<bool, CudaError> {
        let Some(c) = &self.tp else { return Ok(false) };
        self.mark("all-reduce")?;
        let h = self.cfg.hidden_size;
        let count = rows * h;
        let x = crate::device::ptr(&self.a.x);
        let Some(p) = self.peer_for(count) else {
            c.all_reduce(x, count, self.gpu.stream.cu_stream())?;
            return Ok(false);
        };
        let (Some(parts), Some(flags)) = (&p.partial_table, &p.flag_table) else {
            return Err(CudaError::Unsupported("peer all-reduce not connected".into()));
        };
        let world = c.shard.size;
        let g = &self.gpu;
        let table = crate::device::ptr(parts) + 8 * (which * world) as u64;
        let flags = crate::device::ptr(flags);
        let (ranki, worldi) = (c.shard.rank as i32, world as i32);
        let cfg = |blocks: usize, threads: usize| LaunchConfig {
            grid_dim: (blocks.clamp(1, PEER_BLOCKS.min(g.num_sms)) as u32, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let threads = (h / 8).next_multiple_of(32).clamp(32, 1024);
        if p.two_shot.applies(world, rows) && h.is_multiple_of(4) {
            let w = norm.filter(|_| p.fuse_norm);
            let (rowsi, hi, eps) = (rows as i32, h as i32, self.cfg.rms_norm_eps);
            let (wp, y) = (w.unwrap_or(0), crate::device::ptr(&self.a.hb));
            // SAFETY: tp_all_reduce_two_shot(float* x, const u64* partials, const u64* flags,
            // u32* counter, int rank, int world, int rows, int H, const float* w, h16* y,
            // float eps): as tp_all_reduce_norm below, `w` null for no norm; every rank's
            // partial buffer holds rows × H values and is rewritten in place on its own rows.
            unsafe {
                g.launch(
                    &g.k.tp_all_reduce_two_shot,
                    cfg(rows, threads),
                    &[&x, &table, &flags, &p.counter, &ranki, &worldi, &rowsi, &hi, &wp, &y, &eps],
                )?
            };
            return Ok(w.is_some());
        }
        if let Some(w) = norm.filter(|_| p.fuse_norm && h.is_multiple_of(4)) {
            let (rowsi, hi, eps) = (rows as i32, h as i32, self.cfg.rms_norm_eps);
            let y = crate::device::ptr(&self.a.hb);
            // SAFETY: tp_all_reduce_norm(float* x, const u64* partials, const u64* flags,
            // u32* counter, int rank, int world, int rows, int H, const float* w, h16* y,
            // float eps): as below, with `w` H weights and `y` (the activations) rows × H.
            unsafe {
                g.launch(
                    &g.k.tp_all_reduce_norm,
                    // A row in one round of two pieces per thread where it fits.
                    cfg(rows, threads),
                    &[&x, &table, &flags, &p.counter, &ranki, &worldi, &rowsi, &hi, &w, &y, &eps],
                )?
            };
            return Ok(true);
        }
        let n = count as i64;
        // SAFETY: tp_all_reduce(float* x, const u64* partials, const u64* flags, u32* counter,
        // int rank, int world, long long n): `table` holds `world` partial buffers of at least
        // `count` f32 values, `flags` every rank's slots, `counter` PEER_BLOCKS words.
        unsafe {
            g.launch(
                &g.k.tp_all_reduce,
                cfg(count.div_ceil(4 * 256), 256),
                &[&x, &table, &flags, &p.counter, &ranki, &worldi, &n],
            )?
        };
        Ok(false)
    }

    /// Sets up the peer all-reduce's buffers on this rank (peer access must be on), the
    /// all-reduce carrying the following RMSNorm when `fuse_norm`: returns its partial buffers
    /// and flag slots for the others.
    pub(crate) fn alloc_peer_reduce(
        &mut self,
        fuse_norm: bool,
        two_shot: TwoShot,
        shard_head: bool,
    ) -> Result<PeerBuffers, CudaError> {
        self.gpu.bind()?;
        let cap = std::env::var("TANDEM_TP_PEER_ROWS").ok().and_then(|v| v.parse().ok());
        let rows = cap
            .unwrap_or(PEER_ROWS)
            .min(self.opts.max_num_batched_tokens.max(self.opts.max_graph_batch));
        let world = self.tp.as_ref().map_or(1, |c| c.shard.size);
        let head = match shard_head {
            true => self.logits_cap * self.cfg.vocab_size.div_ceil(world),
            false => 0,
        };
        let capacity = rows * self.cfg.hidden_size;
        let p = PeerReduce::alloc(&self.gpu.ctx, capacity, fuse_norm, two_shot, head)?;
        let out = p.buffers();
        match self.tp.as_mut() {
            Some(c) => c.peer = Some(p),
            None => return Err(CudaError::Unsupported("not a tensor-parallel rank".into())),
        }
        self.drop_graphs();
        Ok(out)
    }

    /// Gives this rank every rank's peer all-reduce buffers (`all[r]`: rank `r`'s).
    pub(crate) fn connect_peer_reduce(&mut self, all: &[PeerBuffers]) -> Result<(), CudaError> {
        self.gpu.bind()?;
        let g = &self.gpu;
        match self.tp.as_mut().and_then(|c| c.peer.as_mut()) {
            Some(p) => p.connect(g, all),
            None => Err(CudaError::Unsupported("no peer all-reduce buffers".into())),
        }
    }

    /// Whether this rank computes only its slice of the LM head ([`CudaBackend::lm_head`]).
    pub(crate) fn head_sliced(&self) -> bool {
        self.tp.as_ref().and_then(|c| c.peer.as_ref()).is_some_and(|p| p.head_table.is_some())
    }

    /// The LM head over the first `rows` normed rows of the 16-bit activations, into the
    /// logits (`rows` ≤ the logits buffer's rows). A rank of a group whose peer all-reduce
    /// carries head buffers computes only its slice of the vocabulary (`Shard::vocab_rows`)
    /// and gathers the others' slices from their buffers (`tp_gather_columns`), so every rank
    /// holds every logit — the same bits, each column computed once — and reads `1/N` of the
    /// head's weights a step.
    pub(super) fn lm_head(&self, rows: usize) -> Result<(), CudaError> {
        use crate::device::ptr;
        let (g, v, h) = (&self.gpu, self.cfg.vocab_size, self.cfg.hidden_size);
        let (hb, head, logits) = (ptr(&self.a.hb), ptr(self.w.head()), ptr(&self.a.logits));
        let sliced = self.tp.as_ref().and_then(|c| {
            let p = c.peer.as_ref().filter(|p| p.head != 0)?;
            Some((c, p, p.head_table.as_ref()?, p.flag_table.as_ref()?))
        });
        let held = &self.w.head_rows;
        let Some((c, p, table, flags)) = sliced else {
            if *held != (0..v) {
                return Err(CudaError::Unsupported(format!(
                    "this rank holds vocabulary rows {held:?} of the LM head alone, and the peer gather of the others' logits is not set up"
                )));
            }
            return g.gemm(rows, v, h, hb, head, logits, true, false);
        };
        let world = c.shard.size;
        let mine = c.shard.vocab_rows(v);
        if mine.start < held.start || mine.end > held.end {
            return Err(CudaError::Unsupported(format!(
                "this rank computes vocabulary rows {mine:?} but its LM head holds {held:?}"
            )));
        }
        let per = v.div_ceil(world);
        if rows * per > p.head_capacity {
            return Err(CudaError::Unsupported(format!(
                "{rows} logits rows beyond the head buffer of {} values",
                p.head_capacity
            )));
        }
        let w = head + 2 * ((mine.start - held.start) * h) as u64;
        g.gemm(rows, mine.len(), h, hb, w, p.head, true, false)?;
        let (table, flags) = (ptr(table), ptr(flags));
        let pieces = rows * world * per.div_ceil(4096);
        let cfg = LaunchConfig {
            grid_dim: (pieces.clamp(1, PEER_BLOCKS.min(g.num_sms)) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ranki, worldi, rowsi, vi, peri) =
            (c.shard.rank as i32, world as i32, rows as i32, v as i32, per as i32);
        // SAFETY: tp_gather_columns(float* out, const u64* parts, const u64* flags, u32*
        // counter, int rank, int world, int rows, int cols, int per): `logits` holds at least
        // rows × v values, every rank's head buffer rows × its slice's width (checked above
        // against the capacity all ranks share), `flags`/`counter` the all-reduce's.
        unsafe {
            g.launch(
                &g.k.tp_gather_columns,
                cfg,
                &[&logits, &table, &flags, &p.counter, &ranki, &worldi, &rowsi, &vi, &peri],
            )?
        };
        Ok(())
    }

    /// GPU time of `calls` all-reduces over `rows` rows each, alone in a graph, ms (median of
    /// `reps` replays): what the all-reduces of a step cost, each with the RMSNorm it carries
    /// in the step (all but the last). Every rank must run it at once.
    pub(crate) fn time_all_reduces(
        &mut self,
        rows: usize,
        calls: usize,
        reps: usize,
    ) -> Result<f64, CudaError> {
        self.gpu.bind()?;
        let norm = self.w.layers.first().map(|l| crate::device::ptr(&l.ffn_norm));
        let run = |be: &CudaBackend| -> Result<(), CudaError> {
            for i in 0..calls {
                be.all_reduce(i % 2, rows, norm.filter(|_| i + 1 < calls))?;
            }
            Ok(())
        };
        run(self)?;
        self.gpu.sync()?;
        let (graph, ()) = self.capture_graph(|be, _| run(be))?;
        crate::device::time_ms(&self.gpu, 3, reps, || graph.launch().map_err(CudaError::from))
    }
}

impl CudaBackend {
    /// A follower rank's part of a pass its group's lead runs on the same batch: the same
    /// layers, so the same collectives in the same order — eagerly when `eager` (the lead is
    /// profiling), else through a decode graph where the lead uses one. Its logits stay unread.
    pub(crate) fn follow(
        &mut self,
        b: &ForwardBatch,
        num_layers: usize,
        eager: bool,
    ) -> Result<(), CudaError> {
        let graphs = self.use_graphs;
        self.use_graphs = graphs && !eager;
        let r = self.pass(b, num_layers);
        self.use_graphs = graphs;
        r?;
        self.gpu.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_shot_only_beyond_two_ranks() {
        // Two ranks read one partial either way: never two shots, whatever the switch says.
        for t in [TwoShot::Above, TwoShot::Always, TwoShot::Never] {
            assert!(!t.applies(2, 512));
        }
        // Four or eight ranks: one shot for a few rows (the second barrier costs more than the
        // bytes it saves), two shots from TWO_SHOT_MIN_ROWS rows.
        assert!(!TwoShot::Above.applies(4, 1));
        assert!(!TwoShot::Above.applies(4, TWO_SHOT_MIN_ROWS - 1));
        assert!(TwoShot::Above.applies(4, TWO_SHOT_MIN_ROWS));
        assert!(TwoShot::Above.applies(8, 256));
        assert!(TwoShot::Always.applies(4, 1));
        assert!(!TwoShot::Never.applies(8, 256));
    }
}
