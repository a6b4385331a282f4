//! LLMEngine behaviour on the default model (exact path): batch invariance, preemption by
//! recompute and by swap, prefix caching, chunked prefill that never stalls decodes, n > 1
//! sharing the prompt's blocks, abort, stop strings, min_tokens, penalties, seeds, log-probs.
//! No timing assertions: every check is on tokens, counters or per-step schedules.

use std::collections::HashMap;
use std::path::PathBuf;

use tandem_engine::scheduling::request_output::StopReason;
use tandem_engine::scheduling::scheduler::{PreemptionMode, SchedulerConfig};
use tandem_engine::{
    model_files::model_fetch, score, CompletionOutput, EngineConfig, FinishReason, KvCacheSize,
    LLMEngine, LoadOptions, Model, Prompt, SamplingParams,
};

fn model_path() -> PathBuf {
    model_fetch::default_model_path().unwrap()
}

fn engine_with(kv_tokens: usize, swap_tokens: usize, cfg: EngineConfig) -> LLMEngine {
    // f32 K and V for 30 layers x 3 heads x 64 dims.
    let per_token = 2 * 30 * 3 * 64 * 4;
    let opts = LoadOptions {
        kv_cache: KvCacheSize::Tokens(kv_tokens),
        swap_space_bytes: (swap_tokens * per_token) as u64,
        ..Default::default()
    };
    LLMEngine::new(Model::load(&model_path(), opts).unwrap(), cfg)
}

fn engine() -> LLMEngine {
    engine_with(4096, 0, EngineConfig::default())
}

const PROMPTS: [&str; 16] = [
    "The capital of France is",
    "def add(a, b):\n    return",
    "Once upon a time",
    "The three primary colors are",
    "In mathematics, a prime number is",
    "List of fruits: apple, banana,",
    "The quick brown fox",
    "import numpy as np\nx = np.",
    "Water boils at",
    "My favourite book is",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "SELECT * FROM",
    "Les chats sont",
    "1, 2, 3, 4,",
    "Dear Sir or Madam,",
];

fn tokens(e: &LLMEngine, text: &str) -> Vec<u32> {
    e.tokenizer.encode(text, true).unwrap()
}

fn run(
    e: &mut LLMEngine,
    reqs: &[(&str, Vec<u32>, SamplingParams)],
) -> HashMap<String, Vec<CompletionOutput>> {
    for (id, p, sp) in reqs {
        e.add_request(id, Prompt::TokenIds(p.clone()), sp.clone(), None).unwrap();
    }
    let out = e.run_to_completion().unwrap();
    e.check_invariants().unwrap();
    out
}

fn greedy_ids(out: &HashMap<String, Vec<CompletionOutput>>, id: &str) -> Vec<u32> {
    out[id][0].token_ids.clone()
}

#[test]
fn batch_invariance_sixteen_prompts() {
    let mut e = engine();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(24) };
    let reqs: Vec<(String, Vec<u32>)> =
        PROMPTS.iter().enumerate().map(|(i, p)| (format!("r{i}"), tokens(&e, p))).collect();
    let all: Vec<(&str, Vec<u32>, SamplingParams)> =
        reqs.iter().map(|(id, p)| (id.as_str(), p.clone(), params.clone())).collect();
    let together = run(&mut e, &all);
    assert_eq!(e.block_manager().num_free_blocks(), e.block_manager().num_blocks());
    for (id, p) in &reqs {
        let alone = run(&mut e, &[(id.as_str(), p.clone(), params.clone())]);
        assert_eq!(greedy_ids(&together, id), greedy_ids(&alone, id), "{id}");
    }
}

fn preemption_case(mode: PreemptionMode, zero_freed_blocks: bool) {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(40) };
    let mut free = engine();
    let reqs: Vec<(String, Vec<u32>)> =
        PROMPTS[..8].iter().enumerate().map(|(i, p)| (format!("r{i}"), tokens(&free, p))).collect();
    let all: Vec<(&str, Vec<u32>, SamplingParams)> =
        reqs.iter().map(|(id, p)| (id.as_str(), p.clone(), params.clone())).collect();
    let reference = run(&mut free, &all);
    // 8 sequences of ~50 tokens need ~32 blocks of 16; give them 12.
    let cfg = EngineConfig {
        scheduler: SchedulerConfig { preemption_mode: mode, ..Default::default() },
        enable_prefix_caching: false,
        speculative: None,
        zero_freed_blocks,
        ..Default::default()
    };
    let mut tight = engine_with(12 * 16, 64 * 16, cfg);
    let out = run(&mut tight, &all);
    assert!(tight.stats().num_preemptions > 0, "the pool was meant to be too small");
    for (id, _) in &reqs {
        assert_eq!(
            greedy_ids(&out, id),
            greedy_ids(&reference, id),
            "{id} under {mode:?}, zeroing {zero_freed_blocks}"
        );
        assert_eq!(out[id][0].finish_reason, Some(FinishReason::Length));
    }
    let bm = tight.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks());
    assert_eq!(bm.num_free_host_blocks(), bm.num_host_blocks());
}

