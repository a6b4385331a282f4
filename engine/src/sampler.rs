//! `Sampler`: picks the next token from a row of logits, and reports log-probabilities.

use crate::backend::cpu::ops::log_softmax;
use crate::sampling_params::SamplingParams;

/// A token with its log-probability under the model (before temperature).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenLogprob {
    /// Token id.
    pub token_id: u32,
    /// Natural-log probability.
    pub logprob: f32,
}

/// The sampled token, its log-probability and the top alternatives.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SampledToken {
    /// Chosen token and its log-probability.
    #[serde(flatten)]
    pub chosen: TokenLogprob,
    /// Most likely tokens, best first (empty when not asked for).
    pub top: Vec<TokenLogprob>,
}

/// A small, fast, seedable PRNG (xoshiro256**), so a request's seed fixes its output.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    /// Seeds the generator (SplitMix64 expansion of `seed`).
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The `k` largest entries of `lp`, best first (ties broken by lower id).
pub fn top_k(lp: &[f32], k: usize) -> Vec<TokenLogprob> {
    let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    let cmp = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
    idx.select_nth_unstable_by(k - 1, cmp);
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter().map(|i| TokenLogprob { token_id: i, logprob: lp[i as usize] }).collect()
}

/// Chooses a token from `logits` under `params`, drawing from `rng` when sampling.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut Rng) -> SampledToken {
    let lp = log_softmax(logits);
    let id = if params.temperature == 0.0 {
        top_k(&lp, 1)[0].token_id
    } else {
        let inv_t = 1.0 / params.temperature as f64;
        let m = lp.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let w: Vec<f64> = lp.iter().map(|&l| ((l as f64 - m) * inv_t).exp()).collect();
        let total: f64 = w.iter().sum();
        let mut u = rng.next_f64() * total;
        let mut pick = w.len() - 1;
        for (i, &wi) in w.iter().enumerate() {
            if u < wi {
                pick = i;
                break;
            }
            u -= wi;
        }
        pick as u32
    };
    SampledToken {
        chosen: TokenLogprob { token_id: id, logprob: lp[id as usize] },
        top: params.logprobs.map(|k| top_k(&lp, k)).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax_and_reports_top() {
        let p = SamplingParams { logprobs: Some(2), ..SamplingParams::greedy(1) };
        let s = sample(&[0.0, 3.0, 1.0, 3.0], &p, &mut Rng::new(0));
        assert_eq!(s.chosen.token_id, 1);
        assert_eq!(s.top.iter().map(|t| t.token_id).collect::<Vec<_>>(), vec![1, 3]);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let p = SamplingParams { temperature: 1.0, ..Default::default() };
        let logits = [0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..4000).map(|_| sample(&logits, &p, &mut rng).chosen.token_id).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        let ones = draw(7).iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
    }
}
