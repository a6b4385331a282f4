//! Security at the edges, with real processes: API keys (401 with OpenAI's error JSON), per-key
//! concurrency and rate limits (429 with Retry-After), body and prompt size limits, tenant
//! isolation of the prefix cache, and the shared secret on internal gRPC calls.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

const KEY_A: &str = "sk-tenant-a-0001";
const KEY_A2: &str = "sk-tenant-a-0002";
const KEY_B: &str = "sk-tenant-b-0001";

use common::http_key as call;

fn completion(prompt: &str, max_tokens: u32) -> String {
    json!({ "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0 })
        .to_string()
}

fn assert_error(r: &HttpResponse, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let e = &r.json()["error"];
    assert!(e["message"].is_string() && e["type"].is_string(), "{e}");
    assert_eq!(e["code"], code, "{e}");
}

#[test]
fn api_keys_limits_and_tenant_isolation() {
    let keys = std::env::temp_dir().join(format!("tandem-keys-{}", std::process::id()));
    std::fs::write(&keys, format!("# test keys\n{KEY_A}:team-a\n{KEY_A2}:team-a\n")).unwrap();
    let d = decode(&[], &[]);
    let r = router_with(
        &[&d],
        &[],
        &[
            &format!("--api-keys-file={}", keys.display()),
            "--max-concurrent-per-key=1",
            "--max-body-bytes=4096",
            "--max-prompt-tokens=64",
        ],
        &[("TANDEM_API_KEYS", &format!("{KEY_B}:team-b"))],
    );

    // Keys.
    assert_error(
        &call(&r.addr, "POST", "/v1/completions", Some(&completion("Hi", 2)), None),
        401,
        "invalid_api_key",
    );
    assert_error(
        &call(
            &r.addr,
            "POST",
            "/v1/completions",
            Some(&completion("Hi", 2)),
            Some("sk-wrong-key-000"),
        ),
        401,
        "invalid_api_key",
    );
    assert_error(&call(&r.addr, "GET", "/v1/models", None, None), 401, "invalid_api_key");
    assert_error(&call(&r.addr, "GET", "/debug/routing", None, None), 401, "invalid_api_key");
    assert_eq!(call(&r.addr, "GET", "/v1/models", None, Some(KEY_B)).status, 200);
    assert_eq!(call(&r.addr, "GET", "/health", None, None).status, 200, "probes need no key");
    assert_eq!(call(&r.addr, "GET", "/metrics", None, None).status, 200, "scrapers need no key");
    assert!(!r.log_text().contains(KEY_A) && !r.log_text().contains(KEY_B), "keys never logged");

    // Size limits.
    let big = completion(&"word ".repeat(2000), 2);
    let res = call(&r.addr, "POST", "/v1/completions", Some(&big), Some(KEY_A));
    assert_eq!(res.status, 413, "{}", res.body);
    assert!(res.json()["error"]["message"].is_string());
    let long = completion(&"word ".repeat(100), 2);
    let res = call(&r.addr, "POST", "/v1/completions", Some(&long), Some(KEY_A));
    assert_eq!(res.status, 400, "{}", res.body);
    assert_eq!(res.json()["error"]["param"], "prompt");

    // Per-key concurrency: a second request of the same key while a stream runs is refused;
    // another key is not affected; the slot comes back when the stream ends.
    // Long enough to be in flight while the next requests are made.
    let stream = json!({ "model": MODEL, "prompt": "Count slowly:", "max_tokens": 128, "ignore_eos": true, "stream": true }).to_string();
    let mut s = open_stream_key(&r.addr, "/v1/completions", &stream, Some(KEY_A));
    let head = read_until(&mut s, "data: {");
    assert!(head.contains("200 OK"), "{head}");
    let busy = call(&r.addr, "POST", "/v1/completions", Some(&completion("Hi", 2)), Some(KEY_A));
    assert_error(&busy, 429, "concurrency_limit_exceeded");
    assert!(busy.body.contains("concurrent"));
    assert_eq!(
        call(&r.addr, "POST", "/v1/completions", Some(&completion("Hi", 2)), Some(KEY_A2)).status,
        200,
        "the limit is per key"
    );
    assert_eq!(
        call(&r.addr, "POST", "/v1/completions", Some(&completion("Hi", 2)), Some(KEY_B)).status,
        200,
        "other keys are not limited by it"
    );
    let rest = read_until(&mut s, "data: [DONE]");
    assert!(rest.contains("[DONE]"), "{rest}");
    drop(s);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        call(&r.addr, "POST", "/v1/completions", Some(&completion("Hi", 2)), Some(KEY_A)).status,
        200,
        "the slot came back"
    );

    // Tenant isolation: team-a's second request of a prompt hits its cached prefix; team-b's
    // identical prompt does not (no timing side channel across tenants).
    let prompt = "The committee met on Tuesday to discuss the annual budget for the library, the parks and the roads of the town.";
    let hits = |d: &Proc| metric(&d.addr, "tandem_prefix_cache_hits_total", &[]).unwrap();
    assert_eq!(
        call(&r.addr, "POST", "/v1/completions", Some(&completion(prompt, 2)), Some(KEY_A)).status,
        200
    );
    let h0 = wait_stable(|| hits(&d));
    assert_eq!(
        call(&r.addr, "POST", "/v1/completions", Some(&completion(prompt, 2)), Some(KEY_B)).status,
        200
    );
    let h1 = wait_stable(|| hits(&d));
    assert_eq!(h1, h0, "another tenant's prompt must not hit team-a's cache");
    assert_eq!(
        call(&r.addr, "POST", "/v1/completions", Some(&completion(prompt, 2)), Some(KEY_A2)).status,
        200
    );
    let h2 = wait_stable(|| hits(&d));
    assert!(h2 > h1, "the same tenant (another key) shares its cached prefix");
    let _ = std::fs::remove_file(&keys);
}

/// Reads `f` until two reads 300 ms apart agree (the worker publishes metrics on its own clock).
fn wait_stable(f: impl Fn() -> f64) -> f64 {
    let mut last = f();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(300));
        let v = f();
        if v == last {
            return v;
        }
        last = v;
    }
    last
}

