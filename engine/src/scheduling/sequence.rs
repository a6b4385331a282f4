//! `Sequence`: one completion's state — its tokens, how many have KV computed, its blocks, its
//! place in the request state machine, and its output bookkeeping (stop strings, streaming
//! deltas). Seed 000's `SequenceState`.

use std::sync::Arc;

use crate::model_files::detokenizer::IncrementalDetokenizer;
use crate::model_files::tokenizer::{TokenizeError, Tokenizer};
use crate::sampling::sampler::{Rng, SampledToken, SamplingContext};
use crate::sampling::sampling_params::SamplingParams;
use crate::sampling::structured::GrammarMatcher;
use crate::scheduling::block_hash::BlockHash;
use crate::scheduling::block_manager::BlockTable;
use crate::scheduling::request_output::{
    CompletionOutput, FinishReason, RequestMetrics, StopReason,
};
use crate::speculative::spec_decode::SpecSeq;

/// Prompt tokens per step while their log-probabilities are computed (a logits row each).
pub const PROMPT_LOGPROBS_CHUNK: usize = 256;

/// Engine-wide identifier of a sequence.
pub type SeqId = u64;

/// Sequences by id. Foldhash, not the standard SipHash: every step looks each running sequence
/// up several times (schedule, batch, sample, update, outputs), and the ids are the engine's own.
pub type SeqMap = std::collections::HashMap<SeqId, Sequence, foldhash::fast::RandomState>;

/// States of seed 000's request state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceStatus {
    /// In the waiting queue; holds no KV blocks.
    Waiting,
    /// Scheduled; KV on the device.
    Running,
    /// Preempted by swapping; KV in host memory.
    Swapped,
    /// Ended by a stop condition.
    FinishedStopped,
    /// Ended by `max_tokens` or the context length.
    FinishedLength,
    /// Aborted.
    FinishedAborted,
}

impl SequenceStatus {
    /// Whether the sequence has ended.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            SequenceStatus::FinishedStopped
                | SequenceStatus::FinishedLength
                | SequenceStatus::FinishedAborted
        )
    }
}

/// One completion being generated.
#[derive(Debug)]
pub struct Sequence {
    /// Engine-wide id.
    pub seq_id: SeqId,
    /// The request it belongs to.
    pub request_id: String,
    /// Completion index within the request.
    pub index: usize,
    /// Prompt followed by generated tokens.
    pub token_ids: Vec<u32>,
    /// Number of prompt tokens.
    pub prompt_len: usize,
    /// Tokens whose KV is in the cache.
    pub num_computed_tokens: usize,
    /// Tokens the device is still choosing for it (0 or 1): set while the next step is planned
    /// before the launched step's tokens reach the host (`Scheduler::expect_tokens`); they
    /// count as part of the sequence for scheduling but are not in `token_ids` yet.
    pub pending_tokens: usize,
    /// State.
    pub status: SequenceStatus,
    /// Device blocks (when running).
    pub block_table: BlockTable,
    /// Host blocks (when swapped).
    pub host_blocks: Vec<u32>,
    /// Sampling parameters (shared by the request's completions).
    pub params: Arc<SamplingParams>,
    /// Scheduling priority: lower values are served first.
    pub priority: i32,
    /// Order of arrival (ties of priority are served first come, first served).
    pub arrival_seq: u64,
    /// The client request this sequence serves, as a digest: sequences of one group share the
    /// running set fairly with other groups (see `Scheduler::schedule`).
    pub group: u64,
    /// Digest of the cache salt.
    pub salt: u64,
    /// Chained hashes of the full blocks of `token_ids`.
    pub block_hashes: Vec<BlockHash>,
    /// This completion's random stream.
    pub rng: Rng,
    /// Completions still to fork from this one once its prompt is done (n > 1), or beams it may
    /// still fork (beam search): the running-set slots it holds for them.
    pub pending_forks: usize,
    /// Stop after the first token and keep the blocks (a prefill worker's request).
    pub prefill_only: bool,
    /// Speculative decoding state; `None` when this sequence does not speculate.
    pub spec: Option<SpecSeq>,
    /// Where the output stands in its constraint's language (structured outputs).
    pub grammar: Option<GrammarMatcher>,
    /// Timing.
    pub metrics: RequestMetrics,
    /// Why it finished.
    pub finish_reason: Option<FinishReason>,
    /// What stopped it.
    pub stop_reason: Option<StopReason>,
    finish_reported: bool,
    output: OutputState,
}

