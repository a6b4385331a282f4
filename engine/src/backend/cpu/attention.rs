//! Attention of a batch's tokens over their sequences' cached context (paged KV cache), on the
//! CPU pool: the portable f32 reference and the dispatch to the x86 kernel.

#[cfg(target_arch = "x86_64")]
use super::attention_x86;
#[cfg(not(target_arch = "x86_64"))]
pub(super) use super::kv_cache::KvElem as KvRead;
use super::kv_cache::{CpuKvCache, KvElem};
use super::{linear, ops, pool};
use crate::backend::ForwardBatch;
use crate::model_files::config::ModelConfig;
/// What attention needs of a KV element type: the x86 kernels' vector loads where they exist.
#[cfg(target_arch = "x86_64")]
pub(super) use attention_x86::KvLoad as KvRead;

/// Attention of every batch token over its sequence's cached context, into `out` (`t × q_size`).
/// Work items are (token, KV head): the query heads sharing a KV head are computed together,
/// so each cached K and V row is read once per group. `kv_slot` is `(KV group, number of KV
/// groups, layer index in the group's page)` of the layer ([`crate::backend::KvGroups`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn attend<E: KvRead>(
    cfg: &ModelConfig,
    kv: &CpuKvCache<E>,
    window: Option<usize>,
    simd: bool,
    kv_slot: (usize, usize, usize),
    q: &[f32],
    b: &ForwardBatch,
    tok_seq: &[usize],
    out: &mut [f32],
) {
    let (hd, nh, nkv) = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads);
    let (kv_group, kv_groups, layer) = kv_slot;
    let group = nh / nkv;
    let bs = kv.block_size();
    let scale = 1.0 / cfg.query_pre_attn_scalar.unwrap_or(hd as f32).sqrt();
    let kernel = simd && hd % 8 == 0;
    // The AVX-512 kernel path (unless TANDEM_CPU_KERNEL asks for a lower one) attends on
    // 512-bit vectors where the head width is a multiple of 16.
    #[cfg(target_arch = "x86_64")]
    let wide = kernel
        && hd.is_multiple_of(16)
        && super::quant::QKernel::detect() == super::quant::QKernel::Avx512Vnni;
    let optr = pool::OutPtr(out.as_mut_ptr());
    let n_items = b.num_tokens() * nkv;
    let pool = pool::ThreadPool::global();
    let per_task = n_items.div_ceil(pool.num_threads() * 4).max(1);
    pool.run(n_items.div_ceil(per_task), &|task| {
        ATTN_SCRATCH.with(|sc| {
            let mut sc = sc.borrow_mut();
            let AttnScratch { slots, scores } = &mut *sc;
            for idx in task * per_task..((task + 1) * per_task).min(n_items) {
                let (ti, kvh) = (idx / nkv, idx % nkv);
                let h0 = kvh * group;
                // SAFETY: each (token, KV head) item owns the output slices of its query heads.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(optr.get().add((ti * nh + h0) * hd), group * hd)
                };
                let qg = &q[(ti * nh + h0) * hd..(ti * nh + h0 + group) * hd];
                // The cache row of every context position it sees (a local layer: the
                // last `window`), walking the block table once.
                let end = b.positions[ti] as usize + 1;
                let start = window.map_or(0, |w| end.saturating_sub(w));
                slots.clear();
                let table = &b.seqs[tok_seq[ti]].block_table;
                for bi in start / bs..table.len() / kv_groups {
                    // The layer's group's page of logical block `bi`.
                    let blk = table[bi * kv_groups + kv_group];
                    let base = blk as usize * kv.block_rows();
                    let (lo, hi) = ((bi * bs).max(start), ((bi + 1) * bs).min(end));
                    slots.extend(base + lo - bi * bs..base + hi - bi * bs);
                    if hi == end {
                        break;
                    }
                }
                let ctx = slots.len();
                scores.clear();
                scores.resize(group * ctx, 0.0);
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: the AVX-512 kernel path runs only where the CPU has AVX-512F
                    // (and AVX2, FMA); hd is a multiple of 16.
                    unsafe {
                        attention_x86::attend_group_512(
                            kv, layer, qg, kvh, hd, slots, scale, scores, o,
                        )
                    };
                    continue;
                }
                #[cfg(target_arch = "x86_64")]
                if kernel {
                    // SAFETY: `simd` is set only when the CPU has AVX2 and FMA; hd is a multiple of 8.
                    unsafe {
                        attention_x86::attend_group(kv, layer, qg, kvh, hd, slots, scale, scores, o)
                    };
                    continue;
                }
                let _ = kernel;
                attend_group(kv, layer, qg, kvh, hd, slots, scale, scores, o);
            }
        })
    });
}

/// Per-thread attention buffers, reused across calls.
#[derive(Default)]
struct AttnScratch {
    slots: Vec<usize>,
    scores: Vec<f32>,
}

thread_local! {
    static ATTN_SCRATCH: std::cell::RefCell<AttnScratch> = std::cell::RefCell::new(AttnScratch::default());
}

/// The query heads `qg` (`group × head_dim`) sharing KV head `kvh`, over the cached positions
/// whose cache rows ([`CpuKvCache::row`]) are `slots`: softmax(q·Kᵀ·scale)·V per head, in f32. The portable reference of
/// `attention_x86::attend_group`; `scores` is scratch of `group × slots.len()` floats.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_group<E: KvElem>(
    kv: &CpuKvCache<E>,
    layer: usize,
    qg: &[f32],
    kvh: usize,
    hd: usize,
    slots: &[usize],
    scale: f32,
    scores: &mut [f32],
    o: &mut [f32],
) {
    let group = qg.len() / hd;
    let ctx = slots.len();
    for (p, &slot) in slots.iter().enumerate() {
        let k = &kv.k(layer, slot)[kvh * hd..(kvh + 1) * hd];
        for g in 0..group {
            scores[g * ctx + p] = linear::dot(&qg[g * hd..(g + 1) * hd], k) * scale;
        }
    }
    for g in 0..group {
        ops::softmax(&mut scores[g * ctx..(g + 1) * ctx]);
    }
    o.fill(0.0);
    for (p, &slot) in slots.iter().enumerate() {
        let v = &kv.v(layer, slot)[kvh * hd..(kvh + 1) * hd];
        for g in 0..group {
            let w = scores[g * ctx + p];
            for (a, &x) in o[g * hd..(g + 1) * hd].iter_mut().zip(v) {
                *a += w * x.to_f32();
            }
        }
    }
}
