//! `tandem bench serve`: a serving benchmark against any OpenAI-compatible endpoint (Tandem,
//! llama.cpp's `llama-server`, vLLM, …), measured as `vllm bench serve` measures.

pub(crate) mod http;
pub mod metrics;
pub mod plot;
pub mod stub;
pub mod workload;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};
use tandem_engine::sampling::sampler::Rng;

use metrics::{report, Report, Slo, Timeline};
use workload::{PromptBody, RequestSpec, WorkloadConfig};

/// Workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    /// Random token prompts, lengths uniform within ± range ratio.
    Random,
    /// N system prompts × user turns.
    SharedPrefix,
    /// Conversations that grow turn by turn (chat endpoint).
    MultiTurn,
}

/// Arguments of `tandem bench serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// The server's OpenAI base URL (`http://` or `https://`).
    #[arg(long, default_value = "http://127.0.0.1:8000/v1")]
    pub base_url: String,
    /// API key, sent as a bearer token.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// PEM CA certificate to trust for an `https://` base URL (default: the system's roots).
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
    /// Model name to request (default: the first of the server's `/v1/models`).
    #[arg(long)]
    pub model: Option<String>,
    /// Workload.
    #[arg(long, value_enum, default_value = "random")]
    pub workload: WorkloadKind,
    /// Requests to make (multi-turn: conversations × turns).
    #[arg(long, default_value_t = 32)]
    pub num_prompts: usize,
    /// Prompt length in tokens (shared-prefix, multi-turn: the user turn).
    #[arg(long, default_value_t = 64)]
    pub input_len: usize,
    /// Output length in tokens.
    #[arg(long, default_value_t = 64)]
    pub output_len: usize,
    /// Lengths are uniform in `len·(1 − r) ..= len·(1 + r)`.
    #[arg(long, default_value_t = 0.0)]
    pub range_ratio: f64,
    /// Shared-prefix: number of system prompts.
    #[arg(long, default_value_t = 8)]
    pub num_prefixes: usize,
    /// Shared-prefix: system prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    pub prefix_len: usize,
    /// Multi-turn: turns per conversation.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Requests in flight at most (closed loop); default: all at once.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop: Poisson arrivals at this many requests per second (default: all at once).
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Ask the server to ignore end-of-sequence tokens (exact output lengths).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Service-level objectives for goodput, e.g. `--slo ttft:500 --slo tpot:50` (ms).
    #[arg(long)]
    pub slo: Vec<String>,
    /// Seed of the workload and of the arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Token ids of random prompts are drawn below this.
    #[arg(long, default_value_t = 32000)]
    pub vocab: u32,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Run once per concurrency in this list (closed loop), e.g. `--sweep 1,4,16,32`.
    #[arg(long, value_delimiter = ',')]
    pub sweep: Vec<usize>,
    /// Write the result as JSON here (`-` for standard output; the table then goes to stderr).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a plot here (`.svg` for SVG, else PNG): latency CDFs, or throughput and TTFT
    /// against concurrency with `--sweep`.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// A name for this run in the JSON (e.g. the server's).
    #[arg(long, default_value = "")]
    pub label: String,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Measure this client's own ceiling: run the workload against a built-in server on
    /// loopback that answers every request at once (`--base-url` is ignored).
    #[arg(long)]
    pub stub: bool,
    /// Threads of the client's runtime (default: every CPU this process may use).
    #[arg(long)]
    pub client_threads: Option<usize>,
}

fn specs(a: &ServeArgs) -> Vec<RequestSpec> {
    let c = WorkloadConfig {
        num_prompts: a.num_prompts,
        input_len: a.input_len,
        output_len: a.output_len,
        range_ratio: a.range_ratio,
        num_prefixes: a.num_prefixes,
        prefix_len: a.prefix_len,
        turns: a.turns,
        seed: a.seed,
        vocab: a.vocab,
    };
    match a.workload {
        WorkloadKind::Random => workload::random(&c),
        WorkloadKind::SharedPrefix => workload::shared_prefix(&c),
        WorkloadKind::MultiTurn => workload::multi_turn(&c),
    }
}

/// What the client reads of a streamed event.
#[derive(serde::Deserialize)]
struct StreamChunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<ChunkChoice<'a>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default, borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<ChunkDelta<'a>>,
}

#[derive(serde::Deserialize)]
struct ChunkDelta<'a> {
    #[serde(default, borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

