//! `ModelRunner`: turns a [`SchedulerOutput`] into device work — block swaps and copies, then
//! one forward pass over the flattened batch — and hands back the logits of every sequence that
//! is ready to sample. It knows the model and the KV cache, not the requests.

use std::collections::HashMap;

use super::step_trace::StepTrace;
use crate::backend::{BackendError, ForwardBatch, Logits, ModelBackend, RowSampling};
use crate::sampling::sampler::TokenLogprob;
use crate::scheduling::scheduler::SchedulerOutput;
use crate::scheduling::sequence::{SeqId, SeqMap, Sequence};

/// What a step produced for one sequence ready to sample.
#[derive(Debug, Clone, PartialEq)]
pub enum RowOutput {
    /// One row of logits: the next token is sampled from it.
    Logits(Vec<f32>),
    /// `1 + drafts` rows of logits, one per fed token (the last computed one, then each
    /// draft): the drafts are verified against them.
    Verify(Vec<f32>),
    /// The token the backend already chose on the device (a plain request).
    Sampled(TokenLogprob),
    /// A prompt chunk whose log-probabilities are asked for: one row per token computed, from
    /// position `start`; when `samples`, the chunk ends the prompt and its last row is sampled.
    Prompt {
        /// Position of the chunk's first token.
        start: usize,
        /// The rows, one per token of the chunk.
        rows: Vec<f32>,
        /// Whether the last row gives the next token.
        samples: bool,
    },
}

/// Whether the backend may choose `seq`'s next token by itself: no penalties or alternatives, no
/// `min_tokens` masking still due, no completions to fork off this row, no drafts to verify,
/// and a constrained row's token mask at hand.
fn device_samplable(seq: &Sequence, masks: &dyn DeviceMasks) -> bool {
    let p = &seq.params;
    p.is_plain()
        && seq.num_output_tokens() >= p.min_tokens
        && seq.pending_forks == 0
        && seq.drafts().is_empty()
        && (p.structured.is_none() || masks.covers(seq.seq_id))
}

/// The token masks of a step's constrained sequences, computed on demand (while the device runs
/// the forward pass) for a backend that samples on the device.
pub trait DeviceMasks {
    /// Whether `id`'s mask can be given.
    fn covers(&self, id: SeqId) -> bool;
    /// The masks, by sequence.
    fn compute(&mut self) -> HashMap<SeqId, Vec<u32>>;
}

/// No sequence has a token mask at hand (a launched step samples unconstrained rows only).
struct NoMasks;

impl DeviceMasks for NoMasks {
    fn covers(&self, _: SeqId) -> bool {
        false
    }
    fn compute(&mut self) -> HashMap<SeqId, Vec<u32>> {
        HashMap::new()
    }
}

/// Whether this step computes prompt tokens of `seq` whose log-probabilities are asked for
/// (then every token of its chunk gets a logits row).
fn wants_prompt_rows(seq: &Sequence) -> bool {
    seq.params.prompt_logprobs.is_some() && seq.num_computed_tokens < seq.prompt_len
}

