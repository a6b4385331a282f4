//! TCP transport of KV pages.
//!
//! One connection carries one transfer session: the sender's [`KvLayout`] (the receiver accepts
//! or refuses it, with the reason), then page frames, then an end frame with the page count; the
//! receiver answers with an acknowledgement once every page is written into its blocks. Every
//! read and write has a timeout, so a peer that dies or stalls is detected in bounded time.
//! A side that is alive but busy — the sender waiting for its engine to read the next pages,
//! the receiver waiting for its engine to write them — sends keep-alive frames meanwhile, so
//! busy is never mistaken for stalled.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::page::{KvPage, HEADER_BYTES, PAGE_MAGIC};
use crate::{KvLayout, TransferError};

const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"TKVH");
const END_MAGIC: u32 = u32::from_le_bytes(*b"TKVE");
const ACK_MAGIC: u32 = u32::from_le_bytes(*b"TKVA");
/// A frame that only says "still here, busy": either side may send it where the other waits.
const KEEPALIVE_MAGIC: u32 = u32::from_le_bytes(*b"TKVK");

/// Where received pages go: the receiver's allocated blocks.
pub trait PageSink {
    /// The block that page `index` of `transfer_id` must be written to, if any.
    fn target(&mut self, transfer_id: u64, index: u32, block_hash: u64) -> Option<u32>;
    /// Writes a verified page's payload into `block` (it may be queued until [`PageSink::flush`]).
    fn write(&mut self, block: u32, payload: Vec<u8>) -> Result<(), String>;
    /// Completes every queued write; called before the transfer is acknowledged.
    fn flush(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Waits up to `wait` for the queued writes: `Ok(true)` once complete, `Ok(false)` while
    /// still in progress (the receiver then tells the sender it is busy and asks again).
    fn flush_wait(&mut self, wait: Duration) -> Result<bool, String> {
        let _ = wait;
        self.flush().map(|()| true)
    }
}

/// What a receiver got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferSummary {
    /// The transfer id of the pages.
    pub transfer_id: u64,
    /// Pages written.
    pub pages: u32,
    /// Bytes of payload written.
    pub bytes: u64,
}

fn read_exact(s: &mut TcpStream, buf: &mut [u8], timeout: Duration) -> Result<(), TransferError> {
    s.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            TransferError::Protocol("peer closed the connection mid-transfer".into())
        }
        _ => TransferError::from_io(e, timeout),
    })
}

fn read_u32(s: &mut TcpStream, t: Duration) -> Result<u32, TransferError> {
    let mut b = [0u8; 4];
    read_exact(s, &mut b, t)?;
    Ok(u32::from_le_bytes(b))
}

