//! Model hyper-parameters (`ModelConfig`), read from GGUF metadata or a Hugging Face
//! `config.json`. Nothing here is hard-coded for a particular model: every value comes from the
//! file, with the format's documented defaults where a key is optional.

use serde::Deserialize;

use crate::model_files::gguf::GgufFile;
use crate::LoadError;

/// Supported model architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama (SmolLM2, Llama-2/3 shapes).
    Llama,
    /// Qwen3: Llama plus an RMSNorm on each head's query and key.
    Qwen3,
    /// Gemma 3: embeddings scaled by √hidden, norms before and after each sub-layer, query and
    /// key norms, a GELU (tanh) gated MLP, and sliding-window layers between global ones.
    Gemma3,
    /// Qwen2 / Qwen2.5: Llama with biases on the query, key and value projections.
    Qwen2,
    /// Phi-3: Llama with fused qkv and gate|up projections (and a sliding window when set).
    Phi3,
}

impl Arch {
    /// The GGUF `general.architecture` string.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2 => "qwen2",
            Arch::Phi3 => "phi3",
        }
    }
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): GGUF Llama weights, whose Q/K rows the converter permuted.
    Interleaved,
    /// Pairs (i, i + d/2), "rotate half": Hugging Face weights and GGUF Qwen3.
    Neox,
}

/// The gate's activation in the gated MLP (`act(gate) · up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU): Llama, Qwen.
    Silu,
    /// GELU with the tanh approximation (GeGLU): Gemma.
    GeluTanh,
}

/// Sliding-window attention: most layers attend to the last `size` positions only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer sees, its own included.
    pub size: usize,
    /// Every `global_every`-th layer (1-based) is global, the others local; `None`: every
    /// layer is local (Mistral, Phi-3).
    pub global_every: Option<usize>,
    /// RoPE base of the local layers (global layers use `rope_theta`).
    pub local_rope_theta: f32,
}

/// Shape and numeric constants of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Arch,
    /// Human-readable model name, when the file has one.
    pub name: String,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA when fewer than query heads).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Hidden width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Vocabulary size (rows of the embedding table).
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// Pairing of rotary dimensions for these weights.
    pub rope_style: RopeStyle,
    /// Whether the LM head reuses the token embedding.
    pub tie_word_embeddings: bool,
    /// The gated MLP's activation.
    pub hidden_act: Activation,
    /// Factor on the token embeddings before the first layer (1 but for Gemma: √hidden).
    pub embedding_scale: f32,
    /// RMSNorm on each head's query and key before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm on the attention and MLP outputs before the residual add (Gemma 3).
    pub post_norms: bool,
    /// Sliding-window layers, when the model has them.
    pub sliding_window: Option<SlidingWindow>,
    /// Biases on the query, key and value projections (Qwen2).
    pub attn_bias: bool,
    /// Added to every RMSNorm weight at load: 1 for Hugging Face Gemma weights (their norms
    /// scale by `1 + w`; GGUF files have it folded in), else 0.
    pub norm_offset: f32,
    /// Attention scores are scaled by `1/√query_pre_attn_scalar` (Gemma); `None`: by
    /// `1/√head_dim`.
    pub query_pre_attn_scalar: Option<f32>,
}

impl ModelConfig {
    /// Width of all query heads together.
    pub fn q_size(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Width of all key (or value) heads together.
    pub fn kv_size(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The window of layer `layer` (0-based): `None` for a global layer.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        let w = self.sliding_window?;
        let global = w.global_every.is_some_and(|n| (layer + 1).is_multiple_of(n));
        (!global).then_some(w.size)
    }

    /// The RoPE base of layer `layer`.
    pub fn layer_rope_theta(&self, layer: usize) -> f32 {
        match (self.sliding_window, self.layer_window(layer)) {
            (Some(w), Some(_)) => w.local_rope_theta,
            _ => self.rope_theta,
        }
    }

    /// The architecture's defaults for everything but the shapes (activation, norms, scaling).
    fn arch_defaults(arch: Arch, hidden_size: usize) -> (Activation, f32, bool, bool) {
        match arch {
            Arch::Llama | Arch::Qwen2 | Arch::Phi3 => (Activation::Silu, 1.0, false, false),
            Arch::Qwen3 => (Activation::Silu, 1.0, true, false),
            Arch::Gemma3 => (Activation::GeluTanh, (hidden_size as f32).sqrt(), true, true),
        }
    }

    /// Checks internal consistency.
    pub fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: String| Err(LoadError::Config(m));
        if self.hidden_size == 0
            || self.num_layers == 0
            || self.num_heads == 0
            || self.num_kv_heads == 0
        {
            return bad(format!("zero-sized model dimension in {self:?}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} query heads not divisible by {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even and positive", self.head_dim));
        }
        if let Some(w) = self.sliding_window {
            if w.size == 0
                || w.global_every == Some(0)
                || w.local_rope_theta.is_nan()
                || w.local_rope_theta <= 0.0
            {
                return bad(format!("invalid sliding window {w:?}"));
            }
        }
        // NaN is not positive either.
        let positive = |x: f32| x > 0.0;
        if !positive(self.rms_norm_eps) || !positive(self.rope_theta) {
            return bad(format!(
                "invalid rms_norm_eps {} or rope_theta {}",
                self.rms_norm_eps, self.rope_theta
            ));
        }
        Ok(())
    }

