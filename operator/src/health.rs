//! The operator's own probes: `GET /healthz` answers 200 while the process serves, `GET /readyz`
//! 200 once the controller has reached the InferenceService API and runs (503 before), so the
//! chart's liveness and readiness probes see a hung or not-yet-connected operator.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

/// Whether the controller is ready, shared by the controller and the probe server.
#[derive(Debug, Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    /// Marks the controller ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether the controller is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The probe routes.
pub fn routes(ready: Arc<Readiness>) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(r): State<Arc<Readiness>>| async move {
                if r.get() {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "the controller has not started")
                }
            }),
        )
        .with_state(ready)
}

/// Serves the probes on `addr` until the process ends.
pub async fn serve(addr: SocketAddr, ready: Arc<Readiness>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("probe listener on {addr}: {e}"))?;
    axum::serve(listener, routes(ready)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn status(addr: SocketAddr, path: &str) -> u16 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn probes_follow_the_controller() {
        let ready = Arc::new(Readiness::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = routes(ready.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        assert_eq!(status(addr, "/healthz").await, 200);
        assert_eq!(status(addr, "/readyz").await, 503);
        ready.set(true);
        assert_eq!(status(addr, "/readyz").await, 200);
        assert_eq!(status(addr, "/nothing").await, 404);
    }
}
