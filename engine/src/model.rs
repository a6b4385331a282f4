//! `Model`: a loaded model — configuration, tokenizer, chat template and a backend holding
//! the weights and KV cache — opened from a GGUF file or a safetensors directory.

use std::path::Path;

use crate::backend::cpu::{CpuBackend, CpuBackendOptions};
use crate::backend::{KernelPath, ModelBackend};
use crate::model_files::chat_template::{ChatMessage, ChatTemplate, TemplateError};
use crate::model_files::config::ModelConfig;
use crate::model_files::tokenizer::Tokenizer;
use crate::model_files::weights::ModelFiles;
use crate::LoadError;

/// How much memory the KV cache pool gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvCacheSize {
    /// Room for this many tokens (rounded up to whole blocks).
    Tokens(usize),
    /// A memory budget in bytes.
    Bytes(u64),
    /// A fraction of the memory available after the weights are loaded.
    Fraction(f64),
}

/// How to load a model.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// CPU kernels.
    pub kernel: KernelPath,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Size of the KV cache pool.
    pub kv_cache: KvCacheSize,
    /// Host memory for swapped-out KV blocks, in bytes.
    pub swap_space_bytes: u64,
    /// Sliding-window layers keep KV pages of their own, given back once their window has
    /// passed ([`crate::backend::KvGroups`]); off: every page holds all layers.
    pub hybrid_kv: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            kernel: KernelPath::Exact,
            block_size: 16,
            kv_cache: KvCacheSize::Bytes(512 << 20),
            swap_space_bytes: 256 << 20,
            hybrid_kv: true,
        }
    }
}

impl LoadOptions {
    /// Options with a KV cache of `tokens` tokens and no swap space.
    pub fn with_kv_tokens(tokens: usize) -> Self {
        LoadOptions {
            kv_cache: KvCacheSize::Tokens(tokens),
            swap_space_bytes: 0,
            ..Default::default()
        }
    }
}

/// Memory the OS reports available (`MemAvailable`), in bytes.
pub fn available_memory_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// A model ready to run.
pub struct Model {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Tokenizer and special ids.
    pub tokenizer: Tokenizer,
    /// The model's chat template, when it has one.
    pub chat_template: Option<ChatTemplate>,
    /// Weights and KV cache on a device.
    pub backend: Box<dyn ModelBackend>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("config", &self.config).finish_non_exhaustive()
    }
}

/// What a model is without its weights loaded: configuration, tokenizer and chat template
/// (the router tokenizes and validates requests with this; workers load the weights).
pub struct ModelInfo {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Tokenizer and special ids.
    pub tokenizer: Tokenizer,
    /// The model's chat template, when it has one.
    pub chat_template: Option<ChatTemplate>,
    files: ModelFiles,
}

impl ModelInfo {
    /// Opens `path` (a `.gguf` file or a Hugging Face directory) and reads everything but the
    /// weights (GGUF tensors are memory-mapped, not read).
    pub fn open(path: &Path) -> Result<ModelInfo, LoadError> {
        let (files, config) = ModelFiles::open(path)?;
        let (tokenizer, template_src) = match &files {
            ModelFiles::Gguf(f) => (
                Tokenizer::from_gguf(f)?,
                f.get("tokenizer.chat_template").and_then(|v| v.as_str()).map(str::to_string),
            ),
            ModelFiles::Safetensors(_) => (Tokenizer::from_hf_dir(path)?, hf_chat_template(path)),
        };
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(LoadError::Tokenizer(format!(
                "tokenizer has {} tokens but the model's embedding has {} rows",
                tokenizer.vocab_size(),
                config.vocab_size
            )));
        }
        let mut info = ModelInfo { config, tokenizer, chat_template: None, files };
        if let Some(src) = template_src {
            info.set_chat_template(&src)?;
        }
        Ok(info)
    }

    /// Uses `source` as the chat template instead of the model's own (`--chat-template`).
    pub fn set_chat_template(&mut self, source: &str) -> Result<(), LoadError> {
        let tok = &self.tokenizer;
        let tok_str = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).unwrap_or_default();
        self.chat_template = Some(ChatTemplate::new(
            source,
            &tok_str(tok.bos_token_id),
            &tok_str(tok.eos_token_ids.first().copied()),
        )?);
        Ok(())
    }
}

