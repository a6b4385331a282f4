//! The decode side of disaggregated prefill: KV pages computed by another backend are written
//! into the blocks the engine reserved, and the request continues from the shipped first token.
//! Outputs equal a colocated run; failures recompute locally or abort; blocks always return.

use tandem_engine::backend::{ForwardBatch, Logits};
use tandem_engine::sampling::sampler::{sample, Rng};
use tandem_engine::{
    model_files::model_fetch, CompletionOutput, EngineConfig, FinishReason, LLMEngine, LoadOptions,
    Model, Prompt, RequestOptions, SamplingParams,
};

fn model() -> Model {
    Model::load(&model_fetch::default_model_path().unwrap(), LoadOptions::with_kv_tokens(1024))
        .unwrap()
}

fn engine() -> LLMEngine {
    LLMEngine::new(model(), EngineConfig::default())
}

fn params() -> SamplingParams {
    SamplingParams { ignore_eos: true, logprobs: Some(2), ..SamplingParams::greedy(20) }
}

fn collect(e: &mut LLMEngine, id: &str) -> CompletionOutput {
    let mut acc: Option<CompletionOutput> = None;
    let mut finished = false;
    for _ in 0..10_000 {
        if finished {
            break;
        }
        for out in e.step().unwrap() {
            assert_eq!(out.request_id, id);
            finished |= out.finished;
            for o in out.outputs {
                match acc.as_mut() {
                    None => acc = Some(o),
                    Some(a) => {
                        a.token_ids.extend(o.token_ids);
                        a.text.push_str(&o.text);
                        a.logprobs.extend(o.logprobs);
                        a.finish_reason = o.finish_reason.or(a.finish_reason);
                    }
                }
            }
        }
    }
    acc.unwrap()
}

/// Prefill worker stand-in: computes the prompt's KV on its own backend, samples the first token
/// and returns `(first token, pages)`.
fn remote_prefill(
    prefill: &mut Model,
    prompt: &[u32],
) -> (tandem_engine::sampling::sampler::SampledToken, Vec<Vec<u8>>) {
    let bs = prefill.backend.kv_cache_spec().block_size;
    let table: Vec<u32> = (0..prompt.len().div_ceil(bs) as u32).collect();
    let mut b = ForwardBatch::default();
    b.push_seq(prompt, 0, &table, bs, Logits::Last);
    let logits = prefill.backend.forward(&b).unwrap();
    let first = sample(&logits, &params(), &mut Rng::new(0));
    let pages = table.iter().map(|&blk| prefill.backend.read_block(blk).unwrap()).collect();
    (first, pages)
}

fn colocated(prompt: &[u32]) -> CompletionOutput {
    let mut e = engine();
    e.add_request("r", Prompt::TokenIds(prompt.to_vec()), params(), None).unwrap();
    collect(&mut e, "r")
}

#[test]
fn decode_after_remote_prefill_equals_colocated() {
    let mut prefill = model();
    let mut dec = engine();
    let prompt = dec
        .tokenizer
        .encode(
            "Write a short story about a lighthouse keeper who finds a message in a bottle.",
            false,
        )
        .unwrap();
    let (first, pages) = remote_prefill(&mut prefill, &prompt);
    let baseline = dec.block_manager().num_free_blocks();
    let rp = dec
        .add_remote_prefill(
            "r",
            Prompt::TokenIds(prompt.clone()),
            params(),
            RequestOptions::default(),
        )
        .unwrap()
        .expect("blocks available");
    assert_eq!(rp.num_cached_tokens, 0);
    assert_eq!(rp.block_table.len(), pages.len());
    // Nothing is scheduled while the pages are in flight.
    assert!(dec.step().unwrap().is_empty());
    for (i, page) in pages.iter().enumerate() {
        dec.write_kv_block(rp.block_table[i], page).unwrap();
    }
    dec.finish_remote_prefill("r", first).unwrap();
    let got = collect(&mut dec, "r");
    let want = colocated(&prompt);
    assert_eq!(got.token_ids, want.token_ids);
    assert_eq!(got.text, want.text);
    assert_eq!(got.finish_reason, Some(FinishReason::Length));
    assert!((got.logprobs[0].chosen.logprob - want.logprobs[0].chosen.logprob).abs() < 1e-4);
    dec.check_invariants().unwrap();
    assert_eq!(dec.block_manager().num_free_blocks(), baseline);
}

