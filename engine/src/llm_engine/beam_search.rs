//! Beam search in the engine (seed 000's copy-on-write fork, algorithm 7): a request's live
//! beams are sequences; each step every beam's logits row gives its `2 × width` most likely
//! next tokens instead of a sample, and once every live beam of the request has reported, the
//! `width` best extensions go on: a beam chosen once takes its token itself, a beam chosen
//! several times is forked (the fork shares all its blocks; the shared last block is copied when
//! written), and a beam not chosen is freed. Extensions by end-of-sequence are set aside as
//! ended beams. Beams that reported wait, parked with their blocks, for their siblings (one may
//! have been preempted). At `max_tokens`, or when no beam is live, the ended and live beams are
//! ranked (see [`crate::sampling::beam`]) and the best `n` returned in one output.

use std::collections::HashMap;

use super::{now_secs, LLMEngine};
use crate::backend::cpu::ops::log_sum_exp;
use crate::sampling::beam::{score, step, Beam};
use crate::sampling::sampler::{top_k, SampledToken, TokenLogprob};
use crate::scheduling::request_output::{
    CompletionOutput, FinishReason, RequestMetrics, RequestOutput,
};
use crate::scheduling::sequence::SeqId;

/// A beam-search request's state between steps (its width is the request's `n`, its prompt the
/// request's; the live beams are the request's sequences).
#[derive(Debug)]
pub(super) struct BeamState {
    length_penalty: f64,
    /// End-of-sequence tokens (none when the request ignores them).
    eos: Vec<u32>,
    /// The next step's alternatives reported so far, by live beam.
    tops: HashMap<SeqId, Vec<(u32, f32)>>,
    /// Beams that ended with end-of-sequence.
    ended: Vec<Beam>,
    /// The request's timing (its beams share it).
    metrics: RequestMetrics,
}

impl BeamState {
    /// The state of a new search.
    pub(super) fn new(length_penalty: f64, eos: Vec<u32>) -> Self {
        BeamState {
            length_penalty,
            eos,
            tops: HashMap::new(),
            ended: Vec::new(),
            metrics: RequestMetrics::default(),
        }
    }
}

/// The KV blocks a beam search can hold at once: the prompt's, shared, and each beam's own
/// copies of the rest (the prompt's partial last block and every generated block).
pub(super) fn blocks_needed(
    width: usize,
    prompt_len: usize,
    max_tokens: usize,
    bs: usize,
) -> usize {
    prompt_len / bs + width * ((prompt_len % bs + max_tokens).div_ceil(bs))
}

impl LLMEngine {
    /// Records the alternatives of beam `id` from its logits row (the row ends its prompt or
    /// decodes its last token). Returns false when `id` is not a beam.
    pub(super) fn report_beam(&mut self, id: SeqId, row: &[f32]) -> bool {
        let Some(seq) = self.scheduler.seqs.get(&id) else { return false };
        let Some(req) = self.requests.get_mut(&seq.request_id) else { return false };
        let Some(beam) = req.beam.as_mut() else { return false };
        let lse = log_sum_exp(row);
        let top = top_k(row, 2 * req.n).into_iter().map(|t| (t.token_id, t.logprob - lse));
        beam.tops.insert(id, top.collect());
        true
    }

    /// After a step's update: parks the beams that reported and moves on every beam search
    /// whose live beams have all reported. Returns the outputs of the searches that ended.
    pub(super) fn advance_beams(&mut self) -> Vec<RequestOutput> {
        let mut ready = Vec::new();
        for (rid, req) in &self.requests {
            let Some(beam) = &req.beam else { continue };
            for id in beam.tops.keys() {
                self.scheduler.hold(*id);
            }
            if !beam.tops.is_empty() && req.seq_ids.iter().all(|id| beam.tops.contains_key(id)) {
                ready.push(rid.clone());
            }
        }
        ready.sort();
        let mut outputs = Vec::new();
        for rid in ready {
            outputs.extend(self.beam_step(&rid));
        }
        outputs
    }

