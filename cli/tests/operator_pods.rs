//! The pods the operator deploys, run as processes on loopback: for an InferenceService the
//! test takes the exact container arguments of the operator's Deployments and the environment of
//! its ConfigMap, replaces only what the cluster would provide (pod IP and name, the headless
//! Services' DNS names, fixed ports) and starts the real `tandem` binary with them. It checks
//! that the flags and variables are understood, that the router finds its workers through a DNS
//! entry, that prefill workers reach the decode worker's advertised KV address, and that a
//! decode worker told to stop (SIGTERM, as on scale-down) drains: the stream in flight finishes
//! and the process exits by itself.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tandem_operator::crd::InferenceService;
use tandem_operator::workloads::{
    self, Kind, DECODE_PORT, EPP_PORT, KV_PORT, PREFILL_PORT, ROUTER_PORT,
};

/// A pod's container arguments and environment.
type PodCommand = (Vec<String>, Vec<(String, String)>);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// (args, env) of each role's container, with the cluster's parts replaced by loopback ones.
/// Secrets as the kubelet would provide them: (secret, key) → value, and the directory the
/// router's API-keys volume stands for.
struct Secrets {
    values: BTreeMap<(String, String), String>,
    keys_dir: std::path::PathBuf,
}

fn pods(
    isvc: &InferenceService,
    ports: &BTreeMap<i32, u16>,
    secrets: &Secrets,
) -> BTreeMap<String, PodCommand> {
    let objs = workloads::desired(isvc, &[]);
    let config = &objs.iter().find(|d| d.kind == Kind::ConfigMap).unwrap().object["data"];
    let config_env: Vec<(String, String)> = config
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    let mut out = BTreeMap::new();
    for d in objs.iter().filter(|d| d.kind == Kind::Deployment) {
        let role =
            d.object["metadata"]["labels"][workloads::ROLE_LABEL].as_str().unwrap().to_string();
        let c = &d.object["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["envFrom"][0]["configMapRef"]["name"], "chat-config");
        let mut env = config_env.clone();
        for e in c["env"].as_array().unwrap() {
            if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
                let key = (
                    r["name"].as_str().unwrap().to_string(),
                    r["key"].as_str().unwrap().to_string(),
                );
                env.push((e["name"].as_str().unwrap().to_string(), secrets.values[&key].clone()));
            }
        }
        let args = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let mut a = a
                    .as_str()
                    .unwrap()
                    .replace("$(POD_IP)", "127.0.0.1")
                    .replace("$(POD_NAME)", &format!("chat-{role}-0"))
                    .replace("0.0.0.0:", "127.0.0.1:");
                a = a
                    .replace("chat-decode.ml.svc", "localhost")
                    .replace("chat-prefill.ml.svc", "localhost");
                a = a.replace(
                    tandem_operator::crd::API_KEYS_DIR,
                    secrets.keys_dir.to_str().unwrap(),
                );
                for (from, to) in ports {
                    a = a.replace(&format!(":{from}"), &format!(":{to}"));
                }
                a
            })
            .collect();
        out.insert(role, (args, env));
    }
    out
}

const KEY: &str = "sk-operator-test-1";

fn authed(addr: &str, path: &str, body: &str) -> HttpResponse {
    http_key(addr, "POST", path, Some(body), Some(KEY))
}

fn start(role: &str, pods: &BTreeMap<String, PodCommand>) -> Proc {
    let (args, env) = &pods[role];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Proc::start(role, args, &env)
}

