//! Offline helpers over the engine: one prompt to completion with streamed text
//! ([`LLMEngine::generate`]), and teacher-forced scoring of a token sequence ([`score`]).

use crate::backend::cpu::ops::log_softmax;
use crate::backend::{BackendError, ForwardBatch, Logits};
use crate::llm_engine::{EngineError, LLMEngine, Prompt};
use crate::model::Model;
use crate::sampling::sampler::SampledToken;
use crate::sampling::sampling_params::SamplingParams;
use crate::scheduling::request_output::FinishReason;

/// The result of [`LLMEngine::generate`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    /// Prompt token ids.
    pub prompt_token_ids: Vec<u32>,
    /// Generated token ids (a stop token that ended generation included).
    pub token_ids: Vec<u32>,
    /// Generated text.
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Per-token log-probabilities, when asked for.
    pub logprobs: Vec<SampledToken>,
}

impl LLMEngine {
    /// Runs one request to completion on an idle engine; `on_text` receives each new piece of
    /// text as soon as it is final.
    pub fn generate(
        &mut self,
        prompt: Prompt,
        params: SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, EngineError> {
        if self.has_unfinished_requests() {
            return Err(EngineError::InvalidRequest("generate needs an idle engine".into()));
        }
        let id = "generate";
        self.add_request(id, prompt, params, None)?;
        let mut g = Generation {
            prompt_token_ids: Vec::new(),
            token_ids: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Length,
            logprobs: Vec::new(),
        };
        while self.has_unfinished_requests() {
            for out in self.step()? {
                g.prompt_token_ids = out.prompt_token_ids.to_vec();
                for o in out.outputs {
                    if !o.text.is_empty() {
                        on_text(&o.text);
                    }
                    g.text.push_str(&o.text);
                    g.token_ids.extend(o.token_ids);
                    g.logprobs.extend(o.logprobs);
                    if let Some(r) = o.finish_reason {
                        g.finish_reason = r;
                    }
                }
            }
        }
        Ok(g)
    }
}

/// Runs one forward pass of `model` over `ids` and returns, for each position `i`, the
/// log-probabilities of the token after `ids[..=i]` (teacher forcing). Uses the model's KV
/// blocks from block 0, so it is for a model not yet handed to an engine.
pub fn score(model: &mut Model, ids: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
    if ids.is_empty() {
        return Err(EngineError::InvalidRequest("nothing to score".into()));
    }
    let spec = model.backend.kv_cache_spec();
    let need = ids.len().div_ceil(spec.block_size);
    if need > spec.num_blocks {
        return Err(EngineError::Backend(BackendError::InvalidBatch(format!(
            "{} tokens do not fit the KV cache",
            ids.len()
        ))));
    }
    let table: Vec<u32> = (0..need as u32).collect();
    let mut batch = ForwardBatch::default();
    batch.push_seq(ids, 0, &table, spec.block_size, Logits::All);
    let logits = model.backend.forward(&batch)?;
    Ok(logits.chunks_exact(model.config.vocab_size).map(log_softmax).collect())
}
