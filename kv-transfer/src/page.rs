//! `KvPage`: one block's KV (all layers, K and V) on the wire, with its chained block hash and
//! a CRC32 over header and payload.
//!
//! Frame: `u32 magic "TKVP"`, `u64 transfer_id`, `u32 index`, `u64 block_hash`,
//! `u32 payload_len`, `u32 crc32`, payload.

use crate::TransferError;

/// Frame magic of a page.
pub const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"TKVP");
/// Bytes of a page header.
pub const HEADER_BYTES: usize = 4 + 8 + 4 + 8 + 4 + 4;

/// One block's KV data in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPage {
    /// The transfer (request) the page belongs to.
    pub transfer_id: u64,
    /// Logical block index within the sequence.
    pub index: u32,
    /// Chained hash of the block's tokens (0 for a partial last block).
    pub block_hash: u64,
    /// All layers' K and V, as the backend reads and writes them.
    pub payload: Vec<u8>,
}

fn crc(transfer_id: u64, index: u32, block_hash: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&transfer_id.to_le_bytes());
    h.update(&index.to_le_bytes());
    h.update(&block_hash.to_le_bytes());
    h.update(payload);
    h.finalize()
}

impl KvPage {
    /// The frame's header (the payload follows it on the wire).
    pub fn header(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0..4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
        h[4..12].copy_from_slice(&self.transfer_id.to_le_bytes());
        h[12..16].copy_from_slice(&self.index.to_le_bytes());
        h[16..24].copy_from_slice(&self.block_hash.to_le_bytes());
        h[24..28].copy_from_slice(&(self.payload.len() as u32).to_le_bytes());
        h[28..32].copy_from_slice(
            &crc(self.transfer_id, self.index, self.block_hash, &self.payload).to_le_bytes(),
        );
        h
    }

    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.header().to_vec();
        b.extend_from_slice(&self.payload);
        b
    }

    /// Parses a header: `(transfer_id, index, block_hash, payload_len, crc)`.
    pub fn parse_header(
        h: &[u8; HEADER_BYTES],
        max_payload: usize,
    ) -> Result<(u64, u32, u64, usize, u32), TransferError> {
        let magic = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes"));
        if magic != PAGE_MAGIC {
            return Err(TransferError::Protocol(format!("bad page magic {magic:#010x}")));
        }
        let len = u32::from_le_bytes(h[24..28].try_into().expect("4 bytes")) as usize;
        if len > max_payload {
            return Err(TransferError::Protocol(format!(
                "page of {len} bytes exceeds {max_payload}"
            )));
        }
        Ok((
            u64::from_le_bytes(h[4..12].try_into().expect("8 bytes")),
            u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")),
            u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")),
            len,
            u32::from_le_bytes(h[28..32].try_into().expect("4 bytes")),
        ))
    }

    /// Assembles a page from a parsed header and its payload, verifying the checksum.
    pub fn verified(
        transfer_id: u64,
        index: u32,
        block_hash: u64,
        payload: Vec<u8>,
        expected: u32,
    ) -> Result<KvPage, TransferError> {
        let actual = crc(transfer_id, index, block_hash, &payload);
        if actual != expected {
            return Err(TransferError::Checksum { transfer_id, index, expected, actual });
        }
        Ok(KvPage { transfer_id, index, block_hash, payload })
    }

    /// Parses a whole frame.
    pub fn decode(b: &[u8], max_payload: usize) -> Result<KvPage, TransferError> {
        let h: &[u8; HEADER_BYTES] = b
            .get(..HEADER_BYTES)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| TransferError::Protocol("short page".into()))?;
        let (id, index, hash, len, sum) = Self::parse_header(h, max_payload)?;
        let payload = b
            .get(HEADER_BYTES..HEADER_BYTES + len)
            .ok_or_else(|| TransferError::Protocol("truncated page".into()))?;
        Self::verified(id, index, hash, payload.to_vec(), sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_bit_flip_is_caught() {
        let p = KvPage {
            transfer_id: 9,
            index: 3,
            block_hash: 0xdead_beef,
            payload: (0..=255).collect(),
        };
        let b = p.encode();
        assert_eq!(KvPage::decode(&b, 1 << 20).unwrap(), p);
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut c = b.clone();
                c[i] ^= 1 << bit;
                assert!(
                    KvPage::decode(&c, 1 << 20).is_err(),
                    "flip of bit {bit} of byte {i} went unnoticed"
                );
            }
        }
        assert!(matches!(KvPage::decode(&b, 10), Err(TransferError::Protocol(_))));
    }
}
