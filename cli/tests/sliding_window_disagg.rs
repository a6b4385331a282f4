//! A sliding-window model served by a decode and a prefill worker (real processes, TCP between
//! them): the prefill worker ships only the KV pages the decode worker reads from the end of the
//! prompt on, since the decode worker gave the passed window pages back as it reserved its own;
//! the completion equals the one the decode worker computes alone.

mod common;

use common::*;

fn tiny_gemma() -> String {
    format!("{}/../tests/data/tiny-gemma3", env!("CARGO_MANIFEST_DIR"))
}

/// A worker of `role` on tiny Gemma 3 (window 16, one global and two local layers) with the
/// exact kernels and 16-token blocks.
fn worker(role: &str, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = [
        role,
        "--listen=127.0.0.1:0",
        "--kernel=exact",
        "--kv-cache-memory=16MiB",
        "--block-size=16",
        "--model",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(tiny_gemma());
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::start(role, &args, &[])
}

/// The greedy completion of `prompt` through `router`.
fn complete_ids(router: &Proc, prompt: &[u32]) -> String {
    let models = http(&router.addr, "GET", "/v1/models", None).json();
    let model = models["data"][0]["id"].as_str().expect("a served model").to_string();
    let body = serde_json::json!({
        "model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true
    })
    .to_string();
    let res = http(&router.addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(res.status, 200, "{}", res.body);
    res.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn a_sliding_window_prompt_ships_only_the_pages_its_window_still_reads() {
    // 120 tokens: 8 blocks of 16. The global group's 8 pages travel; each local group's window
    // (16 tokens) reads from block (120 + 1 - 16) / 16 = 6 on, so 2 pages each: 12 of 24.
    let prompt: Vec<u32> = (0..120).map(|k| 3 + (k * 7 % 300)).collect();
    let d = worker("decode", &["--disagg-min-tokens=1"]);
    let p = worker("prefill", &["--max-num-batched-tokens=32"]);
    let r = router(&[&d], &[&p]);
    let remote = complete_ids(&r, &prompt);
    // The log without its colour codes.
    let mut log = String::new();
    let mut escape = false;
    for c in d.log_text().chars() {
        match (escape, c) {
            (false, '\u{1b}') => escape = true,
            (true, 'm') => escape = false,
            (false, c) => log.push(c),
            _ => {}
        }
    }
    assert!(log.contains("remote prefill done"), "the prompt was not prefilled remotely: {log}");
    assert!(log.contains("pages=12 bytes="), "12 of 24 pages should travel: {log}");
    drop((r, p, d));

    let alone = worker("decode", &[]);
    let r = router(&[&alone], &[]);
    assert_eq!(remote, complete_ids(&r, &prompt), "remote prefill changed the completion");
}
