//! `SamplingParams`: how one request's tokens are chosen and when it stops (seed 000's
//! parameters, with OpenAI / vLLM semantics).

use serde::{Deserialize, Serialize};

use crate::sampling::beam::{BeamSearch, MAX_WIDTH};
use crate::sampling::structured::StructuredOutput;

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
    /// Added to a token's logit before sampling (OpenAI's `logit_bias`: -100 bans, 100 forces).
    pub logit_bias: Vec<(u32, f32)>,
    /// What the output must follow (a JSON schema, regex, choice or grammar); tokens that
    /// cannot continue it are masked before sampling.
    pub structured: Option<StructuredOutput>,
    /// Log-probability of every prompt token after the first, with this many most likely
    /// alternatives (vLLM's `prompt_logprobs`; completions' `echo` with `logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// Beam search instead of sampling: `n` beams, ranked at the end (see [`crate::sampling::beam`]).
    pub beam_search: Option<BeamSearch>,
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
            logit_bias: Vec::new(),
            structured: None,
            prompt_logprobs: None,
            beam_search: None,
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

    /// Whether sampling may read logits far below the row's best as they are: log-probs are
    /// reported (or rank beams), or a bias, penalty or grammar can lift an unlikely token to the
    /// top. Rows of other requests may have their far entries approximate (the CPU backend's
    /// two-pass LM head: `backend::Logits::Last`).
    pub fn reads_far_logits(&self) -> bool {
        self.logprobs.is_some()
            || self.prompt_logprobs.is_some()
            || self.beam_search.is_some()
            || self.structured.is_some()
            || !self.logit_bias.is_empty()
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Whether the next token is the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Whether any penalty or bias changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
            || !self.logit_bias.is_empty()
    }

    /// Whether the next token depends on the logits row (with a structured-output mask, which
    /// travels with it), temperature, filters and one random draw only (no penalties, no
    /// alternatives reported): a backend can then choose it where the logits are, without
    /// copying them out.
    pub fn is_plain(&self) -> bool {
        !self.has_penalties()
            && self.logprobs.unwrap_or(0) == 0
            && self.prompt_logprobs.is_none()
            && self.beam_search.is_none()
    }

    /// The rules every request's parameters must meet, wherever it enters (the engine's
    /// `add_request`, the router before anything is queued, the workers' gRPC services):
    /// the error names the parameter as the OpenAI API spells it. `vocab_size` bounds the stop
    /// token ids.
    pub fn validate(&self, vocab_size: usize) -> Result<(), ParamError> {
        let range = |param: &'static str, v: f32, lo: f32, hi: f32| {
            if v.is_finite() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(ParamError::new(
                    param,
                    format!("{param} must be between {lo} and {hi}, got {v}"),
                ))
            }
        };
        if !(1..=MAX_N).contains(&self.n) {
            return Err(ParamError::new(
                "n",
                format!("n must be between 1 and {MAX_N}, got {}", self.n),
            ));
        }
        range("temperature", self.temperature, 0.0, 2.0)?;
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ParamError::new(
                "top_p",
                format!("top_p must be in (0, 1], got {}", self.top_p),
            ));
        }
        if self.top_k < -1 {
            return Err(ParamError::new(
                "top_k",
                format!("top_k must be -1 (disabled) or a positive count, got {}", self.top_k),
            ));
        }
        range("min_p", self.min_p, 0.0, 1.0)?;
        range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0 && r <= 2.0) {
            return Err(ParamError::new(
                "repetition_penalty",
                format!("repetition_penalty must be in (0, 2], got {r}"),
            ));
        }
        if self.max_tokens == 0 {
            return Err(ParamError::new("max_tokens", "max_tokens must be at least 1"));
        }
        if self.min_tokens > self.max_tokens {
            return Err(ParamError::new(
                "min_tokens",
                format!(
                    "min_tokens ({}) must be at most max_tokens, the completion budget ({})",
                    self.min_tokens, self.max_tokens
                ),
            ));
        }
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return Err(ParamError::new(
                "logprobs",
                format!("logprobs must be between 0 and {MAX_LOGPROBS}, got {k}"),
            ));
        }
        if let Some(k) = self.prompt_logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return Err(ParamError::new(
                "prompt_logprobs",
                format!("prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {k}"),
            ));
        }
        if self.stop.len() > MAX_STOP {
            return Err(ParamError::new(
                "stop",
                format!("stop may hold at most {MAX_STOP} sequences, got {}", self.stop.len()),
            ));
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return Err(ParamError::new("stop", "stop sequences must not be empty"));
        }
        if !self.detokenize && !self.stop.is_empty() {
            return Err(ParamError::new("stop", "stop strings need detokenized output"));
        }
        if let Some(&t) = self.stop_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(ParamError::new(
                "stop_token_ids",
                format!("stop_token_ids holds {t}, outside the vocabulary (0..{vocab_size})"),
            ));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(ParamError::new(
                "logit_bias",
                format!(
                    "logit_bias may hold at most {MAX_LOGIT_BIAS} tokens, got {}",
                    self.logit_bias.len()
                ),
            ));
        }
        for &(t, b) in &self.logit_bias {
            if t as usize >= vocab_size {
                return Err(ParamError::new(
                    "logit_bias",
                    format!("logit_bias names token {t}, outside the vocabulary (0..{vocab_size})"),
                ));
            }
            range("logit_bias", b, -100.0, 100.0)?;
        }
        if self.structured.is_some() && self.ignore_eos {
            return Err(ParamError::new(
                "ignore_eos",
                "ignore_eos cannot be combined with structured outputs, which end where their text is complete",
            ));
        }
        if let Some(b) = &self.beam_search {
            check_beam(self, b)?;
        }
        Ok(())
    }
}

