//! Redis for KV events and shared routing state, on the `redis` crate: `redis://` and
//! `rediss://` (TLS) URLs with `user:password@` (Redis ACL users or `requirepass`) and a
//! database number. TLS trusts the system's roots, or a CA file given with the URL, and
//! presents a client certificate when one is given (servers with `tls-auth-clients yes`).
//!
//! Writers (KV event publishers, the routers' load exchange) hold a [`RedisManager`]: a
//! connection made on first use and remade in the background after an I/O error. The router's
//! event reader keeps a plain connection of its own ([`RedisConfig::connect`]), since it must
//! know when it lost one (it then resynchronises). While Redis is away every caller degrades
//! as its module says (events counted as dropped, routing on the approximate index), never
//! failing a request.

use std::path::PathBuf;
use std::time::Duration;

pub use redis::aio::ConnectionManager as RedisManager;
pub use redis::aio::MultiplexedConnection as RedisConn;

/// Where Redis is and how to reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[[user]:password@]host[:port][/db]`, or `rediss://…` for TLS.
    pub url: String,
    /// PEM file of the CA certificate(s) to trust for `rediss://` instead of the system's.
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate and key, for servers that ask clients for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// Why Redis could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// The server or the connection failed (refused, reset, wrong password, a command error).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The URL cannot be used.
    #[error("bad redis URL '{url}': {why}")]
    Url {
        /// The URL, password hidden.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// A certificate or key file could not be read.
    #[error("reading {path}: {err}")]
    File {
        /// The file.
        path: PathBuf,
        /// The error.
        err: std::io::Error,
    },
}

impl RedisConfig {
    /// A configuration with the system's TLS roots and no client certificate.
    pub fn new(url: impl Into<String>) -> RedisConfig {
        RedisConfig { url: url.into(), ..RedisConfig::default() }
    }

    /// The URL with its password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        let Some((scheme, rest)) = self.url.split_once("://") else { return self.url.clone() };
        match rest.rsplit_once('@') {
            Some((auth, host)) => {
                let user = auth.split_once(':').map_or("", |(u, _)| u);
                format!("{scheme}://{user}:***@{host}")
            }
            None => self.url.clone(),
        }
    }

    /// Checks the URL and reads the certificate files into a client (no connection yet): a
    /// configuration error here is reported at start-up, not taken for an outage later.
    pub fn client(&self) -> Result<redis::Client, RedisError> {
        let bad = |why: String| RedisError::Url { url: self.redacted(), why };
        let tls = self.url.starts_with("rediss://");
        if !tls && !self.url.starts_with("redis://") {
            return Err(bad("expected redis:// or rediss://".into()));
        }
        if !tls && (self.ca_cert.is_some() || self.client_cert.is_some()) {
            return Err(bad("certificates are given but the URL is not rediss://".into()));
        }
        let info: redis::ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info(self.url.as_str())
                .map_err(|e| bad(e.to_string()))?;
        if !tls {
            return Ok(redis::Client::open(info)?);
        }
        // The one TLS provider compiled in (ring); a second install attempt is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let read =
            |p: &PathBuf| std::fs::read(p).map_err(|err| RedisError::File { path: p.clone(), err });
        let certs = redis::TlsCertificates {
            client_tls: match &self.client_cert {
                Some((cert, key)) => Some(redis::ClientTlsConfig {
                    client_cert: read(cert)?,
                    client_key: read(key)?,
                }),
                None => None,
            },
            root_cert: self.ca_cert.as_ref().map(read).transpose()?,
        };
        Ok(redis::Client::build_with_tls(info, certs)?)
    }

    /// Opens a connection whose commands fail after `timeout` (connecting included).
    pub async fn connect(&self, timeout: Duration) -> Result<RedisConn, RedisError> {
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Ok(self.client()?.get_multiplexed_async_connection_with_config(&cfg).await?)
    }
    /// A connection manager: connects on first use, reconnects by itself after an I/O error
    /// (one attempt per failed command, so a command fails fast while Redis is away); every
    /// command and connection attempt times out after `timeout`.
    pub fn manager(&self, timeout: Duration) -> Result<RedisManager, RedisError> {
        let cfg = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        Ok(RedisManager::new_lazy_with_config(self.client()?, cfg)?)
    }
}

/// `url` with `password` put in (percent-encoded), keeping a user named in it; an error when
/// the URL already has a password.
pub fn with_password(url: &str, password: &str) -> Result<String, RedisError> {
    let bad =
        |why: &str| RedisError::Url { url: RedisConfig::new(url).redacted(), why: why.into() };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    let (user, host) = match rest.rsplit_once('@') {
        Some((auth, _)) if auth.contains(':') => {
            return Err(bad("it has a password, and a password is given besides"))
        }
        Some((user, host)) => (user, host),
        None => ("", rest),
    };
    let enc: String = password
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    Ok(format!("{scheme}://{user}:{enc}@{host}"))
}

/// A bulk string reply's bytes (`None` for anything else).
pub fn bytes(v: &redis::Value) -> Option<&[u8]> {
    match v {
        redis::Value::BulkString(b) => Some(b),
        redis::Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_passwords_hidden() {
        let c = RedisConfig::new("redis://app:s3cret@127.0.0.1:6390/2");
        assert_eq!(c.redacted(), "redis://app:***@127.0.0.1:6390/2");
        c.client().unwrap();
        assert_eq!(RedisConfig::new("rediss://:pw@h:1").redacted(), "rediss://:***@h:1");
        RedisConfig::new("rediss://h:1").client().unwrap();
        for bad in ["http://h:1", "h:1", "redis://h:notaport"] {
            let e = RedisConfig::new(bad).client().unwrap_err();
            assert!(matches!(e, RedisError::Url { .. }), "{bad}: {e}");
        }
        let with_ca = RedisConfig { ca_cert: Some("/nonexistent/ca.pem".into()), ..c.clone() };
        assert!(matches!(with_ca.client().unwrap_err(), RedisError::Url { .. }));
        let tls = RedisConfig { url: "rediss://:pw@h:1".into(), ..with_ca };
        let e = tls.client().unwrap_err();
        assert!(matches!(e, RedisError::File { .. }), "{e}");
        assert!(!e.to_string().contains("pw"));
    }

    #[test]
    fn passwords_given_apart_go_into_the_url() {
        let url = with_password("rediss://app@h:1/0", "p@ss:w/rd").unwrap();
        assert_eq!(url, "rediss://app:p%40ss%3Aw%2Frd@h:1/0");
        let info: redis::ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
        assert_eq!(info.redis_settings().password(), Some("p@ss:w/rd"));
        assert_eq!(info.redis_settings().username(), Some("app"));
        assert_eq!(with_password("redis://h:1", "x").unwrap(), "redis://:x@h:1");
        assert!(with_password("redis://:old@h:1", "x").is_err());
    }
}
