//! Sliding-window KV release on the GPU: a model with local layers served by the whole engine
//! (scheduler, block manager, CUDA backend) twice, once with KV groups (`hybrid_kv`: the local
//! layers' pages go back once their window has passed) and once keeping every layer's page of
//! every block. The greedy tokens must be the same, the log-probabilities equal within 1e-3
//! nats, and the grouped run must hold less KV at its peak.

use std::collections::HashMap;
use std::path::Path;

use tandem_engine::model_files::weights::ModelFiles;
use tandem_engine::{EngineConfig, LLMEngine, Model, ModelInfo, Prompt, SamplingParams};

use crate::check::CheckResult;
use crate::{CudaBackendOptions, CudaError, Dtype, WeightSource};

/// What one engine run produced.
struct Run {
    /// Per request: tokens and their log-probabilities.
    out: HashMap<String, (Vec<u32>, Vec<f32>)>,
    /// Most KV held at once, in layer-blocks (pages × the layers a page holds).
    peak_kv: usize,
    /// KV groups of the backend.
    groups: usize,
}

/// Requests whose prompts and outputs pass a window of `window` positions several times.
fn requests(vocab: usize, window: usize) -> Vec<(String, Vec<u32>, SamplingParams)> {
    let len = (3 * window).clamp(48, 1500);
    (0..4)
        .map(|i| {
            let prompt: Vec<u32> =
                (0..len + 7 * i).map(|k| (3 + (k * 7 + i * 13) % (vocab - 3)) as u32).collect();
            let params = SamplingParams {
                ignore_eos: true,
                logprobs: Some(1),
                ..SamplingParams::greedy(48 + 8 * i)
            };
            (format!("r{i}"), prompt, params)
        })
        .collect()
}

fn run(path: &Path, hybrid: bool, ordinal: usize) -> Result<Run, CudaError> {
    let info = ModelInfo::open(path)?;
    let (files, cfg) = ModelFiles::open(path)?;
    let opts = CudaBackendOptions {
        num_blocks: Some(2048),
        max_num_batched_tokens: 2048,
        max_model_len: cfg.max_position_embeddings.min(4096),
        max_graph_batch: 8,
        hybrid_kv: hybrid,
        ..Default::default()
    };
    let backend = crate::load(ordinal, Dtype::F16, &cfg, WeightSource::Files(&files), opts)?;
    let model = Model {
        config: info.config,
        tokenizer: info.tokenizer,
        chat_template: info.chat_template,
        backend: Box::new(backend),
    };
    let mut e = LLMEngine::new(model, EngineConfig::default());
    let window = (0..cfg.num_layers).filter_map(|l| cfg.layer_window(l)).min().unwrap_or(256);
    let err = |e: tandem_engine::EngineError| CudaError::Driver(e.to_string());
    for (id, p, sp) in requests(cfg.vocab_size, window) {
        e.add_request(&id, Prompt::TokenIds(p), sp, None).map_err(err)?;
    }
    let page_layers = e.kv_groups().layers_per_page;
    let mut out: HashMap<String, (Vec<u32>, Vec<f32>)> = HashMap::new();
    let mut peak_kv = 0;
    while e.has_unfinished_requests() {
        for o in e.step().map_err(err)? {
            let entry = out.entry(o.request_id.clone()).or_default();
            for c in o.outputs {
                entry.0.extend(c.token_ids);
                entry.1.extend(c.logprobs.iter().map(|l| l.chosen.logprob));
            }
        }
        let bm = e.block_manager();
        peak_kv = peak_kv.max((bm.num_blocks() - bm.num_free_blocks()) * page_layers);
    }
    Ok(Run { out, peak_kv, groups: e.kv_groups().num_groups() })
}

/// Runs the comparison for the model at `path` (a model with sliding-window layers).
pub fn check(path: &Path, ordinal: usize) -> Result<Vec<CheckResult>, CudaError> {
    let (every, grouped) = (run(path, false, ordinal)?, run(path, true, ordinal)?);
    let name = path.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let (mut differ, mut worst) = (0usize, 0f64);
    for (id, (toks, lps)) in &every.out {
        let (gt, gl) = &grouped.out[id];
        differ += usize::from(toks != gt);
        for (a, b) in lps.iter().zip(gl) {
            worst = worst.max((a - b).abs() as f64);
        }
    }
    Ok(vec![
        CheckResult {
            name: format!(
                "{name}: {} KV groups vs one, requests whose greedy tokens differ",
                grouped.groups
            ),
            max_err: differ as f64,
            tol: 0.0,
        },
        CheckResult {
            name: format!("{name}: same, chosen tokens' log-probs (nats)"),
            max_err: worst,
            tol: 1e-3,
        },
        CheckResult {
            name: format!(
                "{name}: peak KV held with groups / keeping every page ({} / {} layer-blocks)",
                grouped.peak_kv, every.peak_kv
            ),
            max_err: grouped.peak_kv as f64 / every.peak_kv.max(1) as f64,
            tol: 0.9,
        },
    ])
}