#[test]
fn preemption_by_recompute_completes_everything_identically() {
    preemption_case(PreemptionMode::Recompute, false);
}

#[test]
fn preemption_by_swap_completes_everything_identically() {
    preemption_case(PreemptionMode::Swap, false);
}

/// Secure mode under preemption: blocks freed mid-schedule (swap-out, recompute) are zeroed
/// after their copies and before reuse, so every output is unchanged.
#[test]
fn zeroing_freed_blocks_under_preemption_changes_no_output() {
    preemption_case(PreemptionMode::Swap, true);
    preemption_case(PreemptionMode::Recompute, true);
}

/// Secure mode: once requests finish (or are aborted) every KV block reads back as zeros and
/// nothing stays in the prefix cache; without it, the finished request's KV stays for reuse.
#[test]
fn secure_mode_zeroes_freed_blocks() {
    let params = SamplingParams::greedy(8);
    let prompt =
        "You are a careful assistant. Answer briefly and cite the source of every claim you make. "
            .repeat(3);
    let zero_page = |e: &LLMEngine, b: u32| e.read_kv_block(b).unwrap().iter().all(|&x| x == 0);
    for secure in [false, true] {
        let mut e = engine_with(
            64 * 16,
            0,
            EngineConfig { zero_freed_blocks: secure, ..Default::default() },
        );
        let p = tokens(&e, &prompt);
        run(&mut e, &[("a", p.clone(), params.clone())]);
        e.add_request("b", Prompt::TokenIds(p.clone()), params.clone(), None).unwrap();
        e.step().unwrap();
        e.abort_request("b");
        e.step().unwrap();
        let n = e.block_manager().num_blocks() as u32;
        let dirty = (0..n).filter(|&b| !zero_page(&e, b)).count();
        if secure {
            assert_eq!(dirty, 0, "{dirty} blocks still hold KV");
            assert!(e.block_manager().cached_hashes().is_empty(), "nothing cached in secure mode");
        } else {
            assert!(dirty > 0, "without secure mode the KV stays (for the prefix cache)");
        }
    }
}

#[test]
fn prefix_cache_computes_only_uncached_tokens() {
    let mut e = engine();
    let prefix: String =
        "You are a careful assistant. Answer briefly and cite the source of every claim you make. "
            .repeat(7);
    let a = tokens(&e, &format!("{prefix}Question: what is the boiling point of water?"));
    let b = tokens(&e, &format!("{prefix}Question: who wrote Hamlet?"));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared >= 100, "shared prefix is {shared} tokens");
    let params = SamplingParams::greedy(12);
    run(&mut e, &[("a", a.clone(), params.clone())]);
    let before = e.stats();
    let warm = run(&mut e, &[("b", b.clone(), params.clone())]);
    let after = e.stats();
    let cached = shared / 16 * 16;
    assert_eq!(
        after.prefill_tokens_computed - before.prefill_tokens_computed,
        (b.len() - cached) as u64
    );
    assert_eq!(after.prefix_cache_hits - before.prefix_cache_hits, (shared / 16) as u64);
    let mut cold_engine =
        engine_with(4096, 0, EngineConfig { enable_prefix_caching: false, ..Default::default() });
    let cold = run(&mut cold_engine, &[("b", b, params)]);
    assert_eq!(greedy_ids(&warm, "b"), greedy_ids(&cold, "b"));
    assert_eq!(warm["b"][0].text, cold["b"][0].text);
}

