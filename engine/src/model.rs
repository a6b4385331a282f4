//! `Model`: a loaded model — configuration, tokenizer, chat template and a backend holding
//! the weights and KV cache — opened from a GGUF file or a safetensors directory.

use std::path::Path;

use crate::backend::cpu::{CpuBackend, CpuBackendOptions};
use crate::backend::{KernelPath, ModelBackend};
use crate::chat_template::{ChatMessage, ChatTemplate, TemplateError};
use crate::config::ModelConfig;
use crate::tokenizer::Tokenizer;
use crate::weights::ModelFiles;
use crate::LoadError;

/// How to load a model.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// CPU kernels.
    pub kernel: KernelPath,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV cache capacity in tokens (rounded up to whole blocks).
    pub kv_cache_tokens: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { kernel: KernelPath::Exact, block_size: 16, kv_cache_tokens: 8192 }
    }
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

impl Model {
    /// Opens `path` (a `.gguf` file or a Hugging Face directory) and loads it on the CPU.
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Model, LoadError> {
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
        let tok_str = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i)).unwrap_or_default();
        let chat_template = match template_src {
            Some(src) => Some(ChatTemplate::new(
                &src,
                &tok_str(tokenizer.bos_token_id),
                &tok_str(tokenizer.eos_token_ids.first().copied()),
            )?),
            None => None,
        };
        let num_blocks = opts.kv_cache_tokens.div_ceil(opts.block_size.max(1));
        let backend = CpuBackend::load(
            &files,
            &config,
            CpuBackendOptions { kernel: opts.kernel, block_size: opts.block_size, num_blocks },
        )?;
        Ok(Model { config, tokenizer, chat_template, backend: Box::new(backend) })
    }

    /// Renders a conversation with the model's chat template, ready for the assistant's reply.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, TemplateError> {
        self.chat_template.as_ref().ok_or(TemplateError::Missing)?.render(messages, true)
    }
}

/// The chat template of a Hugging Face directory: `chat_template.jinja`, or the
/// `chat_template` entry of `tokenizer_config.json` (a string, or a list whose `default` is used).
fn hf_chat_template(dir: &Path) -> Option<String> {
    if let Ok(s) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(s);
    }
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?).ok()?;
    match cfg.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}
