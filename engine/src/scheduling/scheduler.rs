//! `Scheduler`: continuous batching with chunked prefill and preemption (seed 000 alg. 3, 6
//! and 8; the Scheduler → BlockManager step of seed 002).
//!
//! Each step fills a token budget: first one token for every decoding sequence (so long prompts
//! cannot starve decodes), then the chunks of prompts already being prefilled, then swapped-out
//! sequences, then new requests (reusing prefix-cache hits). When a sequence cannot get a block,
//! the lowest-priority / newest sequence not yet scheduled is preempted — by recompute (blocks
//! freed, sequence re-queued) or by swap (blocks copied to host memory). The scheduler owns the
//! sequences and the block manager; it decides, and never runs the model.
//!
//! `max_num_seqs` bounds the running set however a sequence gets there: a new prompt is
//! admitted only with room for itself and the completions it will fork (`n > 1`), and a
//! sequence parked for a remote prefill holds its slot until its KV arrives. New sequences are admitted least-served group first (a group
//! is one client request, which may span several engine requests), so one request's many
//! prompts and completions cannot starve the others.

use std::collections::{HashMap, VecDeque};

use crate::model_files::tokenizer::{TokenizeError, Tokenizer};
use crate::sampling::sampler::{Rng, SampledToken};
use crate::scheduling::block_manager::BlockManager;
use crate::scheduling::request_output::FinishReason;
use crate::scheduling::sequence::{SeqId, SeqMap, Sequence, SequenceStatus};

/// Running-set slots held by each sequence group (a step's admission spreads new work over
/// the groups holding the fewest).
type GroupSlots = HashMap<u64, usize, foldhash::fast::RandomState>;

/// How preempted sequences give their blocks back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptionMode {
    /// Free the blocks; recompute the KV when rescheduled.
    #[default]
    Recompute,
    /// Copy the blocks to host memory and back (falls back to recompute without swap space).
    Swap,
}

/// Order in which requests are served and victims chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    /// First come, first served; the newest request is preempted first.
    #[default]
    Fcfs,
    /// Lowest `priority` value first (then arrival); the lowest priority is preempted first.
    Priority,
}

/// Scheduler limits.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Token budget of one step (decode tokens + prefill chunks).
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Preemption mode.
    pub preemption_mode: PreemptionMode,
    /// Scheduling policy.
    pub policy: SchedulingPolicy,
    /// Split long prompts into chunks across steps.
    pub enable_chunked_prefill: bool,
    /// Longest context a sequence may reach.
    pub max_model_len: usize,
    /// Seed of the block hash.
    pub hash_seed: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            preemption_mode: PreemptionMode::Recompute,
            policy: SchedulingPolicy::Fcfs,
            enable_chunked_prefill: true,
            max_model_len: 8192,
            hash_seed: crate::scheduling::block_hash::DEFAULT_HASH_SEED,
        }
    }
}

/// One sequence's work in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub seq_id: SeqId,
    /// Tokens to compute in this step, from `num_computed_tokens`.
    pub num_tokens: usize,
}

/// The plan of one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerOutput {
    /// Sequences to run, decodes first.
    pub scheduled: Vec<ScheduledSeq>,
    /// `(device, host)` copies for sequences swapped out in this step.
    pub blocks_to_swap_out: Vec<(u32, u32)>,
    /// `(src, dst)` device copies (copy-on-write).
    pub blocks_to_copy: Vec<(u32, u32)>,
    /// `(host, device)` copies for sequences swapped in.
    pub blocks_to_swap_in: Vec<(u32, u32)>,
    /// Sequences preempted in this step.
    pub preempted: Vec<SeqId>,
    /// Tokens in the step.
    pub num_batched_tokens: usize,
    /// Blocks freed while scheduling (secure mode), zeroed after the swap-out copies and
    /// before anything writes them.
    pub blocks_to_zero: Vec<u32>,
}

impl SchedulerOutput {
    /// Whether there is nothing to run.
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty() && self.blocks_to_swap_out.is_empty()
    }
}

