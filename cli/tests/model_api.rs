//! The model's own endpoints through the real gateway: `GET /v1/models/{id}`, vLLM's
//! `/tokenize` and `/detokenize`, checked against what the completion endpoints count; and
//! `logit_bias`, checked with the token ids `/tokenize` gives; `best_of`.

mod common;

use common::*;
use serde_json::{json, Value};

fn post(r: &Proc, path: &str, body: Value) -> (u16, Value) {
    let res = http(&r.addr, "POST", path, Some(&body.to_string()));
    (res.status, res.json())
}

#[test]
fn model_by_id_tokenize_and_detokenize() {
    let d = decode(&["--colocated"], &[]);
    let r = router(&[&d], &[]);

    let res = http(&r.addr, "GET", &format!("/v1/models/{MODEL}"), None);
    assert_eq!(res.status, 200, "{}", res.body);
    assert_eq!(res.json()["id"], MODEL);
    let res = http(&r.addr, "GET", "/v1/models/gpt-17", None);
    assert_eq!(res.status, 404);
    assert_eq!(res.json()["error"]["code"], "model_not_found");

    // A prompt: the same ids the completion counts, and back to the same text.
    let text = "The capital of France is";
    let (s, t) =
        post(&r, "/tokenize", json!({ "model": MODEL, "prompt": text, "return_token_strs": true }));
    assert_eq!(s, 200, "{t}");
    let ids: Vec<u64> =
        t["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(t["count"], ids.len());
    assert!(t["max_model_len"].as_u64().unwrap() > 0);
    assert_eq!(t["token_strs"].as_array().unwrap().len(), ids.len());
    let (s, c) =
        post(&r, "/v1/completions", json!({ "model": MODEL, "prompt": text, "max_tokens": 1 }));
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], ids.len());
    let (s, back) = post(&r, "/detokenize", json!({ "model": MODEL, "tokens": ids }));
    assert_eq!((s, back["prompt"].as_str()), (200, Some(text)), "{back}");

    // Messages: the chat template's rendering, as the chat endpoint counts it.
    let messages = json!([{ "role": "user", "content": "What is the capital of France?" }]);
    let (s, t) = post(&r, "/tokenize", json!({ "messages": messages }));
    assert_eq!(s, 200, "{t}");
    let (s, c) = post(
        &r,
        "/v1/chat/completions",
        json!({ "model": MODEL, "messages": messages, "max_tokens": 1 }),
    );
    assert_eq!(s, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], t["count"]);
    let (_, open) =
        post(&r, "/tokenize", json!({ "messages": messages, "add_generation_prompt": false }));
    assert!(
        open["count"].as_u64() < t["count"].as_u64(),
        "without the assistant turn's opening: fewer tokens"
    );

    // Bad requests: OpenAI error JSON, 400 (404 for another model).
    for (path, body, status) in [
        ("/tokenize", json!({ "prompt": "x", "guided_json": {} }), 400),
        ("/tokenize", json!({ "prompt": "x", "messages": messages }), 400),
        ("/tokenize", json!({ "model": "gpt-17", "prompt": "x" }), 404),
        ("/detokenize", json!({ "tokens": [-1] }), 400),
        ("/detokenize", json!({ "tokens": [10_000_000] }), 400),
        ("/detokenize", json!({ "tokens": "abc" }), 400),
    ] {
        let (s, e) = post(&r, path, body.clone());
        assert_eq!(s, status, "{path} {body}: {e}");
        assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    }
}

/// `logit_bias` through the gateway and a decode worker: +100 on one token makes greedy
/// decoding repeat it; -100 on the unbiased greedy answer's first token bans it.
#[test]
fn logit_bias_forces_and_bans_tokens() {
    let d = decode(&["--colocated"], &[]);
    let r = router(&[&d], &[]);
    let prompt = "The capital of France is";
    let (_, t) = post(&r, "/tokenize", json!({ "prompt": " banana", "add_special_tokens": false }));
    let banana = t["tokens"][0].as_u64().unwrap();
    let complete = |bias: Value| {
        let (s, c) = post(
            &r,
            "/v1/completions",
            json!({ "model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "logit_bias": bias }),
        );
        assert_eq!(s, 200, "{c}");
        c["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(complete(json!({ banana.to_string(): 100 })), " banana".repeat(4));
    let plain = complete(json!({}));
    let (_, first) = post(&r, "/tokenize", json!({ "prompt": plain, "add_special_tokens": false }));
    let first = first["tokens"][0].as_u64().unwrap();
    let banned = complete(json!({ first.to_string(): -100 }));
    let (_, b) = post(&r, "/tokenize", json!({ "prompt": banned, "add_special_tokens": false }));
    assert_ne!(b["tokens"][0].as_u64().unwrap(), first, "{plain:?} / {banned:?}");
    let (s, e) = post(
        &r,
        "/v1/completions",
        json!({ "model": MODEL, "prompt": prompt, "logit_bias": { "x": 1 } }),
    );
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("logit_bias")), "{e}");
    let (s, e) = post(
        &r,
        "/v1/completions",
        json!({ "model": MODEL, "prompt": prompt, "logit_bias": { "5": 101 } }),
    );
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("logit_bias")), "{e}");
}

