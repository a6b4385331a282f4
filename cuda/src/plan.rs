//! `BatchPlan`: the host-side packing of a [`ForwardBatch`] into the flat integer arrays the
//! kernels read (token ids, positions, slots, attention tiles, block tables), plus the sizing
//! rules of the backend (how many attention splits, which batch sizes get a CUDA graph, how many
//! KV blocks fit). Pure Rust, so it is tested without a GPU.

use tandem_engine::backend::{ForwardBatch, NO_PAGE};

mod balance;
pub use balance::{by_length_max, MAX_SPLITS, MIN_PIECE};

/// Query rows (tokens × query heads of one KV head) one attention CTA holds; matches
/// `ATT_MAX_ROWS` in kernels/attention.cu.
pub const ATT_MAX_ROWS: usize = 16;
/// `var` as a count when `ok` accepts it, else `default` (the comparison switches below).
fn env_count(var: &str, ok: impl Fn(&usize) -> bool, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).filter(ok).unwrap_or(default)
}
/// Warps of the flash-attention prefill kernel's CTA (`PF_WARPS`, which the host passes to
/// the kernels' compiler), each owning 16 query rows of the tile; `TANDEM_PF_WARPS` (2, 4 or 8)
/// overrides it for comparison.
pub fn prefill_warps() -> usize {
    static WARPS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WARPS.get_or_init(|| env_count("TANDEM_PF_WARPS", |w| matches!(w, 2 | 4 | 8), 4))
}
/// Pages each warp of the tensor-core decode kernel holds in shared memory (`MMA_STAGES`, which
/// the host passes to the kernels' compiler): the one it works on and the rest copied ahead;
/// `TANDEM_MMA_STAGES` (2, 3 or 4) overrides the default of 2 for comparison.
pub fn decode_stages() -> usize {
    static STAGES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *STAGES.get_or_init(|| env_count("TANDEM_MMA_STAGES", |s| matches!(s, 2..=4), 2))
}
/// Whether the fused decode kernels (`attention_dec_rope64/128`) issue their first page copies
/// before they wait for the q|k|v GEMM, launched as its programmatic dependents (the default;
/// `TANDEM_DEC_EARLY_COPIES=off` waits at entry and launches them plainly, for comparison).
pub fn dec_early_copies() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_DEC_EARLY_COPIES").as_deref() != Ok("off"))
}

/// Dynamic shared memory of the tensor-core decode kernel for heads of width `hd`: two warps'
/// stages of K and V pages of 16 rows, each row padded by 8 elements (kernels/attention_mma.cu's `LD`).
pub fn decode_smem_bytes(hd: usize) -> u32 {
    (2 * decode_stages() * 2 * 16 * (hd + 8) * 2) as u32
}
/// Warps of the small-tile tensor-core decode kernel's CTA for heads `hd` wide (`DEC_WARPS64`,
/// `DEC_WARPS128`, passed to the kernels' compiler): 4 for heads 128 wide, 2 for 64;
/// `TANDEM_DEC_WARPS` (1, 2 or 4) sets both for comparison. Four warps keep twice the pages
/// of a long context in flight as two: on an H100, Qwen3-0.6B's steps over contexts of
/// 100–2,048 positions took 1–4 % less at batch 1–256 and the 8B shape's stayed within 0.8 %;
/// the SmolLM2-135M shape's (heads 64 wide, contexts 100–300) took 5 % more at batch 256
/// (docs/gpu-runs/h100-2026-11-28-step-kernels/).
pub fn dec_warps(hd: usize) -> usize {
    static WARPS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // 0: not set.
    match *WARPS.get_or_init(|| env_count("TANDEM_DEC_WARPS", |w| matches!(w, 1 | 2 | 4), 0)) {
        0 if hd <= 64 => 2,
        0 => 4,
        w => w,
    }
}
/// Whether a step's attention tiles of at most `rows` query rows, `group` query heads a KV head
/// and `pairs` (sequence, KV head) pairs take the small-tile kernel: tiles of up to 8 rows,
/// except where 8 or more query heads share a KV head and the step has 256 pairs or more —
/// there the 16-row kernel measured faster on H200s (Llama-3-70B shape, context 1024: TP=2
/// batch 64 26.2 against 27.1 ms, TP=4 batch 256 31.1 against 33.3; slower at batch 1 and
/// 16; `docs/gpu-runs/h200x4-2026-11-28e-two-shot/`).
pub fn small_tiles(rows: usize, group: usize, pairs: usize) -> bool {
    rows <= 8 && !(group >= 8 && pairs >= 256)
}
/// Dynamic shared memory of the small-tile decode kernel (`attention_dec*`): each warp's
/// stages of K and V pages, as [`decode_smem_bytes`] per warp (its end-of-kernel exchange of
/// per-warp results, at most 8 rows of f32 per warp, fits in the same bytes).
pub fn dec_smem_bytes(hd: usize) -> u32 {
    (dec_warps(hd) * decode_stages() * 2 * 16 * (hd + 8) * 2) as u32
}
/// Query rows of one tile of the prefill kernel.
pub fn prefill_rows() -> usize {
    16 * prefill_warps()
}
/// Threads of the prefill kernel's CTA.
pub fn prefill_threads() -> u32 {
    32 * prefill_warps() as u32
}
/// Largest head width the attention kernel supports; matches `ATT_MAX_HD`.
pub const ATT_MAX_HEAD_DIM: usize = 128;
/// Ints per tile descriptor.
pub const TILE_INTS: usize = 5;