/// The tokens one step produced for one sequence (the runner's output once sampled): the
/// input of [`Scheduler::update_from_output`].
#[derive(Debug, Clone, PartialEq)]
pub struct SampledSeq {
    /// The sequence.
    pub seq_id: SeqId,
    /// Its new tokens, in order: one sampled token, or the drafts the verification accepted
    /// followed by one token of the target's (one token, the common case, is held inline: no
    /// allocation per sequence and step).
    pub tokens: SampledTokens,
    /// `Some(k)` when this step verified `k` drafts.
    pub drafts_verified: Option<usize>,
    /// The completions to fork off this sequence, whose prompt this step finished (n > 1).
    pub forks: Vec<ForkedSeq>,
}

impl SampledSeq {
    /// One sampled token for `seq_id`.
    pub fn one(seq_id: SeqId, token: SampledToken) -> Self {
        let tokens = SampledTokens::from_buf([token]);
        SampledSeq { seq_id, tokens, drafts_verified: None, forks: Vec::new() }
    }
}

/// A sequence's tokens of one step ([`SampledSeq::tokens`]).
pub type SampledTokens = smallvec::SmallVec<[SampledToken; 1]>;

/// A completion forked off a sequence whose prompt is done (n > 1), with its first token.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkedSeq {
    /// Its id.
    pub seq_id: SeqId,
    /// Its completion index.
    pub index: usize,
    /// Its random stream (after drawing `token`).
    pub rng: Rng,
    /// Its first token, sampled from its parent's logits.
    pub token: SampledToken,
}

/// What [`Scheduler::update_from_output`] did.
#[derive(Debug, Default)]
pub struct StepUpdate {
    /// Sequences that received tokens, in the order of the step's output (forked completions
    /// included).
    pub updated: Vec<SeqId>,
    /// Sequences that finished, taken out of the scheduler. A prefill-only one still holds its
    /// block table (its pages are yet to ship: the caller pins and later frees it); every other
    /// one has freed its blocks.
    pub finished: Vec<Sequence>,
    /// Prompt (or recomputed) tokens whose KV this step computed.
    pub prefill_tokens: u64,
    /// Tokens appended.
    pub generation_tokens: u64,
    /// `(proposed, accepted)` of each verified draft.
    pub verified: Vec<(usize, usize)>,
}

/// The scheduler with its queues, sequences and block manager.
#[derive(Debug)]
pub struct Scheduler {
    /// Limits and policies.
    pub config: SchedulerConfig,
    /// Block ownership.
    pub block_manager: BlockManager,
    /// Every live sequence.
    pub seqs: SeqMap,
    waiting: VecDeque<SeqId>,
    running: Vec<SeqId>,
    swapped: VecDeque<SeqId>,
    /// Sequences holding blocks while their prompt's KV arrives from a prefill worker; never
    /// scheduled until unparked.
    parked: Vec<SeqId>,
    /// Preemptions since start.
    pub num_preemptions: u64,
    /// [`Scheduler::schedule`]'s order and reserved sequences, kept between steps: buffers of
    /// a few KiB allocated anew every step each made glibc consolidate its freed small chunks.
    scratch: (Vec<SeqId>, Vec<SeqId>),
}

impl Scheduler {
    /// A scheduler over `block_manager`.
    pub fn new(config: SchedulerConfig, block_manager: BlockManager) -> Self {
        Scheduler {
            config,
            block_manager,
            seqs: SeqMap::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            swapped: VecDeque::new(),
            parked: Vec::new(),
            num_preemptions: 0,
            scratch: Default::default(),
        }
    }

    /// Queues a new sequence.
    pub fn add(&mut self, seq: Sequence) {
        let id = seq.seq_id;
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
    }

    /// Adds a forked sequence that is already running (its blocks are already held).
    pub fn add_running(&mut self, seq: Sequence) {
        let id = seq.seq_id;
        self.seqs.insert(id, seq);
        self.running.push(id);
    }

    /// Numbers of waiting, running and swapped sequences.
    pub fn queue_lengths(&self) -> (usize, usize, usize) {
        (self.waiting.len(), self.running.len(), self.swapped.len())
    }

    /// Whether any sequence is unfinished.
    pub fn has_unfinished(&self) -> bool {
        !(self.waiting.is_empty()
            && self.running.is_empty()
            && self.swapped.is_empty()
            && self.parked.is_empty())
    }

    /// Whether a step has sequences to run the model for (waiting, running or swapped; not
    /// those parked for remote KV).
    pub fn has_runnable(&self) -> bool {
        !(self.waiting.is_empty() && self.running.is_empty() && self.swapped.is_empty())
    }

