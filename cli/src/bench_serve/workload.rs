//! Workload generators of `tandem bench serve`, all seeded:
//! - `random`: prompts of random token ids, input and output lengths uniform within
//!   `len·(1 ± range_ratio)`;
//! - `shared-prefix`: `num_prefixes` system prompts of `prefix_len` tokens, each request one of
//!   them followed by its own user turn;
//! - `multi-turn`: conversations whose every turn re-sends the whole history (user turns and the
//!   server's answers) plus a new user message, through the chat endpoint.

use tandem_engine::sampling::sampler::Rng;

/// A prompt as sent.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptBody {
    /// Token ids for `/v1/completions`.
    Tokens(Vec<u32>),
    /// A new user message for `/v1/chat/completions`; the history is kept by the runner.
    ChatTurn(String),
}

/// One request to make.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    /// What to send.
    pub prompt: PromptBody,
    /// Tokens to generate.
    pub output_len: usize,
    /// Conversation it belongs to (multi-turn; requests of one conversation run in order).
    pub conversation: Option<usize>,
}

/// Workload parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadConfig {
    /// Requests (multi-turn: conversations × turns).
    pub num_prompts: usize,
    /// Prompt (or user turn) length.
    pub input_len: usize,
    /// Output length.
    pub output_len: usize,
    /// Relative spread of lengths: uniform in `len·(1 − r) ..= len·(1 + r)`.
    pub range_ratio: f64,
    /// Shared-prefix: number of system prompts.
    pub num_prefixes: usize,
    /// Shared-prefix: system prompt length.
    pub prefix_len: usize,
    /// Multi-turn: turns per conversation.
    pub turns: usize,
    /// Seed.
    pub seed: u64,
    /// Token ids are drawn from `1000..vocab` (`vocab/2..vocab` below 2000).
    pub vocab: u32,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            num_prompts: 32,
            input_len: 64,
            output_len: 64,
            range_ratio: 0.0,
            num_prefixes: 8,
            prefix_len: 512,
            turns: 4,
            seed: 0,
            vocab: 32000,
        }
    }
}

fn len(rng: &mut Rng, base: usize, ratio: f64) -> usize {
    let lo = ((base as f64) * (1.0 - ratio)).round().max(1.0) as usize;
    let hi = ((base as f64) * (1.0 + ratio)).round().max(lo as f64) as usize;
    lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize
}

fn tokens(rng: &mut Rng, n: usize, vocab: u32) -> Vec<u32> {
    let lo = first_id(vocab);
    (0..n).map(|_| lo + (rng.next_u64() % (vocab.max(lo + 1) - lo) as u64) as u32).collect()
}

/// The lowest token id a random prompt uses: 1000 (past most special tokens), or the middle of a
/// vocabulary smaller than 2000.
pub fn first_id(vocab: u32) -> u32 {
    1000.min(vocab / 2)
}

const WORDS: [&str; 24] = [
    "river", "mountain", "history", "engine", "garden", "music", "winter", "ocean", "language",
    "bridge", "forest", "science", "market", "planet", "village", "library", "journey", "kitchen",
    "island", "window", "storm", "theatre", "harvest", "compass",
];

