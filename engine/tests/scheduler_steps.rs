//! The scheduler alone, driven by fake runner outputs: no model is loaded. Each test plans
//! steps with `Scheduler::schedule`, makes up the tokens a runner would have produced, and
//! feeds them to `Scheduler::update_from_output`, checking what was scheduled, what was
//! computed, what finished and which blocks are held.

use std::sync::Arc;

use tandem_engine::model_files::tokenizer::Tokenizer;
use tandem_engine::sampling::sampler::{Rng, SampledToken, TokenLogprob};
use tandem_engine::scheduling::block_manager::BlockManager;
use tandem_engine::scheduling::request_output::{FinishReason, RequestMetrics};
use tandem_engine::scheduling::scheduler::{
    ForkedSeq, PreemptionMode, SampledSeq, Scheduler, SchedulerConfig, SchedulerOutput, StepUpdate,
};
use tandem_engine::scheduling::sequence::{SeqId, Sequence, SequenceStatus};
use tandem_engine::speculative::spec_decode::SpecSeq;
use tandem_engine::SamplingParams;

const BLOCK: usize = 4;

fn scheduler(num_blocks: usize, budget: usize, max_seqs: usize) -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: max_seqs,
        max_model_len: 1024,
        ..Default::default()
    };
    Scheduler::new(cfg, BlockManager::new(num_blocks, BLOCK, 0, true))
}

/// Token-id-only sampling (no detokenizer: the test tokenizer has no vocabulary).
fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams { detokenize: false, ignore_eos: true, ..SamplingParams::greedy(max_tokens) }
}

fn seq(id: SeqId, prompt_len: usize, p: SamplingParams) -> Sequence {
    let prompt = (0..prompt_len as u32).map(|i| 10 + (id as u32 * 97 + i) % 500).collect();
    let mut s = Sequence::new(
        id,
        format!("r{id}"),
        prompt,
        Arc::new(p),
        Rng::new(id),
        RequestMetrics::default(),
    );
    s.arrival_seq = id;
    s.group = id;
    s
}

fn token(t: u32) -> SampledToken {
    SampledToken {
        chosen: TokenLogprob { token_id: t, logprob: -0.5 },
        top: Vec::new(),
        rank: None,
    }
}

/// What a runner produces for `plan`: one token (`next`) for every scheduled sequence whose
/// tokens are then all computed.
fn fake_output(s: &Scheduler, plan: &SchedulerOutput, next: u32) -> Vec<SampledSeq> {
    plan.scheduled
        .iter()
        .filter(|x| s.seqs[&x.seq_id].num_computed_tokens + x.num_tokens == s.seqs[&x.seq_id].len())
        .map(|x| SampledSeq::one(x.seq_id, token(next)))
        .collect()
}

fn step(s: &mut Scheduler, next: u32) -> (SchedulerOutput, StepUpdate) {
    let plan = s.schedule(0.0);
    let out = fake_output(s, &plan, next);
    let update = s.update_from_output(&plan, out, &Tokenizer::ids_only(), 1.0).unwrap();
    check(s);
    (plan, update)
}

fn check(s: &Scheduler) {
    let tables: Vec<_> = s.seqs.values().map(|q| &q.block_table).collect();
    let hosts: Vec<_> = s.seqs.values().map(|q| &q.host_blocks).collect();
    s.block_manager.check_invariants(&tables, &hosts).unwrap();
}

fn planned(plan: &SchedulerOutput) -> Vec<(SeqId, usize)> {
    plan.scheduled.iter().map(|x| (x.seq_id, x.num_tokens)).collect()
}

