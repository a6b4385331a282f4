//! The fault matrix, with real processes on loopback under load: `kill -9` of a prefill worker,
//! of a decode worker and of one of two router replicas; Redis stopped and restarted; a worker
//! that stops answering without dying (SIGSTOP). In every case:
//! - every client request ends with tokens or an OpenAI error (a JSON error body or an SSE error
//!   event) within 60 s (silence that long counts as a hang and fails the test; the measured
//!   times are far shorter and printed); only the clients of a killed router see their
//!   connection drop, as they would behind a load balancer;
//! - nothing is duplicated: every successful request has exactly its `max_tokens` tokens (they
//!   ignore EOS) and one `[DONE]` when streamed;
//! - `/health` tells the truth about the failed component, and service resumes when it is back;
//! - the surviving workers' free KV blocks return to their baselines.
//!
//! Times to error and to recovery are printed (the closing figures come from this test), not
//! asserted.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const MAX_TOKENS: u64 = 24;

/// How one client request ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok,
    /// An OpenAI error (status, message).
    ApiError(u16, String),
    /// The connection failed or dropped without an HTTP answer.
    Connection(String),
    /// Nothing arrived for 60 s.
    Hung,
    /// Tokens missing or repeated.
    Wrong(String),
}

#[derive(Debug, Clone)]
struct Record {
    router: usize,
    start: Instant,
    end: Instant,
    outcome: Outcome,
}

fn one_request(addr: &str, i: u64) -> Outcome {
    let stream = i.is_multiple_of(2);
    let prompt = format!("Request {i}: {}", long_prompt());
    let mut body = json!({ "model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": true, "temperature": 0, "stream": stream });
    if stream {
        body["stream_options"] = json!({ "include_usage": true });
    }
    let body = body.to_string();
    let req = format!("POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let res = match http_raw(addr, req.as_bytes(), Duration::from_secs(60)) {
        Ok(r) => r,
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            return Outcome::Hung
        }
        Err(e) => return Outcome::Connection(e.to_string()),
    };
    if res.status == 0 {
        return Outcome::Connection("no HTTP answer".into());
    }
    if res.status != 200 {
        return match serde_json::from_str::<Value>(&res.body) {
            Ok(v) if v["error"]["message"].is_string() => {
                Outcome::ApiError(res.status, v["error"]["message"].as_str().unwrap().to_string())
            }
            _ => Outcome::Wrong(format!("status {} without error JSON: {}", res.status, res.body)),
        };
    }
    if !stream {
        let v: Value = match serde_json::from_str(&res.body) {
            Ok(v) => v,
            Err(_) => return Outcome::Wrong(format!("not JSON: {}", res.body)),
        };
        return if v["usage"]["completion_tokens"] == MAX_TOKENS {
            Outcome::Ok
        } else {
            Outcome::Wrong(format!("usage {}", v["usage"]))
        };
    }
    let events: Vec<&str> = res.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    if let Some(e) = events.iter().find(|e| e.contains("\"error\"")) {
        return Outcome::ApiError(200, e.to_string());
    }
    let done = events.iter().filter(|e| **e == "[DONE]").count();
    let usage = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find(|v| v["usage"].is_object())
        .map(|v| v["usage"]["completion_tokens"].clone());
    if done == 1 && usage == Some(json!(MAX_TOKENS)) {
        Outcome::Ok
    } else if done == 0 {
        // The stream ended without [DONE] or an error event: only a dropped connection does that.
        Outcome::Connection(format!("stream cut after {} events", events.len()))
    } else {
        Outcome::Wrong(format!("{done} [DONE], usage {usage:?}"))
    }
}

