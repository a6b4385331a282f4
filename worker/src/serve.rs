//! Serving a worker: gRPC and HTTP (`/metrics`, `/health`) on one port, a ready line for the
//! process that started it, and shutdown on Ctrl-C, SIGTERM or (when started by `tandem up`)
//! the parent's exit.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::engine_loop::EngineHandle;

/// Prints the line `tandem up` and the tests wait for: `TANDEM_READY <role> <addr>`.
pub fn announce_ready(role: &str, addr: SocketAddr) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "TANDEM_READY {role} {addr}");
    let _ = out.flush();
}

static DRAINING: AtomicBool = AtomicBool::new(false);

/// Whether this worker is draining: it finishes the requests it has but reports itself
/// unavailable (`/health` 503, `Worker.Status` unhealthy) so routers and Kubernetes send no more.
pub fn draining() -> bool {
    DRAINING.load(Ordering::Relaxed)
}

/// Why a worker stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Ctrl-C or SIGTERM: drain first.
    Signal,
    /// Standard input closed: the parent (`tandem up`) is gone, and its clients with it.
    ParentGone,
}

/// Resolves on Ctrl-C, SIGTERM, or — with `watch_stdin` — when standard input closes (the
/// parent process is gone).
pub async fn shutdown_signal(watch_stdin: bool) {
    wait_shutdown(watch_stdin).await;
}

/// Like [`shutdown_signal`], saying which it was.
pub async fn wait_shutdown(watch_stdin: bool) -> Shutdown {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let stdin = async {
        if !watch_stdin {
            return std::future::pending::<()>().await;
        }
        // A blocking read on its own thread: EOF or an error means the parent went away.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 64];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
            let _ = tx.send(());
        });
        let _ = rx.await;
    };
    tokio::select! {
        _ = ctrl_c => Shutdown::Signal,
        _ = term => Shutdown::Signal,
        _ = stdin => Shutdown::ParentGone,
    }
}

/// The HTTP side of a worker: `/metrics` (Prometheus text) and `/health` (200 only while the
/// engine thread runs and its last step succeeded).
pub fn http_routes(metrics: PrometheusHandle, engine: EngineHandle) -> axum::Router {
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    axum::Router::new()
        .route("/metrics", get(move || std::future::ready(crate::metrics::render(&metrics))))
        .route(
            "/health",
            get(move || {
                let ok = engine.submit(|_| {}) && !engine.snapshot().failed;
                let code = if ok && !draining() {
                    axum::http::StatusCode::OK
                } else {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                };
                std::future::ready((
                    code,
                    if !ok {
                        "engine unavailable"
                    } else if draining() {
                        "draining"
                    } else {
                        "ok"
                    },
                ))
            }),
        )
}

/// Serves `grpc` and `http` on `listener` until a shutdown (see [`wait_shutdown`]). On a signal
/// the worker drains: it reports itself unavailable, takes no new connections or streams, and
/// waits up to `drain` for the requests it has to finish; when its parent is gone it stops at once.
pub async fn serve(
    listener: TcpListener,
    grpc: tonic::service::Routes,
    http: axum::Router,
    watch_stdin: bool,
    drain: Duration,
) -> anyhow::Result<()> {
    let app = grpc
        .into_axum_router()
        .layer(axum::middleware::from_fn(crate::auth::require_token))
        .merge(http);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        serve_http(nodelay(listener), app, CONN_LIMITS, async move {
            let _ = stop_rx.await;
        })
        .await
    });
    let why = wait_shutdown(watch_stdin).await;
    DRAINING.store(true, Ordering::Relaxed);
    let _ = stop_tx.send(());
    if why == Shutdown::ParentGone {
        return Ok(());
    }
    tracing::info!(drain_timeout = ?drain, "draining: finishing the requests in flight");
    match tokio::time::timeout(drain, server).await {
        Ok(r) => r??,
        Err(_) => tracing::warn!("drain timeout: stopping with requests still in flight"),
    }
    tracing::info!("drained");
    Ok(())
}