/// The rules a beam-search request must meet besides the general ones: the error names the
/// parameter that cannot go with it.
fn check_beam(p: &SamplingParams, b: &BeamSearch) -> Result<(), ParamError> {
    let refuse = |param: &'static str, why: &str| {
        Err(ParamError::new(param, format!("{param} cannot be combined with beam search: {why}")))
    };
    if !(1..=MAX_WIDTH).contains(&p.n) {
        return refuse("n", &format!("n is the beam width, 1 to {MAX_WIDTH}"));
    }
    let lp = b.length_penalty;
    if !(lp.is_finite() && (-10.0..=10.0).contains(&lp)) {
        return Err(ParamError::new(
            "length_penalty",
            format!("length_penalty must be between -10 and 10, got {lp}"),
        ));
    }
    // 0 and 1 both mean the model's own log-probabilities, which beams follow.
    if p.temperature != 0.0 && p.temperature != 1.0 {
        return refuse("temperature", "beams follow the model's own log-probabilities");
    }
    let d = SamplingParams::default();
    for (param, set) in [
        ("top_p", p.top_p != d.top_p),
        ("top_k", p.top_k > 0),
        ("min_p", p.min_p != d.min_p),
        ("seed", p.seed.is_some()),
    ] {
        if set {
            return refuse(param, "beam search does not sample");
        }
    }
    if p.has_penalties() {
        return refuse("logit_bias", "beams follow the model's own log-probabilities");
    }
    if !p.stop.is_empty() || !p.stop_token_ids.is_empty() {
        return refuse("stop", "beams end at end-of-sequence or max_tokens");
    }
    if p.logprobs.is_some() || p.prompt_logprobs.is_some() {
        return refuse("logprobs", "beams report their cumulative log-probability only");
    }
    if p.structured.is_some() {
        return refuse("structured_outputs", "constraints are applied by sampling only");
    }
    Ok(())
}

/// Most completions one request may ask for.
pub const MAX_N: usize = 128;
/// Most stop strings one request may give.
pub const MAX_STOP: usize = 16;
/// Most tokens one request may bias (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;

