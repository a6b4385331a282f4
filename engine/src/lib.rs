//! Tandem's inference engine: model files (GGUF, safetensors), tokenizer and chat templates,
//! the backend seam with its CPU implementation, sampling, and generation.
//!
//! The request path of seed 002 — Scheduler → BlockManager → ModelRunner — is built on the
//! pieces here: [`backend::ForwardBatch`] is the flattened, paged batch a model runner hands to a
//! [`backend::ModelBackend`].

pub mod backend;
pub mod block_hash;
pub mod block_manager;
pub mod chat_template;
pub mod config;
pub mod detokenizer;
pub mod dtype;
mod error;
pub mod generate;
pub mod gguf;
pub mod llm_engine;
pub mod model;
pub mod model_fetch;
pub mod model_runner;
pub mod proposer;
pub mod remote_prefill;
pub mod request_output;
pub mod sampler;
pub mod sampling_params;
pub mod scheduler;
pub mod sequence;
pub mod spec_decode;
pub mod tokenizer;
pub mod weights;

pub use chat_template::{ChatMessage, ChatTemplate, TemplateError};
pub use config::{Arch, ModelConfig};
pub use error::LoadError;
pub use generate::{score, Generation};
pub use llm_engine::{EngineConfig, EngineError, LLMEngine, Prompt, RequestOptions};
pub use model::{KvCacheSize, LoadOptions, Model, ModelInfo};
pub use request_output::{CompletionOutput, FinishReason, RequestOutput};
pub use sampling_params::SamplingParams;
