//! `CudaBackend`: the model on one NVIDIA GPU behind the engine's [`ModelBackend`] seam.
//!
//! A forward pass enqueues, per layer: RMSNorm → fused q|k|v GEMM (cuBLAS, 16-bit in, f32 out) →
//! q/k norm + RoPE + KV store → paged attention → output GEMM accumulated into the f32 residual
//! stream → RMSNorm → gate|up GEMM → SiLU·mul → down GEMM accumulated into the residual (on a
//! tensor-parallel rank, each of the two GEMMs' partial products summed across the group in
//! place by an NCCL all-reduce); then the final norm of the rows whose logits are wanted and the LM head. Decode steps replay a CUDA
//! graph captured for the smallest captured batch size that holds them; steps with prompt
//! chunks of up to `plan::mixed_graph_max_rows()` tokens replay a graph of their padded shape.

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::{CudaGraph, CudaSlice, LaunchConfig};
use tandem_engine::backend::{
    BackendError, ForwardBatch, KvCacheSpec, KvGroups, ModelBackend, RowSampling,
};
use tandem_engine::model_files::config::{Activation, ModelConfig, RopeStyle};
use tandem_engine::sampling::sampler::TokenLogprob;

use crate::device::split_k::{SPLIT_MAX_SLICES, SPLIT_PART_ROWS};
use crate::device::{ptr, Dtype, Gpu};
use crate::plan::{self, LongSeq, ATT_MAX_HEAD_DIM, MAX_SPLITS, TILE_INTS};
use crate::weights::DeviceWeights;
use crate::CudaError;
use attention::PagedAttention;
use residual::Residual;
use rope::RopeInputs;

mod attention;
mod batch;
mod collective;
mod graphs;
mod host_times;
mod mixed;
mod pages;
mod residual;
mod rope;
mod sampling;
mod switches;

pub(crate) use collective::{
    enable_peer_access, peers_reachable, Collective, TwoShot, PEER_MAX_WORLD,
};

pub(crate) use sampling::sampling_args;

/// Rows of attention output the split-context path keeps partial results for.
const SPLIT_ROWS: usize = 512;

/// How to build a [`CudaBackend`].
#[derive(Debug, Clone, Copy)]
pub struct CudaBackendOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks; `None` sizes the pool from free GPU memory.
    pub num_blocks: Option<usize>,
    /// Fraction of the GPU's memory the process may use in all (weights, activations, KV).
    pub gpu_memory_utilization: f64,
    /// Host swap blocks.
    pub num_host_blocks: usize,
    /// Most tokens in one forward pass (sizes the activations).
    pub max_num_batched_tokens: usize,
    /// Longest sequence (sizes the block-table rows of decode graphs).
    pub max_model_len: usize,
    /// Largest decode batch replayed from a CUDA graph (0: no graphs).
    pub max_graph_batch: usize,
    /// Prompt chunks of at least this many tokens attend through cuBLAS GEMMs.
    pub long_prompt_min_tokens: usize,
    /// Group sliding-window layers into KV pages of their own ([`KvGroups`]), so that pages
    /// their window has passed go back to the pool; off: one page holds every layer.
    pub hybrid_kv: bool,
}

impl Default for CudaBackendOptions {
    fn default() -> Self {
        CudaBackendOptions {
            block_size: 16,
            num_blocks: None,
            gpu_memory_utilization: 0.9,
            num_host_blocks: 0,
            max_num_batched_tokens: 8192,
            max_model_len: 4096,
            max_graph_batch: 256,
            long_prompt_min_tokens: 64,
            hybrid_kv: true,
        }
    }
}

