//! The device transport: KV pages moved GPU to GPU (NCCL), never through host memory.
//!
//! A [`DeviceKv`] is one process's KV pool as a transport endpoint; it joins a [`DeviceLink`]
//! with one peer process from a 128-byte link id that the peers exchange over the control plane
//! (the decode worker makes it and hands it to the prefill worker in `KvTransfer.JoinLink`).
//! One link carries every transfer between the pair, one after another, each framed like a TCP
//! session:
//!
//! 1. a [`TransferHeader`] (transfer id, first logical page, page count, page size, with its own
//!    CRC32), so the receiver learns which request the pages belong to and where they go;
//! 2. the pages, in chunks of many pages per message (gathered from the sender's blocks, scattered
//!    into the receiver's);
//! 3. a trailer: the sender's [`page_checksum`] of every page, computed while gathering; the
//!    receiver computes its own while scattering and compares them page by page.
//!
//! A header that arrives for a transfer the receiver no longer waits for (its request was
//! cancelled) is still received, into nowhere, so the link stays in step. Any error other than a
//! checksum mismatch leaves a link unusable: its owner drops it (which aborts the communicator)
//! and connects anew for the next transfer.

use std::time::Duration;

use crate::TransferError;

/// Bytes of a [`TransferHeader`] on the wire.
pub const HEADER_BYTES: usize = 40;
const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"TKVN");
const HEADER_VERSION: u32 = 1;

/// What precedes a transfer's pages on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferHeader {
    /// The transfer (request) on the receiving side.
    pub transfer_id: u64,
    /// Logical index of the first page (pages are consecutive from it).
    pub first_index: u32,
    /// Pages that follow.
    pub pages: u32,
    /// Bytes of each page.
    pub page_bytes: u64,
}

impl TransferHeader {
    /// The header's bytes: magic, version, fields, CRC32 of what precedes it.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&HEADER_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.transfer_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.first_index.to_le_bytes());
        b[20..24].copy_from_slice(&self.pages.to_le_bytes());
        b[24..32].copy_from_slice(&self.page_bytes.to_le_bytes());
        let crc = crc32fast::hash(&b[..32]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and verifies a header.
    pub fn decode(b: &[u8]) -> Result<TransferHeader, TransferError> {
        let b: &[u8; HEADER_BYTES] = b
            .get(..HEADER_BYTES)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| TransferError::Protocol("short transfer header".into()))?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(0) != HEADER_MAGIC {
            return Err(TransferError::Protocol(format!(
                "bad transfer header magic {:#010x}",
                u32_at(0)
            )));
        }
        let (expected, actual) = (u32_at(32), crc32fast::hash(&b[..32]));
        if expected != actual {
            return Err(TransferError::Protocol(format!(
                "transfer header checksum {actual:#010x}, expected {expected:#010x}"
            )));
        }
        if u32_at(4) != HEADER_VERSION {
            return Err(TransferError::Protocol(format!(
                "transfer header version {} (this side speaks {HEADER_VERSION})",
                u32_at(4)
            )));
        }
        Ok(TransferHeader {
            transfer_id: u64_at(8),
            first_index: u32_at(16),
            pages: u32_at(20),
            page_bytes: u64_at(24),
        })
    }
}

/// One 32-bit word's share of a page checksum: a bijection of the word keyed by its position,
/// so changing any one word changes the sum, and so does moving words around.
pub fn page_word_hash(x: u32, pos: u32) -> u32 {
    let mut x = x
        .wrapping_mul(0x9E37_79B1)
        .wrapping_add(pos.wrapping_mul(0x85EB_CA77))
        .wrapping_add(0x1656_67B1);
    x ^= x >> 15;
    x = x.wrapping_mul(0x2C1B_3C6D);
    x ^ (x >> 12)
}

/// The checksum of one page as the device transport computes it on both GPUs (the copy kernels
/// add it up while they move the page): the wrapping sum of [`page_word_hash`] over the page's
/// little-endian 32-bit words. This is the reference the kernels are checked against.
pub fn page_checksum(page: &[u8]) -> u32 {
    page.chunks_exact(4).enumerate().fold(0u32, |acc, (i, w)| {
        acc.wrapping_add(page_word_hash(
            u32::from_le_bytes(w.try_into().expect("4 bytes")),
            i as u32,
        ))
    })
}

/// The first page whose checksums differ, as a [`TransferError::Checksum`].
pub fn compare_checksums(
    h: &TransferHeader,
    sent: &[u32],
    received: &[u32],
) -> Result<(), TransferError> {
    if sent.len() != received.len() {
        return Err(TransferError::Protocol(format!(
            "{} checksums for {} pages",
            sent.len(),
            received.len()
        )));
    }
    match sent.iter().zip(received).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(TransferError::Checksum {
            transfer_id: h.transfer_id,
            index: h.first_index + i as u32,
            expected: sent[i],
            actual: received[i],
        }),
    }
}

/// Which end of a link a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkRole {
    /// Sends pages (the prefill worker; NCCL rank 0).
    Sender,
    /// Receives pages (the decode worker; NCCL rank 1).
    Receiver,
}

/// What both ends of a device link must agree on besides the [`crate::KvLayout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceKvInfo {
    /// Bytes of one page as the device stores it.
    pub page_bytes: u64,
    /// The 16-bit type of the stored KV (`bf16`, `f16`).
    pub dtype: String,
}

