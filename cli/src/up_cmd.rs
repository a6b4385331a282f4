//! `tandem up`: the embedded default. Starts a router, a prefill worker and a decode worker as
//! local processes (or, with `--colocated` and by default with `--device cuda`, one worker that
//! does both) on CPU with the default model, and serves the OpenAI API on 127.0.0.1. It supervises them: a service that dies is
//! started again on the same address, after a backoff that grows while it keeps dying (the
//! router meanwhile routes around a dead prefill worker and its `/health` says `degraded`).
//! Only Ctrl-C or SIGTERM stops everything; the services also exit on their own if this
//! process dies (they watch their standard input).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::engine_args::{DeviceArg, EngineArgs};
use crate::serve_cmd::ModelArgs;

/// Arguments of `tandem up`.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Port of the OpenAI API on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// One worker does prefill and decode (no KV transfer). The default with `--device cuda`:
    /// `up` puts both workers on the one GPU it is given, where a second process only splits
    /// the device and moves KV pages through the host (0.45× the throughput, 4× the TTFT
    /// measured on an H100).
    #[arg(long, conflicts_with = "disaggregated")]
    pub colocated: bool,
    /// A prefill and a decode worker even on a GPU (to try the KV transfer on one machine).
    #[arg(long)]
    pub disaggregated: bool,
    /// Let the prefill and decode workers on CPU compute at the same time instead of taking
    /// turns a step at a time (`--core-share-lock`; both pools then compete for every core).
    #[arg(long)]
    pub no_core_share: bool,
    /// Extra flags for the decode worker (e.g. `--disagg-min-tokens=64`), space-separated.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub decode_flags: String,
    /// Extra flags for the prefill worker, space-separated.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub prefill_flags: String,
    /// A Jinja chat template file for the router to use instead of the model's own.
    #[arg(long, env = "TANDEM_CHAT_TEMPLATE")]
    pub chat_template: Option<std::path::PathBuf>,
    /// How the model writes tool calls (`hermes`, `llama3_json`; default: from the template).
    #[arg(long, env = "TANDEM_TOOL_CALL_PARSER")]
    pub tool_call_parser: Option<tandem_router::tool_format::ToolCallFormat>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// A started service process.
struct Service {
    name: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    addr: String,
}

/// Supervision of one service: how to start it again and when.
struct Supervised {
    service: Service,
    /// Its arguments, listening on the address it got the first time.
    args: Vec<String>,
    /// Environment variables it starts with.
    env: Vec<(String, String)>,
    /// When it was last started.
    since: Instant,
    /// Restarts in a row without a long enough run in between (sets the backoff).
    failures: u32,
    /// Dead and waiting to be started again at this time.
    restart_at: Option<Instant>,
}

/// First wait before starting a dead service again; it doubles per failure in a row.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between restarts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A run this long resets the backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// Least token budget of the prefill worker's step (`--max-num-batched-tokens` may raise it;
/// `--prefill-flags` overrides it).
const PREFILL_STEP_TOKENS: usize = 1024;

/// Token budget of a disaggregated decode worker's step (unless `--max-num-seqs` asks for more).
const DECODE_STEP_TOKENS: usize = 128;

/// Whether `up` runs one colocated worker: when asked, and by default on a GPU (see
/// [`UpArgs::colocated`]); CPU processes each take their own threads, so there the split
/// topology is the default.
fn colocated(a: &UpArgs) -> bool {
    a.colocated || (a.engine.device == DeviceArg::Cuda && !a.disaggregated)
}

/// `args` without the flags that `extra` sets (so `--decode-flags` and `--prefill-flags`
/// override `up`'s own engine flags instead of repeating them).
fn without_flags(args: Vec<String>, extra: &[String]) -> Vec<String> {
    let name = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    let set: Vec<String> = extra.iter().filter(|e| e.starts_with("--")).map(|e| name(e)).collect();
    args.into_iter().filter(|a| !set.contains(&name(a))).collect()
}

/// The wait before restart number `failures` (1-based) in a row.
fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(10)).min(MAX_BACKOFF)
}