#[test]
fn chunked_prefill_does_not_stall_decodes() {
    let cfg = EngineConfig {
        scheduler: SchedulerConfig { max_num_batched_tokens: 256, ..Default::default() },
        ..Default::default()
    };
    let mut e = engine_with(4096, 0, cfg);
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(60) };
    for (i, p) in PROMPTS[..8].iter().enumerate() {
        e.add_request(&format!("d{i}"), Prompt::Text(p.to_string()), params.clone(), None).unwrap();
    }
    // Let the eight reach decoding.
    for _ in 0..3 {
        e.step().unwrap();
    }
    let long: Vec<u32> = (0..2000u32).map(|i| 100 + (i * 7919) % 40000).collect();
    e.add_request("long", Prompt::TokenIds(long), SamplingParams::greedy(4), None).unwrap();
    let mut prefill_steps = 0;
    let mut long_done = false;
    while !long_done {
        let outs = e.step().unwrap();
        let plan = e.last_schedule();
        let decodes = plan.scheduled.iter().filter(|s| s.num_tokens == 1).count();
        let chunk = plan.scheduled.iter().map(|s| s.num_tokens).max().unwrap();
        // Every one of the eight decoding sequences got its token in this step.
        assert_eq!(decodes, 8, "step {prefill_steps}: {plan:?}");
        assert!(plan.num_batched_tokens <= 256);
        assert!(chunk <= 256 - 8);
        prefill_steps += 1;
        long_done = outs.iter().any(|o| o.request_id == "long" && !o.outputs.is_empty());
    }
    assert!(prefill_steps >= 2000 / 248, "the 2000-token prompt must be split into chunks");
    for i in 0..8 {
        e.abort_request(&format!("d{i}"));
    }
    e.abort_request("long");
    e.step().unwrap();
    assert!(!e.has_unfinished_requests());
    assert_eq!(e.block_manager().num_free_blocks(), e.block_manager().num_blocks());
}

#[test]
fn n_completions_share_the_prompt_blocks() {
    let mut e = engine();
    let prompt = tokens(&e, &"The history of the Roman Empire spans many centuries and ".repeat(3));
    let prompt_blocks = prompt.len().div_ceil(16);
    let params = SamplingParams {
        n: 4,
        temperature: 1.0,
        seed: Some(11),
        max_tokens: 12,
        ignore_eos: true,
        ..Default::default()
    };
    e.add_request("n4", Prompt::TokenIds(prompt), params, None).unwrap();
    // The prompt is prefilled in one step; the four completions are forked from it.
    e.step().unwrap();
    let bm = e.block_manager();
    assert_eq!(
        bm.num_blocks() - bm.num_free_blocks(),
        prompt_blocks,
        "forks must not copy the prompt"
    );
    assert_eq!(e.queue_lengths().1, 4);
    let out = e.run_to_completion().unwrap();
    let c = &out["n4"];
    assert_eq!(c.iter().map(|o| o.index).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    // The first token comes from the first step's output; the rest from here.
    assert!(c
        .iter()
        .all(|o| o.token_ids.len() == 11 && o.finish_reason == Some(FinishReason::Length)));
    let distinct: std::collections::HashSet<_> = c.iter().map(|o| o.token_ids.clone()).collect();
    assert!(distinct.len() > 1, "four samples at temperature 1 should differ");
    assert_eq!(e.block_manager().num_free_blocks(), e.block_manager().num_blocks());
}

#[test]
fn abort_from_every_state_frees_everything() {
    let cfg = EngineConfig {
        scheduler: SchedulerConfig { max_num_seqs: 2, ..Default::default() },
        ..Default::default()
    };
    let mut e = engine_with(4096, 0, cfg);
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(50) };
    for (i, prompt) in PROMPTS.iter().take(4).enumerate() {
        e.add_request(&format!("a{i}"), Prompt::Text(prompt.to_string()), p.clone(), None).unwrap();
    }
    e.step().unwrap();
    e.step().unwrap();
    assert_eq!(e.queue_lengths(), (2, 2, 0));
    assert!(e.abort_request("a0")); // running
    assert!(e.abort_request("a3")); // waiting
    assert!(!e.abort_request("nope"));
    let outs = e.step().unwrap();
    for id in ["a0", "a3"] {
        let o = outs.iter().find(|o| o.request_id == id).expect("abort output");
        assert!(o.finished);
        assert_eq!(o.outputs[0].finish_reason, Some(FinishReason::Abort));
    }
    assert_eq!(e.get_num_unfinished_requests(), 2);
    e.run_to_completion().unwrap();
    e.check_invariants().unwrap();
    assert_eq!(e.block_manager().num_free_blocks(), e.block_manager().num_blocks());
}

