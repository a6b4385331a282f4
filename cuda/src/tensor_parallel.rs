//! Tensor parallelism across the GPUs of one host: [`TpBackend`] drives a group of
//! [`CudaBackend`]s, one per GPU, each holding its slice of the model ([`shard`]) and of every
//! KV block, behind the engine's one [`ModelBackend`] — one scheduler, one block manager, one
//! block table for all ranks.
//!
//! One process drives every GPU, a thread per rank: rank 0 (the lead) runs on the engine's
//! thread and returns logits or sampled tokens; each other rank (a follower) has a thread that
//! runs the same pass on the same batch. Steps overlap as on one GPU (step N+1 launched before
//! step N is collected): every rank then samples its own copy of the logits, the same bits on
//! each, so each finds the deferred tokens of the next step on its own device. The ranks meet
//! only in their collectives (two all-reduces per layer and the logits' gather, on each
//! backend's own stream, captured in decode graphs), so no rank waits for a host round-trip
//! inside a step. A thread per rank rather than one thread launching on every device:
//! an eager pass issues a few hundred launches per rank, which then run in parallel, and NCCL's
//! one-communicator-per-thread use needs no group calls.

pub mod check;
pub mod shard;

use std::sync::{mpsc, Arc, Barrier};
use std::thread::JoinHandle;
use std::time::Duration;

use tandem_engine::backend::{BackendError, ForwardBatch, KvCacheSpec, ModelBackend, RowSampling};
use tandem_engine::model_files::config::ModelConfig;
use tandem_engine::sampling::sampler::TokenLogprob;

use crate::backend::{
    dev, enable_peer_access, peers_reachable, Collective, TwoShot, PEER_MAX_WORLD,
};
use crate::device::{Dtype, Gpu};
use crate::{CudaBackend, CudaBackendOptions, CudaError, DeviceWeights, WeightSource};
use shard::{merge_group_pages, split_page, Shard};

/// How long a follower may take over one command before the group is reported broken.
const FOLLOWER_DEADLINE: Duration = Duration::from_secs(600);

/// What a follower sends back.
enum Reply {
    Done,
    Page(Vec<u8>),
    Ms(f64),
}

type Job = Box<dyn FnOnce(&mut CudaBackend) -> Result<Reply, CudaError> + Send>;

/// The largest of rank 0's time `ms` and the followers' timed replies.
fn slowest(ms: f64, replies: &[Reply]) -> f64 {
    replies.iter().fold(ms, |m, r| if let Reply::Ms(x) = r { m.max(*x) } else { m })
}

/// A block operation of the backend (copy, swap out, swap in).
type BlockOp = fn(&mut CudaBackend, &[(u32, u32)]) -> Result<(), BackendError>;

/// A rank driven by its own thread.
struct Follower {
    jobs: Option<mpsc::Sender<Job>>,
    replies: mpsc::Receiver<Result<Reply, CudaError>>,
    thread: Option<JoinHandle<()>>,
}

