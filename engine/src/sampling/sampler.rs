//! `Sampler`: turns one row of logits into the next token under a request's
//! [`SamplingParams`]: penalties, `min_tokens` masking, greedy or temperature sampling with
//! min-p / top-k / top-p filtering, and log-probabilities of the model's own distribution.

use crate::backend::cpu::ops::log_sum_exp;
use crate::sampling::sampling_params::SamplingParams;

/// A token with its log-probability under the model (before penalties and temperature).
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
    /// 1 + how many tokens the model found likelier than the chosen one (computed for scored
    /// prompt tokens only: vLLM's `prompt_logprobs` report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// How a backend that samples on the device chooses the token of one logits row: Gumbel-max
/// over the tokens surviving min-p, top-k and top-p, with this temperature (0 = argmax) and
/// seed, as [`gumbel_max`] defines it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// Softmax temperature (0 = greedy).
    pub temperature: f32,
    /// Seed of the row's random draws.
    pub seed: u64,
    /// Keep the `top_k` most likely tokens (0 or negative: all).
    pub top_k: i32,
    /// Keep the smallest most likely set reaching this probability (1: all).
    pub top_p: f32,
    /// Drop tokens below this fraction of the most likely one's probability (0: none).
    pub min_p: f32,
}

impl RowSampling {
    /// Plain temperature sampling (no filter) with `seed`.
    pub fn new(temperature: f32, seed: u64) -> Self {
        RowSampling { temperature, seed, top_k: 0, top_p: 1.0, min_p: 0.0 }
    }
}

/// A small, fast, seedable PRNG (xoshiro256**), so a request's seed fixes its output.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// The `k` largest entries of `lp`, best first (ties broken by lower id); tokens that cannot be
/// chosen (log-probability minus infinity: masked by a constraint or by `min_tokens`) are left
/// out, so there may be fewer than `k`.
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
    idx.into_iter()
        .filter(|&i| lp[i as usize] > f32::NEG_INFINITY)
        .map(|i| TokenLogprob { token_id: i, logprob: lp[i as usize] })
        .collect()
}

/// Index of the largest value (the first one on ties): greedy decoding.
pub fn argmax(x: &[f32]) -> u32 {
    // Chunks of 64: a chunk's maximum over independent lanes (vectorised), and a scan for its
    // first index only when it beats the best so far, so the serial chain is one compare per
    // chunk (a 262k-entry vocabulary row per token is otherwise a long dependent loop).
    // As a scan with `v > x[best]` from index 0: NaNs never win, a NaN first entry stays.
    let mut best = (0usize, x.first().copied().unwrap_or(f32::NAN));
    for (ci, c) in x.chunks(64).enumerate() {
        let m = crate::backend::cpu::ops::max_lanes(c);
        if m > best.1 {
            let i = c.iter().position(|&v| v == m).expect("the chunk holds its maximum");
            best = (ci * 64 + i, m);
        }
    }
    best.0 as u32
}

/// The uniform draw in (0, 1) of vocabulary entry `i` under `seed`: a SplitMix64 finaliser of
/// `seed ^ i·φ`, its top 24 bits centred in their interval (exact in f32, never 0 or 1).
/// Device samplers compute the same bits, so a seed picks the same token on every backend up to
/// the rounding of the logits.
pub fn draw_uniform(seed: u64, i: u32) -> f32 {
    let mut z = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32 + 0.5) * (1.0 / (1u32 << 24) as f32)
}

/// Gumbel-max sampling of one raw logits row: among the tokens surviving the row's min-p,
/// top-k and top-p filters (as [`filtered_distribution`] keeps them), the token maximising
/// `l / temperature + g` with `g = -ln(-ln(u))`, `u` = [`draw_uniform`] — an exact draw from the
/// filtered `softmax(l / temperature)`; `temperature == 0` is the argmax (lowest id on ties).
/// Returns the token with its log-probability under the raw model distribution. This is the
/// reference the device sampling kernels implement.
pub fn gumbel_max(logits: &[f32], r: &RowSampling) -> TokenLogprob {
    let id = if r.temperature == 0.0 {
        argmax(logits)
    } else {
        let p = SamplingParams {
            temperature: r.temperature,
            top_k: r.top_k,
            top_p: r.top_p,
            min_p: r.min_p,
            ..Default::default()
        };
        let inv_t = 1.0 / r.temperature;
        let mut best = (f32::NEG_INFINITY, 0u32);
        for (i, _) in filtered_weights(logits, &p) {
            let g = -(-draw_uniform(r.seed, i).ln()).ln();
            let score = logits[i as usize] * inv_t + g;
            if score > best.0 || (score == best.0 && i < best.1) {
                best = (score, i);
            }
        }
        best.1
    };
    TokenLogprob { token_id: id, logprob: logits[id as usize] - log_sum_exp(logits) }
}

