//! The CPU backend: a Llama/Qwen3 decoder over a paged KV cache.
//!
//! One struct per sub-layer (`Attention`, `Mlp`, `DecoderLayer`) holds its weights, built from
//! [`ModelFiles`]; `CpuBackend::forward_layers` runs them over a [`ForwardBatch`], the matmuls
//! and attention on the thread pool ([`pool`]) and the row-wise steps (norms, rope, residuals,
//! SiLU) spread over it too. The linear layers sit behind the [`linear::Linear`] trait so that
//! quantised kernels can replace the exact f32 ones.

mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_x86;
pub mod head;
pub mod kv_cache;
pub mod linear;
pub mod ops;
pub mod pool;
pub mod profile;
pub mod quant;
#[cfg(target_arch = "x86_64")]
mod quant_x86;
mod repack_k;

use std::sync::Arc;

use crate::backend::{
    first_visible_block, BackendError, ForwardBatch, KernelPath, KvCacheSpec, KvGroups,
    ModelBackend, NO_PAGE,
};
use crate::model_files::config::{Activation, Arch, ModelConfig, RopeStyle};

use crate::model_files::dtype::GgmlType;
use crate::model_files::weights::ModelFiles;
use crate::LoadError;
use kv_cache::{on_pool, KvPool};
use linear::{ExactLinear, GroupMinLinear, Linear, QuantLinear, StackedLinear};
use ops::Rope;
use profile::{timed, Op};
use quant::{QKernel, QMatrix};

/// How to build a [`CpuBackend`].
#[derive(Debug, Clone, Copy)]
pub struct CpuBackendOptions {
    /// Kernels of the linear layers.
    pub kernel: KernelPath,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Number of KV blocks in the pool.
    pub num_blocks: usize,
    /// Number of host swap blocks.
    pub num_host_blocks: usize,
    /// Group sliding-window layers into KV pages of their own, so that the pages their window
    /// has passed are given back ([`KvGroups`]); off: one page holds every layer.
    pub hybrid_kv: bool,
    /// K and V in IEEE half (half the memory and the bandwidth attention reads); off: f32.
    pub half_kv: bool,
}

/// Loads one or more weight matrices with the same input width as one fused linear layer
/// (rows stacked in order). The fast path keeps weights quantised: one matrix when every part
/// has the same quantised format, else a [`StackedLinear`] of the parts; Q2_K parts as one
/// [`GroupMinLinear`]; types without an integer format (and the exact path) are dequantised to
/// f32.
fn load_fused(
    files: &ModelFiles,
    parts: &[(String, usize)],
    k: usize,
    kernel: KernelPath,
) -> Result<Arc<dyn Linear>, LoadError> {
    let tensors = parts
        .iter()
        .map(|(name, n)| files.require(name, &[*n, k]))
        .collect::<Result<Vec<_>, _>>()?;
    let n_total: usize = parts.iter().map(|p| p.1).sum();
    if kernel == KernelPath::Fast {
        if tensors.iter().all(|t| t.dtype == GgmlType::Q2_K) {
            // Parts stacked as one matrix of values and one of group minimums (rows in order).
            let q2: Option<Vec<(QMatrix, Vec<f32>)>> =
                tensors.iter().map(|t| QMatrix::from_q2_k(t.bytes, t.shape[0], k)).collect();
            if let Some(q2) = q2 {
                let (mats, mins): (Vec<QMatrix>, Vec<Vec<f32>>) = q2.into_iter().unzip();
                let m = if mats.len() == 1 {
                    mats.into_iter().next().expect("one part")
                } else {
                    QMatrix::concat(&mats)
                };
                let mins = mins.concat();
                return Ok(Arc::new(GroupMinLinear::new(Arc::new(m), mins, QKernel::detect())));
            }
        }
        let mats: Option<Vec<QMatrix>> =
            tensors.iter().map(|t| QMatrix::from_gguf(t.dtype, t.bytes, t.shape[0], k)).collect();
        if let Some(mats) = mats {
            if mats.iter().all(|m| m.format == mats[0].format) {
                let m = if mats.len() == 1 {
                    mats.into_iter().next().expect("one part")
                } else {
                    QMatrix::concat(&mats)
                };
                return Ok(Arc::new(QuantLinear::new(Arc::new(m), QKernel::detect())));
            }
        }
    }
    if kernel == KernelPath::Fast && tensors.len() > 1 {
        // Parts of different formats: each on its own kernel.
        let parts = parts
            .iter()
            .map(|p| load_fused(files, std::slice::from_ref(p), k, kernel))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Arc::new(StackedLinear::new(parts)));
    }
    let mut w = Vec::with_capacity(n_total * k);
    for t in &tensors {
        w.extend(t.to_f32());
    }
    Ok(Arc::new(ExactLinear::new(w.into(), n_total, k)))
}

