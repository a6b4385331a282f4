//! `LLMEngine`: seed 000's engine API — `add_request`, `abort_request`, `step`,
//! `has_unfinished_requests`, `get_num_unfinished_requests` — over the Scheduler → BlockManager
//! → ModelRunner flow of seed 002.

mod api;
mod beam_search;
mod counters;
pub mod generate;
pub mod model_runner;
mod overlap;
pub mod remote_prefill;
mod sample_step;
mod spec_decoder;
pub mod step_trace;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::backend::longest_sequence;
use crate::llm_engine::model_runner::{DeviceMasks, ModelRunner};
use crate::model::Model;
use crate::model_files::tokenizer::Tokenizer;
use crate::sampling::sampler::{Rng, SampledToken};
use crate::sampling::sampling_params::SamplingParams;
use crate::sampling::structured::{GrammarCompiler, StructuredError};
use crate::scheduling::block_hash::salt_digest;
use crate::scheduling::block_manager::BlockManager;
use crate::scheduling::request_output::{
    CompletionOutput, Completions, FinishReason, RequestMetrics, RequestOutput,
};
use crate::scheduling::scheduler::{SampledSeq, Scheduler, SchedulerOutput, StepUpdate};
use crate::scheduling::sequence::{SeqId, SeqMap, Sequence, SequenceStatus};
use crate::ModelConfig;
use spec_decoder::SpecDecoder;

pub use api::{EngineConfig, EngineError, EngineStats, PhaseSeconds, Prompt, RequestOptions};

struct RequestState {
    seq_ids: Vec<SeqId>,
    prompt: Arc<Vec<u32>>,
    n: usize,
    finished: usize,
    /// The prompt's log-probabilities so far (when asked for), until they are sent.
    prompt_logprobs: Option<Vec<SampledToken>>,
    /// Beam search's state (`seq_ids` are then the live beams).
    beam: Option<beam_search::BeamState>,
}

/// The engine: model, scheduler and runner.
pub struct LLMEngine {
    /// Model hyper-parameters.
    pub model_config: ModelConfig,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template.
    pub chat_template: Option<crate::ChatTemplate>,
    runner: ModelRunner,
    scheduler: Scheduler,
    /// Unfinished requests by id (foldhash: each step looks up every request it touched).
    requests: HashMap<String, RequestState, foldhash::fast::RandomState>,
    pending: Vec<RequestOutput>,
    next_seq_id: SeqId,
    next_arrival: u64,
    max_model_len: usize,
    /// The longest prompt a prefill-only request may have: all its pages are held at once.
    max_prefill_only_len: usize,
    /// Blocks of finished prefill-only requests, held until released.
    pinned: HashMap<String, remote_prefill::Pinned>,
    stats: EngineStats,
    last_schedule: SchedulerOutput,
    /// Speculative decoding, when configured.
    spec: Option<SpecDecoder>,
    /// Compiles structured-output constraints (built on the first request that has one).
    grammars: Option<Arc<GrammarCompiler>>,
    /// Whether steps may overlap ([`EngineConfig::overlap_steps`]).
    overlap_steps: bool,
    /// Whether a step is planned before the one in flight is collected
    /// ([`EngineConfig::async_scheduling`]).
    async_scheduling: bool,
    /// The step launched on the device and not yet collected: the sequences it samples (its
    /// plan is `last_schedule`).
    in_flight: Option<Vec<SeqId>>,
    /// A failure of the step in flight met outside `step` (it is returned by the next one).
    deferred_error: Option<EngineError>,
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn child_rng(seed: Option<u64>, index: usize, fallback: u64) -> Rng {
    match seed {
        Some(s) => Rng::new(s ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        None => Rng::new(fallback ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)),
    }
}

impl LLMEngine {
    /// An engine over a loaded model.
    pub fn new(model: Model, config: EngineConfig) -> Self {
        let spec = model.backend.kv_cache_spec();
        let host = model.backend.num_host_blocks();
        let mut bm =
            BlockManager::new(spec.num_blocks, spec.block_size, host, config.enable_prefix_caching);
        bm.set_zero_freed(config.zero_freed_blocks);
        let windows = model.backend.kv_groups().windows;
        bm.set_kv_groups(windows.clone());
        // A sequence that runs here gives its passed local pages back as it goes; a prefill
        // worker's keeps every page of its prompt until they are shipped.
        let max_pos = model.config.max_position_embeddings;
        let step_tokens = config.scheduler.max_num_batched_tokens;
        let max_model_len =
            max_pos.min(longest_sequence(&windows, spec.num_blocks, spec.block_size, step_tokens));
        let max_prefill_only_len = max_pos.min(spec.num_blocks / bm.num_groups() * spec.block_size);
        let mut sched_cfg = config.scheduler;
        sched_cfg.max_model_len = max_model_len;
        // Streaming detokenization's byte table is built and checked now, not on the engine
        // thread during the first request.
        let _ = model.tokenizer.pieces();
        LLMEngine {
            model_config: model.config,
            tokenizer: model.tokenizer,
            chat_template: model.chat_template,
            runner: ModelRunner::new(model.backend),
            scheduler: Scheduler::new(sched_cfg, bm),
            requests: HashMap::default(),
            pending: Vec::new(),
            next_seq_id: 0,
            next_arrival: 0,
            max_model_len,
            max_prefill_only_len,
            pinned: HashMap::new(),
            stats: EngineStats::default(),
            last_schedule: SchedulerOutput::default(),
            spec: config.speculative.map(SpecDecoder::new),
            grammars: None,
            overlap_steps: config.overlap_steps,
            async_scheduling: config.overlap_steps && config.async_scheduling,
            in_flight: None,
            deferred_error: None,
        }
    }

