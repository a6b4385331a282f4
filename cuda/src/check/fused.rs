//! The small-tile decode kernel with q/k norm + RoPE + KV store fused in
//! (`attention_dec_rope*`) against the two kernels it replaces (`qkv_rope_store*`, then
//! `attention_dec*`) on the same inputs: the attention output and both caches must be equal bit
//! for bit, with contexts split several ways (a new position in an early split of a short
//! context) and tiles of several tokens whose positions straddle a split's edge.

use cudarc::driver::LaunchConfig;
use tandem_engine::backend::{ForwardBatch, Logits};

use super::{bf, result, CheckResult, Rng};
use crate::device::{ptr, Gpu, KernelArg};
use crate::plan::BatchPlan;
use crate::CudaError;

/// The model traits the rotation and store take: q/k norms (Qwen3), a q|k|v bias (Qwen2),
/// interleaved pairs (Llama GGUF).
#[derive(Clone, Copy)]
pub(super) struct Traits {
    pub norm: bool,
    pub bias: bool,
    pub interleaved: bool,
}

/// Unfused and fused over one batch; the result's error is the number of values (outputs and
/// cache entries) that differ.
pub(super) fn fused_rope_attention(
    g: &Gpu,
    (nh, nkv, hd): (usize, usize, usize),
    tr: Traits,
    splits: usize,
    window: Option<usize>,
) -> Result<CheckResult, CudaError> {
    let (bs, num_blocks, group) = (16, 200, nh / nkv);
    let mut r = Rng::new(41 + nh as u64 * 7 + splits as u64 + hd as u64);
    let kv = bf(&r.vec(num_blocks * bs * nkv * hd, 2.0));
    let vv = bf(&r.vec(num_blocks * bs * nkv * hd, 1.0));
    // Blocks of their own for each sequence, scattered through the pool (37 is prime to 200):
    // a sequence that stored into another's block would make the result depend on CTA timing.
    let mut next = 0u32;
    let mut table = |n: usize| -> Vec<u32> {
        let t = (next..next + n as u32).map(|i| (i * 37 + 11) % num_blocks as u32).collect();
        next += n as u32;
        t
    };
    // Decode steps at 999, 17 and 0 cached positions; a tile of as many tokens as 8 rows hold
    // whose positions cross 32 (a split's edge at four splits of 33 or 34 positions); a row with
    // no slot (stores nothing).
    let multi = (8 / group).max(1);
    let mut b = ForwardBatch::default();
    b.push_seq(&[0], 999, &table(63), bs, Logits::None);
    b.push_seq(&[0], 17, &table(2), bs, Logits::None);
    b.push_seq(&[0], 0, &table(1), bs, Logits::None);
    b.push_seq(&vec![0; multi], 32 - multi / 2, &table(3), bs, Logits::None);
    b.push_seq(&[0], 40, &table(3), bs, Logits::None);
    let last = b.slot_mapping.len() - 1;
    b.slot_mapping[last] = u32::MAX;
    let t = b.num_tokens();
    let heads = nh + 2 * nkv;
    let qkv = r.vec(t * heads * hd, 2.0);
    let bias = r.vec(heads * hd, 1.0);
    let (qn, kn) = (r.vec(hd, 1.0), r.vec(hd, 1.0));
    let inv: Vec<f32> =
        (0..hd / 2).map(|i| (1.0 / 1e6f64.powf(2.0 * i as f64 / hd as f64)) as f32).collect();
    let mut p = BatchPlan::new(&b, group, usize::MAX);
    assert!(p.max_tile_rows(group) <= 8, "every tile small");
    if splits > 1 {
        p.split_contexts(splits, None);
    }
    let num_tiles = p.num_tiles();
    let slots: Vec<i32> =
        b.slot_mapping.iter().map(|&s| if s == u32::MAX { -1 } else { s as i32 }).collect();
    let (dqkv, dpos, dslot) = (g.upload(&qkv)?, g.upload(&p.positions)?, g.upload(&slots)?);
    let (dinv, dqn, dkn, dbias) =
        (g.upload(&inv)?, g.upload(&qn)?, g.upload(&kn)?, g.upload(&bias)?);
    let (dt, dbt) = (g.upload(&p.tiles)?, g.upload(&p.block_tables)?);
    let (qnp, knp) = if tr.norm { (ptr(&dqn), ptr(&dkn)) } else { (0, 0) };
    let bp = if tr.bias { ptr(&dbias) } else { 0 };
    let (nhi, nkvi, hdi, bsi, ti) = (nh as i32, nkv as i32, hd as i32, bs as i32, t as i32);
    let (il, eps, scale) = (tr.interleaved as i32, 1e-6f32, 1.0 / (hd as f32).sqrt());
    let wi = window.map_or(i32::MAX, |w| w as i32);
    let att_cfg = LaunchConfig {
        grid_dim: (nkv as u32, num_tiles as u32, 1),
        block_dim: (32 * crate::plan::dec_warps(hd) as u32, 1, 1),
        shared_mem_bytes: crate::plan::dec_smem_bytes(hd),
    };
    let mut outs = Vec::new();
    for fused in [false, false, true] {
        let (kc, vc) = (g.upload(&kv)?, g.upload(&vv)?);
        let q = g.zeros::<f32>(t * nh * hd)?;
        let out = g.zeros::<u16>(t * nh * hd)?;
        let count = g.zeros::<i32>(t * nkv)?;
        let pa = g.zeros::<f32>(splits * t * nh * hd)?;
        let pm = g.zeros::<f32>(splits * t * nh * 2)?;
        let (qp, kp, vp, op) = (ptr(&q), ptr(&kc), ptr(&vc), ptr(&out));
        let (pap, pmp, cp, tp, btp) = (ptr(&pa), ptr(&pm), ptr(&count), ptr(&dt), ptr(&dbt));
        let (qkvp, posp, slotp, invp) = (ptr(&dqkv), ptr(&dpos), ptr(&dslot), ptr(&dinv));
        let att: [&dyn KernelArg; 16] = [
            &qp, &kp, &vp, &tp, &btp, &op, &pap, &pmp, &cp, &ti, &nhi, &nkvi, &hdi, &bsi, &scale,
            &wi,
        ];
        let rope: [&dyn KernelArg; 9] = [&qkvp, &posp, &slotp, &invp, &qnp, &knp, &bp, &il, &eps];
        if fused {
            let f = if hd == 64 { &g.k.attention_dec_rope64 } else { &g.k.attention_dec_rope128 };
            let args: Vec<&dyn KernelArg> = att.iter().chain(&rope).copied().collect();
            // SAFETY: attention_dec_rope*'s parameters over buffers sized for this batch.
            unsafe { g.launch(f, att_cfg, &args)? };
        } else {
            let (cfg, per_warp) = crate::device::rope_config(t, heads, hd);
            let (null, nt) = (0u64, t as i32);
            let args: [&dyn KernelArg; 19] = [
                &qkvp, &posp, &slotp, &invp, &qnp, &knp, &qp, &null, &kp, &vp, &nhi, &nkvi, &hdi,
                &il, &eps, &bsi, &bp, &nt, &per_warp,
            ];
            let f = if hd == 64 { &g.k.attention_dec64 } else { &g.k.attention_dec128 };
            // SAFETY: qkv_rope_store's, then attention_dec*'s, parameters over the same buffers.
            unsafe {
                g.launch(g.rope_for(hd, per_warp as usize), cfg, &args)?;
                g.launch(f, att_cfg, &att)?;
            }
        }
        outs.push((
            g.read(&out, t * nh * hd)?,
            g.read(&kc, kv.len())?,
            g.read(&vc, vv.len())?,
            g.read(&count, t * nkv)?,
        ));
    }
    let (a, f) = (&outs[0], &outs[2]);
    // Where the outputs part, by token, and by how much (reported when they do).
    let parts = |x: &[u16], y: &[u16]| -> String {
        let (xf, yf) = (super::unbf(x), super::unbf(y));
        let mut toks = std::collections::BTreeMap::new();
        for (i, (p, q)) in xf.iter().zip(&yf).enumerate() {
            if p.to_bits() != q.to_bits() {
                let e = toks.entry(i / (nh * hd)).or_insert(0f32);
                *e = e.max((p - q).abs());
            }
        }
        format!("{toks:?}")
    };
    let again = differ_u16(&a.0, &outs[1].0);
    if f.3.iter().any(|&c| c != 0) {
        return Err(CudaError::Driver(format!("split counters left at {:?}", f.3)));
    }
    let differ = differ_u16;
    let bad = differ(&a.0, &f.0) + differ(&a.1, &f.1) + differ(&a.2, &f.2);
    let detail = match bad {
        0 => String::new(),
        _ => format!(
            " [outputs part at tokens (max diff) {}; keys {}, values {}; the unfused kernels twice: {again} outputs differ]",
            parts(&a.0, &f.0),
            differ(&a.1, &f.1),
            differ(&a.2, &f.2)
        ),
    };
    let (changed_k, changed_v) = (differ(&a.1, &kv), differ(&a.2, &vv));
    // The unfused kernels stored something (the check compares real work).
    if changed_k == 0 || changed_v == 0 {
        return Err(CudaError::Driver("the unfused kernels stored no key or value".into()));
    }
    let seen = window.map_or(String::new(), |w| format!(", window {w}"));
    Ok(result(
        &format!(
            "fused norm+rope+store+attention nh={nh} nkv={nkv} hd={hd} splits={splits}{seen}{}{}{}: values differing from the two kernels' (of {} outputs, {changed_k} keys and {changed_v} values stored){detail}",
            if tr.norm { ", q/k norm" } else { "" },
            if tr.bias { ", bias" } else { "" },
            if tr.interleaved { ", interleaved" } else { "" },
            a.0.len()
        ),
        bad as f64,
        0.0,
    ))
}

/// How many values of two equal-length slices differ.
fn differ_u16(x: &[u16], y: &[u16]) -> usize {
    x.iter().zip(y).filter(|(p, q)| p != q).count()
}