    /// Running-set slots `id` takes: itself and the completions still to fork from it.
    fn slots(&self, id: SeqId) -> usize {
        self.seqs.get(&id).map_or(0, |s| 1 + s.pending_forks)
    }

    /// Slots taken by running and parked sequences (parked ones run as soon as their KV lands).
    pub fn occupied_slots(&self) -> usize {
        self.running.iter().chain(&self.parked).map(|&id| self.slots(id)).sum()
    }

    /// Whether `need` more slots fit under `max_num_seqs`.
    fn has_room(&self, need: usize) -> bool {
        self.occupied_slots() + need <= self.config.max_num_seqs
    }

    /// Moves a waiting sequence to the parked set with blocks for its whole prompt, reusing
    /// prefix-cache hits; it takes its running-set slot now. Returns the number of prompt tokens
    /// already cached, or None (and leaves it waiting) when the blocks or the slot are not
    /// available.
    pub fn park(&mut self, id: SeqId) -> Option<usize> {
        let bs = self.block_manager.block_size();
        let seed = self.config.hash_seed;
        let seq = self.seqs.get_mut(&id)?;
        if seq.status != SequenceStatus::Waiting || !self.waiting.contains(&id) {
            return None;
        }
        let need = 1 + seq.pending_forks;
        if !self.has_room(need) {
            return None;
        }
        let seq = self.seqs.get_mut(&id)?;
        seq.update_block_hashes(seed, bs);
        let usable = (seq.len() - 1) / bs;
        // Pages of the hit that a window has passed are not needed: none are shipped back.
        let cached = self.block_manager.lookup_prefix_in_window(&seq.block_hashes[..usable], true);
        let len = seq.len();
        if !self.block_manager.can_allocate(&seq.block_table, &cached, len) {
            return None;
        }
        self.block_manager
            .allocate(&mut seq.block_table, &cached, len)
            .expect("checked can_allocate");
        // Its first step here runs from position `len`: the pages a window has passed by then
        // go back now, and the prefill worker does not ship them (`page_read_from`).
        self.block_manager.release_passed(&mut seq.block_table, len);
        seq.num_computed_tokens = self.block_manager.cached_tokens(&cached);
        seq.metrics.num_cached_tokens = seq.num_computed_tokens;
        self.waiting.retain(|&x| x != id);
        self.parked.push(id);
        Some(seq.num_computed_tokens)
    }

