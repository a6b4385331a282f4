//! The engine's speculative step: propose drafts for the decoding sequences, fit them into
//! the step's token budget, run a draft model when there is one, and verify the drafts against
//! the target's logits with [`crate::spec_decode::accept_or_resample`].

use std::collections::HashMap;

use super::{now_secs, EngineError, LLMEngine};
use crate::sampler::{
    argmax, draw_weighted, filtered_distribution, processed, sampled, Rng, SamplingContext,
};
use crate::scheduler::SchedulerOutput;
use crate::sequence::{SeqId, SequenceStatus};
use crate::spec_decode::{accept_or_resample, DraftDist};

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
