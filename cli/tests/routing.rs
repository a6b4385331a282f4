//! Prefix-aware routing with real processes: 2 router replicas, 3 prefill workers and a decode
//! worker sharing a real Redis (with a password and TLS). Requests that share a system prompt land on the worker that
//! caches it; one dominant prefix still spreads over the workers; a restarted worker's stale
//! index entries disappear; routing survives Redis going away and coming back.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// The scenarios run one at a time: the load-balance check needs its burst of requests to be
/// routed before the first of them finishes.
static SERIAL: Mutex<()> = Mutex::new(());

fn system_prompt(i: usize) -> String {
    let topics = [
        "the history of astronomy",
        "baking sourdough bread",
        "the rules of chess",
        "sailing across the Atlantic",
    ];
    format!("System {i}: You are an expert on {}. Answer carefully, cite the facts you rely on, and keep every answer short, friendly and precise. ", topics[i]).repeat(3)
}

fn user_turn(i: usize) -> String {
    format!("User question number {i}: what would you recommend to someone who starts today, and which mistakes should they avoid first? Please answer in one short sentence. ")
}

fn decision(router: &Proc, id: &str) -> Value {
    let d = debug_routing(router);
    d["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["request_id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no decision for {id}: {d}"))
}

/// Waits until both routers see no booked prefill load anywhere (the last request's release
/// has reached the other replica through Redis).
fn wait_idle(routers: &[&Proc]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for r in routers {
        loop {
            let d = debug_routing(r);
            if d["workers"].as_array().unwrap().iter().all(|w| w["queued_prefill_tokens"] == 0.0) {
                break;
            }
            assert!(Instant::now() < deadline, "load never drained: {d}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn prefix_aware_routing_across_router_replicas() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Redis as a platform team runs it: a password and TLS with the team's own CA.
    let certs = tls_certs("routing-redis");
    let opts = RedisOptions {
        password: Some("pw".into()),
        tls: Some(certs.clone()),
        ..Default::default()
    };
    let redis = RedisServer::start_with(None, opts);
    let ca = certs.join("ca.pem").display().to_string();
    let env = [("TANDEM_REDIS_CA_CERT", ca.as_str())];
    let rflag = format!("--redis-url={}", redis.url);
    let prefills: Vec<Proc> =
        (0..3).map(|i| prefill(&[&rflag, &format!("--worker-id=prefill-{i}")], &env)).collect();
    let d = decode(&[&rflag, "--worker-id=decode-0", "--disagg-min-tokens=1"], &env);
    let p_refs: Vec<&Proc> = prefills.iter().collect();
    let mk_router = || {
        let mut a: Vec<String> = vec![
            "router".into(),
            "--listen=127.0.0.1:0".into(),
            rflag.clone(),
            "--model".into(),
            model(),
        ];
        a.push(format!("--decode-workers={}", d.addr));
        a.push(format!(
            "--prefill-workers={}",
            p_refs.iter().map(|p| p.addr.as_str()).collect::<Vec<_>>().join(",")
        ));
        Proc::start("router", &a, &env)
    };
    let routers = [mk_router(), mk_router()];
    for r in &routers {
        let deadline = Instant::now() + Duration::from_secs(10);
        while debug_routing(r)["index"] != "exact" {
            assert!(Instant::now() < deadline, "the router never switched to the exact index");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // 1. Shared system prompts, sequential requests alternating between the routers: every
    //    request after the first of its prefix finds the prefix cached where it is sent.
    let mut k = 0;
    for round in 0..3 {
        for s in 0..4 {
            let r = &routers[k % 2];
            k += 1;
            let id = complete(r, &format!("{}{}", system_prompt(s), user_turn(round)));
            let dec = decision(r, &id);
            let matched = dec["matched_blocks"].as_u64().unwrap();
            let chosen = dec["prefill"]["chosen"].as_str().unwrap().to_string();
            eprintln!(
                "prefix {s} round {round}: router {} -> {chosen}, matched {matched}/{} blocks",
                k % 2,
                dec["prompt_blocks"]
            );
            if round == 0 {
                assert_eq!(matched, 0, "a new prefix cannot be cached yet: {dec}");
            } else {
                assert!(
                    matched > 0,
                    "prefix {s} round {round} was sent where it is not cached: {dec}"
                );
            }
            let worker_id = dec["prefill"]["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["worker"] == chosen.as_str())
                .unwrap()["worker_id"]
                .as_str()
                .unwrap()
                .to_string();
            wait_indexed(&[&routers[0], &routers[1]], &worker_id, 1);
            wait_idle(&[&routers[0], &routers[1]]);
        }
    }

    // 2. One prefix dominates: 24 concurrent requests through both routers. The holder of the
    //    prefix computes only the suffix of each, so it may take more requests, but the prefill
    //    work booked per worker (uncached prompt tokens) stays balanced: the busiest worker has
    //    at most one uncached prompt more work than the idlest per router replica (two replicas
    //    deciding at the same instant each see the other's booking only once it is published,
    //    so both may pick the same worker), and every worker gets some.
    let hot = system_prompt(0);
    let handles: Vec<_> = (0..24)
        .map(|i| {
            let (addr, prompt) =
                (routers[i % 2].addr.clone(), format!("{hot}{}", user_turn(100 + i)));
            std::thread::spawn(move || {
                let body =
                    json!({ "model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0 })
                        .to_string();
                let res = http(&addr, "POST", "/v1/completions", Some(&body));
                assert_eq!(res.status, 200, "{}", res.body);
                (i % 2, res.json()["id"].as_str().unwrap().to_string())
            })
        })
        .collect();
    let mut requests = std::collections::HashMap::<String, usize>::new();
    let mut work = std::collections::HashMap::<String, u64>::new();
    let mut largest = 0;
    for h in handles {
        let (ri, id) = h.join().unwrap();
        let dec = decision(&routers[ri], &id);
        let chosen = dec["prefill"]["chosen"].as_str().unwrap().to_string();
        let c = dec["prefill"]["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["worker"] == chosen.as_str())
            .unwrap()
            .clone();
        let uncached =
            dec["prompt_tokens"].as_u64().unwrap() - 16 * c["cached_blocks"].as_u64().unwrap();
        largest = largest.max(dec["prompt_tokens"].as_u64().unwrap());
        *requests.entry(chosen.clone()).or_default() += 1;
        *work.entry(chosen).or_default() += uncached;
    }
    eprintln!("dominant prefix, 24 concurrent requests per worker: {requests:?}; booked prefill tokens: {work:?}");
    assert_eq!(work.len(), 3, "every worker takes part: {requests:?}");
    let (max, min) = (*work.values().max().unwrap(), *work.values().min().unwrap());
    let slack = routers.len() as u64 * largest;
    assert!(
        max <= min + slack,
        "prefill work unbalanced beyond one prompt per replica ({largest} tokens): {work:?}"
    );

    // 3. Nothing leaked anywhere.
    for p in &prefills {
        assert_eq!(wait_metric(&p.addr, "tandem_num_requests_running", 0.0), Some(0.0));
    }
    assert_eq!(wait_metric(&d.addr, "tandem_num_requests_running", 0.0), Some(0.0));
}

#[test]
fn restarted_worker_is_purged_and_redis_outage_degrades_gracefully() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Redis with a password (requirepass).
    let opts = RedisOptions { password: Some("pw".into()), ..Default::default() };
    let mut redis = RedisServer::start_with(None, opts.clone());
    let rflag = format!("--redis-url={}", redis.url);
    let mut p0 = prefill(&[&rflag, "--worker-id=prefill-0"], &[]);
    let p1 = prefill(&[&rflag, "--worker-id=prefill-1"], &[]);
    let d = decode(&[&rflag, "--worker-id=decode-0", "--disagg-min-tokens=1"], &[]);
    let mut a: Vec<String> = vec![
        "router".into(),
        "--listen=127.0.0.1:0".into(),
        rflag.clone(),
        "--model".into(),
        model(),
    ];
    a.push(format!("--decode-workers={}", d.addr));
    a.push(format!("--prefill-workers={},{}", p0.addr, p1.addr));
    let r = Proc::start("router", &a, &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while debug_routing(&r)["index"] != "exact" {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Fill prefill-0's cache: send prompts until one lands there.
    // Cold workers tie, and ties are broken at random: distinct prompts until one lands there.
    let mut on_p0 = false;
    for i in 0..24 {
        let id = complete(&r, &format!("Attempt {i}. {}{}", system_prompt(i % 4), user_turn(i)));
        on_p0 |= decision(&r, &id)["prefill"]["chosen"] == p0.addr.as_str();
        if on_p0 {
            break;
        }
    }
    assert!(on_p0, "no request went to prefill-0");
    wait_indexed(&[&r], "prefill-0", 1);

    // Kill and restart prefill-0 on the same port: the new process's first event (cleared,
    // new epoch) replaces the old entries.
    let epoch_of = |dbg: &Value| {
        dbg["exact_workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["worker_id"] == "prefill-0")
            .map(|w| w["epoch"].clone())
    };
    let old_epoch = epoch_of(&debug_routing(&r)).expect("prefill-0 is indexed");
    let addr = p0.addr.clone();
    p0.kill();
    let restarted = prefill(&[&rflag, "--worker-id=prefill-0", &format!("--listen={addr}")], &[]);
    let t = Instant::now();
    let deadline = t + Duration::from_secs(30);
    loop {
        let dbg = debug_routing(&r);
        let w = dbg["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["address"] == addr.as_str())
            .cloned()
            .unwrap();
        let epoch = epoch_of(&dbg);
        if w["indexed_blocks"] == 0 && epoch.is_some() && epoch != Some(old_epoch.clone()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted worker's new epoch never replaced its old entries: {dbg}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("restarted worker's stale entries gone {:?} after it was ready", t.elapsed());

    // Redis goes away: requests still succeed (approximate index), and routing returns to the
    // exact index when Redis comes back on the same port.
    let port = redis.port;
    redis.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while debug_routing(&r)["index"] != "approximate" {
        assert!(Instant::now() < deadline, "the router did not notice Redis going away");
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..3 {
        complete(&r, &format!("{}{}", system_prompt(1), user_turn(200 + i)));
    }
    let _redis2 = RedisServer::start_with(Some(port), opts);
    let deadline = Instant::now() + Duration::from_secs(15);
    while debug_routing(&r)["index"] != "exact" {
        assert!(Instant::now() < deadline, "the router did not return to the exact index");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The resync brought back what the workers cache, and routing uses it again.
    let id = complete(&r, &format!("{}{}", system_prompt(1), user_turn(300)));
    let dec = decision(&r, &id);
    assert_eq!(dec["index"], "exact");
    assert!(dec["matched_blocks"].as_u64().unwrap() > 0, "{dec}");
    drop(restarted);
}
