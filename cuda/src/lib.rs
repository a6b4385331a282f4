//! Tandem's CUDA backend: the engine's [`tandem_engine::backend::ModelBackend`] on an NVIDIA
//! GPU through `cudarc` — bf16 (or f16) weights, cuBLAS GEMMs with f32 accumulation, kernels compiled at
//! run time by NVRTC for the device's architecture, a paged 16-bit KV cache sized from free GPU
//! memory, and CUDA graphs for decode steps.
//!
//! Nothing CUDA is needed to build this crate: the driver, NVRTC and cuBLAS are loaded when a
//! [`Gpu`] is opened, and their absence is an error, not a crash.

pub mod backend;
pub mod bench;
pub mod check;
pub mod device;
pub mod e2e;
pub mod gemm_tune;
pub mod nccl;
pub mod plan;
pub mod tensor_parallel;
pub mod weights;
pub mod windows;

use std::path::Path;

pub use backend::{CudaBackend, CudaBackendOptions};
pub use device::{Dtype, Gpu};
pub use tensor_parallel::TpBackend;
pub use weights::DeviceWeights;

use tandem_engine::model_files::config::ModelConfig;
use tandem_engine::model_files::weights::ModelFiles;
use tandem_engine::LoadError;

/// What can go wrong on the GPU.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library is missing.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// A kernel did not compile.
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    /// A cuBLAS call failed.
    #[error("cuBLAS: {0}")]
    Blas(String),
    /// The model does not fit.
    #[error("out of GPU memory: {0}")]
    OutOfMemory(String),
    /// The model's shape is outside what the kernels support.
    #[error("unsupported on the CUDA backend: {0}")]
    Unsupported(String),
    /// The model files are unusable.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A peer did not do its part of a transfer in time.
    #[error("stalled: {0}")]
    Stalled(String),
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> CudaError {
        CudaError::Driver(format!("{e:?}"))
    }
}

impl From<CudaError> for LoadError {
    fn from(e: CudaError) -> LoadError {
        match e {
            CudaError::Load(l) => l,
            other => LoadError::Device(other.to_string()),
        }
    }
}

/// Where a model's weights come from.
#[derive(Clone, Copy)]
pub enum WeightSource<'a> {
    /// A GGUF file or safetensors directory.
    Files(&'a ModelFiles),
    /// Random values of the configuration's shape, from this seed.
    Dummy(u32),
}

/// Opens GPU `ordinal` and loads a model on it in `dtype`.
pub fn load(
    ordinal: usize,
    dtype: Dtype,
    cfg: &ModelConfig,
    weights: WeightSource<'_>,
    opts: CudaBackendOptions,
) -> Result<CudaBackend, CudaError> {
    let gpu = Gpu::open(ordinal, dtype)?;
    let w = match weights {
        WeightSource::Files(f) => DeviceWeights::load(&gpu, f, cfg)?,
        WeightSource::Dummy(seed) => DeviceWeights::dummy(&gpu, cfg, seed)?,
    };
    CudaBackend::new(gpu, cfg, w, opts)
}

/// Reads a model configuration for the dummy load format: a Hugging Face `config.json`.
pub fn dummy_config(path: &Path) -> Result<ModelConfig, LoadError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| LoadError::Io { path: path.display().to_string(), source })?;
    ModelConfig::from_hf_json(&text)
}
