//! The benchmark's HTTP client, on hyper: HTTP/1.1 or HTTPS (rustls; the system's roots or a
//! given CA), pooled keep-alive connections, an API key, a JSON body out and server-sent
//! events (or a plain body) back, each event timed as its frame arrives.

use std::path::Path;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// An OpenAI-style server at a base URL.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<Https, Full<Bytes>>,
    /// `scheme://authority` of the base URL.
    origin: String,
    /// Its path prefix (e.g. `/v1`), no trailing slash.
    prefix: String,
    api_key: Option<String>,
}

impl HttpClient {
    /// A client for `base_url` (`http://` or `https://`), trusting the system's roots or, with
    /// `ca_cert`, the CA certificates of that PEM file; `api_key` goes out as a bearer token.
    pub fn new(
        base_url: &str,
        ca_cert: Option<&Path>,
        api_key: Option<String>,
    ) -> Result<HttpClient, String> {
        let uri: hyper::Uri =
            base_url.parse().map_err(|e| format!("base URL '{base_url}': {e}"))?;
        let scheme = uri.scheme_str().unwrap_or("");
        if !matches!(scheme, "http" | "https") {
            return Err(format!("base URL '{base_url}' must start with http:// or https://"));
        }
        let authority =
            uri.authority().ok_or_else(|| format!("base URL '{base_url}' has no host"))?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = match ca_cert {
            Some(path) => {
                use rustls::pki_types::{pem::PemObject, CertificateDer};
                let mut roots = rustls::RootCertStore::empty();
                let certs = CertificateDer::pem_file_iter(path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                for c in certs {
                    let c = c.map_err(|e| format!("reading {}: {e}", path.display()))?;
                    roots.add(c).map_err(|e| format!("{}: {e}", path.display()))?;
                }
                rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth()
            }
            None => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
                rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth()
            }
        };
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(HttpClient {
            client,
            origin: format!("{scheme}://{authority}"),
            prefix: uri.path().trim_end_matches('/').to_string(),
            api_key,
        })
    }

    fn request(
        &self,
        method: hyper::Method,
        path: &str,
        body: Bytes,
    ) -> hyper::Request<Full<Bytes>> {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{}{path}", self.origin, self.prefix))
            .header("content-type", "application/json")
            .header("accept", "text/event-stream, application/json");
        if let Some(k) = &self.api_key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        b.body(Full::new(body)).expect("a valid request")
    }

    /// GETs `path` (under the base URL's prefix) as JSON.
    pub async fn get_json(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value, String> {
        let fut = async {
            let res = self
                .client
                .request(self.request(hyper::Method::GET, path, Bytes::new()))
                .await
                .map_err(|e| format!("GET {path}: {e}"))?;
            let status = res.status();
            let body = res.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
            if !status.is_success() {
                return Err(format!("GET {path}: {status}: {}", String::from_utf8_lossy(&body)));
            }
            serde_json::from_slice(&body).map_err(|e| format!("GET {path}: {e}"))
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| format!("GET {path}: timeout"))?
    }

    /// POSTs `body` to `path` (under the base URL's prefix) and calls `on_data` with every SSE
    /// payload as it arrives (or once with the whole body when the response is not an event
    /// stream). Fails with an error kind: `connect`, `timeout`, `http_<status>`, `io`.
    pub async fn post_events(
        &self,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
        on_data: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), ErrorKind> {
        let fut = async {
            let req = self.request(hyper::Method::POST, path, Bytes::from(body));
            let res = self.client.request(req).await.map_err(|e| {
                if e.is_connect() {
                    "connect".to_string()
                } else {
                    "io".to_string()
                }
            })?;
            let status = res.status().as_u16();
            let sse = res
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut body = res.into_body();
            let mut parser = SseParser::default();
            let mut whole = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|_| "io".to_string())?;
                let Some(data) = frame.data_ref() else { continue };
                if sse && status == 200 {
                    parser.feed_with(data, on_data);
                } else {
                    whole.extend_from_slice(data);
                }
            }
            if status != 200 {
                return Err(format!("http_{status}"));
            }
            if !sse {
                on_data(&String::from_utf8_lossy(&whole));
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err("timeout".to_string()),
        }
    }
}

/// Splits a byte stream into SSE `data:` payloads.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feeds decoded body bytes; calls `on_data` with each complete `data:` line's payload.
    pub fn feed_with(&mut self, data: &[u8], on_data: &mut dyn FnMut(&str)) {
        self.buf.extend_from_slice(data);
        let mut at = 0;
        while let Some(nl) = self.buf[at..].iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&self.buf[at..at + nl]);
            let line = line.trim_end_matches(['\r', '\n']);
            if let Some(d) = line.strip_prefix("data:") {
                on_data(d.trim_start());
            }
            at += nl + 1;
        }
        self.buf.drain(..at);
    }

    /// [`SseParser::feed_with`], collecting the payloads.
    #[cfg(test)]
    pub fn feed(&mut self, data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        self.feed_with(data, &mut |d| out.push(d.to_string()));
        out
    }
}

/// Why a request failed, as counted in the report.
pub type ErrorKind = String;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let c = HttpClient::new("http://127.0.0.1:8000/v1/", None, None).unwrap();
        assert_eq!((c.origin.as_str(), c.prefix.as_str()), ("http://127.0.0.1:8000", "/v1"));
        let c = HttpClient::new("https://api.example.com/v1", None, Some("k".into())).unwrap();
        assert_eq!((c.origin.as_str(), c.prefix.as_str()), ("https://api.example.com", "/v1"));
        let req = c.request(hyper::Method::GET, "/models", Bytes::new());
        assert_eq!(req.uri(), "https://api.example.com/v1/models");
        assert_eq!(req.headers()["authorization"], "Bearer k");
        assert!(HttpClient::new("ftp://h/v1", None, None).is_err());
        assert!(HttpClient::new("https://h/v1", Some(Path::new("/nonexistent.pem")), None).is_err());
    }

    #[test]
    fn sse_payloads() {
        let mut p = SseParser::default();
        assert!(p.feed(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.feed(b":1}\n\n: keep-alive\r\ndata:[DONE]\r\n"),
            vec!["{\"a\":1}".to_string(), "[DONE]".to_string()]
        );
    }
}