/// Completions' `top_logprobs` objects list their tokens most likely first, streamed or not.
#[test]
fn completion_top_logprobs_come_most_likely_first() {
    let d = decode(&["--colocated"], &[]);
    let r = router(&[&d], &[]);
    for stream in [false, true] {
        let body = json!({ "model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "logprobs": 5, "stream": stream });
        let res = http(&r.addr, "POST", "/v1/completions", Some(&body.to_string()));
        assert_eq!(res.status, 200, "{}", res.body);
        // On the raw text (a parsed map would sort the keys): in the first object of each
        // `top_logprobs` list, the values never increase.
        let parts: Vec<&str> = res.body.split("\"top_logprobs\":[").skip(1).collect();
        assert!(!parts.is_empty(), "no top_logprobs in {}", res.body);
        for part in parts {
            let first = part.split('}').next().unwrap();
            let values: Vec<f64> = first
                .split(',')
                .filter_map(|kv| kv.rsplit(':').next()?.trim().parse().ok())
                .collect();
            assert!(values.len() >= 2, "{first}");
            assert!(values.windows(2).all(|w| w[0] >= w[1]), "keys not most likely first: {first}");
        }
    }
}

/// `best_of = 4, n = 2` generates four samples and returns the two with the highest cumulative
/// log-probability: the same four (same seed) come back with `n = 4`, whose token log-probs
/// give each one's score. Streaming it, or `best_of < n`, is a 400.
#[test]
fn best_of_returns_the_highest_scoring_samples() {
    let d = decode(&["--colocated"], &[]);
    let r = router(&[&d], &[]);
    let body = |extra: Value| {
        let mut b = json!({ "model": MODEL, "prompt": "Once upon a time", "max_tokens": 12,
                            "temperature": 1.0, "seed": 5, "logprobs": 0 });
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let (s, all) = post(&r, "/v1/completions", body(json!({ "n": 4 })));
    assert_eq!(s, 200, "{all}");
    let mut scored: Vec<(f64, String)> = all["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
            (lps.iter().map(|x| x.as_f64().unwrap()).sum(), c["text"].as_str().unwrap().into())
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let distinct: std::collections::HashSet<&String> = scored.iter().map(|s| &s.1).collect();
    assert!(distinct.len() >= 3, "the four samples differ: {scored:?}");

    let (s, best) = post(&r, "/v1/completions", body(json!({ "n": 2, "best_of": 4 })));
    assert_eq!(s, 200, "{best}");
    let texts: Vec<&str> =
        best["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts, [scored[0].1.as_str(), scored[1].1.as_str()], "{scored:?}");
    assert_eq!(best["usage"]["completion_tokens"], all["usage"]["completion_tokens"]);

    for (extra, what) in [
        (json!({ "n": 2, "best_of": 4, "stream": true }), "streamed"),
        (json!({ "n": 3, "best_of": 2 }), "below n"),
    ] {
        let (s, e) = post(&r, "/v1/completions", body(extra));
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some("best_of")), "{what}: {e}");
    }
}

/// `echo` with `logprobs` scores the prompt itself: through the gateway, the echoed tokens'
/// log-probabilities and top-5 alternatives equal transformers' teacher-forced ones from the
/// committed golden file (prompt + the reference's greedy tokens sent as the prompt), the first
/// token has none, and the completion's entries follow. Streaming it is a 400.
#[test]
fn echo_with_logprobs_scores_the_prompt_as_the_reference_does() {
    let d = decode(&["--colocated"], &[]);
    let r = router(&[&d], &[]);
    let path =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/smollm2-135m-instruct-q4_1.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut worst = 0f64;
    for case in golden["cases"].as_array().unwrap().iter().take(4) {
        let prompt: Vec<u64> = case["prompt_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let steps = case["steps"].as_array().unwrap();
        let forced: Vec<u64> =
            steps.iter().take(16).map(|s| s["token_id"].as_u64().unwrap()).collect();
        let ids: Vec<u64> = prompt.iter().chain(&forced).copied().collect();
        let body = json!({ "model": MODEL, "prompt": ids, "echo": true, "logprobs": 5,
                           "max_tokens": 2, "temperature": 0 });
        let (s, res) = post(&r, "/v1/completions", body);
        assert_eq!(s, 200, "{res}");
        let lp = &res["choices"][0]["logprobs"];
        let token_lps = lp["token_logprobs"].as_array().unwrap();
        assert_eq!(token_lps.len(), ids.len() + 2, "prompt and completion entries");
        assert!(token_lps[0].is_null() && lp["top_logprobs"][0].is_null());
        for (j, step) in steps.iter().take(16).enumerate() {
            let at = prompt.len() + j;
            let got = token_lps[at].as_f64().unwrap();
            let want = step["logprob"].as_f64().unwrap();
            worst = worst.max((got - want).abs());
            assert!((got - want).abs() < 2e-3, "{} position {at}: {got} vs {want}", case["name"]);
            let tops = lp["top_logprobs"][at].as_object().unwrap();
            assert_eq!(tops.len(), 5);
            let best = step["top"][0]["logprob"].as_f64().unwrap();
            let first = tops.values().next().unwrap().as_f64().unwrap();
            assert!((first - best).abs() < 2e-3, "most likely first: {first} vs {best}");
        }
        // The completion is greedy: its first token is the reference's next one.
        let next = steps[16]["token_id"].as_u64().unwrap();
        assert_eq!(res["usage"]["prompt_tokens"].as_u64().unwrap() as usize, ids.len());
        let (_, t) = post(&r, "/detokenize", json!({ "model": MODEL, "tokens": [next] }));
        assert_eq!(t["prompt"], lp["tokens"][ids.len()], "{t}");
    }
    println!("worst |echo logprob - reference| = {worst:.2e}");
    let body =
        json!({ "model": MODEL, "prompt": "x", "echo": true, "logprobs": 1, "stream": true });
    let (s, e) = post(&r, "/v1/completions", body);
    assert_eq!((s, e["error"]["param"].as_str()), (400, Some("echo")), "{e}");
    prompt_logprobs_as_vllm_writes_them(&r, &golden["cases"][0]);
}

/// vLLM's `prompt_logprobs` field, on completions (per choice) and chat (once): null for the
/// first prompt token, then each token's own entry (log-probability as the reference's, its
/// rank) beside the `k` most likely; echo's `top_logprobs` keep their own count.
fn prompt_logprobs_as_vllm_writes_them(r: &Proc, case: &Value) {
    let ids: Vec<u64> =
        case["prompt_token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let steps = case["steps"].as_array().unwrap();
    let forced: Vec<u64> = steps.iter().take(8).map(|s| s["token_id"].as_u64().unwrap()).collect();
    let all: Vec<u64> = ids.iter().chain(&forced).copied().collect();
    let body = json!({ "model": MODEL, "prompt": all, "prompt_logprobs": 3, "echo": true,
                       "logprobs": 1, "max_tokens": 1, "temperature": 0 });
    let (s, res) = post(r, "/v1/completions", body);
    assert_eq!(s, 200, "{res}");
    let pl = res["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(pl.len(), all.len());
    assert!(pl[0].is_null());
    for (j, step) in steps.iter().take(8).enumerate() {
        let at = ids.len() + j;
        let entries = pl[at].as_object().unwrap();
        assert!((3..=4).contains(&entries.len()), "{}", pl[at]);
        let own = &entries[&all[at].to_string()];
        let want = step["logprob"].as_f64().unwrap();
        assert!((own["logprob"].as_f64().unwrap() - want).abs() < 2e-3, "{own} vs {want}");
        let best =
            entries.values().map(|e| e["logprob"].as_f64().unwrap()).fold(f64::MIN, f64::max);
        let rank = own["rank"].as_u64().unwrap();
        assert_eq!(rank == 1, own["logprob"].as_f64().unwrap() == best, "{}", pl[at]);
        let mut ranks: Vec<u64> = entries.values().map(|e| e["rank"].as_u64().unwrap()).collect();
        ranks.sort();
        assert_eq!(ranks[..3], [1, 2, 3], "{}", pl[at]);
        assert_eq!(entries.len() == 4, rank >= 4, "{}", pl[at]);
        assert!(own["decoded_token"].is_string());
        // echo's own count of alternatives: one.
        assert_eq!(res["choices"][0]["logprobs"]["top_logprobs"][at].as_object().unwrap().len(), 1);
    }
    let body = json!({ "model": MODEL, "messages": [{"role": "user", "content": "Hi there"}],
                       "prompt_logprobs": 0, "max_tokens": 1 });
    let (s, res) = post(r, "/v1/chat/completions", body);
    assert_eq!(s, 200, "{res}");
    let pl = res["prompt_logprobs"].as_array().unwrap();
    assert_eq!(pl.len() as u64, res["usage"]["prompt_tokens"].as_u64().unwrap());
    assert!(pl[1..].iter().all(|e| e.as_object().unwrap().len() == 1), "{res}");
    for bad in [json!({"prompt_logprobs": 1, "stream": true}), json!({"prompt_logprobs": 21})] {
        let mut body = json!({ "model": MODEL, "prompt": "x", "max_tokens": 1 });
        body.as_object_mut().unwrap().extend(bad.as_object().unwrap().clone());
        let (s, e) = post(r, "/v1/completions", body);
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some("prompt_logprobs")), "{e}");
    }
}

/// Beam search by brute force (teacher-forced passes of the same file, exact kernels like the
/// workers): the reference.
fn brute_force_beams(prompt: &[u32], width: usize, steps: usize) -> Vec<(Vec<u32>, f64)> {
    let path = tandem_engine::model_files::model_fetch::default_model_path().unwrap();
    let mut model =
        tandem_engine::Model::load(&path, tandem_engine::LoadOptions::default()).unwrap();
    tandem_engine::beam_search_by_scoring(&mut model, prompt, width, steps, 1.0).unwrap()
}

/// `use_beam_search` through the gateway, on the disaggregated path (a prefill worker beside
/// the decode worker, whose engine runs the search over forks of its beams), returns the
/// brute-force search's beams, best first, and every block is free again at the end.
/// Conflicting fields are 400s.
#[test]
fn beam_search_returns_the_brute_force_beams() {
    let d = decode(&[], &[]);
    let p = prefill(&[], &[]);
    let r = router(&[&d], &[&p]);
    let base = free_blocks(&d);
    let (_, t) = post(
        &r,
        "/tokenize",
        json!({ "model": MODEL, "prompt": "Here is some advice that my grandmother gave me when I was young, and that I have kept with me ever since: the best way to learn is" }),
    );
    let prompt: Vec<u32> =
        t["tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let (width, steps) = (4, 6);
    let body = json!({ "model": MODEL, "prompt": prompt, "use_beam_search": true, "n": width,
                       "max_tokens": steps, "temperature": 0 });
    let (s, res) = post(&r, "/v1/completions", body);
    assert_eq!(s, 200, "{res}");
    let want = brute_force_beams(&prompt, width, steps);
    let choices = res["choices"].as_array().unwrap();
    assert_eq!(choices.len(), width);
    for (c, (toks, cum)) in choices.iter().zip(&want) {
        let (_, text) = post(&r, "/detokenize", json!({ "model": MODEL, "tokens": toks }));
        let text = text["prompt"].as_str().unwrap().to_string();
        let got = c["text"].as_str().unwrap();
        assert!(text.starts_with(got), "beam {got:?} vs brute force {text:?}");
        let lp = c["cumulative_logprob"].as_f64().unwrap();
        assert!((lp - cum).abs() < 1e-3, "{got:?}: {lp} vs {cum}");
    }
    let generated: usize = want.iter().map(|(t, _)| t.len()).sum();
    assert_eq!(res["usage"]["completion_tokens"], generated, "{res}");
    // The decode worker prefilled it for its beams to fork from: no prefill worker was booked.
    let decisions = debug_routing(&r)["decisions"].clone();
    let last = decisions.as_array().and_then(|d| d.last()).cloned().unwrap_or_default();
    assert_eq!(last["prefill"], Value::Null, "{decisions}");
    assert_eq!(wait_metric(&d.addr, "tandem_kv_cache_free_blocks", base), Some(base));
    for (extra, param) in [
        (json!({ "stream": true }), "stream"),
        (json!({ "top_p": 0.5 }), "top_p"),
        (json!({ "stop": ["."] }), "stop"),
        (json!({ "n": 11 }), "n"),
    ] {
        let mut b = json!({ "model": MODEL, "prompt": "x", "use_beam_search": true, "n": 2 });
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (s, e) = post(&r, "/v1/completions", b);
        assert_eq!((s, e["error"]["param"].as_str()), (400, Some(param)), "{e}");
    }
    // A search whose beams could outgrow the worker's KV cache is refused, not queued.
    let big = json!({ "model": MODEL, "prompt": "x", "use_beam_search": true, "n": 10,
                      "max_tokens": 2000 });
    let (s, e) = post(&r, "/v1/completions", big);
    let msg = e["error"]["message"].as_str().unwrap_or_default();
    assert!(s == 400 && msg.contains("beam search of width 10"), "{s} {e}");
    assert_eq!(wait_metric(&d.addr, "tandem_kv_cache_free_blocks", base), Some(base));
}