impl DeviceKvInfo {
    /// Refuses a peer whose pages differ from this side's, naming the field.
    pub fn check(&self, remote: &DeviceKvInfo) -> Result<(), TransferError> {
        if self.page_bytes != remote.page_bytes {
            return Err(TransferError::LayoutMismatch {
                field: "device page bytes",
                local: self.page_bytes.to_string(),
                remote: remote.page_bytes.to_string(),
            });
        }
        if self.dtype != remote.dtype {
            return Err(TransferError::LayoutMismatch {
                field: "device KV dtype",
                local: self.dtype.clone(),
                remote: remote.dtype.clone(),
            });
        }
        Ok(())
    }
}

/// How one send goes.
#[derive(Debug, Clone, Copy)]
pub struct SendOptions {
    /// The transfer fails (and the link with it) when it has not completed within this long.
    pub timeout: Duration,
    /// Fault injection for tests: stop (without closing) after this many pages.
    pub stall_after_pages: Option<u32>,
}

/// What a receiver got.
#[derive(Debug)]
pub struct Received {
    /// The header the pages came with.
    pub header: TransferHeader,
    /// Whether they went into blocks (false: the transfer was unknown, received into nowhere).
    pub stored: bool,
    /// `Ok` when every page's checksum matched; a mismatch names the first bad page (the link
    /// itself is still in step).
    pub verdict: Result<(), TransferError>,
}

/// A process's KV pool as an endpoint of the device transport.
pub trait DeviceKv: Send + Sync {
    /// What the peer's pool must match.
    fn info(&self) -> DeviceKvInfo;
    /// A new link id (the side that makes it hands its bytes to the peer).
    fn new_link_id(&self) -> Result<[u8; 128], TransferError>;
    /// Joins the link of `id` as `role`; returns once the peer has joined too, or with an error.
    fn connect(&self, role: LinkRole, id: &[u8; 128])
        -> Result<Box<dyn DeviceLink>, TransferError>;
}

/// One end of a link between two processes' KV pools.
pub trait DeviceLink: Send {
    /// Sends `blocks` (this side's block ids, pages `first_index..`) as transfer `transfer_id`;
    /// returns the bytes sent once they have left. An error leaves the link unusable.
    fn send(
        &mut self,
        transfer_id: u64,
        first_index: u32,
        blocks: &[u32],
        opts: SendOptions,
    ) -> Result<u64, TransferError>;

    /// Waits for the next transfer while `keep_waiting()` says so (`Ok(None)` when it stopped
    /// waiting; the next call goes on waiting for the same transfer), then receives its pages
    /// into the blocks `route` names for its header (`None`: into nowhere). Pages must arrive
    /// within `timeout` of the header; `keep_waiting()` turning false while they land is an
    /// error. An error leaves the link unusable.
    fn recv(
        &mut self,
        route: &mut dyn FnMut(&TransferHeader) -> Option<Vec<u32>>,
        keep_waiting: &dyn Fn() -> bool,
        timeout: Duration,
    ) -> Result<Option<Received>, TransferError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_every_bit_flip_is_caught() {
        let h = TransferHeader {
            transfer_id: 0x1234_5678_9abc,
            first_index: 3,
            pages: 512,
            page_bytes: 2 << 20,
        };
        let b = h.encode();
        assert_eq!(TransferHeader::decode(&b).unwrap(), h);
        for i in 0..36 {
            for bit in 0..8 {
                let mut c = b;
                c[i] ^= 1 << bit;
                assert!(
                    TransferHeader::decode(&c).is_err(),
                    "flip of bit {bit} of byte {i} went unnoticed"
                );
            }
        }
        assert!(TransferHeader::decode(&b[..10]).is_err());
    }

    #[test]
    fn checksum_sees_any_changed_word_and_swapped_words() {
        let page: Vec<u8> =
            (0..4096u32).flat_map(|i| (i.wrapping_mul(2_654_435_761) >> 7).to_le_bytes()).collect();
        let sum = page_checksum(&page);
        for byte in (0..page.len()).step_by(97) {
            for bit in [0, 3, 7] {
                let mut c = page.clone();
                c[byte] ^= 1 << bit;
                assert_ne!(page_checksum(&c), sum, "flip at byte {byte} bit {bit}");
            }
        }
        let mut swapped = page.clone();
        swapped.copy_within(0..4, 400);
        swapped[..4].copy_from_slice(&page[400..404]);
        assert_ne!(page_checksum(&swapped), sum);
        // A zero page does not sum to zero (position-keyed), so a page never written is caught.
        assert_ne!(page_checksum(&vec![0u8; 4096]), 0);
    }

    #[test]
    fn the_first_bad_page_is_named() {
        let h = TransferHeader { transfer_id: 7, first_index: 10, pages: 3, page_bytes: 64 };
        assert!(compare_checksums(&h, &[1, 2, 3], &[1, 2, 3]).is_ok());
        match compare_checksums(&h, &[1, 2, 3], &[1, 9, 3]) {
            Err(TransferError::Checksum { transfer_id: 7, index: 11, expected: 2, actual: 9 }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(compare_checksums(&h, &[1], &[1, 2]), Err(TransferError::Protocol(_))));
    }

    #[test]
    fn device_pools_must_match() {
        let a = DeviceKvInfo { page_bytes: 1024, dtype: "bf16".into() };
        assert!(a.check(&a.clone()).is_ok());
        let e = a
            .check(&DeviceKvInfo { page_bytes: 1024, dtype: "f16".into() })
            .unwrap_err()
            .to_string();
        assert!(e.contains("device KV dtype") && e.contains("bf16") && e.contains("f16"), "{e}");
        assert!(a.check(&DeviceKvInfo { page_bytes: 2048, dtype: "bf16".into() }).is_err());
    }
}
