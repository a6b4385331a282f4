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
//! Drafts come from a [`crate::proposer::Proposer`]: n-gram lookup, the model's own first
//! layers, or a separate draft model (sampling `k` tokens one batched pass at a time with the
//! request's parameters).

use std::collections::HashMap;

use crate::llm_engine::{now_secs, EngineError, LLMEngine};
use crate::sampler::{
    argmax, draw_weighted, filtered_distribution, processed, sampled, Rng, SamplingContext,
};
use crate::scheduler::SchedulerOutput;
use crate::sequence::{SeqId, SequenceStatus};

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

impl LLMEngine {
    /// Proposes drafts for every running, decoding sequence that may speculate.
    pub(crate) fn propose_drafts(&mut self) {
        let Some(cfg) = self.speculative else { return };
        let Some(proposer) = self.proposer.as_deref() else { return };
        let draft_cost =
            cfg.draft_cost.unwrap_or_else(|| proposer.cost(self.model_config.num_layers));
        let max_len = self.max_model_len;
        let decoding = self
            .scheduler
            .seqs
            .values()
            .filter(|s| s.status == SequenceStatus::Running && s.is_decoding())
            .count();
        let batch_ok = decoding < cfg.disable_batch_size;
        for seq in self.scheduler.seqs.values_mut() {
            seq.spec_tokens.clear();
            seq.spec_probs.clear();
            if !batch_ok
                || !seq.speculate
                || seq.status != SequenceStatus::Running
                || !seq.is_decoding()
            {
                continue;
            }
            // Room for the drafts and the token verification adds after them.
            let left =
                seq.params.max_tokens.saturating_sub(seq.num_output_tokens()).saturating_sub(1);
            let room = max_len.saturating_sub(seq.len()).saturating_sub(1);
            let k = seq.spec.budget(cfg.num_tokens, cfg.cost_slope, draft_cost).min(left).min(room);
            if k > 0 {
                // Model drafts: placeholders whose slots the schedule reserves; a pass fills them.
                seq.spec_tokens = proposer.propose(&seq.token_ids, k).unwrap_or_else(|| vec![0; k]);
            }
        }
    }

    /// Drops drafts the schedule did not make room for.
    pub(crate) fn fit_drafts(&mut self, plan: &SchedulerOutput) {
        let scheduled: HashMap<SeqId, usize> =
            plan.scheduled.iter().map(|s| (s.seq_id, s.num_tokens)).collect();
        for seq in self.scheduler.seqs.values_mut() {
            if seq.spec_tokens.is_empty() {
                continue;
            }
            match scheduled.get(&seq.seq_id) {
                Some(&n) => seq.spec_tokens.truncate(n.saturating_sub(1)),
                None => seq.spec_tokens.clear(),
            }
        }
    }

    /// Uses `draft` (a model with the same vocabulary, loaded with a KV pool of at least this
    /// engine's blocks of the same size) to propose drafts. Its K/V live in the same block ids
    /// as the target's, so it needs no block manager of its own; a sequence's draft K/V are
    /// rebuilt whenever its blocks change (preemption).
    pub fn set_draft_model(&mut self, draft: crate::Model) -> Result<(), EngineError> {
        let spec = draft.backend.kv_cache_spec();
        let mine = self.runner.backend.kv_cache_spec();
        if draft.config.vocab_size != self.model_config.vocab_size {
            return Err(EngineError::InvalidRequest(format!(
                "the draft model's vocabulary ({}) differs from the model's ({})",
                draft.config.vocab_size, self.model_config.vocab_size
            )));
        }
        if spec.block_size != mine.block_size || spec.num_blocks < mine.num_blocks {
            return Err(EngineError::InvalidRequest(format!(
                "the draft model's KV pool ({} blocks of {}) must cover the model's ({} blocks of {})",
                spec.num_blocks, spec.block_size, mine.num_blocks, mine.block_size
            )));
        }
        let relative_cost = crate::proposer::macs_per_token(&draft.config)
            / crate::proposer::macs_per_token(&self.model_config);
        self.proposer =
            Some(Box::new(crate::proposer::DraftModel { backend: draft.backend, relative_cost }));
        Ok(())
    }

