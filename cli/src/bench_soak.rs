//! `tandem bench soak`: runs `tandem up` at saturation for a bounded time and records, over
//! time, the requests served, the errors, every process's resident memory and the KV block
//! pools; at the end, after the load stops, every pool must be whole again. It also reports the
//! streams' time to first token and inter-token gaps and the workers' remote prefills and KV
//! transfer failures; with `--kill-every`, it kills `tandem up`'s children with SIGKILL in turn
//! (prefill, decode, router) and counts what the clients saw while `up` brought them back.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use crate::bench_serve::http::HttpClient;
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
    /// Words per prompt, `MIN-MAX` (each request draws one).
    #[arg(long, value_parser = parse_range, default_value = "8-128")]
    pub prompt_words: (usize, usize),
    /// Tokens per completion, `MIN-MAX` (each request draws one).
    #[arg(long, value_parser = parse_range, default_value = "8-72")]
    pub output_tokens: (usize, usize),
    /// Kill one of `tandem up`'s children with SIGKILL this often, in turn (errors are then
    /// counted, not fatal; the service must be healthy again at the end).
    #[arg(long, value_parser = parse_duration)]
    pub kill_every: Option<Duration>,
}

fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s.split_once('-').ok_or_else(|| format!("'{s}' is not MIN-MAX"))?;
    let (a, b): (usize, usize) = (
        a.trim().parse().map_err(|e| format!("{e}"))?,
        b.trim().parse().map_err(|e| format!("{e}"))?,
    );
    if a == 0 || a > b {
        return Err(format!("'{s}': want 0 < MIN <= MAX"));
    }
    Ok((a, b))
}

