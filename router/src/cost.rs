//! The routing cost (Dynamo's form): for each candidate worker,
//!
//! ```text
//! cost = overlap_weight · max(queued_prefill_tokens + prompt_tokens − cached_tokens, 0) / block_size
//!        + decode_weight · active_decode_blocks
//! ```
//!
//! i.e. the prefill work the worker would have queued (in blocks) if it took the request, after
//! the credit for the prompt blocks it already caches, plus its decode load. A decoding
//! sequence's blocks cost memory and a little compute per step, a queued prefill block costs a
//! block of compute before the first token: `decode_weight` (default 0.1) says how much less
//! a decode block weighs. With 1.0 (Dynamo's form), a worker busy decoding a long prompt loses
//! its cached prefix to an idle cold worker and the prefix is recomputed elsewhere. The pick is random
//! among candidates within `margin` of the best, so router replicas with the same view do not
//! all send the same request shape to the same worker.

/// Routing weights and thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostConfig {
    /// Weight of the prefill term.
    pub overlap_weight: f64,
    /// Weight of the decode term.
    pub decode_weight: f64,
    /// Candidates within this fraction of the best cost (and at least `margin_blocks`) are
    /// equally good.
    pub margin: f64,
    /// Absolute slack, in blocks, of "equally good".
    pub margin_blocks: f64,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig { overlap_weight: 1.0, decode_weight: 0.1, margin: 0.05, margin_blocks: 1.0 }
    }
}

/// One worker's standing for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Index of the worker in its pool.
    pub index: usize,
    /// Prompt tokens the worker already caches (leading full blocks).
    pub cached_tokens: usize,
    /// Prompt tokens queued on the worker (all routers).
    pub queued_prefill_tokens: f64,
    /// KV blocks of requests decoding on the worker (all routers).
    pub active_decode_blocks: f64,
    /// The cost.
    pub cost: f64,
}

/// The cost of sending a `prompt_tokens`-token prompt to a worker.
pub fn cost(
    cfg: &CostConfig,
    block_size: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    queued_prefill_tokens: f64,
    active_decode_blocks: f64,
) -> f64 {
    let prefill = (queued_prefill_tokens + prompt_tokens as f64 - cached_tokens as f64).max(0.0);
    cfg.overlap_weight * prefill / block_size.max(1) as f64
        + cfg.decode_weight * active_decode_blocks
}

/// The candidates within the margin of the best (never empty when `cands` is not).
pub fn near_best<'a>(cfg: &CostConfig, cands: &'a [Candidate]) -> Vec<&'a Candidate> {
    let Some(best) = cands.iter().map(|c| c.cost).reduce(f64::min) else { return Vec::new() };
    let slack = (best.abs() * cfg.margin).max(cfg.margin_blocks);
    cands.iter().filter(|c| c.cost <= best + slack).collect()
}

/// Picks uniformly among the near-best candidates with `rand`, a number in [0, 1).
pub fn pick<'a>(cfg: &CostConfig, cands: &'a [Candidate], rand: f64) -> Option<&'a Candidate> {
    let near = near_best(cfg, cands);
    if near.is_empty() {
        return None;
    }
    let i = ((rand * near.len() as f64) as usize).min(near.len() - 1);
    Some(near[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(index: usize, cached: usize, queued: f64, decode: f64) -> Candidate {
        let cost = cost(
            &CostConfig { decode_weight: 1.0, ..CostConfig::default() },
            16,
            512,
            cached,
            queued,
            decode,
        );
        Candidate {
            index,
            cached_tokens: cached,
            queued_prefill_tokens: queued,
            active_decode_blocks: decode,
            cost,
        }
    }

    #[test]
    fn formula() {
        let c = CostConfig { decode_weight: 1.0, ..CostConfig::default() };
        // 512-token prompt, 256 cached, nothing queued: 16 blocks to prefill.
        assert_eq!(cost(&c, 16, 512, 256, 0.0, 0.0), 16.0);
        // Queued work and decode load add; the prefill term never goes negative.
        assert_eq!(cost(&c, 16, 512, 256, 160.0, 5.0), 26.0 + 5.0);
        assert_eq!(cost(&c, 16, 16, 512, 0.0, 3.0), 3.0);
        let heavy = CostConfig { overlap_weight: 2.0, ..c };
        assert_eq!(cost(&heavy, 16, 512, 256, 0.0, 1.0), 33.0);
        // By default a decode block weighs a tenth of a queued prefill block.
        assert_eq!(cost(&CostConfig::default(), 16, 512, 256, 0.0, 30.0), 19.0);
    }

    #[test]
    fn the_worker_holding_the_prefix_wins_until_its_queue_outweighs_the_credit() {
        let cfg = CostConfig::default();
        let cands = [cand(0, 448, 0.0, 0.0), cand(1, 0, 0.0, 0.0), cand(2, 0, 0.0, 0.0)];
        assert_eq!(pick(&cfg, &cands, 0.99).unwrap().index, 0);
        // Seven 64-token suffixes queued on the holder make it as costly as a cold worker...
        let cands = [cand(0, 448, 7.0 * 64.0, 0.0), cand(1, 0, 0.0, 0.0)];
        assert_eq!(cands[0].cost, cands[1].cost);
        // ...and an eighth tips the request to the cold one.
        let cands = [cand(0, 448, 8.0 * 64.0, 0.0), cand(1, 0, 0.0, 0.0)];
        assert_eq!(pick(&cfg, &cands, 0.0).unwrap().index, 1);
        assert_eq!(pick(&cfg, &cands, 0.99).unwrap().index, 1);
    }

    #[test]
    fn near_ties_are_picked_at_random() {
        let cfg = CostConfig { decode_weight: 1.0, ..CostConfig::default() };
        let cands = [cand(0, 0, 0.0, 10.0), cand(1, 0, 0.0, 10.5), cand(2, 0, 0.0, 30.0)];
        let near: Vec<usize> = near_best(&cfg, &cands).iter().map(|c| c.index).collect();
        assert_eq!(near, vec![0, 1]);
        assert_eq!(pick(&cfg, &cands, 0.0).unwrap().index, 0);
        assert_eq!(pick(&cfg, &cands, 0.75).unwrap().index, 1);
        assert!(pick(&cfg, &[], 0.5).is_none());
    }
}
