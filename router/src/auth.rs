//! API keys at the gateway: who may call `/v1/*`, how many requests each key may have running
//! and how fast it may send them, and the tenant whose prefix cache its prompts share.
//!
//! Keys come from a file (`--api-keys-file`, one per line) or the environment
//! (`TANDEM_API_KEYS`, comma-separated); an entry is `KEY` or `KEY:TENANT`. Keys of one tenant
//! share cached prefixes; different tenants never do (the tenant salts the block hashes), so no
//! tenant can tell from timing whether another sent a prompt. Keys are kept only as SHA-256
//! digests and never logged. Without keys the gateway is open, as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// Per-key limits (none: unlimited).
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyLimits {
    /// Most requests of one key in flight at once (a stream counts until it ends).
    pub max_concurrent: Option<usize>,
    /// Sustained requests per second per key (bursts up to the same number, at least 1).
    pub requests_per_second: Option<f64>,
}

/// The tenant a request was authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub Arc<str>);

impl Tenant {
    /// The prefix-cache salt for a request of this tenant with the client's own `salt`.
    pub fn cache_salt(&self, salt: &str) -> String {
        format!("tenant:{}\u{1f}{salt}", self.0)
    }
}

struct KeyState {
    tenant: Tenant,
    in_flight: Arc<AtomicUsize>,
    /// Token bucket: tokens and when it was last filled.
    bucket: Mutex<(f64, Instant)>,
}

/// The gateway's keys and limits.
pub struct ApiKeys {
    keys: HashMap<[u8; 32], KeyState>,
    limits: KeyLimits,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys themselves.
        f.debug_struct("ApiKeys")
            .field("keys", &self.keys.len())
            .field("limits", &self.limits)
            .finish()
    }
}

/// A malformed key list.
#[derive(Debug, thiserror::Error)]
#[error("API key list: {0}")]
pub struct KeysError(String);

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    /// Parses entries (`KEY` or `KEY:TENANT`; blank lines and `#` comments skipped). A key
    /// without a tenant is its own tenant (named after its digest, never the key).
    pub fn parse<'a>(
        entries: impl IntoIterator<Item = &'a str>,
        limits: KeyLimits,
    ) -> Result<ApiKeys, KeysError> {
        let mut keys = HashMap::new();
        for (i, raw) in entries.into_iter().enumerate() {
            let e = raw.trim();
            if e.is_empty() || e.starts_with('#') {
                continue;
            }
            let (key, tenant) = match e.split_once(':') {
                Some((k, t)) => (k.trim(), t.trim().to_string()),
                None => (e, String::new()),
            };
            if key.len() < 8 || key.chars().any(char::is_whitespace) {
                return Err(KeysError(format!(
                    "entry {} is not a key (at least 8 characters, no spaces)",
                    i + 1
                )));
            }
            let d = digest(key);
            let tenant = if tenant.is_empty() {
                d.iter().take(6).map(|b| format!("{b:02x}")).collect()
            } else {
                tenant
            };
            let burst = limits.requests_per_second.map(|r| r.max(1.0)).unwrap_or(0.0);
            if keys
                .insert(
                    d,
                    KeyState {
                        tenant: Tenant(tenant.into()),
                        in_flight: Arc::default(),
                        bucket: Mutex::new((burst, Instant::now())),
                    },
                )
                .is_some()
            {
                return Err(KeysError(format!("entry {} repeats a key", i + 1)));
            }
        }
        if keys.is_empty() {
            return Err(KeysError("no keys".into()));
        }
        Ok(ApiKeys { keys, limits })
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Takes one request token from the key's bucket; the wait until the next one on refusal.
    fn take_token(&self, k: &KeyState) -> Result<(), f64> {
        let Some(rate) = self.limits.requests_per_second else { return Ok(()) };
        let burst = rate.max(1.0);
        let mut b = k.bucket.lock().expect("bucket lock");
        let now = Instant::now();
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * rate).min(burst);
        b.1 = now;
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            Ok(())
        } else {
            Err((1.0 - b.0) / rate)
        }
    }
}