/// Device buffers of one forward pass.
struct Activations {
    x: CudaSlice<f32>,
    hb: CudaSlice<u16>,
    qkv: CudaSlice<f32>,
    q: CudaSlice<f32>,
    q16: CudaSlice<u16>,
    att: CudaSlice<u16>,
    /// f32 attention output of the GEMM path (when the model's type is not IEEE half).
    o32: CudaSlice<f32>,
    /// Per-head contiguous K and V of one long sequence.
    kg: CudaSlice<u16>,
    vg: CudaSlice<u16>,
    /// Scores (f32) and probabilities (16-bit) of the GEMM attention path.
    scores: CudaSlice<f32>,
    probs: CudaSlice<u16>,
    /// gate|up, 16-bit.
    gu: CudaSlice<u16>,
    act: CudaSlice<u16>,
    /// A sub-layer's output before its post-norm (Gemma; one element otherwise).
    proj: CudaSlice<f32>,
    /// The slices' partial sums of a projection into the residual cut along k
    /// ([`Gpu::split_slices`]), added in by the RMSNorm after it.
    parts: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    part_acc: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    tokens: CudaSlice<i32>,
    positions: CudaSlice<i32>,
    slots: CudaSlice<i32>,
    tiles: CudaSlice<i32>,
    block_tables: CudaSlice<i32>,
    /// Per tile (its first row) and KV head: splits finished so far in the running attention
    /// launch (the kernels' `merge_splits`; zero between launches).
    split_count: CudaSlice<i32>,
    logits_rows: CudaSlice<i32>,
    /// Device sampling: the kernel's per-row arguments ([`sampling::sampling_args`]); tokens
    /// then log-probability bits out.
    sample_args: CudaSlice<u32>,
    sample_out: CudaSlice<i32>,
    /// Steps planned ahead: `(token, row)` pairs of a pass's deferred tokens.
    take_pairs: CudaSlice<u32>,
}

/// Where a pass left its logits (see [`CudaBackend::pass`]).
enum Pass {
    /// A decode graph: row `i` of the buffer is token `i`'s.
    Graph,
    /// An eager pass: the first this many rows asked for, in order.
    Eager(usize),
}

/// A captured decode step.
struct DecodeGraph(CudaGraph);

// SAFETY: a graph executable is a driver handle usable from any thread; `CudaGraph::launch`
// binds the context first, and the backend is used by one thread at a time (`&mut self`).
unsafe impl Send for DecodeGraph {}

