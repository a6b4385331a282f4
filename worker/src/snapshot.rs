//! `Snapshot`: what the engine thread publishes after every step for readers that must not wait
//! for it (health, status, metrics).

use tandem_engine::llm_engine::EngineStats;

/// A point-in-time view of the engine, refreshed after every step (read without waiting for
/// the engine thread).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Snapshot {
    /// Sequences waiting for their first schedule (or recompute).
    pub waiting: usize,
    /// Sequences running.
    pub running: usize,
    /// Sequences swapped to host memory.
    pub swapped: usize,
    /// KV blocks in the pool.
    pub num_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks free or evictable.
    pub free_blocks: usize,
    /// Prompt tokens not yet computed.
    pub queued_prefill_tokens: usize,
    /// Counters since start.
    pub stats: EngineStats,
    /// Whether the last step failed.
    pub failed: bool,
    /// Sequence number of the last KV event handed to the publisher.
    pub event_seq: u64,
}
