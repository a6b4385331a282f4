//! Engine flags shared by every command that runs the engine (`generate`, `bench engine`, and
//! the workers): KV cache budget, block size, swap space, scheduler limits and policies.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use tandem_engine::backend::KernelPath;
use tandem_engine::scheduling::scheduler::{PreemptionMode, SchedulerConfig, SchedulingPolicy};
use tandem_engine::{EngineConfig, KvCacheSize, LoadOptions};

/// How preempted sequences release memory.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PreemptionArg {
    /// Free blocks and recompute later.
    Recompute,
    /// Copy blocks to host memory.
    Swap,
}

/// Scheduling policy.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PolicyArg {
    /// First come, first served.
    Fcfs,
    /// Lowest priority value first.
    Priority,
}

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend on the first visible NVIDIA GPU.
    Cuda,
}

/// 16-bit type of weights and activations on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// f16 for GGUF files (their scales are f16), bf16 otherwise.
    Auto,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

/// Where the weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadFormatArg {
    /// The model's files (GGUF or safetensors with their tokenizer).
    Auto,
    /// Random weights of the shape a Hugging Face `config.json` gives as `--model` (GPU
    /// benchmarks without a download); no tokenizer: prompts are token ids, outputs are not
    /// detokenized.
    Dummy,
}

/// CPU kernels of the linear layers.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum KernelArg {
    /// Quantised weights and activations, SIMD integer dot products.
    Fast,
    /// f32 weights and accumulation (the reference).
    Exact,
}

impl KernelArg {
    /// The engine's kernel path.
    pub fn path(self) -> KernelPath {
        match self {
            KernelArg::Fast => KernelPath::Fast,
            KernelArg::Exact => KernelPath::Exact,
        }
    }
}

