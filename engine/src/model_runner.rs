//! `ModelRunner`: turns a [`SchedulerOutput`] into device work — block swaps and copies, then
//! one forward pass over the flattened batch — and hands back the logits of every sequence that
//! is ready to sample. It knows the model and the KV cache, not the requests.

use std::collections::HashMap;

use crate::backend::{BackendError, ForwardBatch, Logits, ModelBackend};
use crate::scheduler::SchedulerOutput;
use crate::sequence::{SeqId, Sequence};

/// Runs scheduled steps on a backend.
pub struct ModelRunner {
    /// The device.
    pub backend: Box<dyn ModelBackend>,
}

impl ModelRunner {
    /// Wraps a backend.
    pub fn new(backend: Box<dyn ModelBackend>) -> Self {
        ModelRunner { backend }
    }

    /// Builds the batch of a step: each scheduled sequence's next tokens with their positions and
    /// slots; logits are asked for the sequences whose tokens are then all computed.
    pub fn prepare(&self, out: &SchedulerOutput, seqs: &HashMap<SeqId, Sequence>) -> (ForwardBatch, Vec<SeqId>) {
        let bs = self.backend.kv_cache_spec().block_size;
        let mut batch = ForwardBatch::default();
        let mut sampled = Vec::new();
        for s in &out.scheduled {
            let seq = &seqs[&s.seq_id];
            let start = seq.num_computed_tokens;
            if !seq.spec_tokens.is_empty() {
                // Verification: the last token and the drafts, with logits at every position.
                let mut toks = seq.token_ids[start..].to_vec();
                toks.extend_from_slice(&seq.spec_tokens);
                debug_assert_eq!(toks.len(), s.num_tokens);
                batch.push_seq(&toks, start, &seq.block_table.blocks, bs, Logits::All);
                sampled.push(s.seq_id);
                continue;
            }
            let end = start + s.num_tokens;
            let completes = end == seq.len();
            let logits = if completes { Logits::Last } else { Logits::None };
            batch.push_seq(&seq.token_ids[start..end], start, &seq.block_table.blocks, bs, logits);
            if completes {
                sampled.push(s.seq_id);
            }
        }
        (batch, sampled)
    }

    /// Executes a step: swap-outs, copy-on-write copies, swap-ins (in that order, so no block is
    /// overwritten before it is read), then the forward pass. Returns `(sequence, logits)` for
    /// every sequence ready to sample: one row, or `1 + drafts` rows for a speculating one.
    pub fn execute(&mut self, out: &SchedulerOutput, seqs: &HashMap<SeqId, Sequence>) -> Result<Vec<(SeqId, Vec<f32>)>, BackendError> {
        self.backend.swap_out(&out.blocks_to_swap_out)?;
        self.backend.zero_blocks(&out.blocks_to_zero)?;
        self.backend.copy_blocks(&out.blocks_to_copy)?;
        self.backend.swap_in(&out.blocks_to_swap_in)?;
        if out.scheduled.is_empty() {
            return Ok(Vec::new());
        }
        let (batch, sampled) = self.prepare(out, seqs);
        let logits = self.backend.forward(&batch)?;
        let vocab = self.backend.config().vocab_size;
        let mut rows = logits.chunks_exact(vocab);
        Ok(sampled
            .into_iter()
            .map(|id| {
                let n = 1 + seqs[&id].spec_tokens.len();
                let v: Vec<f32> = rows.by_ref().take(n).flatten().copied().collect();
                (id, v)
            })
            .collect())
    }
}
