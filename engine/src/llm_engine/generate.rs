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
    let groups = model.backend.kv_groups().num_groups();
    let need = ids.len().div_ceil(spec.block_size) * groups;
    if need > spec.num_blocks {
        return Err(EngineError::Backend(BackendError::InvalidBatch(format!(
            "{} tokens do not fit the KV cache",
            ids.len()
        ))));
    }
    let table: Vec<u32> = (0..need as u32).collect();
    let mut batch = ForwardBatch::with_kv_groups(groups);
    batch.push_seq(ids, 0, &table, spec.block_size, Logits::All);
    let logits = model.backend.forward(&batch)?;
    Ok(logits.chunks_exact(model.config.vocab_size).map(log_softmax).collect())
}

/// Beam search by brute force, the reference the engine's search is tested against: every
/// beam is scored by a whole teacher-forced pass ([`score`]; no KV shared between beams), the
/// `2 × width` best tokens of each expanded, the `width` best extensions kept and those ending
/// in end-of-sequence set aside, for `steps` steps; then all of them ranked by cumulative
/// log-probability over length (prompt included, a final end-of-sequence token not) to the
/// power `length_penalty`. Returns the `width` best as (tokens, cumulative log-probability).
pub fn beam_search_by_scoring(
    model: &mut Model,
    prompt: &[u32],
    width: usize,
    steps: usize,
    length_penalty: f64,
) -> Result<Vec<(Vec<u32>, f64)>, EngineError> {
    let eos = model.tokenizer.eos_token_ids.clone();
    let mut live: Vec<(Vec<u32>, f64)> = vec![(Vec::new(), 0.0)];
    let mut done: Vec<(Vec<u32>, f64)> = Vec::new();
    for _ in 0..steps {
        let mut next = Vec::new();
        for (toks, cum) in &live {
            let ids: Vec<u32> = prompt.iter().chain(toks).copied().collect();
            let rows = score(model, &ids)?;
            let last = rows.last().expect("one row per token");
            let mut order: Vec<usize> = (0..last.len()).collect();
            order.sort_by(|&a, &b| last[b].total_cmp(&last[a]).then(a.cmp(&b)));
            for &t in order.iter().take(2 * width) {
                let mut ext = toks.clone();
                ext.push(t as u32);
                let entry = (ext, cum + last[t] as f64);
                if eos.contains(&(t as u32)) {
                    done.push(entry);
                } else {
                    next.push(entry);
                }
            }
        }
        next.sort_by(|a, b| b.1.total_cmp(&a.1));
        next.truncate(width);
        live = next;
    }
    done.extend(live);
    let key = |(t, cum): &(Vec<u32>, f64)| {
        let ended = t.last().is_some_and(|x| eos.contains(x));
        cum / ((prompt.len() + t.len() - usize::from(ended)) as f64).powf(length_penalty)
    };
    done.sort_by(|a, b| key(b).total_cmp(&key(a)));
    done.truncate(width);
    Ok(done)
}
