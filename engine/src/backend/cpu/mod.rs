//! The CPU backend: a Llama/Qwen3 decoder over a paged KV cache.
//!
//! One struct per sub-layer (`Attention`, `Mlp`, `DecoderLayer`), each built from
//! [`ModelFiles`] and run over a [`ForwardBatch`]. The linear layers sit behind the
//! [`linear::Linear`] trait so that quantised kernels can replace the exact f32 ones.

pub mod kv_cache;
pub mod linear;
pub mod ops;

use std::sync::Arc;

use rayon::prelude::*;

use crate::backend::{BackendError, ForwardBatch, KernelPath, KvCacheSpec, ModelBackend};
use crate::config::{Arch, ModelConfig, RopeStyle};
use crate::weights::ModelFiles;
use crate::LoadError;
use kv_cache::CpuKvCache;
use linear::{ExactLinear, Linear};
use ops::Rope;

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
}

fn load_linear(files: &ModelFiles, name: &str, n: usize, k: usize, _kernel: KernelPath) -> Result<Box<dyn Linear>, LoadError> {
    let t = files.require(name, &[n, k])?;
    Ok(Box::new(ExactLinear::new(t.to_f32().into(), n, k)))
}

fn load_vec(files: &ModelFiles, name: &str, n: usize) -> Result<Vec<f32>, LoadError> {
    Ok(files.require(name, &[n])?.to_f32())
}

struct Attention {
    q: Box<dyn Linear>,
    k: Box<dyn Linear>,
    v: Box<dyn Linear>,
    o: Box<dyn Linear>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
}

struct Mlp {
    gate: Box<dyn Linear>,
    up: Box<dyn Linear>,
    down: Box<dyn Linear>,
}

struct DecoderLayer {
    attn_norm: Vec<f32>,
    attn: Attention,
    ffn_norm: Vec<f32>,
    mlp: Mlp,
}

/// The model on CPU with its KV cache.
pub struct CpuBackend {
    cfg: ModelConfig,
    embed: Arc<[f32]>,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    lm_head: Box<dyn Linear>,
    rope: Rope,
    kv: CpuKvCache,
}

