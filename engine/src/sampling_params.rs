//! `SamplingParams`: how one request's tokens are chosen and when it stops.

use serde::{Deserialize, Serialize};

/// Per-request sampling and stopping parameters (OpenAI / vLLM semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 selects greedy decoding.
    pub temperature: f32,
    /// Maximum number of generated tokens.
    pub max_tokens: usize,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Seed of this request's random stream (same seed, same output).
    pub seed: Option<u64>,
    /// Number of most likely alternatives reported with each token (0 = log-probs off).
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, max_tokens: 16, ignore_eos: false, seed: None, logprobs: None }
    }
}

impl SamplingParams {
    /// Greedy decoding of up to `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams { temperature: 0.0, max_tokens, ..Default::default() }
    }

    /// Rejects values no sampler can honour.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("temperature must be a finite number >= 0, got {}", self.temperature));
        }
        if self.max_tokens == 0 {
            return Err("max_tokens must be at least 1".into());
        }
        if self.logprobs.is_some_and(|k| k > 20) {
            return Err("logprobs must be at most 20".into());
        }
        Ok(())
    }
}
