//! `RequestOutput` / `CompletionOutput`: what `LLMEngine::step` returns for each request that
//! changed — streaming deltas of text, tokens and log-probabilities, and the request's timing.

use serde::Serialize;

use crate::sampling::sampler::SampledToken;

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// End-of-sequence token, stop token or stop string.
    Stop,
    /// `max_tokens` or the model's context length reached.
    Length,
    /// Aborted by the caller.
    Abort,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What stopped a completion with [`FinishReason::Stop`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum StopReason {
    /// A stop or end-of-sequence token.
    Token(u32),
    /// A stop string.
    Str(String),
}

/// Timing of one request, in seconds since the Unix epoch (vLLM's `RequestMetrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RequestMetrics {
    /// When the request arrived.
    pub arrival_time: f64,
    /// When it was first scheduled.
    pub first_scheduled_time: Option<f64>,
    /// When its first token was produced.
    pub first_token_time: Option<f64>,
    /// When it finished.
    pub finished_time: Option<f64>,
    /// Prompt tokens found in the prefix cache.
    pub num_cached_tokens: usize,
    /// The prompt was prefilled on another worker, which also sampled the first token (so
    /// neither counts as this engine's work in token counters).
    pub remote_prefill: bool,
}

impl RequestMetrics {
    /// Time spent waiting before the first schedule.
    pub fn queue_time(&self) -> Option<f64> {
        Some(self.first_scheduled_time? - self.arrival_time)
    }
    /// Time from first schedule to first token (prefill).
    pub fn prefill_time(&self) -> Option<f64> {
        Some(self.first_token_time? - self.first_scheduled_time?)
    }
    /// Time from first token to finish (decode).
    pub fn decode_time(&self) -> Option<f64> {
        Some(self.finished_time? - self.first_token_time?)
    }
    /// Time to first token, from arrival.
    pub fn ttft(&self) -> Option<f64> {
        Some(self.first_token_time? - self.arrival_time)
    }
}

/// The new part of one completion since the previous output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionOutput {
    /// Index of the completion within the request (0..n).
    pub index: usize,
    /// New text.
    pub text: String,
    /// New token ids.
    pub token_ids: Vec<u32>,
    /// Sum of the log-probabilities of all tokens so far.
    pub cumulative_logprob: f64,
    /// Log-probabilities of the new tokens, when asked for.
    pub logprobs: Vec<SampledToken>,
    /// Set when the completion ended.
    pub finish_reason: Option<FinishReason>,
    /// What stopped it, for [`FinishReason::Stop`].
    pub stop_reason: Option<StopReason>,
}

/// The completions of one [`RequestOutput`].
pub type Completions = smallvec::SmallVec<[CompletionOutput; 1]>;

/// One step's news about a request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestOutput {
    /// The caller's request id.
    pub request_id: String,
    /// Prompt token ids.
    pub prompt_token_ids: std::sync::Arc<Vec<u32>>,
    /// Completions that changed in this step (one, the common case, held inline: a step's
    /// news of a request costs no allocation of its own beyond the deltas).
    pub outputs: Completions,
    /// Whether every completion of the request has ended.
    pub finished: bool,
    /// Log-probabilities of the prompt's tokens after the first (when asked for; sent once,
    /// with the request's first output).
    pub prompt_logprobs: Option<Vec<SampledToken>>,
    /// Timing so far.
    pub metrics: RequestMetrics,
}