#[test]
fn a_long_prompt_is_prefilled_in_chunks_and_sampled_once_complete() {
    let mut s = scheduler(64, 16, 8);
    s.add(seq(1, 40, params(3)));
    let (plan, up) = step(&mut s, 7);
    assert_eq!(planned(&plan), [(1, 16)]);
    assert!(up.updated.is_empty(), "no token before the prompt is complete");
    assert_eq!(up.prefill_tokens, 16);
    let (plan, _) = step(&mut s, 7);
    assert_eq!(planned(&plan), [(1, 16)]);
    let (plan, up) = step(&mut s, 7);
    assert_eq!(planned(&plan), [(1, 8)]);
    assert_eq!(up.updated, [1]);
    let q = &s.seqs[&1];
    assert_eq!((q.num_computed_tokens, q.len(), q.output_ids()), (40, 41, &[7][..]));
    assert!(q.is_decoding());
    assert_eq!(q.metrics.first_token_time, Some(1.0));
    // Decoding: one token per step until max_tokens.
    let (plan, _) = step(&mut s, 8);
    assert_eq!(planned(&plan), [(1, 1)]);
    let (_, up) = step(&mut s, 9);
    assert_eq!(up.finished.len(), 1);
    let done = &up.finished[0];
    assert_eq!(
        (done.finish_reason, done.output_ids()),
        (Some(FinishReason::Length), &[7, 8, 9][..])
    );
    assert!(s.seqs.is_empty());
    assert_eq!(s.block_manager.num_free_blocks(), 64, "every block back");
}

#[test]
fn decodes_come_first_and_a_new_prompt_gets_the_rest_of_the_budget() {
    let mut s = scheduler(64, 10, 8);
    s.add(seq(1, 6, params(20)));
    s.add(seq(2, 6, params(20)));
    let (plan, _) = step(&mut s, 5);
    assert_eq!(planned(&plan), [(1, 6), (2, 4)], "budget split between the two prompts");
    s.add(seq(3, 30, params(20)));
    let (plan, _) = step(&mut s, 5);
    // Seq 1 decodes first, seq 2 finishes its prompt, seq 3 takes what is left.
    assert_eq!(planned(&plan), [(1, 1), (2, 2), (3, 7)]);
    let (plan, _) = step(&mut s, 5);
    assert_eq!(planned(&plan), [(1, 1), (2, 1), (3, 8)]);
}

#[test]
fn a_stop_token_finishes_and_frees_the_blocks() {
    let mut s = scheduler(16, 64, 8);
    let p = SamplingParams { stop_token_ids: vec![99], ..params(50) };
    s.add(seq(1, 9, p));
    step(&mut s, 5);
    assert_eq!(s.block_manager.num_free_blocks(), 16 - 3);
    let (_, up) = step(&mut s, 99);
    assert_eq!(up.finished.len(), 1);
    assert_eq!(up.finished[0].finish_reason, Some(FinishReason::Stop));
    assert_eq!(up.generation_tokens, 1);
    assert_eq!(s.block_manager.num_free_blocks(), 16);
}

#[test]
fn short_of_blocks_the_newest_sequence_is_preempted_and_recomputed_later() {
    // 4 blocks of 4 tokens: two 7-token prompts take 2 blocks each; the first decode that
    // crosses a block boundary needs a fifth.
    let mut s = scheduler(4, 64, 8);
    s.config.preemption_mode = PreemptionMode::Recompute;
    s.add(seq(1, 7, params(10)));
    s.add(seq(2, 7, params(10)));
    step(&mut s, 5); // both prompts, first tokens: 8 tokens each, KV for 7
    let (plan, _) = step(&mut s, 5); // KV for token 8: still in block 2
    assert_eq!(planned(&plan), [(1, 1), (2, 1)]);
    let (plan, _) = step(&mut s, 5); // token 9 needs a third block each: seq 2 gives way
    assert_eq!(plan.preempted, [2]);
    assert_eq!(planned(&plan), [(1, 1)]);
    let q = &s.seqs[&2];
    assert_eq!(
        (q.status, q.num_computed_tokens, q.block_table.len()),
        (SequenceStatus::Waiting, 0, 0)
    );
    assert_eq!(s.num_preemptions, 1);
    // Seq 2 comes back once seq 1 finishes, recomputing its prompt and the tokens it had.
    while s.seqs.contains_key(&1) {
        step(&mut s, 5);
    }
    let plan = s.schedule(0.0);
    assert_eq!(planned(&plan), [(2, 9)]);
}