/// Engine configuration flags.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Where the model runs: `cpu`, or `cuda` (the GPU `--cuda-device` names).
    #[arg(long, value_enum, env = "TANDEM_DEVICE", default_value = "cpu")]
    pub device: DeviceArg,
    /// Which GPU `--device cuda` uses, counted among those CUDA_VISIBLE_DEVICES shows.
    #[arg(long, env = "TANDEM_CUDA_DEVICE", default_value_t = 0)]
    pub cuda_device: usize,
    /// GPUs one model is split across (tensor parallelism, `--device cuda`): GPUs
    /// `--cuda-device` onwards, each holding its share of the heads, the MLP and every KV
    /// block, one process driving them all.
    #[arg(long, env = "TANDEM_TENSOR_PARALLEL_SIZE", default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// GPU weights and activations: `auto` (f16 for GGUF, bf16 otherwise), `bf16` or `f16`.
    #[arg(long, value_enum, default_value = "auto")]
    pub dtype: DtypeArg,
    /// `auto` (the model's files) or `dummy` (random weights for the configuration file given
    /// as the model; `--device cuda` only).
    #[arg(long, value_enum, default_value = "auto")]
    pub load_format: LoadFormatArg,
    /// Fraction of the GPU's memory this process may use for weights, activations and the KV
    /// cache (the KV pool gets what is left; `--kv-cache-memory` sets it instead).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// CPU kernels: `fast` (quantised) or `exact` (f32 reference).
    #[arg(long, value_enum, default_value = "fast")]
    pub kernel: KernelArg,
    /// KV cache memory budget, e.g. `512MiB`, `2GiB` or a byte count.
    #[arg(long, value_name = "SIZE")]
    pub kv_cache_memory: Option<String>,
    /// KV cache budget as a fraction of the memory available after loading weights.
    #[arg(long, value_name = "F", conflicts_with = "kv_cache_memory")]
    pub kv_cache_fraction: Option<f64>,
    /// Tokens per KV block.
    #[arg(long, env = "TANDEM_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: usize,
    /// Host memory for swapped-out KV blocks, e.g. `256MiB`.
    #[arg(long, value_name = "SIZE", default_value = "256MiB")]
    pub swap_space: String,
    /// Keep every layer's KV for the whole context: sliding-window layers (Gemma 3, Mistral)
    /// then share pages with the global ones and nothing is given back as the window passes.
    #[arg(long)]
    pub disable_hybrid_kv_cache_manager: bool,
    /// Token budget of one engine step [default: 512 on CPU, 8192 with `--device cuda`].
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Most sequences running at once [default: 64 on CPU, 256 with `--device cuda`].
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// How preempted sequences release memory.
    #[arg(long, value_enum, default_value = "recompute")]
    pub preemption_mode: PreemptionArg,
    /// Scheduling policy.
    #[arg(long, value_enum, default_value = "fcfs")]
    pub scheduling_policy: PolicyArg,
    /// Do not share prompt blocks between requests.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Secure mode: zero every KV block as soon as no request holds it (cached prefixes are
    /// then shared only between requests running at the same time).
    #[arg(long, env = "TANDEM_ZERO_FREED_BLOCKS")]
    pub zero_freed_blocks: bool,
    /// Wait for each step's tokens before returning its news (by default, on a GPU, a step's
    /// news is built and sent while the device runs the next step).
    #[arg(long)]
    pub no_step_overlap: bool,
    /// Collect each step's tokens before planning the next (by default, on a GPU, step N+1 is
    /// planned and launched while step N runs, reading N's tokens on the device).
    #[arg(long)]
    pub no_async_scheduling: bool,
    /// Process prompts whole instead of in chunks.
    #[arg(long)]
    pub no_chunked_prefill: bool,
    /// Speculative decoding: `ngram` proposes the continuation of the last n-gram's earlier
    /// occurrence (prompt lookup), verified in one forward pass.
    #[arg(long, value_enum, default_value = "none")]
    pub speculative: SpecArg,
    /// Most draft tokens per step (adapted per sequence to its acceptance).
    #[arg(long, default_value_t = 4)]
    pub num_speculative_tokens: usize,
    /// Longest n-gram the n-gram proposer matches.
    #[arg(long, default_value_t = 4)]
    pub ngram_max: usize,
    /// Shortest n-gram the n-gram proposer matches.
    #[arg(long, default_value_t = 2)]
    pub ngram_min: usize,
    /// Layers of the self-speculative draft (`--speculative self-draft`): the model's first N
    /// layers and its head.
    #[arg(long, default_value_t = 8)]
    pub draft_layers: usize,
    /// The draft model of `--speculative draft-model` (same vocabulary; loaded on the fast
    /// kernels with a KV pool mirroring the model's).
    #[arg(long)]
    pub draft_model: Option<std::path::PathBuf>,
}

/// Speculative decoding method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SpecArg {
    /// Off.
    None,
    /// Prompt lookup (n-gram).
    Ngram,
    /// The model's own first layers as the draft (no second model).
    SelfDraft,
    /// A separate, smaller model with the same vocabulary (`--draft-model PATH`).
    DraftModel,
}

/// The command-line spelling of a value-enum flag.
trait ValueEnumName {
    fn name(&self) -> String;
}

impl<T: ValueEnum> ValueEnumName for T {
    fn name(&self) -> String {
        self.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
    }
}

/// Parses `512MiB`, `2GiB`, `1.5GB`, `4096` (bytes).
pub fn parse_size(s: &str) -> Result<u64> {
    tandem_worker::models::parse_size(s).map_err(anyhow::Error::msg)
}