fn load_vec(files: &ModelFiles, name: &str, n: usize) -> Result<Vec<f32>, LoadError> {
    Ok(files.require(name, &[n])?.to_f32())
}

/// An RMSNorm weight, with the model's offset added (Hugging Face Gemma stores `w` for `1 + w`).
fn load_norm(
    files: &ModelFiles,
    cfg: &ModelConfig,
    name: &str,
    n: usize,
) -> Result<Vec<f32>, LoadError> {
    let mut w = load_vec(files, name, n)?;
    if cfg.norm_offset != 0.0 {
        w.iter_mut().for_each(|x| *x += cfg.norm_offset);
    }
    Ok(w)
}

/// The token embedding table, f32 or quantised (shared with a tied LM head).
enum Embedding {
    F32(Arc<[f32]>),
    Quant(Arc<QMatrix>),
}

impl Embedding {
    fn row(&self, tok: usize, h: usize, out: &mut [f32]) {
        match self {
            Embedding::F32(w) => out.copy_from_slice(&w[tok * h..(tok + 1) * h]),
            Embedding::Quant(m) => m.row_f32(tok, out),
        }
    }
}

struct Attention {
    /// Fused q, k and v projections: `[q_size + 2 · kv_size, hidden]`.
    qkv: Arc<dyn Linear>,
    /// Their biases, q then k then v (Qwen2).
    qkv_bias: Option<Vec<f32>>,
    o: Arc<dyn Linear>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
}

struct Mlp {
    /// Fused gate and up projections: `[2 · intermediate, hidden]`.
    gate_up: Arc<dyn Linear>,
    down: Arc<dyn Linear>,
}

struct DecoderLayer {
    attn_norm: Vec<f32>,
    attn: Attention,
    /// Norm of the attention output before the residual add (Gemma 3).
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    mlp: Mlp,
    /// Norm of the MLP output before the residual add (Gemma 3).
    post_ffn_norm: Option<Vec<f32>>,
    /// Positions a local layer attends to (`None`: every position). Local layers use
    /// `CpuBackend::rope_local` when there is one.
    window: Option<usize>,
}

/// The model on CPU with its KV cache.
pub struct CpuBackend {
    cfg: ModelConfig,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    lm_head: Arc<dyn Linear>,
    rope: Rope,
    /// RoPE of the sliding-window layers, only when their base differs from `rope`'s (Gemma 3).
    rope_local: Option<Rope>,
    kv: KvPool,
    /// How layers share the cache's pages.
    kv_groups: KvGroups,
    simd: bool,
    /// Working buffers of `forward`, kept between calls so a step allocates nothing once the
    /// largest batch has been seen.
    scratch: Scratch,
    /// The linear layers' kernel path.
    kernel: KernelPath,
}

/// The forward pass's working buffers.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    hbuf: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    cos_local: Vec<f32>,
    sin_local: Vec<f32>,
    c1: Vec<f32>,
    s1: Vec<f32>,
    sel: Vec<f32>,
    tok_seq: Vec<usize>,
    /// A logits buffer handed back by [`ModelBackend::recycle_logits`], for the next step.
    logits: Vec<f32>,
}

/// The largest logits buffer kept for reuse: a decode batch's (Gemma 3's 262,144 entries × 32
/// rows is 32 MiB), not a scoring pass's logits of every prompt token.
const SPARE_LOGITS_MAX_BYTES: usize = 128 << 20;

/// `v` resized to `n` zeros, reusing its capacity.
fn zeroed(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.clear();
    v.resize(n, 0.0);
    v
}