fn read_msg(s: &mut TcpStream, t: Duration) -> Result<String, TransferError> {
    let n = read_u32(s, t)? as usize;
    if n > 1 << 16 {
        return Err(TransferError::Protocol("message too long".into()));
    }
    let mut b = vec![0u8; n];
    read_exact(s, &mut b, t)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

fn with_msg(out: &mut Vec<u8>, msg: &str) {
    out.extend((msg.len() as u32).to_le_bytes());
    out.extend(msg.as_bytes());
}

/// Sending side of one transfer session.
pub struct TcpSender {
    stream: TcpStream,
    timeout: Duration,
}

impl TcpSender {
    /// Connects and performs the handshake; a layout mismatch is refused with its reason.
    pub fn connect(
        addr: impl ToSocketAddrs,
        layout: &KvLayout,
        timeout: Duration,
    ) -> Result<TcpSender, TransferError> {
        TcpSender::connect_with_auth(addr, layout, timeout, None)
    }

    /// [`TcpSender::connect`], presenting `auth` (the digest of the deployment's shared secret,
    /// see [`auth_digest`]) to a receiver that requires it.
    pub fn connect_with_auth(
        addr: impl ToSocketAddrs,
        layout: &KvLayout,
        timeout: Duration,
        auth: Option<[u8; 32]>,
    ) -> Result<TcpSender, TransferError> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| TransferError::Protocol("no address to connect to".into()))?;
        let mut stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| TransferError::from_io(e, timeout))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let body = layout.encode();
        let mut hello = HELLO_MAGIC.to_le_bytes().to_vec();
        hello.extend((body.len() as u32).to_le_bytes());
        hello.extend(body);
        hello.push(auth.is_some() as u8);
        hello.extend(auth.unwrap_or([0; 32]));
        stream.write_all(&hello).map_err(|e| TransferError::from_io(e, timeout))?;
        let mut ok = [0u8; 1];
        read_exact(&mut stream, &mut ok, timeout)?;
        let msg = read_msg(&mut stream, timeout)?;
        if ok[0] != 1 {
            return Err(TransferError::Refused(msg));
        }
        Ok(TcpSender { stream, timeout })
    }

    /// Sends one page.
    pub fn send(&mut self, page: &KvPage) -> Result<(), TransferError> {
        let t = self.timeout;
        self.stream.write_all(&page.header()).map_err(|e| TransferError::from_io(e, t))?;
        self.stream.write_all(&page.payload).map_err(|e| TransferError::from_io(e, t))
    }

    /// Tells the receiver this sender is alive but busy (waiting for the next pages); call it
    /// at least once per timeout while pages are delayed.
    pub fn keepalive(&mut self) -> Result<(), TransferError> {
        let t = self.timeout;
        self.stream
            .write_all(&KEEPALIVE_MAGIC.to_le_bytes())
            .map_err(|e| TransferError::from_io(e, t))
    }

    /// Writes raw bytes on the session (fault-injection tests send corrupt frames with it).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), TransferError> {
        let t = self.timeout;
        self.stream.write_all(bytes).map_err(|e| TransferError::from_io(e, t))
    }

    /// Ends the session after `pages` pages and waits for the receiver's acknowledgement.
    pub fn finish(mut self, transfer_id: u64, pages: u32) -> Result<u32, TransferError> {
        let t = self.timeout;
        let mut end = END_MAGIC.to_le_bytes().to_vec();
        end.extend(transfer_id.to_le_bytes());
        end.extend(pages.to_le_bytes());
        self.stream.write_all(&end).map_err(|e| TransferError::from_io(e, t))?;
        let mut magic = read_u32(&mut self.stream, t)?;
        // The receiver is still writing the pages into its blocks.
        while magic == KEEPALIVE_MAGIC {
            magic = read_u32(&mut self.stream, t)?;
        }
        if magic != ACK_MAGIC {
            return Err(TransferError::Protocol(format!("bad ack magic {magic:#010x}")));
        }
        let mut ok = [0u8; 1];
        read_exact(&mut self.stream, &mut ok, t)?;
        let written = read_u32(&mut self.stream, t)?;
        let msg = read_msg(&mut self.stream, t)?;
        if ok[0] != 1 {
            return Err(TransferError::Refused(msg));
        }
        Ok(written)
    }
}

/// Receiving side: a listener that serves transfer sessions.
pub struct TcpReceiver {
    listener: TcpListener,
    layout: KvLayout,
    timeout: Duration,
    auth: Option<[u8; 32]>,
}

/// The digest a sender presents for the shared secret `token` (the secret itself never crosses
/// the wire).
pub fn auth_digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"tandem-kv-auth\0");
    h.update(token.as_bytes());
    h.finalize().into()
}

impl TcpReceiver {
    /// Listens on `addr` for senders with the same `layout`.
    pub fn bind(
        addr: impl ToSocketAddrs,
        layout: KvLayout,
        timeout: Duration,
    ) -> Result<TcpReceiver, TransferError> {
        Ok(TcpReceiver { listener: TcpListener::bind(addr)?, layout, timeout, auth: None })
    }