impl EngineArgs {
    /// These flags as command-line arguments (to start a worker process with them).
    pub fn to_args(&self) -> Vec<String> {
        let name = |v: &dyn ValueEnumName| v.name();
        let mut a = vec![
            format!("--device={}", name(&self.device)),
            format!("--dtype={}", name(&self.dtype)),
            format!("--gpu-memory-utilization={}", self.gpu_memory_utilization),
            format!("--kernel={}", name(&self.kernel)),
            format!("--block-size={}", self.block_size),
            format!("--swap-space={}", self.swap_space),
            format!("--cuda-device={}", self.cuda_device),
            format!("--tensor-parallel-size={}", self.tensor_parallel_size),
            format!("--load-format={}", name(&self.load_format)),
            format!("--preemption-mode={}", name(&self.preemption_mode)),
            format!("--scheduling-policy={}", name(&self.scheduling_policy)),
        ];
        // Unset, the worker takes its device's default, as this process would.
        if let Some(n) = self.max_num_batched_tokens {
            a.push(format!("--max-num-batched-tokens={n}"));
        }
        if let Some(n) = self.max_num_seqs {
            a.push(format!("--max-num-seqs={n}"));
        }
        if let Some(m) = &self.kv_cache_memory {
            a.push(format!("--kv-cache-memory={m}"));
        }
        if let Some(f) = self.kv_cache_fraction {
            a.push(format!("--kv-cache-fraction={f}"));
        }
        if self.zero_freed_blocks {
            a.push("--zero-freed-blocks".into());
        }
        if self.no_prefix_caching {
            a.push("--no-prefix-caching".into());
        }
        if self.no_step_overlap {
            a.push("--no-step-overlap".into());
        }
        if self.no_async_scheduling {
            a.push("--no-async-scheduling".into());
        }
        if self.no_chunked_prefill {
            a.push("--no-chunked-prefill".into());
        }
        if self.disable_hybrid_kv_cache_manager {
            a.push("--disable-hybrid-kv-cache-manager".into());
        }
        if self.speculative != SpecArg::None {
            a.push(format!("--speculative={}", name(&self.speculative)));
            a.push(format!("--num-speculative-tokens={}", self.num_speculative_tokens));
            a.push(format!("--ngram-max={}", self.ngram_max));
            a.push(format!("--ngram-min={}", self.ngram_min));
            a.push(format!("--draft-layers={}", self.draft_layers));
            if let Some(p) = &self.draft_model {
                a.push(format!("--draft-model={}", p.display()));
            }
        }
        a
    }

    /// The engine over `model` with these flags, and the draft model when one is asked for.
    pub fn build_engine(&self, model: tandem_engine::Model) -> Result<tandem_engine::LLMEngine> {
        let spec = model.backend.kv_cache_spec();
        let mut engine = tandem_engine::LLMEngine::new(model, self.engine_config());
        if self.speculative == SpecArg::DraftModel {
            let path = self.draft_model.as_ref().ok_or_else(|| {
                anyhow::anyhow!("--speculative draft-model needs --draft-model PATH")
            })?;
            let opts = LoadOptions {
                kernel: KernelPath::Fast,
                block_size: spec.block_size,
                kv_cache: KvCacheSize::Tokens(spec.num_blocks * spec.block_size),
                swap_space_bytes: 0,
                hybrid_kv: true,
            };
            let draft = tandem_engine::Model::load(path, opts)
                .map_err(|e| anyhow::anyhow!("loading the draft model {}: {e}", path.display()))?;
            engine.set_draft_model(draft)?;
        }
        Ok(engine)
    }

    /// Model loading options from these flags.
    pub fn load_options(&self) -> Result<LoadOptions> {
        let kv_cache = match (&self.kv_cache_memory, self.kv_cache_fraction) {
            (Some(m), _) => KvCacheSize::Bytes(parse_size(m)?),
            (None, Some(f)) => KvCacheSize::Fraction(f),
            (None, None) => LoadOptions::default().kv_cache,
        };
        if self.block_size == 0 || self.block_size > 1024 {
            bail!("--block-size must be between 1 and 1024");
        }
        Ok(LoadOptions {
            kernel: self.kernel.path(),
            kv_cache,
            block_size: self.block_size,
            swap_space_bytes: parse_size(&self.swap_space)?,
            hybrid_kv: !self.disable_hybrid_kv_cache_manager,
        })
    }

    /// Loads the model at `path` on the device these flags name.
    pub fn load_model(&self, path: &std::path::Path) -> Result<tandem_engine::Model> {
        Ok(self.load_model_with_device(path)?.0)
    }