impl CpuBackend {
    /// Loads every weight of `cfg`'s architecture from `files`.
    pub fn load(files: &ModelFiles, cfg: &ModelConfig, opts: CpuBackendOptions) -> Result<CpuBackend, LoadError> {
        let (h, q, kv, ff) = (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size);
        let kp = opts.kernel;
        let embed: Arc<[f32]> = files.require("token_embd.weight", &[cfg.vocab_size, h])?.to_f32().into();
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            let qk_norm = cfg.arch == Arch::Qwen3;
            layers.push(DecoderLayer {
                attn_norm: load_vec(files, &p("attn_norm"), h)?,
                attn: Attention {
                    q: load_linear(files, &p("attn_q"), q, h, kp)?,
                    k: load_linear(files, &p("attn_k"), kv, h, kp)?,
                    v: load_linear(files, &p("attn_v"), kv, h, kp)?,
                    o: load_linear(files, &p("attn_output"), h, q, kp)?,
                    q_norm: if qk_norm { Some(load_vec(files, &p("attn_q_norm"), cfg.head_dim)?) } else { None },
                    k_norm: if qk_norm { Some(load_vec(files, &p("attn_k_norm"), cfg.head_dim)?) } else { None },
                },
                ffn_norm: load_vec(files, &p("ffn_norm"), h)?,
                mlp: Mlp {
                    gate: load_linear(files, &p("ffn_gate"), ff, h, kp)?,
                    up: load_linear(files, &p("ffn_up"), ff, h, kp)?,
                    down: load_linear(files, &p("ffn_down"), h, ff, kp)?,
                },
            });
        }
        let lm_head: Box<dyn Linear> = if cfg.tie_word_embeddings {
            Box::new(ExactLinear::new(embed.clone(), cfg.vocab_size, h))
        } else {
            load_linear(files, "output.weight", cfg.vocab_size, h, kp)?
        };
        if opts.block_size == 0 || opts.num_blocks == 0 {
            return Err(LoadError::Config("KV cache needs a positive block size and block count".into()));
        }
        Ok(CpuBackend {
            cfg: cfg.clone(),
            embed,
            norm: load_vec(files, "output_norm.weight", h)?,
            lm_head,
            rope: Rope::new(cfg.head_dim, cfg.rope_theta, cfg.rope_style == RopeStyle::Interleaved),
            layers,
            kv: CpuKvCache::new(cfg.num_layers, opts.num_blocks, opts.block_size, kv).with_host_blocks(opts.num_host_blocks),
        })
    }

    /// Bytes of KV cache one block takes for `cfg` in this backend (f32 K and V).
    pub fn kv_bytes_per_block(cfg: &ModelConfig, block_size: usize) -> usize {
        2 * cfg.num_layers * block_size * cfg.kv_size() * std::mem::size_of::<f32>()
    }

    fn validate(&self, b: &ForwardBatch) -> Result<(), BackendError> {
        let bad = |m: String| Err(BackendError::InvalidBatch(m));
        let t = b.token_ids.len();
        if b.positions.len() != t || b.slot_mapping.len() != t {
            return bad(format!("{t} tokens but {} positions and {} slots", b.positions.len(), b.slot_mapping.len()));
        }
        if let Some(&tok) = b.token_ids.iter().find(|&&x| x as usize >= self.cfg.vocab_size) {
            return bad(format!("token id {tok} outside the vocabulary of {}", self.cfg.vocab_size));
        }
        if let Some(&s) = b.slot_mapping.iter().find(|&&s| s as usize >= self.kv.num_slots()) {
            return bad(format!("slot {s} outside the KV cache of {} slots", self.kv.num_slots()));
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
            if s.context_len.div_ceil(bs) > s.block_table.len() {
                return bad(format!("context of {} tokens needs more than {} blocks", s.context_len, s.block_table.len()));
            }
            if let Some(&blk) = s.block_table.iter().find(|&&x| x as usize >= self.kv.num_blocks()) {
                return bad(format!("block {blk} outside the pool of {}", self.kv.num_blocks()));
            }
            for i in 0..s.query_len {
                if b.positions[s.query_start + i] as usize != s.context_len - s.query_len + i {
                    return bad(format!("positions of the sequence at {} are not contiguous up to its context", s.query_start));
                }
            }
            covered += s.query_len;
        }
        if covered != t {
            return bad(format!("sequences cover {covered} of {t} tokens"));
        }
        Ok(())
    }

    /// Attention of every batch token over its sequence's cached context, into `out` (`t × q_size`).
    fn attend(&self, layer: usize, q: &[f32], b: &ForwardBatch, out: &mut [f32]) {
        let cfg = &self.cfg;
        let (hd, nh) = (cfg.head_dim, cfg.num_heads);
        let group = cfg.num_heads / cfg.num_kv_heads;
        let bs = self.kv.block_size();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut tok_seq = vec![0usize; b.num_tokens()];
        for (si, s) in b.seqs.iter().enumerate() {
            tok_seq[s.query_start..s.query_start + s.query_len].fill(si);
        }
        out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
            let (ti, h) = (idx / nh, idx % nh);
            let s = &b.seqs[tok_seq[ti]];
            let ctx = b.positions[ti] as usize + 1;
            let kvh = h / group;
            let qh = &q[ti * nh * hd + h * hd..ti * nh * hd + (h + 1) * hd];
            let mut scores: Vec<f32> = (0..ctx)
                .map(|p| {
                    let slot = s.block_table[p / bs] as usize * bs + p % bs;
                    linear::dot(qh, &self.kv.k(layer, slot)[kvh * hd..(kvh + 1) * hd]) * scale
                })
                .collect();
            ops::softmax(&mut scores);
            o.fill(0.0);
            for (p, &w) in scores.iter().enumerate() {
                let slot = s.block_table[p / bs] as usize * bs + p % bs;
                let v = &self.kv.v(layer, slot)[kvh * hd..(kvh + 1) * hd];
                for (a, &x) in o.iter_mut().zip(v) {
                    *a += w * x;
                }
            }
        });
    }
}

