//! Speculative decoding (seed 000's algorithm 5): a proposer guesses the next `k` tokens of a
//! decoding sequence, the target model scores all of them in one forward pass over the paged KV
//! cache, and a rejection rule keeps the longest acceptable prefix plus one token of its own.
//!
//! The rule keeps the output distribution exactly the target's, for any sampling parameters:
//! draft token `d` (proposed with probability `q(d)`) is accepted with probability
//! `min(1, p(d) / q(d))`, where `p` is the distribution the request samples from (penalties,
//! temperature, min-p, top-k, top-p applied); on rejection the token is drawn from the residual
//! `max(0, p − q)` renormalised; when every draft is accepted, a bonus token is drawn from the
//! last position. Greedy requests accept a draft when it is the argmax. (The seed's residual,
//! `p − q·p(d)/q(d)`, is not a distribution-preserving rule; this is Leviathan et al.'s.)
//!
//! Drafts come from a [`crate::speculative::proposer::Proposer`]: n-gram lookup, the model's own first
//! layers, or a separate draft model (sampling `k` tokens one batched pass at a time with the
//! request's parameters).
//!
//! This module holds the algorithm's pure parts (settings, the acceptance rule, the per-sequence
//! acceptance estimate and draft length); the engine's speculative step that drives them over
//! the scheduler and the runner is `llm_engine/speculative.rs`.

use crate::sampling::sampler::{draw_weighted, Rng};

/// Speculative decoding settings of an engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeculativeConfig {
    /// Most tokens proposed per step.
    pub num_tokens: usize,
    /// Longest n-gram matched.
    pub ngram_max: usize,
    /// Shortest n-gram matched.
    pub ngram_min: usize,
    /// No proposals while this many sequences or more are decoding (a large batch is already
    /// compute-bound: verifying drafts would cost more than it saves).
    pub disable_batch_size: usize,
    /// Cost of each extra token in a verification pass, in one-token passes.
    pub cost_slope: f64,
    /// Draft with the target's own first `n` layers and its head (self-speculation) instead of
    /// n-gram lookup.
    pub draft_layers: Option<usize>,
    /// Cost of one draft token, in one-token target passes; `None`: estimated from the layer
    /// count for a self-draft (its layers' share of the compute plus the head's), from the
    /// models' sizes for a separate draft model, 0 for n-gram.
    pub draft_cost: Option<f64>,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        SpeculativeConfig {
            num_tokens: 4,
            ngram_max: 4,
            ngram_min: 2,
            disable_batch_size: 4,
            cost_slope: 0.2,
            draft_layers: None,
            draft_cost: None,
        }
    }
}

/// How a draft token was proposed.
#[derive(Debug, Clone, PartialEq)]
pub enum DraftDist<'a> {
    /// Deterministically (n-gram): `q(d) = 1`.
    PointMass,
    /// Sampled from this distribution over the vocabulary (a draft model's).
    Probs(&'a [f32]),
}

impl DraftDist<'_> {
    /// Probability of `id` when `draft` was proposed.
    fn q(&self, draft: u32, id: u32) -> f64 {
        match self {
            DraftDist::PointMass => (id == draft) as u8 as f64,
            DraftDist::Probs(q) => q.get(id as usize).copied().unwrap_or(0.0) as f64,
        }
    }
}

/// Accepts `draft` or draws the replacement from the residual. `p` is the target's
/// distribution (token, probability) as the request samples from it. Returns the token and
/// whether it is the draft.
pub fn accept_or_resample(
    p: &[(u32, f64)],
    draft: u32,
    q: &DraftDist,
    rng: &mut Rng,
) -> (u32, bool) {
    let pd = p.iter().find(|(t, _)| *t == draft).map_or(0.0, |x| x.1);
    let qd = q.q(draft, draft);
    if qd > 0.0 && rng.next_f64() < (pd / qd).min(1.0) {
        return (draft, true);
    }
    let residual: Vec<(u32, f64)> =
        p.iter().map(|&(t, pt)| (t, (pt - q.q(draft, t)).max(0.0))).filter(|x| x.1 > 0.0).collect();
    if residual.is_empty() {
        // p ≤ q everywhere means p = q: the draft distribution is the target's; resample it.
        return (draw_weighted(p, rng), false);
    }
    (draw_weighted(&residual, rng), false)
}

