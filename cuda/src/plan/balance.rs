//! Context splits by length: each decode tile's context cut into pieces of about one length
//! for the whole step (long contexts into more pieces than short ones), instead of every tile
//! into the same number. Decode graphs of at most [`by_length_max`] sequences cut this way, on
//! the grid the uniform rule gives them: on one H200 (Qwen3-0.6B shape, random bf16 weights,
//! decode graphs, `attention_dec_rope128`, cuBLAS GEMMs; contexts 100–2,048)
//! the step of 8 / 16 sequences took 1.385 / 1.637 ms against 1.402–1.407 / 1.670 cut evenly
//! (4: 1.394 against 1.380–1.386); at 32 to 256 sequences the cut by length was 1–9 % slower,
//! with or without a larger grid
//! (docs/gpu-runs/h200-2026-12-02-balanced-splits/).

use super::{env_count, BatchPlan, TILE_INTS};

/// The attention kernels' split granularity (`ATT_BK` in kernels/attention.cu): a split's
/// positions start at a multiple of this.
const SPLIT_ALIGN: usize = 32;
/// Most splits of one context (`ATT_MAX_SPLITS` in kernels/attention.cu), either rule.
pub const MAX_SPLITS: usize = 16;
/// The shortest split either rule cuts (the uniform rule's [`super::attention_splits`] too).
pub const MIN_PIECE: usize = 128;

/// The largest decode graph (sequences) whose contexts are cut by length: 16, or
/// `TANDEM_SPLIT_BY_LENGTH_MAX` (0 to 512; 0 cuts every graph's contexts evenly) for comparison.
pub fn by_length_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| env_count("TANDEM_SPLIT_BY_LENGTH_MAX", |n| *n <= 512, 16))
}

/// The positions `[c0, c1)` piece `s` of `n` attends in a context of `ctx` (the kernels'
/// `tile_range`).
pub fn piece(ctx: usize, s: usize, n: usize) -> (usize, usize) {
    let chunk = ctx.div_ceil(n.max(1)).next_multiple_of(SPLIT_ALIGN);
    let c0 = ctx.min(s * chunk);
    (c0, ctx.min(c0 + chunk))
}

/// Pieces of a context of `ctx` positions at piece length `len`.
fn pieces(ctx: usize, len: usize) -> usize {
    ctx.div_ceil(len).clamp(1, MAX_SPLITS)
}

