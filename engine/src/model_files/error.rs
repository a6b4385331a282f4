//! The engine's typed errors at its boundaries: loading a model, tokenizing, templating.

use crate::model_files::gguf::GgufError;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The GGUF container is unreadable, truncated, corrupt or holds an unsupported type.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A safetensors file is malformed.
    #[error("safetensors file {path}: {message}")]
    Safetensors {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The architecture named by the file is not implemented.
    #[error("unsupported model architecture '{0}' (supported: llama, qwen3)")]
    UnsupportedArchitecture(String),
    /// Hyper-parameters missing or inconsistent.
    #[error("invalid model configuration: {0}")]
    Config(String),
    /// A tensor the architecture needs is absent.
    #[error("model file lacks tensor '{0}'")]
    MissingTensor(String),
    /// A tensor has the wrong shape or an unusable type.
    #[error("tensor '{name}': {message}")]
    BadTensor {
        /// Tensor name in the file.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The tokenizer could not be built.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template does not compile.
    #[error(transparent)]
    Template(#[from] crate::model_files::chat_template::TemplateError),
    /// The path is neither a GGUF file nor a safetensors model directory.
    #[error("cannot tell the model format of {0}: expected a .gguf file or a directory with config.json and *.safetensors")]
    UnknownFormat(String),
    /// The device could not hold or run the model (no GPU, a driver or library error, too little
    /// memory).
    #[error("device: {0}")]
    Device(String),
}
