//! GPU benchmarks, each next to the limit it is measured against in the same run: the decode
//! step against the HBM roofline (device copy bandwidth), prefill against the cuBLAS bf16 GEMM
//! peak. Weights are random (the dummy load format), so no download is needed.

use std::time::Instant;

use tandem_engine::backend::{ForwardBatch, Logits, ModelBackend, RowSampling};
use tandem_engine::model_files::config::ModelConfig;

use crate::device::lt_plans::{GemmKey, Tuned};
use crate::device::{ptr, time_ms, Gpu};
use crate::tensor_parallel::shard::Shard;
use crate::{CudaBackend, CudaBackendOptions, CudaError, Dtype, TpBackend, WeightSource};

mod mixed;
pub use mixed::{mixed, MixedRow};

/// The model under a benchmark: on one GPU, or split across a tensor-parallel group.
enum Under {
    One(Box<CudaBackend>),
    Group(Box<TpBackend>),
}

impl Under {
    /// `cfg` with random weights from `seed` on GPU 0, or on GPUs `0..tp`.
    fn open(
        cfg: &ModelConfig,
        tp: usize,
        seed: u32,
        opts: CudaBackendOptions,
    ) -> Result<Under, CudaError> {
        Ok(if tp <= 1 {
            let mut one = crate::load(0, Dtype::Bf16, cfg, WeightSource::Dummy(seed), opts)?;
            one.set_graph_census(true);
            Under::One(Box::new(one))
        } else {
            Under::Group(Box::new(TpBackend::load(
                0,
                tp,
                Dtype::Bf16,
                cfg,
                WeightSource::Dummy(seed),
                opts,
            )?))
        })
    }

    fn backend(&mut self) -> &mut dyn ModelBackend {
        match self {
            Under::One(b) => b.as_mut(),
            Under::Group(g) => g.as_mut(),
        }
    }

    /// Median replay time of the decode graph serving `b`, ms (a group: its slowest rank).
    fn replay_ms(&mut self, b: &ForwardBatch, reps: usize) -> Result<f64, CudaError> {
        match self {
            Under::One(be) => be.replay_ms(b, reps),
            Under::Group(g) => g.replay_ms(b, reps).map(|(_, worst)| worst),
        }
    }

    fn set_longest_first(&mut self, on: bool) -> Result<(), CudaError> {
        self.switch(CudaBackend::set_longest_first, TpBackend::set_longest_first, on)
    }

    /// Chunks of at least `n` tokens on the prefill kernel, shorter ones on the small-tile one.
    fn set_long_prompt_min(&mut self, n: usize) -> Result<(), CudaError> {
        match self {
            Under::One(be) => {
                be.set_long_prompt_min(n);
                Ok(())
            }
            Under::Group(g) => g.set_long_prompt_min(n),
        }
    }

    /// Flips a switch on the one backend or every rank of the group.
    fn switch(
        &mut self,
        one: fn(&mut CudaBackend, bool),
        group: fn(&mut TpBackend, bool) -> Result<(), CudaError>,
        on: bool,
    ) -> Result<(), CudaError> {
        match self {
            Under::One(be) => {
                one(be, on);
                Ok(())
            }
            Under::Group(g) => group(g, on),
        }
    }

    fn profile(&mut self, b: &ForwardBatch) -> Result<Vec<(&'static str, f64)>, CudaError> {
        match self {
            Under::One(be) => be.profile(b),
            Under::Group(g) => g.profile(b),
        }
    }

    fn set_mma_attention(&mut self, on: bool) -> Result<(), CudaError> {
        self.switch(CudaBackend::set_mma_attention, TpBackend::set_mma_attention, on)
    }

    fn set_dec_attention(&mut self, on: bool) -> Result<(), CudaError> {
        self.switch(CudaBackend::set_dec_attention, TpBackend::set_dec_attention, on)
    }

    fn set_fused_rope(&mut self, on: bool) -> Result<(), CudaError> {
        self.switch(CudaBackend::set_fused_rope, TpBackend::set_fused_rope, on)
    }
}

/// The limits of this GPU, measured.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Device-to-device copy of 2 GiB: bytes read plus written per second.
    pub hbm_bytes_per_s: f64,
    /// cuBLAS bf16 GEMM 8192³ with f32 accumulation, FLOP/s.
    pub gemm_flops: f64,
}