impl CpuBackend {
    /// Loads every weight of `cfg`'s architecture from `files`.
    pub fn load(
        files: &ModelFiles,
        cfg: &ModelConfig,
        opts: CpuBackendOptions,
    ) -> Result<CpuBackend, LoadError> {
        let (h, q, kv, ff) = (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size);
        let kp = opts.kernel;
        if opts.block_size == 0 || opts.num_blocks == 0 {
            return Err(LoadError::Config(
                "KV cache needs a positive block size and block count".into(),
            ));
        }
        let embd = files.require("token_embd.weight", &[cfg.vocab_size, h])?;
        let quant_embd = if kp == KernelPath::Fast {
            QMatrix::from_gguf(embd.dtype, embd.bytes, cfg.vocab_size, h)
        } else {
            None
        };
        let (embed, tied_head): (Embedding, Option<Arc<dyn Linear>>) = match quant_embd {
            Some(m) => {
                let m = Arc::new(m);
                let head: Arc<dyn Linear> =
                    Arc::new(QuantLinear::new(m.clone(), QKernel::detect()));
                (Embedding::Quant(m), Some(head))
            }
            None => {
                let w: Arc<[f32]> = embd.to_f32().into();
                let head: Arc<dyn Linear> =
                    Arc::new(ExactLinear::new(w.clone(), cfg.vocab_size, h));
                (Embedding::F32(w), Some(head))
            }
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            let qk_norm = cfg.qk_norm;
            let post = |name: &str| -> Result<Option<Vec<f32>>, LoadError> {
                cfg.post_norms.then(|| load_norm(files, cfg, &p(name), h)).transpose()
            };
            layers.push(DecoderLayer {
                post_attn_norm: post("post_attention_norm")?,
                post_ffn_norm: post("post_ffw_norm")?,
                window: cfg.layer_window(i),
                attn_norm: load_norm(files, cfg, &p("attn_norm"), h)?,
                attn: Attention {
                    qkv: if files.tensor(&p("attn_qkv")).is_some() {
                        load_fused(files, &[(p("attn_qkv"), q + 2 * kv)], h, kp)?
                    } else {
                        load_fused(
                            files,
                            &[(p("attn_q"), q), (p("attn_k"), kv), (p("attn_v"), kv)],
                            h,
                            kp,
                        )?
                    },
                    qkv_bias: if cfg.attn_bias {
                        let b = |s: &str, n| load_vec(files, &format!("blk.{i}.{s}.bias"), n);
                        Some([b("attn_q", q)?, b("attn_k", kv)?, b("attn_v", kv)?].concat())
                    } else {
                        None
                    },
                    o: load_fused(files, &[(p("attn_output"), h)], q, kp)?,
                    q_norm: if qk_norm {
                        Some(load_norm(files, cfg, &p("attn_q_norm"), cfg.head_dim)?)
                    } else {
                        None
                    },
                    k_norm: if qk_norm {
                        Some(load_norm(files, cfg, &p("attn_k_norm"), cfg.head_dim)?)
                    } else {
                        None
                    },
                },
                ffn_norm: load_norm(files, cfg, &p("ffn_norm"), h)?,
                mlp: Mlp {
                    gate_up: if files.tensor(&p("ffn_gate_up")).is_some() {
                        load_fused(files, &[(p("ffn_gate_up"), 2 * ff)], h, kp)?
                    } else if cfg.arch == Arch::Phi3 {
                        // GGUF keeps Phi-3's fused gate|up under the up projection's name.
                        load_fused(files, &[(p("ffn_up"), 2 * ff)], h, kp)?
                    } else {
                        load_fused(files, &[(p("ffn_gate"), ff), (p("ffn_up"), ff)], h, kp)?
                    },
                    down: load_fused(files, &[(p("ffn_down"), h)], ff, kp)?,
                },
            });
        }
        let lm_head = match (cfg.tie_word_embeddings, tied_head) {
            (true, Some(head)) => head,
            _ => load_fused(files, &[("output.weight".to_string(), cfg.vocab_size)], h, kp)?,
        }
        .into_lm_head();
        let kv_groups = KvGroups::for_model(cfg, opts.hybrid_kv);
        Ok(CpuBackend {
            kernel: kp,
            cfg: cfg.clone(),
            embed,
            norm: load_norm(files, cfg, "output_norm.weight", h)?,
            lm_head,
            rope: Rope::new(cfg.head_dim, cfg.rope_theta, cfg.rope_style == RopeStyle::Interleaved),
            rope_local: cfg.sliding_window.filter(|w| w.local_rope_theta != cfg.rope_theta).map(
                |w| {
                    Rope::new(
                        cfg.head_dim,
                        w.local_rope_theta,
                        cfg.rope_style == RopeStyle::Interleaved,
                    )
                },
            ),
            layers,
            kv: {
                let mut pool = KvPool::new(
                    opts.half_kv,
                    kv_groups.layers_per_page,
                    opts.num_blocks,
                    opts.block_size,
                    kv,
                    pads_blocks(&kv_groups),
                    opts.num_host_blocks,
                );
                pool.prefault(pool::ThreadPool::global());
                pool
            },
            kv_groups,
            simd: simd_available(),
            scratch: Scratch::default(),
        })
    }

