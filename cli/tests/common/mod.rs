//! Helpers of the serving tests: start the real `tandem` binary's services as processes on
//! loopback, talk HTTP to them, read their Prometheus metrics.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The default model (fetched on first use).
pub fn model() -> String {
    tandem_engine::model_files::model_fetch::default_model_path()
        .expect("default model")
        .display()
        .to_string()
}

/// Served model name of the default model.
pub const MODEL: &str = "SmolLM2-135M-Instruct";

/// A running service process; killed when dropped.
pub struct Proc {
    pub name: String,
    pub child: Child,
    _stdin: Option<ChildStdin>,
    /// Its gRPC/HTTP address.
    pub addr: String,
    /// Where its standard error goes.
    pub log: PathBuf,
}

impl Proc {
    /// Starts `tandem <args>` with `env` and waits for its ready line.
    pub fn start(name: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
        // Unique within the test binary: tests run in parallel threads of one process, and a
        // name reused would truncate (and at its test's end delete) another service's log.
        static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log =
            std::env::temp_dir().join(format!("tandem-test-{}-{name}-{n}.log", std::process::id()));
        let err = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
        cmd.args(args);
        if args.first().map(String::as_str) != Some("up") {
            cmd.arg("--watch-stdin");
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(err);
        cmd.env("TANDEM_NUM_THREADS", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn tandem");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for l in lines.by_ref().map_while(Result::ok) {
                if let Some(rest) = l.strip_prefix("TANDEM_READY ") {
                    let _ = tx.send(rest.split_whitespace().nth(1).unwrap_or_default().to_string());
                    break;
                }
            }
            for _ in lines.map_while(Result::ok) {}
        });
        let addr = match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "{name} did not become ready; its log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
        };
        Proc { name: name.to_string(), child, _stdin: stdin, addr, log }
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// `defaults` then `extra`, less each default `--flag=value` that `extra` gives again (a test
/// may choose its own `--listen=` or `--kernel=`).
fn with_extra(defaults: &[&str], extra: &[&str]) -> Vec<String> {
    let flag = |x: &str| x.split_once('=').map(|(f, _)| f.to_string());
    let overridden: Vec<String> = extra.iter().filter_map(|x| flag(x)).collect();
    let kept = defaults.iter().filter(|d| flag(d).is_none_or(|f| !overridden.contains(&f)));
    kept.chain(extra).map(|x| x.to_string()).collect()
}

/// A decode worker with the exact kernels and `extra` flags.
pub fn decode(extra: &[&str], env: &[(&str, &str)]) -> Proc {
    let model = format!("--model={}", model());
    let defaults =
        ["decode", "--listen=127.0.0.1:0", "--kernel=exact", "--kv-cache-memory=128MiB", &model];
    Proc::start("decode", &with_extra(&defaults, extra), env)
}

/// A prefill worker with the exact kernels and `extra` flags.
pub fn prefill(extra: &[&str], env: &[(&str, &str)]) -> Proc {
    let model = format!("--model={}", model());
    let defaults = [
        "prefill",
        "--listen=127.0.0.1:0",
        "--kernel=exact",
        "--kv-cache-memory=128MiB",
        "--max-num-batched-tokens=32",
        &model,
    ];
    Proc::start("prefill", &with_extra(&defaults, extra), env)
}

/// A router over the given workers.
pub fn router(decode: &[&Proc], prefill: &[&Proc]) -> Proc {
    router_with(decode, prefill, &[], &[])
}

/// A router over the given workers, with `extra` flags and `env`.
pub fn router_with(
    decode: &[&Proc],
    prefill: &[&Proc],
    extra: &[&str],
    env: &[(&str, &str)],
) -> Proc {
    let workers = |ps: &[&Proc]| ps.iter().map(|p| p.addr.as_str()).collect::<Vec<_>>().join(",");
    let model = format!("--model={}", model());
    let decode = format!("--decode-workers={}", workers(decode));
    let prefill_workers = format!("--prefill-workers={}", workers(prefill));
    let mut defaults = vec!["router", "--listen=127.0.0.1:0", &model, &decode];
    if !prefill.is_empty() {
        defaults.push(&prefill_workers);
    }
    Proc::start("router", &with_extra(&defaults, extra), env)
}