/// Element offset of K (or V) for cache `slot`, KV head `kvh` in one layer's cache: blocks are
/// laid out `[kv_head][offset][head_dim]`, so one head's keys of a block are contiguous (the
/// kernels' `kv_index`).
pub fn kv_index(slot: usize, kvh: usize, nkv: usize, hd: usize, block_size: usize) -> usize {
    let (b, off) = (slot / block_size, slot % block_size);
    ((b * nkv + kvh) * block_size + off) * hd
}

/// A sequence whose chunk is long enough to attend through cuBLAS GEMMs instead of the tile
/// kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongSeq {
    /// First batch row.
    pub row0: usize,
    /// Tokens in the chunk.
    pub len: usize,
    /// Position of the first.
    pub pos0: usize,
    /// Offset of its block table in `block_tables`.
    pub bt_off: usize,
}

/// A forward batch as the kernels see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchPlan {
    /// Token ids, one per batch row.
    pub tokens: Vec<i32>,
    /// Position of each row.
    pub positions: Vec<i32>,
    /// KV slot each row's K and V go to (-1: not stored), one section of [`BatchPlan::slot_stride`]
    /// rows per KV group (the layers of group `g` store at section `g`).
    pub slots: Vec<i32>,
    /// Attention tiles, [`TILE_INTS`] ints each: first row, rows, first position, block-table
    /// offset (within a group's section), and which split of the tile's context the entry is
    /// (`split << 8 | splits`; 0 for a tile in one piece). [`BatchPlan::split_contexts`] cuts
    /// tiles into one entry per split.
    pub tiles: Vec<i32>,
    /// Every sequence's block table, one after another (or at fixed strides for a graph), one
    /// section of [`BatchPlan::bt_stride`] entries per KV group. A page the block manager gave
    /// back ([`NO_PAGE`]: before its group's window) reads as page 0: the kernels mask those
    /// positions, and every page holds finite values.
    pub block_tables: Vec<i32>,
    /// Entries of one KV group's section of `slots`.
    pub slot_stride: usize,
    /// Entries of one KV group's section of `block_tables`.
    pub bt_stride: usize,
    /// Rows whose logits are wanted.
    pub logits_rows: Vec<i32>,
    /// Longest context of any sequence.
    pub max_context: usize,
    /// Sequences left to the long-chunk attention paths (no tiles of their own in `tiles`).
    pub long: Vec<LongSeq>,
    /// The long sequences' rows as tiles of the prefill kernel (up to [`prefill_rows`] query
    /// rows each), in the layout of [`BatchPlan::tiles`]; uploaded after them.
    pub long_tiles: Vec<i32>,
}