    /// [`EngineArgs::load_model`], with the GPU's KV pool as an endpoint of the device
    /// transport when the model is on a GPU.
    pub fn load_model_with_device(
        &self,
        path: &std::path::Path,
    ) -> Result<(tandem_engine::Model, Option<tandem_worker::kv::KvDevice>)> {
        let opts = self.load_options()?;
        if self.tensor_parallel_size == 0 {
            bail!("--tensor-parallel-size must be at least 1");
        }
        if self.tensor_parallel_size > 1 && self.device != DeviceArg::Cuda {
            bail!("--tensor-parallel-size {} needs --device cuda (the CPU backend runs a model in one process on one host's cores)", self.tensor_parallel_size);
        }
        match (self.device, self.load_format) {
            (DeviceArg::Cpu, LoadFormatArg::Auto) => {
                Ok((tandem_engine::Model::load(path, opts)?, None))
            }
            (DeviceArg::Cpu, LoadFormatArg::Dummy) => {
                bail!("--load-format dummy needs --device cuda")
            }
            (DeviceArg::Cuda, _) => self.load_cuda(path, opts),
        }
    }

    /// The CUDA backend: weights in the chosen 16-bit type, the KV pool from
    /// `--kv-cache-memory` or what `--gpu-memory-utilization` leaves, decode graphs captured
    /// for batch sizes up to `--max-num-seqs` before serving.
    fn load_cuda(
        &self,
        path: &std::path::Path,
        opts: LoadOptions,
    ) -> Result<(tandem_engine::Model, Option<tandem_worker::kv::KvDevice>)> {
        use tandem_cuda::{Dtype, WeightSource};
        if !tandem_cuda::device::driver_present() {
            bail!("--device cuda: CUDA is not available on this machine (libcuda, the NVIDIA driver, cannot be loaded)");
        }
        if self.load_format == LoadFormatArg::Dummy {
            // A GGUF file (its tensors may be left out: scripts/gpu/gguf_metadata_only.py) gives
            // the shape, the tokenizer and the chat template; a config.json the shape alone
            // (token ids only).
            let (config, tokenizer, chat_template) =
                if path.extension().is_some_and(|e| e == "gguf") {
                    let info = tandem_engine::ModelInfo::open(path)?;
                    (info.config, info.tokenizer, info.chat_template)
                } else {
                    let ids = tandem_engine::model_files::tokenizer::Tokenizer::ids_only();
                    (tandem_cuda::dummy_config(path)?, ids, None)
                };
            let dtype = if self.dtype == DtypeArg::F16 { Dtype::F16 } else { Dtype::Bf16 };
            let (backend, device) =
                self.cuda_backend(&config, dtype, WeightSource::Dummy(0), &opts)?;
            return Ok((
                tandem_engine::Model { config, tokenizer, chat_template, backend },
                device,
            ));
        }
        let info = tandem_engine::ModelInfo::open(path)?;
        let (files, _) = tandem_engine::model_files::weights::ModelFiles::open(path)?;
        let gguf = matches!(files, tandem_engine::model_files::weights::ModelFiles::Gguf(_));
        let dtype = match (self.dtype, gguf) {
            (DtypeArg::Bf16, _) | (DtypeArg::Auto, false) => Dtype::Bf16,
            (DtypeArg::F16, _) | (DtypeArg::Auto, true) => Dtype::F16,
        };
        let (backend, device) =
            self.cuda_backend(&info.config, dtype, WeightSource::Files(&files), &opts)?;
        Ok((
            tandem_engine::Model {
                config: info.config,
                tokenizer: info.tokenizer,
                chat_template: info.chat_template,
                backend,
            },
            device,
        ))
    }