/// A sampling parameter breaks a rule of [`SamplingParams::validate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParamError {
    /// The parameter, as the OpenAI API names it.
    pub param: &'static str,
    /// What is wrong, fit for an API error.
    pub message: String,
}

impl ParamError {
    pub(crate) fn new(param: &'static str, message: impl Into<String>) -> Self {
        ParamError { param, message: message.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_logits_are_read_by_reported_log_probs_biases_penalties_and_grammars() {
        let plain =
            SamplingParams { temperature: 0.8, top_p: 0.9, top_k: 40, ..Default::default() };
        assert!(!plain.reads_far_logits());
        assert!(!SamplingParams::greedy(8).reads_far_logits());
        let each = [
            SamplingParams { logprobs: Some(0), ..plain.clone() },
            SamplingParams { prompt_logprobs: Some(1), ..plain.clone() },
            SamplingParams { logit_bias: vec![(5, 100.0)], ..plain.clone() },
            SamplingParams { presence_penalty: 0.5, ..plain.clone() },
            SamplingParams { frequency_penalty: -0.5, ..plain.clone() },
            SamplingParams { repetition_penalty: 1.1, ..plain.clone() },
            SamplingParams {
                structured: Some(StructuredOutput::Regex("[0-9]+".into())),
                ..plain.clone()
            },
        ];
        for p in each {
            assert!(p.reads_far_logits(), "{p:?}");
        }
    }

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
            SamplingParams { temperature: 2.5, ..Default::default() },
            SamplingParams { top_k: -2, ..Default::default() },
            SamplingParams { stop_token_ids: vec![3, 100], ..Default::default() },
            SamplingParams { stop: vec!["x".into(); 17], ..Default::default() },
        ];
        let names = [
            "temperature",
            "top_p",
            "n",
            "min_tokens",
            "logprobs",
            "stop",
            "repetition_penalty",
            "temperature",
            "temperature",
            "top_k",
            "stop_token_ids",
            "stop",
        ];
        for (p, name) in bad.iter().zip(names) {
            let e = p.validate(100).unwrap_err();
            assert_eq!(e.param, name, "{e}");
            assert!(e.message.starts_with(name), "{e}");
        }
        assert!(SamplingParams::default().validate(100).is_ok());
    }

    #[test]
    fn json_defaults() {
        let p: SamplingParams =
            serde_json::from_str(r#"{"temperature": 0.5, "stop": ["\n"]}"#).unwrap();
        assert_eq!(p.temperature, 0.5);
        assert_eq!(p.max_tokens, 16);
        assert_eq!(p.stop, vec!["\n".to_string()]);
    }

    #[test]
    fn sampling_parameters_are_refused_by_name() {
        let b = BeamSearch::default();
        let ok = SamplingParams { n: 4, temperature: 0.0, ..Default::default() };
        assert!(check_beam(&ok, &b).is_ok());
        let cases: Vec<(SamplingParams, &str)> = vec![
            (SamplingParams { n: 11, ..ok.clone() }, "n"),
            (SamplingParams { temperature: 0.7, ..ok.clone() }, "temperature"),
            (SamplingParams { top_p: 0.9, ..ok.clone() }, "top_p"),
            (SamplingParams { seed: Some(1), ..ok.clone() }, "seed"),
            (SamplingParams { stop: vec!["x".into()], ..ok.clone() }, "stop"),
            (SamplingParams { logprobs: Some(1), ..ok.clone() }, "logprobs"),
            (SamplingParams { presence_penalty: 0.5, ..ok.clone() }, "logit_bias"),
        ];
        for (p, param) in cases {
            assert_eq!(check_beam(&p, &b).unwrap_err().param, param, "{p:?}");
        }
        let bad = BeamSearch { length_penalty: f64::NAN };
        assert_eq!(check_beam(&ok, &bad).unwrap_err().param, "length_penalty");
    }
}