/// Client threads sending requests back to back to the routers (client `c` to router
/// `c % routers.len()`), until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<Vec<Record>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(routers: &[String], clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|c| {
                let (addr, router) = (routers[c % routers.len()].clone(), c % routers.len());
                let (stop, records) = (stop.clone(), records.clone());
                std::thread::spawn(move || {
                    let mut i = c as u64 * 1000;
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        let outcome = one_request(&addr, i);
                        let refused = matches!(outcome, Outcome::Connection(_));
                        records.lock().unwrap().push(Record {
                            router,
                            start,
                            end: Instant::now(),
                            outcome,
                        });
                        if refused {
                            // A client whose router is gone retries at a human pace.
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        Load { stop, records, threads }
    }

    fn finish(self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(self.records).unwrap().into_inner().unwrap()
    }
}

/// Checks the records: nothing hung or wrong; connection failures only where `dropped_router`
/// allows; returns (ok count, errors, longest time from `fault` to the end of a request that
/// was in flight at the fault).
fn check(
    records: &[Record],
    fault: Instant,
    dropped_router: Option<usize>,
) -> (usize, usize, Duration) {
    let mut ok = 0;
    let mut errors = 0;
    let mut to_end = Duration::ZERO;
    for r in records {
        match &r.outcome {
            Outcome::Ok => ok += 1,
            Outcome::ApiError(..) => errors += 1,
            Outcome::Connection(e) => assert_eq!(
                Some(r.router),
                dropped_router,
                "a client of a live router lost its connection: {e}"
            ),
            Outcome::Hung => panic!("a request hung: {r:?}"),
            Outcome::Wrong(e) => {
                panic!("a request was answered wrongly (dropped or duplicated tokens): {e}")
            }
        }
        if r.start <= fault && r.end >= fault {
            to_end = to_end.max(r.end - fault);
        }
    }
    (ok, errors, to_end)
}

fn health(router: &Proc) -> Value {
    let h = http(&router.addr, "GET", "/health", None);
    let mut v: Value = serde_json::from_str(&h.body).unwrap_or(json!({}));
    v["status_code"] = json!(h.status);
    v
}

/// Waits until the router's /health reports the worker at `addr` as `healthy`; returns how long.
fn wait_worker_health(router: &Proc, addr: &str, healthy: bool) -> Duration {
    let t = Instant::now();
    loop {
        let h = health(router);
        let w =
            h["workers"].as_array().into_iter().flatten().find(|w| w["address"] == addr).cloned();
        if w.is_some_and(|w| w["healthy"] == healthy) {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the router's /health never said {addr} healthy={healthy}: {h}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The worker's free blocks return to `base` (within 30 s of the load stopping: transfers to a
/// dead peer end by their own timeouts).
fn assert_baseline(w: &Proc, base: f64) {
    let t = Instant::now();
    let mut last = None;
    while t.elapsed() < Duration::from_secs(30) {
        last = metric(&w.addr, "tandem_kv_cache_free_blocks", &[]);
        if last == Some(base) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{} leaked KV blocks: {last:?} free, baseline {base}\n{}", w.name, w.log_text());
}

fn signal(p: &Proc, sig: &str) {
    assert!(std::process::Command::new("kill")
        .args([sig, &p.child.id().to_string()])
        .status()
        .unwrap()
        .success());
}

#[test]
fn prefill_worker_killed_under_load() {
    let _s = serial();
    let d = decode(&[], &[]);
    let p1 = prefill(&[], &[]);
    let mut p2 = prefill(&[], &[]);
    let r = router(&[&d], &[&p1, &p2]);
    let d0 = free_blocks(&d);
    let p10 = free_blocks(&p1);
    let load = Load::start(std::slice::from_ref(&r.addr), 4);
    std::thread::sleep(Duration::from_secs(4));
    let fault = Instant::now();
    let p2_addr = p2.addr.clone();
    p2.kill();
    let seen = wait_worker_health(&r, &p2_addr, false);
    assert_eq!(health(&r)["status_code"], 200, "decode still serves: the router stays ready");
    std::thread::sleep(Duration::from_secs(4));
    let restarted = prefill(&[&format!("--listen={p2_addr}")], &[]);
    let t = Instant::now();
    let back = wait_worker_health(&r, &p2_addr, true);
    // The load goes on until the restarted worker has prefilled prompts again.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&restarted.addr, "tandem_prompt_tokens_total", &[]).unwrap_or(0.0) == 0.0 {
        assert!(Instant::now() < deadline, "the restarted prefill worker takes no work");
        std::thread::sleep(Duration::from_millis(200));
    }
    let records = load.finish();
    let (ok, errors, to_end) = check(&records, fault, None);
    assert_eq!(errors, 0, "with recompute every request is served: {records:?}");
    assert_baseline(&d, d0);
    assert_baseline(&p1, p10);
    eprintln!("prefill kill -9: {ok} served, {errors} errors; in-flight requests ended {to_end:?} after the kill; /health unhealthy after {seen:?}; healthy again {back:?} after restart ({:?} incl. start)", t.elapsed());
}

#[test]
fn decode_worker_killed_under_load() {
    let _s = serial();
    let mut d1 = decode(&[], &[]);
    let d2 = decode(&[], &[]);
    let p = prefill(&[], &[]);
    let r = router(&[&d1, &d2], &[&p]);
    let (d20, p0) = (free_blocks(&d2), free_blocks(&p));
    let load = Load::start(std::slice::from_ref(&r.addr), 4);
    std::thread::sleep(Duration::from_secs(4));
    let fault = Instant::now();
    let d1_addr = d1.addr.clone();
    d1.kill();
    let seen = wait_worker_health(&r, &d1_addr, false);
    assert_eq!(health(&r)["status_code"], 200, "one decode worker left: still ready");
    std::thread::sleep(Duration::from_secs(4));
    let restarted = decode(&[&format!("--listen={d1_addr}")], &[]);
    let back = wait_worker_health(&r, &d1_addr, true);
    std::thread::sleep(Duration::from_secs(5));
    let records = load.finish();
    let (ok, errors, to_end) = check(&records, fault, None);
    // Requests sent once the router knew should normally all succeed; a stream the router had
    // already sent to the dying worker may still end in an error. Printed, not asserted.
    let after: Vec<&Record> =
        records.iter().filter(|x| x.start > fault + seen && x.outcome != Outcome::Ok).collect();
    eprintln!("requests sent after the failure was seen that did not succeed: {after:?}");
    assert!(
        metric(&restarted.addr, "tandem_generation_tokens_total", &[]).unwrap_or(0.0) > 0.0,
        "the restarted decode worker serves again"
    );
    assert_baseline(&d2, d20);
    assert_baseline(&p, p0);
    eprintln!("decode kill -9: {ok} served, {errors} OpenAI errors (streams cut on the dead worker); in-flight requests ended {to_end:?} after the kill; /health unhealthy after {seen:?}; healthy again {back:?} after restart");
}

#[test]
fn router_replica_killed_under_load() {
    let _s = serial();
    let redis = RedisServer::start(None);
    let env = [("TANDEM_REDIS_URL", redis.url.as_str())];
    let d = decode(&[], &env);
    let p = prefill(&[], &env);
    let r1 = router_with(&[&d], &[&p], &[], &env);
    let mut r2 = router_with(&[&d], &[&p], &[], &env);
    let (d0, p0) = (free_blocks(&d), free_blocks(&p));
    let load = Load::start(&[r1.addr.clone(), r2.addr.clone()], 4);
    std::thread::sleep(Duration::from_secs(4));
    let fault = Instant::now();
    let r2_addr = r2.addr.clone();
    r2.kill();
    std::thread::sleep(Duration::from_secs(4));
    let restarted = router_with(&[&d], &[&p], &[&format!("--listen={r2_addr}")], &env);
    let t = Instant::now();
    let res = http(
        &restarted.addr,
        "POST",
        "/v1/completions",
        Some(&json!({ "model": MODEL, "prompt": "Hello", "max_tokens": 4 }).to_string()),
    );
    assert_eq!(res.status, 200, "{}", res.body);
    let back = t.elapsed();
    let records = load.finish();
    let (ok, errors, _) = check(&records, fault, Some(1));
    let cut = records.iter().filter(|x| matches!(x.outcome, Outcome::Connection(_))).count();
    assert_eq!(errors, 0, "the surviving router's clients are all served");
    // The dead router's requests were cancelled at the decode worker: its blocks come back.
    assert_baseline(&d, d0);
    assert_baseline(&p, p0);
    eprintln!("router kill -9: {ok} served, {cut} connections of the dead router's clients dropped, 0 errors on the survivor; restarted router served {back:?} after start");
}

#[test]
fn redis_stopped_and_restarted_under_load() {
    let _s = serial();
    // A managed Redis as pods see it: TLS with a private CA and a password, every setting from
    // the environment (URL without the password, the password apart, the CA file).
    let certs = tls_certs("fault-redis");
    let opts = RedisOptions {
        password: Some("pw".into()),
        tls: Some(certs.clone()),
        ..Default::default()
    };
    let mut redis = RedisServer::start_with(None, opts);
    let env = [
        ("TANDEM_REDIS_URL", redis.url.replace(":pw@", "")),
        ("TANDEM_REDIS_PASSWORD", "pw".to_string()),
        ("TANDEM_REDIS_CA_CERT", certs.join("ca.pem").display().to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let d = decode(&[], &env);
    let p = prefill(&[], &env);
    let r1 = router_with(&[&d], &[&p], &[], &env);
    let r2 = router_with(&[&d], &[&p], &[], &env);
    let (d0, p0) = (free_blocks(&d), free_blocks(&p));
    let load = Load::start(&[r1.addr.clone(), r2.addr.clone()], 4);
    std::thread::sleep(Duration::from_secs(3));
    let fault = Instant::now();
    redis.stop();
    let wait_redis = |up: f64| {
        let t = Instant::now();
        while metric(&r1.addr, "tandem_router_redis_up", &[]) != Some(up) {
            assert!(t.elapsed() < Duration::from_secs(30), "redis_up never became {up}");
            std::thread::sleep(Duration::from_millis(50));
        }
        t.elapsed()
    };
    let seen = wait_redis(0.0);
    assert_eq!(
        health(&r1)["status_code"],
        200,
        "routing degrades to the approximate index; serving goes on"
    );
    std::thread::sleep(Duration::from_secs(4));
    redis.restart();
    let back = wait_redis(1.0);
    std::thread::sleep(Duration::from_secs(3));
    let records = load.finish();
    let (ok, errors, _) = check(&records, fault, None);
    assert_eq!(errors, 0, "no request fails for Redis");
    assert!(
        debug_routing(&r1)["exact_index_live"] == true
            || metric(&r1.addr, "tandem_router_exact_index_live", &[]) == Some(1.0),
        "the exact index is live again"
    );
    assert_baseline(&d, d0);
    assert_baseline(&p, p0);
    eprintln!("redis stop/start: {ok} served, 0 errors; routers noticed the outage after {seen:?}, were back on Redis {back:?} after it restarted");
}

#[test]
fn stopped_workers_are_detected_and_recover_under_load() {
    let _s = serial();
    let d1 = decode(&[], &[]);
    let d2 = decode(&[], &[]);
    let p = prefill(&[], &[]);
    let r = router(&[&d1, &d2], &[&p]);
    let (d10, d20, p0) = (free_blocks(&d1), free_blocks(&d2), free_blocks(&p));
    let load = Load::start(std::slice::from_ref(&r.addr), 4);
    std::thread::sleep(Duration::from_secs(4));

    // A decode worker freezes: its streams are cut by the HTTP/2 keep-alive, its status checks
    // time out, new requests go to the other one.
    let fault = Instant::now();
    signal(&d1, "-STOP");
    let seen = wait_worker_health(&r, &d1.addr, false);
    std::thread::sleep(Duration::from_secs(4));
    signal(&d1, "-CONT");
    let back = wait_worker_health(&r, &d1.addr, true);

    // The prefill worker freezes: transfers stall and decode workers recompute locally.
    std::thread::sleep(Duration::from_secs(2));
    let fault_p = Instant::now();
    signal(&p, "-STOP");
    let seen_p = wait_worker_health(&r, &p.addr, false);
    std::thread::sleep(Duration::from_secs(4));
    signal(&p, "-CONT");
    let back_p = wait_worker_health(&r, &p.addr, true);
    std::thread::sleep(Duration::from_secs(3));
    let records = load.finish();
    let (ok, errors, to_end) = check(&records, fault, None);
    let (_, _, to_end_p) = check(&records, fault_p, None);
    assert_baseline(&d1, d10);
    assert_baseline(&d2, d20);
    assert_baseline(&p, p0);
    eprintln!("SIGSTOP decode: in-flight requests ended {to_end:?} after the stop; /health unhealthy after {seen:?}; healthy {back:?} after SIGCONT. SIGSTOP prefill: in-flight ended {to_end_p:?} after; unhealthy after {seen_p:?}; healthy {back_p:?} after SIGCONT. {ok} served, {errors} OpenAI errors");
}