#[test]
fn stop_strings_match_across_token_boundaries() {
    let mut e = engine();
    let prompt = tokens(&e, "The capital of France is");
    let free = run(
        &mut e,
        &[("f", prompt.clone(), SamplingParams { ignore_eos: true, ..SamplingParams::greedy(24) })],
    );
    let ids = greedy_ids(&free, "f");
    let full = free["f"][0].text.clone();
    // A stop string made of the last character of one token and the first of the next.
    let pieces: Vec<String> =
        ids.iter().map(|&t| e.tokenizer.decode(&[t], true).unwrap()).collect();
    let k = (3..pieces.len() - 1)
        .find(|&k| !pieces[k].is_empty() && !pieces[k + 1].is_empty() && !pieces[k].ends_with(' '))
        .unwrap();
    let stop =
        format!("{}{}", pieces[k].chars().last().unwrap(), pieces[k + 1].chars().next().unwrap());
    let at = full.find(&stop).unwrap();
    for include in [false, true] {
        let params = SamplingParams {
            stop: vec![stop.clone()],
            include_stop_str_in_output: include,
            ignore_eos: true,
            ..SamplingParams::greedy(24)
        };
        e.add_request("s", Prompt::TokenIds(prompt.clone()), params, None).unwrap();
        let mut streamed = String::new();
        let mut last = None;
        while e.has_unfinished_requests() {
            for o in e.step().unwrap() {
                for c in o.outputs {
                    streamed.push_str(&c.text);
                    if c.finish_reason.is_some() {
                        last = Some(c);
                    }
                }
            }
        }
        let last = last.unwrap();
        let want = if include { &full[..at + stop.len()] } else { &full[..at] };
        assert_eq!(streamed, want, "stop {stop:?} include={include}");
        assert_eq!(last.finish_reason, Some(FinishReason::Stop));
        assert_eq!(last.stop_reason, Some(StopReason::Str(stop.clone())));
    }
}

#[test]
fn min_tokens_defers_end_of_sequence() {
    let mut e = engine();
    let chat = e
        .chat_template
        .as_ref()
        .unwrap()
        .render(&[tandem_engine::ChatMessage::new("user", "Say hi.")], true)
        .unwrap();
    let prompt = tokens(&e, &chat);
    let natural = run(&mut e, &[("n", prompt.clone(), SamplingParams::greedy(64))]);
    let n = &natural["n"][0];
    assert_eq!(n.finish_reason, Some(FinishReason::Stop));
    let len = n.token_ids.len();
    let min = len + 5;
    let forced = run(
        &mut e,
        &[("m", prompt, SamplingParams { min_tokens: min, ..SamplingParams::greedy(64) })],
    );
    let m = &forced["m"][0];
    assert!(m.token_ids.len() >= min, "{} < {min}", m.token_ids.len());
    assert!(!m.token_ids[..min].iter().any(|t| e.tokenizer.eos_token_ids.contains(t)));
    // Identical up to where the natural run emitted end-of-sequence.
    assert_eq!(m.token_ids[..len - 1], n.token_ids[..len - 1]);
}

#[test]
fn penalties_reduce_repetition() {
    let mut e = engine();
    let prompt = tokens(&e, "apple apple apple apple apple apple apple apple");
    let base = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(24) };
    let plain = run(&mut e, &[("p", prompt.clone(), base.clone())]);
    let max_count = |ids: &[u32]| {
        let mut c: HashMap<u32, usize> = HashMap::new();
        ids.iter().for_each(|t| *c.entry(*t).or_default() += 1);
        c.values().copied().max().unwrap()
    };
    for (name, p) in [
        ("frequency", SamplingParams { frequency_penalty: 1.5, ..base.clone() }),
        ("presence", SamplingParams { presence_penalty: 2.0, ..base.clone() }),
        ("repetition", SamplingParams { repetition_penalty: 1.8, ..base.clone() }),
    ] {
        let out = run(&mut e, &[(name, prompt.clone(), p)]);
        let (a, b) = (greedy_ids(&plain, "p"), greedy_ids(&out, name));
        assert_ne!(a, b, "{name} penalty changed nothing");
        assert!(max_count(&b) < max_count(&a), "{name}: {} vs {}", max_count(&b), max_count(&a));
    }
}

