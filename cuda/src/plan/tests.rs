use super::*;

#[test]
fn small_tiles_for_decode_except_large_steps_of_groups_of_eight() {
    // Prefill tiles (more than 8 rows) never take the small-tile kernel.
    assert!(!small_tiles(16, 2, 4));
    // Groups of 2 and 4 (Qwen3, Llama-3-8B): decode tiles at every step size.
    assert!(small_tiles(2, 2, 8 * 256));
    assert!(small_tiles(4, 4, 8 * 256));
    // Groups of 8 (the 70B shape on 2 or 4 GPUs): small steps only.
    assert!(small_tiles(8, 8, 64 * 2));
    assert!(small_tiles(8, 8, 255));
    assert!(!small_tiles(8, 8, 256));
    assert!(!small_tiles(8, 8, 256 * 4));
}
use tandem_engine::backend::Logits;

fn batch() -> ForwardBatch {
    let mut b = ForwardBatch::default();
    // A 40-token prefill chunk after 10 cached tokens, then a decode step.
    let toks: Vec<u32> = (0..40).collect();
    b.push_seq(&toks, 10, &[3, 4, 5, 6], 16, Logits::Last);
    b.push_seq(&[7], 20, &[9, 8], 16, Logits::Last);
    b
}

#[test]
fn tiles_cover_every_row_once_within_the_row_limit() {
    let b = batch();
    let group = 3;
    let p = BatchPlan::new(&b, group, usize::MAX);
    let mut covered = vec![0; b.num_tokens()];
    for t in p.tiles.chunks_exact(TILE_INTS) {
        let (row0, n, pos0) = (t[0] as usize, t[1] as usize, t[2] as usize);
        assert!(n * group <= ATT_MAX_ROWS && n > 0);
        for (r, c) in covered.iter_mut().enumerate().skip(row0).take(n) {
            *c += 1;
            assert_eq!(
                b.positions[r] as usize,
                pos0 + (r - row0),
                "tile positions follow the batch"
            );
        }
        let off = t[3] as usize;
        let seq = b
            .seqs
            .iter()
            .position(|s| (s.query_start..s.query_start + s.query_len).contains(&row0))
            .unwrap();
        assert_eq!(
            &p.block_tables[off..off + b.seqs[seq].block_table.len()],
            &b.seqs[seq].block_table.iter().map(|&x| x as i32).collect::<Vec<_>>()[..]
        );
    }
    assert!(covered.iter().all(|&c| c == 1));
    assert_eq!(p.num_tiles(), 40usize.div_ceil(ATT_MAX_ROWS / group) + 1);
    assert_eq!(p.max_context, 50);
    assert_eq!(p.logits_rows, vec![39, 40]);
    assert_eq!(p.max_tile_rows(group), (ATT_MAX_ROWS / group) * group);
}

#[test]
fn long_chunks_leave_the_tiles() {
    let b = batch();
    let p = BatchPlan::new(&b, 3, 32);
    assert_eq!(p.long, vec![LongSeq { row0: 0, len: 40, pos0: 10, bt_off: 0 }]);
    assert_eq!(p.num_tiles(), 1, "only the decode step is tiled");
    assert_eq!(&p.tiles[..4], &[40, 1, 20, 4]);
    assert!(p.tiles.as_chunks::<TILE_INTS>().0.iter().all(|t| t[4] == 0), "one piece");
    assert_eq!(p.max_context, 50);
    assert_eq!(prefill_rows(), 64, "the default prefill tile (TANDEM_PF_WARPS unset)");
    // The long chunk as prefill tiles of 64 / 3 = 21 tokens: rows 0..21 and 21..40, the
    // longer context (positions up to 50) first.
    assert_eq!(p.long_tiles, vec![21, 19, 31, 0, 0, 0, 21, 10, 0, 0]);
    let p = BatchPlan::new(&b, 8, 32);
    // 64 / 8 = 8 tokens: rows 0..8, .., 32..40.
    assert_eq!(p.num_long_tiles(), 5);
    // Longest context first: rows 32..40 (positions up to 50) lead.
    assert_eq!(p.long_tiles[..5], [32, 8, 42, 0, 0]);
    assert_eq!(p.long_tiles[20..25], [0, 8, 10, 0, 0]);
}