    /// The constraint compiler for this model's vocabulary (built once).
    pub fn grammar_compiler(&mut self) -> Result<Arc<GrammarCompiler>, StructuredError> {
        if let Some(g) = &self.grammars {
            return Ok(g.clone());
        }
        let g = Arc::new(GrammarCompiler::new(&self.tokenizer, self.model_config.vocab_size)?);
        self.grammars = Some(g.clone());
        Ok(g)
    }

    /// Uses `draft` (a model with the same vocabulary, loaded with a KV pool of at least this
    /// engine's blocks of the same size) to propose speculative drafts. Its K/V live in the same
    /// block ids as the target's, so it needs no block manager of its own; a sequence's draft
    /// K/V are rebuilt whenever its blocks change (preemption).
    pub fn set_draft_model(&mut self, draft: Model) -> Result<(), EngineError> {
        let spec = draft.backend.kv_cache_spec();
        let mine = self.runner.backend.kv_cache_spec();
        if draft.config.vocab_size != self.model_config.vocab_size {
            return Err(EngineError::InvalidRequest(format!(
                "the draft model's vocabulary ({}) differs from the model's ({})",
                draft.config.vocab_size, self.model_config.vocab_size
            )));
        }
        let groups = self.runner.backend.kv_groups();
        if groups.releases() || draft.backend.kv_groups() != groups {
            return Err(EngineError::InvalidRequest(
                "a draft model with its own KV needs the model's pages kept whole (it would read \
                 pages a sliding window gave back): use --speculative self-draft or ngram, or \
                 --disable-hybrid-kv-cache-manager"
                    .into(),
            ));
        }
        if spec.block_size != mine.block_size || spec.num_blocks < mine.num_blocks {
            return Err(EngineError::InvalidRequest(format!(
                "the draft model's KV pool ({} blocks of {}) must cover the model's ({} blocks of {})",
                spec.num_blocks, spec.block_size, mine.num_blocks, mine.block_size
            )));
        }
        let Some(decoder) = self.spec.as_mut() else {
            return Err(EngineError::InvalidRequest(
                "a draft model needs speculative decoding on (EngineConfig::speculative)".into(),
            ));
        };
        let relative_cost = crate::speculative::proposer::macs_per_token(&draft.config)
            / crate::speculative::proposer::macs_per_token(&self.model_config);
        decoder.set_proposer(Box::new(crate::speculative::proposer::DraftModel {
            backend: draft.backend,
            relative_cost,
        }));
        Ok(())
    }