    /// One step of request `rid`'s search: extends, forks and frees its beams, and ends the
    /// search when it is over.
    fn beam_step(&mut self, rid: &str) -> Option<RequestOutput> {
        let req = self.requests.get_mut(rid)?;
        let (width, prompt_len) = (req.n, req.prompt.len());
        let beam = req.beam.as_mut()?;
        let live: Vec<SeqId> = req.seq_ids.clone();
        let seqs = &self.scheduler.seqs;
        let cums: Vec<f64> = live.iter().map(|id| seqs[id].cumulative_logprob()).collect();
        let now = now_secs();
        beam.metrics = seqs[&live[0]].metrics;
        beam.metrics.first_token_time.get_or_insert(now);
        // Before min_tokens, end-of-sequence is not a choice at all.
        let first = &seqs[&live[0]];
        let banned = first.num_output_tokens() < first.params.min_tokens;
        let tops: Vec<Vec<(u32, f32)>> = live
            .iter()
            .map(|id| {
                let mut t = beam.tops.remove(id).unwrap_or_default();
                if banned {
                    t.retain(|(tok, _)| !beam.eos.contains(tok));
                }
                t
            })
            .collect();
        let (next, ended) = step(&cums, &tops, width, &beam.eos);
        for e in ended {
            let mut tokens = seqs[&live[e.parent]].token_ids[prompt_len..].to_vec();
            tokens.push(e.token);
            beam.ended.push(Beam { tokens, cum: e.cum });
        }
        let max_len = self.max_model_len;
        // Each chosen extension: the parent itself the first time, a fork after that.
        let mut uses = vec![0usize; live.len()];
        let mut new_live = Vec::with_capacity(next.len());
        let mut extended: Vec<(SeqId, SampledToken)> = Vec::with_capacity(next.len());
        for e in &next {
            let parent = live[e.parent];
            let lp = (e.cum - cums[e.parent]) as f32;
            let token = SampledToken {
                chosen: TokenLogprob { token_id: e.token, logprob: lp },
                top: Vec::new(),
                rank: None,
            };
            let id = if uses[e.parent] == 0 {
                parent
            } else {
                let child = self.next_seq_id;
                self.next_seq_id += 1;
                self.scheduler.fork_held(parent, child, new_live.len());
                child
            };
            uses[e.parent] += 1;
            new_live.push(id);
            extended.push((id, token));
        }
        for (i, &id) in live.iter().enumerate() {
            if uses[i] == 0 {
                self.scheduler.remove(id);
            }
        }
        let mut at_end = false;
        for (index, (id, token)) in extended.into_iter().enumerate() {
            let seq = self.scheduler.seqs.get_mut(&id).expect("a live beam");
            seq.metrics.first_token_time.get_or_insert(now);
            seq.index = index;
            // End-of-sequence never continues a beam unless ignored, so only a length ends it:
            // max_tokens (every live beam has the same length) or the context.
            match seq.append_token(token, &self.tokenizer, max_len) {
                Ok(done) => at_end |= done,
                Err(e) => tracing::warn!(error = %e, "detokenizing a beam failed"),
            }
        }
        self.stats.generation_tokens += new_live.len() as u64;
        let req = self.requests.get_mut(rid).expect("checked");
        req.seq_ids = new_live.clone();
        if at_end || new_live.is_empty() {
            return Some(self.finish_beams(rid));
        }
        // The first live beam holds the running-set slots of beams that may come back.
        let spare = req.n - new_live.len();
        for (i, id) in new_live.iter().enumerate() {
            if let Some(s) = self.scheduler.seqs.get_mut(id) {
                s.pending_forks = if i == 0 { spare } else { 0 };
            }
            self.scheduler.unpark_running(*id);
        }
        None
    }

    /// Ends request `rid`'s search: ranks its ended and live beams, frees every live one and
    /// returns the best `n` as the request's final output.
    fn finish_beams(&mut self, rid: &str) -> RequestOutput {
        let req = self.requests.remove(rid).expect("a beam request");
        let beam = req.beam.expect("a beam request");
        let mut all = beam.ended;
        let mut metrics = beam.metrics;
        let prompt_len = req.prompt.len();
        for id in &req.seq_ids {
            if let Some(seq) = self.scheduler.remove(*id) {
                let tokens = seq.token_ids[prompt_len..].to_vec();
                all.push(Beam { tokens, cum: seq.cumulative_logprob() });
            }
        }
        let key = |b: &Beam| score(&b.tokens, b.cum, prompt_len, &beam.eos, beam.length_penalty);
        all.sort_by(|a, b| key(b).total_cmp(&key(a)));
        all.truncate(req.n);
        let detokenize = !self.tokenizer.is_ids_only();
        let outputs = all
            .into_iter()
            .enumerate()
            .map(|(index, b)| {
                let ended = b.tokens.last().is_some_and(|t| beam.eos.contains(t));
                let shown = &b.tokens[..b.tokens.len() - usize::from(ended)];
                let text = if detokenize {
                    self.tokenizer.decode(shown, true).unwrap_or_default()
                } else {
                    String::new()
                };
                CompletionOutput {
                    index,
                    text,
                    token_ids: b.tokens,
                    cumulative_logprob: b.cum,
                    logprobs: Vec::new(),
                    finish_reason: Some(if ended {
                        FinishReason::Stop
                    } else {
                        FinishReason::Length
                    }),
                    stop_reason: None,
                }
            })
            .collect();
        metrics.finished_time = Some(now_secs());
        self.wipe_freed();
        RequestOutput {
            request_id: rid.to_string(),
            prompt_token_ids: req.prompt,
            outputs,
            finished: true,
            metrics,
            prompt_logprobs: None,
        }
    }
}