#[test]
fn padded_decode_keeps_fixed_strides_and_inert_padding() {
    let mut b = ForwardBatch::default();
    b.push_seq(&[5], 16, &[2, 7], 16, Logits::Last);
    b.push_seq(&[6], 3, &[1], 16, Logits::Last);
    let p = BatchPlan::padded_decode(&b, 4, 8).unwrap();
    assert_eq!(p.tokens, vec![5, 6, 0, 0]);
    assert_eq!(p.slots, vec![7 * 16, 16 + 3, -1, -1]);
    // One KV group: tables at the stride of the longest (2 blocks), not of `max_blocks`.
    assert_eq!(&p.tiles[..10], &[0, 1, 16, 0, 0, 1, 1, 3, 2, 0]);
    assert_eq!(&p.tiles[10..], &[0; 10], "padding tiles have no rows");
    assert_eq!(p.block_tables, vec![2, 7, 1, 0, 0, 0, 0, 0]);
    assert_eq!(p.bt_stride, 4 * 2);
    // Not a decode step, too many sequences, or a table too long: no graph.
    assert!(BatchPlan::padded_decode(&batch(), 4, 8).is_none());
    assert!(BatchPlan::padded_decode(&b, 1, 8).is_none());
    assert!(BatchPlan::padded_decode(&b, 4, 1).is_none());
}

/// Tiles start longest context first, in graph-shaped plans and eager ones alike; each
/// still names its own rows and block table, and `batch_order` undoes the order.
#[test]
fn tiles_start_longest_context_first() {
    let mut b = ForwardBatch::default();
    for (i, ctx) in [3usize, 40, 17, 40, 9].into_iter().enumerate() {
        let blocks: Vec<u32> =
            (0..(ctx + 1).div_ceil(16) as u32).map(|j| 10 * i as u32 + j).collect();
        b.push_seq(&[i as u32], ctx, &blocks, 16, Logits::Last);
    }
    let g = BatchPlan::padded_decode(&b, 8, 4).unwrap();
    let rows: Vec<i32> = g.tiles.chunks_exact(TILE_INTS).map(|t| t[0]).collect();
    let ctx: Vec<i32> = g.tiles.chunks_exact(TILE_INTS).map(|t| t[1] + t[2]).collect();
    // Ties keep the batch's order; padding (no rows) last.
    assert_eq!(&rows[..5], &[1, 3, 2, 4, 0]);
    assert_eq!(&ctx[..5], &[41, 41, 18, 10, 4]);
    assert!(g.tiles[5 * TILE_INTS..].iter().all(|&x| x == 0));
    for t in g.tiles.chunks_exact(TILE_INTS).take(5) {
        assert_eq!(t[3], t[0] * 3, "row i keeps sequence i's block table");
        assert_eq!(g.block_tables[t[3] as usize], 10 * t[0]);
    }
    let e = BatchPlan::new(&b, 1, usize::MAX);
    let eager: Vec<(i32, i32)> =
        e.tiles.chunks_exact(TILE_INTS).map(|t| (t[0], t[1] + t[2])).collect();
    assert_eq!(eager, vec![(1, 41), (3, 41), (2, 18), (4, 10), (0, 4)]);
    let mut undone = g.tiles.clone();
    batch_order(&mut undone);
    let rows: Vec<i32> = undone.chunks_exact(TILE_INTS).take(5).map(|t| t[0]).collect();
    assert_eq!(rows, vec![0, 1, 2, 3, 4]);
    assert!(undone[5 * TILE_INTS..].iter().all(|&x| x == 0));
}