#[test]
fn seeds_fix_sampled_outputs() {
    let mut e = engine();
    let prompt = tokens(&e, "Once upon a time");
    let p = |seed| SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens: 16,
        ignore_eos: true,
        ..Default::default()
    };
    let a = run(&mut e, &[("a", prompt.clone(), p(42))]);
    // Same seed inside a batch with other requests: same output.
    let hello = tokens(&e, "Hello");
    let b = run(
        &mut e,
        &[("b", prompt.clone(), p(42)), ("x", hello, p(1)), ("y", prompt.clone(), p(43))],
    );
    assert_eq!(greedy_ids(&a, "a"), greedy_ids(&b, "b"));
    assert_ne!(greedy_ids(&b, "b"), greedy_ids(&b, "y"));
}

#[test]
fn logprobs_are_the_models_own() {
    let mut e = engine();
    let prompt = tokens(&e, "Water boils at");
    let out = run(
        &mut e,
        &[(
            "l",
            prompt.clone(),
            SamplingParams { logprobs: Some(5), ignore_eos: true, ..SamplingParams::greedy(8) },
        )],
    );
    let c = &out["l"][0];
    assert_eq!(c.logprobs.len(), 8);
    let mut m = Model::load(&model_path(), LoadOptions::with_kv_tokens(256)).unwrap();
    let mut all = prompt.clone();
    all.extend(&c.token_ids);
    let reference = score(&mut m, &all).unwrap();
    let mut sum = 0.0;
    for (i, lp) in c.logprobs.iter().enumerate() {
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.top[0].token_id, lp.chosen.token_id, "greedy picks the top token");
        assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        let want = reference[prompt.len() - 1 + i][lp.chosen.token_id as usize];
        assert!((lp.chosen.logprob - want).abs() < 1e-4, "{i}: {} vs {want}", lp.chosen.logprob);
        sum += lp.chosen.logprob as f64;
    }
    assert!((c.cumulative_logprob - sum).abs() < 1e-3);
}

#[test]
fn invalid_requests_are_refused() {
    let mut e = engine_with(256, 0, EngineConfig::default());
    let err = |e: &mut LLMEngine, p: Prompt, sp: SamplingParams| {
        e.add_request("x", p, sp, None).unwrap_err().to_string()
    };
    assert!(err(&mut e, Prompt::TokenIds(vec![]), SamplingParams::default()).contains("empty"));
    assert!(err(&mut e, Prompt::TokenIds(vec![999_999]), SamplingParams::default())
        .contains("outside the vocabulary"));
    assert!(err(&mut e, Prompt::TokenIds(vec![5; 250]), SamplingParams::greedy(10))
        .contains("maximum context length is 256"));
    assert!(err(
        &mut e,
        Prompt::Text("hi".into()),
        SamplingParams { top_p: 2.0, ..Default::default() }
    )
    .contains("top_p"));
    e.add_request("dup", Prompt::Text("hi".into()), SamplingParams::default(), None).unwrap();
    assert!(e
        .add_request("dup", Prompt::Text("hi".into()), SamplingParams::default(), None)
        .unwrap_err()
        .to_string()
        .contains("already in use"));
}

/// The fast kernels over a prompt longer than the step budget: the chunks that end mid-prompt
/// ask for no logits rows (a zero-row matmul), and the output equals an unchunked run.
#[test]
fn fast_kernels_chunked_prefill_of_a_long_prompt() {
    let load = |budget: usize, chunked: bool| {
        let opts = LoadOptions {
            kernel: tandem_engine::backend::KernelPath::Fast,
            kv_cache: KvCacheSize::Tokens(2048),
            swap_space_bytes: 0,
            ..Default::default()
        };
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_batched_tokens: budget,
                enable_chunked_prefill: chunked,
                ..Default::default()
            },
            ..Default::default()
        };
        LLMEngine::new(Model::load(&model_path(), opts).unwrap(), cfg)
    };
    let mut chunked = load(128, true);
    let prompt = tokens(
        &chunked,
        &"Rivers carry water from the mountains to the sea, shaping valleys on the way. "
            .repeat(30),
    );
    assert!(prompt.len() > 3 * 128, "{} tokens", prompt.len());
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let a = run(&mut chunked, &[("r", prompt.clone(), p.clone())]);
    let mut whole = load(2048, false);
    let b = run(&mut whole, &[("r", prompt, p)]);
    assert_eq!(greedy_ids(&a, "r").len(), 8);
    assert_eq!(greedy_ids(&a, "r"), greedy_ids(&b, "r"));
}
