//! Sliding-window KV release: a model with local layers (Gemma 3: local and global layers;
//! Mistral: every layer local) keeps each local group's pages only while its window can see
//! them. The tokens and log-probabilities must equal those of the layout that keeps every page
//! (`hybrid_kv: false`) under prefix caching, chunked prefill, preemption by recompute and by
//! swap, n > 1 forks and speculative decoding; and the pages held must stay bounded by the
//! window on the local groups.

use std::collections::HashMap;
use std::path::PathBuf;

use tandem_engine::sampling::beam::BeamSearch;
use tandem_engine::scheduling::scheduler::{PreemptionMode, SchedulerConfig};
use tandem_engine::speculative::spec_decode::SpeculativeConfig;
use tandem_engine::{
    CompletionOutput, EngineConfig, KvCacheSize, LLMEngine, LoadOptions, Model, Prompt,
    SamplingParams,
};

/// Tokens per block (the tiny models' window is 16: four blocks).
const BS: usize = 4;

fn tiny(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)
}

fn engine(model: &str, hybrid: bool, kv_tokens: usize, cfg: EngineConfig) -> LLMEngine {
    let opts = LoadOptions {
        block_size: BS,
        kv_cache: KvCacheSize::Tokens(kv_tokens),
        swap_space_bytes: 4 << 20,
        hybrid_kv: hybrid,
        ..Default::default()
    };
    LLMEngine::new(Model::load(&tiny(model), opts).unwrap(), cfg)
}

/// Requests sharing prefixes (prefix-cache hits), long enough to pass the window many times.
fn requests(n: usize) -> Vec<(String, Vec<u32>, SamplingParams)> {
    (0..n)
        .map(|i| {
            let mut prompt: Vec<u32> = (0..37).map(|k| 3 + (k * 7 % 50)).collect();
            prompt.extend((0..(i as u32 * 5 % 11)).map(|k| 60 + k + i as u32));
            let params = SamplingParams {
                ignore_eos: true,
                logprobs: Some(1),
                ..SamplingParams::greedy(40 + 9 * (i % 5))
            };
            (format!("r{i}"), prompt, params)
        })
        .collect()
}

#[derive(Default)]
struct Run {
    out: HashMap<String, Vec<CompletionOutput>>,
    /// Most KV held at once, in layer-blocks (pages × layers a page holds: a page's bytes are
    /// proportional to its layers).
    peak_kv: usize,
    /// Whether some pages were ever swapped out to host blocks.
    swapped: bool,
    preemptions: u64,
}

/// Runs the requests in two waves: the second wave's prompts hit the prefix cache the first
/// filled, past the window (so the hit's passed local pages are not taken).
fn run(e: &mut LLMEngine, reqs: &[(String, Vec<u32>, SamplingParams)]) -> Run {
    let mut run = Run::default();
    let (first, second) = reqs.split_at(reqs.len().div_ceil(2));
    for wave in [first, second] {
        for (id, p, sp) in wave {
            e.add_request(id, Prompt::TokenIds(p.clone()), sp.clone(), None).unwrap();
        }
        drain(e, &mut run);
    }
    assert!(e.block_manager().stats().hits > 0, "the second wave hit the prefix cache");
    let bm = e.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks(), "every page back at the end");
    run.preemptions = e.stats().num_preemptions;
    run
}

fn drain(e: &mut LLMEngine, run: &mut Run) {
    let page_layers = e.kv_groups().layers_per_page;
    while e.has_unfinished_requests() {
        // Outputs are deltas: accumulate each completion's tokens and log-probs.
        for o in e.step().unwrap() {
            let entry = run.out.entry(o.request_id.clone()).or_default();
            for c in o.outputs {
                match entry.iter_mut().find(|x| x.index == c.index) {
                    Some(x) => {
                        x.token_ids.extend(c.token_ids);
                        x.logprobs.extend(c.logprobs);
                    }
                    None => entry.push(c),
                }
            }
            entry.sort_by_key(|x| x.index);
        }
        e.check_invariants().unwrap();
        let bm = e.block_manager();
        run.peak_kv = run.peak_kv.max((bm.num_blocks() - bm.num_free_blocks()) * page_layers);
        run.swapped |= bm.num_free_host_blocks() < bm.num_host_blocks();
    }
}