/// Two KV groups: each group's slots and block tables in a section of their own, tile
/// offsets valid in every section, given-back pages read as page 0.
#[test]
fn kv_groups_get_sections_of_their_own() {
    let nb = NO_PAGE;
    let mut b = ForwardBatch::with_kv_groups(2);
    // 40 tokens from position 10 over blocks (3 | 4), (13 | 5), (6 | 7), (8 | 9); then a
    // decode token at position 20 whose first block group 0 gave back.
    let toks: Vec<u32> = (0..40).collect();
    b.push_seq(&toks, 10, &[3, 4, 13, 5, 6, 7, 8, 9], 16, Logits::Last);
    b.push_seq(&[7], 20, &[nb, 2, 11, 12], 16, Logits::Last);
    let p = BatchPlan::new(&b, 1, usize::MAX);
    assert_eq!((p.slot_stride, p.bt_stride), (41, 6));
    assert_eq!(p.block_tables, vec![3, 13, 6, 8, 0, 11, 4, 5, 7, 9, 2, 12]);
    assert_eq!((p.slots[0], p.slots[41]), (3 * 16 + 10, 4 * 16 + 10));
    assert_eq!((p.slots[40], p.slots[81]), (11 * 16 + 4, 12 * 16 + 4));
    let last = p.tiles.chunks_exact(TILE_INTS).last().unwrap();
    assert_eq!(last[3], 4, "the second sequence's table follows the first's four blocks");
    let mut d = ForwardBatch::with_kv_groups(2);
    d.push_seq(&[7], 20, &[nb, 2, 11, 12], 16, Logits::Last);
    let g = BatchPlan::padded_decode(&d, 2, 3).unwrap();
    assert_eq!((g.slot_stride, g.bt_stride), (2, 6));
    assert_eq!(g.slots, vec![11 * 16 + 4, -1, 12 * 16 + 4, -1]);
    assert_eq!(g.block_tables, vec![0, 11, 0, 0, 0, 0, 2, 12, 0, 0, 0, 0]);
    assert!(BatchPlan::padded_decode(&d, 2, 1).is_none(), "two blocks per group");
}

#[test]
fn kv_layout_keeps_a_heads_block_contiguous() {
    let (nkv, hd, bs) = (3, 8, 4);
    // Slots 0..4 (block 0) of head 1 follow each other; block 1 starts after all heads.
    let idx: Vec<usize> = (0..4).map(|s| kv_index(s, 1, nkv, hd, bs)).collect();
    assert_eq!(idx, vec![32, 40, 48, 56]);
    assert_eq!(kv_index(4, 0, nkv, hd, bs), nkv * bs * hd);
    // Every (slot, head) gets its own run of hd values.
    let mut all: Vec<usize> =
        (0..8).flat_map(|s| (0..nkv).map(move |h| kv_index(s, h, nkv, hd, bs))).collect();
    all.sort();
    assert!(all.windows(2).all(|w| w[1] - w[0] == hd));
}

/// Positions `[c0, c1)` that split `s` of `n` attends in a context of `ctx` positions: the
/// kernels' `tile_range` (split lengths a multiple of `ATT_BK`, 32; the last may be empty).
fn split_range(ctx: usize, s: usize, n: usize) -> (usize, usize) {
    let chunk = ctx.div_ceil(n.max(1)).next_multiple_of(32);
    ((s * chunk).min(ctx), ((s + 1) * chunk).min(ctx))
}

/// A decode batch of one token per context.
fn decode_batch(contexts: &[usize]) -> ForwardBatch {
    let mut b = ForwardBatch::default();
    for (i, &c) in contexts.iter().enumerate() {
        let blocks: Vec<u32> = (0..c.div_ceil(16) as u32).collect();
        b.push_seq(&[i as u32], c - 1, &blocks, 16, Logits::Last);
    }
    b
}

/// Every tile's context is covered once by its entries' ranges, and the entries of one
/// tile agree on their count.
fn assert_covers(p: &BatchPlan, contexts: &[usize]) {
    let mut seen = vec![Vec::new(); contexts.len()];
    for t in p.tiles.as_chunks::<TILE_INTS>().0.iter().filter(|t| t[1] > 0) {
        let (n, s) = (((t[4] & 255).max(1)) as usize, (t[4] >> 8) as usize);
        assert_eq!((t[1] + t[2]) as usize, contexts[t[0] as usize]);
        seen[t[0] as usize].push((split_range(contexts[t[0] as usize], s, n), n));
    }
    for (i, pieces) in seen.iter_mut().enumerate() {
        pieces.sort();
        assert!(pieces.iter().all(|&(_, n)| n == pieces.len()), "context {i}: {pieces:?}");
        let ranges: Vec<(usize, usize)> = pieces.iter().map(|&(r, _)| r).collect();
        let mut at = 0;
        for &(c0, c1) in ranges.iter() {
            assert_eq!(c0, at.min(contexts[i]), "context {i}: ranges {ranges:?}");
            at = at.max(c1);
        }
        assert_eq!(at, contexts[i], "context {i} covered to its end");
    }
}

