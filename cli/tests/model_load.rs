//! Loading and unloading a model while serving, with real processes on loopback: a router, a
//! decode worker and a prefill worker share a model directory; Gemma 3 270M is loaded beside
//! the start-up SmolLM2, both are served by name through the official `openai` SDK (greedy
//! texts equal `tandem generate`'s on each model), and Gemma is unloaded while a request for it
//! streams: the request finishes whole, new ones are refused meanwhile, and the worker's
//! memory goes back to what it was before the load.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const LOADED: &str = "gemma-3-270m";
const PROMPT: &str = "Once upon a time";
const MAX_TOKENS: usize = 12;

/// A model directory holding Gemma 3 270M (a link to the fetched file).
fn model_dir() -> (PathBuf, PathBuf) {
    let gemma = tandem_engine::model_files::model_fetch::GEMMA3_270M.path().expect("fetch Gemma 3");
    let dir = std::env::temp_dir().join(format!("tandem-model-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&gemma, dir.join(format!("{LOADED}.gguf"))).unwrap();
    (dir, gemma)
}

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// `tandem generate --json` on the exact kernels, greedy.
fn reference(model: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["generate", "--json", "--kernel=exact", &format!("--max-tokens={MAX_TOKENS}")])
        .args(["--model", model, "--prompt", PROMPT])
        .env("TANDEM_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["text"].as_str().unwrap().to_string()
}

fn wait_status(router: &Proc, want: &str, limit: Duration) -> HttpResponse {
    let started = Instant::now();
    loop {
        let r = http(&router.addr, "GET", &format!("/v1/models/{LOADED}"), None);
        let status =
            if r.status == 404 { "gone".to_string() } else { r.json()["status"].to_string() };
        if status.trim_matches('"') == want {
            return r;
        }
        assert!(started.elapsed() < limit, "the model is still {status} after {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_model_loaded_while_serving_is_served_by_name_and_unloaded_after_its_requests() {
    let (dir, gemma) = model_dir();
    let dir_flag = format!("--model-dir={}", dir.display());
    let decode = decode(&[&dir_flag], &[]);
    let prefill = prefill(&[], &[]);
    let router = router_with(&[&decode], &[&prefill], &[&dir_flag], &[]);
    let before_load = free_blocks(&decode);

    // Names outside the directory, and the start-up model, are refused.
    let r = http(&router.addr, "POST", "/v1/models/not-there/load", None);
    assert_eq!(r.status, 404, "{}", r.body);
    let r = http(&router.addr, "POST", "/v1/models/..%2Fetc/load", None);
    assert_eq!(r.status, 404, "{}", r.body);
    let r = http(&router.addr, "DELETE", &format!("/v1/models/{MODEL}"), None);
    assert_eq!(r.status, 400, "{}", r.body);
    let r = http(&router.addr, "DELETE", &format!("/v1/models/{LOADED}"), None);
    assert_eq!(r.status, 404, "{}", r.body);
    let r = http(
        &router.addr,
        "POST",
        "/v1/completions",
        Some(&format!(r#"{{"model":"{LOADED}","prompt":"hi","max_tokens":2}}"#)),
    );
    assert_eq!(r.status, 404, "not loaded yet: {}", r.body);

    let load = format!("/v1/models/{LOADED}/load");
    for bad in [r#"{"kv_cache_memory": "12 parsecs"}"#, r#"{"kv_cache_memory": 0}"#, r#"{"kv": 1}"#]
    {
        let r = http(&router.addr, "POST", &load, Some(bad));
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
    let rss_before = rss(decode.child.id());
    // Its own KV cache of 64 MiB (the start-up model has the worker's 128 MiB).
    let r = http(&router.addr, "POST", &load, Some(r#"{"kv_cache_memory": "64MiB"}"#));
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.json()["status"], "loading");
    let r = http(&router.addr, "POST", &format!("/v1/models/{LOADED}/load"), None);
    assert!(r.status == 202 || r.status == 200, "loading twice is one load: {}", r.body);
    let ready = wait_status(&router, "ready", Duration::from_secs(120)).json();
    let nodes = http(&router.addr, "GET", "/v1/cluster/nodes", None).json();
    let worker = nodes["data"].as_array().unwrap().iter().find(|n| n["role"] == "decode").unwrap();
    let loaded = &worker["loaded_models"][0];
    assert_eq!(loaded["model"], LOADED, "{nodes}");
    assert_eq!(loaded["state"], "ready", "{nodes}");
    let small_pool = loaded["num_blocks"].as_u64().unwrap();
    // The gateway admits prompts by the context the worker runs it with (not the file's own).
    assert_eq!(ready["max_model_len"], loaded["max_model_len"], "{ready} vs {nodes}");
    assert!(small_pool > 0, "its own KV cache: {nodes}");
    let rss_loaded = rss(decode.child.id());
    eprintln!("decode worker RSS: {rss_before} before the load, {rss_loaded} with Gemma loaded");
    assert!(
        rss_loaded > rss_before + 200 * (1 << 20),
        "Gemma's weights and KV cache take memory: {rss_before} -> {rss_loaded}"
    );

    // The SDK: both models by name, then the unload while a request streams.
    let url = format!("http://{}/v1", router.addr);
    let max = MAX_TOKENS.to_string();
    let got = python_client("model_load_client.py", &[&url, MODEL, LOADED, PROMPT, &max]);
    eprintln!("{got:#}");
    let completions = &got["completions"];
    assert_eq!(completions[LOADED]["text"], reference(&gemma.display().to_string()));
    assert_eq!(completions[MODEL]["text"], reference(&model()));
    assert_ne!(completions[LOADED]["text"], completions[MODEL]["text"]);
    assert_eq!(got["status_while_draining"], "unloading");
    assert_eq!(got["new_request_while_draining"], 503);
    assert_eq!(got["startup_while_draining"], "length");
    let in_flight = &got["in_flight"];
    assert_eq!(in_flight["finish_reason"], "length", "{in_flight}");
    assert_eq!(in_flight["usage"]["completion_tokens"], 64, "{in_flight}");

    // Gone once drained; its memory returned; the start-up model serves on, nothing leaked.
    wait_status(&router, "gone", Duration::from_secs(60));
    let rss_after = rss(decode.child.id());
    eprintln!("decode worker RSS after the unload: {rss_after}");
    assert!(
        rss_after < rss_before + (rss_loaded - rss_before) / 4,
        "the unload returns the model's memory: {rss_before} -> {rss_loaded} -> {rss_after}"
    );
    let models = http(&router.addr, "GET", "/v1/models", None).json();
    let ids: Vec<&str> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [MODEL]);
    assert!(decode.log_text().contains("model unloaded"), "{}", decode.log_text());
    assert!(!complete(&router, PROMPT).is_empty());
    assert_eq!(free_blocks(&decode), before_load, "the start-up model's blocks are all free");
    // Loaded again after the unload, with the workers' KV size: a fresh engine, twice the blocks.
    let r = http(&router.addr, "POST", &load, None);
    assert_eq!(r.status, 202, "{}", r.body);
    wait_status(&router, "ready", Duration::from_secs(120));
    let nodes = http(&router.addr, "GET", "/v1/cluster/nodes", None).json();
    let worker = nodes["data"].as_array().unwrap().iter().find(|n| n["role"] == "decode").unwrap();
    let full_pool = worker["loaded_models"][0]["num_blocks"].as_u64().unwrap();
    assert!(
        full_pool.abs_diff(2 * small_pool) <= 2,
        "64 MiB: {small_pool} blocks, 128 MiB: {full_pool}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_gateway_without_a_model_directory_says_so() {
    let decode = decode(&[], &[]);
    let router = router(&[&decode], &[]);
    let r = http(&router.addr, "POST", &format!("/v1/models/{LOADED}/load"), None);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("--model-dir"), "{}", r.body);
    let r = http(&router.addr, "POST", &format!("/v1/models/{MODEL}/load"), None);
    assert_eq!(r.status, 200, "the start-up model is loaded: {}", r.body);
    assert_eq!(r.json()["status"], "ready");
}