impl BatchPlan {
    /// Packs `b` for a model whose KV heads each serve `group` query heads; chunks of at least
    /// `long_min` tokens go to the GEMM attention path.
    pub fn new(b: &ForwardBatch, group: usize, long_min: usize) -> BatchPlan {
        let per_tile = (ATT_MAX_ROWS / group.max(1)).max(1);
        let per_long_tile = (prefill_rows() / group.max(1)).max(1);
        let (t, groups) = (b.token_ids.len(), b.kv_groups.max(1));
        let mut p = BatchPlan {
            tokens: b.token_ids.iter().map(|&t| t as i32).collect(),
            positions: b.positions.iter().map(|&x| x as i32).collect(),
            slots: (0..groups)
                .flat_map(|g| (0..t).map(move |i| b.slot_mapping[i * groups + g] as i32))
                .collect(),
            logits_rows: b.logits_indices.iter().map(|&i| i as i32).collect(),
            slot_stride: t,
            bt_stride: b.seqs.iter().map(|s| s.block_table.len() / groups).sum(),
            ..Default::default()
        };
        p.block_tables = vec![0; groups * p.bt_stride];
        let mut next = 0;
        for s in &b.seqs {
            let bt_off = next as i32;
            for (i, &blk) in s.block_table.iter().enumerate() {
                p.block_tables[(i % groups) * p.bt_stride + next + i / groups] = page(blk);
            }
            next += s.block_table.len() / groups;
            let first_pos = s.context_len - s.query_len;
            p.max_context = p.max_context.max(s.context_len);
            if s.query_len >= long_min {
                p.long.push(LongSeq {
                    row0: s.query_start,
                    len: s.query_len,
                    pos0: first_pos,
                    bt_off: bt_off as usize,
                });
                push_tiles(
                    &mut p.long_tiles,
                    s.query_start,
                    s.query_len,
                    first_pos,
                    bt_off,
                    per_long_tile,
                );
                continue;
            }
            push_tiles(&mut p.tiles, s.query_start, s.query_len, first_pos, bt_off, per_tile);
        }
        longest_first(&mut p.tiles);
        longest_first(&mut p.long_tiles);
        p
    }

    /// Cuts each tile's context into `n` splits: an entry per split, in the tiles' order
    /// (longest context first). With `pad_to`, empty entries follow up to that many (a
    /// graph's fixed grid).
    pub fn split_contexts(&mut self, n: usize, pad_to: Option<usize>) {
        let n = n.clamp(1, 255);
        let mut out = Vec::with_capacity(self.tiles.len() * n);
        for t in self.tiles.as_chunks::<TILE_INTS>().0.iter().filter(|t| t[1] > 0) {
            for s in 0..n {
                let part = if n > 1 { (s << 8 | n) as i32 } else { 0 };
                out.extend_from_slice(&[t[0], t[1], t[2], t[3], part]);
            }
        }
        if let Some(m) = pad_to {
            assert!(out.len() <= m * TILE_INTS, "more splits than the graph's grid holds");
            out.resize(m * TILE_INTS, 0);
        }
        self.tiles = out;
    }

    /// Number of prefill-kernel tiles.
    pub fn num_long_tiles(&self) -> usize {
        self.long_tiles.len() / TILE_INTS
    }

