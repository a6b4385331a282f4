//! A tensor-parallel group against one GPU on the same weights: the logits of a batch of
//! prompts, then greedy continuations of every prompt decoded together (CUDA graphs on both
//! sides), token for token; where a sequence parts, one GPU's top-2 margin at that token says
//! whether it was a near-tie. The group's on-device sampling at temperature 0 must pick what its
//! logits' argmax picks.

use tandem_engine::backend::{ForwardBatch, Logits, ModelBackend, RowSampling};
use tandem_engine::model_files::config::ModelConfig;

use crate::{CudaBackend, CudaBackendOptions, CudaError, Dtype, TpBackend, WeightSource};

/// Tokens per KV block in the check.
const BS: usize = 16;

/// What the comparison found.
#[derive(Debug, Clone)]
pub struct TpCheck {
    /// GPUs in the group.
    pub size: usize,
    /// Largest |logit difference| over the prompts' last positions.
    pub max_abs_logit_diff: f32,
    /// Largest |logit| there (the scale of the difference).
    pub max_abs_logit: f32,
    /// Per sequence: tokens equal before the first difference (all `steps` when none).
    pub agreed: Vec<usize>,
    /// Per sequence that parted: one GPU's top-2 margin (logits) at the token where it did.
    pub margins: Vec<Option<f32>>,
    /// Greedy steps per sequence.
    pub steps: usize,
    /// Tokens where the group's device sampling (temperature 0) differed from its logits'
    /// argmax.
    pub sampling_mismatches: usize,
}

fn argmax_margin(row: &[f32]) -> (u32, f32) {
    let (mut best, mut bi, mut second) = (f32::NEG_INFINITY, 0usize, f32::NEG_INFINITY);
    for (i, &x) in row.iter().enumerate() {
        if x > best {
            second = best;
            best = x;
            bi = i;
        } else if x > second {
            second = x;
        }
    }
    (bi as u32, best - second)
}

/// Prompt `i` of the check: 17 to 112 pseudo-random token ids below `vocab`.
fn prompt(i: usize, vocab: usize) -> Vec<u32> {
    let len = 17 + (i * 37) % 96;
    let mut x = 0x9E37_79B9u32.wrapping_mul(i as u32 + 1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % vocab as u32
        })
        .collect()
}

fn fail(e: impl std::fmt::Display) -> CudaError {
    CudaError::Driver(e.to_string())
}

/// Every step's logits rows (all sequences) and each sequence's tokens chosen from them.
type Greedy = (Vec<Vec<f32>>, Vec<Vec<u32>>);

/// Greedy decoding of `prompts` together on `be` for `steps` tokens.
fn greedy(
    be: &mut dyn ModelBackend,
    prompts: &[Vec<u32>],
    steps: usize,
    per: usize,
) -> Result<Greedy, CudaError> {
    let vocab = be.config().vocab_size;
    let table = |s: usize| -> Vec<u32> { (0..per as u32).map(|i| (s * per) as u32 + i).collect() };
    let mut b = ForwardBatch::default();
    for (s, p) in prompts.iter().enumerate() {
        b.push_seq(p, 0, &table(s), BS, Logits::Last);
    }
    let mut logits = be.forward(&b).map_err(fail)?;
    let mut rows = Vec::new();
    let mut toks = vec![Vec::new(); prompts.len()];
    for step in 0..steps {
        rows.push(logits.clone());
        let mut b = ForwardBatch::default();
        for (s, p) in prompts.iter().enumerate() {
            let (t, _) = argmax_margin(&logits[s * vocab..(s + 1) * vocab]);
            toks[s].push(t);
            b.push_seq(&[t], p.len() + step, &table(s), BS, Logits::Last);
        }
        if step + 1 < steps {
            logits = be.forward(&b).map_err(fail)?;
        }
    }
    Ok((rows, toks))
}

/// Runs the check for `cfg` with `weights` on GPU 0 alone and on GPUs `0..size`: `prompts`
/// prompts, `steps` greedy tokens each.
pub fn run(
    cfg: &ModelConfig,
    weights: WeightSource<'_>,
    size: usize,
    dtype: Dtype,
    prompts: usize,
    steps: usize,
) -> Result<TpCheck, CudaError> {
    let vocab = cfg.vocab_size;
    let ps: Vec<Vec<u32>> = (0..prompts).map(|i| prompt(i, vocab)).collect();
    let longest = ps.iter().map(Vec::len).max().unwrap_or(0) + steps;
    let per = longest.div_ceil(BS);
    let opts = CudaBackendOptions {
        num_blocks: Some(prompts * per),
        max_num_batched_tokens: ps.iter().map(Vec::len).sum::<usize>().max(256),
        max_model_len: per * BS,
        max_graph_batch: prompts.next_power_of_two(),
        ..Default::default()
    };
    let (one_rows, one_toks) = {
        let mut one: CudaBackend = crate::load(0, dtype, cfg, weights, opts)?;
        greedy(&mut one, &ps, steps, per)?
    };
    let mut group = TpBackend::load(0, size, dtype, cfg, weights, opts)?;
    let (rows, toks) = greedy(&mut group, &ps, steps, per)?;
    let (mut max_abs_logit_diff, mut max_abs_logit) = (0f32, 0f32);
    for (a, b) in one_rows[0].iter().zip(&rows[0]) {
        max_abs_logit_diff = max_abs_logit_diff.max((a - b).abs());
        max_abs_logit = max_abs_logit.max(a.abs());
    }
    let mut agreed = Vec::new();
    let mut margins = Vec::new();
    for s in 0..prompts {
        let same = one_toks[s].iter().zip(&toks[s]).take_while(|(a, b)| a == b).count();
        agreed.push(same);
        margins.push((same < steps).then(|| {
            let row = &one_rows[same][s * vocab..(s + 1) * vocab];
            argmax_margin(row).1
        }));
    }
    // The group's device sampling, teacher-forced along its own greedy tokens.
    let mut sampling_mismatches = 0;
    let table = |s: usize| -> Vec<u32> { (0..per as u32).map(|i| (s * per) as u32 + i).collect() };
    let greedy_rows: Vec<RowSampling> =
        (0..prompts).map(|s| RowSampling::new(0.0, s as u64)).collect();
    let mut b = ForwardBatch::default();
    for (s, p) in ps.iter().enumerate() {
        b.push_seq(p, 0, &table(s), BS, Logits::Last);
    }
    let by_step: Vec<Vec<u32>> =
        (0..steps).map(|st| toks.iter().map(|t| t[st]).collect()).collect();
    for (step, want) in by_step.iter().take(8).enumerate() {
        let got = group.forward_sampled(&b, &greedy_rows, &mut Vec::new).map_err(fail)?;
        let mut next = ForwardBatch::default();
        for (s, p) in ps.iter().enumerate() {
            sampling_mismatches += usize::from(got[s].token_id != want[s]);
            next.push_seq(&[want[s]], p.len() + step, &table(s), BS, Logits::Last);
        }
        b = next;
    }
    Ok(TpCheck {
        size,
        max_abs_logit_diff,
        max_abs_logit,
        agreed,
        margins,
        steps,
        sampling_mismatches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_fixed_and_in_the_vocabulary() {
        let a = prompt(3, 1000);
        assert_eq!(a, prompt(3, 1000));
        assert_ne!(a, prompt(4, 1000));
        assert!((17..=112).contains(&a.len()) && a.iter().all(|&t| t < 1000));
        assert_eq!(argmax_margin(&[0.5, 2.0, 1.25, -1.0]), (1, 0.75));
    }
}