/// An HTTP/1.1 response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

impl HttpResponse {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(nl) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            std::str::from_utf8(&b[..nl]).unwrap_or("0").split(';').next().unwrap().trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = nl + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// Sends raw request bytes and reads the whole response (the connection closes after it).
pub fn http_raw(addr: &str, request: &[u8], timeout: Duration) -> std::io::Result<HttpResponse> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(request)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(buf.len());
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let raw = &buf[(split + 4).min(buf.len())..];
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(raw)
    } else {
        raw.to_vec()
    };
    Ok(HttpResponse { status, body: String::from_utf8_lossy(&body).into_owned() })
}

/// `method path` with an optional JSON body.
pub fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> HttpResponse {
    http_key(addr, method, path, body, None)
}

fn request(addr: &str, method: &str, path: &str, body: &str, key: Option<&str>) -> String {
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
}

/// `method path` with an optional JSON body and API key.
pub fn http_key(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    key: Option<&str>,
) -> HttpResponse {
    http_raw(
        addr,
        request(addr, method, path, body.unwrap_or(""), key).as_bytes(),
        Duration::from_secs(120),
    )
    .expect("HTTP request")
}

/// Opens a streaming request and returns the socket (the response is read with [`read_until`]).
pub fn open_stream(addr: &str, path: &str, body: &str) -> TcpStream {
    open_stream_key(addr, path, body, None)
}

/// [`open_stream`] with an API key.
pub fn open_stream_key(addr: &str, path: &str, body: &str, key: Option<&str>) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request(addr, "POST", path, body, key).as_bytes()).unwrap();
    s
}

/// Reads from a stream until `needle` appeared (or EOF); returns everything read.
pub fn read_until(s: &mut TcpStream, needle: &str) -> String {
    let mut acc = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => acc.extend_from_slice(&buf[..n]),
        }
        if String::from_utf8_lossy(&acc).contains(needle) {
            break;
        }
    }
    String::from_utf8_lossy(&acc).into_owned()
}