    /// A decode batch padded to `graph_size` sequences, so a CUDA graph captured for that size
    /// reads every input from the same places. Padding rows attend nothing and store nothing.
    /// `None` when the batch is not a pure decode step or does not fit. The kernels find a
    /// sequence's block table through its tile, so with one KV group the tables sit at the
    /// stride of the batch's longest one and only those entries travel each step (a model's
    /// `max_model_len` of 40,960 positions made it 2.6 MB a step at 256 sequences); with
    /// several, each group's section starts at the fixed place a graph captured (`graph_size`
    /// sequences of `max_blocks`).
    pub fn padded_decode(
        b: &ForwardBatch,
        graph_size: usize,
        max_blocks: usize,
    ) -> Option<BatchPlan> {
        let (n, groups) = (b.seqs.len(), b.kv_groups.max(1));
        if n > graph_size
            || b.num_tokens() != n
            || b.seqs.iter().any(|s| s.query_len != 1 || s.block_table.len() > max_blocks * groups)
        {
            return None;
        }
        let longest = b.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0).max(1);
        let max_blocks = if groups == 1 { longest } else { max_blocks };
        let mut p = BatchPlan::inert(graph_size, max_blocks, groups);
        for (i, s) in b.seqs.iter().enumerate() {
            p.tokens[i] = b.token_ids[i] as i32;
            p.positions[i] = b.positions[i] as i32;
            for g in 0..groups {
                p.slots[g * graph_size + i] = b.slot_mapping[i * groups + g] as i32;
            }
            let off = i * max_blocks;
            for (j, &blk) in s.block_table.iter().enumerate() {
                p.block_tables[(j % groups) * p.bt_stride + off + j / groups] = page(blk);
            }
            p.tiles[i * TILE_INTS..(i + 1) * TILE_INTS].copy_from_slice(&[
                i as i32,
                1,
                (s.context_len - 1) as i32,
                off as i32,
                0,
            ]);
            p.max_context = p.max_context.max(s.context_len);
        }
        // Padding tiles attend nothing and stay last.
        longest_first(&mut p.tiles);
        // Every row's logits; padding rows' are ignored.
        p.logits_rows = (0..graph_size as i32).collect();
        Some(p)
    }

    /// A graph-shaped plan of `graph_size` padding rows (they attend nothing and store
    /// nothing), block tables at a stride of `max_blocks`, `groups` KV groups.
    pub fn inert(graph_size: usize, max_blocks: usize, groups: usize) -> BatchPlan {
        BatchPlan {
            tokens: vec![0; graph_size],
            positions: vec![0; graph_size],
            slots: vec![-1; groups * graph_size],
            tiles: vec![0; graph_size * TILE_INTS],
            block_tables: vec![0; groups * graph_size * max_blocks],
            slot_stride: graph_size,
            bt_stride: graph_size * max_blocks,
            logits_rows: Vec::new(),
            max_context: 0,
            long: Vec::new(),
            long_tiles: Vec::new(),
        }
    }

    /// Pads a plan of one KV group to `shape`: rows of token 0 at position 0 that store
    /// nothing, tile entries with no rows (the kernels return at once), logits rows that read
    /// row 0 again. The padded plan's grids are the shape's, so one graph serves every plan
    /// padded to it.
    pub fn pad_to(&mut self, shape: &MixedShape) {
        assert_eq!(self.slots.len(), self.slot_stride, "mixed-step graphs take one KV group");
        assert!(self.tokens.len() <= shape.rows && self.logits_rows.len() <= shape.logits);
        assert!(self.num_tiles() <= shape.entries && self.num_long_tiles() <= shape.long_entries);
        self.tokens.resize(shape.rows, 0);
        self.positions.resize(shape.rows, 0);
        self.slots.resize(shape.rows, -1);
        self.slot_stride = shape.rows;
        self.tiles.resize(shape.entries * TILE_INTS, 0);
        self.long_tiles.resize(shape.long_entries * TILE_INTS, 0);
        self.logits_rows.resize(shape.logits, 0);
    }

    /// Most query rows (tokens × `group`) of any tile.
    pub fn max_tile_rows(&self, group: usize) -> usize {
        self.tiles.chunks_exact(TILE_INTS).map(|t| t[1] as usize * group).max().unwrap_or(0)
    }

    /// Number of attention tiles.
    pub fn num_tiles(&self) -> usize {
        self.tiles.len() / TILE_INTS
    }
}

/// Most tokens of a step that runs through a mixed-step graph ([`MixedShape`]) by default
/// (within the step buffers). A small model's prompt steps of thousands of tokens launched one
/// kernel at a time wait on the host: served rounds on an H100 80GB HBM3 with the host short of
/// cores (SmolLM2-135M shape in f16, decode and mixed-step graphs, `attention_dec_rope64`) gave
/// 89 % of `bench engine` with graphs to 8,192 rows against 86 % with graphs to 1,024
/// (docs/gpu.md); on the device alone such a graph is 0.97–1.05× the eager step above ~2,000
/// rows (`tandem-gpu bench-mixed`, one H200), padding included.
pub const MIXED_GRAPH_MAX_ROWS: usize = 8192;

/// Most tokens of a step that runs through a mixed-step graph: [`MIXED_GRAPH_MAX_ROWS`], or
/// `TANDEM_MIXED_GRAPH_MAX_ROWS` (64 to 16,384; 1,024 was the default before) for comparison.
pub fn mixed_graph_max_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        env_count("TANDEM_MIXED_GRAPH_MAX_ROWS", |n| (64..=16384).contains(n), MIXED_GRAPH_MAX_ROWS)
    })
}