    /// Bytes of memory one block (page) takes in this backend's pool for `cfg` (K and V in
    /// IEEE half where `half_kv`, else f32, and the spare row of interleaved groups' blocks).
    pub fn kv_bytes_per_block(
        cfg: &ModelConfig,
        block_size: usize,
        hybrid: bool,
        half_kv: bool,
    ) -> usize {
        let groups = KvGroups::for_model(cfg, hybrid);
        let rows = block_size + usize::from(pads_blocks(&groups));
        KvPool::block_bytes(half_kv, groups.layers_per_page, rows, cfg.kv_size())
    }

    fn validate(&self, b: &ForwardBatch) -> Result<(), BackendError> {
        let bad = |m: String| Err(BackendError::InvalidBatch(m));
        let t = b.token_ids.len();
        let groups = self.kv_groups.num_groups();
        b.check_layout(groups, self.cfg.vocab_size)?;
        if !b.deferred.is_empty() {
            return bad("this backend takes no deferred tokens (it does not overlap steps)".into());
        }
        if let Some(&s) = b.slot_mapping.iter().find(|&&s| s as usize >= self.kv.num_slots()) {
            return bad(format!("slot {s} outside the KV cache of {} slots", self.kv.num_slots()));
        }
        // Tokens write their K and V in parallel: each needs a slot of its own.
        let mut slots = b.slot_mapping.clone();
        slots.sort_unstable();
        if let Some(w) = slots.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("slot {} is written by two tokens of the batch", w[0]));
        }
        if let Some(&i) = b.logits_indices.iter().find(|&&i| i >= t) {
            return bad(format!("logits index {i} outside the batch of {t} tokens"));
        }
        let bs = self.kv.block_size();
        let mut covered = 0;
        for s in &b.seqs {
            if s.query_start != covered || s.query_len == 0 || s.query_len > s.context_len {
                return bad(format!("sequence slice {s:?} does not tile the batch"));
            }
            if s.context_len.div_ceil(bs) * groups > s.block_table.len() {
                return bad(format!(
                    "context of {} tokens needs more than {} pages",
                    s.context_len,
                    s.block_table.len()
                ));
            }
            // Every page a layer reads: global groups' from the start, local groups' from the
            // first position the sequence's first query sees.
            let first = s.context_len - s.query_len;
            for (g, window) in self.kv_groups.windows.iter().enumerate() {
                let read_from = first_visible_block(*window, first, bs);
                let pages = s.block_table.iter().skip(g).step_by(groups);
                for (i, &blk) in pages.enumerate() {
                    if blk == NO_PAGE && i >= read_from && i * bs < s.context_len {
                        return bad(format!(
                            "page of block {i}, KV group {g} is read but was given back"
                        ));
                    }
                    if blk != NO_PAGE && blk as usize >= self.kv.num_blocks() {
                        return bad(format!(
                            "block {blk} outside the pool of {}",
                            self.kv.num_blocks()
                        ));
                    }
                }
            }
            for i in 0..s.query_len {
                if b.positions[s.query_start + i] as usize != s.context_len - s.query_len + i {
                    return bad(format!(
                        "positions of the sequence at {} are not contiguous up to its context",
                        s.query_start
                    ));
                }
            }
            covered += s.query_len;
        }
        if covered != t {
            return bad(format!("sequences cover {covered} of {t} tokens"));
        }
        Ok(())
    }
}

/// A task of [`par_rows`]: a range of token rows and each buffer's part for them.
type RowTask<'a, const N: usize> = dyn Fn(std::ops::Range<usize>, [&mut [f32]; N]) + Sync + 'a;

