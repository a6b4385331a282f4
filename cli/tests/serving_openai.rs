//! End to end with real processes on loopback: the official `openai` Python SDK (installed
//! from PyPI by `scripts/test/python_env.sh`) against a router, a prefill worker and a decode
//! worker. Greedy outputs through the disaggregated path must equal `tandem generate`'s, token
//! for token, on the exact kernels.

mod common;

use std::process::Command;

use common::*;
use serde_json::{json, Value};

const MAX_TOKENS: usize = 24;
const CHAT_PROMPT: &str = "What is the capital of France?";

/// `tandem generate --json` on the exact kernels: the reference.
fn reference(prompt: &str, chat: bool, kernel: &str) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
    cmd.args([
        "generate",
        "--json",
        "--top-logprobs=2",
        &format!("--kernel={kernel}"),
        &format!("--max-tokens={MAX_TOKENS}"),
        "--model",
        &model(),
        "--prompt",
        prompt,
    ]);
    if chat {
        cmd.arg("--chat");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn run_client(base: &str) -> Value {
    let (url, prompt, max) = (format!("http://{base}/v1"), long_prompt(), MAX_TOKENS.to_string());
    python_client("openai_client.py", &[&url, MODEL, &prompt, CHAT_PROMPT, &max])
}

/// The reference text cut before the first stop string, if any.
fn cut_at_stop(text: &str, stops: &[&str]) -> (String, &'static str) {
    match stops.iter().filter_map(|s| text.find(s)).min() {
        Some(i) => (text[..i].to_string(), "stop"),
        None => (text.to_string(), "length"),
    }
}

#[test]
fn openai_sdk_against_disaggregated_services_equals_tandem_generate() {
    // Every prompt goes to the prefill worker, also when the decode worker already caches most
    // of it (then only the blocks it lacks are shipped).
    let d = decode(&["--disagg-min-tokens=1"], &[]);
    let p = prefill(&[], &[]);
    let r = router(&[&d], &[&p]);
    let (d_base, p_base) = (free_blocks(&d), free_blocks(&p));
    let got = run_client(&r.addr);
    let want = reference(&long_prompt(), false, "exact");
    let want_chat = reference(CHAT_PROMPT, true, "exact");
    let text = want["text"].as_str().unwrap();
    let n = want["token_ids"].as_array().unwrap().len();

    assert_eq!(got["models"], serde_json::json!([MODEL]));
    assert_eq!(got["completion"]["text"], want["text"], "completion differs from tandem generate");
    assert_eq!(got["completion"]["usage"]["completion_tokens"].as_u64().unwrap() as usize, n);
    assert_eq!(
        got["completion"]["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        want["prompt_token_ids"].as_array().unwrap().len()
    );
    let lps: Vec<f64> = want["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["logprob"].as_f64().unwrap())
        .collect();
    for (i, (a, b)) in
        got["completion"]["token_logprobs"].as_array().unwrap().iter().zip(&lps).enumerate()
    {
        assert!((a.as_f64().unwrap() - b).abs() < 1e-3, "token {i}: logprob {a} vs reference {b}");
    }
    assert_eq!(got["completion_stream"]["text"], want["text"], "streamed completion differs");
    assert_eq!(
        got["completion_stream"]["usage"]["completion_tokens"].as_u64().unwrap() as usize,
        n,
        "include_usage chunk"
    );
    assert_eq!(got["chat"]["text"], want_chat["text"], "chat differs from tandem generate --chat");
    assert_eq!(got["chat_stream"]["text"], want_chat["text"], "streamed chat differs");
    let finish = if want_chat["finish_reason"] == "stop" { "stop" } else { "length" };
    assert_eq!(got["chat"]["finish_reason"], finish);
    let (cut, reason) = cut_at_stop(text, &[" the", "\n"]);
    assert_eq!(got["stop"]["text"], cut.as_str());
    assert_eq!(got["stop"]["finish_reason"], reason);
    assert_eq!(got["n2"].as_array().unwrap().len(), 2);
    assert_eq!(got["unknown_model"], 404);
    assert!(got["bad_request"].as_str().unwrap().contains("max_tokens"), "{}", got["bad_request"]);

    // The single-completion prompts above were prefilled remotely and shipped as pages
    // (n = 2 is prefilled locally: its completions fork the prompt's blocks).
    let remote =
        metric(&d.addr, "tandem_disagg_decisions_total", &["decision=\"remote\""]).unwrap_or(0.0);
    assert!(remote >= 6.0, "expected remote prefills on the decode worker, got {remote}");
    assert!(metric(&p.addr, "tandem_kv_transfer_bytes_total", &[]).unwrap_or(0.0) > 0.0);
    assert!(
        metric(&r.addr, "tandem_router_requests_total", &["code=\"200\""]).unwrap_or(0.0) >= 1.0
    );
    // Nothing leaked on either side.
    assert_eq!(wait_metric(&d.addr, "tandem_kv_cache_free_blocks", d_base), Some(d_base));
    assert_eq!(wait_metric(&p.addr, "tandem_kv_cache_free_blocks", p_base), Some(p_base));
}

/// A decode worker that serves the OpenAI API on its own port (`--serve-openai`), as a Gateway
/// API Inference Extension model server does: the official SDK gets what `tandem generate`
/// writes, prompts are prefilled by the prefill worker, and the worker's `/metrics` carries the
/// vLLM-named series an endpoint picker reads beside the front end's request counters.
#[test]
fn a_decode_worker_serves_the_openai_api_itself() {
    let p = prefill(&[], &[]);
    let prefill_flag = format!("--prefill-workers={}", p.addr);
    let d = decode(&["--serve-openai", &prefill_flag, "--disagg-min-tokens=1"], &[]);
    let got = run_client(&d.addr);
    let want = reference(&long_prompt(), false, "exact");
    let want_chat = reference(CHAT_PROMPT, true, "exact");
    assert_eq!(got["models"], serde_json::json!([MODEL]));
    assert_eq!(got["completion"]["text"], want["text"]);
    assert_eq!(got["completion_stream"]["text"], want["text"]);
    assert_eq!(got["chat"]["text"], want_chat["text"]);
    assert_eq!(got["chat_stream"]["text"], want_chat["text"]);
    assert_eq!(got["unknown_model"], 404);
    let remote =
        metric(&d.addr, "tandem_disagg_decisions_total", &["decision=\"remote\""]).unwrap_or(0.0);
    assert!(remote >= 6.0, "expected remote prefills, got {remote}");
    let text = http(&d.addr, "GET", "/metrics", None).body;
    for name in
        ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"]
    {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}"));
        assert!(line.contains(&format!("model_name=\"{MODEL}\"")), "{line}");
    }
    assert!(
        metric(&d.addr, "tandem_router_requests_total", &["code=\"200\""]).unwrap_or(0.0) >= 1.0
    );
    // The worker's own routes stay as they were.
    assert_eq!(http(&d.addr, "GET", "/health", None).status, 200);
}

#[test]
fn tandem_up_colocated_serves_the_openai_api() {
    let up = Proc::start(
        "up",
        &[
            "up".into(),
            "--colocated".into(),
            "--port=0".into(),
            "--kernel=exact".into(),
            "--model".into(),
            model(),
        ],
        &[],
    );
    let body = serde_json::json!({ "model": MODEL, "prompt": long_prompt(), "max_tokens": MAX_TOKENS, "temperature": 0 }).to_string();
    let res = http(&up.addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(res.status, 200, "{}", res.body);
    assert_eq!(res.json()["choices"][0]["text"], reference(&long_prompt(), false, "exact")["text"]);
    let health = http(&up.addr, "GET", "/health", None);
    assert_eq!(health.status, 200, "{}", health.body);
    assert_eq!(health.json()["workers"][0]["healthy"], true);
}

/// The fast (quantised) kernels through the disaggregated path against `tandem generate` on the
/// same kernels: equal token for token, except after a near-tie (reference margin between its
/// two best tokens below 0.05 nats), which is reported.
#[test]
fn fast_kernels_disaggregated_equal_generate_except_near_ties() {
    let mut a = vec![
        "decode".to_string(),
        "--listen=127.0.0.1:0".into(),
        "--kernel=fast".into(),
        "--kv-cache-memory=128MiB".into(),
        "--disagg-min-tokens=1".into(),
        "--model".into(),
        model(),
    ];
    let d = Proc::start("decode-fast", &a, &[]);
    a[0] = "prefill".into();
    a[2] = "--kernel=fast".into();
    a.retain(|x| x != "--disagg-min-tokens=1");
    let p = Proc::start("prefill-fast", &a, &[]);
    let r = router(&[&d], &[&p]);
    let info = tandem_engine::ModelInfo::open(std::path::Path::new(&model())).unwrap();
    let prompts = [
        long_prompt(),
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n".repeat(2),
        "Les Misérables est un roman de Victor Hugo publié en 1862. ".repeat(2),
    ];
    let mut near_ties = 0;
    for prompt in &prompts {
        let body = json!({ "model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1 }).to_string();
        let res = http(&r.addr, "POST", "/v1/completions", Some(&body));
        assert_eq!(res.status, 200, "{}", res.body);
        let got: Vec<String> = res.json()["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect();
        let want = reference(prompt, false, "fast");
        let steps = want["logprobs"].as_array().unwrap();
        for (i, step) in steps.iter().enumerate() {
            let id = step["token_id"].as_u64().unwrap() as u32;
            let text = info.tokenizer.decode(&[id], false).unwrap();
            if got.get(i) == Some(&text) {
                continue;
            }
            let top = step["top"].as_array().unwrap();
            let margin = top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap();
            eprintln!("prompt {:?}…: diverges at token {i} ({:?} vs {text:?}), reference margin {margin:.4} nats", &prompt[..20], got.get(i));
            assert!(margin < 0.05, "a divergence away from a near-tie: margin {margin}");
            near_ties += 1;
            break;
        }
        assert!(got.len() == steps.len() || near_ties > 0, "length differs without a near-tie");
    }
    eprintln!("fast kernels: {} prompts, {near_ties} near-tie divergences", prompts.len());
}

/// `tandem bench serve` against a real server: every request completes, token counts are exact
/// with ignore_eos, latencies are ordered; the multi-turn workload's prompts grow turn by turn.
#[test]
fn bench_serve_measures_a_real_server() {
    let d = decode(&["--colocated"], &[]);
    let r = router(&[&d], &[]);
    let run = |extra: &[&str]| -> Value {
        let mut args = vec![
            "bench".to_string(),
            "serve".into(),
            format!("--base-url=http://{}/v1", r.addr),
            "--json=-".into(),
            "--quiet".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = Command::new(env!("CARGO_BIN_EXE_tandem")).args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("Serving Benchmark Result"));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = run(&[
        "--num-prompts=6",
        "--concurrency=3",
        "--input-len=24",
        "--output-len=5",
        "--ignore-eos",
    ]);
    let res = &v["result"];
    assert_eq!(v["config"]["model"], MODEL, "the model is discovered from /v1/models");
    assert_eq!((res["completed"].as_u64(), res["failed"].as_u64()), (Some(6), Some(0)), "{res}");
    assert_eq!(res["total_output_tokens"], 30);
    assert_eq!(res["total_input_tokens"], 6 * 24);
    let (t50, t99, e99) = (
        res["ttft"]["median_ms"].as_f64().unwrap(),
        res["ttft"]["p99_ms"].as_f64().unwrap(),
        res["e2e"]["p99_ms"].as_f64().unwrap(),
    );
    assert!(0.0 < t50 && t50 <= t99 && t99 <= e99, "{res}");
    assert!(res["tpot"]["mean_ms"].as_f64().unwrap() > 0.0);
    let mt = run(&[
        "--workload=multi-turn",
        "--num-prompts=4",
        "--turns=2",
        "--input-len=8",
        "--output-len=4",
        "--ignore-eos",
    ]);
    let res = &mt["result"];
    assert_eq!(res["completed"], 4, "{res}");
    // Second turns re-send the first turn and its answer: more input than 4 fresh turns would be.
    assert!(res["total_input_tokens"].as_u64().unwrap() > 4 * 8 + 2 * 4, "{res}");
}

/// `--speculative ngram` on a decode worker: greedy output through the API equals
/// `tandem generate`, drafts are accepted (the worker's metrics say so), and a request can opt
/// out with `"speculative": false`.
#[test]
fn speculative_decode_worker_serves_identical_greedy_output() {
    let d = decode(&["--colocated", "--speculative=ngram"], &[]);
    let r = router(&[&d], &[]);
    let prompt = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,";
    let body =
        json!({ "model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0 })
            .to_string();
    let res = http(&r.addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(res.status, 200, "{}", res.body);
    assert_eq!(res.json()["choices"][0]["text"], reference(prompt, false, "exact")["text"]);
    // The engine publishes its counters right after dispatching a step's outputs: read until
    // the value settles.
    let settled = || {
        let mut last =
            metric(&d.addr, "tandem_spec_decode_accepted_tokens_total", &[]).unwrap_or(0.0);
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let now =
                metric(&d.addr, "tandem_spec_decode_accepted_tokens_total", &[]).unwrap_or(0.0);
            if now == last {
                return now;
            }
            last = now;
        }
    };
    let accepted = settled();
    assert!(accepted > 0.0, "the decode worker should have accepted drafts");
    let opt_out = json!({ "model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "speculative": false }).to_string();
    let res = http(&r.addr, "POST", "/v1/completions", Some(&opt_out));
    assert_eq!(res.status, 200, "{}", res.body);
    assert_eq!(settled(), accepted, "the opted-out request drafted");
}