/// Time limits of a listener's connections, so that a client that connects and then sends
/// nothing (or half a request) cannot hold a connection and its memory indefinitely.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// A request's headers must arrive in full within this; it is also how long an idle
    /// HTTP/1.1 keep-alive connection stays open.
    pub header_read: Duration,
    /// HTTP/2 connections are pinged this often and closed when a ping is not answered within
    /// the same time (a peer that vanished without closing).
    pub h2_keep_alive: Duration,
    /// Streams one HTTP/2 connection may have open at once. A router sends every request for a
    /// worker over one connection, so this bounds the requests a worker can hold from one
    /// router: it must exceed any engine's `--max-num-seqs` plus its queue. (hyper's default,
    /// 200, held the 201st and later streams in the router until earlier ones finished: a
    /// 256-sequence GPU engine ran at most 200, and status checks queued behind them.)
    pub h2_max_streams: u32,
}

/// The limits every Tandem listener uses (the router also refuses a request body that stalls).
pub const CONN_LIMITS: ConnLimits = ConnLimits {
    header_read: Duration::from_secs(10),
    h2_keep_alive: Duration::from_secs(20),
    h2_max_streams: 8192,
};

/// Serves `app` on `listener` (HTTP/1.1 and HTTP/2, upgrades included) with `limits` until
/// `shutdown` resolves; then stops accepting and waits for the open connections to finish
/// their requests (callers bound that wait).
pub async fn serve_http<L>(
    mut listener: L,
    app: axum::Router,
    limits: ConnLimits,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Io = tokio::net::TcpStream>,
{
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.h2_keep_alive)
        .keep_alive_timeout(limits.h2_keep_alive)
        .max_concurrent_streams(limits.h2_max_streams)
        .enable_connect_protocol();
    tokio::pin!(shutdown);
    loop {
        let (io, _) = tokio::select! {
            conn = listener.accept() => conn,
            _ = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful
            .watch(builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// `listener` with Nagle's algorithm off on every connection: streamed tokens are small writes,
/// and Nagle holding one back until the peer's (delayed) acknowledgement of the last would
/// deliver them in bursts tens of milliseconds apart.
pub fn nodelay(
    listener: TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
    })
}

#[cfg(test)]
mod nodelay_tests {
    use axum::serve::Listener;

    #[tokio::test]
    async fn accepted_connections_do_not_wait_for_acknowledgements() {
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = plain.local_addr().unwrap();
        let mut l = super::nodelay(plain);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (io, _) = l.accept().await;
        assert!(io.nodelay().unwrap(), "Nagle's algorithm is still on for an accepted connection");
    }
}

#[cfg(test)]
mod stream_limit_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;

    /// One HTTP/2 connection (as a router holds to each worker) carries more than hyper's
    /// default 200 concurrent streams: every one of 300 held requests reaches the handler
    /// before any is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_connection_holds_more_than_two_hundred_streams() {
        const STREAMS: usize = 300;
        let arrived = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let (a, r) = (arrived.clone(), released.clone());
        let app = axum::Router::new().route(
            "/hold",
            get(move || {
                let (a, mut r) = (a.clone(), r.clone());
                async move {
                    a.fetch_add(1, Ordering::SeqCst);
                    let _ = r.wait_for(|&go| go).await;
                    "done"
                }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(listener, app, CONN_LIMITS, async move {
            let _ = stopped.await;
        }));

        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        let mut requests = Vec::new();
        for _ in 0..STREAMS {
            let mut c = client.clone();
            requests.push(tokio::spawn(async move {
                c = c.ready().await.unwrap();
                let req = axum::http::Request::get(format!("http://{addr}/hold")).body(()).unwrap();
                let (resp, _) = c.send_request(req, true).unwrap();
                resp.await.unwrap().status()
            }));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while arrived.load(Ordering::SeqCst) < STREAMS {
            assert!(
                Instant::now() < deadline,
                "only {} of {STREAMS} streams reached the server on one connection",
                arrived.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        release.send(true).unwrap();
        for r in requests {
            assert_eq!(r.await.unwrap(), 200);
        }
        let _ = stop.send(());
        let _ = server.await;
    }
}