    /// A parked sequence whose KV has arrived joins the running set (in the slot it took when
    /// parked).
    pub fn unpark_running(&mut self, id: SeqId) -> bool {
        if !self.parked.contains(&id) {
            return false;
        }
        self.parked.retain(|&x| x != id);
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.status = SequenceStatus::Running;
            self.running.push(id);
        }
        true
    }

    /// A parked sequence whose transfer failed goes back to the front of the waiting queue, its
    /// blocks freed, to be prefilled locally.
    pub fn unpark_waiting(&mut self, id: SeqId) -> bool {
        if !self.parked.contains(&id) {
            return false;
        }
        self.parked.retain(|&x| x != id);
        if let Some(seq) = self.seqs.get_mut(&id) {
            self.block_manager.free(&mut seq.block_table);
            seq.num_computed_tokens = 0;
            seq.status = SequenceStatus::Waiting;
            self.waiting.push_front(id);
        }
        true
    }

    fn key(&self, id: SeqId) -> (i32, u64, usize) {
        let s = &self.seqs[&id];
        let prio = if self.config.policy == SchedulingPolicy::Priority { s.priority } else { 0 };
        (prio, s.arrival_seq, s.index)
    }

    /// Removes a sequence from the queues and frees its blocks; returns it.
    pub fn remove(&mut self, id: SeqId) -> Option<Sequence> {
        let mut seq = self.seqs.remove(&id)?;
        self.waiting.retain(|&x| x != id);
        self.running.retain(|&x| x != id);
        self.swapped.retain(|&x| x != id);
        self.parked.retain(|&x| x != id);
        self.block_manager.free(&mut seq.block_table);
        self.block_manager.free_host(&mut seq.host_blocks);
        Some(seq)
    }

    fn preempt(&mut self, id: SeqId, out: &mut SchedulerOutput) {
        self.num_preemptions += 1;
        out.preempted.push(id);
        self.running.retain(|&x| x != id);
        let seq = self.seqs.get_mut(&id).expect("running sequence exists");
        if self.config.preemption_mode == PreemptionMode::Swap {
            if let Ok((host, copies)) = self.block_manager.swap_out(&mut seq.block_table) {
                seq.host_blocks = host;
                seq.status = SequenceStatus::Swapped;
                out.blocks_to_swap_out.extend(copies);
                self.swapped.push_back(id);
                return;
            }
        }
        self.block_manager.free(&mut seq.block_table);
        seq.num_computed_tokens = 0;
        seq.status = SequenceStatus::Waiting;
        self.waiting.push_front(id);
    }

    /// Gives `id` the blocks for `n` more tokens, preempting others (or itself) when memory is
    /// short. Returns whether `id` is still scheduled.
    fn reserve(
        &mut self,
        id: SeqId,
        n: usize,
        order: &[SeqId],
        done: &[SeqId],
        out: &mut SchedulerOutput,
    ) -> bool {
        loop {
            let seq = self.seqs.get_mut(&id).expect("sequence exists");
            let from = seq.num_computed_tokens;
            if !seq.prefill_only {
                self.block_manager.release_passed(&mut seq.block_table, from);
            }
            match self.block_manager.append_slots(&mut seq.block_table, from, from + n) {
                Ok(copies) => {
                    out.blocks_to_copy.extend(copies);
                    return true;
                }
                Err(_) => {
                    let victim = order
                        .iter()
                        .rev()
                        .copied()
                        .find(|v| *v != id && !done.contains(v) && self.running.contains(v));
                    match victim {
                        Some(v) => self.preempt(v, out),
                        None => {
                            self.preempt(id, out);
                            return false;
                        }
                    }
                }
            }
        }
    }

    /// Plans the next step.
    pub fn schedule(&mut self, now: f64) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_num_batched_tokens;
        let mut running = std::mem::take(&mut self.running);
        running.sort_by_key(|&id| self.key(id));
        self.running = running;
        // Decodes first, then prompts being prefilled, each in priority order.
        let (mut order, mut done) = std::mem::take(&mut self.scratch);
        order.clear();
        done.clear();
        let decoding = |id: &&SeqId| self.seqs[*id].is_decoding();
        order.extend(self.running.iter().filter(decoding));
        order.extend(self.running.iter().filter(|id| !decoding(id)));
        out.scheduled.reserve(order.len());
        for &id in &order {
            if out.preempted.contains(&id) {
                continue; // preempted earlier in this step (`preempt` lists every one)
            }
            let want = self.seqs[&id].num_uncomputed() + self.seqs[&id].drafts().len();
            if want == 0 {
                // Its last token is still on the device (planned ahead): it ends with it.
                continue;
            }
            let n = want.min(budget).min(self.seqs[&id].chunk_limit());
            if n == 0 {
                break;
            }
            if self.reserve(id, n, &order, &done, &mut out) {
                done.push(id);
                out.scheduled.push(ScheduledSeq { seq_id: id, num_tokens: n });
                budget -= n;
            }
        }
        self.scratch.0 = order;
        let preempted_now = !out.preempted.is_empty();
        // Swapped sequences come back before new work is admitted.
        if !preempted_now {
            let mut swapped: Vec<SeqId> = self.swapped.iter().copied().collect();
            swapped.sort_by_key(|&id| self.key(id));
            for id in swapped {
                if !self.has_room(self.slots(id)) || budget == 0 {
                    break;
                }
                let seq = &self.seqs[&id];
                let n = seq.num_uncomputed().min(budget).min(seq.chunk_limit());
                // Blocks for its KV and for this step's tokens, so the reservation below cannot
                // preempt a sequence whose swap-in is already planned.
                let need =
                    self.block_manager.swap_in_need(&seq.host_blocks, seq.num_computed_tokens + n);
                if !self.block_manager.can_swap_in(need) {
                    break;
                }
                let seq = self.seqs.get_mut(&id).expect("swapped sequence exists");
                let (table, copies) =
                    self.block_manager.swap_in(&mut seq.host_blocks).expect("checked can_swap_in");
                seq.block_table = table;
                seq.status = SequenceStatus::Running;
                out.blocks_to_swap_in.extend(copies);
                self.swapped.retain(|&x| x != id);
                self.running.push(id);
                if self.reserve(id, n, &[], &done, &mut out) {
                    done.push(id);
                    out.scheduled.push(ScheduledSeq { seq_id: id, num_tokens: n });
                    budget -= n;
                }
            }
        }
        self.scratch.1 = done;
        if !preempted_now && self.swapped.is_empty() {
            self.admit_waiting(&mut budget, now, &mut out);
        }
        out.num_batched_tokens = out.scheduled.iter().map(|s| s.num_tokens).sum();
        out.blocks_to_zero = self.block_manager.take_blocks_to_zero();
        out
    }

    /// The waiting sequence to admit next: highest priority (under the priority policy), then
    /// the group holding the fewest running-set slots, then queue order. Returns its position.
    fn next_waiting(&self, served: &GroupSlots) -> Option<usize> {
        let prio = |s: &Sequence| {
            if self.config.policy == SchedulingPolicy::Priority {
                s.priority
            } else {
                0
            }
        };
        // The queue's front holds the lowest priority value (every priority is 0 under FCFS;
        // under the priority policy `admit_waiting` sorts the queue first): a sequence with that
        // priority whose group holds no slot has the smallest key there can be, and every later
        // one only a larger position, so the scan stops there instead of reading a deep queue
        // once per admission.
        let floor = self.waiting.front().map(|id| prio(&self.seqs[id]))?;
        let mut best: Option<((i32, usize, usize), usize)> = None;
        for (pos, id) in self.waiting.iter().enumerate() {
            let s = &self.seqs[id];
            let key = (prio(s), served.get(&s.group).copied().unwrap_or(0), pos);
            if best.is_none_or(|(b, _)| key < b) {
                best = Some((key, pos));
            }
            if key.0 == floor && key.1 == 0 {
                break;
            }
        }
        best.map(|(_, pos)| pos)
    }

    fn admit_waiting(&mut self, budget: &mut usize, now: f64, out: &mut SchedulerOutput) {
        if self.config.policy == SchedulingPolicy::Priority {
            let mut w: Vec<SeqId> = self.waiting.drain(..).collect();
            w.sort_by_key(|&id| self.key(id));
            self.waiting = w.into();
        }
        let bs = self.block_manager.block_size();
        // Slots each group holds, and all of them.
        let mut served = GroupSlots::default();
        let mut used = 0;
        for &id in self.running.iter().chain(&self.parked) {
            let n = self.slots(id);
            *served.entry(self.seqs[&id].group).or_default() += n;
            used += n;
        }
        while *budget > 0 {
            let Some(pos) = self.next_waiting(&served) else { break };
            let id = self.waiting[pos];
            let need = self.slots(id);
            if used + need > self.config.max_num_seqs {
                break;
            }
            let seed = self.config.hash_seed;
            let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
            seq.update_block_hashes(seed, bs);
            // At least one token is always computed, to produce logits.
            let usable = (seq.len() - 1) / bs;
            let first_time = seq.metrics.first_scheduled_time.is_none();
            let hashes = &seq.block_hashes[..usable];
            // A prefill worker's request ships every page of its prompt, so it needs them all.
            let cached = if seq.prefill_only {
                self.block_manager.lookup_prefix(hashes, first_time)
            } else {
                self.block_manager.lookup_prefix_in_window(hashes, first_time)
            };
            let num_cached = self.block_manager.cached_tokens(&cached);
            let remaining = seq.len() - num_cached;
            let n = if self.config.enable_chunked_prefill {
                remaining.min(*budget).min(seq.chunk_limit())
            } else if remaining <= *budget {
                remaining
            } else {
                break;
            };
            if !self.block_manager.can_allocate(&seq.block_table, &cached, num_cached + n) {
                break;
            }
            self.block_manager
                .allocate(&mut seq.block_table, &cached, num_cached + n)
                .expect("checked can_allocate");
            seq.num_computed_tokens = num_cached;
            seq.status = SequenceStatus::Running;
            if first_time {
                seq.metrics.first_scheduled_time = Some(now);
                seq.metrics.num_cached_tokens = num_cached;
            }
            *served.entry(seq.group).or_default() += need;
            used += need;
            self.waiting.remove(pos);
            self.running.push(id);
            out.scheduled.push(ScheduledSeq { seq_id: id, num_tokens: n });
            *budget -= n;
        }
    }

    /// After a step has run and its rows were sampled: records the KV the step computed,
    /// appends each sequence's new tokens with the stop conditions, gives back the blocks that
    /// only held rejected drafts, and takes finished sequences out (seed 002's postprocess).
    pub fn update_from_output(
        &mut self,
        plan: &SchedulerOutput,
        sampled: Vec<SampledSeq>,
        tokenizer: &Tokenizer,
        now: f64,
    ) -> Result<StepUpdate, TokenizeError> {
        let verifying: Vec<SeqId> =
            sampled.iter().filter(|s| s.drafts_verified.is_some()).map(|s| s.seq_id).collect();
        let prefill_tokens = self.mark_step_computed(plan, &verifying);
        self.apply_sampled(sampled, tokenizer, now, prefill_tokens)
    }

    /// Records the KV a step computed for its sequences but `skip` (drafts being verified are
    /// marked once verified); returns how many of those tokens were prompt (or recomputed)
    /// tokens. Called before the step's tokens are known when the next step is planned ahead:
    /// the device computes that KV before anything the next step queues.
    pub fn mark_step_computed(&mut self, plan: &SchedulerOutput, skip: &[SeqId]) -> u64 {
        let mut prefill_tokens = 0;
        for s in &plan.scheduled {
            let Some(seq) = self.seqs.get(&s.seq_id) else { continue };
            if skip.contains(&s.seq_id) {
                continue;
            }
            if !seq.is_decoding() {
                prefill_tokens += s.num_tokens as u64;
            }
            self.mark_computed(s.seq_id, s.num_tokens);
        }
        prefill_tokens
    }

    /// The launched step samples a token for each of `ids`: those its token cannot end count
    /// it as pending ([`Sequence::pending_tokens`]), so the next step can be planned (and
    /// launched, reading that token on the device) before it reaches the host. A sequence
    /// whose next token is its last is not planned again: it leaves the running set and gives
    /// its blocks back now, as it would once that token arrived (the device writes its KV
    /// before anything planned next; a prefill worker's request keeps both, its pages ship
    /// once it finishes).
    pub fn expect_tokens(&mut self, ids: &[SeqId]) {
        let max_len = self.config.max_model_len;
        for id in ids {
            let Some(seq) = self.seqs.get_mut(id) else { continue };
            if !seq.next_token_ends(max_len) {
                seq.pending_tokens = 1;
            } else if !seq.prefill_only {
                self.block_manager.free(&mut seq.block_table);
                self.running.retain(|x| x != id);
            }
        }
    }

    /// Appends each sequence's new tokens with the stop conditions (clearing its pending
    /// token), gives back the blocks that only held rejected drafts, and takes finished
    /// sequences out; the step's KV was recorded by [`Scheduler::mark_step_computed`], which
    /// counted `prefill_tokens`.
    pub fn apply_sampled(
        &mut self,
        sampled: Vec<SampledSeq>,
        tokenizer: &Tokenizer,
        now: f64,
        prefill_tokens: u64,
    ) -> Result<StepUpdate, TokenizeError> {
        let updated = Vec::with_capacity(sampled.len());
        let mut update = StepUpdate { prefill_tokens, updated, ..Default::default() };
        let mut finished: Vec<SeqId> = Vec::new();
        for out in sampled {
            let id = out.seq_id;
            if !self.seqs.contains_key(&id) {
                continue;
            }
            // Forks first: each starts from the parent's state before this step's token.
            let mut forks = Vec::with_capacity(out.forks.len());
            if !out.forks.is_empty() {
                self.seqs.get_mut(&id).expect("checked").pending_forks = 0;
            }
            for f in out.forks {
                self.fork(id, f.seq_id, f.index, f.rng);
                forks.push((f.seq_id, f.token));
            }
            let offered = out.tokens.len();
            let appended =
                self.append(id, out.tokens, tokenizer, now, &mut update, &mut finished)?;
            if let Some(k) = out.drafts_verified {
                // Appended drafts: all but the target's own last token, unless a stop came first.
                let accepted = appended.min(offered.saturating_sub(1));
                self.verified(id, k, accepted);
                update.verified.push((k, accepted));
            }
            for (child, token) in forks {
                self.append(child, [token], tokenizer, now, &mut update, &mut finished)?;
            }
        }
        for id in finished {
            let pin = self.seqs.get(&id).is_some_and(|s| s.prefill_only);
            let seq = if pin { self.detach(id) } else { self.remove(id) };
            update.finished.extend(seq);
        }
        Ok(update)
    }

    /// Appends `tokens` to `id` until one finishes it; returns how many were appended.
    fn append(
        &mut self,
        id: SeqId,
        tokens: impl IntoIterator<Item = SampledToken>,
        tokenizer: &Tokenizer,
        now: f64,
        update: &mut StepUpdate,
        finished: &mut Vec<SeqId>,
    ) -> Result<usize, TokenizeError> {
        let max_len = self.config.max_model_len;
        let Some(seq) = self.seqs.get_mut(&id) else { return Ok(0) };
        seq.pending_tokens = 0;
        seq.metrics.first_token_time.get_or_insert(now);
        let mut appended = 0;
        let mut done = false;
        for t in tokens {
            appended += 1;
            done = seq.append_token(t, tokenizer, max_len)?;
            if done {
                break;
            }
        }
        if seq.prefill_only && !done {
            // The prefill stage ends at its first token; a decode worker continues.
            seq.finish(FinishReason::Length, None);
            done = true;
        }
        update.generation_tokens += appended as u64;
        if done {
            seq.metrics.finished_time = Some(now);
            finished.push(id);
        }
        update.updated.push(id);
        Ok(appended)
    }

    /// A verified draft of `proposed` tokens kept `accepted`: the fed token and the accepted
    /// drafts have valid KV; blocks past them held only rejected drafts and are given back.
    fn verified(&mut self, id: SeqId, proposed: usize, accepted: usize) {
        self.mark_computed(id, 1 + accepted);
        let bs = self.block_manager.block_size();
        let Some(seq) = self.seqs.get_mut(&id) else { return };
        let keep = seq.num_computed_tokens.div_ceil(bs);
        self.block_manager.truncate(&mut seq.block_table, keep);
        if let Some(spec) = seq.spec.as_mut() {
            spec.drafts.clear();
            spec.draft_probs.clear();
            spec.estimate.update(proposed, accepted);
            spec.draft_computed = spec.draft_computed.min(seq.num_computed_tokens);
            spec.draft_blocks.truncate(keep * self.block_manager.num_groups());
        }
    }

    /// Forks completion `index` of running sequence `parent` as `child_id` (n > 1): it shares
    /// the parent's blocks (copy on write) and runs at once.
    fn fork(&mut self, parent: SeqId, child_id: SeqId, index: usize, rng: Rng) {
        let Some(seq) = self.seqs.get(&parent) else { return };
        let mut child = seq.fork(child_id, index, rng);
        child.block_table = self.block_manager.fork(&seq.block_table);
        child.status = SequenceStatus::Running;
        self.add_running(child);
    }

    /// Beam search: beam `id`, whose logits this step reported, waits with its blocks (parked)
    /// until its siblings have reported too.
    pub fn hold(&mut self, id: SeqId) {
        if self.running.contains(&id) {
            self.running.retain(|&x| x != id);
            self.parked.push(id);
        }
    }

    /// Beam search: forks held beam `parent` as `child_id` (completion `index`), held too; it
    /// shares every block of the parent (copy on write).
    pub fn fork_held(&mut self, parent: SeqId, child_id: SeqId, index: usize) {
        let Some(seq) = self.seqs.get(&parent) else { return };
        let mut child = seq.fork(child_id, index, seq.rng.clone());
        child.block_table = self.block_manager.fork(&seq.block_table);
        self.seqs.insert(child_id, child);
        self.parked.push(child_id);
    }

    /// After a step: records computed tokens and registers newly full blocks in the prefix cache.
    pub fn mark_computed(&mut self, id: SeqId, n: usize) {
        let seed = self.config.hash_seed;
        let bs = self.block_manager.block_size();
        let Some(seq) = self.seqs.get_mut(&id) else { return };
        seq.num_computed_tokens += n;
        seq.update_block_hashes(seed, bs);
        let full = (seq.num_computed_tokens / bs).min(seq.block_hashes.len());
        self.block_manager.cache_blocks(&mut seq.block_table, &seq.block_hashes[..full]);
    }

    /// Removes a sequence from the queues without freeing its blocks (the caller takes its block
    /// table and must free it later).
    pub fn detach(&mut self, id: SeqId) -> Option<Sequence> {
        let seq = self.seqs.remove(&id)?;
        self.waiting.retain(|&x| x != id);
        self.running.retain(|&x| x != id);
        self.swapped.retain(|&x| x != id);
        self.parked.retain(|&x| x != id);
        Some(seq)
    }
}
