//! A small Redis client (RESP2 over TCP): the commands Tandem needs for KV events (streams)
//! and shared router load (keys with expiry), with a timeout on every exchange.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A Redis reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Status(String),
    /// `-ERR ...`.
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$n`, or nil.
    Bulk(Option<Vec<u8>>),
    /// `*n`, or nil.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The bytes of a bulk or status reply.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            Reply::Status(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// The text of a bulk or status reply.
    pub fn text(&self) -> Option<String> {
        self.bytes().map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The items of an array reply (empty for nil).
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(v)) => v,
            _ => &[],
        }
    }
}

/// Why a Redis exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    /// Socket error or closed connection.
    #[error("redis I/O: {0}")]
    Io(#[from] std::io::Error),
    /// No answer within the timeout.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// The server answered with an error.
    #[error("redis error: {0}")]
    Server(String),
    /// The reply could not be parsed.
    #[error("malformed redis reply: {0}")]
    Protocol(String),
    /// The URL is not `redis://host:port`.
    #[error("bad redis URL '{0}' (expected redis://host:port)")]
    Url(String),
}

/// Turns `redis://host:port[/db]` (or `host:port`) into `host:port`.
pub fn parse_url(url: &str) -> Result<String, RedisError> {
    let rest = url.strip_prefix("redis://").unwrap_or(url);
    let hostport = rest.split('/').next().unwrap_or_default();
    let hostport = hostport.rsplit('@').next().unwrap_or_default();
    if hostport.is_empty() {
        return Err(RedisError::Url(url.to_string()));
    }
    Ok(if hostport.contains(':') { hostport.to_string() } else { format!("{hostport}:6379") })
}

/// One connection to a Redis server.
pub struct RedisConn {
    stream: BufReader<TcpStream>,
    timeout: Duration,
}

impl RedisConn {
    /// Connects to `url` (`redis://host:port`), failing after `timeout`.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisConn, RedisError> {
        let addr = parse_url(url)?;
        let s = tokio::time::timeout(timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| RedisError::Timeout(timeout))??;
        s.set_nodelay(true)?;
        Ok(RedisConn { stream: BufReader::new(s), timeout })
    }

    /// Sends a command and reads its reply; a server error becomes [`RedisError::Server`].
    pub async fn cmd(&mut self, args: &[&[u8]]) -> Result<Reply, RedisError> {
        self.cmd_timeout(args, self.timeout).await
    }

    /// Like [`RedisConn::cmd`] with its own timeout (for blocking reads).
    pub async fn cmd_timeout(
        &mut self,
        args: &[&[u8]],
        timeout: Duration,
    ) -> Result<Reply, RedisError> {
        let mut replies = self.pipeline_timeout(&[args], timeout).await?;
        Ok(replies.pop().expect("one reply per command"))
    }

    /// Sends several commands in one write and reads their replies (one round trip); the first
    /// server error fails the whole exchange.
    pub async fn pipeline(&mut self, cmds: &[&[&[u8]]]) -> Result<Vec<Reply>, RedisError> {
        self.pipeline_timeout(cmds, self.timeout).await
    }

    async fn pipeline_timeout(
        &mut self,
        cmds: &[&[&[u8]]],
        timeout: Duration,
    ) -> Result<Vec<Reply>, RedisError> {
        let mut buf = Vec::new();
        for args in cmds {
            buf.extend(format!("*{}\r\n", args.len()).as_bytes());
            for a in *args {
                buf.extend(format!("${}\r\n", a.len()).as_bytes());
                buf.extend_from_slice(a);
                buf.extend_from_slice(b"\r\n");
            }
        }
        let fut = async {
            self.stream.get_mut().write_all(&buf).await?;
            let mut out = Vec::with_capacity(cmds.len());
            for _ in cmds {
                out.push(read_reply(&mut self.stream).await?);
            }
            Ok::<_, RedisError>(out)
        };
        let replies = tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| RedisError::Timeout(timeout))??;
        match replies
            .iter()
            .find_map(|r| if let Reply::Error(e) = r { Some(e.clone()) } else { None })
        {
            Some(e) => Err(RedisError::Server(e)),
            None => Ok(replies),
        }
    }
}

async fn read_line(r: &mut BufReader<TcpStream>) -> Result<String, RedisError> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Err(RedisError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "redis closed the connection",
        )));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_reply(
    r: &mut BufReader<TcpStream>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Reply, RedisError>> + Send + '_>> {
    Box::pin(async move {
        let line = read_line(r).await?;
        let (kind, rest) = line.split_at(line.len().min(1));
        let num = || rest.parse::<i64>().map_err(|_| RedisError::Protocol(line.clone()));
        Ok(match kind {
            "+" => Reply::Status(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(num()?),
            "$" => {
                let n = num()?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut b = vec![0u8; n as usize + 2];
                    r.read_exact(&mut b).await?;
                    b.truncate(n as usize);
                    Reply::Bulk(Some(b))
                }
            }
            "*" => {
                let n = num()?;
                if n < 0 {
                    Reply::Array(None)
                } else {
                    let mut v = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        v.push(read_reply(r).await?);
                    }
                    Reply::Array(Some(v))
                }
            }
            _ => return Err(RedisError::Protocol(line.clone())),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(parse_url("redis://127.0.0.1:6390").unwrap(), "127.0.0.1:6390");
        assert_eq!(parse_url("redis://localhost/0").unwrap(), "localhost:6379");
        assert_eq!(parse_url("redis://user:pw@h:1/2").unwrap(), "h:1");
        assert!(parse_url("redis://").is_err());
    }
}