fn words(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[(rng.next_u64() % WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

/// `random`.
pub fn random(c: &WorkloadConfig) -> Vec<RequestSpec> {
    let mut rng = Rng::new(c.seed);
    (0..c.num_prompts)
        .map(|_| {
            let n = len(&mut rng, c.input_len, c.range_ratio);
            let out = len(&mut rng, c.output_len, c.range_ratio);
            RequestSpec {
                prompt: PromptBody::Tokens(tokens(&mut rng, n, c.vocab)),
                output_len: out,
                conversation: None,
            }
        })
        .collect()
}

/// `shared-prefix`.
pub fn shared_prefix(c: &WorkloadConfig) -> Vec<RequestSpec> {
    let mut rng = Rng::new(c.seed);
    let prefixes: Vec<Vec<u32>> =
        (0..c.num_prefixes.max(1)).map(|_| tokens(&mut rng, c.prefix_len, c.vocab)).collect();
    (0..c.num_prompts)
        .map(|_| {
            let mut p = prefixes[(rng.next_u64() % prefixes.len() as u64) as usize].clone();
            let n = len(&mut rng, c.input_len, c.range_ratio);
            p.extend(tokens(&mut rng, n, c.vocab));
            RequestSpec {
                prompt: PromptBody::Tokens(p),
                output_len: len(&mut rng, c.output_len, c.range_ratio),
                conversation: None,
            }
        })
        .collect()
}

/// `multi-turn`: `num_prompts / turns` conversations (at least one), turn after turn.
pub fn multi_turn(c: &WorkloadConfig) -> Vec<RequestSpec> {
    let mut rng = Rng::new(c.seed);
    let turns = c.turns.max(1);
    let convs = (c.num_prompts / turns).max(1);
    let mut out = Vec::with_capacity(convs * turns);
    for conv in 0..convs {
        for _ in 0..turns {
            // About one token per word with this vocabulary.
            let n = len(&mut rng, c.input_len, c.range_ratio);
            out.push(RequestSpec {
                prompt: PromptBody::ChatTurn(words(&mut rng, n)),
                output_len: len(&mut rng, c.output_len, c.range_ratio),
                conversation: Some(conv),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(r: &RequestSpec) -> &[u32] {
        match &r.prompt {
            PromptBody::Tokens(t) => t,
            PromptBody::ChatTurn(_) => panic!("not tokens"),
        }
    }

    #[test]
    fn random_lengths_and_seeds() {
        let c = WorkloadConfig {
            num_prompts: 200,
            input_len: 100,
            output_len: 50,
            range_ratio: 0.2,
            ..Default::default()
        };
        let a = random(&c);
        assert_eq!(a.len(), 200);
        assert!(a
            .iter()
            .all(|r| (80..=120).contains(&toks(r).len()) && (40..=60).contains(&r.output_len)));
        assert!(
            a.iter().any(|r| toks(r).len() < 90) && a.iter().any(|r| toks(r).len() > 110),
            "lengths spread over the range"
        );
        assert!(a.iter().all(|r| toks(r).iter().all(|&t| (1000..32000).contains(&t))));
        assert_eq!(a, random(&c), "same seed, same workload");
        assert_ne!(a, random(&WorkloadConfig { seed: 1, ..c.clone() }));
        let fixed = random(&WorkloadConfig { range_ratio: 0.0, ..c.clone() });
        assert!(fixed.iter().all(|r| toks(r).len() == 100 && r.output_len == 50));
        // A small vocabulary (a test model's 384 ids): ids stay inside it.
        let small = random(&WorkloadConfig { vocab: 384, ..c });
        assert!(small.iter().all(|r| toks(r).iter().all(|&t| (192..384).contains(&t))));
    }

    #[test]
    fn shared_prefixes_are_shared() {
        let c = WorkloadConfig {
            num_prompts: 64,
            num_prefixes: 4,
            prefix_len: 128,
            input_len: 16,
            ..Default::default()
        };
        let w = shared_prefix(&c);
        let mut prefixes: Vec<&[u32]> = w.iter().map(|r| &toks(r)[..128]).collect();
        prefixes.sort();
        prefixes.dedup();
        assert_eq!(prefixes.len(), 4, "every request starts with one of the 4 system prompts");
        assert!(w.iter().all(|r| toks(r).len() == 144));
        let mut suffixes: Vec<&[u32]> = w.iter().map(|r| &toks(r)[128..]).collect();
        suffixes.sort();
        suffixes.dedup();
        assert_eq!(suffixes.len(), 64, "user turns are distinct");
    }

    #[test]
    fn multi_turn_conversations() {
        let c = WorkloadConfig { num_prompts: 12, turns: 3, input_len: 10, ..Default::default() };
        let w = multi_turn(&c);
        assert_eq!(w.len(), 12);
        for conv in 0..4 {
            let turns: Vec<&RequestSpec> =
                w.iter().filter(|r| r.conversation == Some(conv)).collect();
            assert_eq!(turns.len(), 3);
            for t in turns {
                let PromptBody::ChatTurn(s) = &t.prompt else { panic!("chat turns") };
                assert_eq!(s.split(' ').count(), 10);
            }
        }
    }
}