fn assert_same(a: &Run, b: &Run) {
    assert_eq!(a.out.len(), b.out.len());
    for (id, outs) in &a.out {
        let other = &b.out[id];
        assert_eq!(outs.len(), other.len());
        for (x, y) in outs.iter().zip(other) {
            assert!(x.token_ids.len() >= 40, "{id}: {} tokens", x.token_ids.len());
            assert_eq!(x.token_ids, y.token_ids, "{id}: tokens differ");
            assert_eq!(x.logprobs.len(), x.token_ids.len());
            for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
                assert!(
                    (p.chosen.logprob - q.chosen.logprob).abs() <= 1e-5,
                    "{id}: log-prob {} vs {}",
                    p.chosen.logprob,
                    q.chosen.logprob
                );
            }
        }
    }
}

fn compare(model: &str, kv_tokens: usize, cfg: EngineConfig, reqs: usize) -> (Run, Run) {
    let reqs = requests(reqs);
    // The reference keeps every page, in a pool large enough never to preempt.
    let reference = run(&mut engine(model, false, 8192, EngineConfig::default()), &reqs);
    let grouped = run(&mut engine(model, true, kv_tokens, cfg), &reqs);
    assert_same(&reference, &grouped);
    (reference, grouped)
}

/// The grouped run held at most 60 % of the KV the reference held.
fn assert_holds_less(reference: &Run, grouped: &Run) {
    assert!(
        grouped.peak_kv * 10 < reference.peak_kv * 6,
        "peak KV {} layer-blocks with release vs {} without",
        grouped.peak_kv,
        reference.peak_kv
    );
}

#[test]
fn gemma3_with_window_release_equals_keeping_every_page_and_holds_less() {
    let (reference, grouped) = compare("tiny-gemma3", 8192, EngineConfig::default(), 4);
    // tiny-gemma3: 2 local layers (window 16) and 1 global. Keeping every page, 4 sequences of
    // up to ~120 tokens hold all 3 layers of every token; released, the local layers hold a
    // window (plus the block being written and one partly passed) per sequence.
    assert_holds_less(&reference, &grouped);
}

#[test]
fn mistral_all_local_layers_release_too() {
    let (reference, grouped) = compare("tiny-mistral", 8192, EngineConfig::default(), 3);
    // A prompt's prefill chunk holds all its pages while it runs; decoding then keeps a window.
    assert_holds_less(&reference, &grouped);
}

#[test]
fn window_release_survives_preemption_by_recompute_and_by_swap() {
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        let scheduler = SchedulerConfig {
            preemption_mode: mode,
            max_num_batched_tokens: 24,
            ..Default::default()
        };
        let cfg = EngineConfig { scheduler, ..Default::default() };
        // A pool too small for the four of a wave at once: sequences are preempted and come
        // back (swapped out and in, in the swap mode).
        let (_, grouped) = compare("tiny-gemma3", 128, cfg, 8);
        assert!(grouped.preemptions > 0, "{mode:?}: no preemption happened");
        assert_eq!(grouped.swapped, mode == PreemptionMode::Swap, "{mode:?}");
    }
}

#[test]
fn window_release_with_forks_and_speculative_decoding() {
    // n = 2 seeded sampling: the completions fork the prompt's pages.
    let mut reqs = requests(2);
    for (_, _, p) in &mut reqs {
        *p = SamplingParams { n: 2, temperature: 0.8, seed: Some(7), ..p.clone() };
    }
    let reference = run(&mut engine("tiny-gemma3", false, 8192, EngineConfig::default()), &reqs);
    let grouped = run(&mut engine("tiny-gemma3", true, 8192, EngineConfig::default()), &reqs);
    assert_same(&reference, &grouped);
    // Speculative decoding (n-gram drafts, and the model's first layer as its own draft):
    // rejected drafts give back their pages; greedy output is the plain output.
    let reqs = requests(3);
    let plain = run(&mut engine("tiny-gemma3", false, 8192, EngineConfig::default()), &reqs);
    for draft_layers in [None, Some(1)] {
        let spec = SpeculativeConfig { draft_layers, disable_batch_size: 64, ..Default::default() };
        let cfg = EngineConfig { speculative: Some(spec), ..Default::default() };
        let spec_run = run(&mut engine("tiny-gemma3", true, 8192, cfg), &reqs);
        assert_same(&plain, &spec_run);
    }
}