#[test]
fn decode_side_prefix_hits_need_only_the_suffix_pages() {
    let mut prefill = model();
    let mut dec = engine();
    let system =
        "You are a careful assistant. Answer briefly and cite the source of every claim you make. "
            .repeat(3);
    let warm = dec
        .tokenizer
        .encode(&format!("{system}Question: what is the boiling point of water?"), false)
        .unwrap();
    dec.add_request("warm", Prompt::TokenIds(warm), SamplingParams::greedy(2), None).unwrap();
    collect(&mut dec, "warm");
    let prompt =
        dec.tokenizer.encode(&format!("{system}Question: who wrote Hamlet?"), false).unwrap();
    let (first, pages) = remote_prefill(&mut prefill, &prompt);
    let rp = dec
        .add_remote_prefill(
            "r",
            Prompt::TokenIds(prompt.clone()),
            params(),
            RequestOptions::default(),
        )
        .unwrap()
        .unwrap();
    assert!(rp.num_cached_tokens >= 48, "cached {}", rp.num_cached_tokens);
    let skip = rp.num_cached_tokens / 16;
    for (&block, page) in rp.block_table.iter().zip(&pages).skip(skip) {
        dec.write_kv_block(block, page).unwrap();
    }
    let first_id = first.chosen.token_id;
    dec.finish_remote_prefill("r", first).unwrap();
    // The first token is news at once, without a forward pass.
    let early = dec.take_pending_outputs();
    assert!(!dec.has_pending_outputs());
    assert_eq!(early.len(), 1);
    assert!(!early[0].finished);
    assert_eq!(early[0].outputs[0].token_ids, vec![first_id]);
    let mut got = early[0].outputs[0].token_ids.clone();
    got.extend(collect(&mut dec, "r").token_ids);
    assert_eq!(got, colocated(&prompt).token_ids);
}

#[test]
fn failed_transfers_recompute_or_abort_and_free_blocks() {
    let mut dec = engine();
    let prompt = dec
        .tokenizer
        .encode("The three primary colors are red, yellow and blue, and mixing them gives", false)
        .unwrap();
    let baseline = dec.block_manager().num_free_blocks();
    // recompute: prefilled locally, same output.
    dec.add_remote_prefill(
        "r",
        Prompt::TokenIds(prompt.clone()),
        params(),
        RequestOptions::default(),
    )
    .unwrap()
    .unwrap();
    dec.write_kv_block(0, &vec![0u8; dec.read_kv_block(0).unwrap().len()]).unwrap(); // a half-finished transfer
    assert!(dec.fail_remote_prefill("r", true));
    assert_eq!(collect(&mut dec, "r").token_ids, colocated(&prompt).token_ids);
    assert_eq!(dec.block_manager().num_free_blocks(), baseline);
    // fail: aborted.
    dec.add_remote_prefill(
        "f",
        Prompt::TokenIds(prompt.clone()),
        params(),
        RequestOptions::default(),
    )
    .unwrap()
    .unwrap();
    assert!(dec.block_manager().num_free_blocks() < baseline);
    assert!(dec.fail_remote_prefill("f", false));
    let out = collect(&mut dec, "f");
    assert_eq!(out.finish_reason, Some(FinishReason::Abort));
    assert_eq!(dec.block_manager().num_free_blocks(), baseline);
    // A client that goes away while pages are in flight.
    dec.add_remote_prefill("a", Prompt::TokenIds(prompt), params(), RequestOptions::default())
        .unwrap()
        .unwrap();
    assert!(dec.abort_request("a"));
    dec.step().unwrap();
    assert!(!dec.has_unfinished_requests());
    dec.check_invariants().unwrap();
    assert_eq!(dec.block_manager().num_free_blocks(), baseline);
}