struct Client {
    http: http::HttpClient,
    model: String,
    ignore_eos: bool,
    timeout: Duration,
}

impl Client {
    /// Sends one request; returns its timeline (times from its start) and the text it got.
    async fn request(
        &self,
        prompt: Value,
        chat: bool,
        output_len: usize,
        prompt_tokens: usize,
    ) -> (Timeline, String) {
        let mut body = json!({ "model": self.model, "max_tokens": output_len, "temperature": 0, "stream": true, "stream_options": { "include_usage": true } });
        if chat {
            body["messages"] = prompt;
        } else {
            body["prompt"] = prompt;
        }
        if self.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        let path = if chat { "/chat/completions" } else { "/completions" };
        let start = Instant::now();
        let mut t = Timeline { prompt_tokens, ..Default::default() };
        let mut text = String::new();
        let (mut chunks, mut usage_out, mut stream_err) = (0usize, None, None);
        let res = self
            .http
            .post_events(path, body.to_string().into_bytes(), self.timeout, &mut |d: &str| {
                if d == "[DONE]" {
                    return;
                }
                // Only the fields read, borrowed from the event where they need no unescaping.
                let Ok(v) = serde_json::from_str::<StreamChunk<'_>>(d) else { return };
                if v.error.is_some() {
                    stream_err = Some("stream_error".to_string());
                    return;
                }
                if let Some(u) = v.usage {
                    usage_out = u.completion_tokens.map(|x| x as usize);
                    if let Some(p) = u.prompt_tokens {
                        t.prompt_tokens = p as usize;
                    }
                }
                let piece = v.choices.first().and_then(|c| {
                    c.text
                        .as_deref()
                        .or_else(|| c.delta.as_ref().and_then(|d| d.content.as_deref()))
                });
                // A token's event counts even when its text is empty (a special token skipped,
                // a character not yet complete): the token reached the client then.
                if let Some(piece) = piece {
                    t.chunk_times.push(start.elapsed().as_secs_f64());
                    text.push_str(piece);
                    chunks += 1;
                }
            })
            .await;
        t.end = start.elapsed().as_secs_f64();
        t.output_tokens = usage_out.unwrap_or(chunks);
        t.error = match res {
            Err(kind) => Some(kind),
            Ok(()) if stream_err.is_some() => stream_err,
            Ok(()) if t.chunk_times.is_empty() => Some("empty_response".into()),
            Ok(()) => None,
        };
        (t, text)
    }
}

/// The most connections opened ahead of a run.
const WARM_CONNECTIONS: usize = 1024;

/// Opens about `n` keep-alive connections to the server (`n` model listings in flight at once:
/// the pool opens a connection for each one that finds none idle) and leaves them in the
/// pool. A listing that fails is not an error here: the run reports what its requests meet.
async fn warm_connections(http: &http::HttpClient, n: usize) {
    let all = (0..n).map(|_| {
        let http = http.clone();
        tokio::spawn(async move { http.get_json("/models", Duration::from_secs(10)).await })
    });
    for h in all.collect::<Vec<_>>() {
        let _ = h.await;
    }
}

async fn discover_model(http: &http::HttpClient) -> Result<String> {
    let v = http.get_json("/models", Duration::from_secs(10)).await.map_err(anyhow::Error::msg)?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .context("the server lists no model; pass --model")
}