/// What a sequence generated as text and log-probabilities, and how much of it was reported.
#[derive(Debug, Clone)]
struct OutputState {
    detok: IncrementalDetokenizer,
    text: String,
    /// Log-probabilities of generated tokens (when asked for).
    logprobs: Vec<SampledToken>,
    /// Sum of generated tokens' log-probabilities.
    cumulative_logprob: f64,
    emitted_text: usize,
    emitted_tokens: usize,
    emitted_logprobs: usize,
}

impl Sequence {
    /// A new waiting sequence.
    pub fn new(
        seq_id: SeqId,
        request_id: String,
        prompt: Vec<u32>,
        params: Arc<SamplingParams>,
        rng: Rng,
        metrics: RequestMetrics,
    ) -> Self {
        let detok = IncrementalDetokenizer::new(&prompt, params.skip_special_tokens);
        Sequence {
            seq_id,
            request_id,
            index: 0,
            prompt_len: prompt.len(),
            token_ids: prompt,
            num_computed_tokens: 0,
            pending_tokens: 0,
            status: SequenceStatus::Waiting,
            block_table: BlockTable::default(),
            host_blocks: Vec::new(),
            pending_forks: params.n.saturating_sub(1),
            prefill_only: false,
            params,
            priority: 0,
            arrival_seq: 0,
            group: 0,
            salt: 0,
            block_hashes: Vec::new(),
            rng,
            spec: None,
            grammar: None,
            metrics,
            finish_reason: None,
            stop_reason: None,
            finish_reported: false,
            output: OutputState {
                detok,
                text: String::new(),
                logprobs: Vec::new(),
                cumulative_logprob: 0.0,
                emitted_text: 0,
                emitted_tokens: 0,
                emitted_logprobs: 0,
            },
        }
    }

    /// A copy for completion `index` (n > 1): same tokens and output so far, its own random
    /// stream, no blocks (the caller gives it its block table) and no speculation.
    pub fn fork(&self, seq_id: SeqId, index: usize, rng: Rng) -> Sequence {
        Sequence {
            seq_id,
            request_id: self.request_id.clone(),
            index,
            token_ids: self.token_ids.clone(),
            prompt_len: self.prompt_len,
            num_computed_tokens: self.num_computed_tokens,
            pending_tokens: 0,
            status: self.status,
            block_table: BlockTable::default(),
            host_blocks: Vec::new(),
            params: self.params.clone(),
            priority: self.priority,
            arrival_seq: self.arrival_seq,
            group: self.group,
            salt: self.salt,
            block_hashes: self.block_hashes.clone(),
            rng,
            pending_forks: 0,
            prefill_only: false,
            spec: None,
            grammar: self.grammar.as_ref().map(GrammarMatcher::fork),
            metrics: self.metrics,
            finish_reason: None,
            stop_reason: None,
            finish_reported: false,
            output: self.output.clone(),
        }
    }

    /// This step's draft tokens (empty when not speculating).
    pub fn drafts(&self) -> &[u32] {
        self.spec.as_ref().map_or(&[], |s| &s.drafts)
    }

