//! Fault tests with real processes on loopback: a KV layout mismatch, a corrupted page, a decode
//! worker killed mid-stream, a prefill worker that stalls or is killed mid-transfer, a client
//! that goes away (also while its prompt waits at a frozen prefill worker, which then never
//! computes it). In each case the client gets tokens or an OpenAI error (the failure is
//! detected by the mechanism each test names, which the test checks; times are printed, not
//! asserted: the HTTP client's 120 s read timeout only guards against a hang), and the
//! surviving workers' free-block counts return to their baselines.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// The scenarios run one at a time: each starts its own processes on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn completion(r: &Proc, max_tokens: usize) -> (HttpResponse, Duration) {
    let body = json!({ "model": MODEL, "prompt": long_prompt(), "max_tokens": max_tokens, "temperature": 0 }).to_string();
    let t = Instant::now();
    let res = http(&r.addr, "POST", "/v1/completions", Some(&body));
    (res, t.elapsed())
}

fn assert_tokens(res: &HttpResponse, n: u64) {
    assert_eq!(res.status, 200, "{}", res.body);
    assert_eq!(res.json()["usage"]["completion_tokens"], n, "{}", res.body);
}

fn assert_baseline(w: &Proc, base: f64) {
    assert_eq!(
        wait_metric(&w.addr, "tandem_kv_cache_free_blocks", base),
        Some(base),
        "{} leaked KV blocks",
        w.name
    );
}

#[test]
fn layout_mismatch_is_refused_and_the_prompt_recomputed() {
    let _s = serial();
    let d = decode(&[], &[]);
    let p = prefill(&["--block-size=32"], &[]);
    let r = router(&[&d], &[&p]);
    let (d0, p0) = (free_blocks(&d), free_blocks(&p));
    let (res, took) = completion(&r, 8);
    assert_tokens(&res, 8);
    eprintln!("answered in {took:?}");
    assert!(
        p.log_text().contains("KV layout mismatch on block_size"),
        "the refusal names the field:\n{}",
        p.log_text()
    );
    assert!(
        metric(&p.addr, "tandem_kv_transfer_failures_total", &["reason=\"refused\""])
            .unwrap_or(0.0)
            >= 1.0
    );
    assert!(metric_sum(&d.addr, "tandem_kv_transfer_failures_total") >= 1.0);
    assert_baseline(&d, d0);
    assert_baseline(&p, p0);
}

#[test]
fn corrupted_page_recomputes_or_fails_by_policy() {
    let _s = serial();
    let fault = [("TANDEM_FAULT_INJECT", "corrupt-page")];
    let p = prefill(&[], &fault);
    let d = decode(&[], &[]);
    let d_fail = decode(&["--kv-failure-policy=fail"], &[]);
    let (p0, d0, f0) = (free_blocks(&p), free_blocks(&d), free_blocks(&d_fail));

    // recompute (default): the client gets its tokens.
    let r = router(&[&d], &[&p]);
    let (res, took) = completion(&r, 8);
    assert_tokens(&res, 8);
    eprintln!("answered in {took:?}");
    assert!(
        d.log_text().contains("corrupt"),
        "the decode worker reports the checksum failure:\n{}",
        d.log_text()
    );

    // fail: the client gets an OpenAI error naming the transfer.
    let r2 = router(&[&d_fail], &[&p]);
    let (res, took) = completion(&r2, 8);
    assert!(res.status >= 500, "{} {}", res.status, res.body);
    let err = &res.json()["error"];
    assert!(err["message"].as_str().unwrap().contains("KV transfer failed"), "{err}");
    eprintln!("answered in {took:?}");

    assert_baseline(&p, p0);
    assert_baseline(&d, d0);
    assert_baseline(&d_fail, f0);
}

#[test]
fn decode_worker_killed_mid_stream_ends_the_stream_with_an_error() {
    let _s = serial();
    let mut d = decode(&[], &[]);
    let p = prefill(&[], &[]);
    let r = router(&[&d], &[&p]);
    let p0 = free_blocks(&p);
    let body = json!({ "model": MODEL, "prompt": long_prompt(), "max_tokens": 1000, "ignore_eos": true, "temperature": 0, "stream": true }).to_string();
    let mut s = open_stream(&r.addr, "/v1/completions", &body);
    let head = read_until(&mut s, "\"text\":\"");
    assert!(head.contains("200 OK"), "{head}");
    d.kill();
    let t = Instant::now();
    let rest = read_until(&mut s, "[DONE]");
    let took = t.elapsed();
    assert!(rest.contains("\"error\""), "the stream ends with an error event:\n{rest}");
    eprintln!("error event {took:?} after the kill");
    assert_baseline(&p, p0);
    // With its only decode worker gone the router answers 503 at once, with the error JSON.
    let (res, _) = completion(&r, 4);
    assert_eq!(res.status, 503, "{}", res.body);
    assert!(res.json()["error"]["message"].is_string());
    assert_eq!(http(&r.addr, "GET", "/health", None).status, 503);
}