impl Model {
    /// Opens `path` (a `.gguf` file or a Hugging Face directory) and loads it on the CPU.
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Model, LoadError> {
        Model::from_info(ModelInfo::open(path)?, opts)
    }

    /// Loads the weights of an opened model on the CPU.
    pub fn from_info(info: ModelInfo, opts: LoadOptions) -> Result<Model, LoadError> {
        let ModelInfo { config, tokenizer, chat_template, files } = info;
        if opts.block_size == 0 {
            return Err(LoadError::Config("block size must be positive".into()));
        }
        // The fast path keeps K and V in IEEE half, the exact path in f32.
        let half_kv = opts.kernel == KernelPath::Fast;
        let per_block =
            CpuBackend::kv_bytes_per_block(&config, opts.block_size, opts.hybrid_kv, half_kv)
                as u64;
        let groups = crate::backend::KvGroups::for_model(&config, opts.hybrid_kv).num_groups();
        let num_blocks = match opts.kv_cache {
            // Every page of `t` tokens, as if no window had passed.
            KvCacheSize::Tokens(t) => t.div_ceil(opts.block_size) * groups,
            KvCacheSize::Bytes(b) => (b / per_block) as usize,
            KvCacheSize::Fraction(f) => {
                if !(f > 0.0 && f <= 1.0) {
                    return Err(LoadError::Config(format!(
                        "KV cache fraction {f} must be in (0, 1]"
                    )));
                }
                let weights = resident_weight_bytes(&files, opts.kernel);
                let avail = available_memory_bytes().unwrap_or(0).saturating_sub(weights);
                ((avail as f64 * f) as u64 / per_block) as usize
            }
        };
        if num_blocks == 0 {
            return Err(LoadError::Config(format!(
                "the KV cache budget holds no block of {per_block} bytes"
            )));
        }
        let num_host_blocks = (opts.swap_space_bytes / per_block) as usize;
        let backend = CpuBackend::load(
            &files,
            &config,
            CpuBackendOptions {
                kernel: opts.kernel,
                block_size: opts.block_size,
                num_blocks,
                num_host_blocks,
                hybrid_kv: opts.hybrid_kv,
                half_kv,
            },
        )?;
        Ok(Model { config, tokenizer, chat_template, backend: Box::new(backend) })
    }

    /// Renders a conversation with the model's chat template, ready for the assistant's reply.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, TemplateError> {
        self.chat_template.as_ref().ok_or(TemplateError::Missing)?.render(messages, true)
    }
}

/// Memory the loaded weights will take: the fast path keeps GGUF blocks as stored (about their
/// file size); otherwise weights become f32, 4 bytes per parameter.
fn resident_weight_bytes(files: &ModelFiles, kernel: KernelPath) -> u64 {
    match (files, kernel) {
        (ModelFiles::Gguf(f), KernelPath::Fast) => f.tensors.iter().map(|t| t.size).sum(),
        (ModelFiles::Gguf(f), KernelPath::Exact) => {
            4 * f.tensors.iter().map(|t| t.num_elements()).sum::<u64>()
        }
        (ModelFiles::Safetensors(st), _) => 4 * st.num_elements(),
    }
}

/// The chat template of a Hugging Face directory: `chat_template.jinja`, or the
/// `chat_template` entry of `tokenizer_config.json` (a string, or a list whose `default` is used).
fn hf_chat_template(dir: &Path) -> Option<String> {
    if let Ok(s) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(s);
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?)
            .ok()?;
    match cfg.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}