impl BatchPlan {
    /// Cuts each tile's context into pieces of one length, the shortest (a multiple of 32, at
    /// least `min_len`) for which the step's entries fit `entries`, then lists the entries
    /// longest piece first, padded with empty ones to `entries`.
    pub fn split_balanced(&mut self, min_len: usize, entries: usize) {
        let tiles: Vec<[i32; TILE_INTS]> =
            self.tiles.as_chunks::<TILE_INTS>().0.iter().filter(|t| t[1] > 0).copied().collect();
        let ctx = |t: &[i32; TILE_INTS]| (t[1] + t[2]) as usize;
        assert!(tiles.len() <= entries, "more tiles than the graph's grid holds");
        let longest = tiles.iter().map(ctx).max().unwrap_or(1).max(1);
        let fits = |len: usize| tiles.iter().map(|t| pieces(ctx(t), len)).sum::<usize>() <= entries;
        // Smallest fitting length, in steps of SPLIT_ALIGN: the count of entries only falls as
        // the length grows, and at the longest context every tile is one entry.
        let (mut lo, mut hi) =
            (min_len.div_ceil(SPLIT_ALIGN).max(1), longest.div_ceil(SPLIT_ALIGN));
        hi = hi.max(lo);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fits(mid * SPLIT_ALIGN) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let len = lo * SPLIT_ALIGN;
        let mut out: Vec<(usize, [i32; TILE_INTS])> = Vec::with_capacity(entries);
        for t in &tiles {
            let c = ctx(t);
            let n = pieces(c, len);
            for s in 0..n {
                let (c0, c1) = piece(c, s, n);
                let part = if n > 1 { (s << 8 | n) as i32 } else { 0 };
                out.push((c1 - c0, [t[0], t[1], t[2], t[3], part]));
            }
        }
        // Stable: a tile's pieces of equal length stay together.
        out.sort_by_key(|(l, _)| std::cmp::Reverse(*l));
        self.tiles = out.iter().flat_map(|(_, t)| *t).collect();
        self.tiles.resize(entries * TILE_INTS, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(contexts: &[usize]) -> BatchPlan {
        let mut p = BatchPlan::default();
        for (i, &c) in contexts.iter().enumerate() {
            p.tiles.extend_from_slice(&[i as i32, 1, c as i32 - 1, (i * 200) as i32, 0]);
        }
        p
    }

    /// Every context is covered once by its pieces, no piece is longer than the fitted length
    /// needs, entries fit the grid, and longer pieces come first.
    #[test]
    fn pieces_cover_each_context_once_within_the_grid() {
        let contexts: Vec<usize> = (0..64).map(|i| 100 + i * 1948 / 63).collect();
        for entries in [64, 96, 128, 256, 1024] {
            let mut p = plan(&contexts);
            p.split_balanced(256, entries);
            assert_eq!(p.tiles.len(), entries * TILE_INTS);
            let mut covered = vec![0usize; contexts.len()];
            let mut last_len = usize::MAX;
            for t in p.tiles.as_chunks::<TILE_INTS>().0.iter().filter(|t| t[1] > 0) {
                let (row, ctx) = (t[0] as usize, (t[1] + t[2]) as usize);
                let n = (t[4] & 255).max(1) as usize;
                let (c0, c1) = piece(ctx, (t[4] >> 8) as usize, n);
                assert!(c1 - c0 <= last_len, "pieces listed longest first");
                last_len = c1 - c0;
                covered[row] += c1 - c0;
            }
            assert_eq!(covered, contexts, "entries {entries}");
            // No context in more pieces than pieces of the shortest length (256) make.
            for (row, &c) in contexts.iter().enumerate() {
                let n = p.tiles.as_chunks::<TILE_INTS>().0.iter();
                let n = n.filter(|t| t[1] > 0 && t[0] == row as i32).count();
                assert!(n <= c.div_ceil(256), "context {c} in {n} pieces at entries {entries}");
            }
        }
        // With room for twice the sequences, the longest context is cut and the shortest not.
        let mut p = plan(&contexts);
        p.split_balanced(256, 128);
        let parts = |row: i32| {
            p.tiles.as_chunks::<TILE_INTS>().0.iter().filter(|t| t[1] > 0 && t[0] == row).count()
        };
        assert!(parts(63) >= 3, "the 2,048-position context in {} pieces", parts(63));
        assert_eq!(parts(0), 1);
    }

    /// The fitted length is the shortest that fits: one alignment step shorter would not.
    #[test]
    fn the_piece_length_is_the_shortest_that_fits() {
        let contexts: Vec<usize> = (0..64).map(|i| 100 + i * 1948 / 63).collect();
        let mut p = plan(&contexts);
        p.split_balanced(32, 128);
        let used = p.tiles.as_chunks::<TILE_INTS>().0.iter().filter(|t| t[1] > 0).count();
        assert!(used <= 128);
        let longest_piece = p
            .tiles
            .as_chunks::<TILE_INTS>()
            .0
            .iter()
            .filter(|t| t[1] > 0)
            .map(|t| {
                let ctx = (t[1] + t[2]) as usize;
                let (c0, c1) = piece(ctx, (t[4] >> 8) as usize, (t[4] & 255).max(1) as usize);
                c1 - c0
            })
            .max()
            .unwrap();
        let total = |len: usize| contexts.iter().map(|&c| pieces(c, len)).sum::<usize>();
        let len = (32..=2048).step_by(32).find(|&l| total(l) <= 128).unwrap();
        assert!(total(len) <= 128 && (len == 32 || total(len - 32) > 128));
        assert!(longest_piece <= len + SPLIT_ALIGN, "{longest_piece} against {len}");
    }
}