    /// Refuses senders that do not present `auth` (see [`auth_digest`]); `None` accepts all.
    pub fn require_auth(mut self, auth: Option<[u8; 32]>) -> TcpReceiver {
        self.auth = auth;
        self
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr, TransferError> {
        Ok(self.listener.local_addr()?)
    }

    /// Accepts one connection and receives its transfer into `sink`. Errors (mismatch, corrupt
    /// page, stall, missing target) are reported to the sender before the connection closes.
    pub fn serve_one(&self, sink: &mut dyn PageSink) -> Result<TransferSummary, TransferError> {
        let s = self.accept()?;
        self.serve_connection(s, sink)
    }

    /// Waits for the next sender's connection.
    pub fn accept(&self) -> Result<TcpStream, TransferError> {
        Ok(self.listener.accept()?.0)
    }

    /// Receives the transfer session of one accepted connection into `sink` (connections can
    /// be served on separate threads, one per sender).
    pub fn serve_connection(
        &self,
        mut s: TcpStream,
        sink: &mut dyn PageSink,
    ) -> Result<TransferSummary, TransferError> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        let t = self.timeout;
        // Handshake.
        if read_u32(&mut s, t)? != HELLO_MAGIC {
            return Err(TransferError::Protocol("bad handshake magic".into()));
        }
        let n = read_u32(&mut s, t)? as usize;
        if n > 1 << 16 {
            return Err(TransferError::Protocol("handshake too long".into()));
        }
        let mut body = vec![0u8; n];
        read_exact(&mut s, &mut body, t)?;
        let mut presented = [0u8; 33];
        read_exact(&mut s, &mut presented, t)?;
        let authentic = match &self.auth {
            None => true,
            Some(want) => {
                presented[0] == 1
                    && presented[1..].iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
            }
        };
        let verdict = if authentic {
            KvLayout::decode(&body).and_then(|remote| self.layout.check(&remote))
        } else {
            Err(TransferError::Refused(
                "unauthenticated KV sender: missing or wrong internal token".into(),
            ))
        };
        let mut reply = vec![verdict.is_ok() as u8];
        with_msg(&mut reply, &verdict.as_ref().err().map(|e| e.to_string()).unwrap_or_default());
        s.write_all(&reply).map_err(|e| TransferError::from_io(e, t))?;
        verdict?;
        let result = self.receive_pages(&mut s, sink);
        let mut ack = ACK_MAGIC.to_le_bytes().to_vec();
        match &result {
            Ok(sum) => {
                ack.push(1);
                ack.extend(sum.pages.to_le_bytes());
                with_msg(&mut ack, "");
            }
            Err(e) => {
                ack.push(0);
                ack.extend(0u32.to_le_bytes());
                with_msg(&mut ack, &e.to_string());
            }
        }
        // Best effort: the sender may be gone.
        let _ = s.write_all(&ack);
        result
    }

    fn receive_pages(
        &self,
        s: &mut TcpStream,
        sink: &mut dyn PageSink,
    ) -> Result<TransferSummary, TransferError> {
        let t = self.timeout;
        let max = self.layout.page_bytes();
        let mut sum = TransferSummary { transfer_id: 0, pages: 0, bytes: 0 };
        loop {
            let mut magic = [0u8; 4];
            read_exact(s, &mut magic, t)?;
            let magic_v = u32::from_le_bytes(magic);
            if magic_v == END_MAGIC {
                let mut rest = [0u8; 12];
                read_exact(s, &mut rest, t)?;
                let id = u64::from_le_bytes(rest[0..8].try_into().expect("8 bytes"));
                let count = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes"));
                if count != sum.pages || (count > 0 && id != sum.transfer_id) {
                    return Err(TransferError::Protocol(format!(
                        "sender announced {count} pages of transfer {id}, received {}",
                        sum.pages
                    )));
                }
                sum.transfer_id = id;
                // Tell the sender we are busy for as long as the writes take.
                while !sink.flush_wait(t / 4).map_err(TransferError::Protocol)? {
                    s.write_all(&KEEPALIVE_MAGIC.to_le_bytes())
                        .map_err(|e| TransferError::from_io(e, t))?;
                }
                return Ok(sum);
            }
            if magic_v == KEEPALIVE_MAGIC {
                continue;
            }
            if magic_v != PAGE_MAGIC {
                return Err(TransferError::Protocol(format!("unexpected frame {magic_v:#010x}")));
            }
            let mut h = [0u8; HEADER_BYTES];
            h[..4].copy_from_slice(&magic);
            read_exact(s, &mut h[4..], t)?;
            let (id, index, hash, len, crc) = KvPage::parse_header(&h, max)?;
            if len != max {
                return Err(TransferError::Protocol(format!(
                    "page of {len} bytes, layout pages are {max}"
                )));
            }
            let mut payload = vec![0u8; len];
            read_exact(s, &mut payload, t)?;
            let page = KvPage::verified(id, index, hash, payload, crc)?;
            let block = sink
                .target(id, index, hash)
                .ok_or(TransferError::NoTarget { transfer_id: id, index })?;
            sink.write(block, page.payload).map_err(TransferError::Protocol)?;
            sum.transfer_id = id;
            sum.pages += 1;
            sum.bytes += len as u64;
        }
    }
}