/// glibc's per-thread cache of freed blocks for every service on a GPU host: 1,024 entries a
/// size instead of 7. The operator gives its GPU worker pods the same value (its
/// `workloads::GPU_MALLOC_TUNABLES` says why and what it measured; a test keeps the two equal:
/// the `tandem` binary does not link the operator).
pub(crate) const GPU_MALLOC_TUNABLES: &str = "glibc.malloc.tcache_count=1024";

/// What the services start with beside their arguments: on a GPU host the router's async
/// runtime gets the workers' thread count (`GPU_RUNTIME_THREADS`) and glibc a deeper thread
/// cache ([`GPU_MALLOC_TUNABLES`]), each unless the user set that variable (`is_set`; the
/// children inherit the user's).
fn child_env(device: DeviceArg, is_set: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    if device != DeviceArg::Cuda {
        return Vec::new();
    }
    let runtime = crate::serve_cmd::GPU_RUNTIME_THREADS.to_string();
    [("TANDEM_RUNTIME_THREADS", runtime), ("GLIBC_TUNABLES", GPU_MALLOC_TUNABLES.to_string())]
        .into_iter()
        .filter(|(k, _)| !is_set(k))
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// `args` with its `--listen=` value replaced by `addr` (a restarted service keeps its address).
fn pin_listen(args: &[String], addr: &str) -> Vec<String> {
    args.iter()
        .map(|a| if a.starts_with("--listen=") { format!("--listen={addr}") } else { a.clone() })
        .collect()
}

/// Starts `tandem <args>` and waits for its `TANDEM_READY` line; its further output goes to
/// our standard error.
fn start(name: &'static str, args: &[String], env: &[(String, String)]) -> Result<Service> {
    let exe = std::env::current_exe().context("locating the tandem executable")?;
    let mut child = Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg("--watch-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting the {name}"))?;
    let stdin = child.stdin.take();
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let addr = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(rest) = l.strip_prefix("TANDEM_READY ") {
                    break rest.split_whitespace().nth(1).unwrap_or_default().to_string();
                }
                eprintln!("[{name}] {l}");
            }
            _ => {
                let status = child.wait()?;
                bail!("the {name} exited before it was ready ({status})");
            }
        }
    };
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("[{name}] {l}");
        }
    });
    Ok(Service { name, child, stdin, addr })
}