/// The row's sampling on the device: the request's temperature and a seed drawn from its
/// random stream at this length (the same request seed gives the same tokens).
fn row_sampling(seq: &Sequence) -> RowSampling {
    let base = seq.rng.clone().next_u64();
    let p = &seq.params;
    // At the length it has when this row is sampled (a token still on the device counts).
    let seed = base.wrapping_add((seq.next_len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    RowSampling { temperature: p.temperature, seed, top_k: p.top_k, top_p: p.top_p, min_p: p.min_p }
}

/// Runs scheduled steps on a backend.
pub struct ModelRunner {
    /// The device.
    pub backend: Box<dyn ModelBackend>,
    /// KV groups of the backend's cache (pages per logical block).
    kv_groups: usize,
    /// Every step's record, when recording ([`LLMEngine::record_steps`](super::LLMEngine::record_steps)).
    pub(super) trace: Option<StepTrace>,
    /// The last step's batch, emptied and filled again by the next step's
    /// ([`ForwardBatch::recycle`]): building a step's batch then allocates nothing.
    spare: Option<ForwardBatch>,
}

/// The launched, uncollected pass's logits row of each sequence it samples.
pub type AheadRows = HashMap<SeqId, u32, foldhash::fast::RandomState>;

impl ModelRunner {
    /// Wraps a backend.
    pub fn new(backend: Box<dyn ModelBackend>) -> Self {
        let kv_groups = backend.kv_groups().num_groups();
        ModelRunner { backend, kv_groups, trace: None, spare: None }
    }

    /// Builds the batch of a step: each scheduled sequence's next tokens with their positions and
    /// slots; logits are asked for the sequences whose tokens are then all computed. A token
    /// still on the device (planned ahead) is deferred to the launched pass's row `ahead` names
    /// for its sequence.
    pub fn prepare(
        &mut self,
        out: &SchedulerOutput,
        seqs: &SeqMap,
        ahead: &AheadRows,
    ) -> (ForwardBatch, Vec<SeqId>) {
        let bs = self.backend.kv_cache_spec().block_size;
        let mut batch = match self.spare.take() {
            Some(mut b) => {
                b.recycle();
                b
            }
            None => ForwardBatch::with_kv_groups(self.kv_groups),
        };
        let mut sampled = Vec::with_capacity(out.scheduled.len());
        for s in &out.scheduled {
            let seq = &seqs[&s.seq_id];
            let start = seq.num_computed_tokens;
            if !seq.drafts().is_empty() {
                // Verification: the last token and the drafts, with logits at every position.
                let mut toks = seq.token_ids[start..].to_vec();
                toks.extend_from_slice(seq.drafts());
                debug_assert_eq!(toks.len(), s.num_tokens);
                batch.push_seq(&toks, start, &seq.block_table.blocks, bs, Logits::All);
                sampled.push(s.seq_id);
                continue;
            }
            let end = start + s.num_tokens;
            let completes = end == seq.next_len();
            let logits = if wants_prompt_rows(seq) {
                Logits::All
            } else if completes && seq.params.reads_far_logits() {
                Logits::LastExact
            } else if completes {
                Logits::Last
            } else {
                Logits::None
            };
            if end > seq.len() {
                // Its last token is the one the launched pass samples for `row`.
                let row =
                    *ahead.get(&s.seq_id).expect("a pending token belongs to the launched pass");
                let toks = &seq.token_ids[start..];
                batch.push_seq_deferred(toks, row, start, &seq.block_table.blocks, bs, logits);
            } else {
                let toks = &seq.token_ids[start..end];
                batch.push_seq(toks, start, &seq.block_table.blocks, bs, logits);
            }
            if completes || logits == Logits::All {
                sampled.push(s.seq_id);
            }
        }
        (batch, sampled)
    }

    /// Launches the step without waiting for the device when the backend overlaps steps and
    /// the backend chooses every token it samples (no row needs its logits on the host or a
    /// token mask): block moves, then the pass and its sampling queued. `ahead` is the launched,
    /// uncollected step's sampled sequences, when this step was planned before their tokens
    /// arrived (their pending tokens are read on the device). Returns the sequences whose
    /// tokens [`ModelRunner::collect`] then gives, or `None` when the step must run through
    /// [`ModelRunner::execute`] (nothing was done).
    pub fn launch(
        &mut self,
        out: &SchedulerOutput,
        seqs: &SeqMap,
        ahead: &[SeqId],
    ) -> Result<Option<Vec<SeqId>>, BackendError> {
        if !self.backend.overlaps_steps() || out.scheduled.is_empty() {
            return Ok(None);
        }
        let mut any = false;
        for s in &out.scheduled {
            let seq = &seqs[&s.seq_id];
            let completes = seq.num_computed_tokens + s.num_tokens == seq.next_len();
            if !seq.drafts().is_empty() || wants_prompt_rows(seq) {
                return Ok(None);
            }
            if completes && !device_samplable(seq, &NoMasks) {
                return Ok(None);
            }
            any |= completes;
        }
        if !any {
            return Ok(None);
        }
        self.move_blocks(out)?;
        let ahead: AheadRows =
            ahead.iter().enumerate().map(|(row, &id)| (id, row as u32)).collect();
        let (batch, sampled) = self.prepare(out, seqs, &ahead);
        let rows: Vec<RowSampling> = sampled.iter().map(|id| row_sampling(&seqs[id])).collect();
        let handed = self.trace.as_ref().map(StepTrace::now);
        let launched = self.backend.launch_sampled(&batch, &rows);
        self.spare = Some(batch);
        launched?;
        if let (Some(t), Some(at)) = (&mut self.trace, handed) {
            t.launched(out, seqs, at);
        }
        Ok(Some(sampled))
    }

    /// The tokens of the step [`ModelRunner::launch`] queued, for its `sampled` sequences (waits
    /// for the device).
    pub fn collect(
        &mut self,
        sampled: Vec<SeqId>,
    ) -> Result<Vec<(SeqId, RowOutput)>, BackendError> {
        let tokens = self.backend.collect_sampled()?;
        if let Some(t) = &mut self.trace {
            t.collected(self.backend.device_seconds());
        }
        Self::pair(sampled, tokens)
    }

    fn pair(
        sampled: Vec<SeqId>,
        tokens: Vec<TokenLogprob>,
    ) -> Result<Vec<(SeqId, RowOutput)>, BackendError> {
        if tokens.len() != sampled.len() {
            return Err(BackendError::Device(format!(
                "{} tokens sampled for {} rows",
                tokens.len(),
                sampled.len()
            )));
        }
        Ok(sampled.into_iter().zip(tokens).map(|(id, t)| (id, RowOutput::Sampled(t))).collect())
    }

    /// Swap-outs, copy-on-write copies, swap-ins (in that order, so no block is overwritten
    /// before it is read), and the zeroing of blocks freed by the schedule.
    fn move_blocks(&mut self, out: &SchedulerOutput) -> Result<(), BackendError> {
        self.backend.swap_out(&out.blocks_to_swap_out)?;
        self.backend.zero_blocks(&out.blocks_to_zero)?;
        self.backend.copy_blocks(&out.blocks_to_copy)?;
        self.backend.swap_in(&out.blocks_to_swap_in)
    }

    /// Executes a step: swap-outs, copy-on-write copies, swap-ins (in that order, so no block is
    /// overwritten before it is read), then the forward pass. Returns, for every sequence ready
    /// to sample, its logits — or, when the backend samples on the device and every such
    /// sequence is plain, the chosen token.
    pub fn execute(
        &mut self,
        out: &SchedulerOutput,
        seqs: &SeqMap,
        masks: &mut dyn DeviceMasks,
    ) -> Result<Vec<(SeqId, RowOutput)>, BackendError> {
        self.move_blocks(out)?;
        if out.scheduled.is_empty() {
            return Ok(Vec::new());
        }
        let handed = self.trace.as_ref().map(StepTrace::now);
        let rows = self.run_pass(out, seqs, masks);
        if let (Some(t), Some(at)) = (&mut self.trace, handed) {
            t.launched(out, seqs, at);
            t.collected(self.backend.device_seconds());
        }
        rows
    }

    /// The forward pass of [`ModelRunner::execute`] and its rows.
    fn run_pass(
        &mut self,
        out: &SchedulerOutput,
        seqs: &SeqMap,
        masks: &mut dyn DeviceMasks,
    ) -> Result<Vec<(SeqId, RowOutput)>, BackendError> {
        let (batch, sampled) = self.prepare(out, seqs, &AheadRows::default());
        if self.backend.samples_on_device()
            && !sampled.is_empty()
            && sampled.iter().all(|id| device_samplable(&seqs[id], &*masks))
        {
            let rows: Vec<RowSampling> = sampled.iter().map(|id| row_sampling(&seqs[id])).collect();
            let constrained = sampled.iter().any(|id| masks.covers(*id));
            let mut row_masks = || -> Vec<Option<Vec<u32>>> {
                if !constrained {
                    return Vec::new();
                }
                let mut m = masks.compute();
                sampled.iter().map(|id| m.remove(id)).collect()
            };
            let tokens = self.backend.forward_sampled(&batch, &rows, &mut row_masks);
            self.spare = Some(batch);
            return Self::pair(sampled, tokens?);
        }
        let logits = self.backend.forward(&batch);
        self.spare = Some(batch);
        let logits = logits?;
        let vocab = self.backend.config().vocab_size;
        let scheduled: HashMap<SeqId, usize> =
            out.scheduled.iter().map(|s| (s.seq_id, s.num_tokens)).collect();
        // Each sequence's rows, in batch order (one copy each; the batch's buffer goes back to
        // the backend).
        let mut next = 0;
        let mut take = |n: usize| {
            let rows = logits[next * vocab..(next + n) * vocab].to_vec();
            next += n;
            rows
        };
        let rows = sampled
            .into_iter()
            .map(|id| {
                let seq = &seqs[&id];
                if wants_prompt_rows(seq) {
                    let n = scheduled[&id];
                    let v = take(n);
                    let start = seq.num_computed_tokens;
                    let samples = start + n == seq.len();
                    return (id, RowOutput::Prompt { start, rows: v, samples });
                }
                let drafts = seq.drafts().len();
                let v = take(1 + drafts);
                (id, if drafts == 0 { RowOutput::Logits(v) } else { RowOutput::Verify(v) })
            })
            .collect();
        self.backend.recycle_logits(logits);
        Ok(rows)
    }
}
