//! Authentication of the internal gRPC calls (router → workers, decode → prefill).
//!
//! Every process of one deployment gets the same shared secret in `TANDEM_INTERNAL_TOKEN`
//! (a Kubernetes Secret). Clients send it as `authorization: Bearer …` on every call; servers
//! refuse a call without it with `UNAUTHENTICATED`. Without the variable, calls are not
//! authenticated (a single machine's loopback, as `tandem up` runs).

use std::sync::OnceLock;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The environment variable holding the shared secret.
pub const TOKEN_ENV: &str = "TANDEM_INTERNAL_TOKEN";

/// This process's shared secret, read once from [`TOKEN_ENV`].
pub fn token() -> Option<&'static str> {
    static TOKEN: OnceLock<Option<String>> = OnceLock::new();
    TOKEN
        .get_or_init(|| {
            std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
        })
        .as_deref()
}

/// The digest KV senders present to KV receivers (none without a secret).
pub fn kv_auth() -> Option<[u8; 32]> {
    token().map(tandem_kv_transfer::tcp::auth_digest)
}

/// A client-side interceptor adding the secret to a call.
pub type Attach = fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>;

/// A channel whose calls carry the secret.
pub type AuthChannel = InterceptedService<Channel, Attach>;

fn attach(mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    if let Some(t) = token() {
        let v = format!("Bearer {t}").parse().map_err(|_| {
            tonic::Status::internal("the internal token is not a valid header value")
        })?;
        req.metadata_mut().insert("authorization", v);
    }
    Ok(req)
}

/// Wraps `channel` so that every call carries the secret.
pub fn authed(channel: Channel) -> AuthChannel {
    InterceptedService::new(channel, attach as Attach)
}

/// Compares without an early exit, so the time taken says nothing about the secret.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Server middleware for the gRPC routes: a call without the secret is refused.
pub async fn require_token(req: Request, next: Next) -> Response {
    if let Some(t) = token() {
        let given = req.headers().get("authorization").map(|h| h.as_bytes()).unwrap_or_default();
        if !same(given, format!("Bearer {t}").as_bytes()) {
            let path = req.uri().path().to_string();
            tracing::warn!(%path, "refused an internal call without the shared secret");
            return tonic::Status::unauthenticated("missing or wrong internal token")
                .into_http::<axum::body::Body>();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn comparison() {
        assert!(super::same(b"Bearer abc", b"Bearer abc"));
        assert!(!super::same(b"Bearer abd", b"Bearer abc"));
        assert!(!super::same(b"Bearer ab", b"Bearer abc"));
    }
}