#[test]
fn operator_pods_serve_find_each_other_and_drain() {
    let redis = RedisServer::start(None);
    let spec = json!({
        "model": { "path": model(), "name": MODEL },
        "router": { "redisUrl": redis.url },
        "prefill": { "replicas": 1 },
        "decode": { "replicas": 1, "speculative": { "method": "ngram", "tokens": 3 }, "drainSeconds": 60 },
        "disaggregation": { "mode": "always" },
        "security": { "apiKeysSecret": "chat-keys", "internalTokenSecret": "chat-internal", "maxConcurrentPerKey": 8 },
    });
    let keys_dir = std::env::temp_dir().join(format!("tandem-api-keys-{}", std::process::id()));
    std::fs::create_dir_all(&keys_dir).unwrap();
    std::fs::write(keys_dir.join("api-keys"), "sk-operator-test-1:ops\n").unwrap();
    let secrets = Secrets {
        values: BTreeMap::from([(
            ("chat-internal".to_string(), "token".to_string()),
            "internal-secret-from-k8s".to_string(),
        )]),
        keys_dir,
    };
    let mut isvc = InferenceService::new("chat", serde_json::from_value(spec).unwrap());
    isvc.metadata.namespace = Some("ml".into());
    assert!(tandem_operator::validate::problems(&isvc.spec).is_empty());
    let ports: BTreeMap<i32, u16> = [DECODE_PORT, EPP_PORT, KV_PORT, PREFILL_PORT, ROUTER_PORT]
        .into_iter()
        .map(|p| (p, free_port()))
        .collect();
    let pods = pods(&isvc, &ports, &secrets);
    eprintln!("{pods:#?}");

    let mut decode = start("decode", &pods);
    let prefill = start("prefill", &pods);
    let router = start("router", &pods);
    assert_eq!(decode.addr, format!("127.0.0.1:{}", ports[&DECODE_PORT]));

    // The router found both workers through its DNS entries.
    let health = http(&router.addr, "GET", "/health", None);
    assert_eq!(health.status, 200, "{}", health.body);
    let workers: Vec<String> = health.json()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["address"].as_str().unwrap().to_string())
        .collect();
    assert!(workers.contains(&decode.addr) && workers.contains(&prefill.addr), "{workers:?}");

    // A prompt goes through the prefill worker to the decode worker's advertised KV address.
    let body =
        json!({ "model": MODEL, "prompt": long_prompt(), "max_tokens": 8, "temperature": 0 })
            .to_string();
    assert_eq!(
        http(&router.addr, "POST", "/v1/completions", Some(&body)).status,
        401,
        "the API keys Secret is enforced"
    );
    let res = authed(&router.addr, "/v1/completions", &body);
    assert_eq!(res.status, 200, "{}", res.body);
    assert_eq!(
        metric(&decode.addr, "tandem_disagg_decisions_total", &["decision=\"remote\""]),
        Some(1.0)
    );
    assert_eq!(
        metric(&decode.addr, "tandem_kv_transfer_failures_total", &["reason=\"receive\""]),
        Some(0.0)
    );
    assert!(metric(&decode.addr, "tandem_kv_transfer_bytes_total", &[]).unwrap() > 0.0);
    // The decode pod is an InferencePool member: the OpenAI API on its own port, with the same
    // keys; the router's endpoint picker listens on its port.
    assert_eq!(http(&decode.addr, "POST", "/v1/completions", Some(&body)).status, 401);
    let res = authed(&decode.addr, "/v1/completions", &body);
    assert_eq!(res.status, 200, "{}", res.body);
    assert!(std::net::TcpStream::connect(("127.0.0.1", ports[&EPP_PORT])).is_ok());
    // Worker ids from the pod names reach the router's index.
    let st = http_key(&router.addr, "GET", "/debug/routing", None, Some(KEY)).json();
    assert!(st.to_string().contains("chat-prefill-0"), "{st}");

    // Scale-down: SIGTERM while a stream is in flight. The stream ends normally, the worker
    // leaves the router's healthy set and exits by itself.
    let body = json!({ "model": MODEL, "prompt": "Count from one to one hundred:", "max_tokens": 160, "ignore_eos": true, "temperature": 0, "stream": true }).to_string();
    let mut s = open_stream_key(&router.addr, "/v1/completions", &body, Some(KEY));
    let first = read_until(&mut s, "data: {");
    assert!(first.contains("200 OK"), "{first}");
    let pid = decode.child.id();
    let t = Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let rest = read_until(&mut s, "data: [DONE]");
    assert!(
        rest.contains("data: [DONE]") && !rest.contains("\"error\""),
        "the stream was cut:\n{rest}"
    );
    let text = format!("{first}{rest}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    let status = loop {
        if let Some(st) = decode.child.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "the draining worker did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("stream finished and worker exited {:?} after SIGTERM ({status})", t.elapsed());
    assert!(status.success(), "{status}");
    let log = decode.log_text();
    assert!(log.contains("draining") && log.contains("drained"), "{log}");
    let res = authed(
        &router.addr,
        "/v1/completions",
        &json!({ "model": MODEL, "prompt": "Hi", "max_tokens": 2 }).to_string(),
    );
    assert_eq!(res.status, 503, "no decode worker left: {}", res.body);
    let v: Value = res.json();
    assert!(v["error"]["message"].is_string());
    decode.kill();
}