    /// Reads the configuration from GGUF metadata (`{arch}.*` keys).
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig, LoadError> {
        let arch_name = f
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| LoadError::Config("GGUF has no general.architecture".into()))?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "qwen2" => Arch::Qwen2,
            "phi3" => Arch::Phi3,
            other => return Err(LoadError::UnsupportedArchitecture(other.to_string())),
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize, LoadError> {
            f.get(&key(k)).and_then(|v| v.as_u64()).map(|v| v as usize).ok_or_else(|| {
                LoadError::Config(format!("GGUF metadata lacks integer '{}'", key(k)))
            })
        };
        let opt_u = |k: &str| f.get(&key(k)).and_then(|v| v.as_u64()).map(|v| v as usize);
        let opt_f = |k: &str| f.get(&key(k)).and_then(|v| v.as_f64()).map(|v| v as f32);
        if f.tensor("rope_freqs.weight").is_some()
            || f.get(&key("rope.scaling.type")).is_some_and(|v| v.as_str() != Some("none"))
        {
            return Err(LoadError::Config("RoPE scaling is not supported yet".into()));
        }
        let hidden_size = req("embedding_length")?;
        let num_heads = req("attention.head_count")?;
        let vocab_size = match opt_u("vocab_size") {
            Some(v) => v,
            None => {
                let embd = f
                    .tensor("token_embd.weight")
                    .ok_or_else(|| LoadError::MissingTensor("token_embd.weight".into()))?;
                embd.dims.get(1).copied().unwrap_or(0) as usize
            }
        };
        let (hidden_act, embedding_scale, qk_norm, post_norms) =
            Self::arch_defaults(arch, hidden_size);
        // Gemma 3 defines its layout: five local layers (RoPE base 10k) then a global one.
        let rope_theta = opt_f("rope.freq_base").unwrap_or(10_000.0);
        let sliding_window = match (arch, opt_u("attention.sliding_window")) {
            (Arch::Gemma3, Some(size)) => {
                Some(SlidingWindow { size, global_every: Some(6), local_rope_theta: 10_000.0 })
            }
            (Arch::Phi3, Some(size)) if size > 0 => {
                Some(SlidingWindow { size, global_every: None, local_rope_theta: rope_theta })
            }
            _ => None,
        };
        let cfg = ModelConfig {
            arch,
            name: f.get("general.name").and_then(|v| v.as_str()).unwrap_or(arch_name).to_string(),
            hidden_size,
            num_layers: req("block_count")?,
            num_heads,
            num_kv_heads: opt_u("attention.head_count_kv").unwrap_or(num_heads),
            head_dim: opt_u("attention.key_length")
                .unwrap_or(hidden_size.checked_div(num_heads).unwrap_or(0)),
            intermediate_size: req("feed_forward_length")?,
            vocab_size,
            max_position_embeddings: opt_u("context_length").unwrap_or(2048),
            rope_theta,
            rms_norm_eps: opt_f("attention.layer_norm_rms_epsilon").ok_or_else(|| {
                LoadError::Config(format!(
                    "GGUF metadata lacks '{}'",
                    key("attention.layer_norm_rms_epsilon")
                ))
            })?,
            rope_style: match arch {
                Arch::Llama => RopeStyle::Interleaved,
                Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen2 | Arch::Phi3 => RopeStyle::Neox,
            },
            tie_word_embeddings: f.tensor("output.weight").is_none(),
            hidden_act,
            embedding_scale,
            qk_norm,
            post_norms,
            sliding_window,
            attn_bias: f.tensor("blk.0.attn_q.bias").is_some(),
            norm_offset: 0.0,
            // Gemma 3 27B (62 layers) scales by hidden / heads, as llama.cpp does for it.
            query_pre_attn_scalar: (arch == Arch::Gemma3 && req("block_count")? == 62)
                .then(|| (hidden_size / num_heads) as f32),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<ModelConfig, LoadError> {
        let c: HfConfig = serde_json::from_str(text)
            .map_err(|e| LoadError::Config(format!("config.json: {e}")))?;
        let arch_name = c
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or_else(|| c.model_type.clone())
            .unwrap_or_default();
        let arch = match arch_name.as_str() {
            "LlamaForCausalLM" | "llama" => Arch::Llama,
            "Qwen3ForCausalLM" | "qwen3" => Arch::Qwen3,
            // Mistral is Llama with a sliding window over every layer.
            "MistralForCausalLM" | "mistral" => Arch::Llama,
            "Qwen2ForCausalLM" | "qwen2" => Arch::Qwen2,
            "Phi3ForCausalLM" | "phi3" => Arch::Phi3,
            "Gemma3ForCausalLM" | "gemma3_text" => Arch::Gemma3,
            other => return Err(LoadError::UnsupportedArchitecture(other.to_string())),
        };
        // Qwen2 always has q/k/v biases; elsewhere `attention_bias` says so (o_proj's too).
        if (arch != Arch::Qwen2 && c.attention_bias.unwrap_or(false)) || c.mlp_bias.unwrap_or(false)
        {
            return Err(LoadError::Config("attention/MLP biases are not supported".into()));
        }
        // transformers 5 writes `rope_parameters` (theta, type, partial factor) instead.
        let rp = c.rope_parameters.as_ref();
        let rp_type = rp.and_then(|v| v.get("rope_type")).and_then(|v| v.as_str());
        // Gemma nests one set per layer type.
        let nested_scaled = ["full_attention", "sliding_attention"].iter().any(|k| {
            rp.and_then(|v| v.get(k))
                .and_then(|v| v.get("rope_type"))
                .and_then(|v| v.as_str())
                .is_some_and(|t| t != "default")
        });
        if c.rope_scaling.as_ref().is_some_and(|v| !v.is_null())
            || rp_type.is_some_and(|t| t != "default")
            || nested_scaled
        {
            return Err(LoadError::Config("RoPE scaling is not supported yet".into()));
        }
        let rope_theta = c.rope_theta.or_else(|| {
            rp.and_then(|v| v.get("rope_theta")).and_then(|v| v.as_f64()).map(|v| v as f32)
        });
        let partial_rotary = c.partial_rotary_factor.or_else(|| {
            rp.and_then(|v| v.get("partial_rotary_factor"))
                .and_then(|v| v.as_f64())
                .map(|v| v as f32)
        });
        let act = if arch == Arch::Gemma3 { "gelu_pytorch_tanh" } else { "silu" };
        let given = c.hidden_activation.as_deref().or(c.hidden_act.as_deref());
        if given.is_some_and(|a| a != act) {
            return Err(LoadError::Config(format!(
                "hidden activation '{}' is not supported for {arch_name}",
                given.unwrap_or_default()
            )));
        }
        if c.final_logit_softcapping.as_ref().is_some_and(|v| !v.is_null())
            || c.attn_logit_softcapping.as_ref().is_some_and(|v| !v.is_null())
        {
            return Err(LoadError::Config("logit soft-capping is not supported yet".into()));
        }
        if partial_rotary.is_some_and(|f| f != 1.0) {
            return Err(LoadError::Config(
                "partial rotary embeddings are not supported yet".into(),
            ));
        }
        let window = match (arch, c.sliding_window, c.use_sliding_window) {
            (_, None, _) | (_, Some(0), _) | (Arch::Qwen2, _, None | Some(false)) => None,
            (Arch::Gemma3, Some(size), _) => Some(Self::gemma3_window(&c, size)?),
            (_, Some(size), _) => {
                let theta = rope_theta.unwrap_or(10_000.0);
                Some(SlidingWindow { size, global_every: None, local_rope_theta: theta })
            }
        };
        // Gemma's global layers: `rope_parameters.full_attention` (transformers 5) or `rope_theta`.
        let rope_theta = match (arch, rp.and_then(|v| v.get("full_attention"))) {
            (Arch::Gemma3, Some(full)) => {
                full.get("rope_theta").and_then(|v| v.as_f64()).map(|v| v as f32).or(rope_theta)
            }
            _ => rope_theta,
        };
        let (hidden_act, embedding_scale, qk_norm, post_norms) =
            Self::arch_defaults(arch, c.hidden_size);
        let cfg = ModelConfig {
            arch,
            name: c.model_type.clone().unwrap_or_else(|| arch_name.clone()),
            hidden_size: c.hidden_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
            head_dim: c
                .head_dim
                .unwrap_or(c.hidden_size.checked_div(c.num_attention_heads).unwrap_or(0)),
            intermediate_size: c.intermediate_size,
            vocab_size: c.vocab_size,
            max_position_embeddings: c.max_position_embeddings.unwrap_or(2048),
            rope_theta: rope_theta.unwrap_or(10_000.0),
            rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope_style: RopeStyle::Neox,
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            hidden_act,
            embedding_scale,
            qk_norm,
            post_norms,
            sliding_window: window,
            attn_bias: arch == Arch::Qwen2,
            norm_offset: if arch == Arch::Gemma3 { 1.0 } else { 0.0 },
            query_pre_attn_scalar: c.query_pre_attn_scalar.filter(|_| arch == Arch::Gemma3),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

impl ModelConfig {
    /// Gemma 3's sliding-window layout from `config.json`: which layers are global
    /// (`layer_types`, or every `sliding_window_pattern`-th) and the local RoPE base.
    fn gemma3_window(c: &HfConfig, size: usize) -> Result<SlidingWindow, LoadError> {
        let every = match &c.layer_types {
            Some(types) => {
                let n = types
                    .iter()
                    .position(|t| t == "full_attention")
                    .map_or(types.len() + 1, |i| i + 1);
                let regular = types
                    .iter()
                    .enumerate()
                    .all(|(i, t)| (t == "full_attention") == (i + 1).is_multiple_of(n));
                if !regular {
                    return Err(LoadError::Config(
                        "layer_types without a regular global-layer period are not supported"
                            .into(),
                    ));
                }
                n
            }
            None => c.sliding_window_pattern.unwrap_or(6),
        };
        let local = c
            .rope_parameters
            .as_ref()
            .and_then(|v| v.get("sliding_attention"))
            .and_then(|v| v.get("rope_theta"))
            .and_then(|v| v.as_f64())
            .map(|v| v as f32)
            .or(c.rope_local_base_freq)
            .unwrap_or(10_000.0);
        Ok(SlidingWindow { size, global_every: Some(every), local_rope_theta: local })
    }
}

/// The subset of a Hugging Face `config.json` the engine reads.
#[derive(Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    max_position_embeddings: Option<usize>,
    rope_theta: Option<f32>,
    rms_norm_eps: Option<f32>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    rope_scaling: Option<serde_json::Value>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    partial_rotary_factor: Option<f32>,
    rope_parameters: Option<serde_json::Value>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f32>,
    query_pre_attn_scalar: Option<f32>,
    final_logit_softcapping: Option<serde_json::Value>,
    attn_logit_softcapping: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_config_qwen3() {
        let c = ModelConfig::from_hf_json(
            r#"{"architectures":["Qwen3ForCausalLM"],"hidden_size":64,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,"intermediate_size":128,
            "vocab_size":300,"rope_theta":1000000.0,"rms_norm_eps":1e-6,"tie_word_embeddings":true,
            "rope_scaling":null}"#,
        )
        .unwrap();
        assert_eq!(c.arch, Arch::Qwen3);
        assert_eq!(c.head_dim, 32);
        assert_eq!(c.q_size(), 128);
        assert_eq!(c.rope_style, RopeStyle::Neox);
    }

    #[test]
    fn hf_config_errors_are_clear() {
        let e = ModelConfig::from_hf_json(r#"{"architectures":["GPT2LMHeadModel"],"hidden_size":1,"num_hidden_layers":1,"num_attention_heads":1,"intermediate_size":1,"vocab_size":1}"#).unwrap_err();
        assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
        let e = ModelConfig::from_hf_json(r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2,"intermediate_size":1,"vocab_size":1}"#).unwrap_err();
        assert!(e.to_string().contains("not divisible"), "{e}");
        let e = ModelConfig::from_hf_json("{").unwrap_err();
        assert!(e.to_string().contains("config.json"), "{e}");
    }
}