    /// The CUDA backend for `config` with the KV pool and graphs these flags ask for (split
    /// across `--tensor-parallel-size` GPUs), and its KV pool as an endpoint of the device
    /// transport — on one GPU only: a group's pages leave and enter through the host in the
    /// whole model's layout, which re-shards them by KV head for a peer of another size.
    fn cuda_backend(
        &self,
        config: &tandem_engine::ModelConfig,
        dtype: tandem_cuda::Dtype,
        weights: tandem_cuda::WeightSource<'_>,
        opts: &LoadOptions,
    ) -> Result<(Box<dyn tandem_engine::backend::ModelBackend>, Option<tandem_worker::kv::KvDevice>)>
    {
        use tandem_cuda::{CudaBackend, CudaBackendOptions};
        let tp = self.tensor_parallel_size.max(1);
        // A block's bytes on each GPU of the group.
        // Tensor-parallel ranks keep every layer in one page (no KV groups).
        let hybrid = opts.hybrid_kv && tp == 1;
        let per_block =
            CudaBackend::kv_bytes_per_block(config, opts.block_size, hybrid) as u64 / tp as u64;
        let num_blocks = match (self.kv_cache_memory.is_some(), opts.kv_cache) {
            (true, KvCacheSize::Bytes(b)) => Some((b / per_block) as usize),
            _ => None,
        };
        let copts = CudaBackendOptions {
            block_size: opts.block_size,
            num_blocks,
            gpu_memory_utilization: self.gpu_memory_utilization,
            num_host_blocks: (opts.swap_space_bytes / per_block) as usize,
            max_num_batched_tokens: self.max_num_batched_tokens().max(1),
            max_model_len: config.max_position_embeddings,
            max_graph_batch: self.max_num_seqs().clamp(1, 512),
            hybrid_kv: hybrid,
            ..Default::default()
        };
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("capturing decode graphs {bar:30} {pos}/{len}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let progress = |done: usize, total: usize| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        };
        let (backend, device, seconds): (Box<dyn tandem_engine::backend::ModelBackend>, _, _) =
            if tp == 1 {
                let mut b = tandem_cuda::load(self.cuda_device, dtype, config, weights, copts)?;
                b.capture_all(progress)?;
                let d = tandem_worker::kv::KvDevice(std::sync::Arc::new(b.device_pool()));
                let s = b.capture_seconds;
                (Box::new(b), Some(d), s)
            } else {
                let mut g = tandem_cuda::TpBackend::load(
                    self.cuda_device,
                    tp,
                    dtype,
                    config,
                    weights,
                    copts,
                )?;
                g.capture_all(progress)?;
                let s = g.capture_seconds();
                (Box::new(g), None, s)
            };
        bar.finish_and_clear();
        tracing::info!(device = %backend.device(), dtype = dtype.name(), kv_blocks = backend.kv_cache_spec().num_blocks, graph_seconds = seconds, "model on the GPU");
        Ok((backend, device))
    }

    /// The step's token budget: `--max-num-batched-tokens`, else the device's default (a GPU
    /// step of a few thousand tokens costs about what one of 512 does; a CPU step's time grows
    /// with its tokens, and decode streams wait for it).
    pub fn max_num_batched_tokens(&self) -> usize {
        self.max_num_batched_tokens.unwrap_or(match self.device {
            DeviceArg::Cpu => 512,
            DeviceArg::Cuda => 8192,
        })
    }

    /// The most sequences running at once: `--max-num-seqs`, else the device's default.
    pub fn max_num_seqs(&self) -> usize {
        self.max_num_seqs.unwrap_or(match self.device {
            DeviceArg::Cpu => 64,
            DeviceArg::Cuda => 256,
        })
    }

    /// Engine configuration from these flags.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            scheduler: SchedulerConfig {
                max_num_batched_tokens: self.max_num_batched_tokens().max(1),
                max_num_seqs: self.max_num_seqs().max(1),
                preemption_mode: match self.preemption_mode {
                    PreemptionArg::Recompute => PreemptionMode::Recompute,
                    PreemptionArg::Swap => PreemptionMode::Swap,
                },
                policy: match self.scheduling_policy {
                    PolicyArg::Fcfs => SchedulingPolicy::Fcfs,
                    PolicyArg::Priority => SchedulingPolicy::Priority,
                },
                enable_chunked_prefill: !self.no_chunked_prefill,
                ..Default::default()
            },
            enable_prefix_caching: !self.no_prefix_caching,
            speculative: (self.speculative != SpecArg::None && self.num_speculative_tokens > 0)
                .then(|| tandem_engine::speculative::spec_decode::SpeculativeConfig {
                    draft_layers: (self.speculative == SpecArg::SelfDraft)
                        .then_some(self.draft_layers.max(1)),
                    num_tokens: self.num_speculative_tokens.min(16),
                    ngram_max: self.ngram_max.max(1),
                    ngram_min: self.ngram_min.clamp(1, self.ngram_max.max(1)),
                    ..Default::default()
                }),
            zero_freed_blocks: self.zero_freed_blocks,
            overlap_steps: !self.no_step_overlap,
            async_scheduling: !self.no_async_scheduling,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parser itself is tested where it lives (`tandem_worker::models`); here, that its
    /// errors come through.
    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert!(parse_size("12 parsecs").unwrap_err().to_string().contains("parsecs"));
    }

    #[derive(clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        e: EngineArgs,
    }

    #[test]
    fn flags_round_trip() {
        use clap::Parser;
        let argv = [
            "x",
            "--kernel",
            "exact",
            "--block-size",
            "32",
            "--kv-cache-memory",
            "64MiB",
            "--preemption-mode",
            "swap",
            "--no-prefix-caching",
            "--speculative",
            "ngram",
            "--num-speculative-tokens",
            "3",
        ];
        let w = Wrap::parse_from(argv);
        let again = Wrap::parse_from(std::iter::once("x".to_string()).chain(w.e.to_args()));
        assert_eq!(format!("{:?}", w.e), format!("{:?}", again.e));
        assert!(again.e.no_prefix_caching && again.e.block_size == 32);
        let w = Wrap::parse_from([
            "x",
            "--device",
            "cuda",
            "--dtype",
            "f16",
            "--gpu-memory-utilization",
            "0.5",
            "--load-format",
            "dummy",
            "--cuda-device",
            "1",
            "--max-num-seqs",
            "8",
            "--no-async-scheduling",
        ]);
        let again = Wrap::parse_from(std::iter::once("x".to_string()).chain(w.e.to_args()));
        assert_eq!(format!("{:?}", w.e), format!("{:?}", again.e));
        assert_eq!((again.e.load_format, again.e.cuda_device), (LoadFormatArg::Dummy, 1));
        let cfg = again.e.engine_config();
        assert!(cfg.overlap_steps && !cfg.async_scheduling, "workers keep async scheduling off");
        assert_eq!((again.e.max_num_seqs(), again.e.max_num_batched_tokens()), (8, 8192));
    }

    #[test]
    fn cuda_without_a_gpu_is_a_clear_error() {
        use clap::Parser;
        if tandem_cuda::device::driver_present() {
            return; // a GPU machine: scripts/gpu/run.sh covers the CUDA path there
        }
        let w = Wrap::parse_from(["x", "--device", "cuda"]);
        let e = w.e.load_model(std::path::Path::new("/nonexistent.gguf")).expect_err("no GPU here");
        assert!(e.to_string().contains("CUDA is not available"), "{e}");
    }

    #[test]
    fn tensor_parallel_needs_a_gpu_and_travels_to_workers() {
        use clap::Parser;
        let w = Wrap::parse_from(["x", "--tensor-parallel-size", "2"]);
        let e = w.e.load_model(std::path::Path::new("/nonexistent.gguf")).expect_err("CPU");
        assert!(e.to_string().contains("--tensor-parallel-size 2 needs --device cuda"), "{e}");
        let w = Wrap::parse_from(["x", "--tensor-parallel-size", "0"]);
        let e = w.e.load_model(std::path::Path::new("/nonexistent.gguf")).expect_err("zero");
        assert!(e.to_string().contains("at least 1"), "{e}");
        let w = Wrap::parse_from(["x", "--device", "cuda", "--tensor-parallel-size", "4"]);
        let args = w.e.to_args();
        assert!(args.contains(&"--tensor-parallel-size=4".to_string()), "{args:?}");
        let again = Wrap::parse_from(std::iter::once("x".to_string()).chain(args));
        assert_eq!(again.e.tensor_parallel_size, 4);
    }
}