impl Follower {
    fn spawn(mut be: CudaBackend) -> Follower {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (reply_tx, replies) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("tp-rank-{}", be.tp.as_ref().map_or(0, |c| c.shard.rank)))
            .spawn(move || {
                if let Err(e) = be.gpu().bind() {
                    let _ = reply_tx.send(Err(e));
                    return;
                }
                for job in job_rx {
                    if reply_tx.send(job(&mut be)).is_err() {
                        break;
                    }
                }
            })
            .ok();
        Follower { jobs: Some(jobs), replies, thread }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A model split across several GPUs of this host, as one [`ModelBackend`].
pub struct TpBackend {
    /// The whole model's configuration.
    cfg: ModelConfig,
    lead: CudaBackend,
    followers: Vec<Follower>,
    /// KV blocks every rank holds.
    num_blocks: usize,
    /// How the group sums its partial products (`all_reduce_path`).
    path: &'static str,
}

/// The group's all-reduce as the switches ask for it (`TANDEM_TP_ALL_REDUCE`,
/// `TANDEM_TP_HEAD`; see [`TpBackend::all_reduce_path`]).
struct PeerChoice {
    /// Over peer memory where the GPUs reach each other (else NCCL).
    peer: bool,
    /// The RMSNorm after it carried by the same kernel.
    fuse_norm: bool,
    /// When it sums in two shots.
    two_shot: TwoShot,
    /// Each rank computes its slice of the vocabulary's logits (peer path only).
    head: bool,
}

fn peer_reduce_choice() -> PeerChoice {
    let choice = std::env::var("TANDEM_TP_ALL_REDUCE").unwrap_or_default();
    let peer = choice != "nccl";
    PeerChoice {
        peer,
        fuse_norm: choice != "peer-apart",
        two_shot: match choice.as_str() {
            "peer-one-shot" => TwoShot::Never,
            "peer-two-shot" => TwoShot::Always,
            _ => TwoShot::Above,
        },
        head: peer && std::env::var("TANDEM_TP_HEAD").map_or(true, |v| v != "whole"),
    }
}

impl TpBackend {
    /// Opens GPUs `first..first + size` and loads one slice of the model on each (in parallel),
    /// joined by an NCCL group. Each rank sizes its KV pool as a lone backend would from its
    /// memory; the group uses the smallest. Sliding-window layers share pages with the others
    /// here (no KV groups).
    pub fn load(
        first: usize,
        size: usize,
        dtype: Dtype,
        cfg: &ModelConfig,
        weights: WeightSource<'_>,
        opts: CudaBackendOptions,
    ) -> Result<TpBackend, CudaError> {
        if let Some(why) = Shard::refusal(cfg, size) {
            return Err(CudaError::Unsupported(why));
        }
        // Ranks keep every layer in one page: the group's pages merge and split per layer.
        let opts = CudaBackendOptions { hybrid_kv: false, ..opts };
        let have = cudarc::driver::CudaContext::device_count().map_err(CudaError::from)? as usize;
        if first + size > have {
            return Err(CudaError::Unsupported(format!(
                "tensor-parallel size {size} from GPU {first} needs {} GPUs; this host shows {have}",
                first + size
            )));
        }
        if !crate::nccl::nccl_present() {
            return Err(CudaError::Unavailable(
                "libnccl (needed between the GPUs of a tensor-parallel group) is not installed"
                    .into(),
            ));
        }
        // Where the peer all-reduce will run, each rank computes the logits of its slice of the
        // vocabulary and keeps only those rows of an untied LM head (decided before loading, so
        // the KV pool gets the rest of the memory).
        let choice = peer_reduce_choice();
        let slice_head =
            choice.head && size <= PEER_MAX_WORLD && peers_reachable(first..first + size)?;
        let id = crate::nccl::new_id()?;
        // Every rank opens its GPU before any joins the group: a rank that failed to open
        // would leave the others waiting in NCCL's initialisation for ever.
        let opened = Barrier::new(size);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let (id, opened, failed, weights) = (&id, &opened, &failed, &weights);
        let built: Vec<Result<CudaBackend, CudaError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    sc.spawn(move || -> Result<CudaBackend, CudaError> {
                        let shard = Shard { rank, size };
                        let gpu = Gpu::open(first + rank, dtype);
                        if gpu.is_err() {
                            failed.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                        opened.wait();
                        let gpu = gpu?;
                        if failed.load(std::sync::atomic::Ordering::SeqCst) {
                            return Err(CudaError::Unavailable(
                                "another GPU of the group did not open".into(),
                            ));
                        }
                        gpu.bind()?;
                        let comm = Collective::join(id, shard)?;
                        let w = match weights {
                            WeightSource::Files(f) => {
                                DeviceWeights::load_shard(&gpu, f, cfg, shard, slice_head)?
                            }
                            WeightSource::Dummy(seed) => {
                                DeviceWeights::dummy_shard(&gpu, cfg, *seed, shard, slice_head)?
                            }
                        };
                        let mut be = CudaBackend::new(gpu, &shard.local_config(cfg), w, opts)?;
                        be.set_collective(comm);
                        Ok(be)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(CudaError::Unsupported("a rank's loader thread panicked".into()))
                    })
                })
                .collect()
        });
        let mut ranks = Vec::with_capacity(size);
        for b in built {
            ranks.push(b?);
        }
        let path = Self::peer_reduce(&mut ranks, &choice, slice_head)?;
        let num_blocks = ranks.iter().map(|b| b.num_blocks).min().unwrap_or(0);
        let mut ranks = ranks.into_iter();
        let lead = ranks.next().ok_or_else(|| CudaError::Unsupported("an empty group".into()))?;
        lead.gpu().bind()?;
        Ok(TpBackend {
            cfg: cfg.clone(),
            lead,
            followers: ranks.map(Follower::spawn).collect(),
            num_blocks,
            path,
        })
    }

    /// Sets up the all-reduce over peer memory for steps of up to `PEER_ROWS` tokens (and the
    /// sliced LM head's gather, unless `TANDEM_TP_HEAD` is `whole`), unless
    /// `TANDEM_TP_ALL_REDUCE` is `nccl` or some pair of GPUs cannot reach each other. It
    /// carries the RMSNorm that follows it unless `TANDEM_TP_ALL_REDUCE` is `peer-apart`, and
    /// sums in two shots in groups of more than two (steps of `TWO_SHOT_MIN_ROWS` rows and
    /// more) unless it is `peer-one-shot` (`peer-two-shot`: at every size; all for
    /// comparison) — the switches as `choice` read them before loading. With `slice_head` the
    /// ranks loaded only their rows of the LM head, so the peer path must be set up. Returns
    /// the path taken, as [`TpBackend::all_reduce_path`] names it.
    fn peer_reduce(
        ranks: &mut [CudaBackend],
        choice: &PeerChoice,
        slice_head: bool,
    ) -> Result<&'static str, CudaError> {
        let ctxs: Vec<_> = ranks.iter().map(|b| b.gpu().ctx.clone()).collect();
        if !choice.peer || ranks.len() > PEER_MAX_WORLD || !enable_peer_access(&ctxs)? {
            if slice_head {
                return Err(CudaError::Unavailable(
                    "the GPUs of the group could not turn on access to each other's memory, which the sliced LM head needs (TANDEM_TP_HEAD=whole keeps it whole)".into(),
                ));
            }
            return Ok("nccl");
        }
        let (fuse_norm, two_shot) = (choice.fuse_norm, choice.two_shot);
        let mut all = Vec::with_capacity(ranks.len());
        for be in ranks.iter_mut() {
            all.push(be.alloc_peer_reduce(fuse_norm, two_shot, slice_head)?);
        }
        for be in ranks.iter_mut() {
            be.connect_peer_reduce(&all)?;
        }
        Ok(match (fuse_norm, two_shot != TwoShot::Never && ranks.len() > 2) {
            (true, true) => "peer, two-shot, with the RMSNorm",
            (true, false) => "peer, with the RMSNorm",
            (false, true) => "peer, two-shot, RMSNorm apart",
            (false, false) => "peer, RMSNorm apart",
        })
    }

    /// How the group sums its partial products: `peer` (a kernel reading the other GPUs'
    /// memory, for steps of up to 8192 tokens, with the RMSNorm after it or without; NCCL
    /// above) or `nccl`.
    pub fn all_reduce_path(&self) -> &'static str {
        self.path
    }

    /// GPU time of `calls` all-reduces over `rows` rows of the residual stream alone in a
    /// graph on every rank (each with the RMSNorm it carries in a step), ms: rank 0's and the
    /// slowest rank's.
    pub fn time_all_reduces(
        &mut self,
        rows: usize,
        calls: usize,
        reps: usize,
    ) -> Result<(f64, f64), CudaError> {
        let each =
            move |be: &mut CudaBackend| be.time_all_reduces(rows, calls, reps).map(Reply::Ms);
        let (ms, replies) = self.together(each, |be| be.time_all_reduces(rows, calls, reps))?;
        Ok((ms, slowest(ms, &replies)))
    }

    /// Whether each rank computes only its slice of the LM head (the peer all-reduce's
    /// gather), rather than the whole head.
    pub fn head_sliced(&self) -> bool {
        self.lead.head_sliced()
    }

    /// GPUs in the group.
    pub fn size(&self) -> usize {
        1 + self.followers.len()
    }

    /// Wall time rank 0 spent capturing graphs, seconds.
    pub fn capture_seconds(&self) -> f64 {
        self.lead.capture_seconds
    }

    /// Sends `job(rank)` to every follower (rank 1, 2, ...).
    fn send(&self, job: impl Fn(usize) -> Job) -> Result<(), CudaError> {
        for (i, f) in self.followers.iter().enumerate() {
            let tx = f.jobs.as_ref().ok_or_else(|| CudaError::Stalled("rank gone".into()))?;
            tx.send(job(i + 1))
                .map_err(|_| CudaError::Stalled(format!("rank {} has stopped", i + 1)))?;
        }
        Ok(())
    }

    /// Every follower's reply to the last job, in rank order; the first error if any failed.
    fn collect(&self) -> Result<Vec<Reply>, CudaError> {
        let mut out = Vec::with_capacity(self.followers.len());
        let mut first_err = None;
        for (i, f) in self.followers.iter().enumerate() {
            match f.replies.recv_timeout(FOLLOWER_DEADLINE) {
                Ok(Ok(r)) => out.push(r),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(CudaError::Stalled(format!(
                        "rank {} did not finish its part in {} s",
                        i + 1,
                        FOLLOWER_DEADLINE.as_secs()
                    )));
                }
            }
        }
        first_err.map_or(Ok(out), Err)
    }

    /// Runs `lead` on rank 0 while every follower runs `each` on its own rank, then waits
    /// for all; the lead's result, or the first error of any rank.
    fn together<R>(
        &mut self,
        each: impl Fn(&mut CudaBackend) -> Result<Reply, CudaError> + Clone + Send + 'static,
        lead: impl FnOnce(&mut CudaBackend) -> Result<R, CudaError>,
    ) -> Result<(R, Vec<Reply>), CudaError> {
        self.send(|_| Box::new(each.clone()))?;
        let r = lead(&mut self.lead);
        let replies = self.collect();
        Ok((r?, replies?))
    }

    /// A pass of `b` on every rank through the first `layers` layers; rank 0's `lead` part
    /// reads its result.
    fn pass<R>(
        &mut self,
        b: &ForwardBatch,
        layers: usize,
        eager: bool,
        lead: impl FnOnce(&mut CudaBackend) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        let shared = Arc::new(b.clone());
        let each =
            move |be: &mut CudaBackend| be.follow(&shared, layers, eager).map(|_| Reply::Done);
        self.together(each, lead).map(|(r, _)| r)
    }

    /// GPU time per stage of one eager pass of `b` on rank 0, ms (the other ranks run it too).
    pub fn profile(&mut self, b: &ForwardBatch) -> Result<Vec<(&'static str, f64)>, CudaError> {
        self.lead.validate(b).map_err(|e| CudaError::Unsupported(e.to_string()))?;
        self.pass(b, self.cfg.num_layers, true, |be| be.profile(b))
    }

    /// Median GPU time of `reps` replays of the decode graph serving `b`, ms: rank 0's, and the
    /// slowest rank's.
    pub fn replay_ms(&mut self, b: &ForwardBatch, reps: usize) -> Result<(f64, f64), CudaError> {
        self.lead.validate(b).map_err(|e| CudaError::Unsupported(e.to_string()))?;
        let shared = Arc::new(b.clone());
        let each = move |be: &mut CudaBackend| be.replay_ms(&shared, reps).map(Reply::Ms);
        let (ms, replies) = self.together(each, |be| be.replay_ms(b, reps))?;
        Ok((ms, slowest(ms, &replies)))
    }

    /// Sets one of the backend's switches (`set`) on every rank.
    fn switch(
        &mut self,
        set: impl Fn(&mut CudaBackend) + Clone + Send + 'static,
    ) -> Result<(), CudaError> {
        let lead = set.clone();
        let each = move |be: &mut CudaBackend| {
            set(be);
            Ok(Reply::Done)
        };
        self.together(each, |be| {
            lead(be);
            Ok(())
        })
        .map(|_| ())
    }

    /// Uses the tensor-core attention kernel where it applies, or not, on every rank.
    pub fn set_mma_attention(&mut self, on: bool) -> Result<(), CudaError> {
        self.switch(move |be| be.set_mma_attention(on))
    }

    /// Uses the small-tile tensor-core kernel for decode tiles, or not, on every rank.
    pub fn set_dec_attention(&mut self, on: bool) -> Result<(), CudaError> {
        self.switch(move |be| be.set_dec_attention(on))
    }

    /// Fuses q/k norm + RoPE + KV store into the small-tile decode kernel, or not, on every rank.
    pub fn set_fused_rope(&mut self, on: bool) -> Result<(), CudaError> {
        self.switch(move |be| be.set_fused_rope(on))
    }

    /// Orders every rank's attention tiles longest context first, or in the batch's order
    /// ([`CudaBackend::set_longest_first`]).
    pub fn set_longest_first(&mut self, on: bool) -> Result<(), CudaError> {
        self.switch(move |be| be.set_longest_first(on))
    }

    /// Chunks of at least `n` tokens take the prefill path on every rank
    /// ([`CudaBackend::set_long_prompt_min`]).
    pub fn set_long_prompt_min(&mut self, n: usize) -> Result<(), CudaError> {
        self.switch(move |be| be.set_long_prompt_min(n))
    }

    /// Captures every rank's decode graphs up front (`progress` is told rank 0's progress).
    pub fn capture_all(&mut self, progress: impl FnMut(usize, usize)) -> Result<(), CudaError> {
        let each = |be: &mut CudaBackend| be.capture_all(|_, _| {}).map(|_| Reply::Done);
        self.together(each, |be| be.capture_all(progress)).map(|_| ())
    }

    /// Runs a block operation on every rank.
    fn blocks(&mut self, op: BlockOp, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        let shared: Arc<Vec<(u32, u32)>> = Arc::new(pairs.to_vec());
        let each = move |be: &mut CudaBackend| {
            op(be, &shared).map(|_| Reply::Done).map_err(|e| CudaError::Unsupported(e.to_string()))
        };
        let r = self.together(each, |be| Ok(op(be, pairs))).map_err(dev)?;
        r.0
    }

    fn check_block(&self, block: u32) -> Result<(), BackendError> {
        if block as usize >= self.num_blocks {
            return Err(BackendError::InvalidBatch(format!(
                "block {block} outside the pool of {}",
                self.num_blocks
            )));
        }
        Ok(())
    }
}