/// Split entries cover each context once, in the tiles' order, and fit the grid of the
/// graph they were sized for: a replay's contexts are never longer than the capture's.
#[test]
fn split_entries_cover_each_context_once_and_fit_the_graph() {
    let contexts = [40, 1000, 17, 300];
    let mut p = BatchPlan::new(&decode_batch(&contexts), 2, usize::MAX);
    p.split_contexts(3, None);
    assert_eq!(p.num_tiles(), 12);
    assert_covers(&p, &contexts);
    let rows: Vec<i32> = p.tiles.as_chunks::<TILE_INTS>().0.iter().map(|t| t[0]).collect();
    assert_eq!(rows, vec![1, 1, 1, 3, 3, 3, 0, 0, 0, 2, 2, 2], "longest context first");
    assert_eq!(split_range(40, 2, 3), (40, 40), "a short context's last split is empty");
    p.split_contexts(1, None);
    assert!(p.tiles.as_chunks::<TILE_INTS>().0.iter().all(|t| t[4] == 0), "one piece");
    let (size, max_len) = (16, 4096);
    let cap = size * attention_splits(size, 8, max_len, 132);
    for ctx in [[1usize; 9], [4096; 9], [130; 9]] {
        let mut g = BatchPlan::padded_decode(&decode_batch(&ctx), size, 256).unwrap();
        let n = attention_splits(size, 8, g.max_context, 132);
        g.split_contexts(n, Some(cap));
        assert_eq!(g.num_tiles(), cap);
        assert_covers(&g, &ctx);
        let live = g.tiles.as_chunks::<TILE_INTS>().0.iter().filter(|t| t[1] > 0).count();
        assert_eq!(live, 9 * n);
    }
}

const LIM: MixedLimits = MixedLimits {
    split_rows: 512,
    split_ctas: 264,
    num_kv_heads: 3,
    long_tile_tokens: 21,
    long_min: 64,
    max_rows: 1024,
};

#[test]
fn mixed_shapes_round_up_and_padding_is_inert() {
    // 254 decode rows and two 108-token prompts, 256 logits rows.
    let s = MixedShape::holding(470, 256, true, false, &LIM).unwrap();
    assert_eq!((s.rows, s.entries, s.long_entries, s.logits), (512, 512 + 88, 25 + 8, 256));
    // Nearby steps share the shape; logits rows beyond 256 go up in 128s.
    assert_eq!(MixedShape::holding(449, 250, true, false, &LIM), Some(s));
    // A step with chunks for the prefill kernel takes a graph of its own: the graph of one
    // without them launches no prefill kernel and ropes rows inside the small-tile kernel.
    assert_ne!(MixedShape::holding(470, 256, true, true, &LIM), Some(s));
    assert_eq!(MixedShape::holding(600, 300, true, false, &LIM).unwrap().logits, 384);
    assert_eq!(MixedShape::holding(600, 300, true, false, &LIM).unwrap().entries, 640);
    assert_eq!(MixedShape::holding(3, 3, true, false, &LIM).unwrap().logits, 64);
    assert!(MixedShape::holding(1025, 1, true, false, &LIM).is_none());
    // A larger limit: rows above 1,024 go up in 256s, up to the limit.
    let big = MixedLimits { max_rows: 8192, ..LIM };
    let s = MixedShape::holding(3900, 300, false, false, &big).unwrap();
    assert_eq!((s.rows, s.entries, s.logits), (4096, 4096, 384));
    assert_eq!(MixedShape::holding(1025, 1, false, false, &big).unwrap().rows, 1280);
    assert_eq!(MixedShape::holding(8192, 1, false, false, &big).unwrap().rows, 8192);
    assert!(MixedShape::holding(8193, 1, false, false, &big).is_none());
    assert!(MixedShape::holding(0, 0, true, false, &LIM).is_none());
    let mut b = batch();
    b.push_seq(&(0..80).collect::<Vec<u32>>(), 0, &[4, 5, 6, 7, 8], 16, Logits::Last);
    let mut p = BatchPlan::new(&b, 2, 64);
    let before = p.clone();
    let lim = MixedLimits { num_kv_heads: 8, long_tile_tokens: 32, ..LIM };
    let shape =
        MixedShape::holding(p.tokens.len(), p.logits_rows.len(), false, true, &lim).unwrap();
    p.pad_to(&shape);
    assert_eq!(p.tokens.len(), 128);
    assert_eq!(&p.tokens[..before.tokens.len()], &before.tokens[..]);
    assert_eq!(&p.slots[..before.slots.len()], &before.slots[..]);
    assert!(p.slots[before.slots.len()..].iter().all(|&s| s == -1), "padding stores nothing");
    assert_eq!(p.slot_stride, 128);
    assert_eq!(p.num_tiles(), 128 + 33);
    assert_eq!(p.num_long_tiles(), 4 + 2);
    let rows = |t: &[i32]| t.chunks_exact(TILE_INTS).map(|t| t[1]).sum::<i32>();
    assert_eq!(rows(&p.tiles), rows(&before.tiles), "padding tiles have no rows");
    assert_eq!(rows(&p.long_tiles), 80);
    assert_eq!(&p.logits_rows[..before.logits_rows.len()], &before.logits_rows[..]);
    assert_eq!(p.logits_rows.len(), 64);
    assert!(p.logits_rows[before.logits_rows.len()..].iter().all(|&r| r == 0));
    assert_eq!(p.block_tables, before.block_tables);
}

