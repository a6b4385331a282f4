//! The backend seam: what the engine asks of a device (the CPU backend here, the CUDA one in
//! the `tandem-cuda` crate).
//!
//! A backend owns the model weights and the paged KV cache and runs one forward pass over a
//! flattened batch of tokens from many sequences ([`ForwardBatch`]), returning logits for the
//! rows asked for. Scheduling, block allocation and sampling live above this seam and never see
//! device memory; kernels live below it and never see requests.

pub mod cpu;
pub mod kv_groups;

use crate::model_files::config::ModelConfig;
pub use kv_groups::{first_visible_block, longest_sequence, page_read_from, KvGroups, NO_PAGE};

/// One sequence's part of a [`ForwardBatch`].
#[derive(Debug, Clone, PartialEq)]
pub struct SeqSlice {
    /// Index of the sequence's first token in the batch.
    pub query_start: usize,
    /// Number of tokens of this sequence in the batch (1 for a decode step).
    pub query_len: usize,
    /// Tokens of context after this step (cached prefix + this step's tokens).
    pub context_len: usize,
    /// The sequence's KV pages: entry `i * kv_groups + g` is logical block `i`'s page of KV
    /// group `g` ([`NO_PAGE`] where a local group gave it back).
    pub block_table: Vec<u32>,
}

/// Which of a sequence's batch rows return logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk that does not finish the prompt).
    None,
    /// The last token's (the next token is sampled from it). Entries far below the row's best
    /// may be approximate (the CPU backend's two-pass LM head), as they barely weigh in the
    /// distribution.
    Last,
    /// The last token's, every entry exact (its log-probs are reported, or a bias or grammar may
    /// pick an unlikely token: `SamplingParams::reads_far_logits`).
    LastExact,
    /// Every token's (teacher-forced scoring), each entry exact however unlikely its token:
    /// a prompt token's log-prob may lie far down the distribution.
    All,
}

/// A flattened batch of tokens for one forward pass (the varlen layout of seed 002).
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardBatch {
    /// Token ids, sequences one after another.
    pub token_ids: Vec<u32>,
    /// Position of each token in its sequence.
    pub positions: Vec<u32>,
    /// KV cache slots (`page * block_size + offset`) where each token's K and V are written:
    /// entry `token * kv_groups + g` for the layers of KV group `g`.
    pub slot_mapping: Vec<u32>,
    /// KV groups of the backend's cache ([`KvGroups`]): pages per logical block (1 by default).
    pub kv_groups: usize,
    /// The sequences, in batch order.
    pub seqs: Vec<SeqSlice>,
    /// Batch rows whose logits are returned, in this order.
    pub logits_indices: Vec<usize>,
    /// For each of `logits_indices`, whether every entry must be exact ([`Logits::All`],
    /// [`Logits::LastExact`]).
    pub logits_exact: Vec<bool>,
    /// `(token, row)`: token `token` of this batch is the one the launched, uncollected pass
    /// samples for its logits row `row` (its entry in `token_ids` is a placeholder). Only for
    /// [`ModelBackend::launch_sampled`] on a backend that [`ModelBackend::takes_deferred_tokens`].
    pub deferred: Vec<(u32, u32)>,
    /// Block-table buffers of the sequences of a batch [`ForwardBatch::recycle`] emptied, for
    /// the next sequences pushed.
    spare: SpareTables,
}

/// Emptied block-table buffers a recycled [`ForwardBatch`] keeps: not part of the batch's
/// value (two batches of the same sequences are equal whatever their spares).
#[derive(Debug, Clone, Default)]
struct SpareTables(Vec<Vec<u32>>);

impl PartialEq for SpareTables {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Default for ForwardBatch {
    /// An empty batch for a cache of one KV group.
    fn default() -> Self {
        ForwardBatch::with_kv_groups(1)
    }
}

impl ForwardBatch {
    /// Whether the batch asks for the logits of its first tokens, in order (its i-th logits
    /// row is token i's): every decode-only batch the runner builds does.
    pub fn logits_in_order(&self) -> bool {
        self.logits_indices.iter().enumerate().all(|(i, &r)| i == r)
    }

