//! Property tests of the BlockManager over random sequences of allocate / append / fork /
//! free / preempt / swap: reference counts always equal the number of holders, no block is both
//! free and held, the cache index is consistent, and everything is free at the end. The same
//! with KV groups whose sliding-window pages are given back as sequences grow.

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
    run_groups(seed, prefix_caching, vec![None]);
}

fn run_groups(seed: u64, prefix_caching: bool, windows: Vec<Option<usize>>) {
    let mut rng = Rng::new(seed);
    let groups = windows.len();
    let mut m = BlockManager::new(40 * groups, BS, 24 * groups, prefix_caching);
    m.set_kv_groups(windows);
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
                // A sequence that runs here needs only its windows' pages of a hit.
                let cached = if r(2) == 0 {
                    m.lookup_prefix(&full[..usable], true)
                } else {
                    m.lookup_prefix_in_window(&full[..usable], true)
                };
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
                    // As the scheduler does before each step: pages the window passed go back.
                    m.release_passed(&mut s.table, old);
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
                        assert_eq!(host.iter().filter(|&&h| h != u32::MAX).count(), copies.len());
                        s.host = Some(host);
                    }
                }
            }
            6 if !seqs.is_empty() => {
                let i = r(seqs.len() as u64);
                let s = &mut seqs[i];
                if let Some(h) = s.host.as_mut() {
                    let n = m.swap_in_need(h, 0);
                    if m.can_swap_in(n) {
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
                assert!(s.table.len() * BS >= s.tokens.len() * groups, "table too short");
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
fn random_operations_keep_invariants_with_sliding_window_groups() {
    for seed in 200..230 {
        // One global group and two local ones (Gemma 3's shape, small).
        run_groups(seed, true, vec![None, Some(6), Some(6)]);
    }
    for seed in 300..310 {
        // Every layer local (Mistral).
        run_groups(seed, seed % 2 == 0, vec![Some(9)]);
    }
}

#[test]
fn passed_window_pages_go_back_and_stay_cached_until_reused() {
    let mut m = BlockManager::new(16, BS, 16, true);
    m.set_kv_groups(vec![None, Some(8)]);
    m.enable_kv_events();
    let _ = m.take_kv_events();
    let tokens: Vec<u32> = (0..16).collect();
    let h = hashes(&tokens);
    let mut t = BlockTable::default();
    m.allocate(&mut t, &[], 16).unwrap();
    assert_eq!((t.len(), m.num_free_blocks()), (8, 8), "a page per block and group");
    m.cache_blocks(&mut t, &h);
    // Only group 0's pages are published: their hash is the block's.
    assert_eq!(m.take_kv_events(), vec![KvEvent::Stored(h.clone())]);
    let held = t.blocks.clone();
    // From position 16 a window of 8 sees positions 9.. : blocks 0 and 1 are passed.
    m.release_passed(&mut t, 16);
    let nil = u32::MAX;
    assert_eq!(t.blocks, [held[0], nil, held[2], nil, held[4], held[5], held[6], held[7]]);
    assert_eq!(m.num_free_blocks(), 10);
    m.check_invariants(&[&t], &[]).unwrap();
    // A second release at the same place changes nothing; a later one passes block 2.
    m.release_passed(&mut t, 16);
    assert_eq!(m.num_free_blocks(), 10);
    m.release_passed(&mut t, 20);
    assert_eq!(t.blocks[5], nil);
    assert_eq!(m.num_free_blocks(), 11);
    // Another request with the same prefix: its prompt's pages of both groups are still cached
    // (given back, not reused), so every block is a hit.
    assert_eq!(m.lookup_prefix(&h, true).len(), 8);
    // Growing, swapping and forking a table with given-back pages.
    m.append_slots(&mut t, 16, 21).unwrap();
    assert_eq!(t.len(), 12);
    let child = m.fork(&t);
    let (mut host, copies) = m.swap_out(&mut t).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(copies.len(), 9, "given-back pages are not swapped");
    let _ = host.len();
    m.check_invariants(&[&child], &[&host]).unwrap();
    let mut child = child;
    m.free(&mut child);
    m.free_host(&mut host);
    m.check_invariants(&[], &[]).unwrap();
    assert_eq!(m.num_free_blocks(), 16);
    assert!(m.take_kv_events().iter().all(|e| match e {
        KvEvent::Stored(v) | KvEvent::Removed(v) => v.iter().all(|x| h.contains(x)),
        KvEvent::Cleared => true,
    }));
}

#[test]
fn a_prefix_hit_needs_every_groups_page() {
    let mut m = BlockManager::new(9, BS, 0, true);
    m.set_kv_groups(vec![None, Some(4)]);
    let tokens: Vec<u32> = (0..8).collect();
    let h = hashes(&tokens);
    let mut t = BlockTable::default();
    m.allocate(&mut t, &[], 8).unwrap();
    m.cache_blocks(&mut t, &h);
    assert_eq!(m.lookup_prefix(&h, false).len(), 4);
    // Block 0's local page is passed at position 8 and goes back to the free queue, behind the
    // five never-used pages; taking six pages reuses it.
    let local0 = t.blocks[1];
    m.release_passed(&mut t, 8);
    let mut other = BlockTable::default();
    m.allocate(&mut other, &[], 3 * BS).unwrap();
    assert!(other.blocks.contains(&local0));
    // Block 0's global page is still cached (t holds it), its local one is gone: no hit at all.
    assert!(m.lookup_prefix(&h, false).is_empty());
    // A sequence that runs here continues at position 8, where a window of 4 sees block 1
    // only: both blocks are a hit, block 0 without its local page.
    let nil = u32::MAX;
    let hit = m.lookup_prefix_in_window(&h, false);
    assert_eq!(hit, [t.blocks[0], nil, t.blocks[2], t.blocks[3]]);
    m.free(&mut other);
    let mut third = BlockTable::default();
    let free = m.num_free_blocks();
    m.allocate(&mut third, &hit, 9).unwrap();
    assert_eq!(third.blocks[..4], hit[..]);
    assert_eq!(m.num_free_blocks(), free - 2, "only block 2's pages are new");
    m.check_invariants(&[&t, &third], &[]).unwrap();
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