    /// What runs the model ([`ModelBackend::device`]).
    pub fn device(&self) -> String {
        self.runner.backend.device()
    }

    /// Longest context (prompt + output) a request may reach.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// The longest prompt (with its first token) of a prefill-only request: a prefill worker
    /// keeps every page of it until they are shipped, so its sliding-window layers give none
    /// back. Equals [`LLMEngine::max_model_len`] for a model without them.
    pub fn max_prefill_only_len(&self) -> usize {
        self.max_prefill_only_len
    }

    /// Queues a request.
    pub fn add_request(
        &mut self,
        request_id: &str,
        prompt: Prompt,
        params: SamplingParams,
        arrival_time: Option<f64>,
    ) -> Result<(), EngineError> {
        self.add_request_with(
            request_id,
            prompt,
            params,
            RequestOptions { arrival_time, ..Default::default() },
        )
    }

    /// Queues a request with priority and cache salt.
    pub fn add_request_with(
        &mut self,
        request_id: &str,
        prompt: Prompt,
        mut params: SamplingParams,
        opts: RequestOptions,
    ) -> Result<(), EngineError> {
        // A model loaded without a tokenizer serves token ids only.
        params.detokenize &= !self.tokenizer.is_ids_only();
        params.validate(self.model_config.vocab_size)?;
        if opts.prefill_only && (params.n > 1 || params.beam_search.is_some()) {
            return Err(EngineError::InvalidRequest(
                "a prefill-only request has one sampled completion (n = 1, no beam search)".into(),
            ));
        }
        let max_seqs = self.scheduler.config.max_num_seqs;
        if params.n > max_seqs {
            return Err(EngineError::InvalidRequest(format!(
                "n is {}, but this server runs at most {max_seqs} sequences at once",
                params.n
            )));
        }
        if self.requests.contains_key(request_id) || self.pinned.contains_key(request_id) {
            return Err(EngineError::DuplicateRequestId(request_id.to_string()));
        }
        let ids = match prompt {
            Prompt::Text(t) => self.tokenizer.encode(&t, true)?,
            Prompt::TokenIds(ids) => ids,
        };
        if ids.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.model_config.vocab_size) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.model_config.vocab_size
            )));
        }
        if opts.prefill_only && ids.len() > self.max_prefill_only_len {
            return Err(EngineError::InvalidRequest(format!(
                "a prefill worker holds every KV page of a prompt until it is shipped: at most \
                 {} prompt tokens fit this one's pool; the request has {}",
                self.max_prefill_only_len,
                ids.len()
            )));
        }
        if ids.len() + params.max_tokens > self.max_model_len {
            return Err(EngineError::InvalidRequest(format!(
                "this model's maximum context length is {} tokens; the request has {} prompt tokens and asks for {} more",
                self.max_model_len,
                ids.len(),
                params.max_tokens
            )));
        }
        let beam = match &params.beam_search {
            Some(b) => {
                let bm = &self.scheduler.block_manager;
                let bs = bm.block_size();
                let need = beam_search::blocks_needed(params.n, ids.len(), params.max_tokens, bs);
                if need > bm.num_blocks() {
                    return Err(EngineError::InvalidRequest(format!(
                        "a beam search of width {} over {} prompt and {} new tokens can hold up to {need} KV blocks; this server has {}",
                        params.n,
                        ids.len(),
                        params.max_tokens,
                        bm.num_blocks()
                    )));
                }
                let eos = if params.ignore_eos {
                    Vec::new()
                } else {
                    self.tokenizer.eos_token_ids.clone()
                };
                Some(beam_search::BeamState::new(b.length_penalty, eos))
            }
            None => None,
        };
        let grammar = match &params.structured {
            Some(c) => Some(self.grammar_compiler()?.compile(c)?),
            None => None,
        };
        let arrival = opts.arrival_time.unwrap_or_else(now_secs);
        let params = Arc::new(params);
        let prompt = Arc::new(ids.clone());
        let id = self.next_seq_id;
        self.next_seq_id += 1;
        let fallback = now_secs().to_bits() ^ id;
        let metrics = RequestMetrics { arrival_time: arrival, ..Default::default() };
        let mut seq = Sequence::new(
            id,
            request_id.to_string(),
            ids,
            params.clone(),
            child_rng(params.seed, 0, fallback),
            metrics,
        );
        seq.priority = opts.priority;
        seq.arrival_seq = self.next_arrival;
        self.next_arrival += 1;
        seq.salt = opts.cache_salt.as_deref().map(salt_digest).unwrap_or(0);
        seq.group = salt_digest(opts.group.as_deref().unwrap_or(request_id));
        if params.prompt_logprobs.is_some() {
            // Every prompt token needs its logits row: no block may come from the prefix cache.
            seq.salt = salt_digest(&format!("\0prompt_logprobs\0{request_id}\0{id}"));
        }
        seq.prefill_only = opts.prefill_only;
        seq.grammar = grammar;
        if self.spec.is_some() {
            // Drafts are not checked against a constraint: constrained requests do not speculate.
            let may = !opts.no_speculation
                && !opts.prefill_only
                && params.n == 1
                && params.beam_search.is_none()
                && params.structured.is_none();
            seq.spec = SpecDecoder::start(may);
        }
        self.scheduler.add(seq);
        self.requests.insert(
            request_id.to_string(),
            RequestState {
                seq_ids: vec![id],
                prompt,
                n: params.n,
                finished: 0,
                prompt_logprobs: params.prompt_logprobs.map(|_| Vec::new()),
                beam,
            },
        );
        Ok(())
    }

    /// Aborts a request in any state, freeing everything it holds. Its final output (finish
    /// reason `abort`) comes with the next `step`. Returns whether the request was known.
    pub fn abort_request(&mut self, request_id: &str) -> bool {
        // A request already done (a server aborts every stream it drops, finished or not)
        // leaves the step in flight running: collecting it here would stall the device until
        // the next step is planned and launched.
        if !self.requests.contains_key(request_id) {
            return false;
        }
        // The step in flight may sample the request's sequences: its tokens first.
        self.settle();
        let Some(req) = self.requests.get(request_id) else { return false };
        let mut ended = Vec::new();
        for &id in &req.seq_ids {
            if let Some(mut seq) = self.scheduler.remove(id) {
                if !seq.status.is_finished() {
                    seq.finish(FinishReason::Abort, None);
                }
                ended.push(seq);
            }
        }
        let out = self.request_output(request_id.to_string(), &mut ended, true);
        self.pending.extend(out);
        self.wipe_freed();
        true
    }

    /// The news of request `request_id` since it was last reported: the deltas of its live
    /// sequences and of `ended` (those of its sequences that just left the scheduler). The
    /// request is done, and forgotten, once all its completions ended (or with `abort`).
    /// `None` when nothing changed.
    fn request_output(
        &mut self,
        request_id: String,
        ended: &mut [Sequence],
        abort: bool,
    ) -> Option<RequestOutput> {
        let req = self.requests.get_mut(request_id.as_str())?;
        let mut outputs = Completions::with_capacity(req.seq_ids.len());
        let mut metrics = RequestMetrics::default();
        for id in &req.seq_ids {
            let seq = match ended.iter_mut().find(|s| s.seq_id == *id) {
                Some(s) => {
                    req.finished += 1;
                    s
                }
                None => match self.scheduler.seqs.get_mut(id) {
                    Some(s) => s,
                    None => continue,
                },
            };
            metrics = seq.metrics;
            outputs.extend(seq.take_delta());
        }
        let done = abort || (req.finished >= req.n && req.seq_ids.len() >= req.n);
        if done {
            metrics.finished_time = Some(now_secs());
        }
        let prompt_token_ids = req.prompt.clone();
        // The prompt's log-probabilities go with its first token.
        let prompt_logprobs = match &req.prompt_logprobs {
            Some(lps) if !outputs.is_empty() && lps.len() + 1 >= prompt_token_ids.len() => {
                req.prompt_logprobs.take()
            }
            _ => None,
        };
        if done {
            self.requests.remove(request_id.as_str());
        }
        if outputs.is_empty() && !done {
            return None;
        }
        outputs.sort_by_key(|o| o.index);
        Some(RequestOutput {
            request_id,
            prompt_token_ids,
            outputs,
            finished: done,
            metrics,
            prompt_logprobs,
        })
    }

    /// Secure mode: zeroes the blocks freed since the last wipe. Every public method that can
    /// free blocks ends with it, so no freed block is handed out again unwiped (blocks freed
    /// inside `schedule` are zeroed by the runner, after the swap-out copies).
    fn wipe_freed(&mut self) {
        let blocks = self.scheduler.block_manager.take_blocks_to_zero();
        if let Err(e) = self.runner.backend.zero_blocks(&blocks) {
            tracing::error!("zeroing freed KV blocks failed: {e}");
        }
    }

    /// States of a request's sequences, when the request is unfinished.
    pub fn request_status(&self, request_id: &str) -> Option<Vec<SequenceStatus>> {
        let req = self.requests.get(request_id)?;
        Some(
            req.seq_ids
                .iter()
                .filter_map(|id| self.scheduler.seqs.get(id).map(|s| s.status))
                .collect(),
        )
    }

    /// Whether any request is unfinished.
    pub fn has_unfinished_requests(&self) -> bool {
        !self.requests.is_empty() || self.in_flight.is_some()
    }

    /// Whether the next step may run the model: some sequence waits, runs or is swapped out
    /// (not only ones parked for remote KV).
    pub fn has_model_work(&self) -> bool {
        self.scheduler.has_runnable() || self.in_flight.is_some()
    }

    /// Number of unfinished requests.
    pub fn get_num_unfinished_requests(&self) -> usize {
        self.requests.len()
    }

    /// The plan of the last step (for tests and metrics).
    pub fn last_schedule(&self) -> &SchedulerOutput {
        &self.last_schedule
    }

    /// The block manager (KV usage, free blocks).
    pub fn block_manager(&self) -> &BlockManager {
        &self.scheduler.block_manager
    }

    /// Shape of the backend's KV cache (pages, their size).
    pub fn kv_cache_spec(&self) -> crate::backend::KvCacheSpec {
        self.runner.backend.kv_cache_spec()
    }

    /// How the backend's KV pages group the model's layers.
    pub fn kv_groups(&self) -> crate::backend::KvGroups {
        self.runner.backend.kv_groups()
    }

    /// Waiting, running and swapped sequence counts.
    pub fn queue_lengths(&self) -> (usize, usize, usize) {
        self.scheduler.queue_lengths()
    }

    /// Starts recording KV cache events (see [`crate::scheduling::block_manager::KvEvent`]).
    pub fn enable_kv_events(&mut self) {
        self.scheduler.block_manager.enable_kv_events();
    }

    /// KV cache events since the last call.
    pub fn take_kv_events(&mut self) -> Vec<crate::scheduling::block_manager::KvEvent> {
        self.scheduler.block_manager.take_kv_events()
    }

    /// The block table and computed-token count of a running single-completion request (for
    /// tests and debugging of the KV cache).
    pub fn request_blocks(&self, request_id: &str) -> Option<(Vec<u32>, usize)> {
        let r = self.requests.get(request_id)?;
        let seq = self.scheduler.seqs.get(r.seq_ids.first()?)?;
        Some((seq.block_table.blocks.clone(), seq.num_computed_tokens))
    }

    /// The block tables of an unfinished request's live sequences (its completions, or its
    /// live beams), in completion order (for tests of block sharing).
    pub fn request_tables(&self, request_id: &str) -> Option<Vec<Vec<u32>>> {
        let r = self.requests.get(request_id)?;
        let mut seqs: Vec<_> =
            r.seq_ids.iter().filter_map(|id| self.scheduler.seqs.get(id)).collect();
        seqs.sort_by_key(|s| s.index);
        Some(seqs.iter().map(|s| s.block_table.blocks.clone()).collect())
    }

    /// Whether outputs are waiting for the next [`LLMEngine::step`] (e.g. after an abort or a
    /// remote prefill's first token), even with no request left to run.
    pub fn has_pending_outputs(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes the outputs made between steps, without running one: a server hands a remote
    /// prefill's first token to its client at once instead of after the next forward pass.
    /// (The next [`LLMEngine::step`] would otherwise return them first.)
    pub fn take_pending_outputs(&mut self) -> Vec<RequestOutput> {
        std::mem::take(&mut self.pending)
    }

    /// Prompt tokens not yet computed, over every waiting and running sequence (the prefill
    /// work queued on this engine).
    pub fn queued_prefill_tokens(&self) -> usize {
        self.scheduler
            .seqs
            .values()
            .filter(|s| !s.status.is_finished())
            .map(|s| s.prompt_len.saturating_sub(s.num_computed_tokens))
            .sum()
    }

    /// Checks block ownership invariants (for tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut tables: Vec<_> = self.scheduler.seqs.values().map(|s| &s.block_table).collect();
        tables.extend(self.pinned.values().map(|p| &p.table));
        let hosts: Vec<_> = self.scheduler.seqs.values().map(|s| &s.host_blocks).collect();
        self.scheduler.block_manager.check_invariants(&tables, &hosts)
    }

    /// Runs one scheduler iteration and returns the news of every request that changed:
    /// schedule (with speculative drafts), execute, sample, update (seed 002's flow).
    ///
    /// On a backend that overlaps steps, a step whose tokens are all chosen on the device is
    /// launched and left running: this call returns the news of the step before it (collected
    /// at its start), and the next call collects this one. The caller's work between calls —
    /// sending the news, taking new requests — then runs while the device computes.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        self.step_with(&mut |_| {})
    }

    pub(super) fn step_hooked(
        &mut self,
        hook: &mut Option<&mut dyn FnMut(&LLMEngine)>,
    ) -> Result<Vec<RequestOutput>, EngineError> {
        if let Some(e) = self.deferred_error.take() {
            return Err(e);
        }
        let (done, plan) = match self.plan_step(hook)? {
            overlap::PlannedStep::Launched(outputs) => return Ok(outputs),
            overlap::PlannedStep::ToRun(update, plan) => (update, *plan),
        };
        let mut clock = std::time::Instant::now();
        let mut lap = |phase: &mut f64| {
            let now = std::time::Instant::now();
            *phase += now.duration_since(clock).as_secs_f64();
            clock = now;
        };
        if self.overlap_steps && self.spec.is_none() {
            let launching = std::time::Instant::now();
            if let Some(sampled) = self.runner.launch(&plan, &self.scheduler.seqs, &[])? {
                self.stats.phase_seconds.launch += launching.elapsed().as_secs_f64();
                lap(&mut self.stats.phase_seconds.forward);
                self.last_schedule = plan;
                self.in_flight = Some(sampled);
                self.run_hook(hook);
                let outputs = match done {
                    Some(update) => self.outputs(update),
                    None => std::mem::take(&mut self.pending),
                };
                lap(&mut self.stats.phase_seconds.outputs);
                return Ok(outputs);
            }
        }
        if let Some(update) = done {
            // Its news goes first, with this step's.
            self.pending = self.outputs(update);
            lap(&mut self.stats.phase_seconds.outputs);
        }
        self.run_hook(hook);
        let mut grammars = self.step_grammars(&plan);
        let rows = self.runner.execute(&plan, &self.scheduler.seqs, &mut grammars);
        grammars.restore(&mut self.scheduler.seqs);
        let rows = rows?;
        let sampled = self.sample(rows);
        self.feed_grammars(&sampled);
        lap(&mut self.stats.phase_seconds.forward);
        let update =
            self.scheduler.update_from_output(&plan, sampled, &self.tokenizer, now_secs())?;
        lap(&mut self.stats.phase_seconds.update);
        let mut outputs = self.outputs(update);
        outputs.extend(self.advance_beams());
        self.wipe_freed();
        self.last_schedule = plan;
        lap(&mut self.stats.phase_seconds.outputs);
        Ok(outputs)
    }

    /// Moves the matchers of the step's constrained sequences past their new tokens, in
    /// parallel (each takes tens of microseconds; `Sequence::append_token` then finds its token
    /// already taken). Sequences that fork this step are left to `append_token`: their
    /// completions start from the state before the token.
    fn feed_grammars(&mut self, sampled: &[SampledSeq]) {
        if sampled.len() < 2 || !self.scheduler.seqs.values().any(|s| s.grammar.is_some()) {
            return; // the common step: nothing constrained, no map of the step's tokens
        }
        let due: HashMap<SeqId, u32> = sampled
            .iter()
            .filter(|s| s.forks.is_empty() && s.tokens.len() == 1)
            .map(|s| (s.seq_id, s.tokens[0].chosen.token_id))
            .collect();
        let mut rows: Vec<(&mut crate::sampling::structured::GrammarMatcher, u32)> = self
            .scheduler
            .seqs
            .iter_mut()
            .filter_map(|(id, seq)| Some((seq.grammar.as_mut()?, *due.get(id)?)))
            .collect();
        if rows.len() < 2 {
            return;
        }
        use rayon::prelude::*;
        rows.par_iter_mut().for_each(|(g, t)| g.accept_ahead(*t));
    }

    /// On a backend that samples on the device: the matchers of the constrained sequences this
    /// step samples, taken out of their sequences for the runner to compute their masks while
    /// the device runs the forward pass ([`StepGrammars::restore`] puts them back).
    fn step_grammars(&mut self, plan: &SchedulerOutput) -> StepGrammars {
        let mut g = StepGrammars::default();
        if !self.runner.backend.samples_on_device() {
            return g;
        }
        for s in &plan.scheduled {
            let Some(seq) = self.scheduler.seqs.get_mut(&s.seq_id) else { continue };
            if seq.num_computed_tokens + s.num_tokens == seq.len() {
                if let Some(m) = seq.grammar.take() {
                    g.rows.push((s.seq_id, m));
                }
            }
        }
        g
    }

    /// Plans the step: proposes drafts, schedules, then fits (and, from a draft model, fills)
    /// the drafts of the sequences scheduled.
    fn schedule(&mut self) -> Result<SchedulerOutput, EngineError> {
        let Some(spec) = self.spec.as_mut() else {
            return Ok(self.scheduler.schedule(now_secs()));
        };
        spec.propose(&mut self.scheduler, self.model_config.num_layers, self.max_model_len);
        let plan = self.scheduler.schedule(now_secs());
        spec.fit(&plan, &mut self.scheduler);
        let eos = &self.tokenizer.eos_token_ids;
        spec.draft(&plan, &mut self.scheduler, &mut *self.runner.backend, eos)?;
        Ok(plan)
    }

    /// After the update: counts the step and collects the news of every request it changed
    /// (pinning the blocks of finished prefill-only requests until their pages ship).
    fn outputs(&mut self, mut update: StepUpdate) -> Vec<RequestOutput> {
        self.stats.prefill_tokens_computed += update.prefill_tokens;
        self.stats.generation_tokens += update.generation_tokens;
        for &(proposed, accepted) in &update.verified {
            self.stats.spec_drafts += 1;
            self.stats.spec_draft_tokens += proposed as u64;
            self.stats.spec_accepted_tokens += accepted as u64;
            for i in 0..accepted {
                self.stats.spec_accepted_per_position[i.min(7)] += 1;
            }
        }
        for seq in &mut update.finished {
            if seq.prefill_only {
                let table = std::mem::take(&mut seq.block_table);
                let pinned = remote_prefill::Pinned { table, prompt_len: seq.prompt_len };
                self.pinned.insert(seq.request_id.clone(), pinned);
            }
        }
        let mut results = std::mem::take(&mut self.pending);
        // Each changed request once, in the order of its first changed sequence (only requests
        // of several sequences can come twice: the others skip the set).
        let mut touched: Vec<String> = Vec::with_capacity(update.updated.len());
        let mut seen: HashSet<&str> = HashSet::new();
        for id in &update.updated {
            let seq = match self.scheduler.seqs.get(id) {
                Some(s) => s,
                None => match update.finished.iter().find(|s| s.seq_id == *id) {
                    Some(s) => s,
                    None => continue,
                },
            };
            let several = seq.params.n > 1 || seq.params.beam_search.is_some();
            if !several || seen.insert(&seq.request_id) {
                touched.push(seq.request_id.clone());
            }
        }
        drop(seen);
        for rid in touched {
            results.extend(self.request_output(rid, &mut update.finished, false));
        }
        results
    }

    /// Runs requests to completion (the offline path): returns, per request id, the
    /// accumulated completions in index order.
    pub fn run_to_completion(
        &mut self,
    ) -> Result<HashMap<String, Vec<CompletionOutput>>, EngineError> {
        let mut acc: HashMap<String, Vec<CompletionOutput>> = HashMap::new();
        while self.has_unfinished_requests() || !self.pending.is_empty() {
            for out in self.step()? {
                let entry = acc.entry(out.request_id.clone()).or_default();
                for o in out.outputs {
                    match entry.iter_mut().find(|e| e.index == o.index) {
                        Some(e) => {
                            e.text.push_str(&o.text);
                            e.token_ids.extend(o.token_ids);
                            e.logprobs.extend(o.logprobs);
                            e.cumulative_logprob = o.cumulative_logprob;
                            if o.finish_reason.is_some() {
                                e.finish_reason = o.finish_reason;
                                e.stop_reason = o.stop_reason;
                            }
                        }
                        None => entry.push(o),
                    }
                }
                entry.sort_by_key(|e| e.index);
            }
        }
        Ok(acc)
    }
}

/// A step's constrained sequences' matchers, lent to the runner (see
/// [`LLMEngine::step_grammars`]).
#[derive(Default)]
struct StepGrammars {
    rows: Vec<(SeqId, crate::sampling::structured::GrammarMatcher)>,
}

impl StepGrammars {
    /// Gives every matcher back to its sequence.
    fn restore(self, seqs: &mut SeqMap) {
        for (id, m) in self.rows {
            if let Some(seq) = seqs.get_mut(&id) {
                seq.grammar = Some(m);
            }
        }
    }
}

impl DeviceMasks for StepGrammars {
    fn covers(&self, id: SeqId) -> bool {
        self.rows.iter().any(|(i, _)| *i == id)
    }

    fn compute(&mut self) -> HashMap<SeqId, Vec<u32>> {
        // One row's mask takes tens to hundreds of microseconds: the rows in parallel.
        use rayon::prelude::*;
        self.rows.par_iter_mut().map(|(id, g)| (*id, g.allowed_bits())).collect()
    }
}