    /// Self-speculation: fills the scheduled sequences' draft slots with tokens sampled from the
    /// model's first `draft_layers` layers, one pass per draft position over every drafting
    /// sequence, keeping each draft distribution for the rejection rule.
    pub(crate) fn run_draft_model(&mut self, plan: &SchedulerOutput) -> Result<(), EngineError> {
        let Some(proposer) = self.proposer.as_deref() else { return Ok(()) };
        if !proposer.runs_model() {
            return Ok(()); // drafts were known before the step
        }
        let own_kv = proposer.own_kv();
        let ids: Vec<SeqId> = plan
            .scheduled
            .iter()
            .map(|s| s.seq_id)
            .filter(|id| !self.scheduler.seqs[id].spec_tokens.is_empty())
            .collect();
        let k_max =
            ids.iter().map(|id| self.scheduler.seqs[id].spec_tokens.len()).max().unwrap_or(0);
        let bs = self.scheduler.block_manager.block_size();
        let vocab = self.model_config.vocab_size;
        for j in 0..k_max {
            let mut batch = crate::backend::ForwardBatch::default();
            let mut rows: Vec<SeqId> = Vec::new();
            for &id in &ids {
                let seq = self.scheduler.seqs.get_mut(&id).expect("drafting sequence exists");
                if seq.spec_tokens.len() <= j {
                    continue;
                }
                let pos = seq.num_computed_tokens + j;
                if j == 0 && own_kv {
                    // A separate draft catches up on every token it has not seen yet.
                    let same_blocks = seq.draft_blocks.len() <= seq.block_table.blocks.len()
                        && seq.block_table.blocks.starts_with(&seq.draft_blocks);
                    if !same_blocks {
                        seq.draft_computed = 0;
                    }
                    let from = seq.draft_computed.min(pos);
                    batch.push_seq(
                        &seq.token_ids[from..=pos],
                        from,
                        &seq.block_table.blocks,
                        bs,
                        crate::backend::Logits::Last,
                    );
                } else {
                    let tok = if j == 0 { seq.token_ids[pos] } else { seq.spec_tokens[j - 1] };
                    batch.push_seq(
                        &[tok],
                        pos,
                        &seq.block_table.blocks,
                        bs,
                        crate::backend::Logits::Last,
                    );
                }
                if own_kv {
                    seq.draft_computed = pos + 1;
                    seq.draft_blocks.clone_from(&seq.block_table.blocks);
                }
                rows.push(id);
            }
            let proposer = self.proposer.as_deref_mut().expect("checked above");
            let logits = proposer.forward(&mut *self.runner.backend, &batch)?;
            for (id, row) in rows.into_iter().zip(logits.chunks_exact(vocab)) {
                let eos = &self.tokenizer.eos_token_ids;
                let seq = self.scheduler.seqs.get_mut(&id).expect("drafting sequence exists");
                let params = seq.params.clone();
                let (token, q) = {
                    let ctx = SamplingContext {
                        prompt: &seq.token_ids[..seq.prompt_len],
                        output: seq.output_ids(),
                        eos_token_ids: eos,
                    };
                    let work = processed(row, &params, &ctx);
                    if params.is_greedy() {
                        (argmax(&work), None)
                    } else {
                        let dist = filtered_distribution(&work, &params);
                        let mut rng = Rng::new(seq.rng.next_u64());
                        let t = draw_weighted(&dist, &mut rng);
                        let mut q = vec![0f32; vocab];
                        for (i, p) in dist {
                            q[i as usize] = p as f32;
                        }
                        (t, Some(q))
                    }
                };
                seq.spec_tokens[j] = token;
                if let Some(q) = q {
                    seq.spec_probs.push(q);
                }
            }
        }
        Ok(())
    }

    /// Verifies a sequence's drafts against the target's `rows` (one per fed token): appends
    /// the accepted drafts and one token of the target's, marks the valid KV computed, and
    /// gives back the blocks that only held rejected drafts.
    pub(crate) fn verify_drafts(
        &mut self,
        id: SeqId,
        rows: &[f32],
        finished: &mut Vec<SeqId>,
    ) -> Result<(), EngineError> {
        let vocab = self.model_config.vocab_size;
        let max_len = self.max_model_len;
        let seq = self.scheduler.seqs.get_mut(&id).expect("verified sequence exists");
        let drafts = std::mem::take(&mut seq.spec_tokens);
        let probs = std::mem::take(&mut seq.spec_probs);
        let k = drafts.len();
        debug_assert_eq!(rows.len(), (k + 1) * vocab);
        let params = seq.params.clone();
        let mut rng = seq.rng.clone();
        let mut accepted = 0usize;
        let mut done = false;
        for i in 0..=k {
            let row = &rows[i * vocab..(i + 1) * vocab];
            let (token, is_draft) = {
                let ctx = SamplingContext {
                    prompt: &seq.token_ids[..seq.prompt_len],
                    output: seq.output_ids(),
                    eos_token_ids: &self.tokenizer.eos_token_ids,
                };
                let work = processed(row, &params, &ctx);
                match (drafts.get(i), params.is_greedy()) {
                    (Some(&d), true) => {
                        let t = argmax(&work);
                        (t, t == d)
                    }
                    (Some(&d), false) => {
                        let q = probs.get(i).map_or(DraftDist::PointMass, |q| DraftDist::Probs(q));
                        accept_or_resample(&filtered_distribution(&work, &params), d, &q, &mut rng)
                    }
                    (None, true) => (argmax(&work), false),
                    (None, false) => {
                        (draw_weighted(&filtered_distribution(&work, &params), &mut rng), false)
                    }
                }
            };
            self.stats.generation_tokens += 1;
            done = seq.append_token(sampled(row, token, &params), &self.tokenizer, max_len)?;
            if is_draft {
                accepted += 1;
                self.stats.spec_accepted_per_position[i.min(7)] += 1;
            }
            if done || !is_draft {
                break;
            }
        }
        seq.rng = rng;
        seq.spec.update(k, accepted);
        self.stats.spec_drafts += 1;
        self.stats.spec_draft_tokens += k as u64;
        self.stats.spec_accepted_tokens += accepted as u64;
        if done {
            seq.metrics.finished_time = Some(now_secs());
            finished.push(id);
        }
        // Valid KV: the fed last token and the accepted drafts.
        self.scheduler.mark_computed(id, 1 + accepted);
        let bs = self.scheduler.block_manager.block_size();
        let seq = self.scheduler.seqs.get_mut(&id).expect("verified sequence exists");
        seq.draft_computed = seq.draft_computed.min(seq.num_computed_tokens);
        let keep = seq.num_computed_tokens.div_ceil(bs);
        self.scheduler.block_manager.truncate(&mut seq.block_table, keep);
        seq.draft_blocks.truncate(keep);
        Ok(())
    }
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