/// What the sampler needs to know about the sequence besides its params.
pub struct SamplingContext<'a> {
    /// Prompt token ids (for the repetition penalty).
    pub prompt: &'a [u32],
    /// Tokens generated so far.
    pub output: &'a [u32],
    /// End-of-sequence ids of the model (masked while below `min_tokens`).
    pub eos_token_ids: &'a [u32],
}

/// Applies penalties, `logit_bias` and `min_tokens` masking to `logits` in place.
pub fn process_logits(logits: &mut [f32], p: &SamplingParams, ctx: &SamplingContext) {
    if p.has_penalties() {
        let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        for &t in ctx.output {
            *counts.entry(t).or_default() += 1;
        }
        if p.repetition_penalty != 1.0 {
            let mut seen: std::collections::HashSet<u32> = ctx.prompt.iter().copied().collect();
            seen.extend(counts.keys());
            for t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        for (&t, &c) in &counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.frequency_penalty * c as f32 + p.presence_penalty;
            }
        }
        for &(t, b) in &p.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
    }
    if ctx.output.len() < p.min_tokens {
        let eos = if p.ignore_eos { &[][..] } else { ctx.eos_token_ids };
        for &t in eos.iter().chain(&p.stop_token_ids) {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Samples from processed logits: temperature, then min-p, top-k and top-p filters.
fn sample_filtered(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
    draw_weighted(&filtered_weights(logits, p), rng)
}

/// Draws a token from `(token, weight)` pairs (weights need not sum to 1).
pub fn draw_weighted(cand: &[(u32, f64)], rng: &mut Rng) -> u32 {
    let total: f64 = cand.iter().map(|c| c.1).sum();
    let mut u = rng.next_f64() * total;
    for &(id, w) in cand {
        if u < w {
            return id;
        }
        u -= w;
    }
    cand.last().map(|c| c.0).unwrap_or(0)
}

/// The distribution a non-greedy request samples from, given processed logits: the surviving
/// tokens of temperature, min-p, top-k and top-p, with their probabilities (summing to 1).
pub fn filtered_distribution(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let mut cand = filtered_weights(logits, p);
    let total: f64 = cand.iter().map(|c| c.1).sum();
    for c in &mut cand {
        c.1 /= total;
    }
    cand
}

/// Unnormalised weights of the tokens surviving the filters, largest first when filtered.
fn filtered_weights(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let inv_t = 1.0 / p.temperature as f64;
    let m = crate::backend::cpu::ops::max_lanes(logits) as f64;
    let mut cand: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, &l)| l > f32::NEG_INFINITY)
        .map(|(i, &l)| (i as u32, ((l as f64 - m) * inv_t).exp()))
        .collect();
    if p.min_p > 0.0 {
        // Relative to the most likely token, whose weight is 1 after the shift by the max.
        let floor = p.min_p as f64;
        cand.retain(|&(_, w)| w >= floor);
    }
    let k = if p.top_k > 0 { p.top_k as usize } else { usize::MAX };
    if k < cand.len() || p.top_p < 1.0 {
        let by_weight = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, by_weight);
            cand.truncate(k);
        }
        cand.sort_by(by_weight);
        if p.top_p < 1.0 {
            let total: f64 = cand.iter().map(|c| c.1).sum();
            let mut acc = 0.0;
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                acc += c.1;
                if acc >= p.top_p as f64 * total {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep);
        }
    }
    cand
}

/// `logits` with the request's penalties and `min_tokens` masking applied (a copy only when
/// something applies).
pub fn processed<'a>(
    logits: &'a [f32],
    p: &SamplingParams,
    ctx: &SamplingContext,
) -> std::borrow::Cow<'a, [f32]> {
    if p.has_penalties() || ctx.output.len() < p.min_tokens {
        let mut l = logits.to_vec();
        process_logits(&mut l, p, ctx);
        std::borrow::Cow::Owned(l)
    } else {
        std::borrow::Cow::Borrowed(logits)
    }
}

/// The [`SampledToken`] for choosing `id` from raw `logits`: its log-probability under the
/// model and, when asked for, the top alternatives.
pub fn sampled(logits: &[f32], id: u32, p: &SamplingParams) -> SampledToken {
    scored(logits, id, p.logprobs)
}

/// The log-probability of `id` under `logits`, with the `k` most likely alternatives when
/// asked for.
pub fn scored(logits: &[f32], id: u32, k: Option<usize>) -> SampledToken {
    let lse = log_sum_exp(logits);
    let mut top = k.map(|k| top_k(logits, k)).unwrap_or_default();
    for t in &mut top {
        t.logprob -= lse;
    }
    SampledToken {
        chosen: TokenLogprob { token_id: id, logprob: logits[id as usize] - lse },
        top,
        rank: None,
    }
}