#[derive(Default)]
struct Counters {
    ok: AtomicU64,
    errors: AtomicU64,
    tokens: AtomicU64,
    /// Time to first token of every served stream, seconds.
    ttft: std::sync::Mutex<Vec<f64>>,
    /// Every gap between consecutive token events of a stream, seconds.
    gaps: std::sync::Mutex<Vec<f64>>,
    /// `(seconds since the soak started at the gap's end, gap)` of every gap over 1 s.
    long_gaps: std::sync::Mutex<Vec<(f64, f64)>>,
    /// Failed requests by what the client saw.
    error_kinds: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

/// What a failed request's client saw, in a few words (`http_503`, `connect`, ...).
fn error_kind(e: &str) -> String {
    if e.starts_with("error event") {
        "error event in the stream".into()
    } else if e.starts_with("stream ended") {
        "stream cut".into()
    } else {
        e.split(|c: char| c == ':' || c.is_whitespace()).next().unwrap_or(e).to_string()
    }
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
    for l in text
        .lines()
        .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
    {
        let v: f64 = l.rsplit(' ').next()?.parse().ok()?;
        found = Some(found.unwrap_or(0.0) + v);
    }
    found
}

/// Resident memory of `pid` in MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 =
        s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The `tandem` subcommand a process runs (`up`, `router`, `prefill`, `decode`).
fn role(pid: u32) -> String {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmd.split(|&b| b == 0)
        .nth(1)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .unwrap_or_default()
}

/// The direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // Fields after the command name (which may hold spaces) start after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|x| x.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

fn prompt(rng: &mut u64, words: usize) -> String {
    const WORDS: [&str; 16] = [
        "river", "stone", "light", "market", "engine", "garden", "winter", "paper", "signal",
        "harbor", "forest", "copper", "window", "ladder", "planet", "violin",
    ];
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

/// The workload: prompt words and completion tokens, each drawn from its range.
#[derive(Clone, Copy)]
struct Shape {
    words: (usize, usize),
    tokens: (usize, usize),
}

async fn client(
    api: String,
    model: String,
    seed: u64,
    shape: Shape,
    stop: Arc<AtomicBool>,
    c: Arc<Counters>,
    t0: Instant,
) {
    let http = HttpClient::new(&format!("http://{api}"), None, None).expect("the router's address");
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while !stop.load(Ordering::Relaxed) {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let words = shape.words.0 + (rng >> 33) as usize % (shape.words.1 - shape.words.0 + 1);
        let max_tokens =
            shape.tokens.0 + (rng >> 20) as usize % (shape.tokens.1 - shape.tokens.0 + 1);
        let (path, body) = if rng.is_multiple_of(3) {
            (
                "/v1/chat/completions",
                json!({ "model": model, "messages": [{ "role": "user", "content": prompt(&mut rng, words) }], "max_tokens": max_tokens, "stream": true, "ignore_eos": true }),
            )
        } else {
            (
                "/v1/completions",
                json!({ "model": model, "prompt": prompt(&mut rng, words), "max_tokens": max_tokens, "stream": true, "ignore_eos": true, "temperature": 0.8, "seed": rng % 1000 }),
            )
        };
        let mut tokens = 0u64;
        let mut done = false;
        let mut failed: Option<String> = None;
        let sent = Instant::now();
        let mut last: Option<Instant> = None;
        let mut ttft = None;
        let mut gaps = Vec::new();
        let mut long = Vec::new();
        let r = http
            .post_events(
                path,
                body.to_string().into_bytes(),
                Duration::from_secs(300),
                &mut |d: &str| {
                    if d == "[DONE]" {
                        done = true;
                        return;
                    }
                    let Ok(v) = serde_json::from_str::<Value>(d) else { return };
                    if v.get("error").is_some() {
                        // An error event (a chunk whose generated text says "error" is not one).
                        failed = Some(d.chars().take(300).collect());
                        return;
                    }
                    let c = &v["choices"][0];
                    let text =
                        c["text"].as_str().or_else(|| c["delta"]["content"].as_str()).unwrap_or("");
                    if !text.is_empty() {
                        // A chunk that carries generated text (not the role chunk or the finish chunk).
                        let now = Instant::now();
                        match last {
                            None => ttft = Some(now.duration_since(sent).as_secs_f64()),
                            Some(l) => {
                                let gap = now.duration_since(l).as_secs_f64();
                                if gap > 1.0 {
                                    long.push((now.duration_since(t0).as_secs_f64(), gap));
                                }
                                gaps.push(gap);
                            }
                        }
                        last = Some(now);
                        tokens += 1;
                    }
                },
            )
            .await;
        if r.is_ok() && done && failed.is_none() {
            c.ok.fetch_add(1, Ordering::Relaxed);
            c.tokens.fetch_add(tokens, Ordering::Relaxed);
            c.ttft.lock().expect("ttft lock").extend(ttft);
            c.gaps.lock().expect("gaps lock").extend(gaps);
            c.long_gaps.lock().expect("gaps lock").extend(long);
        } else {
            c.errors.fetch_add(1, Ordering::Relaxed);
            let why = r.err().unwrap_or_else(|| {
                failed
                    .map(|f| format!("error event {f}"))
                    .unwrap_or_else(|| "stream ended without [DONE]".into())
            });
            eprintln!("request failed: {why}");
            *c.error_kinds.lock().expect("errors lock").entry(error_kind(&why)).or_default() += 1;
            // As a client would: wait a little before trying again.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Runs the soak.
pub fn run(a: SoakArgs) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut up = Command::new(exe);
    up.args(["up", "--port", "0"]).args(a.up_flags.split_whitespace());
    let log_path = std::env::temp_dir().join(format!("tandem-soak-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    eprintln!("soak: the services' logs go to {}", log_path.display());
    let mut child = up
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting tandem up")?;
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
    let killing = a.kill_every.is_some();
    if (!killing && report["errors"].as_u64() != Some(0))
        || report["blocks_leaked"].as_f64() != Some(0.0)
        || report["healthy_at_end"] != json!(true)
    {
        bail!(
            "soak failed: {} errors, {} blocks not returned, healthy at the end: {}",
            report["errors"],
            report["blocks_leaked"],
            report["healthy_at_end"]
        );
    }
    Ok(())
}

/// Sum of the samples of `name` whose labels contain `label` (e.g. `decision="remote"`).
fn metric_with(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The `q` quantile of `v` (sorted in place).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Kills `tandem up`'s children in turn — prefill worker, decode worker, router — every
/// `every`, until `stop`; returns what it killed, when.
fn killer(up_pid: u32, every: Duration, started: Instant, stop: Arc<AtomicBool>) -> Vec<Value> {
    let order = ["prefill", "decode", "router"];
    let mut kills = Vec::new();
    let mut turn = 0;
    let mut next = started + every;
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        next += every;
        let kids: Vec<(u32, String)> = children(up_pid).into_iter().map(|p| (p, role(p))).collect();
        for _ in 0..order.len() {
            let want = order[turn % order.len()];
            turn += 1;
            if let Some((pid, r)) = kids.iter().find(|(_, r)| r == want) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                eprintln!(
                    "soak: killed the {r} (pid {pid}) at {:.0} s",
                    started.elapsed().as_secs_f64()
                );
                kills.push(json!({ "t": started.elapsed().as_secs_f64(), "role": r, "pid": pid }));
                break;
            }
        }
    }
    kills
}

fn soak(a: &SoakArgs, api: &str, up_pid: u32) -> Result<Value> {
    let health: Value =
        serde_json::from_str(&http_get(api, "/health").context("router /health")?.1)?;
    let workers: Vec<(String, String)> = health["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            (
                w["role"].as_str().unwrap_or("").to_string(),
                w["address"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let models: Value =
        serde_json::from_str(&http_get(api, "/v1/models").context("/v1/models")?.1)?;
    let model = models["data"][0]["id"].as_str().unwrap_or_default().to_string();
    let pids = || -> Vec<u32> {
        let mut kids = children(up_pid);
        kids.sort_by_key(|&p| role(p));
        std::iter::once(up_pid).chain(kids).collect()
    };
    let roles: Vec<String> = pids().iter().map(|&p| role(p)).collect();
    let pools = || -> (f64, f64) {
        workers.iter().filter_map(|(_, addr)| http_get(addr, "/metrics")).fold(
            (0.0, 0.0),
            |(f, t), (_, m)| {
                (
                    f + metric(&m, "tandem_kv_cache_free_blocks").unwrap_or(0.0),
                    t + metric(&m, "tandem_kv_cache_num_blocks").unwrap_or(0.0),
                )
            },
        )
    };
    let rss = || pids().iter().map(|&p| rss_mib(p).unwrap_or(0.0)).collect::<Vec<_>>();
    let worker_metrics = || {
        workers
            .iter()
            .filter_map(|(_, addr)| http_get(addr, "/metrics"))
            .map(|(_, m)| m)
            .collect::<Vec<_>>()
    };
    let remote_before: f64 = worker_metrics()
        .iter()
        .map(|m| metric_with(m, "tandem_disagg_decisions_total", "decision=\"remote\""))
        .sum();
    let failures_before: f64 = worker_metrics()
        .iter()
        .map(|m| metric(m, "tandem_kv_transfer_failures_total").unwrap_or(0.0))
        .sum();

    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let shape = Shape { words: a.prompt_words, tokens: a.output_tokens };
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..a.concurrency)
        .map(|i| {
            rt.spawn(client(
                api.to_string(),
                model.clone(),
                i as u64 + 1,
                shape,
                stop.clone(),
                counters.clone(),
                t0,
            ))
        })
        .collect();

    let started = Instant::now();
    let kill_task = a.kill_every.map(|every| {
        let stop = stop.clone();
        std::thread::spawn(move || killer(up_pid, every, started, stop))
    });
    let mut samples: Vec<Value> = Vec::new();
    eprintln!(
        "{:>7} {:>9} {:>7} {:>9} {:>10}  RSS MiB of {}",
        "t (s)",
        "requests",
        "errors",
        "tokens",
        "KV used",
        roles.join(", ")
    );
    let rss_start = rss();
    loop {
        let t = started.elapsed();
        let (free, total) = pools();
        let r = rss();
        let (ok, err, tok) = (
            counters.ok.load(Ordering::Relaxed),
            counters.errors.load(Ordering::Relaxed),
            counters.tokens.load(Ordering::Relaxed),
        );
        eprintln!(
            "{:>7.0} {ok:>9} {err:>7} {tok:>9} {:>9.1}%  {}",
            t.as_secs_f64(),
            100.0 * (total - free) / total.max(1.0),
            r.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" ")
        );
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
    let kills = kill_task.map(|t| t.join().unwrap_or_default()).unwrap_or_default();
    // The service is back: the router answers /health with 200 (within a minute of the load's end).
    let deadline = Instant::now() + Duration::from_secs(60);
    let healthy_at_end = loop {
        if http_get(api, "/health").is_some_and(|(code, _)| code == 200) {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let remote: f64 = worker_metrics()
        .iter()
        .map(|m| metric_with(m, "tandem_disagg_decisions_total", "decision=\"remote\""))
        .sum::<f64>()
        - if kills.is_empty() { remote_before } else { 0.0 };
    let transfer_failures: f64 = worker_metrics()
        .iter()
        .map(|m| metric(m, "tandem_kv_transfer_failures_total").unwrap_or(0.0))
        .sum::<f64>()
        - if kills.is_empty() { failures_before } else { 0.0 };
    let mut ttft = counters.ttft.lock().expect("ttft lock").clone();
    let mut gaps = counters.gaps.lock().expect("gaps lock").clone();
    let gaps_over_1s = gaps.iter().filter(|&&g| g > 1.0).count();
    let max_gap = gaps.iter().copied().fold(0.0, f64::max);
    let (ttft_p50, ttft_p99) = (quantile(&mut ttft, 0.5), quantile(&mut ttft, 0.99));
    let gap_p99 = quantile(&mut gaps, 0.99);
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
    let mid = samples
        .iter()
        .find(|s| s["t"].as_f64().unwrap_or(0.0) >= elapsed / 2.0)
        .unwrap_or(&samples[0]);
    let growth: Vec<f64> = rss_end
        .iter()
        .enumerate()
        .map(|(i, e)| e - mid["rss_mib"][i].as_f64().unwrap_or(0.0))
        .collect();
    let report = json!({
        "duration_s": elapsed,
        "concurrency": a.concurrency,
        "requests": ok,
        "errors": counters.errors.load(Ordering::Relaxed),
        "errors_by_kind": counters.error_kinds.lock().expect("errors lock").clone(),
        "output_tokens": counters.tokens.load(Ordering::Relaxed),
        "requests_per_s": ok as f64 / elapsed,
        "processes": roles,
        "rss_start_mib": rss_start,
        "rss_end_mib": rss_end,
        "rss_growth_second_half_mib": growth,
        "blocks_total": total,
        "blocks_leaked": total - free,
        "workers": workers.iter().map(|(r, a)| json!({ "role": r, "address": a })).collect::<Vec<_>>(),
        "ttft_p50_s": ttft_p50,
        "ttft_p99_s": ttft_p99,
        "inter_token_gap_p99_s": gap_p99,
        "inter_token_gap_max_s": max_gap,
        "inter_token_gaps_over_1s": gaps_over_1s,
        "long_gaps": counters.long_gaps.lock().expect("gaps lock").iter().map(|(t, g)| json!({ "t": t, "gap_s": g })).collect::<Vec<_>>(),
        "remote_prefills": remote,
        "kv_transfer_failures": transfer_failures,
        "kills": kills,
        "healthy_at_end": healthy_at_end,
        "samples": samples,
    });
    eprintln!(
        "soak: TTFT p50 {ttft_p50:.2} s, p99 {ttft_p99:.2} s; inter-token gap p99 {gap_p99:.3} s, max {max_gap:.2} s, {gaps_over_1s} over 1 s; {remote} remote prefills, {transfer_failures} KV transfer failures{}; healthy at the end: {healthy_at_end}",
        if kills.is_empty() { String::new() } else { format!(" (counters since start; {} kills)", kills.len()) }
    );
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