fn unauthorized(message: &str) -> Response {
    ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("invalid_api_key"),
    }
    .into_response()
}

fn too_many(message: String, code: &'static str, retry_after: f64) -> Response {
    let mut r = ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        message,
        kind: "requests",
        param: None,
        code: Some(code),
    }
    .into_response();
    let secs = retry_after.ceil().max(1.0) as u64;
    r.headers_mut().insert("retry-after", HeaderValue::from(secs));
    r
}

/// Decrements a key's in-flight count when the response body is done (or dropped).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Middleware for the `/v1` routes: checks `Authorization: Bearer KEY`, applies the key's
/// limits and hands the handler its [`Tenant`].
pub async fn authenticate(
    State(keys): State<Arc<ApiKeys>>,
    mut req: Request,
    next: Next,
) -> Response {
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let Some(key) = header.strip_prefix("Bearer ").map(str::trim).filter(|k| !k.is_empty()) else {
        return unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
        );
    };
    let Some(state) = keys.keys.get(&digest(key)) else {
        return unauthorized("Incorrect API key provided.");
    };
    if let Err(wait) = keys.take_token(state) {
        let rate = keys.limits.requests_per_second.unwrap_or_default();
        return too_many(format!("Rate limit reached: {rate} requests per second for this key. Retry after {wait:.2} s."), "rate_limit_exceeded", wait);
    }
    let running = state.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
    let guard = InFlight(state.in_flight.clone());
    if let Some(max) = keys.limits.max_concurrent {
        if running > max {
            return too_many(
                format!("Too many concurrent requests for this key (limit {max})."),
                "concurrency_limit_exceeded",
                1.0,
            );
        }
    }
    req.extensions_mut().insert(state.tenant.clone());
    let res = next.run(req).await;
    // The slot is held until the body (a whole SSE stream) has been sent or dropped.
    let (parts, body) = res.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _held = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_tenants_and_errors() {
        let k = ApiKeys::parse(
            [
                "# team keys",
                "",
                "sk-alpha-0001:research",
                "sk-alpha-0002:research",
                "sk-beta-00001",
            ],
            KeyLimits::default(),
        )
        .unwrap();
        assert_eq!(k.len(), 3);
        let t = |key: &str| k.keys[&digest(key)].tenant.clone();
        assert_eq!(t("sk-alpha-0001"), t("sk-alpha-0002"));
        assert_ne!(t("sk-alpha-0001"), t("sk-beta-00001"));
        assert!(!t("sk-beta-00001").0.contains("beta"), "a tenant name never carries the key");
        assert_ne!(Tenant("a".into()).cache_salt(""), Tenant("b".into()).cache_salt(""));
        assert!(ApiKeys::parse(["short"], KeyLimits::default()).is_err());
        assert!(ApiKeys::parse(["sk-same-key-1", "sk-same-key-1"], KeyLimits::default()).is_err());
        assert!(ApiKeys::parse(["# none"], KeyLimits::default()).is_err());
    }

    #[test]
    fn token_bucket_allows_bursts_then_the_rate() {
        let k = ApiKeys::parse(
            ["sk-bucket-0001"],
            KeyLimits { max_concurrent: None, requests_per_second: Some(2.0) },
        )
        .unwrap();
        let s = &k.keys[&digest("sk-bucket-0001")];
        assert!(k.take_token(s).is_ok() && k.take_token(s).is_ok());
        let wait = k.take_token(s).unwrap_err();
        assert!(wait > 0.0 && wait <= 0.5, "{wait}");
        // Half a second later one more token has come.
        s.bucket.lock().unwrap().1 -= std::time::Duration::from_millis(500);
        assert!(k.take_token(s).is_ok());
        assert!(k.take_token(s).is_err());
    }
}