    /// Total tokens (prompt + generated).
    pub fn len(&self) -> usize {
        self.token_ids.len()
    }
    /// Whether there are no tokens (never true for a valid request).
    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }
    /// Generated tokens.
    pub fn output_ids(&self) -> &[u32] {
        &self.token_ids[self.prompt_len..]
    }
    /// What the sampler needs to know of this sequence (penalties, `min_tokens` masking), with
    /// the model's end-of-sequence ids.
    pub fn sampling_context<'a>(&'a self, eos_token_ids: &'a [u32]) -> SamplingContext<'a> {
        SamplingContext {
            prompt: &self.token_ids[..self.prompt_len],
            output: self.output_ids(),
            eos_token_ids,
        }
    }
    /// Sum of the generated tokens' log-probabilities.
    pub fn cumulative_logprob(&self) -> f64 {
        self.output.cumulative_logprob
    }
    /// Number of generated tokens.
    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.prompt_len
    }
    /// Whether all its tokens but the newest are computed (a decode step computes one).
    pub fn is_decoding(&self) -> bool {
        self.num_computed_tokens + 1 == self.next_len()
            && self.num_output_tokens() + self.pending_tokens > 0
    }
    /// Tokens still to compute before the next sample (a pending token included).
    pub fn num_uncomputed(&self) -> usize {
        self.next_len() - self.num_computed_tokens
    }
    /// Its length once the tokens the device is choosing have arrived.
    pub fn next_len(&self) -> usize {
        self.token_ids.len() + self.pending_tokens
    }
    /// Whether the next token will end it whatever it is: its last by `max_tokens` or by
    /// `max_model_len`, or the only token of a prefill worker's request.
    pub fn next_token_ends(&self, max_model_len: usize) -> bool {
        self.prefill_only || self.ends_by_length(1, max_model_len)
    }
    /// Whether `extra` more tokens reach `max_tokens` or `max_model_len` (the length rule
    /// [`Sequence::append_token`] ends a sequence by).
    fn ends_by_length(&self, extra: usize, max_model_len: usize) -> bool {
        self.num_output_tokens() + extra >= self.params.max_tokens
            || self.token_ids.len() + extra >= max_model_len
    }

    /// Most tokens one step may compute for it: a prompt whose log-probabilities are asked for
    /// needs a logits row per token, so it goes in chunks of [`PROMPT_LOGPROBS_CHUNK`].
    pub fn chunk_limit(&self) -> usize {
        if self.params.prompt_logprobs.is_some() && self.num_computed_tokens < self.prompt_len {
            PROMPT_LOGPROBS_CHUNK
        } else {
            usize::MAX
        }
    }

    /// Extends `block_hashes` to every full block of `token_ids`.
    pub fn update_block_hashes(&mut self, seed: u64, block_size: usize) {
        let full = self.token_ids.len() / block_size;
        while self.block_hashes.len() < full {
            let i = self.block_hashes.len();
            let parent = i.checked_sub(1).map(|p| self.block_hashes[p]);
            let h = BlockHash::new(
                seed,
                parent,
                &self.token_ids[i * block_size..(i + 1) * block_size],
                self.salt,
            );
            self.block_hashes.push(h);
        }
    }

    /// Appends a sampled token and applies the stop conditions; returns whether it finished.
    pub fn append_token(
        &mut self,
        s: SampledToken,
        tok: &Tokenizer,
        max_model_len: usize,
    ) -> Result<bool, TokenizeError> {
        let id = s.chosen.token_id;
        self.token_ids.push(id);
        self.output.cumulative_logprob += s.chosen.logprob as f64;
        if self.params.logprobs.is_some() {
            self.output.logprobs.push(s);
        }
        // The parameters are read in place: this runs for every token of every sequence.
        let p = &self.params;
        let detokenize = p.detokenize;
        let may_stop = self.num_output_tokens() >= p.min_tokens;
        // A requested stop token is the stop reason; end-of-sequence has none (as in vLLM).
        if may_stop && p.stop_token_ids.contains(&id) {
            self.finish(FinishReason::Stop, Some(StopReason::Token(id)));
            return Ok(true);
        }
        if may_stop && !p.ignore_eos && tok.eos_token_ids.contains(&id) {
            self.finish(FinishReason::Stop, None);
            return Ok(true);
        }
        let grammar_done = self.grammar.as_mut().is_some_and(|g| {
            if let Err(e) = g.accept(id) {
                tracing::warn!(error = %e, "a sampled token broke its constraint");
            }
            g.is_complete()
        });
        let prev_len = self.output.text.len();
        if detokenize {
            let piece = self.output.detok.push(tok, id)?;
            self.output.text.push_str(&piece);
        }
        let p = &self.params;
        if may_stop && !p.stop.is_empty() {
            if let Some((at, stop)) = find_stop(&self.output.text, prev_len, &p.stop) {
                let end = if p.include_stop_str_in_output { at + stop.len() } else { at };
                self.output.text.truncate(end);
                self.finish(FinishReason::Stop, Some(StopReason::Str(stop)));
                return Ok(true);
            }
        }
        if grammar_done {
            // The constrained text is complete: nothing may follow it.
            if detokenize {
                let tail = self.output.detok.flush(tok)?;
                self.output.text.push_str(&tail);
            }
            self.finish(FinishReason::Stop, None);
            return Ok(true);
        }
        if self.ends_by_length(0, max_model_len) {
            if detokenize {
                let tail = self.output.detok.flush(tok)?;
                self.output.text.push_str(&tail);
            }
            self.finish(FinishReason::Length, None);
            return Ok(true);
        }
        Ok(false)
    }

    /// Marks the sequence finished.
    pub fn finish(&mut self, reason: FinishReason, stop: Option<StopReason>) {
        self.status = match reason {
            FinishReason::Stop => SequenceStatus::FinishedStopped,
            FinishReason::Length => SequenceStatus::FinishedLength,
            FinishReason::Abort => SequenceStatus::FinishedAborted,
        };
        self.finish_reason = Some(reason);
        self.stop_reason = stop;
    }

    /// The output since the last call, or None when nothing changed. While stop strings are
    /// active, the last `max_stop_len - 1` bytes are held back: they may begin a stop string.
    pub fn take_delta(&mut self) -> Option<CompletionOutput> {
        let finished = self.status.is_finished();
        let mut upto = self.output.text.len();
        if !finished && !self.params.include_stop_str_in_output {
            let hold =
                self.params.stop.iter().map(|s| s.len()).max().unwrap_or(1).saturating_sub(1);
            upto = upto.saturating_sub(hold).max(self.output.emitted_text);
            while !self.output.text.is_char_boundary(upto) {
                upto -= 1;
            }
        }
        let upto = upto.max(self.output.emitted_text);
        let n_tokens = self.num_output_tokens();
        let report_finish = finished && !self.finish_reported;
        if upto == self.output.emitted_text
            && n_tokens == self.output.emitted_tokens
            && !report_finish
        {
            return None;
        }
        let out = CompletionOutput {
            index: self.index,
            text: self.output.text[self.output.emitted_text..upto].to_string(),
            token_ids: self.token_ids[self.prompt_len + self.output.emitted_tokens..].to_vec(),
            cumulative_logprob: self.output.cumulative_logprob,
            logprobs: self.output.logprobs[self.output.emitted_logprobs..].to_vec(),
            finish_reason: if report_finish { self.finish_reason } else { None },
            stop_reason: if report_finish { self.stop_reason.clone() } else { None },
        };
        self.output.emitted_text = upto;
        self.output.emitted_tokens = n_tokens;
        self.output.emitted_logprobs = self.output.logprobs.len();
        self.finish_reported |= report_finish;
        Some(out)
    }
}

/// Finds the earliest stop string that ends after byte `prev_len` of `text` (only new text can
/// complete a match, but the match may start in older text).
fn find_stop(text: &str, prev_len: usize, stops: &[String]) -> Option<(usize, String)> {
    let mut best: Option<(usize, String)> = None;
    for s in stops {
        let mut from = prev_len.saturating_sub(s.len().saturating_sub(1));
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        if let Some(i) = text[from..].find(s.as_str()) {
            let at = from + i;
            if best.as_ref().is_none_or(|(b, _)| at < *b) {
                best = Some((at, s.clone()));
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_found_across_appends() {
        assert_eq!(find_stop("hello wor", 5, &["world".into()]), None);
        assert_eq!(find_stop("hello world", 9, &["world".into()]), Some((6, "world".into())));
        assert_eq!(find_stop("a\n\nb", 2, &["\n\n".into(), "b".into()]), Some((1, "\n\n".into())));
        assert_eq!(find_stop("日本語です", 6, &["語で".into()]), Some((6, "語で".into())));
    }
}
