//! `SpecDecoder`: speculative decoding as a component the engine holds. Around each step it
//! proposes drafts for the decoding sequences (before scheduling, so the schedule makes room for
//! them), fits them to what was scheduled, runs the draft model when drafts come from one, and
//! turns the target's verification rows into tokens with
//! [`crate::speculative::spec_decode::accept_or_resample`]. The scheduler records what was accepted
//! ([`crate::scheduling::scheduler::Scheduler::update_from_output`]).

use std::collections::HashMap;

use crate::backend::{BackendError, ForwardBatch, Logits, ModelBackend};
use crate::sampling::sampler::{
    argmax, draw_weighted, filtered_distribution, processed, sampled, Rng, SamplingContext,
};
use crate::scheduling::scheduler::{SampledSeq, Scheduler, SchedulerOutput};
use crate::scheduling::sequence::{SeqId, Sequence, SequenceStatus};
use crate::speculative::proposer::{NgramProposer, Proposer, SelfDraft};
use crate::speculative::spec_decode::{accept_or_resample, DraftDist, SpecSeq, SpeculativeConfig};

/// Proposes, drafts and verifies speculative tokens.
pub(crate) struct SpecDecoder {
    config: SpeculativeConfig,
    proposer: Box<dyn Proposer>,
}

impl SpecDecoder {
    /// A decoder with the proposer `config` names (n-gram lookup or self-drafting).
    pub(crate) fn new(config: SpeculativeConfig) -> Self {
        let proposer: Box<dyn Proposer> = match config.draft_layers {
            Some(layers) => Box::new(SelfDraft { layers }),
            None => Box::new(NgramProposer { max_n: config.ngram_max, min_n: config.ngram_min }),
        };
        SpecDecoder { config, proposer }
    }

    /// Drafts come from `proposer` instead.
    pub(crate) fn set_proposer(&mut self, proposer: Box<dyn Proposer>) {
        self.proposer = proposer;
    }

    /// The state a new sequence starts with (speculating when allowed).
    pub(crate) fn start(may_speculate: bool) -> Option<SpecSeq> {
        may_speculate.then(SpecSeq::default)
    }

    /// Before scheduling: proposes drafts for every running, decoding sequence that may
    /// speculate, as many as its acceptance estimate says pay (none while the batch is large).
    pub(crate) fn propose(&self, sched: &mut Scheduler, num_layers: usize, max_len: usize) {
        let cfg = self.config;
        let draft_cost = cfg.draft_cost.unwrap_or_else(|| self.proposer.cost(num_layers));
        let decoding = sched
            .seqs
            .values()
            .filter(|s| s.status == SequenceStatus::Running && s.is_decoding())
            .count();
        let batch_ok = decoding < cfg.disable_batch_size;
        for seq in sched.seqs.values_mut() {
            let decoding = seq.status == SequenceStatus::Running && seq.is_decoding();
            // Room for the drafts and the token verification adds after them.
            let left =
                seq.params.max_tokens.saturating_sub(seq.num_output_tokens()).saturating_sub(1);
            let room = max_len.saturating_sub(seq.len()).saturating_sub(1);
            let Some(spec) = seq.spec.as_mut() else { continue };
            spec.drafts.clear();
            spec.draft_probs.clear();
            if !batch_ok || !decoding {
                continue;
            }
            let k = spec
                .estimate
                .budget(cfg.num_tokens, cfg.cost_slope, draft_cost)
                .min(left)
                .min(room);
            if k > 0 {
                // Model drafts: placeholders whose slots the schedule reserves; a pass fills them.
                spec.drafts =
                    self.proposer.propose(&seq.token_ids, k).unwrap_or_else(|| vec![0; k]);
            }
        }
    }

    /// After scheduling: drops the drafts the schedule did not make room for.
    pub(crate) fn fit(&self, plan: &SchedulerOutput, sched: &mut Scheduler) {
        let scheduled: HashMap<SeqId, usize> =
            plan.scheduled.iter().map(|s| (s.seq_id, s.num_tokens)).collect();
        for seq in sched.seqs.values_mut() {
            let id = seq.seq_id;
            let Some(spec) = seq.spec.as_mut() else { continue };
            match scheduled.get(&id) {
                Some(&n) => spec.drafts.truncate(n.saturating_sub(1)),
                None => spec.drafts.clear(),
            }
        }
    }

