//! `SamplingParams`: how one request's tokens are chosen and when it stops (seed 000's
//! parameters, with OpenAI / vLLM semantics).

use serde::{Deserialize, Serialize};

/// Per-request sampling and stopping parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Number of completions to generate for the prompt (they share its KV blocks).
    pub n: usize,
    /// Softmax temperature; 0 selects greedy decoding.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens (0 or negative: disabled).
    pub top_k: i32,
    /// Drop tokens whose probability is below `min_p` times the most likely one's.
    pub min_p: f32,
    /// Subtracted from the logit of every token already generated (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (OpenAI semantics).
    pub frequency_penalty: f32,
    /// Divides positive / multiplies negative logits of tokens seen in prompt or output (> 1
    /// discourages repetition; vLLM semantics).
    pub repetition_penalty: f32,
    /// Maximum number of generated tokens.
    pub max_tokens: usize,
    /// End-of-sequence, stop tokens and stop strings are ignored before this many tokens.
    pub min_tokens: usize,
    /// Strings that end generation; matched across token boundaries.
    pub stop: Vec<String>,
    /// Token ids that end generation.
    pub stop_token_ids: Vec<u32>,
    /// Keep the matched stop string at the end of the output text.
    pub include_stop_str_in_output: bool,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Number of most likely alternatives reported with each token (None = log-probs off).
    pub logprobs: Option<usize>,
    /// Seed of this request's random stream (same seed, same output).
    pub seed: Option<u64>,
    /// Leave special tokens out of the output text.
    pub skip_special_tokens: bool,
    /// Turn tokens into text (off: token ids only, as for a model loaded without a tokenizer).
    pub detokenize: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            max_tokens: 16,
            min_tokens: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            include_stop_str_in_output: false,
            ignore_eos: false,
            logprobs: None,
            seed: None,
            skip_special_tokens: true,
            detokenize: true,
        }
    }
}

/// Most alternatives a request may ask log-probabilities for.
pub const MAX_LOGPROBS: usize = 20;

impl SamplingParams {
    /// Greedy decoding of up to `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams { temperature: 0.0, max_tokens, ..Default::default() }
    }

    /// Whether the next token is the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether any penalty changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Whether the next token depends on the logits row, temperature, filters and one random
    /// draw only (no penalties, no alternatives reported): a backend can then choose it where
    /// the logits are, without copying them out.
    pub fn is_plain(&self) -> bool {
        !self.has_penalties() && self.logprobs.unwrap_or(0) == 0
    }

    /// Rejects values no sampler can honour, with a message fit for an API error.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |name: &str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number, got {v}"))
            }
        };
        finite("temperature", self.temperature)?;
        finite("top_p", self.top_p)?;
        finite("min_p", self.min_p)?;
        finite("presence_penalty", self.presence_penalty)?;
        finite("frequency_penalty", self.frequency_penalty)?;
        finite("repetition_penalty", self.repetition_penalty)?;
        if self.n == 0 || self.n > 128 {
            return Err(format!("n must be between 1 and 128, got {}", self.n));
        }
        if self.temperature < 0.0 {
            return Err(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(format!(
                "presence_penalty must be in [-2, 2], got {}",
                self.presence_penalty
            ));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(format!(
                "frequency_penalty must be in [-2, 2], got {}",
                self.frequency_penalty
            ));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 2.0) {
            return Err(format!(
                "repetition_penalty must be in (0, 2], got {}",
                self.repetition_penalty
            ));
        }
        if self.max_tokens == 0 {
            return Err("max_tokens must be at least 1".into());
        }
        if self.min_tokens > self.max_tokens {
            return Err(format!(
                "min_tokens ({}) must not exceed max_tokens ({})",
                self.min_tokens, self.max_tokens
            ));
        }
        if self.logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
            return Err(format!("logprobs must be at most {MAX_LOGPROBS}"));
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return Err("stop strings must not be empty".into());
        }
        if !self.detokenize && !self.stop.is_empty() {
            return Err("stop strings need detokenize".into());
        }
        if self.n > 1 && self.is_greedy() && self.seed.is_none() {
            // Allowed (vLLM allows it); the n completions are then identical.
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_messages_name_the_field() {
        let bad = [
            SamplingParams { temperature: -1.0, ..Default::default() },
            SamplingParams { top_p: 0.0, ..Default::default() },
            SamplingParams { n: 0, ..Default::default() },
            SamplingParams { min_tokens: 20, max_tokens: 10, ..Default::default() },
            SamplingParams { logprobs: Some(21), ..Default::default() },
            SamplingParams { stop: vec![String::new()], ..Default::default() },
            SamplingParams { repetition_penalty: 0.0, ..Default::default() },
            SamplingParams { temperature: f32::NAN, ..Default::default() },
        ];
        let names = [
            "temperature",
            "top_p",
            "n must",
            "min_tokens",
            "logprobs",
            "stop",
            "repetition_penalty",
            "temperature",
        ];
        for (p, name) in bad.iter().zip(names) {
            let e = p.validate().unwrap_err();
            assert!(e.contains(name), "{e}");
        }
        assert!(SamplingParams::default().validate().is_ok());
    }

    #[test]
    fn json_defaults() {
        let p: SamplingParams =
            serde_json::from_str(r#"{"temperature": 0.5, "stop": ["\n"]}"#).unwrap();
        assert_eq!(p.temperature, 0.5);
        assert_eq!(p.max_tokens, 16);
        assert_eq!(p.stop, vec!["\n".to_string()]);
    }
}
