//! Single-sequence generation and scoring over a [`Model`]: the offline path behind
//! `tandem generate` and the golden tests. Batched serving goes through the scheduler instead.

use crate::backend::{BackendError, ForwardBatch};
use crate::backend::cpu::ops::log_softmax;
use crate::detokenizer::IncrementalDetokenizer;
use crate::model::Model;
use crate::sampler::{sample, Rng, SampledToken};
use crate::sampling_params::SamplingParams;
use crate::tokenizer::TokenizeError;

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token was produced.
    Stop,
    /// `max_tokens` was reached.
    Length,
}

/// The result of [`generate`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    /// Prompt token ids.
    pub prompt_token_ids: Vec<u32>,
    /// Generated token ids (an end-of-sequence token that stopped generation included).
    pub token_ids: Vec<u32>,
    /// Generated text (special tokens skipped).
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Per-token log-probabilities, when asked for.
    pub logprobs: Vec<SampledToken>,
}

/// A generation request could not be run.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The request itself is invalid.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The backend refused the batch.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Detokenization failed.
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
}

fn check_fits(model: &Model, tokens: usize) -> Result<Vec<u32>, GenerateError> {
    let spec = model.backend.kv_cache_spec();
    let need = tokens.div_ceil(spec.block_size);
    if need > spec.num_blocks {
        return Err(GenerateError::InvalidRequest(format!(
            "{tokens} tokens need {need} KV blocks but the cache has {}",
            spec.num_blocks
        )));
    }
    if tokens > model.config.max_position_embeddings {
        return Err(GenerateError::InvalidRequest(format!(
            "{tokens} tokens exceed the model's context length of {}",
            model.config.max_position_embeddings
        )));
    }
    Ok((0..need as u32).collect())
}

/// Generates up to `params.max_tokens` tokens after `prompt_ids`; `on_text` receives each piece
/// of text as soon as it is complete.
pub fn generate(
    model: &mut Model,
    prompt_ids: &[u32],
    params: &SamplingParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation, GenerateError> {
    params.validate().map_err(GenerateError::InvalidRequest)?;
    if prompt_ids.is_empty() {
        return Err(GenerateError::InvalidRequest("the prompt is empty".into()));
    }
    let block_table = check_fits(model, prompt_ids.len() + params.max_tokens)?;
    let bs = model.backend.kv_cache_spec().block_size;
    let mut rng = Rng::new(params.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
    }));
    let mut detok = IncrementalDetokenizer::new(prompt_ids, true);
    let mut out = Generation {
        prompt_token_ids: prompt_ids.to_vec(),
        token_ids: Vec::new(),
        text: String::new(),
        finish_reason: FinishReason::Length,
        logprobs: Vec::new(),
    };
    let mut step_tokens: Vec<u32> = prompt_ids.to_vec();
    let mut pos = 0;
    while out.token_ids.len() < params.max_tokens {
        let mut batch = ForwardBatch::default();
        batch.push_seq(&step_tokens, pos, &block_table, bs, false);
        let logits = model.backend.forward(&batch)?;
        pos += step_tokens.len();
        let s = sample(&logits, params, &mut rng);
        let id = s.chosen.token_id;
        out.token_ids.push(id);
        if params.logprobs.is_some() {
            out.logprobs.push(s);
        }
        let is_eos = model.tokenizer.eos_token_ids.contains(&id);
        if is_eos && !params.ignore_eos {
            out.finish_reason = FinishReason::Stop;
            break;
        }
        let piece = detok.push(&model.tokenizer, id)?;
        if !piece.is_empty() {
            on_text(&piece);
            out.text.push_str(&piece);
        }
        step_tokens = vec![id];
    }
    let tail = detok.flush(&model.tokenizer)?;
    if !tail.is_empty() {
        on_text(&tail);
        out.text.push_str(&tail);
    }
    Ok(out)
}

/// Runs one forward pass over `ids` and returns, for each position `i`, the log-probabilities of
/// the token after `ids[..=i]` (teacher forcing).
pub fn score(model: &mut Model, ids: &[u32]) -> Result<Vec<Vec<f32>>, GenerateError> {
    if ids.is_empty() {
        return Err(GenerateError::InvalidRequest("nothing to score".into()));
    }
    let block_table = check_fits(model, ids.len())?;
    let bs = model.backend.kv_cache_spec().block_size;
    let mut batch = ForwardBatch::default();
    batch.push_seq(ids, 0, &block_table, bs, true);
    let logits = model.backend.forward(&batch)?;
    Ok(logits.chunks_exact(model.config.vocab_size).map(log_softmax).collect())
}
