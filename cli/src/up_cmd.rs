//! `tandem up`: the embedded default. Starts a router, a prefill worker and a decode worker as
//! local processes (or, with `--colocated`, one worker that does both) on CPU with the default
//! model, and serves the OpenAI API on 127.0.0.1. Ctrl-C stops everything; the workers also
//! exit on their own if this process dies (they watch their standard input).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::engine_args::EngineArgs;
use crate::serve_cmd::ModelArgs;

/// Arguments of `tandem up`.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Port of the OpenAI API on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// One worker does prefill and decode (no KV transfer).
    #[arg(long)]
    pub colocated: bool,
    /// Extra flags for the decode worker (e.g. `--disagg-min-tokens=64`), space-separated.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub decode_flags: String,
    /// Extra flags for the prefill worker, space-separated.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub prefill_flags: String,
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

/// Starts `tandem <args>` and waits for its `TANDEM_READY` line; its further output goes to
/// our standard error.
fn start(name: &'static str, args: &[String]) -> Result<Service> {
    let exe = std::env::current_exe().context("locating the tandem executable")?;
    let mut child = Command::new(exe)
        .args(args)
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
    let mut common = vec!["--model".to_string(), path.display().to_string(), "--served-model-name".to_string(), name.clone()];
    if log_json {
        common.push("--log-format=json".into());
    }
    let engine = a.engine.to_args();
    let split = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let mut services: Vec<Service> = Vec::new();
    let result = (|| -> Result<String> {
        let mut decode = vec!["decode".to_string(), "--listen=127.0.0.1:0".into()];
        decode.extend(common.clone());
        decode.extend(engine.clone());
        if a.colocated {
            decode.push("--colocated".into());
        }
        decode.extend(split(&a.decode_flags));
        services.push(start("decode worker", &decode)?);
        let decode_addr = services[0].addr.clone();
        let mut router = vec!["router".to_string(), format!("--listen=127.0.0.1:{}", a.port), format!("--decode-workers={decode_addr}")];
        if !a.colocated {
            let mut prefill = vec!["prefill".to_string(), "--listen=127.0.0.1:0".into()];
            prefill.extend(common.clone());
            prefill.extend(engine.clone());
            prefill.extend(split(&a.prefill_flags));
            services.push(start("prefill worker", &prefill)?);
            router.push(format!("--prefill-workers={}", services[1].addr));
        }
        router.extend(common.clone());
        services.push(start("router", &router)?);
        Ok(services.last().expect("router").addr.clone())
    })();
    let api = match result {
        Ok(a) => a,
        Err(e) => {
            stop_all(&mut services);
            return Err(e);
        }
    };
    let topology = if a.colocated { "colocated: one worker prefills and decodes" } else { "disaggregated: prefill worker -> KV pages over TCP -> decode worker" };
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
    let mut failed = None;
    while !stop.load(Ordering::SeqCst) {
        for s in services.iter_mut() {
            if let Ok(Some(status)) = s.child.try_wait() {
                failed = Some(format!("the {} exited ({status})", s.name));
            }
        }
        if failed.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("stopping...");
    stop_all(&mut services);
    match failed {
        Some(f) => bail!("{f}; stopped the other services"),
        None => Ok(()),
    }
}
