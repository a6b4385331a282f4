//! The model's own endpoints through the real gateway: `GET /v1/models/{id}`, vLLM's
//! `/tokenize` and `/detokenize`, checked against what the completion endpoints count; and
//! `logit_bias`, checked with the token ids `/tokenize` gives.

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