#[test]
fn n_greater_than_one_is_prefilled_locally() {
    let mut dec = engine();
    let p = SamplingParams { n: 2, ..params() };
    assert!(dec
        .add_remote_prefill("n2", Prompt::Text("Hello there".into()), p, RequestOptions::default())
        .unwrap()
        .is_none());
    while dec.has_unfinished_requests() {
        dec.step().unwrap();
    }
}

/// A prefill worker ships complete blocks while the rest of the prompt is still being computed:
/// what `prefill_progress` reports complete is a prefix of the final blocks and its pages do not
/// change afterwards.
#[test]
fn complete_blocks_are_reported_while_a_chunked_prefill_runs_and_never_change() {
    let mut cfg = EngineConfig::default();
    cfg.scheduler.max_num_batched_tokens = 48;
    let mut e = LLMEngine::new(model(), cfg);
    let prompt: Vec<u32> = (0..200u32).map(|i| 100 + (i * 37) % 5000).collect();
    let opts = RequestOptions { prefill_only: true, ..Default::default() };
    e.add_request_with("p", Prompt::TokenIds(prompt.clone()), params(), opts).unwrap();
    assert_eq!(
        e.prefill_progress("p").unwrap().complete_blocks,
        Vec::<u32>::new(),
        "nothing computed yet"
    );
    let mut early: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut seen = Vec::new();
    let mut finished = false;
    for step in 1..100 {
        finished = e.step().unwrap().iter().any(|o| o.finished);
        if finished {
            break;
        }
        let p = e.prefill_progress("p").expect("running");
        assert!(p.complete_blocks.starts_with(&seen), "complete blocks only grow");
        // 48 tokens a step: only blocks whose 16 tokens are all computed count as complete.
        assert_eq!(p.complete_blocks.len(), 48 * step / 16, "step {step}");
        for &b in &p.complete_blocks[seen.len()..] {
            early.push((b, e.read_kv_block(b).unwrap()));
        }
        seen = p.complete_blocks;
    }
    assert!(finished);
    assert!(
        seen.len() >= 9,
        "most of the 12 full blocks were complete before the last chunk: {}",
        seen.len()
    );
    assert_eq!(e.prefill_progress("p"), None, "a finished prefill has no progress");
    let fin = e.prefill_blocks("p").unwrap();
    assert!(fin.starts_with(&seen));
    for (b, page) in &early {
        assert_eq!(
            &e.read_kv_block(*b).unwrap(),
            page,
            "block {b} changed after it was reported complete"
        );
    }
    assert!(e.release_prefill("p"));
}

#[test]
fn a_parked_prefill_holds_its_running_slot() {
    // Room for two sequences: one running locally, one parked for a remote prefill. A third
    // request cannot be parked (it would run past the limit when its KV lands) nor admitted
    // locally until a slot frees.
    let sched = tandem_engine::scheduling::scheduler::SchedulerConfig {
        max_num_seqs: 2,
        ..Default::default()
    };
    let mut dec =
        LLMEngine::new(model(), EngineConfig { scheduler: sched, ..EngineConfig::default() });
    let prompt = dec
        .tokenizer
        .encode("Name three rivers of Europe and the seas they flow into.", false)
        .unwrap();
    dec.add_request("local", Prompt::TokenIds(prompt.clone()), params(), None).unwrap();
    dec.step().unwrap();
    assert!(dec
        .add_remote_prefill(
            "parked",
            Prompt::TokenIds(prompt.clone()),
            params(),
            RequestOptions::default()
        )
        .unwrap()
        .is_some());
    assert!(
        dec.add_remote_prefill(
            "third",
            Prompt::TokenIds(prompt.clone()),
            params(),
            RequestOptions::default()
        )
        .unwrap()
        .is_none(),
        "no slot left to park in"
    );
    for _ in 0..5 {
        dec.step().unwrap();
        let (waiting, running, _) = dec.queue_lengths();
        assert_eq!(
            (waiting, running),
            (1, 1),
            "the third request waits while the parked one holds its slot"
        );
    }
    assert!(dec.fail_remote_prefill("parked", false));
    dec.abort_request("third");
    while dec.has_unfinished_requests() {
        dec.step().unwrap();
    }
    dec.check_invariants().unwrap();
}
