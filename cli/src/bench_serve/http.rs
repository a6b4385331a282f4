//! A small HTTP/1.1 client for the benchmark: one connection per request, a JSON body out,
//! server-sent events (or a plain body) back, decoded incrementally so each event is timed
//! when it arrives.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `http://host:port/prefix` split into the address and the path prefix.
pub fn split_base_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("base URL '{url}' must start with http://"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() {
        return Err(format!("base URL '{url}' has no host"));
    }
    let host = if host.contains(':') { host.to_string() } else { format!("{host}:80") };
    Ok((host, path.to_string()))
}

/// Incremental decoder of `Transfer-Encoding: chunked`.
#[derive(Debug, Default)]
pub struct Dechunker {
    buf: Vec<u8>,
    /// Bytes left in the current chunk, plus its CRLF.
    left: Option<usize>,
    done: bool,
}

impl Dechunker {
    /// Feeds raw bytes; returns the decoded ones available so far.
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            match self.left {
                None => {
                    let Some(nl) = self.buf.windows(2).position(|w| w == b"\r\n") else { break };
                    let line = String::from_utf8_lossy(&self.buf[..nl]).to_string();
                    self.buf.drain(..nl + 2);
                    let size =
                        usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                            .unwrap_or(0);
                    if size == 0 {
                        self.done = true;
                        break;
                    }
                    self.left = Some(size + 2);
                }
                Some(n) => {
                    if self.buf.is_empty() {
                        break;
                    }
                    let take = n.min(self.buf.len());
                    let data_end = take.min(n.saturating_sub(2));
                    out.extend_from_slice(&self.buf[..data_end]);
                    self.buf.drain(..take);
                    self.left = if n - take == 0 { None } else { Some(n - take) };
                }
            }
        }
        out
    }

    /// Whether the terminating chunk was seen.
    pub fn done(&self) -> bool {
        self.done
    }
}

/// Splits a byte stream into SSE `data:` payloads.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// Feeds decoded body bytes; returns the complete `data:` lines' payloads.
    pub fn feed(&mut self, data: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\r', '\n']);
            if let Some(d) = line.strip_prefix("data:") {
                out.push(d.trim_start().to_string());
            }
        }
        out
    }
}

/// Why a request failed, as counted in the report.
pub type ErrorKind = String;

/// POSTs `body` to `path` on `addr` and calls `on_data` with every SSE payload as it arrives
/// (or once with the whole body when the response is not an event stream). Fails with an
/// error kind: `connect`, `timeout`, `http_<status>`, `io`.
pub async fn post_events(
    addr: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
    on_data: &mut (dyn FnMut(&str) + Send),
) -> Result<(), ErrorKind> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await.map_err(|_| "connect".to_string())?;
        let _ = s.set_nodelay(true);
        let head = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).await.map_err(|_| "io".to_string())?;
        s.write_all(body).await.map_err(|_| "io".to_string())?;
        let mut raw = Vec::new();
        let mut buf = vec![0u8; 16384];
        // Response head.
        let split = loop {
            let n = s.read(&mut buf).await.map_err(|_| "io".to_string())?;
            if n == 0 {
                return Err("io".to_string());
            }
            raw.extend_from_slice(&buf[..n]);
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
        };
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let chunked = head.contains("transfer-encoding: chunked");
        let sse = head.contains("text/event-stream");
        let mut dechunk = Dechunker::default();
        let mut sse_parser = SseParser::default();
        let mut body_acc = Vec::new();
        let mut pending = raw[split + 4..].to_vec();
        loop {
            let decoded =
                if chunked { dechunk.feed(&pending) } else { std::mem::take(&mut pending) };
            pending.clear();
            if sse && status == 200 {
                for d in sse_parser.feed(&decoded) {
                    on_data(&d);
                }
            } else {
                body_acc.extend_from_slice(&decoded);
            }
            if chunked && dechunk.done() {
                break;
            }
            let n = s.read(&mut buf).await.map_err(|_| "io".to_string())?;
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&buf[..n]);
        }
        if status != 200 {
            return Err(format!("http_{status}"));
        }
        if !sse {
            on_data(&String::from_utf8_lossy(&body_acc));
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err("timeout".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(
            split_base_url("http://127.0.0.1:8000/v1").unwrap(),
            ("127.0.0.1:8000".into(), "/v1".into())
        );
        assert_eq!(
            split_base_url("http://localhost/v1/").unwrap(),
            ("localhost:80".into(), "/v1".into())
        );
        assert_eq!(split_base_url("http://h:1").unwrap(), ("h:1".into(), "".into()));
        assert!(split_base_url("https://h/v1").is_err());
    }

    #[test]
    fn chunked_bodies_decode_across_arbitrary_splits() {
        let wire = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        for cut in 1..wire.len() {
            let mut d = Dechunker::default();
            let mut out = d.feed(&wire[..cut]);
            out.extend(d.feed(&wire[cut..]));
            assert_eq!(out, b"hello, world", "split at {cut}");
            assert!(d.done());
        }
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
