//! Disaggregated prefill between two engines over loopback TCP: the prefill engine runs the
//! prompt in chunks and stops at the first token with its blocks pinned; the pages travel over
//! the TCP transport into the blocks the decode engine reserved; the decode engine continues.
//! The tokens equal a colocated engine's, and both sides return to their free-block baselines.
//! With a sliding-window model (Gemma 3) the prefill side keeps every page until shipped, the
//! decode side reserves only the pages read from the end of the prompt on, and only those
//! travel.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tandem_engine::backend::NO_PAGE;
use tandem_engine::sampling::sampler::{SampledToken, TokenLogprob};
use tandem_engine::scheduling::scheduler::SchedulerConfig;
use tandem_engine::{
    model_files::model_fetch, CompletionOutput, EngineConfig, LLMEngine, LoadOptions, Model,
    Prompt, RequestOptions, SamplingParams,
};
use tandem_kv_transfer::tcp::{PageSink, TcpReceiver, TcpSender};
use tandem_kv_transfer::KvPage;
use tandem_worker::kv::kv_layout;

fn engine(model: &Path, budget: usize) -> LLMEngine {
    let m = Model::load(model, LoadOptions::with_kv_tokens(1024)).unwrap();
    let cfg = EngineConfig {
        scheduler: SchedulerConfig { max_num_batched_tokens: budget, ..Default::default() },
        ..Default::default()
    };
    LLMEngine::new(m, cfg)
}

struct EngineSink<'a> {
    engine: &'a mut LLMEngine,
    table: Vec<u32>,
}

impl PageSink for EngineSink<'_> {
    fn target(&mut self, _id: u64, index: u32, _hash: u64) -> Option<u32> {
        self.table.get(index as usize).copied()
    }
    fn write(&mut self, block: u32, payload: Vec<u8>) -> Result<(), String> {
        self.engine.write_kv_block(block, &payload).map_err(|e| e.to_string())
    }
}

fn drain(e: &mut LLMEngine) -> Vec<CompletionOutput> {
    let mut outs: Vec<CompletionOutput> = Vec::new();
    for _ in 0..10_000 {
        let step = e.step().unwrap();
        let done = step.iter().any(|o| o.finished);
        for o in step.into_iter().flat_map(|o| o.outputs) {
            match outs.last_mut() {
                Some(a) => {
                    a.token_ids.extend(o.token_ids);
                    a.text.push_str(&o.text);
                    a.finish_reason = o.finish_reason.or(a.finish_reason);
                }
                None => outs.push(o),
            }
        }
        if done && !e.has_unfinished_requests() {
            break;
        }
    }
    outs
}

#[test]
fn prefill_engine_to_decode_engine_over_tcp_equals_colocated() {
    transfer_equals_colocated(&model_fetch::default_model_path().unwrap());
}

#[test]
fn sliding_window_model_over_tcp_equals_colocated() {
    // Two local layers of window 16 and a global one: pages of three KV groups per block.
    let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-gemma3");
    transfer_equals_colocated(&tiny);
}

fn transfer_equals_colocated(model: &Path) {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(24) };
    let mut prefill = engine(model, 32); // 32-token budget: the prompt is prefilled in chunks
    let mut decode = engine(model, 512);
    let prompt = prefill
        .tokenizer
        .encode(&"In the beginning of the industrial revolution, factories ".repeat(9), false)
        .unwrap();
    assert!(prompt.len() > 64);
    let (p_base, d_base) =
        (prefill.block_manager().num_free_blocks(), decode.block_manager().num_free_blocks());

    // Prefill worker: prompt only, first token out, blocks pinned.
    let opts = RequestOptions { prefill_only: true, ..Default::default() };
    prefill
        .add_request_with("req", Prompt::TokenIds(prompt.clone()), params.clone(), opts)
        .unwrap();
    let mut first = None;
    let mut steps = 0;
    while first.is_none() {
        steps += 1;
        for o in prefill.step().unwrap() {
            assert!(o.finished);
            let c = &o.outputs[0];
            assert_eq!(
                c.token_ids.len(),
                1,
                "a prefill-only request yields exactly its first token"
            );
            let chosen =
                TokenLogprob { token_id: c.token_ids[0], logprob: c.cumulative_logprob as f32 };
            first = Some(SampledToken { chosen, top: vec![], rank: None });
        }
    }
    assert!(
        steps >= prompt.len() / 32,
        "the prompt should take several chunked steps, took {steps}"
    );
    let src = prefill.prefill_blocks("req").expect("pinned blocks");
    prefill.check_invariants().unwrap();

    // Decode worker: reserve blocks, receive pages over TCP, continue.
    let rp = decode
        .add_remote_prefill(
            "req",
            Prompt::TokenIds(prompt.clone()),
            params.clone(),
            RequestOptions::default(),
        )
        .unwrap()
        .unwrap();
    let receiver =
        TcpReceiver::bind("127.0.0.1:0", kv_layout(&decode), Duration::from_secs(2)).unwrap();
    let addr = receiver.local_addr().unwrap();
    let skip = rp.num_cached_pages;
    assert_eq!(rp.block_table.len(), src.len(), "both sides lay pages out alike");
    // Only the pages the decode side reads from the end of the prompt on: it gave back the
    // ones a window has passed as it reserved its blocks.
    let ship = prefill.prefill_pages_to_ship("req", skip).expect("pinned blocks");
    let windows = prefill.kv_groups().windows;
    for (i, &b) in rp.block_table.iter().enumerate().skip(skip) {
        let shipped = ship.iter().any(|&(j, _)| j == i);
        assert_eq!(b != NO_PAGE, shipped, "entry {i}: reserved exactly where a page comes");
    }
    if windows.iter().any(Option::is_some) {
        assert!(ship.len() * 2 < src.len() - skip, "{} of {} pages shipped", ship.len(), src.len());
    } else {
        assert_eq!(ship.len(), src.len() - skip);
    }
    std::thread::scope(|scope| {
        let sink_engine = &mut decode;
        let table = rp.block_table.clone();
        let rx =
            scope.spawn(move || receiver.serve_one(&mut EngineSink { engine: sink_engine, table }));
        let mut tx =
            TcpSender::connect(addr, &kv_layout(&prefill), Duration::from_secs(2)).unwrap();
        for &(i, blk) in &ship {
            let payload = prefill.read_kv_block(blk).unwrap();
            tx.send(&KvPage { transfer_id: 1, index: i as u32, block_hash: 0, payload }).unwrap();
        }
        tx.finish(1, ship.len() as u32).unwrap();
        rx.join().unwrap().unwrap();
    });
    assert!(prefill.release_prefill("req"));
    assert_eq!(
        prefill.block_manager().num_free_blocks(),
        p_base,
        "prefill side frees (and caches) its blocks"
    );
    decode.finish_remote_prefill("req", first.unwrap()).unwrap();
    let got = drain(&mut decode);
    decode.check_invariants().unwrap();
    assert_eq!(decode.block_manager().num_free_blocks(), d_base);

    let mut colo = engine(model, 512);
    colo.add_request("req", Prompt::TokenIds(prompt), params, None).unwrap();
    let want = drain(&mut colo);
    assert_eq!(got[0].token_ids, want[0].token_ids);
    assert_eq!(got[0].text, want[0].text);
}