/// The model and its paged KV cache on one GPU.
pub struct CudaBackend {
    gpu: Gpu,
    cfg: ModelConfig,
    w: DeviceWeights,
    /// `[page layer][K|V][slot][kv_size]`, 16-bit: a page holds `kv_groups.layers_per_page`
    /// layers of one KV group.
    kv: CudaSlice<u16>,
    /// How the layers share pages (one group of every layer unless sliding-window layers get
    /// their own).
    kv_groups: KvGroups,
    pub(crate) num_blocks: usize,
    block_size: usize,
    /// Host swap space in page-locked memory (DMA both ways), `[block][2·layers·block_size·kv_size]`, 16-bit.
    host: Option<cudarc::driver::PinnedHostSlice<u16>>,
    num_host_blocks: usize,
    a: Activations,
    opts: CudaBackendOptions,
    /// Rows of logits the device buffer holds.
    logits_cap: usize,
    max_blocks_per_seq: usize,
    graph_sizes: Vec<usize>,
    graphs: HashMap<usize, DecodeGraph>,
    /// Steps with prompt chunks replay mixed-step graphs (`mixed.rs`).
    use_mixed_graphs: bool,
    mixed_graphs: HashMap<plan::MixedShape, DecodeGraph>,
    /// How often each shape was asked for before its graph was captured.
    mixed_seen: HashMap<plan::MixedShape, u32>,
    /// Each captured graph's nodes by kernel name (`graphs::census`), when `census_on`.
    census: HashMap<usize, Vec<(String, usize)>>,
    census_on: bool,
    /// Replays [`CudaBackend::replay_ms`] times back to back (0: each alone).
    chain: usize,
    /// Wall time spent capturing graphs, seconds.
    pub capture_seconds: f64,
    use_graphs: bool,
    use_mma: bool,
    /// Decode tiles on the small-tile tensor-core kernel (`attention_dec*`).
    use_dec: bool,
    /// Steps whose rows are all in small tiles run q/k norm + RoPE + KV store inside that
    /// kernel (`attention_dec_rope*`) instead of a kernel of its own.
    fuse_rope: bool,
    /// Attention tiles in the order of their contexts, longest first (`plan::longest_first`).
    longest_first: bool,
    /// Stage boundaries recorded while profiling: (stage that starts, event).
    marks: std::cell::RefCell<Option<Vec<(&'static str, cudarc::driver::CudaEvent)>>>,
    /// The tensor-parallel group this backend is one rank of (`None`: the whole model).
    pub(crate) tp: Option<Collective>,
    /// Every row attends through the GEMM path (heads wider than the paged kernels take).
    gemm_attention: bool,
    /// The passes `launch_sampled` queued, oldest first, until `collect_sampled` (two at
    /// most: a step planned ahead of the one in flight).
    launched: std::collections::VecDeque<sampling::Launched>,
    /// Where queued passes' tokens land on the host, one per pass that can be in flight.
    samples_host: Vec<sampling::SampleSlot>,
    /// The device's time on the queued passes collected so far, seconds.
    device_seconds: f64,
    /// The host's time launching passes, by part.
    host_times: host_times::HostTimes,
}

/// A device error as the engine's backend error.
pub(crate) fn dev(e: CudaError) -> BackendError {
    BackendError::Device(e.to_string())
}

impl CudaBackend {
    /// Builds the backend around loaded weights: sizes activations, then the KV pool from what
    /// memory is left.
    pub fn new(
        gpu: Gpu,
        cfg: &ModelConfig,
        w: DeviceWeights,
        opts: CudaBackendOptions,
    ) -> Result<CudaBackend, CudaError> {
        if !cfg.head_dim.is_multiple_of(8) || cfg.head_dim > 1024 {
            return Err(CudaError::Unsupported(format!(
                "head_dim {} (the attention kernels take multiples of 8 up to 1024)",
                cfg.head_dim
            )));
        }
        // Heads wider than the paged kernels take (Gemma 3's 256) attend through the GEMM
        // path, every row of every step, without decode graphs.
        let gemm_attention = cfg.head_dim > ATT_MAX_HEAD_DIM;
        if cfg.num_heads / cfg.num_kv_heads > plan::ATT_MAX_ROWS {
            return Err(CudaError::Unsupported(format!(
                "{} query heads per KV head (the attention kernel takes up to {})",
                cfg.num_heads / cfg.num_kv_heads,
                plan::ATT_MAX_ROWS
            )));
        }
        if opts.block_size == 0 || opts.max_num_batched_tokens == 0 {
            return Err(CudaError::Unsupported(
                "block size and max_num_batched_tokens must be positive".into(),
            ));
        }
        let t = opts.max_num_batched_tokens.max(opts.max_graph_batch);
        let kv_groups = KvGroups::for_model(cfg, opts.hybrid_kv);
        let (groups, page_layers) = (kv_groups.num_groups(), kv_groups.layers_per_page);
        let (h, q, kvs, ff, v) =
            (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size, cfg.vocab_size);
        let max_blocks_per_seq = opts.max_model_len.div_ceil(opts.block_size);
        let logits_cap = 1024.max(opts.max_graph_batch);
        // Tile entries: a tile per row, each cut into at most MAX_SPLITS (for at most
        // SPLIT_ROWS rows); the prefill kernel's tiles after them.
        let entries = t + (MAX_SPLITS - 1) * t.min(SPLIT_ROWS);
        // Scores of the GEMM attention path: at most 128M per pass (512 MiB), chunked by rows.
        let score_cap = (cfg.num_heads * t * opts.max_model_len).min(128 << 20);
        let a = Activations {
            x: gpu.zeros(t * h)?,
            hb: gpu.zeros(t * h)?,
            qkv: gpu.zeros(t * (q + 2 * kvs))?,
            q: gpu.zeros(t * q)?,
            q16: gpu.zeros(t * q)?,
            o32: gpu.zeros(if gpu.dtype == Dtype::F16 { 1 } else { t * q })?,
            att: gpu.zeros(t * q)?,
            kg: gpu.zeros(cfg.num_heads * opts.max_model_len * cfg.head_dim)?,
            vg: gpu.zeros(cfg.num_heads * opts.max_model_len * cfg.head_dim)?,
            scores: gpu.zeros(score_cap)?,
            probs: gpu.zeros(score_cap)?,
            gu: gpu.zeros(t * 2 * ff)?,
            act: gpu.zeros(t * ff)?,
            proj: gpu.zeros(if cfg.post_norms { t * h } else { 1 })?,
            parts: gpu.zeros(match cfg.post_norms {
                true => 1,
                false => SPLIT_PART_ROWS.min(SPLIT_MAX_SLICES * t) * h,
            })?,
            logits: gpu.zeros(logits_cap * v)?,
            part_acc: gpu.zeros(MAX_SPLITS * SPLIT_ROWS * q)?,
            part_ml: gpu.zeros(MAX_SPLITS * SPLIT_ROWS * cfg.num_heads * 2)?,
            tokens: gpu.zeros(t)?,
            positions: gpu.zeros(t)?,
            slots: gpu.zeros(groups * t)?,
            tiles: gpu.zeros(entries * TILE_INTS)?,
            block_tables: gpu.zeros(groups * t.max(1) * max_blocks_per_seq)?,
            split_count: gpu.zeros(t * cfg.num_kv_heads)?,
            logits_rows: gpu.zeros(t)?,
            sample_args: gpu.zeros(7 * logits_cap)?,
            sample_out: gpu.zeros(2 * logits_cap)?,
            take_pairs: gpu.zeros(2 * logits_cap)?,
        };
        gpu.sync()?;
        let per_block = Self::kv_bytes_per_block(cfg, opts.block_size, opts.hybrid_kv) as u64;
        let num_blocks = match opts.num_blocks {
            Some(n) => n,
            None => {
                let (free, total) = gpu.mem_info()?;
                let used = gpu.free_at_open.saturating_sub(free) as u64;
                // Half a GiB for cuBLAS, graphs and the allocator's slack.
                plan::kv_blocks_for(
                    total as u64,
                    free as u64,
                    used,
                    opts.gpu_memory_utilization,
                    512 << 20,
                    per_block,
                )
            }
        };
        if num_blocks == 0 {
            return Err(CudaError::OutOfMemory(format!(
                "no room for a KV block of {per_block} bytes after the weights and activations"
            )));
        }
        let kv = gpu.zeros::<u16>(num_blocks * opts.block_size * kvs * 2 * page_layers)?;
        let page = 2 * page_layers * opts.block_size * kvs;
        let graph_sizes = match gemm_attention {
            true => Vec::new(),
            false => plan::graph_batch_sizes(opts.max_graph_batch),
        };
        let host = if opts.num_host_blocks == 0 {
            None
        } else {
            // SAFETY: page-locked host memory, written by swap-outs before any swap-in reads it.
            Some(
                unsafe { gpu.ctx.alloc_pinned_with_flags::<u16>(opts.num_host_blocks * page, 0) }
                    .map_err(CudaError::from)?,
            )
        };
        Ok(CudaBackend {
            gpu,
            cfg: cfg.clone(),
            w,
            kv,
            kv_groups,
            num_blocks,
            block_size: opts.block_size,
            host,
            num_host_blocks: opts.num_host_blocks,
            a,
            opts,
            logits_cap,
            max_blocks_per_seq,
            graph_sizes,
            graphs: HashMap::new(),
            use_mixed_graphs: true,
            mixed_graphs: HashMap::new(),
            mixed_seen: HashMap::new(),
            census: HashMap::new(),
            census_on: false,
            chain: 0,
            capture_seconds: 0.0,
            use_graphs: opts.max_graph_batch > 0 && !gemm_attention,
            gemm_attention,
            use_mma: true,
            // TANDEM_DEC_KERNEL=off keeps decode tiles on the 16-row kernel (for comparison).
            use_dec: std::env::var("TANDEM_DEC_KERNEL").as_deref() != Ok("off"),
            // TANDEM_FUSED_ROPE=off keeps q/k norm + RoPE + KV store a kernel of its own.
            fuse_rope: std::env::var("TANDEM_FUSED_ROPE").as_deref() != Ok("off"),
            longest_first: true,
            marks: std::cell::RefCell::new(None),
            tp: None,
            launched: Default::default(),
            samples_host: Vec::new(),
            device_seconds: 0.0,
            host_times: host_times::HostTimes::default(),
        })
    }

