//! `DeviceWeights`: a model's weights in GPU memory — linear layers in the device's 16-bit type
//! (q|k|v and gate|up fused), norms and rotary frequencies as f32 — loaded from a GGUF or safetensors model
//! (dequantised on the host) or filled with random values for a shape alone (the dummy load
//! format, for benchmarks that need no download).

use std::ops::Range;

use cudarc::driver::{CudaSlice, LaunchConfig};
use tandem_engine::model_files::config::{Activation, Arch, ModelConfig};
use tandem_engine::model_files::weights::ModelFiles;

use crate::device::{ptr, Gpu};
use crate::tensor_parallel::shard::{take_cols, take_rows, Shard};
use crate::CudaError;

/// What part of a whole matrix a rank keeps.
enum Keep {
    All,
    /// These rows, in order.
    Rows(Vec<Range<usize>>),
    /// These columns of every row.
    Cols(Range<usize>),
}

/// One decoder layer's weights.
pub struct LayerWeights {
    /// Attention RMSNorm (f32).
    pub attn_norm: CudaSlice<f32>,
    /// `[q + 2·kv, hidden]`, 16-bit.
    pub qkv: CudaSlice<u16>,
    /// `[hidden, q]`, 16-bit.
    pub o: CudaSlice<u16>,
    /// Qwen2 q|k|v projection bias (f32, `[q + 2·kv]`).
    pub qkv_bias: Option<CudaSlice<f32>>,
    /// Qwen3 per-head query norm (f32).
    pub q_norm: Option<CudaSlice<f32>>,
    /// Qwen3 per-head key norm (f32).
    pub k_norm: Option<CudaSlice<f32>>,
    /// MLP RMSNorm (f32).
    pub ffn_norm: CudaSlice<f32>,
    /// Gemma's RMSNorm of the attention output before the residual add (f32).
    pub post_attn_norm: Option<CudaSlice<f32>>,
    /// Gemma's RMSNorm of the MLP output before the residual add (f32).
    pub post_ffn_norm: Option<CudaSlice<f32>>,
    /// RoPE inverse frequencies of this layer (f32, `head_dim / 2`; Gemma's local and global
    /// layers have different bases).
    pub inv_freq: CudaSlice<f32>,
    /// `[2·intermediate, hidden]`, 16-bit.
    pub gate_up: CudaSlice<u16>,
    /// `[hidden, intermediate]`, 16-bit.
    pub down: CudaSlice<u16>,
}

/// All weights of a model on one GPU.
pub struct DeviceWeights {
    /// `[vocab, hidden]`, 16-bit.
    pub embed: CudaSlice<u16>,
    /// The decoder layers.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm (f32).
    pub norm: CudaSlice<f32>,
    /// `[vocab, hidden]`, 16-bit (the rows of `head_rows` alone), or `None` when tied to the
    /// embedding.
    pub lm_head: Option<CudaSlice<u16>>,
    /// The vocabulary rows the LM head holds: all of them, or a tensor-parallel rank's slice
    /// (`Shard::vocab_rows`) where the rank computes only its slice's logits.
    pub head_rows: Range<usize>,
    /// Bytes of 16-bit weights on the device.
    pub bytes: u64,
}

/// What of `cfg` the CUDA backend does not run yet, as a refusal naming it (none: it runs the
/// model). Llama, Qwen2 (q/k/v bias), Qwen3 (q/k norms), Mistral (sliding window), Phi-3 (fused
/// q|k|v and gate|up) and Gemma 3 (scaled embedding, (1 + w) norms, post-norms, GeGLU, its own
/// attention scale, a RoPE base per layer) run.
pub fn unsupported(cfg: &ModelConfig) -> Option<String> {
    let mut missing = Vec::new();
    if !matches!(cfg.hidden_act, Activation::Silu | Activation::GeluTanh) {
        missing.push(format!("the {:?} activation", cfg.hidden_act));
    }
    (!missing.is_empty()).then(|| {
        format!(
            "the {} architecture needs {} on the GPU, which the CUDA backend does not have yet; run it with --device cpu",
            cfg.arch.gguf_name(),
            missing.join(", ")
        )
    })
}

