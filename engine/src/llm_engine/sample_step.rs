//! The engine step's sampling: the runner's rows turned into tokens. Rows are sampled in
//! parallel on the CPU pool (each row's work — penalties, a softmax over the vocabulary, the
//! draw — is independent of the others'), so a batched step does not wait on one core for
//! every sequence's sample; the rest (verification, prompt log-probabilities, forks, grammar
//! masks) stays on the engine's thread, in row order.

use std::sync::OnceLock;

use super::model_runner::RowOutput;
use super::spec_decoder::SpecDecoder;
use super::{child_rng, LLMEngine};
use crate::backend::cpu::pool::ThreadPool;
use crate::sampling::sampler::{sample_token, scored_ranked, Rng, SampledToken};
use crate::scheduling::scheduler::{ForkedSeq, SampledSeq};
use crate::scheduling::sequence::{SeqId, SeqMap};

/// A row still to be sampled: its sequence, its (masked) logits, and, when completions fork
/// off it this step, the draw their random streams derive from.
struct Pending {
    seq_id: SeqId,
    row: Vec<f32>,
    fork_seed: Option<u64>,
    /// Where its result goes among the step's outputs.
    at: usize,
}

impl LLMEngine {
    /// Turns the runner's rows into tokens: samples each logits row (and, for a finished
    /// prompt with more completions due, their first tokens from the same row, each with its own
    /// random stream), verifies draft rows, and takes the tokens the device chose as they are.
    pub(super) fn sample(&mut self, rows: Vec<(SeqId, RowOutput)>) -> Vec<SampledSeq> {
        let vocab = self.model_config.vocab_size;
        let eos = &self.tokenizer.eos_token_ids;
        let mut out: Vec<Option<SampledSeq>> = Vec::with_capacity(rows.len());
        let mut pending = Vec::new();
        let mut beams = Vec::new();
        for (id, row) in rows {
            let seq = self.scheduler.seqs.get_mut(&id).expect("a row's sequence exists");
            let mut row = match row {
                RowOutput::Sampled(t) => {
                    out.push(Some(SampledSeq::one(
                        id,
                        SampledToken { chosen: t, top: Vec::new(), rank: None },
                    )));
                    continue;
                }
                RowOutput::Verify(rows) => {
                    out.push(Some(SpecDecoder::verify(seq, &rows, vocab, eos)));
                    continue;
                }
                RowOutput::Logits(row) => row,
                RowOutput::Prompt { start, rows, samples } => {
                    let k = seq.params.prompt_logprobs;
                    let lps = self
                        .requests
                        .get_mut(&seq.request_id)
                        .and_then(|r| r.prompt_logprobs.as_mut());
                    if let Some(lps) = lps {
                        // Row j scores prompt token start + j + 1; rows a recomputation (after
                        // preemption) repeats are skipped.
                        for (j, row) in rows.chunks_exact(vocab).enumerate() {
                            let target = start + j + 1;
                            if target < seq.prompt_len && target == lps.len() + 1 {
                                lps.push(scored_ranked(row, seq.token_ids[target], k));
                            }
                        }
                    }
                    if !samples {
                        continue;
                    }
                    rows[rows.len() - vocab..].to_vec()
                }
            };
            if seq.params.beam_search.is_some() {
                // A beam reports its alternatives; its token comes from the request's step.
                beams.push((id, row));
                continue;
            }
            if let Some(g) = seq.grammar.as_mut() {
                g.mask_logits(&mut row);
            }
            // n > 1: the other completions fork off the finished prompt, with streams of their
            // own drawn from the parent's (before the parent's own draw).
            let fork_seed = (seq.pending_forks > 0).then(|| seq.rng.next_u64());
            pending.push(Pending { seq_id: id, row, fork_seed, at: out.len() });
            out.push(None);
        }
        for (id, row) in beams {
            self.report_beam(id, &row);
        }
        let eos = &self.tokenizer.eos_token_ids;
        let drawn = draw_rows(&self.scheduler.seqs, eos, &pending);
        for (p, (token, rng)) in pending.into_iter().zip(drawn) {
            let seq = self.scheduler.seqs.get_mut(&p.seq_id).expect("a row's sequence exists");
            let mut sampled = SampledSeq::one(p.seq_id, token);
            if let Some(fallback) = p.fork_seed {
                let ctx = seq.sampling_context(eos);
                for index in 1..=seq.pending_forks {
                    let mut child_rng = child_rng(seq.params.seed, index, fallback);
                    let token = sample_token(&p.row, &seq.params, &ctx, &mut child_rng);
                    let seq_id = self.next_seq_id;
                    self.next_seq_id += 1;
                    sampled.forks.push(ForkedSeq { seq_id, index, rng: child_rng, token });
                }
                if let Some(r) = self.requests.get_mut(&seq.request_id) {
                    r.seq_ids.extend(sampled.forks.iter().map(|f| f.seq_id));
                }
            }
            seq.rng = rng;
            out[p.at] = Some(sampled);
        }
        out.into_iter().map(|s| s.expect("every row has its tokens")).collect()
    }
}

/// Each pending row's token and its sequence's random stream after the draw, in order; on
/// the CPU pool when there is more than one row.
fn draw_rows(seqs: &SeqMap, eos: &[u32], pending: &[Pending]) -> Vec<(SampledToken, Rng)> {
    let draw = |p: &Pending| {
        let seq = &seqs[&p.seq_id];
        let ctx = seq.sampling_context(eos);
        let mut rng = seq.rng.clone();
        let token = sample_token(&p.row, &seq.params, &ctx, &mut rng);
        (token, rng)
    };
    if pending.len() < 2 {
        return pending.iter().map(draw).collect();
    }
    let slots: Vec<OnceLock<(SampledToken, Rng)>> =
        pending.iter().map(|_| OnceLock::new()).collect();
    ThreadPool::global().run(pending.len(), &|i| {
        let _ = slots[i].set(draw(&pending[i]));
    });
    slots.into_iter().map(|s| s.into_inner().expect("every row drawn")).collect()
}
