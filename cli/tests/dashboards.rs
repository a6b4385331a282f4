//! The Grafana dashboards against a real Prometheus: `tandem up` (router, prefill and decode
//! workers, KV events through a real Redis, n-gram speculative decoding) serves a little load
//! while Prometheus (Debian's package, started here on a free loopback port) scrapes all three
//! processes; then every query of every dashboard panel must return data with a finite value, and
//! so must the vLLM-named aliases and the process metrics.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

struct Prometheus {
    child: Child,
    addr: String,
    _dir: std::path::PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

fn start_prometheus(targets: &[String]) -> Prometheus {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/test/prometheus.sh");
    let out = Command::new("bash").arg(script).output().expect("run prometheus.sh");
    assert!(
        out.status.success(),
        "prometheus is missing and could not be installed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let dir = std::env::temp_dir().join(format!("tandem-prometheus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let config = format!("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tandem\n    metrics_path: /metrics\n    static_configs:\n      - targets: [{}]\n", targets.join(", "));
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(bin)
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    let p = Prometheus { child, addr, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http_raw(
            &p.addr,
            format!("GET /-/ready HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", p.addr)
                .as_bytes(),
            Duration::from_secs(2),
        ) {
            if r.status == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "prometheus did not become ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    p
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn query(p: &Prometheus, q: &str) -> Value {
    http(&p.addr, "GET", &format!("/api/v1/query?query={}", urlencode(q)), None).json()
}

/// Whether a query result has a sample with a finite value.
fn has_data(v: &Value) -> bool {
    v["status"] == "success"
        && v["data"]["result"].as_array().is_some_and(|r| {
            r.iter().any(|s| {
                s["value"][1]
                    .as_str()
                    .and_then(|x| x.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            })
        })
}

/// `rounds` rounds of requests from two clients, and one bad request. Long prompts begin
/// differently in every call, so each is computed (and its KV shipped) anew.
fn load(addr: &str, rounds: usize) {
    let repetitive =
        "alpha beta gamma delta alpha beta gamma delta alpha beta gamma delta alpha beta";
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let addr = addr.to_string();
            std::thread::spawn(move || {
                for i in 0..rounds * 2 {
                    let prompt = if i % 2 == 0 { format!("Document {rounds}.{t}.{i}: {}", long_prompt()) } else { format!("Continue the pattern: {repetitive}") };
                    let body = json!({ "model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "stream": i % 3 == 1 }).to_string();
                    let r = http(&addr, "POST", "/v1/completions", Some(&body));
                    assert_eq!(r.status, 200, "{}", r.body);
                    let chat = json!({ "model": MODEL, "messages": [{ "role": "user", "content": format!("Say hello to client {t}, round {i}.") }], "max_tokens": 12 }).to_string();
                    assert_eq!(http(&addr, "POST", "/v1/chat/completions", Some(&chat)).status, 200);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let bad = http(
        addr,
        "POST",
        "/v1/completions",
        Some(&json!({ "model": MODEL, "prompt": "x", "max_tokens": -1 }).to_string()),
    );
    assert_eq!(bad.status, 400);
}

#[test]
fn every_dashboard_query_returns_data() {
    let redis = RedisServer::start(None);
    let up = Proc::start(
        "up",
        &[
            "up".into(),
            "--port=0".into(),
            // The decode worker is also a model server (its own OpenAI API, as an InferencePool
            // member): what an endpoint picker scrapes is this process's metrics.
            "--decode-flags=--speculative ngram --num-speculative-tokens 3 --serve-openai".into(),
        ],
        &[("TANDEM_REDIS_URL", &redis.url)],
    );
    let health = http(&up.addr, "GET", "/health", None).json();
    let mut targets = vec![up.addr.clone()];
    targets.extend(
        health["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["address"].as_str().unwrap().to_string()),
    );
    assert_eq!(targets.len(), 3, "{health}");
    let prom = start_prometheus(&targets);

    // A little load: long prompts (remote prefill, KV transfer), repeated prefixes (prefix-cache
    // hits, KV events), repetitive text (n-gram drafts), chats, streams, and a bad request. A
    // first round creates every series; Prometheus scrapes it before the second round, so the
    // rates see the increase (a series born with its final value has no rate, as in a fresh
    // deployment's first minutes).
    let started = Instant::now();
    load(&up.addr, 1);
    std::thread::sleep(Duration::from_secs(3));
    load(&up.addr, 3);
    // And straight to the decode worker's own API, as a gateway's endpoint picker sends it.
    let decode = health["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["role"] == "decode")
        .map(|w| w["address"].as_str().unwrap().to_string())
        .expect("a decode worker");
    let direct = json!({ "model": MODEL, "prompt": "Hello", "max_tokens": 4 }).to_string();
    assert_eq!(http(&decode, "POST", "/v1/completions", Some(&direct)).status, 200);
    eprintln!("load took {:?}", started.elapsed());

    // Wait until Prometheus has scraped every target after the load; the rates need two samples.
    let deadline = Instant::now() + Duration::from_secs(60);
    let queries = tandem_operator::dashboards::queries();
    assert!(queries.len() >= 30, "{} queries", queries.len());
    // The dashboards' variables as Grafana sends them: "All" is `.*` (which also matches the
    // missing `namespace` label of this static scrape); one model picks its series only.
    let with = |q: &str, model: &str| q.replace("$model", model).replace("$namespace", ".*");
    let missing = loop {
        let missing: Vec<String> = queries
            .iter()
            .filter(|(_, _, q)| !has_data(&query(&prom, &with(q, ".*"))))
            .map(|(d, p, q)| format!("{d} / {p}: {q}"))
            .collect();
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    assert!(missing.is_empty(), "panel queries without data:\n{}", missing.join("\n"));
    let (_, _, first) = &queries[0];
    assert!(has_data(&query(&prom, &with(first, MODEL))), "{first} for {MODEL}");
    assert!(!has_data(&query(&prom, &with(first, "no-such-model"))), "{first} filters by model");

    // vLLM's names for the same series, as the Gateway API Inference Extension's picker, KEDA
    // and vLLM dashboards query them, labelled with the model's name; and the process metrics.
    let vllm = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
        "vllm:e2e_request_latency_seconds_count",
        "histogram_quantile(0.5, sum by (le) (rate(vllm:iteration_tokens_total_bucket[1m])))",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    ];
    for q in vllm {
        assert!(has_data(&query(&prom, q)), "no data for {q}");
    }
    // The decode worker's own front end counts what it answered, beside its engine's series.
    let served = r#"tandem_router_requests_total{role="decode",code="200"}"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !has_data(&query(&prom, served)) {
        assert!(Instant::now() < deadline, "no data for {served}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let named = query(&prom, "vllm:num_requests_running");
    for s in named["data"]["result"].as_array().unwrap() {
        assert_eq!(s["metric"]["model_name"], MODEL, "{s}");
    }
    let total = |q: &str| -> f64 {
        let v = query(&prom, q);
        v["data"]["result"][0]["value"][1].as_str().unwrap_or("nan").parse().unwrap()
    };
    assert_eq!(
        total("sum(vllm:generation_tokens_total)"),
        total("sum(tandem_generation_tokens_total)"),
        "the aliases carry the same counts"
    );
    assert!(total(r#"sum(vllm:request_success_total{finished_reason="length"})"#) > 0.0);
    eprintln!(
        "{} panel queries across {} dashboards returned data",
        queries.len(),
        tandem_operator::dashboards::all().len()
    );
}
