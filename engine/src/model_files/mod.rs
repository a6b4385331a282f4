//! What a model is made of, read from its files: the GGUF container and safetensors weights,
//! hyper-parameters, weight types and their dequantisation, the tokenizer with incremental
//! detokenization, the chat template, and fetching the default model.

pub mod chat_template;
pub mod config;
pub mod detokenizer;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod model_fetch;
pub mod spm;
pub mod tokenizer;
pub mod weights;
