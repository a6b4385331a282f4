//! `BlockManager`: the physical KV blocks of one device — free list, reference counts,
//! copy-on-write fork (seed 000 alg. 7), the hash-based prefix cache, and the host-side swap
//! space.
//!
//! A block (page) holds `block_size` tokens of the layers of one KV group
//! ([`crate::backend::KvGroups`]): a table lists each logical block's page of every group, and
//! pages of sliding-window groups that the window has passed are given back
//! ([`BlockManager::release_passed`]). With one group (no sliding window) a page is a whole
//! logical block.
//!
//! Free blocks sit in one LRU queue. A freed block keeps its [`BlockHash`] and can be revived by
//! a prefix hit until it reaches the front of the queue and is reused (evicted). Only full
//! blocks are ever hashed and shared through the cache. This module tracks ownership only; it
//! never touches KV data — copies and swaps are returned as block pairs for the backend.

use std::collections::HashMap;

use crate::backend::{first_visible_block, NO_PAGE};
use crate::scheduling::block_hash::BlockHash;

/// The physical blocks a sequence holds, in logical order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTable {
    /// Pages: entry `i * groups + g` is logical block `i`'s page of KV group `g`
    /// ([`NO_PAGE`] once a sliding-window group gave it back). One group: a page per block.
    pub blocks: Vec<u32>,
    /// Leading logical blocks already registered in (or taken from) the prefix cache.
    pub num_hashed: usize,
    /// The position of the last release of passed sliding-window pages
    /// ([`BlockManager::release_passed`]).
    pub window_start: usize,
}

impl BlockTable {
    /// Number of entries (pages, given back ones included).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }
    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// Block pairs to copy, `(from, to)` (device to host, host to device, or copy-on-write).
pub type BlockCopies = Vec<(u32, u32)>;

/// Not enough free blocks for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of KV blocks: need {needed}, {free} free")]
pub struct NoFreeBlocks {
    /// Blocks the operation needed.
    pub needed: usize,
    /// Blocks that were free.
    pub free: usize,
}

const NIL: u32 = NO_PAGE;

/// Counters of the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Full prompt blocks looked up.
    pub queries: u64,
    /// Of those, blocks found in the cache.
    pub hits: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
}

/// Owner of the device's KV blocks and of the host swap space.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    /// Window of each KV group (`None`: a global group).
    windows: Vec<Option<usize>>,
    /// Whether a cached page is of group 0 (its hash is the block's, which KV events publish).
    group0: Vec<bool>,
    ref_count: Vec<u32>,
    hash: Vec<Option<BlockHash>>,
    // Doubly linked LRU free queue over block ids; front is reused first.
    prev: Vec<u32>,
    next: Vec<u32>,
    in_free: Vec<bool>,
    head: u32,
    tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, u32, foldhash::fast::RandomState>,
    enable_prefix_caching: bool,
    host_free: Vec<u32>,
    num_host_blocks: usize,
    stats: PrefixCacheStats,
    events: Option<Vec<KvEvent>>,
    // Secure mode: freed blocks leave the prefix cache and wait here to be zeroed.
    zero_freed: bool,
    to_zero: Vec<u32>,
}

/// A change to the set of blocks in the prefix cache, as routers learn it (KV events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// These blocks entered the cache, in order.
    Stored(Vec<BlockHash>),
    /// These blocks left the cache (evicted for reuse).
    Removed(Vec<BlockHash>),
    /// Every block left the cache.
    Cleared,
}

