//! Beam search in the engine: the beams are copy-on-write forks that share their prompt's
//! blocks; the search returns what a brute-force search over teacher-forced passes of the same
//! model returns, also when its beams are preempted under memory pressure, and gives every
//! block back at the end.

use std::collections::HashSet;

use tandem_engine::sampling::beam::BeamSearch;
use tandem_engine::scheduling::scheduler::{PreemptionMode, SchedulerConfig};
use tandem_engine::{
    beam_search_by_scoring, model_files::model_fetch, CompletionOutput, EngineConfig, KvCacheSize,
    LLMEngine, LoadOptions, Model, Prompt, SamplingParams,
};

const PROMPT: &str = "Here is some advice that my grandmother gave me when I was young, and that I have kept with me ever since: the best way to learn is";

fn load(tokens: usize) -> Model {
    let opts = LoadOptions { kv_cache: KvCacheSize::Tokens(tokens), ..Default::default() };
    Model::load(&model_fetch::default_model_path().unwrap(), opts).unwrap()
}

fn beams(width: usize, steps: usize) -> SamplingParams {
    SamplingParams {
        n: width,
        temperature: 0.0,
        max_tokens: steps,
        beam_search: Some(BeamSearch::default()),
        ..Default::default()
    }
}

fn assert_same(got: &[CompletionOutput], want: &[(Vec<u32>, f64)]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, (toks, cum))) in got.iter().zip(want).enumerate() {
        assert_eq!(g.index, i);
        assert_eq!(&g.token_ids, toks, "beam {i}: {:?}", g.text);
        assert!(
            (g.cumulative_logprob - cum).abs() < 1e-3,
            "beam {i}: {} vs {cum}",
            g.cumulative_logprob
        );
    }
}

#[test]
fn beams_fork_share_their_blocks_and_equal_a_brute_force_search() {
    let (width, steps) = (4, 6);
    let mut reference = load(1024);
    let prompt = reference.tokenizer.encode(PROMPT, true).unwrap();
    let want = beam_search_by_scoring(&mut reference, &prompt, width, steps, 1.0).unwrap();

    let mut e = LLMEngine::new(load(4096), EngineConfig::default());
    let bs = e.block_manager().block_size();
    let total = e.block_manager().num_blocks();
    e.add_request("beams", Prompt::TokenIds(prompt.clone()), beams(width, steps), None).unwrap();
    let mut got = None;
    let mut most_saved = 0;
    while e.has_unfinished_requests() {
        for out in e.step().unwrap() {
            assert!(out.finished, "a beam search answers once, at its end");
            got = Some(out.outputs);
        }
        let Some(tables) = e.request_tables("beams") else { continue };
        // Every live beam holds the prompt's full blocks: the same blocks, held once.
        let full = prompt.len() / bs;
        for t in &tables {
            assert_eq!(t[..full], tables[0][..full], "the prompt's blocks are shared");
        }
        let distinct: HashSet<u32> = tables.iter().flatten().copied().collect();
        let held: usize = tables.iter().map(Vec::len).sum();
        let used = total - e.block_manager().num_free_blocks();
        assert_eq!(used, distinct.len(), "the blocks in use are the beams' distinct blocks");
        most_saved = most_saved.max(held - distinct.len());
        e.check_invariants().unwrap();
    }
    println!("beams held up to {most_saved} blocks fewer than unshared copies would");
    assert!(most_saved >= (width - 1) * (prompt.len() / bs), "{most_saved}");
    assert_same(&got.expect("the search answered"), &want);
    assert_eq!(e.block_manager().num_free_blocks(), total, "every block is free again");
    e.check_invariants().unwrap();
}

#[test]
fn preempted_beams_wait_for_each_other_and_find_the_same_beams() {
    let (width, steps) = (4, 24);
    let mut calm = LLMEngine::new(load(4096), EngineConfig::default());
    let prompt = calm.tokenizer.encode(PROMPT, true).unwrap();
    calm.add_request("beams", Prompt::TokenIds(prompt.clone()), beams(width, steps), None).unwrap();
    let want = calm.run_to_completion().unwrap().remove("beams").unwrap();

    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        // Room for the search alone, not for it and two long greedy requests beside it.
        let config = EngineConfig {
            scheduler: SchedulerConfig { preemption_mode: mode, ..Default::default() },
            ..Default::default()
        };
        let mut e = LLMEngine::new(load(256), config);
        let filler: Vec<u32> = (0..70u32).map(|i| 200 + i * 37).collect();
        for i in 0..2 {
            let p = Prompt::TokenIds(filler.iter().map(|t| t + i).collect());
            e.add_request(&format!("greedy{i}"), p, SamplingParams::greedy(60), None).unwrap();
        }
        e.add_request("beams", Prompt::TokenIds(prompt.clone()), beams(width, steps), None)
            .unwrap();
        let got = e.run_to_completion().unwrap().remove("beams").unwrap();
        let preempted = e.stats().num_preemptions;
        println!("{mode:?}: {preempted} preemptions");
        assert!(preempted > 0, "{mode:?}: the cache was tight enough to preempt");
        let want: Vec<(Vec<u32>, f64)> =
            want.iter().map(|o| (o.token_ids.clone(), o.cumulative_logprob)).collect();
        assert_same(&got, &want);
        let bm = e.block_manager();
        assert_eq!(bm.num_free_blocks(), bm.num_blocks(), "{mode:?}: no block leaked");
        e.check_invariants().unwrap();
    }
}

#[test]
fn a_search_that_cannot_fit_is_refused_and_an_abort_frees_the_beams() {
    let mut e = LLMEngine::new(load(256), EngineConfig::default());
    let prompt = e.tokenizer.encode(PROMPT, true).unwrap();
    let err = e
        .add_request("big", Prompt::TokenIds(prompt.clone()), beams(10, 100), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("beam search of width 10"), "{err}");
    let bad = SamplingParams { temperature: 0.7, ..beams(2, 4) };
    let err = e.add_request("hot", Prompt::TokenIds(prompt.clone()), bad, None).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");

    e.add_request("beams", Prompt::TokenIds(prompt), beams(3, 8), None).unwrap();
    for _ in 0..4 {
        e.step().unwrap();
    }
    assert!(e.request_tables("beams").is_some_and(|t| t.len() > 1), "beams forked");
    assert!(e.abort_request("beams"));
    let outs = e.step().unwrap();
    assert!(outs.iter().any(|o| o.request_id == "beams" && o.finished));
    assert!(!e.has_unfinished_requests());
    let bm = e.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks());
    e.check_invariants().unwrap();
}