#[test]
fn stalled_or_killed_prefill_worker_is_detected_and_the_prompt_recomputed() {
    let _s = serial();
    let mut p = prefill(&[], &[("TANDEM_FAULT_INJECT", "stall-after-pages=1")]);
    let d = decode(&[], &[]);
    let r = router(&[&d], &[&p]);
    let d0 = free_blocks(&d);

    // A stall: the receiver's 2 s timeout notices, the decode worker recomputes.
    let (res, took) = completion(&r, 8);
    assert_tokens(&res, 8);
    eprintln!("answered in {took:?}");
    assert!(d.log_text().contains("stalled"), "{}", d.log_text());
    assert_baseline(&d, d0);

    // A kill mid-transfer: the call fails at once, the decode worker recomputes.
    let addr = r.addr.clone();
    let req = std::thread::spawn(move || {
        let body = json!({ "model": MODEL, "prompt": format!("Another prompt. {}", long_prompt()), "max_tokens": 8, "temperature": 0 }).to_string();
        http(&addr, "POST", "/v1/completions", Some(&body))
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.log_text().matches("stalling the transfer").count() < 2 {
        assert!(Instant::now() < deadline, "the prefill worker never started the second transfer");
        std::thread::sleep(Duration::from_millis(20));
    }
    p.kill();
    let t = Instant::now();
    let res = req.join().unwrap();
    assert_tokens(&res, 8);
    eprintln!("answered {:?} after the kill", t.elapsed());
    // Detected by the failed call, not by a timeout: a second "remote prefill failed".
    assert!(d.log_text().matches("remote prefill failed").count() >= 2, "{}", d.log_text());
    assert_baseline(&d, d0);
}

#[test]
fn client_going_away_aborts_the_request_and_frees_its_blocks() {
    let _s = serial();
    let d = decode(&[], &[]);
    let p = prefill(&[], &[]);
    let r = router(&[&d], &[&p]);
    let d0 = free_blocks(&d);
    let body = json!({ "model": MODEL, "prompt": long_prompt(), "max_tokens": 2000, "ignore_eos": true, "temperature": 0, "stream": true }).to_string();
    let mut s = open_stream(&r.addr, "/v1/completions", &body);
    read_until(&mut s, "\"text\":\"");
    assert!(free_blocks(&d) < d0, "the request holds blocks while it runs");
    drop(s);
    assert_baseline(&d, d0);
    assert_eq!(wait_metric(&d.addr, "tandem_num_requests_running", 0.0), Some(0.0));
    // A non-streaming client that hangs up is aborted too.
    let body = json!({ "model": MODEL, "prompt": long_prompt(), "max_tokens": 2000, "ignore_eos": true, "temperature": 0 }).to_string();
    let s = open_stream(&r.addr, "/v1/completions", &body);
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&d.addr, "tandem_num_requests_running", &[]) != Some(1.0) {
        assert!(Instant::now() < deadline, "the request never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    assert_baseline(&d, d0);
}

#[test]
fn a_prefill_the_decode_side_gave_up_on_is_never_computed() {
    let _s = serial();
    let p = prefill(&[], &[]);
    let d = decode(&[], &[]);
    let r = router(&[&d], &[&p]);
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &p.child.id().to_string()])
            .status()
            .unwrap()
            .success())
    };
    // The prefill worker is frozen while the request reaches it; its client then goes away,
    // which cancels the Prefill call. Once thawed, the worker must not compute that prompt.
    signal("-STOP");
    let body = json!({ "model": MODEL, "prompt": long_prompt(), "max_tokens": 8, "temperature": 0, "stream": true }).to_string();
    let s = open_stream(&r.addr, "/v1/completions", &body);
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&d.addr, "tandem_disagg_decisions_total", &["decision=\"remote\""]).unwrap_or(0.0)
        < 1.0
    {
        assert!(Instant::now() < deadline, "the decode worker never asked for the remote prefill");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    assert_eq!(wait_metric(&d.addr, "tandem_num_requests_running", 0.0), Some(0.0));
    std::thread::sleep(Duration::from_millis(500));
    signal("-CONT");
    // The worker is alive and serves the next prompt, but computed none of the abandoned one.
    std::thread::sleep(Duration::from_secs(2));
    // A computed prefill samples its first token; the abandoned one ended aborted, with none.
    assert_eq!(
        metric_sum(&p.addr, "tandem_generation_tokens_total"),
        0.0,
        "the abandoned prompt was prefilled"
    );
    assert_eq!(
        metric_sum(&p.addr, "tandem_request_prompt_tokens_count"),
        1.0,
        "the call reached the prefill worker and ended there"
    );
    let (res, _) = completion(&r, 4);
    assert_tokens(&res, 4);
    assert!(metric_sum(&p.addr, "tandem_generation_tokens_total") > 0.0);
}
