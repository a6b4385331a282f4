//! Property tests of the BlockManager over random sequences of allocate / append / fork /
//! free / preempt / swap: reference counts always equal the number of holders, no block is both
//! free and held, the cache index is consistent, and everything is free at the end.

use tandem_engine::sampling::sampler::Rng;
use tandem_engine::scheduling::block_hash::{BlockHash, DEFAULT_HASH_SEED};
use tandem_engine::scheduling::block_manager::{BlockManager, BlockTable, KvEvent};

const BS: usize = 4;

struct Seq {
    tokens: Vec<u32>,
    table: BlockTable,
    host: Option<Vec<u32>>,
}

fn hashes(tokens: &[u32]) -> Vec<BlockHash> {
    BlockHash::chain(DEFAULT_HASH_SEED, tokens, BS, 0)
}

fn run(seed: u64, prefix_caching: bool) {
    let mut rng = Rng::new(seed);
    let mut m = BlockManager::new(40, BS, 24, prefix_caching);
    m.enable_kv_events();
    // A router's view, rebuilt from the events alone.
    let mut seen: std::collections::HashSet<BlockHash> = std::collections::HashSet::new();
    let mut seqs: Vec<Seq> = Vec::new();
    let mut r = |n: u64| (rng.next_u64() % n) as usize;
    for step in 0..3000 {
        match r(7) {
            0 => {
                // New sequence; prompts draw from few token patterns so prefixes repeat.
                let len = 1 + r(20);
                let base = r(3) as u32;
                let tokens: Vec<u32> = (0..len as u32).map(|i| base * 100 + i).collect();
                let mut table = BlockTable::default();
                let full = hashes(&tokens);
                // Keep at least one token to compute, as the scheduler does.
                let usable = if tokens.len().is_multiple_of(BS) {
                    full.len().saturating_sub(1)
                } else {
                    full.len()
                };
                let cached = m.lookup_prefix(&full[..usable], true);
                if m.can_allocate(&table, &cached, tokens.len()) {
                    m.allocate(&mut table, &cached, tokens.len()).unwrap();
                    m.cache_blocks(&mut table, &full);
                    seqs.push(Seq { tokens, table, host: None });
                } else {
                    assert!(m.allocate(&mut table, &cached, tokens.len()).is_err());
                    assert!(table.is_empty(), "failed allocation must not leave blocks behind");
                }
            }
            1 | 2 if !seqs.is_empty() => {
                // Append 1..6 tokens to a running sequence (copy-on-write when shared).
                let i = r(seqs.len() as u64);
                let s = &mut seqs[i];
                if s.host.is_none() {
                    let n = 1 + r(6);
                    let old = s.tokens.len();
                    let before = s.table.clone();
                    match m.append_slots(&mut s.table, old, old + n) {
                        Ok(copies) => {
                            for (src, dst) in copies {
                                assert_ne!(src, dst);
                                assert_eq!(m.ref_count(dst), 1);
                            }
                            s.tokens.extend((0..n as u32).map(|k| 7000 + step as u32 * 8 + k));
                            let h = hashes(&s.tokens);
                            m.cache_blocks(&mut s.table, &h);
                        }
                        Err(_) => {
                            assert_eq!(s.table, before, "failed append must not change the table")
                        }
                    }
                }
            }
            3 if !seqs.is_empty() => {
                let i = r(seqs.len() as u64);
                if seqs[i].host.is_none() {
                    let table = m.fork(&seqs[i].table);
                    let tokens = seqs[i].tokens.clone();
                    seqs.push(Seq { tokens, table, host: None });
                }
            }
            4 if !seqs.is_empty() => {
                // Finish or preempt-by-recompute: both free everything.
                let i = r(seqs.len() as u64);
                let mut s = seqs.swap_remove(i);
                match s.host.as_mut() {
                    Some(h) => m.free_host(h),
                    None => m.free(&mut s.table),
                }
            }
            5 if !seqs.is_empty() => {
                let i = r(seqs.len() as u64);
                let s = &mut seqs[i];
                if s.host.is_none() {
                    if let Ok((host, copies)) = m.swap_out(&mut s.table) {
                        assert_eq!(host.len(), copies.len());
                        s.host = Some(host);
                    }
                }
            }
            6 if !seqs.is_empty() => {
                let i = r(seqs.len() as u64);
                let s = &mut seqs[i];
                if let Some(h) = s.host.as_mut() {
                    if m.can_swap_in(h.len()) {
                        let n = h.len();
                        let (table, copies) = m.swap_in(h).unwrap();
                        assert_eq!(copies.len(), n);
                        s.table = table;
                        s.host = None;
                    }
                }
            }
            _ => {}
        }
        for ev in m.take_kv_events() {
            match ev {
                KvEvent::Stored(v) => {
                    v.into_iter().for_each(|h| assert!(seen.insert(h), "stored twice"))
                }
                KvEvent::Removed(v) => {
                    v.into_iter().for_each(|h| assert!(seen.remove(&h), "removed unknown"))
                }
                KvEvent::Cleared => seen.clear(),
            }
        }
        let mut cached = m.cached_hashes();
        cached.sort();
        let mut view: Vec<BlockHash> = seen.iter().copied().collect();
        view.sort();
        assert_eq!(
            view, cached,
            "seed {seed} step {step}: the event stream disagrees with the cache"
        );
        let holders: Vec<&BlockTable> = seqs.iter().map(|s| &s.table).collect();
        let hosts: Vec<&Vec<u32>> = seqs.iter().filter_map(|s| s.host.as_ref()).collect();
        if let Err(e) = m.check_invariants(&holders, &hosts) {
            panic!("seed {seed} step {step}: {e}");
        }
        for s in &seqs {
            if s.host.is_none() {
                assert!(s.table.len() * BS >= s.tokens.len(), "table too short");
            }
        }
    }
    for mut s in seqs {
        match s.host.as_mut() {
            Some(h) => m.free_host(h),
            None => m.free(&mut s.table),
        }
    }
    m.check_invariants(&[], &[]).unwrap();
    assert_eq!(m.num_free_blocks(), m.num_blocks());
    assert_eq!(m.num_free_host_blocks(), m.num_host_blocks());
}