#[test]
fn window_release_under_beam_search() {
    // Beams fork and wait for each other (held) while the window passes their blocks.
    let mut reqs = requests(2);
    for (_, _, p) in &mut reqs {
        *p = SamplingParams {
            n: 3,
            temperature: 0.0,
            max_tokens: 30,
            beam_search: Some(BeamSearch::default()),
            ..Default::default()
        };
    }
    let reference = run(&mut engine("tiny-gemma3", false, 8192, EngineConfig::default()), &reqs);
    let grouped = run(&mut engine("tiny-gemma3", true, 8192, EngineConfig::default()), &reqs);
    for (id, outs) in &reference.out {
        assert_eq!(outs.len(), 3, "{id}: three beams");
        for (x, y) in outs.iter().zip(&grouped.out[id]) {
            assert_eq!(x.token_ids.len(), 30, "{id}: beam length");
            assert_eq!(x.token_ids, y.token_ids, "{id}: beam tokens differ");
            assert!((x.cumulative_logprob - y.cumulative_logprob).abs() < 1e-4, "{id}");
        }
    }
    // Beams share the prompt's pages, so less is at stake than with separate sequences.
    assert!(grouped.peak_kv < reference.peak_kv, "{} vs {}", grouped.peak_kv, reference.peak_kv);
}

#[test]
fn a_separate_draft_model_is_refused_while_windows_give_pages_back() {
    let spec = SpeculativeConfig::default();
    let cfg = || EngineConfig { speculative: Some(spec), ..Default::default() };
    let draft = |hybrid: bool| {
        let opts = LoadOptions {
            block_size: BS,
            kv_cache: KvCacheSize::Tokens(8192),
            hybrid_kv: hybrid,
            ..Default::default()
        };
        Model::load(&tiny("tiny-gemma3"), opts).unwrap()
    };
    let mut e = engine("tiny-gemma3", true, 8192, cfg());
    let err = e.set_draft_model(draft(true)).unwrap_err().to_string();
    assert!(err.contains("sliding window"), "{err}");
    // With every page kept, the same draft is accepted.
    let mut e = engine("tiny-gemma3", false, 8192, cfg());
    e.set_draft_model(draft(false)).unwrap();
}

/// A sequence longer than the pool holds with every page kept runs when the local groups give
/// their passed pages back, and equals the same request in a pool large enough for every page.
/// The layout that keeps every page refuses it, and so does a prefill-only request (a prefill
/// worker keeps every page of a prompt until it is shipped).
#[test]
fn a_sequence_longer_than_the_pool_runs_while_its_window_gives_pages_back() {
    let scheduler = SchedulerConfig { max_num_batched_tokens: 8, ..Default::default() };
    let cfg = EngineConfig { scheduler, ..Default::default() };
    // tiny-gemma3: groups of one global and two local layers (window 16). 64 tokens' pages
    // are 48 pages; the local groups hold (16 + 8) / 4 + 1 = 7 pages each at most, which
    // leaves 34 blocks (136 tokens) for the global group.
    let mut grouped = engine("tiny-gemma3", true, 64, cfg);
    assert_eq!((grouped.max_model_len(), grouped.max_prefill_only_len()), (136, 64));
    let mut every = engine("tiny-gemma3", false, 64, cfg);
    assert_eq!((every.max_model_len(), every.max_prefill_only_len()), (64, 64));

    let prompt: Vec<u32> = (0..40).map(|k| 3 + (k * 11 % 70)).collect();
    let params =
        SamplingParams { ignore_eos: true, logprobs: Some(1), ..SamplingParams::greedy(96) };
    let req = vec![("long".to_string(), prompt.clone(), params.clone())];
    let err = every.add_request("long", Prompt::TokenIds(prompt.clone()), params.clone(), None);
    assert!(err.unwrap_err().to_string().contains("maximum context length is 64"));

    let mut got = Run::default();
    grouped.add_request("long", Prompt::TokenIds(prompt.clone()), params.clone(), None).unwrap();
    drain(&mut grouped, &mut got);
    assert_eq!(got.out["long"][0].token_ids.len(), 96, "136 tokens in a pool of 64");
    let bm = grouped.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks(), "every page back at the end");
    let mut reference = Run::default();
    let mut big = engine("tiny-gemma3", false, 8192, EngineConfig::default());
    for (id, p, sp) in &req {
        big.add_request(id, Prompt::TokenIds(p.clone()), sp.clone(), None).unwrap();
    }
    drain(&mut big, &mut reference);
    assert_same(&reference, &got);

    // A prefill-only prompt must fit with every page.
    let opts = |_| tandem_engine::RequestOptions { prefill_only: true, ..Default::default() };
    let long: Vec<u32> = (0..70).map(|k| 3 + (k * 7 % 50)).collect();
    let err =
        grouped.add_request_with("p1", Prompt::TokenIds(long), SamplingParams::greedy(1), opts(()));
    assert!(err.unwrap_err().to_string().contains("at most 64 prompt tokens"));
    grouped
        .add_request_with("p2", Prompt::TokenIds(prompt), SamplingParams::greedy(1), opts(()))
        .unwrap();
}