#[test]
fn verified_drafts_advance_by_the_accepted_tokens_and_return_rejected_blocks() {
    let mut s = scheduler(32, 64, 8);
    let mut q = seq(1, 7, params(50));
    q.spec = Some(SpecSeq::default());
    s.add(q);
    step(&mut s, 5); // prompt: 8 tokens, KV for 7
                     // Four drafts: the step feeds 5 tokens (positions 7..12), needing blocks up to token 12.
    s.seqs.get_mut(&1).unwrap().spec.as_mut().unwrap().drafts = vec![20, 21, 22, 23];
    let plan = s.schedule(0.0);
    assert_eq!(planned(&plan), [(1, 5)]);
    assert_eq!(s.seqs[&1].block_table.len(), 3);
    // The runner verified: the first draft accepted, the second replaced by 30.
    let out = vec![SampledSeq {
        tokens: vec![token(20), token(30)].into(),
        drafts_verified: Some(4),
        ..SampledSeq::one(1, token(0))
    }];
    let up = s.update_from_output(&plan, out, &Tokenizer::ids_only(), 1.0).unwrap();
    check(&s);
    assert_eq!(up.verified, [(4, 1)]);
    let q = &s.seqs[&1];
    assert_eq!(q.output_ids(), [5, 20, 30]);
    // KV is valid for the fed token and the accepted draft: 9 tokens, 3 blocks (not more).
    assert_eq!((q.num_computed_tokens, q.block_table.len()), (9, 3));
    assert!(q.drafts().is_empty());
    assert!(q.is_decoding());
}

#[test]
fn a_stop_among_the_accepted_drafts_ends_the_sequence_there() {
    let mut s = scheduler(32, 64, 8);
    let mut q = seq(1, 7, SamplingParams { stop_token_ids: vec![21], ..params(50) });
    q.spec = Some(SpecSeq::default());
    s.add(q);
    step(&mut s, 5);
    s.seqs.get_mut(&1).unwrap().spec.as_mut().unwrap().drafts = vec![20, 21, 22];
    let plan = s.schedule(0.0);
    let out = vec![SampledSeq {
        tokens: vec![token(20), token(21), token(22), token(40)].into(),
        drafts_verified: Some(3),
        ..SampledSeq::one(1, token(0))
    }];
    let up = s.update_from_output(&plan, out, &Tokenizer::ids_only(), 1.0).unwrap();
    assert_eq!(up.verified, [(3, 2)], "drafts after the stop do not count");
    assert_eq!(up.generation_tokens, 2);
    assert_eq!(up.finished[0].output_ids(), [5, 20, 21]);
    assert_eq!(s.block_manager.num_free_blocks(), 32);
}

#[test]
fn a_prefill_only_sequence_finishes_at_its_first_token_holding_its_blocks() {
    let mut s = scheduler(16, 64, 8);
    let mut q = seq(1, 9, params(50));
    q.prefill_only = true;
    s.add(q);
    let plan = s.schedule(0.0);
    let out = fake_output(&s, &plan, 5);
    let up = s.update_from_output(&plan, out, &Tokenizer::ids_only(), 1.0).unwrap();
    assert_eq!(up.finished.len(), 1);
    let done = &up.finished[0];
    assert_eq!(done.finish_reason, Some(FinishReason::Length));
    assert_eq!(done.block_table.len(), 3, "its pages are still to ship");
    s.block_manager.check_invariants(&[&done.block_table], &[]).unwrap();
    assert_eq!(s.block_manager.num_free_blocks(), 16 - 3);
    assert!(s.seqs.is_empty());
}