#[test]
fn random_operations_keep_invariants_with_prefix_caching() {
    for seed in 0..40 {
        run(seed, true);
    }
}

#[test]
fn random_operations_keep_invariants_without_prefix_caching() {
    for seed in 100..120 {
        run(seed, false);
    }
}

#[test]
fn freed_blocks_keep_their_hash_until_evicted() {
    let mut m = BlockManager::new(4, BS, 0, true);
    let tokens: Vec<u32> = (0..8).collect();
    let h = hashes(&tokens);
    let mut t = BlockTable::default();
    m.allocate(&mut t, &[], 8).unwrap();
    m.cache_blocks(&mut t, &h);
    let first = t.blocks.clone();
    m.free(&mut t);
    // Both blocks are free, and still a hit.
    assert_eq!(m.num_free_blocks(), 4);
    assert_eq!(m.lookup_prefix(&h, true), first);
    // Allocating the two never-used blocks does not evict them...
    let mut other = BlockTable::default();
    m.allocate(&mut other, &[], 8).unwrap();
    assert_eq!(m.lookup_prefix(&h, false), first);
    // ...but one more block evicts the least recently freed cached block (the tail block).
    let mut third = BlockTable::default();
    m.allocate(&mut third, &[], 1).unwrap();
    assert_eq!(m.lookup_prefix(&h, false), vec![first[0]]);
    assert_eq!(m.stats().evictions, 1);
    assert_eq!(m.stats().queries, 2);
    assert_eq!(m.stats().hits, 2);
}

#[test]
fn fork_shares_then_copies_on_write() {
    let mut m = BlockManager::new(8, BS, 0, true);
    let mut parent = BlockTable::default();
    m.allocate(&mut parent, &[], 6).unwrap(); // one full block + a partial one
    let mut child = m.fork(&parent);
    assert_eq!(m.num_free_blocks(), 6, "fork takes no new blocks");
    // The child writes token 6 into the shared partial block: it gets a private copy.
    let copies = m.append_slots(&mut child, 6, 7).unwrap();
    assert_eq!(copies, vec![(parent.blocks[1], child.blocks[1])]);
    assert_ne!(parent.blocks[1], child.blocks[1]);
    assert_eq!(parent.blocks[0], child.blocks[0]);
    // The parent is now the only holder of its partial block: writes in place.
    assert!(m.append_slots(&mut parent, 6, 7).unwrap().is_empty());
    m.check_invariants(&[&parent, &child], &[]).unwrap();
}
