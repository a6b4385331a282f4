//! Disaggregated prefill on the decode side: a request whose prompt KV is computed by a prefill
//! worker. The engine reserves blocks for the prompt (reusing its own prefix-cache hits), the
//! transport writes the remote pages into them, and the request then continues from the first
//! token the prefill worker sampled. A failed transfer falls back to local prefill (`recompute`)
//! or aborts (`fail`); blocks are freed either way.

use crate::backend::page_read_from;
use crate::llm_engine::{now_secs, EngineError, LLMEngine, Prompt, RequestOptions};
use crate::sampling::sampler::SampledToken;
use crate::sampling::sampling_params::SamplingParams;
use crate::scheduling::scheduler::{SampledSeq, SchedulerOutput};

/// A finished prefill-only request's blocks, held until they are shipped.
#[derive(Debug)]
pub(crate) struct Pinned {
    pub(crate) table: crate::scheduling::block_manager::BlockTable,
    /// Its prompt's length: the decode worker's first step runs from there.
    pub(crate) prompt_len: usize,
}

/// Blocks reserved for a remote prefill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePrefill {
    /// Prompt token ids.
    pub prompt_token_ids: Vec<u32>,
    /// The sequence's pages, in logical order (each logical block's page of every KV group);
    /// page `i` goes into `block_table[i]`. Entries a sliding window has passed by the end of
    /// the prompt are [`crate::backend::NO_PAGE`]: no step here reads them, and the prefill
    /// worker does not ship them ([`LLMEngine::prefill_pages_to_ship`]); every other entry
    /// from `num_cached_pages` on holds a page to fill.
    pub block_table: Vec<u32>,
    /// Leading prompt tokens already in this engine's prefix cache (their pages need not be
    /// sent: a multiple of the block size).
    pub num_cached_tokens: usize,
    /// The leading entries of `block_table` those tokens fill (pages not to send).
    pub num_cached_pages: usize,
}

/// How far a prefill-only request has come: the pages that can be shipped while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillProgress {
    /// The request's blocks whose KV is complete (every token computed), in logical order.
    pub complete_blocks: Vec<u32>,
    /// Preemptions in this engine so far: when it changes while pages are shipped early, a
    /// preempted request may have moved to other blocks, so ship them again from its final ones.
    pub preemptions: u64,
}

impl LLMEngine {
    /// The progress of running prefill-only request `request_id` (`None` once it finished or
    /// if it is unknown).
    pub fn prefill_progress(&self, request_id: &str) -> Option<PrefillProgress> {
        let seq = self.scheduler.seqs.get(&self.single_seq(request_id)?)?;
        if !seq.prefill_only {
            return None;
        }
        let bm = &self.scheduler.block_manager;
        let full = (seq.num_computed_tokens / bm.block_size() * bm.num_groups())
            .min(seq.block_table.blocks.len());
        Some(PrefillProgress {
            complete_blocks: seq.block_table.blocks[..full].to_vec(),
            preemptions: self.scheduler.num_preemptions,
        })
    }

    /// The blocks of a finished prefill-only request (its pages, in logical order).
    pub fn prefill_blocks(&self, request_id: &str) -> Option<Vec<u32>> {
        self.pinned.get(request_id).map(|p| p.table.blocks.clone())
    }

    /// The pages of finished prefill-only request `request_id` that a decode worker reads, as
    /// `(logical index, block)` from entry `skip` on: every page but those a sliding window has
    /// passed by the end of the prompt, which the decode worker gave back as it reserved its
    /// own (`Scheduler::park`; both apply [`page_read_from`]).
    pub fn prefill_pages_to_ship(
        &self,
        request_id: &str,
        skip: usize,
    ) -> Option<Vec<(usize, u32)>> {
        let p = self.pinned.get(request_id)?;
        let windows = self.scheduler.block_manager.windows();
        let bs = self.scheduler.block_manager.block_size();
        Some(
            p.table
                .blocks
                .iter()
                .copied()
                .enumerate()
                .skip(skip)
                .filter(|&(i, _)| page_read_from(windows, i, p.prompt_len, bs))
                .collect(),
        )
    }

    /// Releases a prefill-only request's blocks once its pages were acknowledged (or the
    /// transfer failed). Full blocks stay in the prefix cache. Returns whether any were held.
    pub fn release_prefill(&mut self, request_id: &str) -> bool {
        match self.pinned.remove(request_id) {
            Some(mut p) => {
                self.scheduler.block_manager.free(&mut p.table);
                self.wipe_freed();
                true
            }
            None => false,
        }
    }