/// The vocabulary rows a rank's LM head keeps: its slice (`Shard::vocab_rows`) where the head
/// is sliced and not tied to the embedding (which every rank keeps whole), else all of them.
fn head_rows(cfg: &ModelConfig, shard: Shard, slice_head: bool) -> Range<usize> {
    match slice_head && !cfg.tie_word_embeddings {
        true => shard.vocab_rows(cfg.vocab_size),
        false => 0..cfg.vocab_size,
    }
}

/// RoPE inverse frequencies of layer `layer`, `theta^(-2i/d)` (computed in f64, rounded to f32
/// as the CPU path does).
pub fn inv_freq(cfg: &ModelConfig, layer: usize) -> Vec<f32> {
    let (d, theta) = (cfg.head_dim, cfg.layer_rope_theta(layer) as f64);
    (0..d / 2).map(|i| (1.0 / theta.powf(2.0 * i as f64 / d as f64)) as f32).collect()
}

impl DeviceWeights {
    /// Uploads the weights of `files`.
    pub fn load(
        gpu: &Gpu,
        files: &ModelFiles,
        cfg: &ModelConfig,
    ) -> Result<DeviceWeights, CudaError> {
        Self::load_shard(gpu, files, cfg, Shard::WHOLE, false)
    }

    /// Uploads one tensor-parallel rank's slice of the weights of `files` (`cfg` is the whole
    /// model's configuration); with `slice_head`, only the rank's rows of an untied LM head.
    pub fn load_shard(
        gpu: &Gpu,
        files: &ModelFiles,
        cfg: &ModelConfig,
        shard: Shard,
        slice_head: bool,
    ) -> Result<DeviceWeights, CudaError> {
        let (h, q, kv, ff) = (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size);
        if let Some(why) = unsupported(cfg) {
            return Err(CudaError::Unsupported(why));
        }
        let mut bytes = 0u64;
        let mut mat = |parts: &[(String, usize)],
                       k: usize,
                       keep: Keep|
         -> Result<CudaSlice<u16>, CudaError> {
            let mut all = Vec::new();
            for (name, n) in parts {
                all.extend(files.require(name, &[*n, k]).map_err(CudaError::Load)?.to_f32());
            }
            let all = match keep {
                Keep::All => all,
                Keep::Rows(r) => take_rows(&all, k, &r),
                Keep::Cols(c) => take_cols(&all, k, c),
            };
            bytes += 2 * all.len() as u64;
            gpu.upload(&all.iter().map(|&x| gpu.dtype.from_f32(x)).collect::<Vec<u16>>())
        };
        // Norm weights, with the (1 + w) offset of Hugging Face Gemma files added.
        let vec = |name: &str, n: usize| -> Result<CudaSlice<f32>, CudaError> {
            let mut w = files.require(name, &[n]).map_err(CudaError::Load)?.to_f32();
            w.iter_mut().for_each(|x| *x += cfg.norm_offset);
            gpu.upload(&w)
        };
        let post = |name: &str| -> Result<Option<CudaSlice<f32>>, CudaError> {
            cfg.post_norms.then(|| vec(name, h)).transpose()
        };
        let embed = mat(&[("token_embd.weight".into(), cfg.vocab_size)], h, Keep::All)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            let qk = cfg.qk_norm;
            // Phi-3 keeps q|k|v fused, and gate|up under the up projection's name.
            let qkv_parts = if files.tensor(&p("attn_qkv")).is_some() {
                vec![(p("attn_qkv"), q + 2 * kv)]
            } else {
                vec![(p("attn_q"), q), (p("attn_k"), kv), (p("attn_v"), kv)]
            };
            let gate_up_parts = if files.tensor(&p("ffn_gate_up")).is_some() {
                vec![(p("ffn_gate_up"), 2 * ff)]
            } else if cfg.arch == Arch::Phi3 {
                vec![(p("ffn_up"), 2 * ff)]
            } else {
                vec![(p("ffn_gate"), ff), (p("ffn_up"), ff)]
            };
            let qkv_bias = if cfg.attn_bias {
                let b = |s: &str, n| -> Result<Vec<f32>, CudaError> {
                    Ok(files
                        .require(&format!("blk.{i}.{s}.bias"), &[n])
                        .map_err(CudaError::Load)?
                        .to_f32())
                };
                let whole = [b("attn_q", q)?, b("attn_k", kv)?, b("attn_v", kv)?].concat();
                Some(gpu.upload(&take_rows(&whole, 1, &shard.qkv_rows(cfg)))?)
            } else {
                None
            };
            layers.push(LayerWeights {
                attn_norm: vec(&p("attn_norm"), h)?,
                qkv: mat(&qkv_parts, h, Keep::Rows(shard.qkv_rows(cfg).to_vec()))?,
                qkv_bias,
                o: mat(&[(p("attn_output"), h)], q, Keep::Cols(shard.o_cols(cfg)))?,
                q_norm: if qk { Some(vec(&p("attn_q_norm"), cfg.head_dim)?) } else { None },
                k_norm: if qk { Some(vec(&p("attn_k_norm"), cfg.head_dim)?) } else { None },
                ffn_norm: vec(&p("ffn_norm"), h)?,
                post_attn_norm: post(&p("post_attention_norm"))?,
                post_ffn_norm: post(&p("post_ffw_norm"))?,
                inv_freq: gpu.upload(&inv_freq(cfg, i))?,
                gate_up: mat(&gate_up_parts, h, Keep::Rows(shard.gate_up_rows(cfg).to_vec()))?,
                down: mat(&[(p("ffn_down"), h)], ff, Keep::Cols(shard.down_cols(cfg)))?,
            });
        }
        let head_rows = head_rows(cfg, shard, slice_head);
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            let keep = Keep::Rows(vec![head_rows.clone()]);
            Some(mat(&[("output.weight".into(), cfg.vocab_size)], h, keep)?)
        };
        let norm = vec("output_norm.weight", h)?;
        Ok(DeviceWeights { embed, layers, norm, lm_head, head_rows, bytes })
    }

    /// Random weights of `cfg`'s shape, generated on the device (seeded, so runs repeat):
    /// linear layers uniform in ±1/√in_features, the embedding in ±1, norms 1.
    pub fn dummy(gpu: &Gpu, cfg: &ModelConfig, seed: u32) -> Result<DeviceWeights, CudaError> {
        Self::dummy_shard(gpu, cfg, seed, Shard::WHOLE, false)
    }

    /// One tensor-parallel rank's slice of [`DeviceWeights::dummy`]'s weights: every value
    /// equals the one the whole model has at the same place; with `slice_head`, only the
    /// rank's rows of an untied LM head.
    pub fn dummy_shard(
        gpu: &Gpu,
        cfg: &ModelConfig,
        seed: u32,
        shard: Shard,
        slice_head: bool,
    ) -> Result<DeviceWeights, CudaError> {
        if let Some(why) = unsupported(cfg) {
            return Err(CudaError::Unsupported(why));
        }
        let (h, q, kv, ff) = (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size);
        let mut bytes = 0u64;
        let mut next = seed;
        // The kept part of a whole `[rows, cols]` matrix, filled block by block.
        let mut rand = |rows: usize,
                        cols: usize,
                        scale: f32,
                        keep: Keep|
         -> Result<CudaSlice<u16>, CudaError> {
            next = next.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
            let blocks: Vec<(Range<usize>, Range<usize>)> = match keep {
                Keep::All => vec![(0..rows, 0..cols)],
                Keep::Rows(r) => r.into_iter().map(|r| (r, 0..cols)).collect(),
                Keep::Cols(c) => vec![(0..rows, c)],
            };
            let n: usize = blocks.iter().map(|(r, c)| r.len() * c.len()).sum();
            let buf = gpu.zeros::<u16>(n)?;
            let mut at = 0u64;
            for (r, c) in blocks {
                let (p, nr, nc) = (ptr(&buf) + 2 * at, r.len() as u64, c.len() as u64);
                let (first, ld) = ((r.start * cols + c.start) as u64, cols as u64);
                let lc = LaunchConfig {
                    grid_dim: (gpu.num_sms as u32 * 8, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: fill_random_block(h16*, u64 rows, u64 cols, u64 first, u64 ld, u32,
                // f32) writes rows × cols elements from `p`, inside the buffer of n.
                unsafe {
                    gpu.launch(
                        &gpu.k.fill_random_block,
                        lc,
                        &[&p, &nr, &nc, &first, &ld, &next, &scale],
                    )?
                };
                at += nr * nc;
            }
            bytes += 2 * n as u64;
            Ok(buf)
        };
        let ones = |n: usize| gpu.upload(&vec![1f32; n]);
        // Small seeded biases in ±0.1 (Qwen2 shapes): the bias path runs in benchmarks too.
        let bias = |n: usize, layer: usize| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    let x = (i as u32 ^ (layer as u32) << 20).wrapping_mul(2_654_435_761) ^ seed;
                    (x as f32 / u32::MAX as f32 - 0.5) * 0.2
                })
                .collect()
        };
        let embed = rand(cfg.vocab_size, h, 1.0, Keep::All)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let (qkv_rows, gate_up_rows) =
            (shard.qkv_rows(cfg).to_vec(), shard.gate_up_rows(cfg).to_vec());
        for li in 0..cfg.num_layers {
            let qk = cfg.qk_norm;
            let qkv_bias = match cfg.attn_bias {
                true => Some(gpu.upload(&take_rows(&bias(q + 2 * kv, li), 1, &qkv_rows))?),
                false => None,
            };
            let (sh, sq, sf) =
                (1.0 / (h as f32).sqrt(), 1.0 / (q as f32).sqrt(), 1.0 / (ff as f32).sqrt());
            layers.push(LayerWeights {
                attn_norm: ones(h)?,
                qkv: rand(q + 2 * kv, h, sh, Keep::Rows(qkv_rows.clone()))?,
                qkv_bias,
                o: rand(h, q, sq, Keep::Cols(shard.o_cols(cfg)))?,
                q_norm: if qk { Some(ones(cfg.head_dim)?) } else { None },
                k_norm: if qk { Some(ones(cfg.head_dim)?) } else { None },
                ffn_norm: ones(h)?,
                post_attn_norm: if cfg.post_norms { Some(ones(h)?) } else { None },
                post_ffn_norm: if cfg.post_norms { Some(ones(h)?) } else { None },
                inv_freq: gpu.upload(&inv_freq(cfg, li))?,
                gate_up: rand(2 * ff, h, sh, Keep::Rows(gate_up_rows.clone()))?,
                down: rand(h, ff, sf, Keep::Cols(shard.down_cols(cfg)))?,
            });
        }
        let head_rows = head_rows(cfg, shard, slice_head);
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            let keep = Keep::Rows(vec![head_rows.clone()]);
            Some(rand(cfg.vocab_size, h, 1.0 / (h as f32).sqrt(), keep)?)
        };
        gpu.sync()?;
        Ok(DeviceWeights { embed, layers, norm: ones(h)?, lm_head, head_rows, bytes })
    }

    /// The LM head (the embedding when tied).
    pub fn head(&self) -> &CudaSlice<u16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliced_head_keeps_the_ranks_rows_unless_tied() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/llama-3-8b.json");
        let mut cfg = crate::dummy_config(&path).unwrap();
        let (v, rank1) = (cfg.vocab_size, Shard { rank: 1, size: 2 });
        assert!(!cfg.tie_word_embeddings);
        assert_eq!(head_rows(&cfg, rank1, true), rank1.vocab_rows(v));
        assert_eq!(head_rows(&cfg, rank1, false), 0..v);
        assert_eq!(head_rows(&cfg, Shard::WHOLE, true), 0..v);
        // Tied: the head is the embedding, which every rank keeps whole.
        cfg.tie_word_embeddings = true;
        assert_eq!(head_rows(&cfg, rank1, true), 0..v);
    }
}