/// Per-sequence choice of how many tokens to propose. It estimates the probability `α` that a
/// draft token is accepted (a decayed maximum-likelihood estimate: `a` accepted of a draft that
/// stopped at its first rejection counts `a` successes in `a + 1` trials) and proposes the `k`
/// that maximises expected tokens per unit of verification cost,
/// `(1 − α^(k+1)) / (1 − α)` over `1 + slope·k` — a pass over `k + 1` tokens costs
/// `1 + slope·k` one-token passes (about 0.2 for a whole decode step on the fast CPU kernels,
/// where fixed per-step work dilutes the matmuls' 0.4; near 0 on a GPU). When no `k ≥ 1` beats
/// plain decoding the sequence does not speculate, and retries after a pause.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecState {
    successes: f64,
    trials: f64,
    pause: u32,
}

/// Decay of the acceptance estimate per verified draft.
const DECAY: f64 = 0.8;
/// Steps without proposals after the estimate says speculation does not pay.
const PAUSE: u32 = 16;

impl SpecState {
    /// A fresh estimate (optimistic: α = 0.75 from 3 of 4).
    pub fn new() -> SpecState {
        SpecState { successes: 3.0, trials: 4.0, pause: 0 }
    }

    /// The estimated acceptance probability of a draft token.
    pub fn alpha(&self) -> f64 {
        (self.successes / self.trials).clamp(0.0, 0.99)
    }

    /// How many tokens to propose this step (at most `k_max`; 0: do not speculate), with a
    /// verification cost slope `slope` and a per-draft-token cost `draft_cost`.
    pub fn budget(&mut self, k_max: usize, slope: f64, draft_cost: f64) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            if self.pause == 0 {
                // Try again, from a neutral estimate.
                self.successes = 1.0;
                self.trials = 2.0;
            }
            return 0;
        }
        let k = best_k(self.alpha(), k_max, slope + draft_cost);
        if k == 0 {
            self.pause = PAUSE;
        }
        k
    }

    /// Records a verified draft of `proposed` tokens of which `accepted` were kept.
    pub fn update(&mut self, proposed: usize, accepted: usize) {
        let trials = accepted as f64 + if accepted < proposed { 1.0 } else { 0.0 };
        self.successes = self.successes * DECAY + accepted as f64;
        self.trials = self.trials * DECAY + trials;
    }
}

/// A speculating sequence's state, kept in `Sequence::spec` (`None`: the sequence does not
/// speculate).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecSeq {
    /// Draft tokens proposed for this step; not part of the sequence's tokens until verified.
    pub drafts: Vec<u32>,
    /// Draft distributions of `drafts` (a sampling draft model's), one per draft.
    pub draft_probs: Vec<Vec<f32>>,
    /// The acceptance estimate that chooses how many tokens to propose next.
    pub estimate: SpecState,
    /// Tokens whose K/V a separate draft model holds (in its mirror of the block table).
    pub draft_computed: usize,
    /// The block table the draft model's K/V were written under.
    pub draft_blocks: Vec<u32>,
}

impl Default for SpecState {
    fn default() -> Self {
        SpecState::new()
    }
}

