//! Prompt log-probabilities (`prompt_logprobs`): for a prompt longer than one chunk, computed in
//! several steps, after another request already put the same prompt in the prefix cache, every
//! prompt token after the first is scored once, as a single teacher-forced pass over the prompt
//! scores it, and sent with the request's first output.

use tandem_engine::{
    model_files::model_fetch, score, EngineConfig, KvCacheSize, LLMEngine, LoadOptions, Model,
    Prompt, SamplingParams,
};

fn load(tokens: usize) -> Model {
    let opts = LoadOptions { kv_cache: KvCacheSize::Tokens(tokens), ..Default::default() };
    Model::load(&model_fetch::default_model_path().unwrap(), opts).unwrap()
}

#[test]
fn prompt_logprobs_equal_a_teacher_forced_pass() {
    // 600 tokens: three chunks of 256 at most.
    let ids: Vec<u32> = (0..600u32).map(|i| 100 + (i * 7919) % 40_000).collect();
    let reference = score(&mut load(1024), &ids).unwrap();

    let mut e = LLMEngine::new(load(4096), EngineConfig::default());
    // The same prompt first, without prompt logprobs: its blocks are cached.
    e.add_request("warm", Prompt::TokenIds(ids.clone()), SamplingParams::greedy(1), None).unwrap();
    e.run_to_completion().unwrap();
    let p = SamplingParams { prompt_logprobs: Some(3), ..SamplingParams::greedy(2) };
    e.add_request("scored", Prompt::TokenIds(ids.clone()), p, None).unwrap();
    let mut got = None;
    let mut steps = 0;
    while e.has_unfinished_requests() {
        steps += 1;
        for out in e.step().unwrap() {
            if let Some(lps) = out.prompt_logprobs {
                assert!(got.is_none(), "sent once");
                assert!(!out.outputs.is_empty(), "with the first token");
                got = Some(lps);
            }
        }
    }
    assert!(steps >= 4, "the prompt went in chunks ({steps} steps)");
    let got = got.expect("prompt logprobs were sent");
    assert_eq!(got.len(), ids.len() - 1);
    let mut worst = 0f32;
    for (i, s) in got.iter().enumerate() {
        assert_eq!(s.chosen.token_id, ids[i + 1]);
        let want = reference[i][ids[i + 1] as usize];
        worst = worst.max((s.chosen.logprob - want).abs());
        assert_eq!(s.top.len(), 3);
        assert!(s.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }
    println!("worst |prompt logprob - teacher forced| = {worst:.2e}");
    assert!(worst < 1e-3, "{worst}");
    let bm = e.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks(), "no block leaked");
    assert!(SamplingParams { prompt_logprobs: Some(21), ..Default::default() }
        .validate(100)
        .is_err());
}