    fn single_seq(&self, request_id: &str) -> Option<u64> {
        let r = self.requests.get(request_id)?;
        (r.seq_ids.len() == 1).then(|| r.seq_ids[0])
    }

    /// Queues a request whose prompt KV will arrive from a prefill worker. Returns the blocks to
    /// fill, or `None` when the request is instead prefilled here (no free blocks, `n > 1`, prompt
    /// log-probabilities or beam search: its beams fork here).
    pub fn add_remote_prefill(
        &mut self,
        request_id: &str,
        prompt: Prompt,
        params: SamplingParams,
        opts: RequestOptions,
    ) -> Result<Option<RemotePrefill>, EngineError> {
        let local =
            params.n > 1 || params.prompt_logprobs.is_some() || params.beam_search.is_some();
        self.add_request_with(request_id, prompt, params, opts)?;
        let id = self.single_seq(request_id).expect("just added");
        if local {
            return Ok(None);
        }
        let Some(cached) = self.scheduler.park(id) else { return Ok(None) };
        let seq = self.scheduler.seqs.get_mut(&id).expect("just added");
        // Its prefill begins now, on the prefill worker.
        seq.metrics.first_scheduled_time = Some(now_secs());
        Ok(Some(RemotePrefill {
            prompt_token_ids: seq.token_ids.clone(),
            block_table: seq.block_table.blocks.clone(),
            num_cached_tokens: cached,
            num_cached_pages: cached / self.scheduler.block_manager.block_size()
                * self.scheduler.block_manager.num_groups(),
        }))
    }

    /// Writes a received KV page into one of this engine's blocks.
    pub fn write_kv_block(&mut self, block: u32, page: &[u8]) -> Result<(), EngineError> {
        Ok(self.runner.backend.write_block(block, page)?)
    }

    /// Reads the KV page of one of this engine's blocks.
    pub fn read_kv_block(&self, block: u32) -> Result<Vec<u8>, EngineError> {
        Ok(self.runner.backend.read_block(block)?)
    }

    /// Every page has arrived: the request continues from `first`, the token the prefill worker
    /// sampled (its news comes with the next `step`).
    pub fn finish_remote_prefill(
        &mut self,
        request_id: &str,
        first: SampledToken,
    ) -> Result<(), EngineError> {
        let id = self.single_seq(request_id).ok_or_else(|| {
            EngineError::InvalidRequest(format!("unknown request '{request_id}'"))
        })?;
        let now = now_secs();
        {
            let seq = self.scheduler.seqs.get_mut(&id).expect("request's sequence exists");
            if first.chosen.token_id as usize >= self.model_config.vocab_size {
                return Err(EngineError::InvalidRequest(format!(
                    "first token {} is outside the vocabulary",
                    first.chosen.token_id
                )));
            }
            seq.metrics.first_scheduled_time.get_or_insert(now);
            seq.metrics.first_token_time = Some(now);
            seq.metrics.remote_prefill = true;
            // The prefill worker drew once from this request's random stream.
            if !seq.params.is_greedy() {
                seq.rng.next_f64();
            }
        }
        if !self.scheduler.unpark_running(id) {
            return Err(EngineError::InvalidRequest(format!(
                "request '{request_id}' is not waiting for KV"
            )));
        }
        let n = self.scheduler.seqs[&id].len() - self.scheduler.seqs[&id].num_computed_tokens;
        self.scheduler.mark_computed(id, n);
        let first = SampledSeq::one(id, first);
        let plan = SchedulerOutput::default();
        let update = self.scheduler.update_from_output(&plan, vec![first], &self.tokenizer, now)?;
        let mut ended = update.finished;
        let out = self.request_output(request_id.to_string(), &mut ended, false);
        self.pending.extend(out);
        self.wipe_freed();
        Ok(())
    }

    /// The transfer failed: with `recompute` the request is prefilled here instead, otherwise it
    /// is aborted. Its blocks are freed either way. Returns whether the request was waiting.
    pub fn fail_remote_prefill(&mut self, request_id: &str, recompute: bool) -> bool {
        let Some(id) = self.single_seq(request_id) else { return false };
        if recompute {
            let waiting = self.scheduler.unpark_waiting(id);
            self.wipe_freed();
            waiting
        } else {
            self.abort_request(request_id)
        }
    }
}
