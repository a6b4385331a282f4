//! Steps with prompt chunks beside decoding sequences (what a server runs while requests
//! arrive): eager against the mixed-step graph of their shape, beside the decode step alone.

use tandem_engine::backend::{ForwardBatch, Logits, ModelBackend};
use tandem_engine::model_files::config::ModelConfig;

use super::{decode_block, decode_options};
use crate::{CudaBackend, CudaError, Dtype, WeightSource};

/// One mixed-step measurement (wall time of steps queued back to back, ms).
#[derive(Debug, Clone)]
pub struct MixedRow {
    /// Decoding sequences in the step.
    pub decode: usize,
    /// Prompt chunks in the step.
    pub prompts: usize,
    /// Tokens of each chunk.
    pub prompt_len: usize,
    /// The step with every kernel launched one by one.
    pub eager_ms: f64,
    /// The step replayed from its mixed-step graph.
    pub graph_ms: f64,
    /// The decode rows alone, from their decode graph.
    pub decode_ms: f64,
    /// Largest difference between the step's logits from its graph and eager, and the largest
    /// logit's magnitude (`None`: the step is beyond every mixed-step graph).
    pub logit_diff: Option<(f64, f64)>,
}

/// For each `(prompts, prompt_len)`: a step of `decode` sequences (contexts over `context`, as
/// the decode benchmark spreads them) and that many prompt chunks from position 0, each with
/// blocks of its own, on GPU 0 with random weights (`dtype`).
pub fn mixed(
    cfg: &ModelConfig,
    dtype: Dtype,
    decode: usize,
    context: (usize, usize),
    chunks: &[(usize, usize)],
) -> Result<Vec<MixedRow>, CudaError> {
    let hi = context.1.max(context.0);
    let longest = chunks.iter().map(|c| c.1).max().unwrap_or(1).max(hi);
    let most = chunks.iter().map(|c| c.0).max().unwrap_or(0);
    let bs = decode_block();
    let mut opts = decode_options(decode + most, longest);
    opts.max_num_batched_tokens = 8192;
    let mut be = crate::load(0, dtype, cfg, WeightSource::Dummy(1), opts)?;
    let alone = super::decode_batch(decode, (context.0, hi), bs);
    let per = (longest + 1).div_ceil(bs);
    let mut rows = Vec::new();
    for &(prompts, len) in chunks {
        let mut b = alone.clone();
        for i in 0..prompts {
            let s = decode + i;
            let blocks: Vec<u32> =
                (0..len.div_ceil(bs) as u32).map(|j| (s * per) as u32 + j).collect();
            let toks: Vec<u32> = (0..len as u32).map(|t| (t * 31 + i as u32) % 1000 + 1).collect();
            b.push_seq(&toks, 0, &blocks, bs, Logits::Last);
        }
        be.set_mixed_graphs(false);
        let eager_ms = be.step_ms(&b, 10, 7)?;
        be.set_mixed_graphs(true);
        let graph_ms = be.step_ms(&b, 10, 7)?;
        let decode_ms = be.step_ms(&alone, 10, 7)?;
        let logit_diff = graph_vs_eager(&mut be, &b)?;
        rows.push(MixedRow {
            decode,
            prompts,
            prompt_len: len,
            eager_ms,
            graph_ms,
            decode_ms,
            logit_diff,
        });
    }
    Ok(rows)
}

/// The logits of `b` run eagerly against those from its mixed-step graph (captured on the
/// second run, replayed on the third): the largest difference and the largest magnitude;
/// `None` when no graph serves the step.
fn graph_vs_eager(be: &mut CudaBackend, b: &ForwardBatch) -> Result<Option<(f64, f64)>, CudaError> {
    let fwd = |be: &mut CudaBackend| be.forward(b).map_err(|e| CudaError::Driver(e.to_string()));
    be.set_mixed_graphs(false);
    let eager = fwd(be)?;
    be.set_mixed_graphs(true);
    let mut graph = Vec::new();
    for _ in 0..3 {
        graph = fwd(be)?;
    }
    match be.mixed_graph_count() {
        // No graph holds the step's shape: the row has no graph comparison (its graph time is
        // the eager one).
        0 => return Ok(None),
        1 => {}
        n => {
            return Err(CudaError::Unsupported(format!(
                "the step made {n} mixed-step graphs where one was expected"
            )))
        }
    }
    let diff = graph.iter().zip(&eager).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    let top = eager.iter().map(|a| a.abs() as f64).fold(0.0, f64::max);
    Ok(Some((diff, top)))
}