impl ModelBackend for TpBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn device(&self) -> String {
        let g = self.lead.gpu();
        format!("cuda: {} × {} (sm_{}), tensor parallel", self.size(), g.name, g.sm)
    }

    fn kv_cache_spec(&self) -> KvCacheSpec {
        let one = self.lead.kv_cache_spec();
        KvCacheSpec {
            num_blocks: self.num_blocks,
            block_size: one.block_size,
            // The whole model's page: each KV head once, however many ranks hold it.
            bytes_per_block: one.bytes_per_block * self.size()
                / Shard::kv_replicas(&self.cfg, self.size()),
            pool_bytes_per_block: one.pool_bytes_per_block * self.size(),
        }
    }

    fn forward(&mut self, b: &ForwardBatch) -> Result<Vec<f32>, BackendError> {
        self.forward_layers(b, self.cfg.num_layers)
    }

    fn forward_layers(
        &mut self,
        b: &ForwardBatch,
        num_layers: usize,
    ) -> Result<Vec<f32>, BackendError> {
        // Everything that can refuse the batch is checked before any rank starts: a rank that
        // stopped short of its all-reduces would leave the others waiting in them.
        self.lead.validate(b)?;
        let layers = num_layers.min(self.cfg.num_layers);
        self.pass(b, layers, false, |be| be.run(b, layers)).map_err(dev)
    }

    fn samples_on_device(&self) -> bool {
        true
    }

    fn forward_sampled(
        &mut self,
        b: &ForwardBatch,
        rows: &[RowSampling],
        masks: &mut dyn FnMut() -> Vec<Option<Vec<u32>>>,
    ) -> Result<Vec<TokenLogprob>, BackendError> {
        self.lead.validate(b)?;
        CudaBackend::check_sampling_rows(b, rows)?;
        let layers = self.cfg.num_layers;
        self.pass(b, layers, false, |be| be.run_sampled(b, rows, masks)).map_err(dev)
    }

    fn overlaps_steps(&self) -> bool {
        true
    }

    fn takes_deferred_tokens(&self) -> bool {
        true
    }

    fn launch_sampled(
        &mut self,
        b: &ForwardBatch,
        rows: &[RowSampling],
    ) -> Result<(), BackendError> {
        self.lead.validate_with(b, true)?;
        CudaBackend::check_sampling_rows(b, rows)?;
        // Every rank samples its own copy of the logits (the same bits on every rank: the
        // residual is summed in rank order, and each logit is computed by one rank and
        // gathered, or by every rank alike when the head is whole), so each finds a later
        // pass's deferred tokens on its own device. Followers only queue the pass.
        let shared = Arc::new((b.clone(), rows.to_vec()));
        let each =
            move |be: &mut CudaBackend| be.launch_pass(&shared.0, &shared.1).map(|_| Reply::Done);
        self.together(each, |be| be.launch_pass(b, rows)).map(|_| ()).map_err(dev)
    }

    fn collect_sampled(&mut self) -> Result<Vec<TokenLogprob>, BackendError> {
        let each = |be: &mut CudaBackend| be.collect_pass().map(|_| Reply::Done);
        self.together(each, |be| be.collect_pass()).map(|(t, _)| t).map_err(dev)
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.blocks(|be, p| be.copy_blocks(p), pairs)
    }

    fn swap_out(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.blocks(|be, p| be.swap_out(p), pairs)
    }

    fn swap_in(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.blocks(|be, p| be.swap_in(p), pairs)
    }

    fn num_host_blocks(&self) -> usize {
        self.lead.num_host_blocks()
    }

    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError> {
        self.check_block(block)?;
        self.send(|_| {
            Box::new(move |be: &mut CudaBackend| {
                be.read_block(block)
                    .map(Reply::Page)
                    .map_err(|e| CudaError::Unsupported(e.to_string()))
            })
        })
        .map_err(dev)?;
        let own = self.lead.read_block(block);
        let replies = self.collect().map_err(dev)?;
        let mut pages = vec![own?];
        pages.extend(replies.into_iter().filter_map(|r| match r {
            Reply::Page(p) => Some(p),
            _ => None,
        }));
        let reps = Shard::kv_replicas(&self.cfg, self.size());
        let (parts, bs) = (2 * self.cfg.num_layers, self.kv_cache_spec().block_size);
        Ok(merge_group_pages(&pages, reps, parts, bs))
    }

    fn write_block(&mut self, block: u32, page: &[u8]) -> Result<(), BackendError> {
        self.check_block(block)?;
        let want = self.kv_cache_spec().bytes_per_block;
        if page.len() != want {
            return Err(BackendError::InvalidBatch(format!(
                "page of {} bytes, blocks hold {want}",
                page.len()
            )));
        }
        // Split among the holders of distinct KV heads; rank r holds part r / reps.
        let reps = Shard::kv_replicas(&self.cfg, self.size());
        let (layer_parts, bs) = (2 * self.cfg.num_layers, self.kv_cache_spec().block_size);
        let parts = split_page(page, self.size() / reps, layer_parts, bs);
        let parts: Vec<Arc<Vec<u8>>> = parts.into_iter().map(Arc::new).collect();
        let each = parts.clone();
        self.send(move |rank| {
            let p = each[rank / reps].clone();
            Box::new(move |be: &mut CudaBackend| {
                be.write_block(block, &p)
                    .map(|_| Reply::Done)
                    .map_err(|e| CudaError::Unsupported(e.to_string()))
            })
        })
        .map_err(dev)?;
        let own = self.lead.write_block(block, &parts[0]);
        self.collect().map_err(dev)?;
        own
    }
}