    /// KV bytes of one block (page) on this backend: 16-bit K and V of every layer, or of one
    /// KV group's layers when `hybrid` groups sliding-window layers ([`KvGroups::for_model`]).
    pub fn kv_bytes_per_block(cfg: &ModelConfig, block_size: usize, hybrid: bool) -> usize {
        2 * 2 * KvGroups::for_model(cfg, hybrid).layers_per_page * block_size * cfg.kv_size()
    }

    /// Layers one page holds.
    fn page_layers(&self) -> usize {
        self.kv_groups.layers_per_page
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.w.bytes
    }

    /// Query heads per KV head.
    fn group(&self) -> usize {
        self.cfg.num_heads / self.cfg.num_kv_heads
    }

    fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Offset (elements) of the K (`which` 0) or V (1) cache of page layer `l` (the layers at
    /// index `l` of their KV group share it, each in its group's pages).
    fn kv_offset(&self, l: usize, which: usize) -> usize {
        (2 * l + which) * self.num_slots() * self.cfg.kv_size()
    }

    /// Enqueues the decoder over `t` rows described by the uploaded plan (no host sync, so it
    /// can be captured): `num_layers` layers, then the final norm and LM head for
    /// `logit_rows` rows starting at `logits_rows[row_off]`. `sections`: entries per KV group
    /// in the plan's slots and block tables ([`BatchPlan::slot_stride`], [`BatchPlan::bt_stride`]).
    /// `long`: the plan's long chunks and how many prefill-kernel tiles they make
    /// ([`BatchPlan::long`], [`BatchPlan::num_long_tiles`]).
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        t: usize,
        tiling: (usize, bool),
        long: (&[LongSeq], usize),
        sections: (usize, usize),
        num_layers: usize,
        logit_rows: usize,
        row_off: usize,
    ) -> Result<(), CudaError> {
        // Number of tile entries, and whether every tile has at most 8 query rows.
        let (num_tiles, small_tiles) = tiling;
        // Chunks for the long-chunk paths, and their tiles for the prefill kernel.
        let (long, num_long_tiles) = long;
        let (g, c, a, w) = (&self.gpu, &self.cfg, &self.a, &self.w);
        let (h, qs, kvs, ff) = (c.hidden_size, c.q_size(), c.kv_size(), c.intermediate_size);
        let (nh, nkv, hd) = (c.num_heads as i32, c.num_kv_heads as i32, c.head_dim as i32);
        let eps = c.rms_norm_eps;
        let (x, hb, qkv, q, att, gu, act) =
            (ptr(&a.x), ptr(&a.hb), ptr(&a.qkv), ptr(&a.q), ptr(&a.att), ptr(&a.gu), ptr(&a.act));
        let (tok, pos, slot, tiles, bt) =
            (ptr(&a.tokens), ptr(&a.positions), ptr(&a.slots), ptr(&a.tiles), ptr(&a.block_tables));
        let rows_cfg = |n: usize, threads: u32| LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (hi, null) = (h as i32, 0u64);
        // SAFETY (every launch below): argument lists match kernels/*.cu, and every buffer was
        // sized in `new` for at least `t` rows (validate checks the batch against it).
        self.mark("embed")?;
        let escale = c.embedding_scale;
        unsafe {
            g.launch(&g.k.embed, rows_cfg(t, 256), &[&tok, &ptr(&w.embed), &x, &hi, &escale])?
        };
        let interleaved = (c.rope_style == RopeStyle::Interleaved) as i32;
        // Gemma scales scores by 1/√query_pre_attn_scalar, everyone else by 1/√head_dim.
        let scale = 1.0 / c.query_pre_attn_scalar.unwrap_or(c.head_dim as f32).sqrt();
        let (kv_base, bs) = (ptr(&self.kv), self.block_size as i32);
        // RMSNorm of the residual stream's t rows into the 16-bit activations, given what the
        // projection before it left: the sum (norm it), a group's normed rows (nothing to do) or
        // slices of k (added in first).
        let norm_rows = |left: Residual, weights: u64| -> Result<(), CudaError> {
            if left == Residual::Normed {
                return Ok(());
            }
            self.mark("rmsnorm")?;
            if let Residual::Parts(n) = left {
                return self.norm_parts(t, n, weights);
            }
            unsafe {
                g.launch(g.rmsnorm_for(h), rows_cfg(t, 256), &[&x, &null, &weights, &hb, &hi, &eps])
            }
        };
        // Every row in a small tile: the decode kernel norms, rotates and stores them.
        let fused = match self.fused_rope_kernel() {
            Some(f) if small_tiles && long.is_empty() && num_tiles > 0 => Some(f),
            _ => None,
        };
        // What the previous layer's down projection left for this layer's input norm.
        let mut left = Residual::Summed;
        for (li, l) in w.layers.iter().enumerate().take(num_layers) {
            // The layer's KV group: its slots, block tables and page layer.
            let (kg, page_layer) = self.kv_groups.layer_slot[li];
            let slot = slot + 4 * (kg * sections.0) as u64;
            let bt = bt + 4 * (kg * sections.1) as u64;
            norm_rows(left, ptr(&l.attn_norm))?;
            self.mark("gemm qkv")?;
            g.gemm(t, qs + 2 * kvs, h, hb, ptr(&l.qkv), qkv, true, false)?;
            let kc = kv_base + 2 * self.kv_offset(page_layer, 0) as u64;
            let vc = kv_base + 2 * self.kv_offset(page_layer, 1) as u64;
            let rope = RopeInputs {
                qkv,
                pos,
                slot,
                inv_freq: ptr(&l.inv_freq),
                q_norm: l.q_norm.as_ref().map_or(0, ptr),
                k_norm: l.k_norm.as_ref().map_or(0, ptr),
                qkv_bias: l.qkv_bias.as_ref().map_or(0, ptr),
                interleaved,
                eps,
            };
            if fused.is_none() {
                self.mark("qk norm, rope, kv store")?;
                // Half-precision queries only for long chunks that attend through cuBLAS.
                let q16 = match long.is_empty() || self.prefill_kernel().is_some() {
                    true => 0,
                    false => ptr(&a.q16),
                };
                self.rope_store(t, &rope, (kc, vc), q16)?;
            }
            self.mark("attention")?;
            // A sliding-window layer sees the last `window` positions (i32::MAX: all).
            let window = c.layer_window(li).map_or(i32::MAX, |w| w.min(i32::MAX as usize) as i32);
            let cfg = LaunchConfig {
                grid_dim: (nkv as u32, num_tiles as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let paged = PagedAttention {
                q,
                k_cache: kc,
                v_cache: vc,
                tiles,
                block_tables: bt,
                out: att,
                part_acc: ptr(&a.part_acc),
                part_ml: ptr(&a.part_ml),
                split_count: ptr(&a.split_count),
                num_tokens: t as i32,
                nh,
                nkv,
                hd,
                block_size: bs,
                scale,
                window,
            };
            if let Some(f) = fused {
                self.attend_fused(f, num_tiles, &paged, &rope)?;
            } else if num_tiles > 0 {
                let (f, cfg) = match (self.dec_kernel(), self.mma_kernel()) {
                    (Some(f), _) if small_tiles => {
                        let shared_mem_bytes = plan::dec_smem_bytes(c.head_dim);
                        let threads = 32 * plan::dec_warps(c.head_dim) as u32;
                        (f, LaunchConfig { block_dim: (threads, 1, 1), shared_mem_bytes, ..cfg })
                    }
                    (_, Some(f)) => {
                        let shared_mem_bytes = plan::decode_smem_bytes(c.head_dim);
                        (f, LaunchConfig { block_dim: (64, 1, 1), shared_mem_bytes, ..cfg })
                    }
                    (_, None) if small_tiles => (&g.k.attention_decode, cfg),
                    (_, None) => (&g.k.attention, cfg),
                };
                unsafe { g.launch(f, cfg, &paged.args())? };
            }
            if let (Some(f), false) = (self.prefill_kernel(), long.is_empty()) {
                // The long chunks' tiles follow the others in the uploaded tiles.
                self.mark("attention (prefill kernel)")?;
                let lt = tiles + (num_tiles * TILE_INTS * size_of::<i32>()) as u64;
                let cfg = LaunchConfig {
                    grid_dim: (nkv as u32, num_long_tiles as u32, 1),
                    block_dim: (plan::prefill_threads(), 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the paged-attention parameters; `lt` holds `n` tiles of long rows.
                unsafe { g.launch(f, cfg, &PagedAttention { tiles: lt, ..paged }.args())? };
            } else {
                for s in long {
                    self.mark("attention (GEMM path)")?;
                    self.attend_long(s, (kc, vc, bt), scale, window)?;
                }
            }
            self.mark("gemm o")?;
            let ffn_norm = Some(ptr(&l.ffn_norm));
            let post = l.post_attn_norm.as_ref();
            let after_o = self.project_into_residual(t, qs, att, ptr(&l.o), post, 0, ffn_norm)?;
            norm_rows(after_o, ptr(&l.ffn_norm))?;
            self.mark("gemm gate_up")?;
            let gelu = c.hidden_act == Activation::GeluTanh;
            if !g.gemm_glu((t, ff, h), hb, ptr(&l.gate_up), act, gelu)? {
                g.gemm(t, 2 * ff, h, hb, ptr(&l.gate_up), gu, false, false)?;
                self.mark("silu_mul")?;
                let (fi, gelu) = (ff as i32, gelu as i32);
                let cfg = LaunchConfig {
                    grid_dim: (ff.div_ceil(1024) as u32, t as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                unsafe { g.launch(&g.k.silu_mul, cfg, &[&gu, &act, &fi, &gelu])? };
            }
            self.mark("gemm down")?;
            // The next layer's input norm rides on this all-reduce (not the final norm's,
            // which takes only the logits rows).
            let next_norm = w.layers.get(li + 1).filter(|_| li + 1 < num_layers);
            let post = l.post_ffn_norm.as_ref();
            let next_norm = next_norm.map(|n| ptr(&n.attn_norm));
            left = self.project_into_residual(t, ff, act, ptr(&l.down), post, 1, next_norm)?;
        }
        self.mark("final norm, lm head")?;
        if logit_rows > 0 {
            let rows = ptr(&a.logits_rows) + 4 * row_off as u64;
            unsafe {
                g.launch(
                    g.rmsnorm_for(h),
                    rows_cfg(logit_rows, 256),
                    &[&x, &rows, &ptr(&w.norm), &hb, &hi, &eps],
                )?
            };
            self.lm_head(logit_rows)?;
        }
        Ok(())
    }

    /// Runs a pass and returns the logits of `b.logits_indices`.
    pub(crate) fn run(
        &mut self,
        b: &ForwardBatch,
        num_layers: usize,
    ) -> Result<Vec<f32>, CudaError> {
        let vocab = self.cfg.vocab_size;
        let first = match self.pass(b, num_layers)? {
            Pass::Graph => {
                // The batch asks in its own order; a decode step built by the runner asks for
                // 0..n, returned as read.
                let all = self.gpu.read(&self.a.logits, b.num_tokens() * vocab)?;
                if b.logits_indices.iter().enumerate().all(|(i, &r)| i == r) {
                    return Ok(all);
                }
                let mut out = Vec::with_capacity(b.logits_indices.len() * vocab);
                for &r in &b.logits_indices {
                    out.extend_from_slice(&all[r * vocab..(r + 1) * vocab]);
                }
                return Ok(out);
            }
            Pass::Eager(first) => first,
        };
        self.mark("logits to host")?;
        let rows = b.logits_indices.len();
        let mut out = self.gpu.read(&self.a.logits, first * vocab)?;
        // More rows than the logits buffer holds (teacher-forced scoring): the head again per chunk.
        let mut done = first;
        while done < rows {
            let m = (rows - done).min(self.logits_cap);
            self.head_only(m, done)?;
            out.extend(self.gpu.read(&self.a.logits, m * vocab)?);
            done += m;
        }
        Ok(out)
    }

    fn head_only(&self, rows: usize, row_off: usize) -> Result<(), CudaError> {
        let (g, a, w, c) = (&self.gpu, &self.a, &self.w, &self.cfg);
        let (hi, eps) = (c.hidden_size as i32, c.rms_norm_eps);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let rp = ptr(&a.logits_rows) + 4 * row_off as u64;
        // SAFETY: rmsnorm's arguments; `rows` ≤ logits_cap rows of hb and logits.
        unsafe {
            let f = g.rmsnorm_for(c.hidden_size);
            g.launch(f, cfg, &[&ptr(&a.x), &rp, &ptr(&w.norm), &ptr(&a.hb), &hi, &eps])?
        };
        self.lm_head(rows)
    }
}

impl ModelBackend for CudaBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn device(&self) -> String {
        format!("cuda: {} (sm_{})", self.gpu.name, self.gpu.sm)
    }

    fn kv_cache_spec(&self) -> KvCacheSpec {
        // Pages travel as f32, as the CPU backend's do.
        KvCacheSpec {
            num_blocks: self.num_blocks,
            block_size: self.block_size,
            bytes_per_block: 2 * 4 * self.page_layers() * self.block_elems(),
            pool_bytes_per_block: 2 * 2 * self.page_layers() * self.block_elems(),
        }
    }

    fn kv_groups(&self) -> KvGroups {
        self.kv_groups.clone()
    }

    fn forward(&mut self, b: &ForwardBatch) -> Result<Vec<f32>, BackendError> {
        self.validate(b)?;
        self.run(b, self.cfg.num_layers).map_err(dev)
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
        self.validate(b)?;
        Self::check_sampling_rows(b, rows)?;
        self.run_sampled(b, rows, masks).map_err(dev)
    }

    fn overlaps_steps(&self) -> bool {
        // A tensor-parallel rank's pass waits on its group's collectives.
        self.tp.is_none()
    }

    fn takes_deferred_tokens(&self) -> bool {
        self.overlaps_steps()
    }

    fn launch_sampled(
        &mut self,
        b: &ForwardBatch,
        rows: &[RowSampling],
    ) -> Result<(), BackendError> {
        let mut clock = Instant::now();
        self.validate_with(b, true)?;
        Self::check_sampling_rows(b, rows)?;
        host_times::HostTimes::lap(&mut self.host_times.validate, &mut clock);
        self.launch_pass(b, rows).map_err(dev)
    }

    fn collect_sampled(&mut self) -> Result<Vec<TokenLogprob>, BackendError> {
        self.collect_pass().map_err(dev)
    }

    fn device_seconds(&self) -> Option<f64> {
        Some(self.device_seconds)
    }

    fn host_seconds(&self) -> Vec<(&'static str, f64)> {
        self.host_times.parts()
    }

    fn forward_layers(
        &mut self,
        b: &ForwardBatch,
        num_layers: usize,
    ) -> Result<Vec<f32>, BackendError> {
        self.validate(b)?;
        self.run(b, num_layers.min(self.cfg.num_layers)).map_err(dev)
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.copy_pages(pairs)
    }

    fn swap_out(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.swap_pages_out(pairs)
    }

    fn swap_in(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.swap_pages_in(pairs)
    }

    fn num_host_blocks(&self) -> usize {
        self.num_host_blocks
    }

    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError> {
        self.read_page(block)
    }

    fn write_block(&mut self, block: u32, page: &[u8]) -> Result<(), BackendError> {
        self.write_page(block, page)
    }
}