impl CpuBackend {
    fn check_pairs(&self, pairs: &[(u32, u32)], src_limit: usize, dst_limit: usize) -> Result<(), BackendError> {
        match pairs.iter().find(|(s, d)| *s as usize >= src_limit || *d as usize >= dst_limit) {
            Some(p) => Err(BackendError::InvalidBatch(format!("block pair {p:?} out of range"))),
            None => Ok(()),
        }
    }
}

impl ModelBackend for CpuBackend {
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

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn kv_cache_spec(&self) -> KvCacheSpec {
        KvCacheSpec { num_blocks: self.kv.num_blocks(), block_size: self.kv.block_size(), bytes_per_block: self.kv.bytes_per_block() }
    }

    fn forward(&mut self, b: &ForwardBatch) -> Result<Vec<f32>, BackendError> {
        self.validate(b)?;
        let cfg = self.cfg.clone();
        let (h, qs, kvs, ff, hd) = (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size, cfg.head_dim);
        let t = b.num_tokens();
        let eps = cfg.rms_norm_eps;
        let mut x = vec![0f32; t * h];
        for (i, &tok) in b.token_ids.iter().enumerate() {
            x[i * h..(i + 1) * h].copy_from_slice(&self.embed[tok as usize * h..(tok as usize + 1) * h]);
        }
        let mut hbuf = vec![0f32; t * h];
        let (mut q, mut k, mut v) = (vec![0f32; t * qs], vec![0f32; t * kvs], vec![0f32; t * kvs]);
        let mut att = vec![0f32; t * qs];
        let mut proj = vec![0f32; t * h];
        let (mut gate, mut up) = (vec![0f32; t * ff], vec![0f32; t * ff]);
        for li in 0..self.layers.len() {
            let layer = &self.layers[li];
            ops::rms_norm(&x, &layer.attn_norm, eps, &mut hbuf);
            layer.attn.q.forward(&hbuf, t, &mut q);
            layer.attn.k.forward(&hbuf, t, &mut k);
            layer.attn.v.forward(&hbuf, t, &mut v);
            if let (Some(qn), Some(kn)) = (&layer.attn.q_norm, &layer.attn.k_norm) {
                ops::rms_norm_inplace(&mut q, qn, eps);
                ops::rms_norm_inplace(&mut k, kn, eps);
            }
            for ti in 0..t {
                self.rope.apply(&mut q[ti * qs..(ti + 1) * qs], b.positions[ti]);
                self.rope.apply(&mut k[ti * kvs..(ti + 1) * kvs], b.positions[ti]);
            }
            for ti in 0..t {
                self.kv.write(li, b.slot_mapping[ti] as usize, &k[ti * kvs..(ti + 1) * kvs], &v[ti * kvs..(ti + 1) * kvs]);
            }
            self.attend(li, &q, b, &mut att);
            let layer = &self.layers[li];
            layer.attn.o.forward(&att, t, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
            ops::rms_norm(&x, &layer.ffn_norm, eps, &mut hbuf);
            layer.mlp.gate.forward(&hbuf, t, &mut gate);
            layer.mlp.up.forward(&hbuf, t, &mut up);
            ops::silu_mul(&mut gate, &up);
            layer.mlp.down.forward(&gate, t, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
        }
        let _ = hd;
        let rows = b.logits_indices.len();
        let mut sel = vec![0f32; rows * h];
        for (r, &i) in b.logits_indices.iter().enumerate() {
            ops::rms_norm(&x[i * h..(i + 1) * h], &self.norm, eps, &mut sel[r * h..(r + 1) * h]);
        }
        let mut logits = vec![0f32; rows * cfg.vocab_size];
        self.lm_head.forward(&sel, rows, &mut logits);
        Ok(logits)
    }
}
