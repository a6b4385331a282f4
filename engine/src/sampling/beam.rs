//! Beam search's rules (vLLM's definition): each step extends every live beam by its `2 × width`
//! most likely next tokens, keeps the `width` best extensions by cumulative log-probability and
//! sets aside those that end with end-of-sequence; at the end the ended and live beams are ranked
//! by `cumulative_logprob / length^length_penalty` (the length counts the prompt, not a final
//! end-of-sequence token). The engine runs the search over copy-on-write forks of the beams'
//! block tables (`llm_engine::beam_search`); this module holds the pure parts (the request's
//! rules are `SamplingParams::validate`'s).

use serde::{Deserialize, Serialize};

/// Widest beam search (each step weighs `2 × width` alternatives per beam).
pub const MAX_WIDTH: usize = 10;

/// Beam search for a request: its width is the request's `n` (every beam is returned, best
/// first).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BeamSearch {
    /// The exponent of the length in the final ranking (1: average log-probability per token,
    /// 0: the cumulative log-probability itself).
    pub length_penalty: f64,
}

impl Default for BeamSearch {
    fn default() -> Self {
        BeamSearch { length_penalty: 1.0 }
    }
}

/// One hypothesis: the tokens generated and the sum of their log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct Beam {
    /// Generated tokens.
    pub tokens: Vec<u32>,
    /// Sum of their log-probabilities.
    pub cum: f64,
}

/// A beam's ranking: its cumulative log-probability over its length (prompt included, a final
/// end-of-sequence token not) to the power `length_penalty`.
pub fn score(tokens: &[u32], cum: f64, prompt_len: usize, eos: &[u32], length_penalty: f64) -> f64 {
    let ended = tokens.last().is_some_and(|t| eos.contains(t));
    let len = prompt_len + tokens.len() - usize::from(ended);
    cum / (len.max(1) as f64).powf(length_penalty)
}

/// An extension chosen by a step: beam `parent` (its index among the step's beams) followed by
/// `token`, with the new cumulative log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Extension {
    /// Index of the extended beam.
    pub parent: usize,
    /// The token appended.
    pub token: u32,
    /// Cumulative log-probability after it.
    pub cum: f64,
}

/// One step of the search over beams with cumulative log-probabilities `cums` and their
/// alternatives `tops` (per beam: token and log-probability, best first): returns the `width`
/// best extensions that go on and, separately, every extension by an end-of-sequence token
/// (`eos`; empty when end-of-sequence is ignored). Ties keep the order of beams and
/// alternatives.
pub fn step(
    cums: &[f64],
    tops: &[Vec<(u32, f32)>],
    width: usize,
    eos: &[u32],
) -> (Vec<Extension>, Vec<Extension>) {
    let mut live = Vec::new();
    let mut ended = Vec::new();
    for (parent, (cum, top)) in cums.iter().zip(tops).enumerate() {
        for &(token, lp) in top {
            let e = Extension { parent, token, cum: cum + lp as f64 };
            if eos.contains(&token) {
                ended.push(e);
            } else {
                live.push(e);
            }
        }
    }
    live.sort_by(|a, b| b.cum.total_cmp(&a.cum));
    live.truncate(width);
    (live, ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_keeps_the_best_and_sets_ended_beams_aside() {
        let cums = [-1.0, -0.5];
        let tops = vec![vec![(5, -0.1), (9, -0.2), (6, -3.0)], vec![(7, -1.0), (9, -0.05)]];
        let (live, ended) = step(&cums, &tops, 2, &[9]);
        let got: Vec<(usize, u32)> = live.iter().map(|e| (e.parent, e.token)).collect();
        assert_eq!(got, vec![(0, 5), (1, 7)]);
        assert!((live[0].cum - -1.1).abs() < 1e-6 && (live[1].cum - -1.5).abs() < 1e-6);
        assert_eq!(ended.iter().map(|e| e.parent).collect::<Vec<_>>(), vec![0, 1]);
        // With end-of-sequence ignored, it competes like any token.
        let (live, ended) = step(&cums, &tops, 2, &[]);
        assert!(ended.is_empty());
        assert_eq!((live[0].parent, live[0].token), (1, 9));
    }

    #[test]
    fn the_final_end_of_sequence_token_does_not_count_in_the_length() {
        assert!((score(&[2, 9], -0.55, 3, &[9], 1.0) - -0.55 / 4.0).abs() < 1e-12);
        assert!((score(&[2, 9], -0.55, 3, &[], 1.0) - -0.55 / 5.0).abs() < 1e-12);
        assert!((score(&[2, 9], -0.55, 3, &[9], 0.0) - -0.55).abs() < 1e-12);
    }
}