/// Runs the workload once with at most `concurrency` requests (or conversations) in flight.
async fn run_once(
    client: Arc<Client>,
    specs: &[RequestSpec],
    concurrency: usize,
    rate: Option<f64>,
    seed: u64,
    progress: &indicatif::ProgressBar,
) -> (Vec<Timeline>, f64) {
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let results = Arc::new(Mutex::new(Vec::with_capacity(specs.len())));
    // Units of work: single requests, or whole conversations (turns in order).
    let mut units: Vec<Vec<RequestSpec>> = Vec::new();
    for s in specs {
        match s.conversation {
            Some(c) if units.last().is_some_and(|u| u[0].conversation == Some(c)) => {
                units.last_mut().expect("checked").push(s.clone())
            }
            _ => units.push(vec![s.clone()]),
        }
    }
    let mut rng = Rng::new(seed ^ 0xA5A5_5A5A);
    let start = Instant::now();
    let mut handles = Vec::new();
    for unit in units {
        if let Some(r) = rate.filter(|r| r.is_finite() && *r > 0.0) {
            // Poisson arrivals: exponential gaps.
            let gap = -(1.0 - rng.next_f64()).ln() / r;
            tokio::time::sleep(Duration::from_secs_f64(gap)).await;
        }
        let permit = sem.clone().acquire_owned().await.expect("semaphore open");
        let (client, results, progress) = (client.clone(), results.clone(), progress.clone());
        handles.push(tokio::spawn(async move {
            let _permit = permit;
            let mut history: Vec<Value> = Vec::new();
            for spec in unit {
                let (t, text) = match &spec.prompt {
                    PromptBody::Tokens(ids) => {
                        client.request(json!(ids), false, spec.output_len, ids.len()).await
                    }
                    PromptBody::ChatTurn(msg) => {
                        history.push(json!({ "role": "user", "content": msg }));
                        client
                            .request(Value::Array(history.clone()), true, spec.output_len, 0)
                            .await
                    }
                };
                let failed = t.error.is_some();
                if matches!(spec.prompt, PromptBody::ChatTurn(_)) {
                    history.push(json!({ "role": "assistant", "content": text }));
                }
                results.lock().expect("results lock").push(t);
                progress.inc(1);
                if failed {
                    break;
                }
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    let duration = start.elapsed().as_secs_f64();
    let v = std::mem::take(&mut *results.lock().expect("results lock"));
    (v, duration)
}

fn emit(a: &ServeArgs, value: &Value, tables: &str) -> Result<()> {
    match &a.json {
        Some(p) if p.as_os_str() == "-" => {
            eprint!("{tables}");
            println!("{}", serde_json::to_string_pretty(value)?);
        }
        Some(p) => {
            print!("{tables}");
            std::fs::write(p, serde_json::to_string_pretty(value)?)
                .with_context(|| format!("writing {}", p.display()))?;
        }
        None => print!("{tables}"),
    }
    Ok(())
}

/// Runs `tandem bench serve`.
pub fn run(mut a: ServeArgs) -> Result<()> {
    let threads = a.client_threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
    });
    if a.stub {
        a.base_url = stub::start(threads)?;
        a.model = Some(stub::STUB_MODEL.into());
    }
    let api_key = a.api_key.clone().filter(|k| !k.is_empty());
    let http = http::HttpClient::new(&a.base_url, a.ca_cert.as_deref(), api_key)
        .map_err(anyhow::Error::msg)?;
    let slo = Slo::parse(&a.slo).map_err(anyhow::Error::msg)?;
    if a.num_prompts == 0 {
        bail!("--num-prompts must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    rt.block_on(async {
        let model = match &a.model {
            Some(m) => m.clone(),
            None => discover_model(&http).await?,
        };
        let client = Arc::new(Client { http, model: model.clone(), ignore_eos: a.ignore_eos, timeout: Duration::from_secs(a.timeout) });
        let specs = specs(&a);
        // Warm-up: one short request, not measured.
        // Token ids below --vocab, as the workload's are (a small vocabulary has no id 1000).
        let lo = workload::first_id(a.vocab);
        let warm: Vec<u32> = (lo..lo + 4).map(|t| t.min(a.vocab.saturating_sub(1))).collect();
        let (w, _) = client.request(json!(warm), false, 2, 4).await;
        if let Some(e) = w.error {
            bail!("the warm-up request to {} failed ({e}); is the server up, and is '{model}' its model?", a.base_url);
        }
        let levels: Vec<usize> = if a.sweep.is_empty() { vec![a.concurrency.unwrap_or(specs.len())] } else { a.sweep.clone() };
        // The connections the run will hold, opened before any clock starts: otherwise the
        // first wave of requests waits on connection set-up and is measured doing so.
        let most = levels.iter().copied().max().unwrap_or(1).min(specs.len()).min(WARM_CONNECTIONS);
        warm_connections(&client.http, most).await;
        let mut runs: Vec<(usize, Report, Vec<Timeline>)> = Vec::new();
        let mut tables = String::new();
        for &c in &levels {
            let pb = if a.quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(specs.len() as u64) };
            pb.set_style(indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} requests {elapsed}").expect("valid template").progress_chars("=> "));
            pb.set_prefix(format!("concurrency {c}"));
            let (tl, dur) = run_once(client.clone(), &specs, c, a.request_rate, a.seed, &pb).await;
            pb.finish_and_clear();
            let r = report(&tl, dur, &slo);
            let title = if levels.len() > 1 { format!("Serving Benchmark Result (concurrency {c})") } else { "Serving Benchmark Result".to_string() };
            tables.push_str(&r.table(&title));
            runs.push((c, r, tl));
        }
        let config = json!({
            "base_url": a.base_url, "model": model, "workload": format!("{:?}", a.workload), "num_prompts": a.num_prompts,
            "input_len": a.input_len, "output_len": a.output_len, "range_ratio": a.range_ratio, "num_prefixes": a.num_prefixes,
            "prefix_len": a.prefix_len, "turns": a.turns, "request_rate": a.request_rate, "ignore_eos": a.ignore_eos, "seed": a.seed, "slo": slo,
        });
        let value = if runs.len() == 1 {
            json!({ "label": a.label, "config": config, "concurrency": runs[0].0, "result": runs[0].1 })
        } else {
            json!({ "label": a.label, "config": config, "sweep": runs.iter().map(|(c, r, _)| json!({ "concurrency": c, "result": r })).collect::<Vec<_>>() })
        };
        if let Some(p) = &a.plot {
            let heading = format!(
                "tandem bench serve: {} workload, {} requests, {} in / {} out tokens",
                format!("{:?}", a.workload).to_lowercase(),
                a.num_prompts,
                a.input_len,
                a.output_len,
            );
            let charts = if runs.len() == 1 {
                let tl = &runs[0].2;
                let ok: Vec<&Timeline> = tl.iter().filter(|t| t.error.is_none()).collect();
                let ms = |v: Vec<f64>| v.into_iter().map(|x| x * 1000.0).collect::<Vec<_>>();
                vec![
                    plot::Chart {
                        title: format!("Latency CDF, concurrency {}", runs[0].0),
                        x_label: "milliseconds",
                        y_label: "fraction of requests",
                        series: vec![
                            ("TTFT".to_string(), plot::cdf(&ms(ok.iter().filter_map(|t| t.ttft()).collect()))),
                            ("end to end".to_string(), plot::cdf(&ms(ok.iter().map(|t| t.end).collect()))),
                        ],
                    },
                    plot::Chart {
                        title: "Inter-token latency CDF".into(),
                        x_label: "milliseconds",
                        y_label: "fraction of tokens",
                        series: vec![("ITL".to_string(), plot::cdf(&ms(ok.iter().flat_map(|t| t.itls()).collect())))],
                    },
                ]
            } else {
                let at = |f: &dyn Fn(&Report) -> f64| runs.iter().map(|(c, r, _)| (*c as f64, f(r))).collect::<Vec<_>>();
                vec![
                    plot::Chart {
                        title: "Throughput against concurrency".into(),
                        x_label: "requests in flight",
                        y_label: "tokens per second",
                        series: vec![("output tok/s".to_string(), at(&|r| r.output_throughput))],
                    },
                    plot::Chart {
                        title: "TTFT against concurrency".into(),
                        x_label: "requests in flight",
                        y_label: "milliseconds",
                        series: vec![("TTFT median".to_string(), at(&|r| r.ttft.median_ms)), ("TTFT p99".to_string(), at(&|r| r.ttft.p99_ms))],
                    },
                ]
            };
            plot::draw(p, (&heading, &a.label), &charts).map_err(anyhow::Error::msg)?;
        }
        emit(&a, &value, &tables)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback HTTP/1.1 server that answers every request with a small JSON body after
    /// `delay` (so requests sent together overlap) and counts the connections it accepted.
    async fn counting_server(delay: Duration) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut held = Vec::new();
                    loop {
                        let Ok(n) = sock.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        held.extend_from_slice(&buf[..n]);
                        // One response per complete request head (GETs carry no body).
                        while let Some(end) = held.windows(4).position(|w| w == b"\r\n\r\n") {
                            held.drain(..end + 4);
                            tokio::time::sleep(delay).await;
                            let body = r#"{"data":[{"id":"m"}]}"#;
                            let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
                            if sock.write_all(format!("{head}{body}").as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (format!("http://{addr}/v1"), accepted)
    }

    /// The run's connections are open before its clock starts, and the next run reuses them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn warming_opens_one_connection_per_stream_and_keeps_them() {
        let (url, accepted) = counting_server(Duration::from_millis(50)).await;
        let http = http::HttpClient::new(&url, None, None).unwrap();
        warm_connections(&http, 12).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 12);
        warm_connections(&http, 12).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 12, "idle connections are reused");
        assert_eq!(discover_model(&http).await.unwrap(), "m");
    }
}