/// Runs `f(rows, parts)` over chunks of `t` token rows, on the CPU pool when there are enough
/// rows to be worth it. Each `(buffer, width)` of `bufs` is handed to `f` as the sub-slice of
/// the chunk's rows (`rows.len() × width` floats), so tasks write disjoint parts.
fn par_rows<const N: usize>(t: usize, bufs: &mut [(&mut [f32], usize); N], f: &RowTask<'_, N>) {
    let pool = pool::ThreadPool::global();
    let ptrs: [(pool::OutPtr, usize); N] =
        std::array::from_fn(|i| (pool::OutPtr(bufs[i].0.as_mut_ptr()), bufs[i].1));
    for (buf, width) in bufs.iter() {
        assert!(buf.len() >= t * width, "row buffer too small");
    }
    let chunk = if t < 16 { t.max(1) } else { t.div_ceil(pool.num_threads() * 2) };
    pool.run(t.div_ceil(chunk), &|c| {
        let rows = c * chunk..((c + 1) * chunk).min(t);
        // SAFETY: chunks are disjoint row ranges within buffers of at least t rows (checked above).
        let parts = ptrs.map(|(p, w)| unsafe {
            std::slice::from_raw_parts_mut(p.get().add(rows.start * w), rows.len() * w)
        });
        f(rows, parts);
    });
}

/// `x += out` over `t` rows of width `h`, with `out` normalised first when the layer has a
/// post-norm (Gemma 3's sandwich norms).
fn add_residual(
    t: usize,
    h: usize,
    x: &mut [f32],
    out: &mut [f32],
    norm: Option<&[f32]>,
    eps: f32,
) {
    if let Some(w) = norm {
        par_rows(t, &mut [(&mut *out, h)], &|_, [o]| ops::rms_norm_inplace(o, w, eps));
    }
    let out = &*out;
    par_rows(t, &mut [(&mut *x, h)], &|r, [xr]| {
        xr.iter_mut().zip(&out[r.start * h..r.end * h]).for_each(|(a, b)| *a += b)
    });
}

/// Whether the pool gives every block a spare row: when several KV groups share it, so that a
/// group's pages, a fixed number of blocks apart, do not all map onto the same cache sets
/// (`kv_cache.rs`).
fn pads_blocks(groups: &KvGroups) -> bool {
    groups.num_groups() > 1
}

fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl CpuBackend {
    fn check_pairs(
        &self,
        pairs: &[(u32, u32)],
        src_limit: usize,
        dst_limit: usize,
    ) -> Result<(), BackendError> {
        match pairs.iter().find(|(s, d)| *s as usize >= src_limit || *d as usize >= dst_limit) {
            Some(p) => Err(BackendError::InvalidBatch(format!("block pair {p:?} out of range"))),
            None => Ok(()),
        }
    }
}

impl ModelBackend for CpuBackend {
    fn device(&self) -> String {
        let threads = pool::ThreadPool::global().num_threads();
        match self.kernel {
            KernelPath::Fast => format!("cpu: {:?} kernels, {threads} threads", QKernel::detect()),
            KernelPath::Exact => format!("cpu: exact f32 kernels, {threads} threads"),
        }
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.check_pairs(pairs, self.kv.num_blocks(), self.kv.num_blocks())?;
        for &(s, d) in pairs {
            self.kv.copy_block(s as usize, d as usize);
        }
        Ok(())
    }

    fn swap_out(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.check_pairs(pairs, self.kv.num_blocks(), self.kv.num_host_blocks())?;
        for &(d, h) in pairs {
            self.kv.save_to_host(d as usize, h as usize);
        }
        Ok(())
    }

    fn swap_in(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.check_pairs(pairs, self.kv.num_host_blocks(), self.kv.num_blocks())?;
        for &(h, d) in pairs {
            self.kv.load_from_host(h as usize, d as usize);
        }
        Ok(())
    }

    fn num_host_blocks(&self) -> usize {
        self.kv.num_host_blocks()
    }

    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError> {
        if block as usize >= self.kv.num_blocks() {
            return Err(BackendError::InvalidBatch(format!(
                "block {block} outside the pool of {}",
                self.kv.num_blocks()
            )));
        }
        let mut out = Vec::with_capacity(self.kv.bytes_per_block());
        self.kv.read_page(block as usize, &mut out);
        Ok(out)
    }