#[test]
fn forks_share_the_prompt_blocks_and_count_against_max_num_seqs() {
    let mut s = scheduler(32, 64, 3);
    s.add(seq(1, 8, SamplingParams { n: 3, ..params(4) }));
    s.add(seq(2, 8, params(4)));
    let plan = s.schedule(0.0);
    assert_eq!(planned(&plan), [(1, 8)], "seq 1 takes three slots; seq 2 waits");
    let mut out = fake_output(&s, &plan, 5);
    out[0].forks = [(10, 1), (11, 2)]
        .map(|(id, index)| ForkedSeq { seq_id: id, index, rng: Rng::new(id), token: token(6) })
        .to_vec();
    let up = s.update_from_output(&plan, out, &Tokenizer::ids_only(), 1.0).unwrap();
    check(&s);
    assert_eq!(up.updated, [1, 10, 11]);
    // The prompt's blocks are shared three ways, and were cached before they were shared.
    let first = s.seqs[&1].block_table.blocks[0];
    assert_eq!(s.block_manager.ref_count(first), 3);
    assert_eq!(s.block_manager.cached_hashes().len(), 2);
    assert_eq!(s.seqs[&10].num_computed_tokens, 8, "a fork does not recompute the prompt");
    assert_eq!(s.seqs[&10].output_ids(), [6]);
    let plan = s.schedule(0.0);
    assert_eq!(planned(&plan), [(1, 1), (10, 1), (11, 1)], "seq 2 still waits for a slot");
}

/// Planning ahead (async scheduling): with a step's tokens still on the device, its KV is
/// marked computed, each sequence counts its coming token as pending and is planned one token
/// further; a sequence that token must end (its last by `max_tokens`) leaves the running set
/// with its blocks at once, so its slot goes to a waiting prompt in the same plan.
#[test]
fn a_step_planned_ahead_counts_pending_tokens_and_frees_ending_sequences() {
    let mut s = scheduler(32, 64, 2);
    s.add(seq(1, 6, params(5)));
    s.add(seq(2, 6, params(1)));
    s.add(seq(3, 6, params(5)));
    let plan = s.schedule(0.0);
    assert_eq!(planned(&plan), [(1, 6), (2, 6)], "two slots: seq 3 waits");
    let free_before = s.block_manager.num_free_blocks();
    // The step is launched; the next is planned before its tokens arrive.
    let prefill = s.mark_step_computed(&plan, &[]);
    assert_eq!(prefill, 12);
    s.expect_tokens(&[1, 2]);
    assert_eq!((s.seqs[&1].pending_tokens, s.seqs[&1].next_len()), (1, 7));
    assert!(s.seqs[&1].is_decoding(), "a pending first token makes it a decode");
    assert_eq!(s.seqs[&2].pending_tokens, 0, "its coming token is its last");
    assert!(s.seqs[&2].block_table.is_empty(), "its blocks went back at once");
    assert!(s.block_manager.num_free_blocks() > free_before);
    let ahead = s.schedule(0.0);
    assert_eq!(planned(&ahead), [(1, 1), (3, 6)], "seq 1 one token on; seq 3 takes seq 2's slot");
    // The launched step's tokens arrive: seq 2 ends, seq 1 has its token and no pending one.
    let out = vec![SampledSeq::one(1, token(7)), SampledSeq::one(2, token(8))];
    let up = s.apply_sampled(out, &Tokenizer::ids_only(), 1.0, prefill).unwrap();
    check(&s);
    assert_eq!(up.finished.iter().map(|q| q.seq_id).collect::<Vec<_>>(), [2]);
    assert_eq!(up.prefill_tokens, 12);
    assert_eq!((s.seqs[&1].pending_tokens, s.seqs[&1].len()), (0, 7));
    assert_eq!(s.seqs[&1].output_ids(), [7]);
    // The planned step runs as planned: seq 1 computes the token that arrived.
    let out = fake_output(&s, &ahead, 9);
    let up = s.update_from_output(&ahead, out, &Tokenizer::ids_only(), 2.0).unwrap();
    check(&s);
    assert_eq!(up.updated, [1, 3]);
    assert_eq!(s.seqs[&1].num_computed_tokens, 7);
    assert_eq!(s.seqs[&1].output_ids(), [7, 9]);
}
