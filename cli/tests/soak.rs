//! The soak command, bounded to 60 seconds: `tandem bench soak` runs `tandem up` at saturation
//! (24 clients, streamed completions and chats of random lengths) and must finish with no
//! failed request and every KV block back in its pool once idle. The 10-minute run behind the
//! published figures is the same command with `--duration 600s` (docs/reliability.md).

use std::process::Command;

#[test]
fn sixty_second_soak_has_no_errors_and_no_leaked_blocks() {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["bench", "soak", "--duration", "60s", "--interval", "10s", "--json", "-"])
        .env("TANDEM_NUM_THREADS", "1")
        .output()
        .expect("run tandem bench soak");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "soak failed:\n{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["errors"], 0);
    assert_eq!(r["blocks_leaked"], 0.0);
    assert!(r["requests"].as_u64().unwrap() > 10, "{r}");
    assert!(r["blocks_total"].as_f64().unwrap() > 0.0);
    let procs: Vec<&str> =
        r["processes"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert_eq!(procs, ["up", "decode", "prefill", "router"], "every service's memory is sampled");
    assert!(r["samples"].as_array().unwrap().len() >= 6);
}