/// The limits of GPUs `0..n` together: the slowest one's copy bandwidth (each GPU streams its
/// own share, so the slowest sets the pace) and the sum of their GEMM peaks.
pub fn group_limits(n: usize) -> Result<(String, Limits), CudaError> {
    let mut names = Vec::new();
    let mut lim = Limits { hbm_bytes_per_s: f64::INFINITY, gemm_flops: 0.0 };
    for i in 0..n.max(1) {
        let g = Gpu::open(i, Dtype::Bf16)?;
        let l = limits(&g)?;
        lim.hbm_bytes_per_s = lim.hbm_bytes_per_s.min(l.hbm_bytes_per_s);
        lim.gemm_flops += l.gemm_flops;
        names.push(g.name.clone());
    }
    names.dedup();
    let name = match n {
        0 | 1 => names.concat(),
        _ => format!("{n} × {}", names.join(" + ")),
    };
    Ok((name, lim))
}

/// Device-to-device copy bandwidth of GPU `ordinal` (bytes read plus written per second, as
/// [`Limits::hbm_bytes_per_s`]: 10 copies of 1 GiB after 2 untimed), on a context of its own
/// without compiling the kernels, so a caller can measure it before it builds an engine (whose
/// KV pool then takes what the copy's buffers held).
pub fn copy_bandwidth(ordinal: usize) -> Result<f64, CudaError> {
    let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(CudaError::from)?;
    let stream = ctx.default_stream();
    let bytes = 1usize << 30;
    let src = stream.alloc_zeros::<u8>(bytes).map_err(CudaError::from)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes).map_err(CudaError::from)?;
    let mut copy = |n: usize| -> Result<f64, CudaError> {
        let t = Instant::now();
        for _ in 0..n {
            stream.memcpy_dtod(&src, &mut dst).map_err(CudaError::from)?;
        }
        stream.synchronize().map_err(CudaError::from)?;
        Ok(t.elapsed().as_secs_f64())
    };
    copy(2)?;
    let secs = copy(10)?;
    Ok(2.0 * 10.0 * bytes as f64 / secs)
}

