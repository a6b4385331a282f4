//! Beam search (`use_beam_search`, vLLM's algorithm): each step asks a decode worker for the
//! `2 × width` most likely next tokens of every live beam (one token each, greedy, as a batch of
//! prompts routed together), extends the beams with them, keeps the `width` best by cumulative
//! log-probability and sets aside those that ended with end-of-sequence; at the end the finished
//! and live beams are ranked by `cumulative_logprob / length^length_penalty` (length counts the
//! prompt, not a final end-of-sequence token) and the best `n` returned. Each beam's tokens are
//! its prompt: the worker's prefix cache shares the blocks beams have in common, and every
//! step's blocks are freed when its one-token requests end.

use std::time::Instant;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tandem_engine::SamplingParams;

use crate::error::ApiError;
use crate::openai::CommonParams;
use crate::relay::{merged, start, Prepared};
use crate::responses::{self, Endpoint};
use crate::state::AppState;

/// Widest beam search (each step asks for `2 × width` alternatives, at most 20).
pub const MAX_WIDTH: usize = 10;

/// The length penalty when the request asks for beam search (`use_beam_search`), after
/// checking that nothing else it asks for conflicts: sampling, stop strings, log-probabilities,
/// streaming, constraints, tools, `best_of` or `echo` with logprobs (`other`) are a 400 naming
/// the field.
pub(crate) fn requested(
    c: &CommonParams,
    p: &SamplingParams,
    other: bool,
) -> Result<Option<f64>, ApiError> {
    if c.use_beam_search != Some(true) {
        if c.length_penalty.is_some() {
            return Err(ApiError::invalid(
                Some("length_penalty"),
                "length_penalty applies to beam search only (use_beam_search: true)",
            ));
        }
        return Ok(None);
    }
    let refuse = |param: &str, why: &str| {
        Err(ApiError::invalid(
            Some(param),
            format!("{param} cannot be combined with use_beam_search: {why}"),
        ))
    };
    let d = SamplingParams::default();
    if c.stream == Some(true) {
        return refuse("stream", "the beams are ranked at the end");
    }
    // 0 and 1 both mean the model's own log-probabilities, which beams follow.
    if c.temperature.is_some_and(|t| t != 0.0 && t != 1.0) {
        return refuse("temperature", "beams follow the model's own log-probabilities");
    }
    for (param, set) in [
        ("top_p", p.top_p != d.top_p),
        ("top_k", p.top_k > 0),
        ("min_p", p.min_p != d.min_p),
        ("seed", c.seed.is_some()),
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
    if p.logprobs.is_some() || p.structured.is_some() || other {
        return refuse(
            "use_beam_search",
            "log-probabilities, prompt log-probabilities, constraints, tools, best_of and echo are answered by sampling only",
        );
    }
    if !(1..=MAX_WIDTH).contains(&p.n) {
        return refuse("n", &format!("n is the beam width, 1 to {MAX_WIDTH}"));
    }
    match c.length_penalty.unwrap_or(1.0) {
        lp if lp.is_finite() && (-10.0..=10.0).contains(&lp) => Ok(Some(lp)),
        lp => Err(ApiError::invalid(
            Some("length_penalty"),
            format!("length_penalty must be between -10 and 10, got {lp}"),
        )),
    }
}

/// One hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub struct Beam {
    /// Generated tokens.
    pub tokens: Vec<u32>,
    /// Sum of their log-probabilities.
    pub cum: f64,
}

/// Beam search's ranking: cumulative log-probability over length (prompt included, a final
/// end-of-sequence token not) to the power `length_penalty`.
pub fn score(b: &Beam, prompt_len: usize, eos: &[u32], length_penalty: f64) -> f64 {
    let ended = b.tokens.last().is_some_and(|t| eos.contains(t));
    let len = prompt_len + b.tokens.len() - usize::from(ended);
    b.cum / (len.max(1) as f64).powf(length_penalty)
}

/// One step of the search: `beams` extended by their alternatives `tops` (per beam, token and
/// log-probability), the `width` best kept live and those ending in `eos` moved to `done`.
pub fn step(
    beams: &[Beam],
    tops: &[Vec<(u32, f32)>],
    width: usize,
    eos: &[u32],
    done: &mut Vec<Beam>,
) -> Vec<Beam> {
    let mut next: Vec<Beam> = Vec::new();
    for (b, top) in beams.iter().zip(tops) {
        for &(t, lp) in top {
            let mut tokens = b.tokens.clone();
            tokens.push(t);
            let nb = Beam { tokens, cum: b.cum + lp as f64 };
            if eos.contains(&t) {
                done.push(nb);
            } else {
                next.push(nb);
            }
        }
    }
    // Stable: ties keep the order of their beams and alternatives.
    next.sort_by(|a, b| b.cum.total_cmp(&a.cum));
    next.truncate(width);
    next
}