/// [`scored`], with the chosen token's rank.
pub fn scored_ranked(logits: &[f32], id: u32, k: Option<usize>) -> SampledToken {
    let x = logits[id as usize];
    let above = logits.iter().filter(|&&l| l > x).count() as u32;
    SampledToken { rank: Some(above + 1), ..scored(logits, id, k) }
}

/// Chooses the next token from raw `logits` under `p`, drawing from `rng` when sampling.
/// Log-probabilities are those of the raw model distribution.
pub fn sample_token(
    logits: &[f32],
    p: &SamplingParams,
    ctx: &SamplingContext,
    rng: &mut Rng,
) -> SampledToken {
    let work = processed(logits, p, ctx);
    let id = if p.is_greedy() { argmax(&work) } else { sample_filtered(&work, p, rng) };
    sampled(logits, id, p)
}

/// Samples with no history (no penalties apply, no `min_tokens` masking).
pub fn sample(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> SampledToken {
    sample_token(logits, p, &SamplingContext { prompt: &[], output: &[], eos_token_ids: &[] }, rng)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx<'a>(prompt: &'a [u32], output: &'a [u32]) -> SamplingContext<'a> {
        SamplingContext { prompt, output, eos_token_ids: &[0] }
    }

    #[test]
    fn argmax_is_the_first_largest_entry() {
        let scan = |x: &[f32]| {
            let mut best = 0;
            for (i, &v) in x.iter().enumerate() {
                if v > x[best] {
                    best = i;
                }
            }
            best as u32
        };
        let mut rng = Rng::new(3);
        for len in [0, 1, 5, 63, 64, 65, 200, 1000] {
            // Few distinct values: ties across chunks and lanes.
            let mut x: Vec<f32> = (0..len).map(|_| (rng.next_f64() * 6.0).floor() as f32).collect();
            assert_eq!(argmax(&x), scan(&x), "{x:?}");
            if len > 70 {
                x[len / 2] = f32::NAN;
                x[3] = f32::INFINITY;
                assert_eq!(argmax(&x), scan(&x));
                x[0] = f32::NAN;
                assert_eq!(argmax(&x), 0);
            }
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY; 100]), 0);
    }

    #[test]
    fn greedy_picks_argmax_and_reports_top() {
        let p = SamplingParams { logprobs: Some(2), ..SamplingParams::greedy(1) };
        let s = sample(&[0.0, 3.0, 1.0, 3.0], &p, &mut Rng::new(0));
        assert_eq!(s.chosen.token_id, 1);
        assert_eq!(s.top.iter().map(|t| t.token_id).collect::<Vec<_>>(), vec![1, 3]);
        // Masked tokens are never alternatives.
        let p = SamplingParams { logprobs: Some(3), ..SamplingParams::greedy(1) };
        let s = sample(&[f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY], &p, &mut Rng::new(0));
        assert_eq!(
            s.top.iter().map(|t| (t.token_id, t.logprob)).collect::<Vec<_>>(),
            vec![(1, 0.0)]
        );
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
        assert_ne!(draw(7), draw(8));
        let ones = draw(7).iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
    }

    #[test]
    fn penalties_follow_openai_and_vllm_semantics() {
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut l = vec![1.0f32, 2.0, -2.0, 4.0];
        process_logits(&mut l, &p, &ctx(&[3], &[1, 1, 2]));
        assert_eq!(l[0], 1.0); // unseen
        assert_eq!(l[1], 2.0 / 2.0 - 0.25 * 2.0 - 0.5); // repetition, then twice frequency + presence
        assert_eq!(l[2], -2.0 * 2.0 - 0.25 - 0.5);
        assert_eq!(l[3], 4.0 / 2.0); // prompt-only: repetition penalty only
    }

    #[test]
    fn logit_bias_is_added_after_penalties_and_steers_greedy_choice() {
        let p = SamplingParams {
            presence_penalty: 0.5,
            logit_bias: vec![(0, 100.0), (2, -100.0)],
            ..SamplingParams::greedy(4)
        };
        let mut l = vec![1.0f32, 2.0, 9.0, 4.0];
        process_logits(&mut l, &p, &ctx(&[], &[0]));
        assert_eq!(l, vec![1.0 - 0.5 + 100.0, 2.0, 9.0 - 100.0, 4.0]);
        let logits = [1.0f32, 2.0, 9.0, 4.0];
        assert_eq!(sample_token(&logits, &p, &ctx(&[], &[]), &mut Rng::new(0)).chosen.token_id, 0);
        let bad =
            |b: Vec<(u32, f32)>| SamplingParams { logit_bias: b, ..SamplingParams::greedy(4) };
        assert_eq!(bad(vec![(4, 1.0)]).validate(4).unwrap_err().param, "logit_bias");
        assert_eq!(bad(vec![(1, 100.5)]).validate(4).unwrap_err().param, "logit_bias");
        assert_eq!(bad(vec![(1, f32::NAN)]).validate(4).unwrap_err().param, "logit_bias");
        assert!(bad(vec![(3, -100.0)]).validate(4).is_ok());
    }

    #[test]
    fn min_tokens_masks_eos_and_stop_ids() {
        let p =
            SamplingParams { min_tokens: 2, stop_token_ids: vec![2], ..SamplingParams::greedy(4) };
        let logits = [9.0f32, 1.0, 8.0, 0.0];
        assert_eq!(sample_token(&logits, &p, &ctx(&[], &[5]), &mut Rng::new(0)).chosen.token_id, 1);
        assert_eq!(
            sample_token(&logits, &p, &ctx(&[], &[5, 5]), &mut Rng::new(0)).chosen.token_id,
            0
        );
    }

    #[test]
    fn gumbel_max_follows_the_tempered_distribution() {
        let logits = [0.0f32, 1.0, 2.0, -1.0];
        let t = 0.6f32;
        let z: f64 = logits.iter().map(|&l| (l as f64 / t as f64).exp()).sum();
        let mut counts = [0usize; 4];
        for seed in 0..20_000u64 {
            let s =
                gumbel_max(&logits, &RowSampling::new(t, seed.wrapping_mul(0x2545_F491_4F6C_DD1D)));
            counts[s.token_id as usize] += 1;
            let lse = log_sum_exp(&logits);
            assert!((s.logprob - (logits[s.token_id as usize] - lse)).abs() < 1e-6);
        }
        for (i, &c) in counts.iter().enumerate() {
            let p = (logits[i] as f64 / t as f64).exp() / z;
            assert!((c as f64 / 20_000.0 - p).abs() < 0.01, "token {i}: {c} draws, p = {p}");
        }
        // Temperature 0 is the argmax, the first on ties.
        assert_eq!(gumbel_max(&[1.0, 3.0, 3.0], &RowSampling::new(0.0, 9)).token_id, 1);
        // The draw is fixed by the seed.
        assert_eq!(
            gumbel_max(&logits, &RowSampling::new(1.0, 77)),
            gumbel_max(&logits, &RowSampling::new(1.0, 77))
        );
        let u: Vec<f32> = (0..1000).map(|i| draw_uniform(5, i)).collect();
        assert!(u.iter().all(|&x| x > 0.0 && x < 1.0));
    }

    #[test]
    fn filtered_gumbel_max_follows_the_filtered_distribution() {
        let logits = [0.5f32, 2.0, 1.0, -1.0, 1.5, 0.0];
        for r in [
            RowSampling { top_k: 3, ..RowSampling::new(0.8, 0) },
            RowSampling { top_p: 0.7, ..RowSampling::new(1.0, 0) },
            RowSampling { min_p: 0.3, ..RowSampling::new(1.2, 0) },
            RowSampling { top_k: 4, top_p: 0.9, min_p: 0.1, ..RowSampling::new(0.6, 0) },
        ] {
            let p = SamplingParams {
                temperature: r.temperature,
                top_k: r.top_k,
                top_p: r.top_p,
                min_p: r.min_p,
                ..Default::default()
            };
            let want = filtered_distribution(&logits, &p);
            let mut counts = [0usize; 6];
            let n = 20_000;
            for seed in 0..n as u64 {
                counts[gumbel_max(
                    &logits,
                    &RowSampling { seed: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) + 1, ..r },
                )
                .token_id as usize] += 1;
            }
            for (i, &c) in counts.iter().enumerate() {
                let p = want.iter().find(|w| w.0 == i as u32).map_or(0.0, |w| w.1);
                assert!(
                    (c as f64 / n as f64 - p).abs() < 0.012,
                    "{r:?} token {i}: {c} draws, p = {p}"
                );
            }
        }
    }

    #[test]
    fn filters_restrict_the_support() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let mut rng = Rng::new(3);
        let topk = SamplingParams { top_k: 2, ..Default::default() };
        let topp = SamplingParams { top_p: 0.5, ..Default::default() };
        let minp = SamplingParams { min_p: 0.3, ..Default::default() };
        for _ in 0..500 {
            assert!(sample(&logits, &topk, &mut rng).chosen.token_id >= 2);
            assert_eq!(sample(&logits, &topp, &mut rng).chosen.token_id, 3); // p(3) = 0.64
            assert!(sample(&logits, &minp, &mut rng).chosen.token_id >= 2); // e^-1 = 0.37 >= 0.3
        }
    }
}
