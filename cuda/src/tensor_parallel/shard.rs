//! How a model splits across the GPUs of a tensor-parallel group — arithmetic only, no device.
//!
//! Rank `r` of `n` keeps query heads `r·H/n ..` and KV heads `r·K/n ..` (so each rank's query
//! heads read only its own KV heads), and the same slice of the MLP's hidden width. A group
//! larger than the model's KV heads (`n` a multiple of `K`) replicates them: rank `r` keeps KV
//! head `r·K/n` — the one its query heads read — and `n/K` ranks hold each. The fused
//! q|k|v and gate|up matrices are column-parallel (a rank keeps its rows of each part), the
//! output and down projections row-parallel (a rank keeps its columns; the partial products are
//! summed by an all-reduce). Norms, the embedding and the LM head's weights are whole on every
//! rank; where the group gathers logits over peer memory, rank `r` computes only the logits of
//! its [`Shard::vocab_rows`].
//!
//! KV pages leave and enter a group in the whole model's format: for each layer's K and V, each
//! position's heads in order. A rank's page holds its heads; [`merge_pages`] and
//! [`split_page`] convert, so a worker of one group size can exchange pages with a worker of
//! another (the re-sharding happens where pages are read and written).

use std::ops::Range;

use tandem_engine::model_files::config::ModelConfig;

/// One rank's place in a tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..size`.
    pub rank: usize,
    /// GPUs in the group.
    pub size: usize,
}

impl Shard {
    /// The whole model on one GPU.
    pub const WHOLE: Shard = Shard { rank: 0, size: 1 };

    /// Why `cfg` cannot be split `size` ways, if it cannot: every rank must get whole query
    /// heads, whole KV heads (or one KV head it shares with other ranks) and an equal slice of
    /// the MLP.
    pub fn refusal(cfg: &ModelConfig, size: usize) -> Option<String> {
        if size == 0 {
            return Some("a tensor-parallel size of 0".into());
        }
        let mut why = Vec::new();
        if size > 1 && cfg.post_norms {
            return Some(format!(
                "tensor parallelism is not supported for {} (its norms after each sub-layer need the whole sum first)",
                cfg.arch.gguf_name()
            ));
        }
        for (what, n) in [("query heads", cfg.num_heads), ("MLP width", cfg.intermediate_size)] {
            if !n.is_multiple_of(size) {
                why.push(format!("{n} {what}"));
            }
        }
        let kv = cfg.num_kv_heads;
        if !kv.is_multiple_of(size) && (kv == 0 || !size.is_multiple_of(kv)) {
            why.push(format!("{kv} KV heads"));
        }
        (!why.is_empty()).then(|| {
            format!(
                "tensor-parallel size {size} does not divide the model's {} (each GPU keeps whole heads; KV heads are replicated only when the size is a multiple of their count)",
                why.join(", ")
            )
        })
    }

    /// Ranks that hold each KV head: 1, or `size / K` when the group is larger than the model's
    /// `K` KV heads (a group [`Shard::refusal`] accepts).
    pub fn kv_replicas(cfg: &ModelConfig, size: usize) -> usize {
        match cfg.num_kv_heads {
            k if k > 0 && k < size => size / k,
            _ => 1,
        }
    }

    /// Rows of the whole `[kv_size, …]` K (or V) part this rank keeps: its slice of the KV heads,
    /// or the one head its query heads read where heads are replicated.
    fn kv_part(&self, cfg: &ModelConfig) -> Range<usize> {
        let reps = Self::kv_replicas(cfg, self.size);
        if reps == 1 {
            return self.part(cfg.kv_size());
        }
        let head = self.rank / reps;
        head * cfg.head_dim..(head + 1) * cfg.head_dim
    }

    /// Whether this rank holds the whole residual stream before the all-reduce (its output
    /// projections add to it; the others contribute their partial products alone).
    pub fn leads(&self) -> bool {
        self.rank == 0
    }

    fn part(&self, n: usize) -> Range<usize> {
        let w = n / self.size;
        self.rank * w..(self.rank + 1) * w
    }

    /// The configuration of one rank's slice: its heads and MLP width; everything else whole.
    pub fn local_config(&self, cfg: &ModelConfig) -> ModelConfig {
        let mut c = cfg.clone();
        c.num_heads /= self.size;
        c.num_kv_heads = (c.num_kv_heads / self.size).max(1);
        c.intermediate_size /= self.size;
        c
    }

    /// Rows of the whole `[q + 2·kv, hidden]` q|k|v matrix (or bias) this rank keeps, in order.
    pub fn qkv_rows(&self, cfg: &ModelConfig) -> [Range<usize>; 3] {
        let (q, kv) = (cfg.q_size(), cfg.kv_size());
        let (qr, kr) = (self.part(q), self.kv_part(cfg));
        [qr, q + kr.start..q + kr.end, q + kv + kr.start..q + kv + kr.end]
    }

