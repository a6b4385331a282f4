//! `tandem bench serve` against an HTTPS endpoint with an API key, as a deployment behind a
//! TLS-terminating gateway is measured: a local TLS proxy (rustls, a throwaway CA) in front of
//! a real router; the same workload over plain HTTP and over HTTPS gives the same counts and
//! throughput within noise.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;

const KEY: &str = "sk-bench-test";

/// A TLS-terminating proxy on a free loopback port forwarding every connection to `target`;
/// its address. Runs for the rest of the test process.
fn tls_proxy(certs: &std::path::Path, target: String) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(certs.join("server.pem"))
            .unwrap()
            .map(Result::unwrap)
            .collect();
    let key = PrivateKeyDer::from_pem_file(certs.join("server.key")).unwrap();
    let cfg =
        rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(chain, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap().to_string();
    std_listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let (acceptor, target) = (acceptor.clone(), target.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let Ok(mut up) = tokio::net::TcpStream::connect(&target).await else { return };
                    let _ = up.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
    });
    addr
}

fn bench(base: &str, extra: &[&str]) -> (bool, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["bench", "serve", &format!("--base-url={base}"), "--json=-", "--quiet"])
        .args([
            "--num-prompts=8",
            "--concurrency=4",
            "--input-len=32",
            "--output-len=8",
            "--ignore-eos",
        ])
        .args(extra)
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), serde_json::from_slice(&out.stdout).unwrap_or(Value::Null), stderr)
}

#[test]
fn bench_serve_measures_an_https_endpoint_with_an_api_key() {
    let certs = tls_certs("bench-https");
    let d = decode(&["--colocated"], &[]);
    let r = router_with(&[&d], &[], &[], &[("TANDEM_API_KEYS", KEY)]);
    let proxy = tls_proxy(&certs, r.addr.clone());
    let ca = format!("--ca-cert={}", certs.join("ca.pem").display());
    let key = format!("--api-key={KEY}");

    // One run first so that both measured runs find the same prompts cached.
    let (ok, _, err) = bench(&format!("http://{}/v1", r.addr), &[&key]);
    assert!(ok, "{err}");
    let (ok, plain, err) = bench(&format!("http://{}/v1", r.addr), &[&key]);
    assert!(ok, "{err}");
    let (ok, tls, err) = bench(&format!("https://{proxy}/v1"), &[&key, &ca]);
    assert!(ok, "{err}");
    for v in [&plain, &tls] {
        let res = &v["result"];
        assert_eq!(
            (res["completed"].as_u64(), res["failed"].as_u64()),
            (Some(8), Some(0)),
            "{res}"
        );
        assert_eq!(res["total_output_tokens"], 64);
        assert_eq!(v["config"]["model"], MODEL, "the model is discovered through the same client");
    }
    let tput = |v: &Value| v["result"]["output_throughput"].as_f64().unwrap();
    let ratio = tput(&tls) / tput(&plain);
    eprintln!(
        "output tok/s: http {:.1}, https {:.1} (ratio {ratio:.2}); TTFT median ms: {} / {}",
        tput(&plain),
        tput(&tls),
        plain["result"]["ttft"]["median_ms"],
        tls["result"]["ttft"]["median_ms"]
    );
    // TLS on loopback costs microseconds against milliseconds per token: the same within noise
    // (the bound is wide so that a busy host cannot fail it).
    assert!((0.5..2.0).contains(&ratio), "https/http throughput ratio {ratio}");

    // Without the key: 401 on the first request, reported as such.
    let (ok, _, err) = bench(&format!("https://{proxy}/v1"), &[&ca, "--model=x"]);
    assert!(!ok && err.contains("http_401"), "{err}");
    // An untrusted certificate (the system's roots do not know the test CA): refused.
    let (ok, _, err) = bench(&format!("https://{proxy}/v1"), &[&key, "--model=x"]);
    assert!(!ok && err.contains("failed"), "{err}");
}