/// Measures [`Limits`].
pub fn limits(g: &Gpu) -> Result<Limits, CudaError> {
    let bytes = 2usize << 30;
    let src = g.zeros::<u8>(bytes)?;
    let mut dst = g.zeros::<u8>(bytes)?;
    let ms = time_ms(g, 3, 10, || g.stream.memcpy_dtod(&src, &mut dst).map_err(CudaError::from))?;
    let hbm = 2.0 * bytes as f64 / (ms / 1e3);
    drop((src, dst));
    let n = 8192;
    let a = g.zeros::<u16>(n * n)?;
    let w = g.zeros::<u16>(n * n)?;
    let c = g.zeros::<u16>(n * n)?;
    // Random operands: cuBLAS runs faster on zeros than on data.
    for (i, buf) in [&a, &w].into_iter().enumerate() {
        let (p, len, seed, scale, konst) =
            (ptr(buf), (n * n) as u64, 17u32 + i as u32, 1.0f32, 0i32);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (g.num_sms as u32 * 8, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: fill_random over n² bf16 elements.
        unsafe { g.launch(&g.k.fill_random, cfg, &[&p, &len, &seed, &scale, &konst])? };
    }
    let ms = time_ms(g, 3, 10, || g.gemm(n, n, n, ptr(&a), ptr(&w), ptr(&c), false, false))?;
    Ok(Limits { hbm_bytes_per_s: hbm, gemm_flops: 2.0 * (n as f64).powi(3) / (ms / 1e3) })
}

/// Parameters of the linear layers (what a decode step streams): every layer plus the LM head.
pub fn linear_params(c: &ModelConfig) -> u64 {
    let (h, q, kv, ff) =
        (c.hidden_size as u64, c.q_size() as u64, c.kv_size() as u64, c.intermediate_size as u64);
    c.num_layers as u64 * (h * (q + 2 * kv) + q * h + 3 * h * ff) + c.vocab_size as u64 * h
}

/// One decode measurement.
#[derive(Debug, Clone)]
pub struct DecodeRow {
    /// Sequences in the step.
    pub batch: usize,
    /// Shortest and longest context (spread evenly between them).
    pub context: (usize, usize),
    /// GPU time of one step (graph replay), ms.
    pub step_ms: f64,
    /// The same step with the CUDA-core attention kernel instead of the tensor-core one, ms.
    pub tile_step_ms: f64,
    /// The same step with the 16-row tensor-core kernel on the decode tiles instead of the
    /// small-tile one, ms, and that eager step's GPU time per stage.
    pub rows16: (f64, Vec<(&'static str, f64)>),
    /// The same step with q/k norm + RoPE + KV store a kernel of its own instead of fused into
    /// the small-tile decode kernel, ms.
    pub unfused_rope_ms: f64,
    /// Contexts of different lengths: the same step with the attention tiles started in the
    /// batch's order instead of longest first, ms.
    pub batch_order_step_ms: Option<f64>,
    /// On one GPU, one sequence: the same step with every product on cuBLAS instead of the
    /// `gemv` kernel, ms.
    pub cublas_step_ms: Option<f64>,
    /// On one GPU: the step's graph replayed 10 times back to back, ms per replay (the first
    /// replay's launch latency shared by ten).
    pub chained_ms: Option<f64>,
    /// On one GPU: the step's graph, its nodes counted by kernel name.
    pub census: Option<Vec<(String, usize)>>,
    /// Bytes a step must read: weights plus every sequence's KV (every GPU's together).
    pub bytes: f64,
    /// Time the HBM roofline allows for those bytes, ms (on a tensor-parallel group: for each
    /// GPU's share, at the slowest GPU's bandwidth).
    pub roofline_ms: f64,
    /// The bound once the GEMMs' arithmetic counts too, ms (each GPU's share): its weights read
    /// at the copy bandwidth or multiplied at the GEMM peak, whichever is slower, then its KV
    /// read at the copy bandwidth (the step's GEMMs and attention run one after the other).
    pub compute_bound_ms: f64,
    /// GPU time per stage of an eager step, ms.
    pub profile: Vec<(&'static str, f64)>,
    /// On a tensor-parallel group: the step's all-reduces alone in a graph, ms (slowest rank),
    /// and how they sum (`peer` or `nccl`).
    pub all_reduce: Option<(f64, &'static str)>,
    /// The products timed against cuBLASLt's candidates before this size's graph was captured
    /// ([`crate::device::Gpu::tune_gemm`]; one GPU).
    pub gemm_tunings: Vec<(GemmKey, Tuned)>,
}

/// Tokens per KV block of the decode benchmarks: 16, or `TANDEM_BLOCK_SIZE` (a multiple of 16,
/// for comparison).
fn decode_block() -> usize {
    match std::env::var("TANDEM_BLOCK_SIZE").ok().and_then(|v| v.parse::<usize>().ok()) {
        Some(b) if b > 0 && b.is_multiple_of(16) => b,
        _ => 16,
    }
}

/// A backend for decode steps of up to `max_batch` sequences of at most `longest` positions,
/// each with blocks of its own, graphs captured up to `max_batch`.
fn decode_options(max_batch: usize, longest: usize) -> CudaBackendOptions {
    let bs = decode_block();
    CudaBackendOptions {
        num_blocks: Some(max_batch * (longest + 1).div_ceil(bs)),
        max_num_batched_tokens: 2048,
        max_model_len: longest + bs,
        max_graph_batch: max_batch,
        block_size: bs,
        ..Default::default()
    }
}

/// A decode step of `batch` sequences with contexts spread evenly over `lo..=hi` tokens (each
/// `lo` when they are equal) in a shuffled order, with blocks of their own.
fn decode_batch(batch: usize, (lo, hi): (usize, usize), block_size: usize) -> ForwardBatch {
    let per = (hi + 1).div_ceil(block_size);
    // Where a sequence's blocks lie (`TANDEM_BENCH_BLOCKS`): one run each (default);
    // `striped`, block i of sequence s at i·batch + s, as blocks taken one a step by every
    // sequence of a decode batch lie; `scattered`, a fixed permutation of the whole pool.
    let order = std::env::var("TANDEM_BENCH_BLOCKS").unwrap_or_default();
    let total = batch * per;
    let id = |s: usize, i: usize| -> u32 {
        match order.as_str() {
            "striped" => (i * batch + s) as u32,
            // 1,000,003 is prime and larger than any pool here: a permutation of 0..total.
            "scattered" => ((s * per + i) * 1_000_003 % total) as u32,
            _ => (s * per + i) as u32,
        }
    };
    let mut b = ForwardBatch::default();
    for s in 0..batch {
        // 7919 is prime, so s ↦ 7919·s mod batch is a permutation (batch < 7919).
        let rank = (s * 7919) % batch;
        let context = lo + (hi - lo) * rank / (batch - 1).max(1);
        let blocks: Vec<u32> = (0..(context + 1).div_ceil(block_size)).map(|i| id(s, i)).collect();
        b.push_seq(&[(s % 1000) as u32 + 1], context, &blocks, block_size, Logits::Last);
    }
    b
}

/// Decode steps of the model `cfg` (random weights) at each batch size, contexts spread over
/// `context` (`(lo, hi)`; equal for one length), on one GPU or (`tp` > 1) split across GPUs
/// `0..tp`; `lim` from [`group_limits`].
pub fn decode(
    cfg: &ModelConfig,
    batches: &[usize],
    context: (usize, usize),
    lim: &Limits,
    tp: usize,
) -> Result<Vec<DecodeRow>, CudaError> {
    let max_b = batches.iter().copied().max().unwrap_or(1);
    let hi = context.1.max(context.0);
    let context = (context.0, hi);
    let opts = decode_options(max_b, hi);
    let mut be = Under::open(cfg, tp, 1, opts)?;
    // What each GPU reads: its slice of the layers and of every KV block, and the head (whole,
    // or its slice where the group slices it).
    let local = Shard { rank: 0, size: tp.max(1) }.local_config(cfg);
    let kv_per_token = 2.0 * 2.0 * (local.num_layers * local.kv_size()) as f64;
    let mut rows = Vec::new();
    let mut gemm_tunings = Vec::new();
    for &batch in batches {
        let b = decode_batch(batch, context, decode_block());
        be.backend().forward(&b).map_err(|e| CudaError::Driver(e.to_string()))?;
        let step_ms = be.replay_ms(&b, 20)?;
        let (census, chained_ms) = match &mut be {
            Under::One(one) => {
                // Only this size's: the first step above captured its graph, tuning first.
                let all = one.gpu().gemm_tunings();
                gemm_tunings = all.into_iter().filter(|t| t.0 .0 == batch).collect();
                let census = one.graph_census(batch).map(|c| c.to_vec());
                one.set_replay_chain(10);
                let ms = one.replay_ms(&b, 10);
                one.set_replay_chain(0);
                (census, Some(ms?))
            }
            Under::Group(_) => (None, None),
        };
        let profile = be.profile(&b)?;
        be.set_mma_attention(false)?;
        let tile_step_ms = be.replay_ms(&b, 20)?;
        be.set_mma_attention(true)?;
        // The 16-row tensor-core kernel on the decode tiles, for comparison.
        be.set_dec_attention(false)?;
        let rows16_step_ms = be.replay_ms(&b, 20)?;
        let rows16_profile = be.profile(&b)?;
        be.set_dec_attention(true)?;
        be.set_fused_rope(false)?;
        let unfused_rope_ms = be.replay_ms(&b, 20)?;
        be.set_fused_rope(true)?;
        // Contexts of different lengths: the same step with the tiles in the batch's order.
        let batch_order_step_ms = match context.0 == context.1 {
            true => None,
            false => {
                be.set_longest_first(false)?;
                let ms = be.replay_ms(&b, 20)?;
                be.set_longest_first(true)?;
                Some(ms)
            }
        };
        // Every product on cuBLAS, where Tandem's own kernels took some (one row: gemv; 2–64:
        // gemm_stream).
        let cublas_step_ms = match &mut be {
            Under::One(one) if one.gpu().gemv_on() || one.gpu().stream_gemm_on() => {
                let (gemv, stream) = (one.gpu().gemv_on(), one.gpu().stream_gemm_on());
                let rows = one.gpu().stream_gemm_max_rows();
                let own = (batch == 1 && gemv) || ((2..=rows).contains(&batch) && stream);
                match own {
                    true => {
                        one.set_gemv(false);
                        one.set_stream_gemm(false);
                        let ms = one.replay_ms(&b, 20);
                        one.set_gemv(gemv);
                        one.set_stream_gemm(stream);
                        Some(ms?)
                    }
                    false => None,
                }
            }
            _ => None,
        };
        let all_reduce = match &mut be {
            Under::One(_) => None,
            Under::Group(g) => {
                let calls = 2 * cfg.num_layers;
                let (_, worst) = g.time_all_reduces(batch, calls, 20)?;
                Some((worst, g.all_reduce_path()))
            }
        };
        let positions: usize = b.seqs.iter().map(|s| s.context_len).sum();
        // A group whose ranks compute slices of the LM head reads it once between them.
        let head = (cfg.vocab_size * cfg.hidden_size) as f64;
        let head_saved = match &be {
            Under::Group(g) if g.head_sliced() => head * (1.0 - 1.0 / tp as f64),
            _ => 0.0,
        };
        let weights = 2.0 * (linear_params(&local) as f64 - head_saved);
        let kv = kv_per_token * positions as f64;
        let per_gpu = weights + kv;
        // Two FLOPs per weight and row, at one GPU's share of the group's measured peak.
        let gemm_s = weights * batch as f64 / (lim.gemm_flops / tp.max(1) as f64);
        let compute_bound_ms =
            ((weights / lim.hbm_bytes_per_s).max(gemm_s) + kv / lim.hbm_bytes_per_s) * 1e3;
        rows.push(DecodeRow {
            gemm_tunings: std::mem::take(&mut gemm_tunings),
            batch,
            context,
            step_ms,
            tile_step_ms,
            rows16: (rows16_step_ms, rows16_profile),
            unfused_rope_ms,
            batch_order_step_ms,
            cublas_step_ms,
            census,
            chained_ms,
            bytes: per_gpu * tp.max(1) as f64,
            roofline_ms: per_gpu / lim.hbm_bytes_per_s * 1e3,
            compute_bound_ms,
            profile,
            all_reduce,
        });
    }
    Ok(rows)
}

/// A decode step run as two independent halves at once on one GPU: for each batch size, the
/// whole step's graph, one half's, and two halves replayed together from two backends (each
/// with its own stream and its own copy of the weights), ms. What splitting a step into two
/// streams (nano-batching) would gain before any finer interleaving.
pub fn lanes(
    cfg: &ModelConfig,
    batches: &[usize],
    context: (usize, usize),
) -> Result<Vec<(usize, f64, f64, f64)>, CudaError> {
    let max_b = batches.iter().copied().max().unwrap_or(2).max(2);
    let hi = context.1.max(context.0);
    let context = (context.0, hi);
    let mut x =
        crate::load(0, Dtype::Bf16, cfg, WeightSource::Dummy(1), decode_options(max_b, hi))?;
    let mut y =
        crate::load(0, Dtype::Bf16, cfg, WeightSource::Dummy(1), decode_options(max_b / 2, hi))?;
    let mut rows = Vec::new();
    for &batch in batches.iter().filter(|&&b| b >= 2) {
        let whole = decode_batch(batch, context, decode_block());
        let half = decode_batch(batch / 2, context, decode_block());
        let whole_ms = x.replay_ms(&whole, 20)?;
        let half_ms = x.replay_ms(&half, 20)?;
        y.replay_ms(&half, 3)?;
        let pair_ms = x.replay_pair_ms(&mut y, &half, &half, 20)?;
        rows.push((batch, whole_ms, half_ms, pair_ms));
    }
    Ok(rows)
}

/// One decode step of `batch` sequences (contexts over `context`, as [`decode`]) replayed from
/// its graph on GPU 0: the median of 20 replays, ms, then one more replay between
/// `cuProfilerStart` and `cuProfilerStop`, so a profiler started with its collection off
/// (`ncu --profile-from-start off`) sees exactly one step's kernels.
pub fn step_for_profiler(
    cfg: &ModelConfig,
    batch: usize,
    context: (usize, usize),
) -> Result<f64, CudaError> {
    let hi = context.1.max(context.0);
    let opts = decode_options(batch, hi);
    let mut be = crate::load(0, Dtype::Bf16, cfg, WeightSource::Dummy(1), opts)?;
    let b = decode_batch(batch, (context.0, hi), decode_block());
    be.forward(&b).map_err(|e| CudaError::Driver(e.to_string()))?;
    let ms = be.replay_ms(&b, 20)?;
    // SAFETY: the profiler calls take no arguments and only mark a collection range.
    unsafe {
        cudarc::driver::sys::cuProfilerStart().result().map_err(CudaError::from)?;
    }
    be.replay_ms(&b, 1)?;
    unsafe {
        cudarc::driver::sys::cuProfilerStop().result().map_err(CudaError::from)?;
    }
    Ok(ms)
}

/// One prefill measurement.
#[derive(Debug, Clone)]
pub struct PrefillRow {
    /// Prompts in the batch.
    pub prompts: usize,
    /// Tokens of each.
    pub len: usize,
    /// Wall time of the forward pass with each prompt's next token chosen on the device (greedy),
    /// as the engine runs it, ms (median of 5).
    pub ms: f64,
    /// Attention on the prefill kernel: the same with its tiles started in the batch's order
    /// instead of longest context first, ms.
    pub batch_order_ms: Option<f64>,
    /// Attention on the prefill kernel: the same with every chunk on the small-tile kernel
    /// instead (as chunks shorter than `long_prompt_min_tokens` are), ms.
    pub small_tiles_ms: Option<f64>,
    /// FLOPs of the pass (linear layers, causal attention, LM head of the last rows).
    pub flops: f64,
    /// GPU time per stage, ms.
    pub profile: Vec<(&'static str, f64)>,
}

/// FLOPs of a prefill of `prompts × len` tokens.
pub fn prefill_flops(c: &ModelConfig, prompts: usize, len: usize) -> f64 {
    let tokens = (prompts * len) as f64;
    let lin = 2.0 * tokens * (linear_params(c) - c.vocab_size as u64 * c.hidden_size as u64) as f64;
    let head = 2.0 * prompts as f64 * (c.vocab_size * c.hidden_size) as f64;
    let pairs = prompts as f64 * (len * (len + 1) / 2) as f64;
    let attn = 4.0 * pairs * (c.num_heads * c.head_dim) as f64 * c.num_layers as f64;
    lin + head + attn
}

/// A prefill of `prompts` prompts of `len` tokens in one pass, on one GPU or (`tp` > 1) split
/// across GPUs `0..tp`; `mma`: attention on the tensor-core kernels (the flash-attention prefill
/// kernel for these long chunks), else on the CUDA-core tile kernel and cuBLAS GEMMs.
pub fn prefill(
    cfg: &ModelConfig,
    prompts: usize,
    len: usize,
    tp: usize,
    mma: bool,
) -> Result<PrefillRow, CudaError> {
    let bs = 16;
    let per = len.div_ceil(bs);
    let opts = CudaBackendOptions {
        num_blocks: Some(prompts * per),
        max_num_batched_tokens: prompts * len,
        max_model_len: len,
        max_graph_batch: 0,
        ..Default::default()
    };
    let mut be = Under::open(cfg, tp, 2, opts)?;
    be.set_mma_attention(mma)?;
    let mut b = ForwardBatch::default();
    for p in 0..prompts {
        let toks: Vec<u32> = (0..len as u32).map(|i| (i * 7 + p as u32 * 13) % 1000 + 1).collect();
        let blocks: Vec<u32> = (0..per as u32).map(|i| (p * per) as u32 + i).collect();
        b.push_seq(&toks, 0, &blocks, bs, Logits::Last);
    }
    // Each prompt's next token chosen on the device, greedily, as the engine's runner does:
    // only the tokens come back (copying every prompt's logits to the host would time the copy).
    let rows = vec![RowSampling::new(0.0, 0); b.logits_indices.len()];
    // Median of five passes after two untimed ones, ms.
    let median = |be: &mut Under| -> Result<f64, CudaError> {
        let mut ts = Vec::new();
        for i in 0..7 {
            let t = Instant::now();
            be.backend()
                .forward_sampled(&b, &rows, &mut Vec::new)
                .map_err(|e| CudaError::Driver(e.to_string()))?;
            if i >= 2 {
                ts.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        ts.sort_by(f64::total_cmp);
        Ok(ts[ts.len() / 2])
    };
    let ms = median(&mut be)?;
    let (batch_order_ms, small_tiles_ms) = match mma {
        true => {
            be.set_longest_first(false)?;
            let order = median(&mut be)?;
            be.set_longest_first(true)?;
            be.set_long_prompt_min(usize::MAX)?;
            let small = median(&mut be)?;
            be.set_long_prompt_min(CudaBackendOptions::default().long_prompt_min_tokens)?;
            (Some(order), Some(small))
        }
        false => (None, None),
    };
    let profile = be.profile(&b)?;
    Ok(PrefillRow {
        prompts,
        len,
        ms,
        batch_order_ms,
        small_tiles_ms,
        flops: prefill_flops(cfg, prompts, len),
        profile,
    })
}

/// One KV page transfer measurement between two GPUs.
#[derive(Debug, Clone)]
pub struct PagesRow {
    /// Pages moved.
    pub pages: usize,
    /// Bytes moved.
    pub bytes: usize,
    /// Gather, NCCL in chunks, scatter: receiver's time from the common start, ms (median of 5).
    pub paged_ms: f64,
    /// One raw NCCL send/recv of the same bytes between contiguous buffers, ms (median of 5).
    pub raw_ms: f64,
    /// Pages compared byte for byte after the transfer (first, middle, last) and how many differed.
    pub checked: usize,
    /// Of those, pages that differ.
    pub differing: usize,
    /// Checksums of those pages, on either side, that differ from the host's reference.
    pub bad_sums: usize,
}

/// Page ids `0..n` spread through a pool of `num_blocks` (distinct while `num_blocks` is prime
/// to `step`).
fn spread_blocks(n: usize, num_blocks: usize, step: usize, offset: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * step + offset) % num_blocks) as u32).collect()
}

/// KV pages of the model `cfg` (random contents, blocks of 16) from GPU 0 to GPU 1 over NCCL, a
/// thread per GPU as two processes would be: for each count, the paged transfer (gather, chunks
/// of `chunk_pages` pages through `stages` staging buffers, scatter into scattered blocks)
/// against one raw NCCL send/recv of the same bytes, and the moved pages and their checksums
/// checked.
pub fn pages(
    cfg: &ModelConfig,
    counts: &[usize],
    chunk_pages: usize,
    copy_ctas: usize,
    stages: usize,
) -> Result<Vec<PagesRow>, CudaError> {
    use crate::nccl::{DevicePool, PageLink, PoolView};
    use std::sync::{mpsc, Barrier};
    let max = counts.iter().copied().max().unwrap_or(1);
    let (bs, parts) = (16, 2 * cfg.num_layers);
    let block_elems = bs * cfg.kv_size();
    // A pool size prime to the spreading steps (7 and 5).
    let mut num_blocks = max + 16;
    while num_blocks % 7 == 0 || num_blocks % 5 == 0 {
        num_blocks += 1;
    }
    let id = crate::nccl::new_id()?;
    let barrier = Barrier::new(2);
    let (page_tx, page_rx) = mpsc::channel::<Vec<u16>>();
    let run = |rank: usize,
               page_tx: Option<mpsc::Sender<Vec<u16>>>,
               page_rx: Option<mpsc::Receiver<Vec<u16>>>|
     -> Result<Vec<PagesRow>, CudaError> {
        let gone = || CudaError::Unsupported("peer thread gone".into());
        let g = Gpu::open(rank, Dtype::Bf16)?;
        let pool = g.zeros::<u16>(parts * num_blocks * block_elems)?;
        if rank == 0 {
            let (p, len, seed, scale, konst) = (ptr(&pool), pool.len() as u64, 5u32, 1.0f32, 0i32);
            let cfg = cudarc::driver::LaunchConfig {
                grid_dim: (g.num_sms as u32 * 8, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: fill_random over the pool's elements.
            unsafe { g.launch(&g.k.fill_random, cfg, &[&p, &len, &seed, &scale, &konst])? };
        }
        let view = PoolView { base: ptr(&pool), parts, num_blocks, block_elems };
        let mut raw = g.zeros::<u8>(max * view.page_bytes())?;
        g.sync()?;
        let mut link =
            PageLink::connect(&DevicePool::new(&g, view), rank, id, chunk_pages, stages, max)?;
        link.set_copy_ctas(copy_ctas);
        let mut rows = Vec::new();
        for &n in counts {
            let blocks = if rank == 0 {
                spread_blocks(n, num_blocks, 7, 3)
            } else {
                spread_blocks(n, num_blocks, 5, 11)
            };
            let bytes = n * view.page_bytes();
            let mut paged = Vec::new();
            let mut rawt = Vec::new();
            for rep in 0..6 {
                barrier.wait();
                let t = Instant::now();
                if rank == 0 {
                    link.send_blocks(&blocks)?
                } else {
                    link.recv_blocks(&blocks)?
                }
                let ms = t.elapsed().as_secs_f64() * 1e3;
                barrier.wait();
                barrier.wait();
                let t = Instant::now();
                if rank == 0 {
                    link.send_raw(&raw, bytes)?
                } else {
                    link.recv_raw(&mut raw, bytes)?
                }
                let raw_ms = t.elapsed().as_secs_f64() * 1e3;
                if rep > 0 {
                    paged.push(ms);
                    rawt.push(raw_ms);
                }
            }
            paged.sort_by(f64::total_cmp);
            rawt.sort_by(f64::total_cmp);
            // The first, middle and last page, sender's against receiver's, and each side's
            // checksums (computed by the copy kernels) against the host's reference.
            let picks = [0, n / 2, n - 1];
            let sums = link.checksums(n)?;
            let (mut checked, mut differing, mut bad_sums) = (0, 0, 0);
            for &i in &picks {
                let page = crate::nccl::read_page(&g, &pool, &view, blocks[i] as usize)?;
                let bytes: Vec<u8> = page.iter().flat_map(|v| v.to_le_bytes()).collect();
                bad_sums +=
                    usize::from(tandem_kv_transfer::device::page_checksum(&bytes) != sums[i]);
                if let Some(tx) = &page_tx {
                    tx.send(page).map_err(|_| gone())?;
                } else if let Some(rx) = &page_rx {
                    let sent = rx.recv().map_err(|_| gone())?;
                    checked += 1;
                    differing += usize::from(sent != page);
                }
            }
            rows.push(PagesRow {
                pages: n,
                bytes,
                paged_ms: paged[paged.len() / 2],
                raw_ms: rawt[rawt.len() / 2],
                checked,
                differing,
                bad_sums,
            });
        }
        Ok(rows)
    };
    let (r0, r1) = std::thread::scope(|sc| {
        let run = &run;
        let h0 = sc.spawn(move || run(0, Some(page_tx), None));
        let h1 = sc.spawn(move || run(1, None, Some(page_rx)));
        (h0.join(), h1.join())
    });
    let sent = r0.map_err(|_| CudaError::Unsupported("sender thread panicked".into()))??;
    let mut rows = r1.map_err(|_| CudaError::Unsupported("receiver thread panicked".into()))??;
    for (r, s) in rows.iter_mut().zip(sent) {
        r.bad_sums += s.bad_sums;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama8b() -> ModelConfig {
        crate::dummy_config(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/llama-3-8b.json"),
        )
        .unwrap()
    }

    #[test]
    fn llama3_8b_shape_counts() {
        let c = llama8b();
        // 32 layers × 218.1M linear parameters + a 525M LM head: the published 8.03B less the
        // 525M embedding and the norms.
        let p = linear_params(&c);
        assert_eq!(
            p,
            32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336) + 128_256 * 4096
        );
        assert!((7.4e9..7.6e9).contains(&(p as f64)), "{p}");
        let b = decode_batch(3, (1024, 1024), 16);
        assert_eq!(b.seqs.len(), 3);
        assert_eq!(b.seqs[2].block_table[0], 2 * 65);
        // A spread: every context between the ends once, each with the blocks it needs.
        let b = decode_batch(5, (100, 500), 16);
        let mut ctx: Vec<usize> = b.seqs.iter().map(|s| s.context_len - 1).collect();
        ctx.sort();
        assert_eq!(ctx, vec![100, 200, 300, 400, 500]);
        assert!(b.seqs.iter().all(|s| s.block_table.len() == s.context_len.div_ceil(16)));
        assert!(prefill_flops(&c, 4, 2048) > 2.0 * 8192.0 * 6.9e9);
    }

    #[test]
    fn page_transfer_layout() {
        let c = llama8b();
        // A Llama-3-8B page: 32 layers × K and V × 16 positions × 8 KV heads × 128 dims × 2 bytes.
        let v = crate::nccl::PoolView {
            base: 0,
            parts: 2 * c.num_layers,
            num_blocks: 4113,
            block_elems: 16 * c.kv_size(),
        };
        assert_eq!(v.page_bytes(), 2 << 20);
        for (step, off) in [(7, 3), (5, 11)] {
            let b = spread_blocks(4096, 4113, step, off);
            let distinct: std::collections::HashSet<_> = b.iter().collect();
            assert_eq!(distinct.len(), 4096);
            assert!(b.iter().all(|&x| (x as usize) < 4113));
        }
    }
}