/// Runs the search for every prompt of `p` (`p.n` is the width) and answers with the best `n`
/// beams of each, as the endpoint's whole response.
pub(crate) async fn run(
    st: &AppState,
    p: &Prepared,
    length_penalty: f64,
    started: Instant,
) -> Result<Value, ApiError> {
    let eos = st.info.tokenizer.eos_token_ids.clone();
    let width = p.n;
    let mut choices: Vec<responses::Choice> = Vec::new();
    let mut prompt_tokens = 0;
    for (prompt, params) in p.prompts.iter().zip(&p.params) {
        prompt_tokens += prompt.len();
        let mut beams = vec![Beam { tokens: Vec::new(), cum: 0.0 }];
        let mut done: Vec<Beam> = Vec::new();
        for _ in 0..params.max_tokens {
            let tops = alternatives(st, p, prompt, &beams, 2 * width).await?;
            beams = step(&beams, &tops, width, &eos, &mut done);
            if beams.is_empty() {
                break;
            }
        }
        done.extend(beams);
        let key = |b: &Beam| score(b, prompt.len(), &eos, length_penalty);
        done.sort_by(|a, b| key(b).total_cmp(&key(a)));
        for b in done.into_iter().take(width) {
            let ended = b.tokens.last().is_some_and(|t| eos.contains(t));
            let shown = &b.tokens[..b.tokens.len() - usize::from(ended)];
            choices.push(responses::Choice {
                text: st.info.tokenizer.decode(shown, true).unwrap_or_default(),
                num_tokens: b.tokens.len(),
                finish_reason: Some(if ended { "stop" } else { "length" }.into()),
                cumulative_logprob: b.cum,
                ..Default::default()
            });
        }
    }
    let h = responses::Header { id: &p.id, created: p.created, model: &st.model_name };
    let mut v = responses::full_response(
        p.ep,
        &h,
        &st.info.tokenizer,
        &choices,
        false,
        prompt_tokens,
        &p.echo,
    );
    for (c, out) in choices.iter().zip(v["choices"].as_array_mut().into_iter().flatten()) {
        out["cumulative_logprob"] = json!(c.cumulative_logprob);
    }
    v["timing"] = json!({ "total_time_ms": started.elapsed().as_secs_f64() * 1000.0 });
    Ok(v)
}

/// The `k` most likely next tokens of each beam (greedy one-token requests, routed together).
async fn alternatives(
    st: &AppState,
    p: &Prepared,
    prompt: &[u32],
    beams: &[Beam],
    k: usize,
) -> Result<Vec<Vec<(u32, f32)>>, ApiError> {
    let one = SamplingParams { logprobs: Some(k), ignore_eos: true, ..SamplingParams::greedy(1) };
    let sub = Prepared {
        prompts: beams.iter().map(|b| [prompt, &b.tokens].concat()).collect(),
        params: vec![one; beams.len()],
        echo: vec![None; beams.len()],
        n: 1,
        keep: 1,
        stream: false,
        ep: Endpoint::Completions,
        tool_names: None,
        tool_format: Default::default(),
        prefill_hint: None,
        echo_logprobs: false,
        prompt_logprobs: None,
        ..p.clone()
    };
    let (_route, streams) = start(st, &sub).await?;
    let mut tops: Vec<Vec<(u32, f32)>> = vec![Vec::new(); beams.len()];
    let mut s = merged(streams);
    while let Some((i, r)) = s.next().await {
        let resp = r.map_err(|e| ApiError::from_status(&e))?;
        for d in &resp.outputs {
            if let Some(first) = d.logprobs.first() {
                tops[i] = first.top.iter().map(|t| (t.token_id, t.logprob)).collect();
            }
        }
    }
    if tops.iter().any(Vec::is_empty) {
        return Err(ApiError::upstream("a decode worker returned no alternatives for a beam"));
    }
    Ok(tops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_keeps_the_best_and_sets_ended_beams_aside() {
        let beams = vec![Beam { tokens: vec![1], cum: -1.0 }, Beam { tokens: vec![2], cum: -0.5 }];
        let tops = vec![vec![(5, -0.1), (9, -0.2), (6, -3.0)], vec![(7, -1.0), (9, -0.05)]];
        let mut done = Vec::new();
        let next = step(&beams, &tops, 2, &[9], &mut done);
        let got: Vec<(Vec<u32>, f64)> = next.iter().map(|b| (b.tokens.clone(), b.cum)).collect();
        assert_eq!((got[0].0.clone(), got[1].0.clone()), (vec![1, 5], vec![2, 7]));
        assert!((got[0].1 - -1.1).abs() < 1e-6 && (got[1].1 - -1.5).abs() < 1e-6);
        assert_eq!(done.len(), 2);
        // The final end-of-sequence token does not count in the length.
        let b = Beam { tokens: vec![2, 9], cum: -0.55 };
        assert!((score(&b, 3, &[9], 1.0) - -0.55 / 4.0).abs() < 1e-12);
        assert!((score(&b, 3, &[9], 0.0) - -0.55).abs() < 1e-12);
    }
}
