//! `tandem bench serve --stub`: the benchmark's own ceiling, against a built-in server that
//! answers at once. Every token arrives as its own event and is counted; completions and chat
//! both parse; the ceiling is reported like any run. (Its figure is machine-dependent: the
//! GPU scripts print it next to what the client measured against Tandem; no speed is asserted.)

use std::process::Command;

use serde_json::Value;

fn bench(extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["bench", "serve", "--stub", "--json=-", "--quiet", "--ignore-eos"])
        .args(extra)
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_stub_streams_every_token_and_the_client_counts_them() {
    let v = bench(&["--num-prompts=64", "--input-len=16", "--output-len=48", "--client-threads=2"]);
    let r = &v["result"];
    assert_eq!((r["completed"].as_u64(), r["failed"].as_u64()), (Some(64), Some(0)), "{r}");
    assert_eq!(r["total_output_tokens"], 64 * 48, "{r}");
    assert_eq!(r["total_input_tokens"], 64 * 16, "usage's prompt tokens are read: {r}");
    assert_eq!(v["config"]["model"], "stub");
    let tput = r["output_throughput"].as_f64().unwrap();
    assert!(tput > 0.0 && tput.is_finite(), "{r}");
    // Each token was parsed as its own event, so inter-token gaps are reported.
    assert!(r["itl"]["mean_ms"].as_f64().is_some_and(|m| m >= 0.0), "{r}");

    // The chat endpoint (multi-turn conversations grow by the stub's answers).
    let v = bench(&["--workload=multi-turn", "--num-prompts=8", "--turns=2", "--output-len=12"]);
    let r = &v["result"];
    assert_eq!((r["completed"].as_u64(), r["failed"].as_u64()), (Some(8), Some(0)), "{r}");
    assert_eq!(r["total_output_tokens"], 8 * 12, "{r}");
}

/// `tandem bench single` and `bench engine` on a model with sliding-window layers (three KV
/// groups: their batches lay out a page per group) report their figures and the KV held.
#[test]
fn single_and_engine_benches_run_a_sliding_window_model() {
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tiny-gemma3");
    let run = |args: &[&str]| -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = run(&[
        "bench",
        "single",
        "--json",
        "--model",
        tiny,
        "--prompt-tokens=40",
        "--decode-tokens=4",
    ]);
    assert!(v["prompt_tok_per_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    assert!(v["decode_tok_per_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    let v = run(&[
        "bench",
        "engine",
        "--json",
        "--model",
        tiny,
        "--num-prompts=2",
        "--input-len=48",
        "--min-input-len=48",
        "--output-len=8",
        "--min-output-len=8",
        "--block-size=4",
    ]);
    assert_eq!(v["kv_groups"], 3, "{v}");
    assert!(v["peak_kv_mib"].as_f64().is_some_and(|x| x > 0.0), "{v}");
}