    /// Rows of the whole `[2·intermediate, hidden]` gate|up matrix this rank keeps, in order.
    pub fn gate_up_rows(&self, cfg: &ModelConfig) -> [Range<usize>; 2] {
        let ff = cfg.intermediate_size;
        let r = self.part(ff);
        [r.clone(), ff + r.start..ff + r.end]
    }

    /// Columns of the whole `[hidden, q]` output projection this rank keeps.
    pub fn o_cols(&self, cfg: &ModelConfig) -> Range<usize> {
        self.part(cfg.q_size())
    }

    /// Columns of the whole `[hidden, intermediate]` down projection this rank keeps.
    pub fn down_cols(&self, cfg: &ModelConfig) -> Range<usize> {
        self.part(cfg.intermediate_size)
    }

    /// The vocabulary rows of the LM head whose logits this rank computes: `⌈V/N⌉` a rank, the
    /// last rank's slice shorter when `N` does not divide `V` (any vocabulary size shards).
    pub fn vocab_rows(&self, vocab: usize) -> Range<usize> {
        let per = vocab.div_ceil(self.size);
        let start = (self.rank * per).min(vocab);
        start..(start + per).min(vocab)
    }
}

/// The rows `ranges` of a row-major matrix of `cols` columns, in order.
pub fn take_rows<T: Copy>(m: &[T], cols: usize, ranges: &[Range<usize>]) -> Vec<T> {
    ranges.iter().flat_map(|r| m[r.start * cols..r.end * cols].iter().copied()).collect()
}

/// The columns `range` of every row of a row-major matrix of `cols` columns.
pub fn take_cols<T: Copy>(m: &[T], cols: usize, range: Range<usize>) -> Vec<T> {
    m.chunks_exact(cols).flat_map(|row| row[range.clone()].iter().copied()).collect()
}

/// The whole page of a block from the ranks' pages (rank order): each of `parts` layer-parts
/// holds `positions` rows, and a rank's row is its slice of the whole row's heads.
pub fn merge_pages<P: AsRef<[u8]>>(pages: &[P], parts: usize, positions: usize) -> Vec<u8> {
    let total: usize = pages.iter().map(|p| p.as_ref().len()).sum();
    let mut out = Vec::with_capacity(total);
    let rows = parts * positions;
    for row in 0..rows {
        for p in pages {
            let p = p.as_ref();
            let w = p.len() / rows;
            out.extend_from_slice(&p[row * w..(row + 1) * w]);
        }
    }
    out
}

/// The whole page of a block from every rank's page of a group (rank order), where `reps` ranks
/// in a row hold the same KV heads ([`Shard::kv_replicas`]): the first of each, uncopied. The
/// reverse is [`split_page`] into `size / reps` parts, part `rank / reps` going to each rank.
pub fn merge_group_pages(
    pages: &[Vec<u8>],
    reps: usize,
    parts: usize,
    positions: usize,
) -> Vec<u8> {
    let holders: Vec<&[u8]> = pages.iter().step_by(reps.max(1)).map(Vec::as_slice).collect();
    merge_pages(&holders, parts, positions)
}