    /// Model drafts: fills the scheduled sequences' draft slots with tokens sampled from the
    /// draft (the model's first layers or a separate model), one pass per draft position over
    /// every drafting sequence, keeping each draft distribution for the rejection rule.
    pub(crate) fn draft(
        &mut self,
        plan: &SchedulerOutput,
        sched: &mut Scheduler,
        target: &mut dyn ModelBackend,
        eos: &[u32],
    ) -> Result<(), BackendError> {
        if !self.proposer.runs_model() {
            return Ok(()); // drafts were known before the step
        }
        let own_kv = self.proposer.own_kv();
        let ids: Vec<SeqId> = plan
            .scheduled
            .iter()
            .map(|s| s.seq_id)
            .filter(|id| !sched.seqs[id].drafts().is_empty())
            .collect();
        let k_max = ids.iter().map(|id| sched.seqs[id].drafts().len()).max().unwrap_or(0);
        let bs = sched.block_manager.block_size();
        let vocab = target.config().vocab_size;
        for j in 0..k_max {
            let mut batch = ForwardBatch::with_kv_groups(sched.block_manager.num_groups());
            let mut rows: Vec<SeqId> = Vec::new();
            for &id in &ids {
                let seq = sched.seqs.get_mut(&id).expect("drafting sequence exists");
                let pos = seq.num_computed_tokens + j;
                let blocks = &seq.block_table.blocks;
                let Some(spec) = seq.spec.as_mut().filter(|s| s.drafts.len() > j) else {
                    continue;
                };
                if j == 0 && own_kv {
                    // A separate draft catches up on every token it has not seen yet.
                    let same_blocks = spec.draft_blocks.len() <= blocks.len()
                        && blocks.starts_with(&spec.draft_blocks);
                    if !same_blocks {
                        spec.draft_computed = 0;
                    }
                    let from = spec.draft_computed.min(pos);
                    batch.push_seq(&seq.token_ids[from..=pos], from, blocks, bs, Logits::Last);
                } else {
                    let tok = if j == 0 { seq.token_ids[pos] } else { spec.drafts[j - 1] };
                    batch.push_seq(&[tok], pos, blocks, bs, Logits::Last);
                }
                if own_kv {
                    spec.draft_computed = pos + 1;
                    spec.draft_blocks.clone_from(blocks);
                }
                rows.push(id);
            }
            let logits = self.proposer.forward(target, &batch)?;
            for (id, row) in rows.into_iter().zip(logits.chunks_exact(vocab)) {
                let seq = sched.seqs.get_mut(&id).expect("drafting sequence exists");
                let params = seq.params.clone();
                let ctx = seq.sampling_context(eos);
                let work = processed(row, &params, &ctx);
                let (token, q) = if params.is_greedy() {
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
                };
                let spec = seq.spec.as_mut().expect("drafting sequence speculates");
                spec.drafts[j] = token;
                spec.draft_probs.extend(q);
            }
        }
        Ok(())
    }

    /// Verifies `seq`'s drafts against the target's `rows` (one per fed token): the accepted
    /// drafts in order, then one token of the target's (the replacement of the first rejected
    /// draft, or a bonus token after the last).
    pub(crate) fn verify(
        seq: &mut Sequence,
        rows: &[f32],
        vocab: usize,
        eos: &[u32],
    ) -> SampledSeq {
        let spec = seq.spec.as_mut().expect("a verified sequence speculates");
        let drafts = std::mem::take(&mut spec.drafts);
        let probs = std::mem::take(&mut spec.draft_probs);
        let k = drafts.len();
        debug_assert_eq!(rows.len(), (k + 1) * vocab);
        let params = seq.params.clone();
        let mut rng = seq.rng.clone();
        // Each position sees the output as it would be with the drafts accepted before it.
        let mut output = seq.output_ids().to_vec();
        let mut tokens = Vec::with_capacity(k + 1);
        for (i, row) in rows.chunks_exact(vocab).enumerate().take(k + 1) {
            let ctx = SamplingContext {
                prompt: &seq.token_ids[..seq.prompt_len],
                output: &output,
                eos_token_ids: eos,
            };
            let work = processed(row, &params, &ctx);
            let (token, is_draft) = match (drafts.get(i), params.is_greedy()) {
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
            };
            tokens.push(sampled(row, token, &params));
            output.push(token);
            if !is_draft {
                break;
            }
        }
        seq.rng = rng;
        let tokens = tokens.into();
        SampledSeq { seq_id: seq.seq_id, tokens, drafts_verified: Some(k), forks: Vec::new() }
    }
}
