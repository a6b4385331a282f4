//! `Proposer`: where speculative drafts come from, behind one trait.
//!
//! - [`NgramProposer`]: prompt lookup — the continuation of the most recent earlier occurrence
//!   of the sequence's last n tokens (no model; drafts known before the step).
//! - [`SelfDraft`]: the model's own first layers, final norm and head (early exit); its K/V for
//!   those layers are exactly what verification writes.
//! - [`DraftModel`]: a separate model with the same vocabulary; its K/V live in a pool that
//!   mirrors the target's block ids and it catches up on tokens it has not seen.
//!
//! Model proposers fill their drafts after scheduling, one batched pass per draft position.

use crate::backend::{BackendError, ForwardBatch, ModelBackend};

/// A source of draft tokens.
pub trait Proposer: Send {
    /// Up to `k` draft tokens for a sequence of `tokens`, when they are known before the step
    /// (lookup proposers); `None` when a model pass produces them after scheduling.
    fn propose(&self, tokens: &[u32], k: usize) -> Option<Vec<u32>>;
    /// One draft pass over `batch` (model proposers): logits of its requested rows.
    fn forward(
        &mut self,
        target: &mut dyn ModelBackend,
        batch: &ForwardBatch,
    ) -> Result<Vec<f32>, BackendError>;
    /// Whether drafts come from a model pass after scheduling (then `propose` gives `None`).
    fn runs_model(&self) -> bool {
        true
    }
    /// Whether the draft keeps K/V of its own that must catch up on unseen tokens.
    fn own_kv(&self) -> bool {
        false
    }
    /// Cost of one draft token, in one-token passes of a `num_layers`-layer target.
    fn cost(&self, num_layers: usize) -> f64;
}

/// Prompt-lookup proposals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramProposer {
    /// Longest n-gram matched.
    pub max_n: usize,
    /// Shortest n-gram matched.
    pub min_n: usize,
}

impl NgramProposer {
    /// Up to `k` tokens following the most recent earlier occurrence of the longest suffix of
    /// `tokens` (between `min_n` and `max_n` long) that occurred before.
    pub fn lookup(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        if k == 0 {
            return Vec::new();
        }
        let len = tokens.len();
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if n >= len {
                continue;
            }
            let suffix = &tokens[len - n..];
            // Most recent earlier occurrence, whose continuation is known.
            for start in (0..len - n).rev() {
                if &tokens[start..start + n] == suffix {
                    let from = start + n;
                    return tokens[from..(from + k).min(len)].to_vec();
                }
            }
        }
        Vec::new()
    }
}

impl Proposer for NgramProposer {
    fn propose(&self, tokens: &[u32], k: usize) -> Option<Vec<u32>> {
        Some(self.lookup(tokens, k))
    }
    fn runs_model(&self) -> bool {
        false
    }
    fn forward(
        &mut self,
        _target: &mut dyn ModelBackend,
        _batch: &ForwardBatch,
    ) -> Result<Vec<f32>, BackendError> {
        Err(BackendError::InvalidBatch("the n-gram proposer runs no model".into()))
    }
    fn cost(&self, _num_layers: usize) -> f64 {
        0.0
    }
}

/// The model's first `layers` layers and its head as the draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelfDraft {
    /// Layers run by the draft.
    pub layers: usize,
}

impl Proposer for SelfDraft {
    fn propose(&self, _tokens: &[u32], _k: usize) -> Option<Vec<u32>> {
        None
    }
    fn forward(
        &mut self,
        target: &mut dyn ModelBackend,
        batch: &ForwardBatch,
    ) -> Result<Vec<f32>, BackendError> {
        target.forward_layers(batch, self.layers)
    }
    fn cost(&self, num_layers: usize) -> f64 {
        // Its layers' share of the compute, plus the head's (about a fifth of a pass here).
        0.2 + 0.8 * (self.layers as f64 / num_layers.max(1) as f64).min(1.0)
    }
}

/// A separate draft model.
pub struct DraftModel {
    /// Its weights and its K/V pool (mirroring the target's block ids).
    pub backend: Box<dyn ModelBackend>,
    /// Its compute per token relative to the target's.
    pub relative_cost: f64,
}

/// Approximate multiply-adds per token of a model: attention and MLP projections plus the head.
pub fn macs_per_token(c: &crate::ModelConfig) -> f64 {
    let (d, l) = (c.hidden_size as f64, c.num_layers as f64);
    let attn = d * (c.q_size() + 2 * c.kv_size()) as f64 + c.q_size() as f64 * d;
    let mlp = 3.0 * d * c.intermediate_size as f64;
    l * (attn + mlp) + d * c.vocab_size as f64
}

impl Proposer for DraftModel {
    fn propose(&self, _tokens: &[u32], _k: usize) -> Option<Vec<u32>> {
        None
    }
    fn forward(
        &mut self,
        _target: &mut dyn ModelBackend,
        batch: &ForwardBatch,
    ) -> Result<Vec<f32>, BackendError> {
        self.backend.forward(batch)
    }
    fn own_kv(&self) -> bool {
        true
    }
    fn cost(&self, _num_layers: usize) -> f64 {
        self.relative_cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_lookup() {
        let p = NgramProposer { max_n: 3, min_n: 1 };
        // "a b c d a b" → the earlier "a b" was followed by "c d a".
        assert_eq!(p.lookup(&[1, 2, 3, 4, 1, 2], 3), vec![3, 4, 1]);
        assert_eq!(p.lookup(&[1, 2, 3, 4, 1, 2], 10), vec![3, 4, 1, 2]);
        // The most recent occurrence wins.
        assert_eq!(p.lookup(&[7, 1, 8, 7, 1, 9, 7, 1], 1), vec![9]);
        assert!(p.lookup(&[1, 2, 3], 2).is_empty());
        assert!(p.lookup(&[1, 2, 1], 0).is_empty());
        // Longer matches are preferred: "5 6" occurs followed by 9, "6" alone more recently by 8.
        let q = NgramProposer { max_n: 2, min_n: 1 };
        assert_eq!(q.lookup(&[5, 6, 9, 6, 8, 5, 6], 1), vec![9]);
        assert_eq!(q.propose(&[5, 6, 9, 6, 8, 5, 6], 1), Some(vec![9]));
        assert_eq!(SelfDraft { layers: 10 }.propose(&[1, 2], 2), None);
        assert!((SelfDraft { layers: 15 }.cost(30) - 0.6).abs() < 1e-12);
    }
}