fn stop_all(services: &mut [Service]) {
    // Closing their stdin asks them to shut down gracefully.
    for s in services.iter_mut() {
        s.stdin.take();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for s in services.iter_mut() {
        while Instant::now() < deadline {
            if matches!(s.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !matches!(s.child.try_wait(), Ok(Some(_))) {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
    }
}

/// `tandem up`; `log_json` passes structured logging on to the services.
pub fn run(a: UpArgs, log_json: bool) -> Result<()> {
    let path = a.model.path()?;
    let name = a.model.served_name(&path);
    let mut common = vec![
        "--model".to_string(),
        path.display().to_string(),
        "--served-model-name".to_string(),
        name.clone(),
    ];
    if log_json {
        common.push("--log-format=json".into());
    }
    // Models loaded later run on the decode workers (prefilled there), named by the router.
    let model_dir: Vec<String> =
        a.model.model_dir.iter().map(|d| format!("--model-dir={}", d.display())).collect();
    let split = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let one_worker = colocated(&a);
    let env = child_env(a.engine.device, |k| std::env::var_os(k).is_some());
    // Two workers on this host's CPU cores take turns at them, a step at a time.
    let core_share = (!one_worker && a.engine.device == DeviceArg::Cpu && !a.no_core_share)
        .then(|| std::env::temp_dir().join(format!("tandem-up-{}.cores.lock", std::process::id())));
    let share_flag = core_share.iter().map(|p| format!("--core-share-lock={}", p.display()));
    let share_flag: Vec<String> = share_flag.collect();
    let mut services: Vec<Service> = Vec::new();
    let mut started_with: Vec<Vec<String>> = Vec::new();
    let result = (|| -> Result<String> {
        let mut decode = vec!["decode".to_string(), "--listen=127.0.0.1:0".into()];
        decode.extend(common.clone());
        decode.extend(model_dir.clone());
        let mut decode_engine = a.engine.clone();
        if !one_worker {
            // Its prompts are prefilled elsewhere; one it must prefill itself (a full prefill
            // queue, a failed transfer) comes in small chunks, so the streams it decodes never
            // wait long for their next token.
            decode_engine.max_num_batched_tokens = Some(
                decode_engine
                    .max_num_batched_tokens()
                    .min((2 * decode_engine.max_num_seqs()).max(DECODE_STEP_TOKENS)),
            );
        }
        let decode_flags = split(&a.decode_flags);
        decode.extend(without_flags(decode_engine.to_args(), &decode_flags));
        decode.extend(without_flags(share_flag.clone(), &decode_flags));
        if one_worker {
            decode.push("--colocated".into());
        }
        decode.extend(decode_flags);
        services.push(start("decode worker", &decode, &env)?);
        started_with.push(decode);
        let decode_addr = services[0].addr.clone();
        let mut router = vec![
            "router".to_string(),
            format!("--listen=127.0.0.1:{}", a.port),
            format!("--decode-workers={decode_addr}"),
        ];
        if !one_worker {
            let mut prefill = vec!["prefill".to_string(), "--listen=127.0.0.1:0".into()];
            prefill.extend(common.clone());
            let prefill_flags = split(&a.prefill_flags);
            // No stream waits on a prefill worker's steps, so their budget only trades the
            // first prompts' TTFT for the batch's: twice the usual step lets a burst of prompts
            // finish in fewer, larger steps before the decode worker (on the same cores here)
            // starts competing for the CPU.
            let mut prefill_engine = a.engine.clone();
            prefill_engine.max_num_batched_tokens =
                Some(prefill_engine.max_num_batched_tokens().max(PREFILL_STEP_TOKENS));
            prefill.extend(without_flags(prefill_engine.to_args(), &prefill_flags));
            prefill.extend(without_flags(share_flag.clone(), &prefill_flags));
            prefill.extend(prefill_flags);
            services.push(start("prefill worker", &prefill, &env)?);
            started_with.push(prefill);
            router.push(format!("--prefill-workers={}", services[1].addr));
        }
        router.extend(common.clone());
        router.extend(model_dir.clone());
        if let Some(t) = &a.chat_template {
            router.push(format!("--chat-template={}", t.display()));
        }
        if let Some(f) = a.tool_call_parser {
            router.push(format!("--tool-call-parser={}", f.name()));
        }
        services.push(start("router", &router, &env)?);
        started_with.push(router);
        Ok(services.last().expect("router").addr.clone())
    })();
    let api = match result {
        Ok(a) => a,
        Err(e) => {
            stop_all(&mut services);
            return Err(e);
        }
    };
    let topology = if one_worker {
        "colocated: one worker prefills and decodes"
    } else {
        "disaggregated: prefill worker -> KV pages over TCP -> decode worker"
    };
    eprintln!("Tandem is serving {name} at http://{api}/v1 ({topology}). Press Ctrl-C to stop.");
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "TANDEM_READY up {api}")?;
        out.flush()?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
            rt.block_on(tandem_worker::serve::shutdown_signal(false));
        }
        flag.store(true, Ordering::SeqCst);
    });
    let now = Instant::now();
    let mut supervised: Vec<Supervised> = services
        .into_iter()
        .zip(started_with)
        .map(|(service, args)| Supervised {
            args: pin_listen(&args, &service.addr),
            env: env.clone(),
            service,
            since: now,
            failures: 0,
            restart_at: None,
        })
        .collect();
    while !stop.load(Ordering::SeqCst) {
        for s in supervised.iter_mut() {
            supervise(s, &stop);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("stopping...");
    let mut services: Vec<Service> = supervised.into_iter().map(|s| s.service).collect();
    stop_all(&mut services);
    if let Some(p) = core_share {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// One supervision round for `s`: notice that it died, or start it again once its backoff is
/// over.
fn supervise(s: &mut Supervised, stop: &AtomicBool) {
    let name = s.service.name;
    match s.restart_at {
        None => {
            if let Ok(Some(status)) = s.service.child.try_wait() {
                s.failures = if s.since.elapsed() >= HEALTHY_RUN { 1 } else { s.failures + 1 };
                let wait = backoff(s.failures);
                eprintln!("[up] the {name} exited ({status}); starting it again in {wait:?} (restart {} in a row)", s.failures);
                s.restart_at = Some(Instant::now() + wait);
            }
        }
        Some(at) if Instant::now() >= at && !stop.load(Ordering::SeqCst) => {
            match start(name, &s.args, &s.env) {
                Ok(service) => {
                    eprintln!("[up] the {name} is back at {}", service.addr);
                    s.service = service;
                    s.since = Instant::now();
                    s.restart_at = None;
                }
                Err(e) => {
                    s.failures += 1;
                    let wait = backoff(s.failures);
                    eprintln!("[up] starting the {name} again failed: {e:#}; next try in {wait:?}");
                    s.restart_at = Some(Instant::now() + wait);
                }
            }
        }
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(6), MAX_BACKOFF);
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    /// On a GPU host every service gets the GPU thread count for its runtime and glibc's deeper
    /// thread cache, each unless the user set that variable (the children inherit theirs); on
    /// CPU nothing is added.
    #[test]
    fn gpu_services_get_more_runtime_threads_and_malloc_cache_unless_the_user_chose() {
        let threads = crate::serve_cmd::GPU_RUNTIME_THREADS.to_string();
        let both = vec![
            ("TANDEM_RUNTIME_THREADS".to_string(), threads.clone()),
            ("GLIBC_TUNABLES".to_string(), GPU_MALLOC_TUNABLES.to_string()),
        ];
        assert_eq!(child_env(DeviceArg::Cuda, |_| false), both);
        assert_eq!(child_env(DeviceArg::Cuda, |k| k == "TANDEM_RUNTIME_THREADS"), both[1..]);
        assert_eq!(child_env(DeviceArg::Cuda, |k| k == "GLIBC_TUNABLES"), both[..1]);
        assert!(child_env(DeviceArg::Cuda, |_| true).is_empty());
        assert!(child_env(DeviceArg::Cpu, |_| false).is_empty());
        // The operator's GPU worker pods run with the same cache.
        assert_eq!(GPU_MALLOC_TUNABLES, tandem_operator::workloads::GPU_MALLOC_TUNABLES);
    }

    /// `tandem up` as a user types it.
    fn up(args: &[&str]) -> UpArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            up: UpArgs,
        }
        <Cli as clap::Parser>::try_parse_from(std::iter::once("up").chain(args.iter().copied()))
            .unwrap()
            .up
    }

    #[test]
    fn one_gpu_runs_colocated_with_gpu_sized_steps() {
        let gpu = up(&["--device", "cuda"]);
        assert!(colocated(&gpu));
        assert_eq!((gpu.engine.max_num_seqs(), gpu.engine.max_num_batched_tokens()), (256, 8192));
        assert!(!colocated(&up(&["--device", "cuda", "--disaggregated"])));
        let cpu = up(&[]);
        assert!(!colocated(&cpu) && colocated(&up(&["--colocated"])));
        assert_eq!((cpu.engine.max_num_seqs(), cpu.engine.max_num_batched_tokens()), (64, 512));
        let set =
            up(&["--device", "cuda", "--max-num-seqs", "32", "--max-num-batched-tokens", "2048"]);
        assert_eq!((set.engine.max_num_seqs(), set.engine.max_num_batched_tokens()), (32, 2048));
    }

    #[test]
    fn extra_flags_override_ups_own() {
        let args: Vec<String> =
            ["--max-num-seqs=64", "--max-num-batched-tokens=128", "--block-size=16"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let extra: Vec<String> = ["--max-num-batched-tokens", "512", "--disagg-min-tokens=8"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(without_flags(args, &extra), ["--max-num-seqs=64", "--block-size=16"]);
    }

    #[test]
    fn a_restarted_service_keeps_its_address() {
        let args: Vec<String> = ["decode", "--listen=127.0.0.1:0", "--model", "m"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            pin_listen(&args, "127.0.0.1:4321"),
            ["decode", "--listen=127.0.0.1:4321", "--model", "m"]
        );
    }
}
