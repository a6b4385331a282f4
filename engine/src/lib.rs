//! Tandem's inference engine, in layers (each uses only those listed before it):
//!
//! - [`model_files`]: what a model is made of — GGUF and safetensors files, hyper-parameters,
//!   weight types, the tokenizer, incremental detokenization and the chat template.
//! - [`sampling`]: sampling parameters (one rule set for every entry point) and the host
//!   sampler.
//! - [`backend`]: the device seam ([`backend::ModelBackend`] runs a flattened, paged
//!   [`backend::ForwardBatch`]) and its CPU implementation; [`model`] loads files onto one.
//! - [`speculative`]: the pure parts of speculative decoding (acceptance rule, draft length)
//!   and the draft proposers.
//! - [`scheduling`]: seed 000's request state machine and seed 002's Scheduler → BlockManager
//!   core — sequences, continuous batching, paged KV blocks, the prefix cache — deciding and
//!   never running the model.
//! - [`llm_engine`]: `LLMEngine`, whose `step` is schedule → execute (ModelRunner) → sample →
//!   update, with speculative decoding, disaggregated prefill and offline generation on top.

pub mod backend;
pub mod llm_engine;
pub mod model;
pub mod model_files;
pub mod sampling;
pub mod scheduling;
pub mod speculative;

pub use llm_engine::generate::{beam_search_by_scoring, score, Generation};
pub use llm_engine::{EngineConfig, EngineError, LLMEngine, Prompt, RequestOptions};
pub use model::{KvCacheSize, LoadOptions, Model, ModelInfo};
pub use model_files::chat_template::{ChatMessage, ChatTemplate, TemplateError};
pub use model_files::config::{Arch, ModelConfig};
pub use model_files::error::LoadError;
pub use sampling::sampling_params::SamplingParams;
pub use scheduling::request_output::{CompletionOutput, Completions, FinishReason, RequestOutput};