    fn write_block(&mut self, block: u32, page: &[u8]) -> Result<(), BackendError> {
        if block as usize >= self.kv.num_blocks() {
            return Err(BackendError::InvalidBatch(format!(
                "block {block} outside the pool of {}",
                self.kv.num_blocks()
            )));
        }
        if page.len() != self.kv.bytes_per_block() {
            return Err(BackendError::InvalidBatch(format!(
                "page of {} bytes, blocks hold {}",
                page.len(),
                self.kv.bytes_per_block()
            )));
        }
        self.kv.write_page(block as usize, page);
        Ok(())
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn kv_groups(&self) -> KvGroups {
        self.kv_groups.clone()
    }

    fn kv_cache_spec(&self) -> KvCacheSpec {
        KvCacheSpec {
            num_blocks: self.kv.num_blocks(),
            block_size: self.kv.block_size(),
            bytes_per_block: self.kv.bytes_per_block(),
            pool_bytes_per_block: self.kv.pool_bytes_per_block(),
        }
    }

    fn forward(&mut self, b: &ForwardBatch) -> Result<Vec<f32>, BackendError> {
        self.forward_layers(b, self.layers.len())
    }

    fn recycle_logits(&mut self, buf: Vec<f32>) {
        if buf.capacity() * size_of::<f32>() <= SPARE_LOGITS_MAX_BYTES {
            self.scratch.logits = buf;
        }
    }

    fn forward_layers(
        &mut self,
        b: &ForwardBatch,
        num_layers: usize,
    ) -> Result<Vec<f32>, BackendError> {
        self.validate(b)?;
        let _forward = profile::span(Op::Forward);
        let embed = profile::span(Op::Embed);
        let num_layers = num_layers.min(self.layers.len());
        let cfg = &self.cfg;
        let (h, qs, kvs, ff) =
            (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size);
        let (eps, half, vocab) = (cfg.rms_norm_eps, cfg.head_dim / 2, cfg.vocab_size);
        let t = b.num_tokens();
        let qkv_w = qs + 2 * kvs;
        let mut sc = std::mem::take(&mut self.scratch);
        let Scratch {
            x,
            hbuf,
            qkv,
            q,
            att,
            proj,
            gate_up,
            act,
            cos,
            sin,
            cos_local,
            sin_local,
            c1,
            s1,
            sel,
            tok_seq,
            logits: spare_logits,
        } = &mut sc;
        let x = zeroed(x, t * h);
        for (i, &tok) in b.token_ids.iter().enumerate() {
            self.embed.row(tok as usize, h, &mut x[i * h..(i + 1) * h]);
        }
        if cfg.embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= cfg.embedding_scale);
        }
        let hbuf = zeroed(hbuf, t * h);
        let qkv = zeroed(qkv, t * qkv_w);
        let q = zeroed(q, t * qs);
        let att = zeroed(att, t * qs);
        let proj = zeroed(proj, t * h);
        let gate_up = zeroed(gate_up, t * 2 * ff);
        let act = zeroed(act, t * ff);
        tok_seq.clear();
        tok_seq.resize(t, 0);
        for (si, s) in b.seqs.iter().enumerate() {
            tok_seq[s.query_start..s.query_start + s.query_len].fill(si);
        }
        // Rotary angles per token, shared by every layer (of each RoPE base).
        let (cos, sin) = (zeroed(cos, t * half), zeroed(sin, t * half));
        let nl = if self.rope_local.is_some() { t * half } else { 0 };
        let (cos_l, sin_l) = (zeroed(cos_local, nl), zeroed(sin_local, nl));
        for ti in 0..t {
            self.rope.angles(b.positions[ti], c1, s1);
            cos[ti * half..(ti + 1) * half].copy_from_slice(c1);
            sin[ti * half..(ti + 1) * half].copy_from_slice(s1);
            if let Some(rope) = &self.rope_local {
                rope.angles(b.positions[ti], c1, s1);
                cos_l[ti * half..(ti + 1) * half].copy_from_slice(c1);
                sin_l[ti * half..(ti + 1) * half].copy_from_slice(s1);
            }
        }
        drop(embed);
        for li in 0..num_layers {
            let layer = &self.layers[li];
            let local = layer.window.is_some() && self.rope_local.is_some();
            let (cos, sin) = if local { (&*cos_l, &*sin_l) } else { (&*cos, &*sin) };
            timed(Op::Norm, || {
                par_rows(t, &mut [(&mut *hbuf, h)], &|r, [hb]| {
                    ops::rms_norm(&x[r.start * h..r.end * h], &layer.attn_norm, eps, hb)
                });
            });
            timed(Op::Qkv, || {
                layer.attn.qkv.forward(hbuf, t, qkv);
            });
            let (kv_group, kv_layer) = self.kv_groups.layer_slot[li];
            let groups = self.kv_groups.num_groups();
            let kv_rows = self.kv.layer_writer(kv_layer);
            timed(Op::Rope, || {
                par_rows(t, &mut [(&mut *qkv, qkv_w), (&mut *q, qs)], &|r, [qkv_rows, q_rows]| {
                    for (i, ti) in r.enumerate() {
                        let row = &mut qkv_rows[i * qkv_w..(i + 1) * qkv_w];
                        if let Some(bias) = &layer.attn.qkv_bias {
                            row.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
                        }
                        let (qr, rest) = row.split_at_mut(qs);
                        let kr = &mut rest[..kvs];
                        if let (Some(qn), Some(kn)) = (&layer.attn.q_norm, &layer.attn.k_norm) {
                            ops::rms_norm_inplace(qr, qn, eps);
                            ops::rms_norm_inplace(kr, kn, eps);
                        }
                        let (c, sn) =
                            (&cos[ti * half..(ti + 1) * half], &sin[ti * half..(ti + 1) * half]);
                        self.rope.apply_with(qr, c, sn);
                        self.rope.apply_with(kr, c, sn);
                        q_rows[i * qs..(i + 1) * qs].copy_from_slice(qr);
                        let (kr, vr) = rest.split_at(kvs);
                        // SAFETY: `validate` checked that every token has a slot of its own;
                        // the cache is not read until this region has ended.
                        unsafe {
                            kv_rows.write(b.slot_mapping[ti * groups + kv_group] as usize, kr, vr)
                        };
                    }
                });
            });
            timed(Op::Attention, || {
                on_pool!(&self.kv, kv => attention::attend(
                    &self.cfg,
                    kv,
                    self.layers[li].window,
                    self.simd,
                    (kv_group, groups, kv_layer),
                    q,
                    b,
                    tok_seq,
                    att,
                ));
            });
            let layer = &self.layers[li];
            timed(Op::OProj, || {
                layer.attn.o.forward(att, t, proj);
            });
            timed(Op::Residual, || {
                add_residual(t, h, x, proj, layer.post_attn_norm.as_deref(), eps);
            });
            timed(Op::Norm, || {
                par_rows(t, &mut [(&mut *hbuf, h)], &|r, [hb]| {
                    ops::rms_norm(&x[r.start * h..r.end * h], &layer.ffn_norm, eps, hb)
                });
            });
            timed(Op::GateUp, || {
                layer.mlp.gate_up.forward(hbuf, t, gate_up);
            });
            timed(Op::Act, || {
                par_rows(t, &mut [(&mut *act, ff)], &|r, [act_rows]| {
                    for (i, ti) in r.enumerate() {
                        let row = &gate_up[ti * 2 * ff..(ti + 1) * 2 * ff];
                        let a = &mut act_rows[i * ff..(i + 1) * ff];
                        a.copy_from_slice(&row[..ff]);
                        match cfg.hidden_act {
                            Activation::Silu => ops::silu_mul(a, &row[ff..]),
                            Activation::GeluTanh => ops::gelu_tanh_mul(a, &row[ff..]),
                        }
                    }
                });
            });
            timed(Op::Down, || {
                layer.mlp.down.forward(act, t, proj);
            });
            timed(Op::Residual, || {
                add_residual(t, h, x, proj, layer.post_ffn_norm.as_deref(), eps);
            });
        }
        let _head = profile::span(Op::LmHead);
        let rows = b.logits_indices.len();
        let sel = zeroed(sel, rows * h);
        for (r, &i) in b.logits_indices.iter().enumerate() {
            ops::rms_norm(&x[i * h..(i + 1) * h], &self.norm, eps, &mut sel[r * h..(r + 1) * h]);
        }
        // Every entry is written by the head: a reused buffer keeps its stale values until then,
        // and only a longer one is zero-extended.
        let mut logits = std::mem::take(spare_logits);
        logits.resize(rows * vocab, 0.0);
        self.lm_head.forward_logits(sel, rows, &b.logits_exact, &mut logits);
        self.scratch = sc;
        Ok(logits)
    }
}