/// The launch shape of a step with prompt chunks (or a decode step no decode graph holds)
/// replayed from a CUDA graph. Rows go up in 64s to 1,024 and in 256s above (where the limit
/// allows steps that large), logits rows in 64s to 256, then in 128s;
/// the attention grids follow from the rows ([`MixedLimits`]), so the rows, the logits rows, the
/// tile kernel and whether there are long chunks name a graph: a server's steps need few of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MixedShape {
    /// Token rows (the GEMMs' M).
    pub rows: usize,
    /// Entries of the decode-tile attention kernels' grid.
    pub entries: usize,
    /// Tiles of the prefill kernel's grid.
    pub long_entries: usize,
    /// Rows through the final norm and the LM head.
    pub logits: usize,
    /// Whether the tiles take the small-tile kernel.
    pub small_tiles: bool,
    /// Whether the step has chunks for the prefill kernel. A graph launches that kernel, and
    /// runs q/k norm, RoPE and KV store as a kernel of their own rather than inside the
    /// small-tile kernel, only when the step it was captured from had such chunks: a graph of a
    /// step without them would leave a long chunk's rows unrotated, unstored and unattended.
    pub long_chunks: bool,
}

/// What bounds the attention grids of a step of a given number of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixedLimits {
    /// Steps of more rows than this never split contexts (the backend's `SPLIT_ROWS`).
    pub split_rows: usize,
    /// The most CTAs [`attention_splits`] aims at ([`split_ctas_per_sm_max`] per SM).
    pub split_ctas: usize,
    /// KV heads (one CTA each per tile entry).
    pub num_kv_heads: usize,
    /// Tokens of one prefill-kernel tile.
    pub long_tile_tokens: usize,
    /// Shortest chunk that goes to the prefill kernel.
    pub long_min: usize,
    /// Most rows of a step a graph holds ([`mixed_graph_max_rows`]).
    pub max_rows: usize,
}

impl MixedLimits {
    /// Most tile entries a step of `rows` rows makes: a tile per row at most, and where
    /// contexts split, `tiles · ⌈ctas / (tiles · kv_heads)⌉ < tiles + ctas / kv_heads`.
    pub fn max_entries(&self, rows: usize) -> usize {
        match rows > self.split_rows {
            true => rows,
            false => rows + self.split_ctas.div_ceil(self.num_kv_heads.max(1)),
        }
    }

    /// Most prefill-kernel tiles a step of `rows` rows makes: each long chunk of `len` tokens
    /// takes `⌈len / tile⌉ ≤ len / tile + 1` tiles, and there are at most `rows / long_min`.
    pub fn max_long_entries(&self, rows: usize) -> usize {
        rows.div_ceil(self.long_tile_tokens.max(1)) + rows / self.long_min.max(1)
    }
}

impl MixedShape {
    /// The shape that holds a step of `rows` tokens and `logits` logits rows (`small_tiles`:
    /// its tiles take the small-tile kernel; `long_chunks`: it has chunks for the prefill
    /// kernel); `None` above the limits' `max_rows`.
    pub fn holding(
        rows: usize,
        logits: usize,
        small_tiles: bool,
        long_chunks: bool,
        lim: &MixedLimits,
    ) -> Option<MixedShape> {
        if rows == 0 || rows > lim.max_rows {
            return None;
        }
        let r = match rows {
            0..=1024 => rows.next_multiple_of(64),
            n => n.next_multiple_of(256),
        };
        let logits = match logits {
            0..=256 => logits.next_multiple_of(64),
            n => n.next_multiple_of(128),
        };
        Some(MixedShape {
            rows: r,
            entries: lim.max_entries(r),
            long_entries: lim.max_long_entries(r),
            logits: logits.min(r),
            small_tiles,
            long_chunks,
        })
    }
}

/// Appends the tiles of `len` rows from batch row `row0` (positions from `pos0`), `per` tokens
/// at most each.
fn push_tiles(tiles: &mut Vec<i32>, row0: usize, len: usize, pos0: usize, bt_off: i32, per: usize) {
    let mut done = 0;
    while done < len {
        let n = per.min(len - done);
        tiles.extend_from_slice(&[(row0 + done) as i32, n as i32, (pos0 + done) as i32, bt_off, 0]);
        done += n;
    }
}

