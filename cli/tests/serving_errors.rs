//! Malformed requests against a real router (with a real decode worker behind it): every one
//! is answered 4xx with OpenAI's error JSON — never a 500, never a hang — and the server keeps
//! serving afterwards.

mod common;

use common::*;
use serde_json::{json, Value};

struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    body: String,
    status: u16,
    /// The `param` the error must name, when it names one.
    param: Option<&'static str>,
}

fn case(
    name: &'static str,
    path: &'static str,
    body: Value,
    status: u16,
    param: Option<&'static str>,
) -> Case {
    Case { name, method: "POST", path, body: body.to_string(), status, param }
}

fn raw(
    name: &'static str,
    method: &'static str,
    path: &'static str,
    body: &str,
    status: u16,
) -> Case {
    Case { name, method, path, body: body.to_string(), status, param: None }
}

const C: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

fn cases() -> Vec<Case> {
    let m = MODEL;
    let user = json!([{ "role": "user", "content": "hi" }]);
    vec![
        raw("body is not JSON", "POST", C, "{not json", 400),
        raw("empty body", "POST", C, "", 400),
        raw("body is a JSON array", "POST", C, "[1, 2]", 400),
        raw("truncated JSON", "POST", CHAT, r#"{"model": "x", "messages": [{"role": "user""#, 400),
        case("missing model", C, json!({ "prompt": "hi" }), 400, Some("model")),
        case("unknown model", C, json!({ "model": "gpt-17", "prompt": "hi" }), 404, Some("model")),
        case("missing prompt", C, json!({ "model": m }), 400, Some("prompt")),
        case("prompt is a number", C, json!({ "model": m, "prompt": 42 }), 400, Some("prompt")),
        case(
            "negative max_tokens",
            C,
            json!({ "model": m, "prompt": "hi", "max_tokens": -5 }),
            400,
            Some("max_tokens"),
        ),
        case(
            "zero max_tokens",
            C,
            json!({ "model": m, "prompt": "hi", "max_tokens": 0 }),
            400,
            Some("max_tokens"),
        ),
        case(
            "max_tokens is a string",
            C,
            json!({ "model": m, "prompt": "hi", "max_tokens": "ten" }),
            400,
            Some("max_tokens"),
        ),
        case(
            "temperature too high",
            C,
            json!({ "model": m, "prompt": "hi", "temperature": 5 }),
            400,
            Some("temperature"),
        ),
        case(
            "negative temperature",
            C,
            json!({ "model": m, "prompt": "hi", "temperature": -1 }),
            400,
            Some("temperature"),
        ),
        case(
            "top_p zero",
            C,
            json!({ "model": m, "prompt": "hi", "top_p": 0 }),
            400,
            Some("top_p"),
        ),
        case(
            "top_p above one",
            C,
            json!({ "model": m, "prompt": "hi", "top_p": 1.5 }),
            400,
            Some("top_p"),
        ),
        case("n zero", C, json!({ "model": m, "prompt": "hi", "n": 0 }), 400, Some("n")),
        case("n huge", C, json!({ "model": m, "prompt": "hi", "n": 500 }), 400, Some("n")),
        case(
            "presence_penalty out of range",
            C,
            json!({ "model": m, "prompt": "hi", "presence_penalty": 3 }),
            400,
            Some("presence_penalty"),
        ),
        case(
            "frequency_penalty out of range",
            C,
            json!({ "model": m, "prompt": "hi", "frequency_penalty": -3 }),
            400,
            Some("frequency_penalty"),
        ),
        case(
            "logprobs too many",
            C,
            json!({ "model": m, "prompt": "hi", "logprobs": 50 }),
            400,
            Some("logprobs"),
        ),
        case(
            "empty stop string",
            C,
            json!({ "model": m, "prompt": "hi", "stop": [""] }),
            400,
            Some("stop"),
        ),
        case(
            "negative seed",
            C,
            json!({ "model": m, "prompt": "hi", "seed": -1 }),
            400,
            Some("seed"),
        ),
        case(
            "token id outside the vocabulary",
            C,
            json!({ "model": m, "prompt": [1, 2, 999999] }),
            400,
            Some("prompt"),
        ),
        case("empty prompt", C, json!({ "model": m, "prompt": "" }), 400, Some("prompt")),
        case("empty prompt list", C, json!({ "model": m, "prompt": [] }), 400, Some("prompt")),
        case(
            "huge prompt",
            C,
            json!({ "model": m, "prompt": "hello ".repeat(100_000) }),
            400,
            None,
        ),
        case(
            "completion beyond the context",
            C,
            json!({ "model": m, "prompt": "hi", "max_tokens": 1_000_000 }),
            400,
            Some("max_tokens"),
        ),
        case(
            "stream is not a boolean",
            C,
            json!({ "model": m, "prompt": "hi", "stream": "yes" }),
            400,
            Some("stream"),
        ),
        case(
            "best_of below n",
            C,
            json!({ "model": m, "prompt": "hi", "n": 3, "best_of": 2 }),
            400,
            Some("best_of"),
        ),
        case(
            "best_of above n, streamed",
            C,
            json!({ "model": m, "prompt": "hi", "best_of": 3, "stream": true }),
            400,
            Some("best_of"),
        ),
        case(
            "echo with logprobs, streamed",
            C,
            json!({ "model": m, "prompt": "hi", "echo": true, "logprobs": 1, "stream": true }),
            400,
            Some("echo"),
        ),
        case(
            "length_penalty without beam search",
            C,
            json!({ "model": m, "prompt": "hi", "length_penalty": 0.5 }),
            400,
            Some("length_penalty"),
        ),
        case(
            "logit_bias",
            C,
            json!({ "model": m, "prompt": "hi", "logit_bias": { "50256": -100 } }),
            400,
            Some("logit_bias"),
        ),
        case("empty messages", CHAT, json!({ "model": m, "messages": [] }), 400, Some("messages")),
        case("missing messages", CHAT, json!({ "model": m }), 400, Some("messages")),
        case(
            "messages is a string",
            CHAT,
            json!({ "model": m, "messages": "hello" }),
            400,
            Some("messages"),
        ),
        case(
            "unknown role",
            CHAT,
            json!({ "model": m, "messages": [{ "role": "wizard", "content": "hi" }] }),
            400,
            Some("messages[0].role"),
        ),
        case(
            "message without role",
            CHAT,
            json!({ "model": m, "messages": [{ "content": "hi" }] }),
            400,
            Some("messages[0]"),
        ),
        case(
            "image content part",
            CHAT,
            json!({ "model": m, "messages": [{ "role": "user", "content": [{ "type": "image_url", "image_url": { "url": "x" } }] }] }),
            400,
            Some("messages[0].content[0].type"),
        ),
        case(
            "top_logprobs without logprobs",
            CHAT,
            json!({ "model": m, "messages": user, "top_logprobs": 3 }),
            400,
            Some("top_logprobs"),
        ),
        case(
            "tool with a bad name",
            CHAT,
            json!({ "model": m, "messages": user, "tools": [{ "type": "function", "function": { "name": "no spaces" } }] }),
            400,
            Some("tools[0].function.name"),
        ),
        case(
            "unknown response_format type",
            CHAT,
            json!({ "model": m, "messages": user, "response_format": { "type": "xml" } }),
            400,
            Some("response_format.type"),
        ),
        case(
            "schema that does not compile",
            C,
            json!({ "model": m, "prompt": "x", "response_format": { "type": "json_schema", "json_schema": { "name": "s", "schema": { "type": "object", "properties": { "a": { "type": "wat" } } } } } }),
            400,
            Some("response_format.json_schema.schema"),
        ),
        // Fields nobody reads are refused by name, never ignored.
        case(
            "vLLM guided_decoding_backend",
            C,
            json!({ "model": m, "prompt": "The capital of France is", "guided_choice": ["Paris", "Lyon"], "guided_decoding_backend": "xgrammar" }),
            400,
            Some("guided_decoding_backend"),
        ),
        case(
            "llama-server n_probs",
            CHAT,
            json!({ "model": m, "messages": user, "n_probs": 3 }),
            400,
            Some("n_probs"),
        ),
        case(
            "llama-server grammar with an undefined rule",
            CHAT,
            json!({ "model": m, "messages": user, "grammar": "root ::= answer" }),
            400,
            Some("grammar"),
        ),
        case(
            "tool_calls with arguments that are not an object",
            CHAT,
            json!({ "model": m, "messages": [{ "role": "user", "content": "hi" }, { "role": "assistant", "content": null, "tool_calls": [{ "id": "c1", "type": "function", "function": { "name": "f", "arguments": "[1]" } }] }] }),
            400,
            Some("messages[1].tool_calls[0].function.arguments"),
        ),
        case(
            "a message's name",
            CHAT,
            json!({ "model": m, "messages": [{ "role": "user", "content": "hi", "name": "bob" }] }),
            400,
            Some("messages[0].name"),
        ),
        case(
            "unknown stream option",
            C,
            json!({ "model": m, "prompt": "hi", "stream": true, "stream_options": { "continuous_usage_stats": true } }),
            400,
            Some("stream_options.continuous_usage_stats"),
        ),
        case(
            "chat completion beyond the context",
            CHAT,
            json!({ "model": m, "messages": user, "max_completion_tokens": 1_000_000 }),
            400,
            Some("max_completion_tokens"),
        ),
        case(
            "chat temperature is a string",
            CHAT,
            json!({ "model": m, "messages": user, "temperature": "warm" }),
            400,
            Some("temperature"),
        ),
        case(
            "max_tokens past i64",
            C,
            json!({ "model": m, "prompt": "hi", "max_tokens": i64::MAX }),
            400,
            Some("max_tokens"),
        ),
        case(
            "min_tokens past u32",
            C,
            json!({ "model": m, "prompt": "hi", "max_tokens": 8, "min_tokens": 4_294_967_301u64 }),
            400,
            Some("min_tokens"),
        ),
        case(
            "min_tokens above max_tokens",
            C,
            json!({ "model": m, "prompt": "hi", "max_tokens": 4, "min_tokens": 5 }),
            400,
            Some("min_tokens"),
        ),
        case(
            "stream_options without stream",
            C,
            json!({ "model": m, "prompt": "hi", "stream_options": { "include_usage": true } }),
            400,
            Some("stream_options"),
        ),
        case(
            "stop token outside the vocabulary",
            C,
            json!({ "model": m, "prompt": "hi", "stop_token_ids": [99_999_999] }),
            400,
            Some("stop_token_ids"),
        ),
        case(
            "user message with null content",
            CHAT,
            json!({ "model": m, "messages": [{ "role": "user", "content": null }] }),
            400,
            Some("messages[0].content"),
        ),
        raw("wrong method", "GET", C, "", 405),
        raw("unknown path", "POST", "/v1/embeddings", "{}", 404),
    ]
}

#[test]
fn malformed_requests_get_openai_errors() {
    let d = decode(&["--colocated"], &[]);
    let r = router(&[&d], &[]);
    let all = cases();
    assert!(all.len() >= 30);
    let mut failures = Vec::new();
    for c in &all {
        let res = http(&r.addr, c.method, c.path, Some(&c.body));
        let ok = (|| -> Result<(), String> {
            if res.status != c.status {
                return Err(format!("status {} (want {})", res.status, c.status));
            }
            let v: Value = serde_json::from_str(&res.body).map_err(|e| format!("not JSON: {e}"))?;
            let e = v.get("error").ok_or("no 'error' object")?;
            let msg = e["message"].as_str().ok_or("no message")?;
            if msg.is_empty()
                || !e["type"].is_string()
                || e.get("param").is_none()
                || e.get("code").is_none()
            {
                return Err(format!("incomplete error object {e}"));
            }
            if let Some(p) = c.param {
                if e["param"].as_str() != Some(p) {
                    return Err(format!("param {} (want {p}); message: {msg}", e["param"]));
                }
            }
            Ok(())
        })();
        if let Err(why) = ok {
            failures.push(format!(
                "{}: {why}\n    body: {}",
                c.name,
                res.body.chars().take(300).collect::<String>()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    // The server is unharmed and no request is left behind.
    let ok = http(
        &r.addr,
        "POST",
        C,
        Some(&json!({ "model": MODEL, "prompt": "hi", "max_tokens": 3 }).to_string()),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(wait_metric(&d.addr, "tandem_num_requests_running", 0.0), Some(0.0));
    let huge = http(
        &r.addr,
        "POST",
        C,
        Some(&json!({ "model": MODEL, "prompt": "hello ".repeat(200_000) }).to_string()),
    );
    assert!(
        huge.json()["error"]["message"].as_str().unwrap().contains("maximum context length"),
        "{}",
        huge.body
    );
    // Refused by its length before tokenizing: the message counts bytes, not tokens.
    assert!(
        huge.json()["error"]["message"].as_str().unwrap().contains("1200000 bytes"),
        "{}",
        huge.body
    );
}

#[test]
fn a_chat_without_max_tokens_gets_the_default_budget() {
    // Like vLLM's generation-config default and llama-server's -n: a chat that names no budget
    // stops at --default-max-tokens, not at the end of the context window.
    let d = decode(&["--colocated"], &[]);
    let r = router_with(&[&d], &[], &["--default-max-tokens=7"], &[]);
    let chat = |extra: Value| {
        let mut body = json!({ "model": MODEL, "messages": [{ "role": "user", "content": "Count from one to one hundred." }], "ignore_eos": true });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        http(&r.addr, "POST", CHAT, Some(&body.to_string())).json()
    };
    let v = chat(json!({}));
    assert_eq!(v["usage"]["completion_tokens"], 7, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    // An explicit budget wins, above or below the default.
    let v = chat(json!({ "max_tokens": 9 }));
    assert_eq!(v["usage"]["completion_tokens"], 9, "{v}");
    let v = chat(json!({ "max_completion_tokens": 3 }));
    assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
}