#[test]
fn request_rate_per_key() {
    let d = decode(&[], &[]);
    // One token per 20 s: the second request is refused however slow the machine is.
    let r = router_with(
        &[&d],
        &[],
        &["--requests-per-second-per-key=0.05"],
        &[("TANDEM_API_KEYS", KEY_A)],
    );
    let models = |k| call(&r.addr, "GET", "/v1/models", None, Some(k));
    assert_eq!(models(KEY_A).status, 200);
    let limited = models(KEY_A);
    assert_error(&limited, 429, "rate_limit_exceeded");
    assert!(limited.body.contains("Retry after"), "{}", limited.body);
}

#[test]
fn internal_calls_need_the_shared_secret() {
    let secret = [("TANDEM_INTERNAL_TOKEN", "internal-secret-1")];
    let d = decode(&["--zero-freed-blocks"], &secret);
    let p = prefill(&[], &secret);
    // With the secret: served, through the prefill worker.
    let good = router_with(&[&d], &[&p], &[], &secret);
    let res =
        call(&good.addr, "POST", "/v1/completions", Some(&completion(&long_prompt(), 4)), None);
    assert_eq!(res.status, 200, "{}", res.body);
    assert_eq!(
        metric(&d.addr, "tandem_disagg_decisions_total", &["decision=\"remote\""]),
        Some(1.0),
        "decode → prefill carried the secret"
    );
    // Without it (or with another), every call is refused: the router sees no usable worker.
    for env in [vec![], vec![("TANDEM_INTERNAL_TOKEN", "not-the-secret")]] {
        let bad = router_with(&[&d], &[&p], &[], &env);
        let h = call(&bad.addr, "GET", "/health", None, None);
        assert_eq!(h.status, 503, "{}", h.body);
        assert!(h.body.contains("internal token"), "{}", h.body);
        let res = call(&bad.addr, "POST", "/v1/completions", Some(&completion("Hi", 2)), None);
        assert!(res.status >= 500, "{}", res.body);
        assert!(res.json()["error"]["message"].is_string());
    }
    assert!(d.log_text().contains("refused an internal call"), "{}", d.log_text());
    // The worker still serves the router that knows the secret.
    assert_eq!(
        call(&good.addr, "POST", "/v1/completions", Some(&completion("Hello", 2)), None).status,
        200
    );
}
