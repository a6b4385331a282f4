//! The engine's request and configuration types: what a caller passes in, what it gets back
//! when a request is refused, and the engine's counters.

use crate::backend::BackendError;
use crate::model_files::tokenizer::TokenizeError;
use crate::sampling::structured::StructuredError;
use crate::scheduling::scheduler::SchedulerConfig;

/// A prompt as text or as token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, tokenized by the engine.
    Text(String),
    /// Token ids.
    TokenIds(Vec<u32>),
}

/// Per-request options beyond sampling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestOptions {
    /// Arrival time (seconds since the Unix epoch); now when absent.
    pub arrival_time: Option<f64>,
    /// Scheduling priority (lower is served first) under the priority policy.
    pub priority: i32,
    /// Prefix-cache salt: requests with different salts never share cached blocks.
    pub cache_salt: Option<String>,
    /// Prefill only (a prefill worker's request): stop after the first token and keep the
    /// prompt's blocks until [`super::LLMEngine::release_prefill`], so their KV pages can be shipped.
    pub prefill_only: bool,
    /// Opt this request out of speculative decoding.
    pub no_speculation: bool,
    /// The client request this one is part of (a completions request with several prompts is
    /// several engine requests): groups share the running set fairly. None: its own group.
    pub group: Option<String>,
}

/// Engine configuration.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Scheduler limits and policies.
    pub scheduler: SchedulerConfig,
    /// Share full blocks between requests through the prefix cache.
    pub enable_prefix_caching: bool,
    /// Speculative decoding (n-gram proposals), when set.
    pub speculative: Option<crate::speculative::spec_decode::SpeculativeConfig>,
    /// Secure mode: zero every KV block when its last user lets go (no prefix reuse after).
    pub zero_freed_blocks: bool,
    /// On a backend that overlaps steps ([`crate::backend::ModelBackend::overlaps_steps`]):
    /// return a step's news while the device runs the next step, so the host's work between
    /// steps does not idle the device.
    pub overlap_steps: bool,
    /// With overlapping steps, on a backend that takes deferred tokens
    /// ([`crate::backend::ModelBackend::takes_deferred_tokens`]): plan and launch step N+1
    /// before step N's tokens reach the host (vLLM's async scheduling), so the device does not
    /// wait for the host to apply them and schedule. Each row's token is the one a waiting step
    /// would choose; under memory pressure preemption may fall at other steps (a sequence that
    /// EOS or a stop string ends at step N holds its blocks while N+1 is planned).
    pub async_scheduling: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            scheduler: SchedulerConfig::default(),
            enable_prefix_caching: true,
            speculative: None,
            zero_freed_blocks: false,
            overlap_steps: true,
            async_scheduling: true,
        }
    }
}

/// A request was refused or a step failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid (the message is fit for an API error).
    #[error("{0}")]
    InvalidRequest(String),
    /// A sampling parameter breaks its rule.
    #[error(transparent)]
    InvalidParam(#[from] crate::sampling::sampling_params::ParamError),
    /// A request with this id is already running.
    #[error("request id '{0}' is already in use")]
    DuplicateRequestId(String),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Tokenization failed.
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    /// The structured-output constraint cannot be used.
    #[error("invalid structured output constraint: {0}")]
    Structured(#[from] StructuredError),
}

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Steps run.
    pub steps: u64,
    /// Prompt (and recomputed) tokens whose KV was computed.
    pub prefill_tokens_computed: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Preemptions.
    pub num_preemptions: u64,
    /// Prompt blocks looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Of those, hits.
    pub prefix_cache_hits: u64,
    /// Speculative verification steps (one per sequence that proposed drafts).
    pub spec_drafts: u64,
    /// Draft tokens proposed.
    pub spec_draft_tokens: u64,
    /// Draft tokens accepted.
    pub spec_accepted_tokens: u64,
    /// Accepted drafts by position in the draft (0 = first proposed token); the last entry
    /// counts every later position.
    pub spec_accepted_per_position: [u64; 8],
    /// Wall time of the steps' phases, in seconds: where a step's time goes on the host.
    pub phase_seconds: PhaseSeconds,
}

/// Wall time spent in each phase of [`LLMEngine::step`](crate::LLMEngine::step), summed over
/// steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseSeconds {
    /// Scheduling (and speculative drafting).
    pub schedule: f64,
    /// The forward pass and sampling: building the batch, the device's work and the wait for
    /// its tokens.
    pub forward: f64,
    /// Appending the sampled tokens to their sequences: detokenizing, stop checks, freeing the
    /// blocks of finished sequences.
    pub update: f64,
    /// Building each changed request's output.
    pub outputs: f64,
    /// Of `forward`, on a backend that overlaps steps: building and queueing the passes (the
    /// rest is the wait for the device's tokens).
    pub launch: f64,
    /// The device's own time on the steps' passes where the backend times it
    /// ([`ModelBackend::device_seconds`](crate::backend::ModelBackend::device_seconds); 0 where
    /// it does not): not a host phase, it runs beside the others.
    pub device: f64,
}

impl PhaseSeconds {
    /// `self − base`, phase by phase.
    pub fn since(&self, base: &PhaseSeconds) -> PhaseSeconds {
        PhaseSeconds {
            schedule: self.schedule - base.schedule,
            forward: self.forward - base.forward,
            update: self.update - base.update,
            outputs: self.outputs - base.outputs,
            launch: self.launch - base.launch,
            device: self.device - base.device,
        }
    }
}