/// The value of the first sample of `name` (with every label in `labels`) on `addr`'s
/// `/metrics`.
pub fn metric(addr: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let text = http(addr, "GET", "/metrics", None).body;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            (l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
                && labels.iter().all(|x| l.contains(x))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The sum of every sample of `name` on `addr`'s `/metrics` (all label sets).
pub fn metric_sum(addr: &str, name: &str) -> f64 {
    let text = http(addr, "GET", "/metrics", None).body;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits (up to 10 s) for `name` on `addr` to equal `want`; returns the last value seen.
pub fn wait_metric(addr: &str, name: &str, want: f64) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = metric(addr, name, &[]);
        if v == Some(want) || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Free KV blocks of a worker.
pub fn free_blocks(w: &Proc) -> f64 {
    metric(&w.addr, "tandem_kv_cache_free_blocks", &[]).expect("free-blocks gauge")
}

/// A prompt long enough to be prefilled remotely (several blocks).
pub fn long_prompt() -> String {
    "The history of the printing press begins in the fifteenth century, when ".repeat(4)
}

/// A `redis-server` on a free loopback port; stopped when dropped.
pub struct RedisServer {
    child: Child,
    /// `redis://127.0.0.1:port` (`rediss://:password@…` with TLS and a password).
    pub url: String,
    /// Its port.
    pub port: u16,
    opts: RedisOptions,
}

/// How a test's Redis is secured.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// `requirepass`.
    pub password: Option<String>,
    /// TLS only, with the certificates of `scripts/test/tls_certs.sh` in this folder.
    pub tls: Option<PathBuf>,
    /// Whether TLS clients must present a certificate.
    pub client_certs: bool,
}

impl RedisServer {
    /// Starts one (on `port`, or a free one).
    pub fn start(port: Option<u16>) -> RedisServer {
        Self::start_with(port, RedisOptions::default())
    }

    /// Starts one with a password and/or TLS.
    pub fn start_with(port: Option<u16>, opts: RedisOptions) -> RedisServer {
        let port = port.unwrap_or_else(|| {
            std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
        });
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/test/redis_server.sh");
        let out = Command::new("bash").arg(script).output().expect("run redis_server.sh");
        assert!(
            out.status.success(),
            "redis-server is missing and could not be installed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let mut args: Vec<String> =
            ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"].map(String::from).into();
        if let Some(dir) = &opts.tls {
            let f = |name: &str| dir.join(name).display().to_string();
            args.extend(["--port".into(), "0".into(), "--tls-port".into(), port.to_string()]);
            args.extend(["--tls-cert-file".into(), f("server.pem")]);
            args.extend(["--tls-key-file".into(), f("server.key")]);
            args.extend(["--tls-ca-cert-file".into(), f("ca.pem")]);
            let auth = if opts.client_certs { "yes" } else { "no" };
            args.extend(["--tls-auth-clients".into(), auth.into()]);
        } else {
            args.extend(["--port".into(), port.to_string()]);
        }
        if let Some(pw) = &opts.password {
            args.extend(["--requirepass".into(), pw.clone()]);
        }
        let child = Command::new(bin)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let scheme = if opts.tls.is_some() { "rediss" } else { "redis" };
        let auth = opts.password.as_ref().map_or(String::new(), |p| format!(":{p}@"));
        let url = format!("{scheme}://{auth}127.0.0.1:{port}");
        RedisServer { child, url, port, opts }
    }

    /// Stops it and starts it again on the same port with the same options.
    pub fn restart(&mut self) {
        self.stop();
        *self = Self::start_with(Some(self.port), self.opts.clone());
    }

    /// Stops it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A throwaway CA with server and client certificates (`scripts/test/tls_certs.sh`) in a
/// fresh folder under the target directory.
pub fn tls_certs(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/test/tls_certs.sh");
    let out = Command::new("bash").arg(script).arg(&dir).output().expect("run tls_certs.sh");
    assert!(out.status.success(), "certificates: {}", String::from_utf8_lossy(&out.stderr));
    dir
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A router's `/debug/routing`.
pub fn debug_routing(router: &Proc) -> serde_json::Value {
    http(&router.addr, "GET", "/debug/routing", None).json()
}

/// A two-token greedy completion through `router`; its request id.
pub fn complete(router: &Proc, prompt: &str) -> String {
    let body =
        serde_json::json!({ "model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0 })
            .to_string();
    let res = http(&router.addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(res.status, 200, "{}", res.body);
    res.json()["id"].as_str().unwrap().to_string()
}

/// Waits until every router indexes at least `at_least` blocks for `worker_id`.
pub fn wait_indexed(routers: &[&Proc], worker_id: &str, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for r in routers {
        loop {
            let d = debug_routing(r);
            let n = d["workers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["worker_id"] == worker_id)
                .map_or(0, |w| w["indexed_blocks"].as_u64().unwrap());
            if n >= at_least {
                break;
            }
            assert!(Instant::now() < deadline, "router never indexed {worker_id}'s blocks: {d}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The Python interpreter of the clients' environment (`scripts/test/python_env.sh`: the
/// `openai` SDK, `langchain-openai`, LiteLLM, `jsonschema`; created on first use).
pub fn python() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/test/python_env.sh");
    let out = Command::new("bash").arg(script).output().expect("run python_env.sh");
    assert!(
        out.status.success(),
        "setting up the Python clients failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Runs the client script `tests/e2e/{script}` with `args` in the clients' Python environment
/// and returns the JSON it prints (a failing script fails the test with its output).
pub fn python_client(script: &str, args: &[&str]) -> serde_json::Value {
    let path = format!("{}/../tests/e2e/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python()).arg(&path).args(args).output().expect("run the client");
    assert!(
        out.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client prints JSON")
}