    /// What every backend checks of a batch's layout: laid out for its `groups` KV groups, a
    /// position for each token and a slot for each token and group, token ids below `vocab`.
    pub fn check_layout(&self, groups: usize, vocab: usize) -> Result<(), BackendError> {
        let bad = |m: String| Err(BackendError::InvalidBatch(m));
        let t = self.token_ids.len();
        if self.kv_groups != groups {
            return bad(format!(
                "batch laid out for {} KV groups, the cache has {groups}",
                self.kv_groups
            ));
        }
        if self.positions.len() != t || self.slot_mapping.len() != t * groups {
            return bad(format!(
                "{t} tokens but {} positions and {} slots ({groups} per token)",
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        if let Some(&tok) = self.token_ids.iter().find(|&&x| x as usize >= vocab) {
            return bad(format!("token id {tok} outside the vocabulary of {vocab}"));
        }
        if let Some(&(tok, _)) = self.deferred.iter().find(|&&(x, _)| x as usize >= t) {
            return bad(format!("deferred token {tok} outside the batch of {t} tokens"));
        }
        Ok(())
    }

    /// An empty batch for a cache of `kv_groups` groups.
    pub fn with_kv_groups(kv_groups: usize) -> Self {
        assert!(kv_groups > 0, "a KV cache has at least one group");
        ForwardBatch {
            token_ids: Vec::new(),
            positions: Vec::new(),
            slot_mapping: Vec::new(),
            kv_groups,
            seqs: Vec::new(),
            logits_indices: Vec::new(),
            logits_exact: Vec::new(),
            deferred: Vec::new(),
            spare: SpareTables::default(),
        }
    }

    /// Empties the batch for another step's, keeping every buffer (its sequences' block-table
    /// buffers go to the spares the next sequences pushed take), so that a runner building each
    /// step's batch in the last one's allocates nothing once batches have reached their size.
    pub fn recycle(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.logits_indices.clear();
        self.logits_exact.clear();
        self.deferred.clear();
        // Reversed, so that the next batch's i-th sequence takes this one's i-th buffer: in
        // consecutive steps mostly the same sequence, with a table as long or one block longer.
        let spare = &mut self.spare.0;
        spare.extend(self.seqs.drain(..).rev().map(|s| {
            let mut t = s.block_table;
            t.clear();
            t
        }));
    }

    /// Appends a sequence's tokens at positions `start_pos..`, with slots derived from its
    /// block table, asking for the `logits` rows named.
    pub fn push_seq(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        block_table: &[u32],
        block_size: usize,
        logits: Logits,
    ) {
        let n = tokens.len();
        self.push_tokens(tokens.iter().copied(), n, start_pos, block_table, block_size, logits);
    }

    /// [`ForwardBatch::push_seq`] of `tokens` and one token more: the one the launched,
    /// uncollected pass samples for its logits row `row` (a placeholder in `token_ids`, named in
    /// `deferred`).
    pub fn push_seq_deferred(
        &mut self,
        tokens: &[u32],
        row: u32,
        start_pos: usize,
        block_table: &[u32],
        block_size: usize,
        logits: Logits,
    ) {
        self.deferred.push(((self.num_tokens() + tokens.len()) as u32, row));
        let all = tokens.iter().copied().chain(std::iter::once(0));
        self.push_tokens(all, tokens.len() + 1, start_pos, block_table, block_size, logits);
    }

    /// Appends the `query_len` tokens of `tokens` as [`ForwardBatch::push_seq`] does.
    fn push_tokens(
        &mut self,
        tokens: impl Iterator<Item = u32>,
        query_len: usize,
        start_pos: usize,
        block_table: &[u32],
        block_size: usize,
        logits: Logits,
    ) {
        let query_start = self.token_ids.len();
        let groups = self.kv_groups;
        for (i, t) in tokens.enumerate() {
            let pos = start_pos + i;
            self.token_ids.push(t);
            self.positions.push(pos as u32);
            for g in 0..groups {
                let block =
                    block_table.get(pos / block_size * groups + g).copied().unwrap_or(NO_PAGE);
                self.slot_mapping.push(
                    block
                        .saturating_mul(block_size as u32)
                        .saturating_add((pos % block_size) as u32),
                );
            }
            if logits == Logits::All {
                self.logits_indices.push(query_start + i);
                self.logits_exact.push(true);
            }
        }
        if matches!(logits, Logits::Last | Logits::LastExact) && query_len > 0 {
            self.logits_indices.push(query_start + query_len - 1);
            self.logits_exact.push(logits == Logits::LastExact);
        }
        let mut table = self.spare.0.pop().unwrap_or_default();
        table.extend_from_slice(block_table);
        self.seqs.push(SeqSlice {
            query_start,
            query_len,
            context_len: start_pos + query_len,
            block_table: table,
        });
    }

    /// Number of tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}

pub use crate::sampling::sampler::RowSampling;

/// Shape of a backend's paged KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// Number of physical blocks.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one block's page as it travels (`read_block` / `write_block`): K and V of the
    /// layers of one KV group (all layers when the cache has a single group), in f32.
    pub bytes_per_block: usize,
    /// Bytes one block takes in the backend's own pool (its element type: IEEE half on the CPU
    /// fast path, the model's 16-bit type on CUDA, f32 on the CPU exact path).
    pub pool_bytes_per_block: usize,
}

/// Which CPU kernels run the linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelPath {
    /// Weights dequantised to f32, f32 accumulation: the reference every faster path is checked
    /// against.
    #[default]
    Exact,
    /// Q4_0/Q4_1/Q8_0 weights kept quantised, activations quantised to 8 bits per matmul, SIMD
    /// integer dot products (AVX-512 VNNI, AVX-VNNI or AVX2, chosen at run time).
    Fast,
}

/// A forward pass was refused or failed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BackendError {
    /// The batch is inconsistent (lengths disagree, a slot or block is out of range, ...).
    #[error("invalid forward batch: {0}")]
    InvalidBatch(String),
    /// The device failed (a driver, kernel or library error).
    #[error("device error: {0}")]
    Device(String),
}

/// A device that runs the model.
pub trait ModelBackend: Send {
    /// The model's hyper-parameters.
    fn config(&self) -> &ModelConfig;
    /// What runs the model, for status reports (e.g. `cpu: Avx512Vnni kernels, 2 threads`).
    fn device(&self) -> String;
    /// Shape of the KV cache this backend holds.
    fn kv_cache_spec(&self) -> KvCacheSpec;
    /// How layers share KV pages; a backend without sliding-window release keeps one group of
    /// every layer.
    fn kv_groups(&self) -> KvGroups {
        KvGroups::single(self.config().num_layers)
    }
    /// Runs one forward pass: writes each token's K/V into its slot, attends through the block
    /// tables, and returns `logits_indices.len() × vocab_size` logits, row-major.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, BackendError>;
    /// Takes back a buffer [`ModelBackend::forward`] returned, to return the next step's
    /// logits in: a batch's logits outgrow what the allocator keeps (32 MiB for a 262k
    /// vocabulary at 32 rows), so a fresh buffer is mapped and faulted in page by page each
    /// step. The default drops it.
    fn recycle_logits(&mut self, buf: Vec<f32>) {
        drop(buf);
    }
    /// Like [`ModelBackend::forward`] through the first `num_layers` layers only, then the
    /// final norm and the head: the model as its own early-exit draft (self-speculation). K/V of
    /// those layers are written into the batch's slots as a full pass would write them.
    fn forward_layers(
        &mut self,
        batch: &ForwardBatch,
        num_layers: usize,
    ) -> Result<Vec<f32>, BackendError> {
        let _ = (batch, num_layers);
        Err(BackendError::InvalidBatch("this backend has no early-exit forward".into()))
    }
    /// Whether [`ModelBackend::forward_sampled`] is implemented (the runner then samples plain
    /// requests where the logits are instead of copying every row to the host).
    fn samples_on_device(&self) -> bool {
        false
    }
    /// Like [`ModelBackend::forward`], then chooses one token per logits row as `rows` say
    /// (one entry per `batch.logits_indices`); returns each token with its log-probability under
    /// the model distribution. `masks` is called once the forward pass is under way (so the
    /// host computes them while the device runs) and returns nothing or one entry per row: a
    /// row's allowed tokens as bits (bit `i % 32` of word `i / 32`; structured outputs), the
    /// others set to minus infinity before sampling. Only the tokens leave the device.
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
        masks: &mut dyn FnMut() -> Vec<Option<Vec<u32>>>,
    ) -> Result<Vec<crate::sampling::sampler::TokenLogprob>, BackendError> {
        let _ = (batch, rows, masks);
        Err(BackendError::InvalidBatch("this backend does not sample on the device".into()))
    }
    /// Whether [`ModelBackend::launch_sampled`] returns once the pass is queued, before the
    /// device is done: the engine then does its host work (the previous step's outputs, the
    /// server's between-step jobs) while the device runs the step.
    fn overlaps_steps(&self) -> bool {
        false
    }
    /// Whether a second pass may be launched while one is uncollected, taking some of its
    /// token ids from the tokens the first samples ([`ForwardBatch::deferred`]): the engine
    /// then plans and launches step N+1 before step N's tokens reach the host (block moves
    /// between the two are queued after step N on the device).
    fn takes_deferred_tokens(&self) -> bool {
        false
    }
    /// Queues what [`ModelBackend::forward_sampled`] does for `batch` (no token masks) and
    /// returns without waiting for it; [`ModelBackend::collect_sampled`] then gives the
    /// tokens. One launch at a time — every launch is collected before the next call that
    /// touches the device — unless the backend [`ModelBackend::takes_deferred_tokens`]: then
    /// at most two, collected in launch order, and anything else on the device is queued
    /// after them.
    fn launch_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
    ) -> Result<(), BackendError> {
        let _ = (batch, rows);
        Err(BackendError::InvalidBatch("this backend does not overlap steps".into()))
    }
    /// Waits for the pass [`ModelBackend::launch_sampled`] queued and returns its tokens, one
    /// per row, as [`ModelBackend::forward_sampled`] would.
    fn collect_sampled(
        &mut self,
    ) -> Result<Vec<crate::sampling::sampler::TokenLogprob>, BackendError> {
        Err(BackendError::InvalidBatch("no pass was launched".into()))
    }
    /// The device's own time on the passes [`ModelBackend::launch_sampled`] queued and
    /// [`ModelBackend::collect_sampled`] collected so far, in seconds, where the backend times
    /// them (from the device reaching a pass to its tokens' copy; a gap while the host still
    /// queues the pass counts). Set against wall time it says whether steps wait for the
    /// device or for the host. `None`: not measured.
    fn device_seconds(&self) -> Option<f64> {
        None
    }
    /// The host's time launching passes so far, by part, in seconds (a diagnostic: where
    /// the launch phase of a step goes). Empty: not measured.
    fn host_seconds(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
    /// Copies whole blocks `(src, dst)` within the device pool (copy-on-write).
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError>;
    /// Copies device blocks to host swap blocks `(device, host)`.
    fn swap_out(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError>;
    /// Copies host swap blocks back to device blocks `(host, device)`.
    fn swap_in(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError>;
    /// Number of host swap blocks this backend holds.
    fn num_host_blocks(&self) -> usize;
    /// The KV page of one block: for each layer of the page (every layer, or a KV group's),
    /// K then V, each `block_size × kv_heads × head_dim` little-endian f32
    /// (`kv_cache_spec().bytes_per_block` bytes).
    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError>;
    /// Writes a KV page (as [`ModelBackend::read_block`] returns it) into `block`.
    fn write_block(&mut self, block: u32, page: &[u8]) -> Result<(), BackendError>;
    /// Overwrites `blocks` with zeros (secure mode).
    fn zero_blocks(&mut self, blocks: &[u32]) -> Result<(), BackendError> {
        if blocks.is_empty() {
            return Ok(());
        }
        let zeros = vec![0u8; self.kv_cache_spec().bytes_per_block];
        for &b in blocks {
            self.write_block(b, &zeros)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logits_in_order_only_when_the_first_tokens_ask_in_turn() {
        let table = [0u32, 1];
        let mut decode = ForwardBatch::with_kv_groups(1);
        decode.push_seq(&[5], 7, &table, 16, Logits::Last);
        decode.push_seq(&[6], 3, &table, 16, Logits::Last);
        assert!(decode.logits_in_order());
        // A prompt chunk's sampled row is its last token's, not row 0.
        let mut prompt = ForwardBatch::with_kv_groups(1);
        prompt.push_seq(&[1, 2, 3], 0, &table, 16, Logits::Last);
        assert_eq!(prompt.logits_indices, [2]);
        assert!(!prompt.logits_in_order());
        // A decode row before the prompt keeps row 0 in order, the prompt's row breaks it.
        decode.push_seq(&[1, 2, 3], 0, &table, 16, Logits::Last);
        assert!(!decode.logits_in_order());
    }

    /// Two steps' batches: a prompt chunk, a decode row, and a decode row whose token is still
    /// on the device (`deferred`), over two KV groups.
    fn fill(b: &mut ForwardBatch, step: u32) {
        b.push_seq(&[1, 2, 3], 0, &[4, 5], 2, Logits::Last);
        b.push_seq(&[7 + step], 9, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 2, Logits::LastExact);
        b.push_seq_deferred(&[], step, 5, &[11, 12, 13, 14, 15, 16], 2, Logits::Last);
    }

    #[test]
    fn a_recycled_batch_is_built_again_in_its_own_buffers() {
        let mut b = ForwardBatch::with_kv_groups(2);
        fill(&mut b, 0);
        // The deferred row: a placeholder token at the batch's end, named with its row.
        assert_eq!(b.token_ids, [1, 2, 3, 7, 0]);
        assert_eq!(b.deferred, [(4, 0)]);
        assert_eq!(b.seqs[2].query_len, 1);
        assert_eq!(b.seqs[2].context_len, 6);
        assert_eq!(&b.slot_mapping[8..], [2 * 15 + 1, 2 * 16 + 1]);
        let tables: Vec<*const u32> = b.seqs.iter().map(|s| s.block_table.as_ptr()).collect();
        let flat = b.token_ids.as_ptr();
        b.recycle();
        assert_eq!(b, ForwardBatch::with_kv_groups(2));
        fill(&mut b, 1);
        let mut fresh = ForwardBatch::with_kv_groups(2);
        fill(&mut fresh, 1);
        assert_eq!(b, fresh);
        // No buffer was given back and taken anew: the same token buffer, and each sequence's
        // block table in the buffer of the sequence in its place before.
        assert_eq!(b.token_ids.as_ptr(), flat);
        let again: Vec<*const u32> = b.seqs.iter().map(|s| s.block_table.as_ptr()).collect();
        assert_eq!(tables, again);
    }
}
