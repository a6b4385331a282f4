//! The model's own endpoints through the real gateway: `GET /v1/models/{id}`, vLLM's
//! `/tokenize` and `/detokenize`, checked against what the completion endpoints count.

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