/// Orders tiles by the context they attend, longest first. The GPU starts an attention
/// launch's CTAs in grid order, a tile's KV heads together (grid `(nkv, tile entries)`), and
/// hands the next CTA to whichever SM frees first: started longest first, the long contexts
/// of a batch of mixed lengths (a few thousand positions beside a few hundred) are not the
/// last CTAs left running on a few SMs while the others idle (longest-processing-time-first
/// scheduling). Sorting only reorders work: each tile names its own rows and block table.
pub fn longest_first(tiles: &mut [i32]) {
    // Stable, so equal contexts keep the batch's order.
    tiles.as_chunks_mut::<TILE_INTS>().0.sort_by_key(|t| std::cmp::Reverse(t[1] + t[2]));
}

/// Puts tiles back in the batch's order (padding tiles last): the order before
/// [`longest_first`], kept for measuring what that order gains.
pub fn batch_order(tiles: &mut [i32]) {
    tiles.as_chunks_mut::<TILE_INTS>().0.sort_by_key(|t| (t[1] == 0, t[0]));
}

/// A block-table entry as the kernels read it: a given-back page as page 0.
fn page(blk: u32) -> i32 {
    if blk == NO_PAGE {
        0
    } else {
        blk as i32
    }
}

/// How many ways the attention kernels split each context of a pass: enough CTAs to fill the
/// GPU — about two per SM, or up to four per SM where three pieces or fewer get there (on an
/// H100, 64 sequences × 8 KV heads cut in 2 instead of whole: the Llama-3-8B shape's decode
/// step 1.3 % faster, Qwen3-0.6B's 1 % and at mixed contexts 2 %; cutting 16 sequences in 5
/// instead of 3 was 2–3 % slower; docs/gpu-runs/h100-2026-12-07b-landed/2-k130/) — never a
/// split shorter than 128 positions, at most 16. (Cutting long
/// contexts into more splits than short ones, for CTAs of equal length, measured slower on an
/// H100 — docs/gpu-runs/2026-11-27-split-merge/ — and on an H200 at 32 or more sequences; decode
/// graphs of up to 16 cut that way on this rule's grid: [`BatchPlan::split_balanced`].)
pub fn attention_splits(
    num_tiles: usize,
    num_kv_heads: usize,
    max_context: usize,
    num_sms: usize,
) -> usize {
    let ctas = (num_tiles * num_kv_heads).max(1);
    let want = match split_ctas_per_sm() {
        Some(n) => (n * num_sms).div_ceil(ctas),
        None => (2 * num_sms).div_ceil(ctas).max((4 * num_sms).div_ceil(ctas).min(3)),
    };
    let by_len = max_context.div_ceil(MIN_PIECE).max(1);
    want.min(by_len).clamp(1, MAX_SPLITS)
}

/// `TANDEM_SPLIT_CTAS_PER_SM` (1 to 8): [`attention_splits`] aims at exactly that many CTAs an
/// SM instead of its own rule, for comparison.
pub fn split_ctas_per_sm() -> Option<usize> {
    static N: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let n = env_count("TANDEM_SPLIT_CTAS_PER_SM", |n| (1..=8).contains(n), 0);
        (n > 0).then_some(n)
    })
}

/// The most CTAs per SM [`attention_splits`] can aim at (what the split buffers are sized for).
pub fn split_ctas_per_sm_max() -> usize {
    split_ctas_per_sm().unwrap_or(4)
}

/// The batch sizes that get a captured decode graph: 1, 2, 4, 8, then every 16 up to `max`.
pub fn graph_batch_sizes(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [1, 2, 4, 8].into_iter().filter(|&s| s <= max).collect();
    v.extend((16..=max).step_by(16));
    v
}

/// The smallest captured size that holds `n` sequences.
pub fn graph_size_for(sizes: &[usize], n: usize) -> Option<usize> {
    sizes.iter().copied().find(|&s| s >= n)
}

/// KV blocks for a process allowed `utilization` of the GPU's `total` bytes, vLLM's meaning:
/// the process's own use (`used`: weights and activations so far) plus its KV pool stay within
/// `utilization · total`, less `slack` for cuBLAS, graphs and the allocator; never more than is
/// `free`. Two workers on one GPU each take their share this way.
pub fn kv_blocks_for(
    total: u64,
    free: u64,
    used: u64,
    utilization: f64,
    slack: u64,
    bytes_per_block: u64,
) -> usize {
    let budget = (total as f64 * utilization.clamp(0.0, 1.0)) as u64;
    let room = budget.saturating_sub(used).saturating_sub(slack).min(free.saturating_sub(slack));
    (room / bytes_per_block.max(1)) as usize
}

#[cfg(test)]
mod tests;