/// The draft length maximising expected tokens per unit of cost (0 when none beats plain
/// decoding's one token per unit).
pub fn best_k(alpha: f64, k_max: usize, slope: f64) -> usize {
    let mut best = (0usize, 1.0f64);
    let mut expected = 1.0;
    let mut term = 1.0;
    for k in 1..=k_max {
        term *= alpha;
        expected += term;
        let rate = expected / (1.0 + slope * k as f64);
        if rate > best.1 * 1.02 {
            best = (k, rate);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_length_follows_acceptance_and_cost() {
        // Free verification (GPU-like): propose as much as allowed when acceptance is decent.
        assert_eq!(best_k(0.7, 4, 0.0), 4);
        // CPU-like cost: long drafts only pay at high acceptance; low acceptance: none.
        assert!(best_k(0.95, 8, 0.5) >= 4);
        assert!(best_k(0.8, 8, 0.5) >= 1);
        assert_eq!(best_k(0.3, 8, 0.5), 0);
        assert_eq!(best_k(0.9, 0, 0.5), 0);
    }

    #[test]
    fn acceptance_estimate_and_pause() {
        let mut s = SpecState::new();
        assert!(s.budget(4, 0.5, 0.0) >= 1, "optimistic start");
        for _ in 0..10 {
            s.update(3, 0);
        }
        assert!(s.alpha() < 0.1);
        assert_eq!(s.budget(4, 0.5, 0.0), 0, "no longer worth it");
        // Paused, then retried from a neutral estimate.
        assert_eq!((0..PAUSE).map(|_| s.budget(4, 0.5, 0.0)).sum::<usize>(), 0);
        assert!((s.alpha() - 0.5).abs() < 1e-9);
        for _ in 0..10 {
            s.update(4, 4);
        }
        assert!(s.alpha() > 0.9);
        assert!(s.budget(4, 0.5, 0.0) >= 3);
        // An expensive draft model lowers the length that pays.
        assert!(s.budget(4, 0.5, 1.0) < 3);
    }

    /// Pearson's chi-square statistic of `counts` against probabilities `p`.
    fn chi2(counts: &[u64], p: &[f64]) -> f64 {
        let n: u64 = counts.iter().sum();
        counts
            .iter()
            .zip(p)
            .map(|(&c, &pi)| (c as f64 - n as f64 * pi).powi(2) / (n as f64 * pi))
            .sum()
    }

    #[test]
    fn the_rejection_rule_preserves_the_target_distribution() {
        // 8 tokens; 99.9th percentile of chi-square with 7 degrees of freedom: 24.32 (the seed is
        // fixed, so the outcome is too).
        let p: Vec<(u32, f64)> = [0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02]
            .iter()
            .enumerate()
            .map(|(i, &x)| (i as u32, x))
            .collect();
        let probs: Vec<f64> = p.iter().map(|x| x.1).collect();
        let n = 200_000;
        let q_model: Vec<f32> = vec![0.05, 0.05, 0.40, 0.10, 0.10, 0.10, 0.10, 0.10];
        let mut rng = Rng::new(12345);
        // n-gram drafts (point mass) of every token, and a draft model's samples.
        for case in 0..3 {
            let mut counts = vec![0u64; 8];
            for i in 0..n {
                let (draft, q) = match case {
                    0 => (0u32, DraftDist::PointMass),
                    1 => ((i % 8) as u32, DraftDist::PointMass),
                    _ => {
                        // Draw the draft from q_model, as a draft model would.
                        let mut u = rng.next_f64() as f32;
                        let mut d = 7;
                        for (t, &qt) in q_model.iter().enumerate() {
                            if u < qt {
                                d = t;
                                break;
                            }
                            u -= qt;
                        }
                        (d as u32, DraftDist::Probs(&q_model))
                    }
                };
                let (t, _) = accept_or_resample(&p, draft, &q, &mut rng);
                counts[t as usize] += 1;
            }
            let x2 = chi2(&counts, &probs);
            assert!(x2 < 24.32, "case {case}: chi-square {x2:.2} over {counts:?}");
        }
        // The test can fail: a 2 % shift of probability mass is detected at this sample size.
        let shifted: Vec<f64> = vec![0.28, 0.22, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02];
        let mut counts = vec![0u64; 8];
        for _ in 0..n {
            let (t, _) = accept_or_resample(&p, 0, &DraftDist::PointMass, &mut rng);
            counts[t as usize] += 1;
        }
        assert!(chi2(&counts, &shifted) > 24.32, "a 2 % shift must be visible");
    }

    #[test]
    fn acceptance_probability() {
        let p = vec![(0u32, 0.25), (1, 0.75)];
        let mut rng = Rng::new(3);
        let acc = (0..40_000)
            .filter(|_| accept_or_resample(&p, 1, &DraftDist::PointMass, &mut rng).1)
            .count() as f64
            / 40_000.0;
        assert!((acc - 0.75).abs() < 0.01, "{acc}");
        // A draft the target cannot produce is never accepted.
        let p = vec![(0u32, 1.0)];
        assert_eq!(accept_or_resample(&p, 5, &DraftDist::PointMass, &mut rng), (0, false));
    }
}
