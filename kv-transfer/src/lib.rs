//! KV page transfer between a prefill worker and a decode worker.
//!
//! - [`layout`]: what both sides must agree on (model, dtype, block size, layers, KV heads,
//!   head_dim, hash seed); a mismatch is refused at the handshake with the field named.
//! - [`page`]: the wire format of one KV page (one block: all layers' K and V) with its block
//!   hash and a CRC32 checksum.
//! - [`tcp`]: a TCP transport with I/O timeouts, so a stalled peer is detected in bounded time;
//!   received pages go straight into the receiver's blocks through a [`tcp::PageSink`].
//!
//! - [`device`]: the device transport between GPUs (NCCL): the contract a GPU backend
//!   implements (`tandem_cuda::nccl`), the transfer header and the page checksums.

pub mod device;
pub mod layout;
pub mod page;
pub mod tcp;

pub use layout::{KvDtype, KvLayout};
pub use page::KvPage;

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The peers disagree on the KV layout.
    #[error("KV layout mismatch on {field}: local {local}, remote {remote}")]
    LayoutMismatch {
        /// The field that differs.
        field: &'static str,
        /// This side's value.
        local: String,
        /// The peer's value.
        remote: String,
    },
    /// The peer refused the handshake.
    #[error("peer refused the transfer: {0}")]
    Refused(String),
    /// A page's checksum does not match its contents.
    #[error("KV page {index} of transfer {transfer_id} is corrupt: checksum {actual:#010x}, expected {expected:#010x}")]
    Checksum {
        /// Transfer the page belongs to.
        transfer_id: u64,
        /// Logical block index.
        index: u32,
        /// Checksum carried by the page.
        expected: u32,
        /// Checksum of what arrived.
        actual: u32,
    },
    /// A frame is malformed.
    #[error("malformed KV frame: {0}")]
    Protocol(String),
    /// The peer did not answer or send within the timeout.
    #[error("KV transfer stalled: no progress for {0:?}")]
    Timeout(std::time::Duration),
    /// The receiver has no block for a page.
    #[error("receiver has no block for page {index} of transfer {transfer_id}")]
    NoTarget {
        /// Transfer id.
        transfer_id: u64,
        /// Logical block index.
        index: u32,
    },
    /// Socket error.
    #[error("KV transfer I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl TransferError {
    /// Maps a socket error, turning timeouts into [`TransferError::Timeout`].
    pub fn from_io(e: std::io::Error, timeout: std::time::Duration) -> TransferError {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                TransferError::Timeout(timeout)
            }
            _ => TransferError::Io(e),
        }
    }
}