/// The grids a shape fixes hold every plan of its rows: decode rows with contexts split as
/// `attention_splits` cuts them, and long chunks of every length from `long_min` up.
#[test]
fn mixed_grids_hold_every_plan_of_their_rows() {
    for (nkv, sms, group) in [(3, 132, 3), (8, 132, 2), (8, 78, 4), (1, 132, 8)] {
        let lim = MixedLimits {
            split_rows: 512,
            split_ctas: split_ctas_per_sm_max() * sms,
            num_kv_heads: nkv,
            long_tile_tokens: 64 / group,
            long_min: 64,
            max_rows: 8192,
        };
        for tiles in (1..=1024).chain((1025..=8192).step_by(37)) {
            let s = MixedShape::holding(tiles, tiles, true, false, &lim).unwrap();
            let splits = match tiles > lim.split_rows {
                true => 1,
                false => attention_splits(tiles, nkv, 1 << 20, sms).min(16),
            };
            assert!(tiles * splits <= s.entries, "{tiles} tiles x {splits} > {}", s.entries);
        }
        for len in [64, 65, 100, 127, 128, 200, 1000] {
            for n in 1..=8192 / len {
                let per = lim.long_tile_tokens;
                let s = MixedShape::holding(n * len, 1, false, true, &lim).unwrap();
                assert!(n * len.div_ceil(per) <= s.long_entries, "{n} chunks of {len}");
            }
        }
    }
}

#[test]
fn sizing_rules() {
    assert_eq!(graph_batch_sizes(40), vec![1, 2, 4, 8, 16, 32]);
    assert_eq!(graph_batch_sizes(512).len(), 4 + 32);
    assert_eq!(graph_size_for(&graph_batch_sizes(64), 9), Some(16));
    assert_eq!(graph_size_for(&graph_batch_sizes(64), 65), None);
    // One sequence, 8 KV heads, long context: split to fill 132 SMs, capped at 16.
    assert_eq!(attention_splits(1, 8, 4096, 132), 16);
    // Short context: never below 128 positions per split.
    assert_eq!(attention_splits(1, 8, 300, 132), 3);
    // A big batch already fills the GPU.
    assert_eq!(attention_splits(256, 8, 1024, 132), 1);
    // About two CTAs an SM, or up to four where three pieces or fewer get there: 16 sequences
    // × 8 KV heads in 3 (not 5), 32 in 3, 48 and 64 in 2, 96 whole.
    if split_ctas_per_sm().is_none() {
        let cuts: Vec<usize> =
            [16, 32, 48, 64, 96].map(|b| attention_splits(b, 8, 1024, 132)).to_vec();
        assert_eq!(cuts, vec![3, 3, 2, 2, 1]);
    }
    // 80 units, 50 % allowed, 10 used by weights, slack 2: 28 units of pool.
    assert_eq!(kv_blocks_for(80_000, 70_000, 10_000, 0.5, 2_000, 1_000), 28);
    // A second process at 40 % after the first took 40 of the 80: its own 40 % still fits.
    assert_eq!(kv_blocks_for(80_000, 40_000, 8_000, 0.4, 2_000, 1_000), 22);
    // Never more than is free, nothing when weights alone exceed the share.
    assert_eq!(kv_blocks_for(80_000, 5_000, 8_000, 0.9, 2_000, 1_000), 3);
    assert_eq!(kv_blocks_for(80_000, 70_000, 50_000, 0.5, 2_000, 1_000), 0);
}