/// The ranks' pages of a whole page ([`merge_pages`] reversed): `size` equal slices of each of
/// `parts × positions` rows.
pub fn split_page(page: &[u8], size: usize, parts: usize, positions: usize) -> Vec<Vec<u8>> {
    let rows = parts * positions;
    let w = page.len() / rows / size;
    let mut out = vec![Vec::with_capacity(page.len() / size); size];
    for row in page.chunks_exact(w * size) {
        for (r, o) in out.iter_mut().enumerate() {
            o.extend_from_slice(&row[r * w..(r + 1) * w]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_rows_cover_the_vocabulary_once() {
        for (vocab, size) in [(128_256, 2), (128_256, 4), (151_936, 8), (49_152, 3), (7, 4)] {
            let mut next = 0;
            for rank in 0..size {
                let r = Shard { rank, size }.vocab_rows(vocab);
                assert_eq!(r.start, next, "vocab {vocab}, rank {rank} of {size}");
                assert!(r.len() <= vocab.div_ceil(size));
                next = r.end;
            }
            assert_eq!(next, vocab, "vocab {vocab} over {size} ranks");
        }
        assert_eq!(Shard { rank: 1, size: 2 }.vocab_rows(128_256), 64_128..128_256);
    }

    fn llama70b() -> ModelConfig {
        crate::dummy_config(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/llama-3-70b.json"),
        )
        .unwrap()
    }

    /// A tiny GQA shape whose weights can be written out by hand: 4 query heads, 2 KV heads,
    /// head width 2, MLP width 6.
    fn tiny() -> ModelConfig {
        let mut c = llama70b();
        (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size) =
            (3, 4, 2, 2, 6);
        c
    }

    #[test]
    fn refuses_sizes_that_split_heads() {
        let c = llama70b();
        // 8 KV heads: split 1–8 ways, replicated 16 ways (two ranks a head).
        for n in [1, 2, 4, 8, 16] {
            assert_eq!(Shard::refusal(&c, n), None, "TP={n}");
        }
        assert_eq!((Shard::kv_replicas(&c, 8), Shard::kv_replicas(&c, 16)), (1, 2));
        assert!(Shard::refusal(&c, 3).unwrap().contains("64 query heads"));
        assert!(Shard::refusal(&c, 0).is_some());
        // 6 KV heads of 12 query heads on 4 GPUs: neither split nor replicated evenly.
        let mut odd = c.clone();
        (odd.num_heads, odd.num_kv_heads) = (12, 6);
        let why = Shard::refusal(&odd, 4).unwrap();
        assert!(why.contains("6 KV heads") && !why.contains("query"), "{why}");
        assert!(why.contains("replicated only when"), "{why}");
    }

    #[test]
    fn replicated_kv_heads_follow_the_ranks_query_heads() {
        // 4 query heads, 2 KV heads of width 2, on 4 GPUs: ranks 0, 1 read KV head 0, ranks
        // 2, 3 KV head 1.
        let c = tiny();
        let (q, kv) = (c.q_size(), c.kv_size());
        for rank in 0..4 {
            let s = Shard { rank, size: 4 };
            let l = s.local_config(&c);
            assert_eq!((l.num_heads, l.num_kv_heads), (1, 1));
            let head = rank / 2;
            let rows = s.qkv_rows(&c);
            assert_eq!(rows[0], rank * 2..rank * 2 + 2);
            assert_eq!(rows[1], q + head * 2..q + head * 2 + 2);
            assert_eq!(rows[2], q + kv + head * 2..q + kv + head * 2 + 2);
        }
    }

    #[test]
    fn refuses_post_norm_models() {
        let gemma = crate::dummy_config(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/data/tiny-gemma3/config.json"),
        )
        .unwrap();
        assert!(gemma.post_norms);
        assert_eq!(Shard::refusal(&gemma, 1), None);
        assert!(Shard::refusal(&gemma, 2).unwrap().contains("norms after each sub-layer"));
    }

    #[test]
    fn local_config_keeps_the_group_size_and_widths() {
        let c = llama70b();
        for n in [2, 4, 8] {
            let l = Shard { rank: n - 1, size: n }.local_config(&c);
            assert_eq!((l.num_heads, l.num_kv_heads), (64 / n, 8 / n));
            assert_eq!(l.num_heads / l.num_kv_heads, c.num_heads / c.num_kv_heads);
            assert_eq!(l.intermediate_size * n, c.intermediate_size);
            assert_eq!((l.hidden_size, l.vocab_size, l.head_dim), (8192, 128_256, 128));
        }
    }

    /// Column-parallel q|k|v then row-parallel o, summed over ranks, equals the whole model's
    /// product — and each rank's query heads use only that rank's KV heads.
    #[test]
    fn shards_sum_to_the_whole_attention_projection() {
        let c = tiny();
        let (h, q, kv) = (c.hidden_size, c.q_size(), c.kv_size());
        let qkv: Vec<f32> = (0..(q + 2 * kv) * h).map(|i| (i as f32 * 0.37).sin()).collect();
        let o: Vec<f32> = (0..h * q).map(|i| (i as f32 * 0.11).cos()).collect();
        let x = [0.5f32, -1.0, 2.0];
        let matvec = |m: &[f32], v: &[f32]| -> Vec<f32> {
            m.chunks_exact(v.len()).map(|r| r.iter().zip(v).map(|(a, b)| a * b).sum()).collect()
        };
        // Whole model: q heads 0..4, kv head of q head i is i / 2; "attention" here is the
        // elementwise product of each q head with its kv head's v (a stand-in that keeps the
        // head mapping).
        let attend = |y: &[f32], nh: usize, nkv: usize| -> Vec<f32> {
            let (qs, hd) = (nh * 2, 2);
            let group = nh / nkv;
            (0..qs)
                .map(|i| {
                    let head = i / hd;
                    let vi = qs + nkv * hd + (head / group) * hd + i % hd;
                    y[i] * y[vi]
                })
                .collect()
        };
        let whole = matvec(&o, &attend(&matvec(&qkv, &x), c.num_heads, c.num_kv_heads));
        // KV heads split (2 GPUs) and replicated (4 GPUs, two ranks a head).
        for n in [2, 4] {
            let mut sum = vec![0f32; h];
            for rank in 0..n {
                let s = Shard { rank, size: n };
                let l = s.local_config(&c);
                let wq = take_rows(&qkv, h, &s.qkv_rows(&c));
                let wo = take_cols(&o, q, s.o_cols(&c));
                assert_eq!(wq.len(), (l.q_size() + 2 * l.kv_size()) * h);
                let part = matvec(&wo, &attend(&matvec(&wq, &x), l.num_heads, l.num_kv_heads));
                for (a, b) in sum.iter_mut().zip(part) {
                    *a += b;
                }
            }
            for (a, b) in sum.iter().zip(&whole) {
                assert!((a - b).abs() < 1e-5, "TP={n}: {sum:?} vs {whole:?}");
            }
        }
    }

    #[test]
    fn shards_sum_to_the_whole_mlp() {
        let c = tiny();
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let gu: Vec<f32> = (0..2 * ff * h).map(|i| (i as f32 * 0.7).sin()).collect();
        let down: Vec<f32> = (0..h * ff).map(|i| (i as f32 * 0.3).cos()).collect();
        let x = [1.0f32, 0.25, -0.5];
        let mlp = |gu: &[f32], down: &[f32], ff: usize| -> Vec<f32> {
            let y: Vec<f32> =
                gu.chunks_exact(h).map(|r| r.iter().zip(&x).map(|(a, b)| a * b).sum()).collect();
            let act: Vec<f32> = (0..ff).map(|i| y[i] / (1.0 + (-y[i]).exp()) * y[ff + i]).collect();
            down.chunks_exact(ff).map(|r| r.iter().zip(&act).map(|(a, b)| a * b).sum()).collect()
        };
        let whole = mlp(&gu, &down, ff);
        for n in [2, 3, 6] {
            let mut sum = vec![0f32; h];
            for rank in 0..n {
                let s = Shard { rank, size: n };
                let part = mlp(
                    &take_rows(&gu, h, &s.gate_up_rows(&c)),
                    &take_cols(&down, ff, s.down_cols(&c)),
                    ff / n,
                );
                sum.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
            for (a, b) in sum.iter().zip(&whole) {
                assert!((a - b).abs() < 1e-5, "TP={n}: {sum:?} vs {whole:?}");
            }
        }
    }

    #[test]
    fn one_rank_keeps_everything() {
        let c = llama70b();
        let s = Shard::WHOLE;
        assert_eq!(s.qkv_rows(&c)[0], 0..8192);
        assert_eq!(s.qkv_rows(&c)[2].end, 8192 + 2 * 1024);
        assert_eq!(s.gate_up_rows(&c), [0..28672, 28672..57344]);
        assert_eq!(s.down_cols(&c), 0..28672);
        assert!(s.leads() && !Shard { rank: 1, size: 2 }.leads());
    }

    #[test]
    fn pages_split_by_kv_head_and_merge_back() {
        // 2 layers × K|V = 4 parts, 3 positions, 4 KV heads of 2 values (bytes as labels).
        let (parts, positions, heads, hd) = (4, 3, 4, 2);
        let whole: Vec<u8> = (0..parts * positions * heads * hd).map(|i| i as u8).collect();
        for n in [1, 2, 4] {
            let ranks = split_page(&whole, n, parts, positions);
            assert_eq!(ranks.len(), n);
            // Rank r holds heads r·4/n.. of every row.
            let per = heads / n * hd;
            for (r, p) in ranks.iter().enumerate() {
                assert_eq!(p.len(), whole.len() / n);
                for row in 0..parts * positions {
                    let start = row * heads * hd + r * per;
                    assert_eq!(&p[row * per..(row + 1) * per], &whole[start..start + per]);
                }
            }
            assert_eq!(merge_pages(&ranks, parts, positions), whole, "TP={n}");
        }
        // 8 GPUs on the 4 heads: two ranks a head, rank r given part r / 2 of the page split
        // among the 4 holders (as `TpBackend::write_block` does), each the head its query heads
        // read.
        let reps = 2;
        let holders = split_page(&whole, 8 / reps, parts, positions);
        let ranks: Vec<Vec<u8>> = (0..8).map(|r| holders[r / reps].clone()).collect();
        for (r, p) in ranks.iter().enumerate() {
            for row in 0..parts * positions {
                let start = row * heads * hd + (r / 2) * hd;
                assert_eq!(&p[row * hd..(row + 1) * hd], &whole[start..start + hd], "rank {r}");
            }
        }
        assert_eq!(merge_group_pages(&ranks, reps, parts, positions), whole);
        assert_eq!(
            merge_group_pages(&split_page(&whole, 2, parts, positions), 1, parts, positions),
            whole
        );
    }
}
