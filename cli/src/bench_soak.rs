//! `tandem bench soak`: runs `tandem up` at saturation for a bounded time and records, over
//! time, the requests served, the errors, every process's resident memory and the KV block
//! pools; at the end, after the load stops, every pool must be whole again.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use crate::bench_serve::http::post_events;
use crate::serve_cmd::parse_duration;

/// Arguments of `tandem bench soak`.
#[derive(Args, Debug)]
pub struct SoakArgs {
    /// How long the load runs.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub duration: Duration,
    /// Clients sending requests back to back (saturation: more than the workers batch).
    #[arg(long, default_value_t = 24)]
    pub concurrency: usize,
    /// Seconds between samples.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub interval: Duration,
    /// Flags for `tandem up` (e.g. `--colocated --kv-cache-memory 64MiB`).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub up_flags: String,
    /// Write the report as JSON here (`-`: standard output).
    #[arg(long)]
    pub json: Option<String>,
}

#[derive(Default)]
struct Counters {
    ok: AtomicU64,
    errors: AtomicU64,
    tokens: AtomicU64,
}

fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Sum of every sample of `name` in a Prometheus text page.
fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{"))) {
        let v: f64 = l.rsplit(' ').next()?.parse().ok()?;
        found = Some(found.unwrap_or(0.0) + v);
    }
    found
}

/// Resident memory of `pid` in MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The `tandem` subcommand a process runs (`up`, `router`, `prefill`, `decode`).
fn role(pid: u32) -> String {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmd.split(|&b| b == 0).nth(1).map(|s| String::from_utf8_lossy(s).into_owned()).unwrap_or_default()
}

/// The direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // Fields after the command name (which may hold spaces) start after the last ')'.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|x| x.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