impl BlockManager {
    /// `num_blocks` device blocks of `block_size` tokens and `num_host_blocks` of swap space.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        num_host_blocks: usize,
        enable_prefix_caching: bool,
    ) -> Self {
        let mut m = BlockManager {
            block_size,
            windows: vec![None],
            group0: vec![false; num_blocks],
            ref_count: vec![0; num_blocks],
            hash: vec![None; num_blocks],
            prev: vec![NIL; num_blocks],
            next: vec![NIL; num_blocks],
            in_free: vec![false; num_blocks],
            head: NIL,
            tail: NIL,
            num_free: 0,
            cached: HashMap::default(),
            enable_prefix_caching,
            host_free: (0..num_host_blocks as u32).rev().collect(),
            num_host_blocks,
            stats: PrefixCacheStats::default(),
            events: None,
            zero_freed: false,
            to_zero: Vec::new(),
        };
        for b in 0..num_blocks as u32 {
            m.push_back(b);
        }
        m
    }

    /// Pages are grouped as `windows` says (one entry per KV group: its window, `None` for
    /// global layers); set before any table is allocated.
    pub fn set_kv_groups(&mut self, windows: Vec<Option<usize>>) {
        assert!(!windows.is_empty(), "at least one KV group");
        self.windows = windows;
    }

    /// Number of KV groups (pages per logical block).
    pub fn num_groups(&self) -> usize {
        self.windows.len()
    }

    /// The window of each KV group (`None`: a global group).
    pub fn windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Tokens covered by prefix-cache hits `cached` (as [`BlockManager::lookup_prefix`]
    /// returns them).
    pub fn cached_tokens(&self, cached: &[u32]) -> usize {
        cached.len() / self.num_groups() * self.block_size
    }
    /// Total device blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_count.len()
    }
    /// Blocks not held by any sequence (cached ones included: they can be evicted).
    pub fn num_free_blocks(&self) -> usize {
        self.num_free
    }
    /// Fraction of blocks held by sequences.
    pub fn usage(&self) -> f64 {
        if self.num_blocks() == 0 {
            return 0.0;
        }
        1.0 - self.num_free as f64 / self.num_blocks() as f64
    }
    /// Free host (swap) blocks.
    pub fn num_free_host_blocks(&self) -> usize {
        self.host_free.len()
    }
    /// Total host (swap) blocks.
    pub fn num_host_blocks(&self) -> usize {
        self.num_host_blocks
    }
    /// Prefix cache counters.
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }
    /// Whether full blocks are shared through the prefix cache.
    pub fn prefix_caching(&self) -> bool {
        self.enable_prefix_caching
    }
    /// References held on a block.
    pub fn ref_count(&self, block: u32) -> u32 {
        self.ref_count[block as usize]
    }

    fn push_back(&mut self, b: u32) {
        debug_assert!(!self.in_free[b as usize]);
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail != NIL {
            self.next[self.tail as usize] = b;
        } else {
            self.head = b;
        }
        self.tail = b;
        self.in_free[b as usize] = true;
        self.num_free += 1;
    }

    fn push_front(&mut self, b: u32) {
        debug_assert!(!self.in_free[b as usize]);
        self.next[b as usize] = self.head;
        self.prev[b as usize] = NIL;
        if self.head != NIL {
            self.prev[self.head as usize] = b;
        } else {
            self.tail = b;
        }
        self.head = b;
        self.in_free[b as usize] = true;
        self.num_free += 1;
    }

    fn unlink(&mut self, b: u32) {
        debug_assert!(self.in_free[b as usize]);
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.in_free[b as usize] = false;
        self.num_free -= 1;
    }

    /// Secure mode (seed 000's `SECURE_MODE`): a block whose last reference goes is dropped from
    /// the prefix cache and listed for zeroing ([`BlockManager::take_blocks_to_zero`]), so no
    /// request's KV outlives it. Prefix sharing then only happens between live requests.
    pub fn set_zero_freed(&mut self, on: bool) {
        self.zero_freed = on;
    }

    /// Blocks freed since the last call, to be zeroed before anything else writes them.
    pub fn take_blocks_to_zero(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.to_zero)
    }

    fn uncache(&mut self, b: u32) {
        if let Some(h) = self.hash[b as usize].take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
                if let (Some(ev), true) = (&mut self.events, self.group0[b as usize]) {
                    match ev.last_mut() {
                        Some(KvEvent::Removed(v)) => v.push(h),
                        _ => ev.push(KvEvent::Removed(vec![h])),
                    }
                }
            }
        }
    }

    fn take_free(&mut self) -> u32 {
        let b = self.head;
        debug_assert!(b != NIL);
        self.unlink(b);
        if let Some(h) = self.hash[b as usize].take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
                self.stats.evictions += 1;
                if let (Some(ev), true) = (&mut self.events, self.group0[b as usize]) {
                    match ev.last_mut() {
                        Some(KvEvent::Removed(v)) => v.push(h),
                        _ => ev.push(KvEvent::Removed(vec![h])),
                    }
                }
            }
        }
        self.ref_count[b as usize] = 1;
        b
    }

    fn take_ref(&mut self, b: u32) {
        if self.ref_count[b as usize] == 0 {
            self.unlink(b);
        }
        self.ref_count[b as usize] += 1;
    }

    fn drop_ref(&mut self, b: u32) {
        let rc = &mut self.ref_count[b as usize];
        debug_assert!(*rc > 0, "double free of block {b}");
        *rc -= 1;
        if *rc == 0 {
            if self.zero_freed {
                self.uncache(b);
                self.to_zero.push(b);
                self.push_front(b);
            } else if self.hash[b as usize].is_some() {
                self.push_back(b); // reusable content: evict last
            } else {
                self.push_front(b); // nothing worth keeping: reuse first
            }
        }
    }

    /// The pages of the longest run of leading `hashes` whose every group's page is in the
    /// prefix cache (no references taken), as table entries. Counts the lookups in the
    /// prefix-cache statistics when `record` is set. For a sequence that must hold every page
    /// (a prefill worker's, which ships them); [`BlockManager::lookup_prefix_in_window`] is the
    /// lookup of one that runs here.
    pub fn lookup_prefix(&mut self, hashes: &[BlockHash], record: bool) -> Vec<u32> {
        self.lookup(hashes, record, false)
    }

    /// Like [`BlockManager::lookup_prefix`], but a sliding-window group needs only the pages
    /// its window still sees from the end of the hit (the earlier entries are [`NO_PAGE`]): the
    /// longest hit whose global pages are all cached and whose local groups' last
    /// `window` positions are.
    pub fn lookup_prefix_in_window(&mut self, hashes: &[BlockHash], record: bool) -> Vec<u32> {
        self.lookup(hashes, record, true)
    }

    fn lookup(&mut self, hashes: &[BlockHash], record: bool, in_window: bool) -> Vec<u32> {
        if !self.enable_prefix_caching {
            return Vec::new();
        }
        let (groups, bs) = (self.num_groups(), self.block_size);
        // A group whose every block of the hit must be cached: all of them, or (in a window)
        // the global ones.
        let must = |g: usize| !in_window || self.windows[g].is_none();
        // Each group's cached page of the leading blocks, looked up once, up to the first block
        // a must-group misses.
        let mut pages: Vec<Option<u32>> = Vec::new();
        for h in hashes {
            let block: Vec<Option<u32>> =
                (0..groups).map(|g| self.cached.get(&h.for_group(g)).copied()).collect();
            if (0..groups).any(|g| must(g) && block[g].is_none()) {
                break;
            }
            pages.extend(block);
        }
        let mut hit = pages.len() / groups;
        // The first block a group still reads once `n` blocks are cached.
        let first_seen = |g: usize, n: usize| {
            if in_window {
                first_visible_block(self.windows[g], n * bs, bs)
            } else {
                0
            }
        };
        // Shorten the hit until every local group holds the blocks its window sees from its end.
        while hit > 0
            && !(0..groups)
                .all(|g| (first_seen(g, hit)..hit).all(|i| pages[i * groups + g].is_some()))
        {
            hit -= 1;
        }
        let out = (0..hit * groups)
            .map(|e| {
                let (i, g) = (e / groups, e % groups);
                if i < first_seen(g, hit) {
                    NIL
                } else {
                    pages[e].expect("a hit's pages are cached")
                }
            })
            .collect();
        if record {
            self.stats.queries += hashes.len() as u64;
            self.stats.hits += hit as u64;
        }
        out
    }

    /// Whether `table` can grow to cover `num_tokens` tokens, first reusing `cached` blocks.
    pub fn can_allocate(&self, table: &BlockTable, cached: &[u32], num_tokens: usize) -> bool {
        self.blocks_needed(table, cached, num_tokens) <= self.num_free
    }

    fn blocks_needed(&self, table: &BlockTable, cached: &[u32], num_tokens: usize) -> usize {
        let total = num_tokens.div_ceil(self.block_size) * self.num_groups();
        let fresh = total.saturating_sub(table.len() + cached.len());
        // Reviving a cached block that is free also takes it off the free queue.
        let revived =
            cached.iter().filter(|&&b| b != NIL && self.ref_count[b as usize] == 0).count();
        fresh + revived
    }

    /// Appends the prefix-cache hits `cached` (full blocks) to an empty `table`, then fresh
    /// blocks until it covers `num_tokens` tokens. All or nothing.
    pub fn allocate(
        &mut self,
        table: &mut BlockTable,
        cached: &[u32],
        num_tokens: usize,
    ) -> Result<(), NoFreeBlocks> {
        let needed = self.blocks_needed(table, cached, num_tokens);
        if needed > self.num_free {
            return Err(NoFreeBlocks { needed, free: self.num_free });
        }
        debug_assert!(cached.is_empty() || table.is_empty());
        for &b in cached {
            if b != NIL {
                self.take_ref(b);
            }
            table.blocks.push(b);
        }
        table.num_hashed = table.num_hashed.max(cached.len() / self.num_groups());
        let total = num_tokens.div_ceil(self.block_size) * self.num_groups();
        self.grow(table, total);
        Ok(())
    }

    /// Appends fresh pages until `table` has `total` entries, taking each group's pages one
    /// after another: a group's new blocks then sit side by side in the pool (a layer reads
    /// them in order) instead of one page in every `groups`.
    fn grow(&mut self, table: &mut BlockTable, total: usize) {
        let (start, groups) = (table.len(), self.num_groups());
        if total <= start {
            return;
        }
        table.blocks.resize(total, NIL);
        for g in 0..groups {
            for e in (start..total).filter(|e| e % groups == g) {
                table.blocks[e] = self.take_free();
            }
        }
    }

    /// Makes room for tokens `first_new..num_tokens` to be written: appends blocks and copies
    /// any shared block that will be written (copy-on-write). Returns `(src, dst)` block copies
    /// the backend must perform before the write. All or nothing.
    pub fn append_slots(
        &mut self,
        table: &mut BlockTable,
        first_new: usize,
        num_tokens: usize,
    ) -> Result<Vec<(u32, u32)>, NoFreeBlocks> {
        let (bs, groups) = (self.block_size, self.num_groups());
        let existing = table.len();
        let total = num_tokens.div_ceil(bs) * groups;
        let cow: Vec<usize> = (first_new / bs * groups..existing.min(total))
            .filter(|&e| table.blocks[e] != NIL && self.ref_count[table.blocks[e] as usize] > 1)
            .collect();
        let grow = total.saturating_sub(existing);
        let needed = grow + cow.len();
        if needed > self.num_free {
            return Err(NoFreeBlocks { needed, free: self.num_free });
        }
        let mut copies = Vec::with_capacity(cow.len());
        for i in cow {
            let src = table.blocks[i];
            let dst = self.take_free();
            self.drop_ref(src);
            table.blocks[i] = dst;
            table.num_hashed = table.num_hashed.min(i / groups);
            copies.push((src, dst));
        }
        self.grow(table, existing + grow);
        Ok(copies)
    }

    /// Gives back the pages of sliding-window groups that no token from position `first_new`
    /// on can see: logical blocks wholly before `first_new + 1 − window`. Their entries become
    /// [`NO_PAGE`]; a hashed page stays in the prefix cache until it is reused. A sequence that
    /// still has to ship its pages (a prefill worker's) keeps them.
    pub fn release_passed(&mut self, table: &mut BlockTable, first_new: usize) {
        let groups = self.num_groups();
        let logical = table.len() / groups;
        let bs = self.block_size;
        for g in 0..groups {
            let window = self.windows[g];
            if window.is_none() {
                continue;
            }
            let passed = |pos: usize| first_visible_block(window, pos, bs).min(logical);
            for i in passed(table.window_start)..passed(first_new) {
                let b = std::mem::replace(&mut table.blocks[i * groups + g], NIL);
                if b != NIL {
                    self.drop_ref(b);
                }
            }
        }
        table.window_start = table.window_start.max(first_new);
    }

    /// Starts recording [`KvEvent`]s (a server publishes them; nothing else needs them). The
    /// first event is [`KvEvent::Cleared`] followed by every block already cached.
    pub fn enable_kv_events(&mut self) {
        let mut all = self.cached_hashes();
        all.sort();
        let mut ev = vec![KvEvent::Cleared];
        if !all.is_empty() {
            ev.push(KvEvent::Stored(all));
        }
        self.events = Some(ev);
    }

    /// The events recorded since the last call.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Every block hash in the prefix cache (for a router's resync).
    pub fn cached_hashes(&self) -> Vec<BlockHash> {
        self.cached.iter().filter(|(_, &b)| self.group0[b as usize]).map(|(h, _)| *h).collect()
    }

    /// Registers the table's full blocks (hashes in `hashes`, one per full computed block) in
    /// the prefix cache. A block whose content is already cached elsewhere is left unshared.
    pub fn cache_blocks(&mut self, table: &mut BlockTable, hashes: &[BlockHash]) {
        if !self.enable_prefix_caching {
            return;
        }
        let groups = self.num_groups();
        let upto = hashes.len().min(table.len() / groups);
        let mut stored = Vec::new();
        let from = table.num_hashed.min(upto);
        for (e, &b) in table.blocks.iter().enumerate().take(upto * groups).skip(from * groups) {
            let (i, g) = (e / groups, e % groups);
            let h = hashes[i].for_group(g);
            if b != NIL
                && self.hash[b as usize].is_none()
                && !self.cached.contains_key(&h)
                && self.ref_count[b as usize] == 1
            {
                self.hash[b as usize] = Some(h);
                self.group0[b as usize] = g == 0;
                self.cached.insert(h, b);
                if g == 0 {
                    stored.push(h);
                }
            }
        }
        if let (Some(ev), false) = (&mut self.events, stored.is_empty()) {
            ev.push(KvEvent::Stored(stored));
        }
        table.num_hashed = table.num_hashed.max(upto);
    }

    /// Releases the pages of `table` beyond its first `keep` logical blocks (e.g. blocks that
    /// held rejected speculative tokens).
    pub fn truncate(&mut self, table: &mut BlockTable, keep: usize) {
        let groups = self.num_groups();
        while table.blocks.len() > keep * groups {
            let b = table.blocks.pop().expect("longer than keep");
            if b != NIL {
                self.drop_ref(b);
            }
        }
        table.num_hashed = table.num_hashed.min(table.blocks.len() / groups);
    }

    /// Releases every block of `table` (tail first, so a prefix stays cached longest).
    pub fn free(&mut self, table: &mut BlockTable) {
        for &b in table.blocks.iter().rev() {
            if b != NIL {
                self.drop_ref(b);
            }
        }
        table.blocks.clear();
        table.num_hashed = 0;
        table.window_start = 0;
    }

    /// A child table sharing every block of `parent` (copy-on-write on the next write).
    pub fn fork(&mut self, parent: &BlockTable) -> BlockTable {
        for &b in parent.blocks.iter().filter(|&&b| b != NIL) {
            self.ref_count[b as usize] += 1;
        }
        parent.clone()
    }

    /// Moves a table to host memory: returns the host table and `(device, host)` copies to run
    /// before the device blocks are reused. All or nothing.
    pub fn swap_out(
        &mut self,
        table: &mut BlockTable,
    ) -> Result<(Vec<u32>, BlockCopies), NoFreeBlocks> {
        let held = table.blocks.iter().filter(|&&b| b != NIL).count();
        if self.host_free.len() < held {
            return Err(NoFreeBlocks { needed: held, free: self.host_free.len() });
        }
        let mut host = Vec::with_capacity(table.len());
        let mut copies = Vec::with_capacity(held);
        for &b in &table.blocks {
            if b == NIL {
                host.push(NIL);
                continue;
            }
            let h = self.host_free.pop().expect("checked above");
            host.push(h);
            copies.push((b, h));
        }
        self.free(table);
        Ok((host, copies))
    }

    /// Device pages a swapped-out table needs to come back and grow to `num_tokens` tokens.
    pub fn swap_in_need(&self, host: &[u32], num_tokens: usize) -> usize {
        let held = host.iter().filter(|&&h| h != NIL).count();
        held + (num_tokens.div_ceil(self.block_size) * self.num_groups()).saturating_sub(host.len())
    }

    /// Whether a swapped-out table of `n` host blocks fits back on the device.
    pub fn can_swap_in(&self, n: usize) -> bool {
        n <= self.num_free
    }

    /// Brings a host table back: returns the device table and `(host, device)` copies.
    pub fn swap_in(
        &mut self,
        host: &mut Vec<u32>,
    ) -> Result<(BlockTable, Vec<(u32, u32)>), NoFreeBlocks> {
        let held = host.iter().filter(|&&h| h != NIL).count();
        if held > self.num_free {
            return Err(NoFreeBlocks { needed: held, free: self.num_free });
        }
        let mut table = BlockTable::default();
        let mut copies = Vec::with_capacity(held);
        for &h in host.iter() {
            if h == NIL {
                table.blocks.push(NIL);
                continue;
            }
            let b = self.take_free();
            table.blocks.push(b);
            copies.push((h, b));
        }
        self.free_host(host);
        Ok((table, copies))
    }

    /// Releases host blocks (a swapped sequence that was aborted).
    pub fn free_host(&mut self, host: &mut Vec<u32>) {
        self.host_free.extend(host.drain(..).filter(|&h| h != NIL));
    }

    /// Checks every invariant against the complete list of holders; returns a description of the
    /// first violation. For tests and debug assertions.
    pub fn check_invariants(
        &self,
        holders: &[&BlockTable],
        host_holders: &[&Vec<u32>],
    ) -> Result<(), String> {
        let mut counts = vec![0u32; self.num_blocks()];
        for t in holders {
            for &b in t.blocks.iter().filter(|&&b| b != NIL) {
                counts[b as usize] += 1;
            }
        }
        for (b, (&want, &have)) in counts.iter().zip(&self.ref_count).enumerate() {
            if want != have {
                return Err(format!("block {b}: ref count {have}, held by {want}"));
            }
            if (have == 0) != self.in_free[b] {
                return Err(format!(
                    "block {b}: ref count {have} but in free queue = {}",
                    self.in_free[b]
                ));
            }
        }
        let mut n = 0;
        let mut cur = self.head;
        while cur != NIL {
            n += 1;
            if n > self.num_blocks() {
                return Err("free queue has a cycle".into());
            }
            cur = self.next[cur as usize];
        }
        if n != self.num_free {
            return Err(format!("free queue length {n} != num_free {}", self.num_free));
        }
        for (h, &b) in &self.cached {
            if self.hash[b as usize] != Some(*h) {
                return Err(format!(
                    "cache entry {h:?} -> {b} but block hash is {:?}",
                    self.hash[b as usize]
                ));
            }
        }
        let held_host: usize =
            host_holders.iter().map(|h| h.iter().filter(|&&b| b != NIL).count()).sum();
        if held_host + self.host_free.len() != self.num_host_blocks {
            return Err(format!(
                "host blocks: {held_host} held + {} free != {}",
                self.host_free.len(),
                self.num_host_blocks
            ));
        }
        Ok(())
    }
}
