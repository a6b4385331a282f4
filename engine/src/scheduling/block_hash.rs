//! `BlockHash`: the chained hash that names a full KV block everywhere in Tandem — the engine's
//! prefix cache, the KV events workers publish, the router's index and the prefill→decode
//! handoff.
//!
//! `hash(block i) = H(seed, hash(block i-1), salt, tokens of block i)`. It is a fixed function
//! (not Rust's randomly keyed hasher), so every process computes the same value for the same
//! tokens; `seed` is part of the KV transfer handshake.

/// The default seed of the block hash.
pub const DEFAULT_HASH_SEED: u64 = 0x7A6E_6465_6D5F_6B76;

/// Chained 64-bit hash of one full block of tokens and everything before it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct BlockHash(pub u64);

#[inline]
fn mix(mut x: u64) -> u64 {
    // The finaliser of MurmurHash3 / SplitMix64: full avalanche on 64 bits.
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A 64-bit digest of a cache salt (for per-tenant isolation of the prefix cache).
pub fn salt_digest(salt: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64; // FNV-1a offset basis
    for b in salt.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

impl BlockHash {
    /// Hash of a block given its parent's hash (None for the first block).
    pub fn new(seed: u64, parent: Option<BlockHash>, tokens: &[u32], salt: u64) -> BlockHash {
        let mut h = mix(seed ^ 0x9E37_79B9_7F4A_7C15);
        h = mix(h ^ parent.map_or(0x5555_5555_5555_5555, |p| p.0));
        h = mix(h ^ salt);
        for pair in tokens.chunks(2) {
            let v = pair[0] as u64 | (pair.get(1).map_or(u32::MAX as u64, |&t| t as u64) << 32);
            h = mix(h.rotate_left(29) ^ v);
        }
        BlockHash(mix(h ^ tokens.len() as u64))
    }

    /// The name of this block's page of KV group `group` in the prefix cache (the block's own
    /// hash for group 0, the one routers and KV events know).
    pub fn for_group(self, group: usize) -> BlockHash {
        if group == 0 {
            self
        } else {
            BlockHash(mix(self.0 ^ mix(0xA5A5_0000_0000_0000 ^ group as u64)))
        }
    }

    /// Hashes of every full block of `tokens`, chained from the start.
    pub fn chain(seed: u64, tokens: &[u32], block_size: usize, salt: u64) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(tokens.len() / block_size);
        let mut parent = None;
        for block in tokens.chunks_exact(block_size) {
            let h = BlockHash::new(seed, parent, block, salt);
            out.push(h);
            parent = Some(h);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chaining_and_salt() {
        let toks: Vec<u32> = (0..64).collect();
        let a = BlockHash::chain(DEFAULT_HASH_SEED, &toks, 16, 0);
        assert_eq!(a.len(), 4);
        // Same block content after a different prefix hashes differently.
        let mut other = toks.clone();
        other[0] = 999;
        let b = BlockHash::chain(DEFAULT_HASH_SEED, &other, 16, 0);
        assert_ne!(a[3], b[3]);
        assert_eq!(a, BlockHash::chain(DEFAULT_HASH_SEED, &toks, 16, 0));
        assert_ne!(a[0], BlockHash::chain(DEFAULT_HASH_SEED, &toks, 16, salt_digest("tenant"))[0]);
        assert_ne!(a[0], BlockHash::chain(1, &toks, 16, 0)[0]);
        // A fixed function: this value must never change (other processes depend on it).
        assert_eq!(
            BlockHash::new(DEFAULT_HASH_SEED, None, &[1, 2, 3], 0),
            BlockHash(0xb992_005a_7616_313e)
        );
    }
}