fn prompt(rng: &mut u64, words: usize) -> String {
    const WORDS: [&str; 16] = ["river", "stone", "light", "market", "engine", "garden", "winter", "paper", "signal", "harbor", "forest", "copper", "window", "ladder", "planet", "violin"];
    (0..words)
        .map(|_| {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            WORDS[(*rng % 16) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn client(api: String, model: String, seed: u64, stop: Arc<AtomicBool>, c: Arc<Counters>) {
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while !stop.load(Ordering::Relaxed) {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let words = 8 + (rng >> 33) as usize % 120;
        let max_tokens = 8 + (rng >> 20) as usize % 64;
        let (path, body) = if rng % 3 == 0 {
            ("/v1/chat/completions", json!({ "model": model, "messages": [{ "role": "user", "content": prompt(&mut rng, words) }], "max_tokens": max_tokens, "stream": true, "ignore_eos": true }))
        } else {
            ("/v1/completions", json!({ "model": model, "prompt": prompt(&mut rng, words), "max_tokens": max_tokens, "stream": true, "ignore_eos": true, "temperature": 0.8, "seed": rng % 1000 }))
        };
        let mut tokens = 0u64;
        let mut done = false;
        let mut failed = false;
        let r = post_events(&api, path, body.to_string().as_bytes(), Duration::from_secs(300), &mut |d: &str| {
            if d == "[DONE]" {
                done = true;
            } else if d.contains("\"error\"") {
                failed = true;
            } else {
                tokens += 1;
            }
        })
        .await;
        if r.is_ok() && done && !failed {
            c.ok.fetch_add(1, Ordering::Relaxed);
            c.tokens.fetch_add(tokens, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("request failed: {}", r.err().unwrap_or_else(|| if failed { "error event".into() } else { "stream ended without [DONE]".into() }));
        }
    }
}

/// Runs the soak.
pub fn run(a: SoakArgs) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut up = Command::new(exe);
    up.args(["up", "--port", "0"]).args(a.up_flags.split_whitespace());
    let mut child = up.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().context("starting tandem up")?;
    let _stdin = child.stdin.take();
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let api = loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut out, &mut line)? == 0 {
            bail!("tandem up exited before it was ready");
        }
        if let Some(rest) = line.trim().strip_prefix("TANDEM_READY up ") {
            break rest.to_string();
        }
    };
    let result = soak(&a, &api, child.id());
    let _ = child.kill();
    let _ = child.wait();
    let report = result?;
    let text = serde_json::to_string_pretty(&report)?;
    match a.json.as_deref() {
        Some("-") => println!("{text}"),
        Some(p) => std::fs::write(p, text + "\n")?,
        None => {}
    }
    if report["errors"].as_u64() != Some(0) || report["blocks_leaked"].as_f64() != Some(0.0) {
        bail!("soak failed: {} errors, {} blocks not returned", report["errors"], report["blocks_leaked"]);
    }
    Ok(())
}

fn soak(a: &SoakArgs, api: &str, up_pid: u32) -> Result<Value> {
    let health: Value = serde_json::from_str(&http_get(api, "/health").context("router /health")?.1)?;
    let workers: Vec<(String, String)> = health["workers"].as_array().into_iter().flatten().map(|w| (w["role"].as_str().unwrap_or("").to_string(), w["address"].as_str().unwrap_or("").to_string())).collect();
    let models: Value = serde_json::from_str(&http_get(api, "/v1/models").context("/v1/models")?.1)?;
    let model = models["data"][0]["id"].as_str().unwrap_or_default().to_string();
    let pids: Vec<u32> = std::iter::once(up_pid).chain(children(up_pid)).collect();
    let roles: Vec<String> = pids.iter().map(|&p| role(p)).collect();
    let pools = || -> (f64, f64) {
        workers.iter().filter_map(|(_, addr)| http_get(addr, "/metrics")).fold((0.0, 0.0), |(f, t), (_, m)| (f + metric(&m, "tandem_kv_cache_free_blocks").unwrap_or(0.0), t + metric(&m, "tandem_kv_cache_num_blocks").unwrap_or(0.0)))
    };
    let rss = || pids.iter().map(|&p| rss_mib(p).unwrap_or(0.0)).collect::<Vec<_>>();

    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let tasks: Vec<_> = (0..a.concurrency).map(|i| rt.spawn(client(api.to_string(), model.clone(), i as u64 + 1, stop.clone(), counters.clone()))).collect();

    let started = Instant::now();
    let mut samples: Vec<Value> = Vec::new();
    eprintln!("{:>7} {:>9} {:>7} {:>9} {:>10}  RSS MiB of {}", "t (s)", "requests", "errors", "tokens", "KV used", roles.join(", "));
    let rss_start = rss();
    loop {
        let t = started.elapsed();
        let (free, total) = pools();
        let r = rss();
        let (ok, err, tok) = (counters.ok.load(Ordering::Relaxed), counters.errors.load(Ordering::Relaxed), counters.tokens.load(Ordering::Relaxed));
        eprintln!("{:>7.0} {ok:>9} {err:>7} {tok:>9} {:>9.1}%  {}", t.as_secs_f64(), 100.0 * (total - free) / total.max(1.0), r.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" "));
        samples.push(json!({ "t": t.as_secs_f64(), "requests": ok, "errors": err, "tokens": tok, "kv_used_blocks": total - free, "kv_total_blocks": total, "rss_mib": r }));
        if t >= a.duration {
            break;
        }
        std::thread::sleep(a.interval.min(a.duration - t));
    }
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for t in tasks {
            let _ = t.await;
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    // Idle: every block must come back (cached blocks count as free).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut free, mut total) = pools();
    while free < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        (free, total) = pools();
    }
    let rss_end = rss();
    let ok = counters.ok.load(Ordering::Relaxed);
    // Memory that keeps growing once the KV pool's pages have all been touched is a leak:
    // growth over the second half of the run, per process.
    let mid = samples.iter().find(|s| s["t"].as_f64().unwrap_or(0.0) >= elapsed / 2.0).unwrap_or(&samples[0]);
    let growth: Vec<f64> = rss_end.iter().enumerate().map(|(i, e)| e - mid["rss_mib"][i].as_f64().unwrap_or(0.0)).collect();
    let report = json!({
        "duration_s": elapsed,
        "concurrency": a.concurrency,
        "requests": ok,
        "errors": counters.errors.load(Ordering::Relaxed),
        "output_tokens": counters.tokens.load(Ordering::Relaxed),
        "requests_per_s": ok as f64 / elapsed,
        "processes": roles,
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_end,
        "rss_growth_second_half_mib": growth,
        "blocks_total": total,
        "blocks_leaked": total - free,
        "workers": workers.iter().map(|(r, a)| json!({ "role": r, "address": a })).collect::<Vec<_>>(),
        "samples": samples,
    });
    eprintln!(
        "soak: {ok} requests, {} errors, {:.2} req/s over {elapsed:.0} s; RSS MiB ({}) start {:?} end {:?}, second-half growth {:?}; KV blocks not returned: {}",
        report["errors"],
        ok as f64 / elapsed,
        roles.join(", "),
        rss_start.iter().map(|x| x.round()).collect::<Vec<_>>(),
        rss_end.iter().map(|x| x.round()).collect::<Vec<_>>(),
        growth.iter().map(|x| x.round()).collect::<Vec<_>>(),
        total - free
    );
    Ok(report)
}
