//! Kernel checks: every CUDA kernel against the CPU exact path (or an f64 reference where the
//! CPU backend has no standalone function) on seeded random inputs, each with its stated
//! tolerance. Run on a GPU by `tandem-gpu check` (scripts/gpu/run.sh).

use cudarc::driver::LaunchConfig;
use tandem_engine::backend::cpu::ops;

use crate::device::{ptr, Dtype, Gpu};
use crate::plan::kv_index;
use crate::CudaError;

mod fused;
mod gemm;
mod norms;
use gemm::{gemm, glu};
use norms::{rmsnorm, rmsnorm_add, rmsnorm_parts};

/// Outcome of one check.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// What was checked.
    pub name: String,
    /// Largest error seen (in the check's own measure).
    pub max_err: f64,
    /// The bound it had to stay under.
    pub tol: f64,
}

impl CheckResult {
    /// Whether the error stayed within the tolerance.
    pub fn passed(&self) -> bool {
        self.max_err <= self.tol
    }
}

/// A small seeded generator (xorshift64*), uniform in [-1, 1).
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next value in [-1, 1).
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        v as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// `n` values scaled by `s`.
    pub fn vec(&mut self, n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * s).collect()
    }
}

thread_local! {
    static DTYPE: std::cell::Cell<Dtype> = const { std::cell::Cell::new(Dtype::Bf16) };
}

/// To the checked device's 16-bit type.
fn bf(v: &[f32]) -> Vec<u16> {
    let d = DTYPE.with(|c| c.get());
    v.iter().map(|&x| d.from_f32(x)).collect()
}

/// From the checked device's 16-bit type.
fn unbf(v: &[u16]) -> Vec<f32> {
    let d = DTYPE.with(|c| c.get());
    v.iter().map(|&b| d.to_f32(b)).collect()
}

fn round_bf(v: &[f32]) -> Vec<f32> {
    unbf(&bf(v))
}

/// Largest `|a - b| / (|b| + floor)`.
fn rel_err(a: &[f32], b: &[f32], floor: f32) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| ((x - y).abs() / (y.abs() + floor)) as f64).fold(0.0, f64::max)
}

fn abs_err(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (x - y).abs() as f64).fold(0.0, f64::max)
}

fn result(name: &str, max_err: f64, tol: f64) -> CheckResult {
    CheckResult { name: name.to_string(), max_err, tol }
}

/// Runs every kernel check for the device's 16-bit type. Tolerances are in units of that
/// type's rounding error `u` (2^-8 for bf16, 2^-11 for f16) where a 16-bit rounding bounds them.
pub fn run_all(g: &Gpu) -> Result<Vec<CheckResult>, CudaError> {
    DTYPE.with(|c| c.set(g.dtype));
    let u = g.dtype.unit_roundoff();
    let mut out = Vec::new();
    out.extend(gemm(g, u)?);
    out.extend(glu(g)?);
    out.push(embed(g)?);
    out.extend(rmsnorm(g, u)?);
    out.extend(rmsnorm_parts(g, u)?);
    // Each head width's variant (64, 128, 256), and the general kernel at 128.
    out.extend(qkv_rope_store(g, u, false, false, 9, 3, 64, false)?);
    out.extend(qkv_rope_store(g, u, true, false, 16, 8, 128, false)?);
    out.extend(qkv_rope_store(g, u, false, true, 14, 2, 64, false)?);
    out.extend(qkv_rope_store(g, u, true, false, 4, 1, 256, false)?);
    out.extend(qkv_rope_store(g, u, true, false, 16, 8, 128, true)?);
    for (nh, nkv, hd) in [(9, 3, 64), (32, 8, 128), (16, 8, 128), (64, 8, 128)] {
        // Full causal attention, and a sliding window of 100 positions (Mistral's layers).
        for window in [None, Some(100)] {
            for splits in [1, 4] {
                out.push(attention(g, u, nh, nkv, hd, splits, AttKernel::Tile, window)?);
            }
            // Decode steps alone, through the small-tile variant.
            out.push(attention(g, u, nh, nkv, hd, 4, AttKernel::Decode, window)?);
            if g.sm >= 80 {
                for splits in [1, 3] {
                    out.push(attention(g, u, nh, nkv, hd, splits, AttKernel::Mma, window)?);
                    out.push(attention(g, u, nh, nkv, hd, splits, AttKernel::Dec, window)?);
                }
                // Splits by length (the balanced rule: the 1,000-position context in 8 pieces,
                // the others whole).
                out.push(attention(g, u, nh, nkv, hd, 0, AttKernel::Dec, window)?);
                out.push(attention(g, u, nh, nkv, hd, 1, AttKernel::Prefill, window)?);
            }
        }
    }
    if g.sm >= 80 {
        // The decode kernel with q/k norm + RoPE + KV store fused in, bit for bit the two kernels.
        let qwen3 = fused::Traits { norm: true, bias: false, interleaved: false };
        let llama_bias = fused::Traits { norm: false, bias: true, interleaved: true };
        for shape in [(9, 3, 64), (16, 8, 128), (32, 8, 128), (64, 8, 128)] {
            for tr in [qwen3, llama_bias] {
                for splits in [1, 4] {
                    out.push(fused::fused_rope_attention(g, shape, tr, splits, None)?);
                }
            }
        }
        out.push(fused::fused_rope_attention(g, (16, 8, 128), qwen3, 3, Some(20))?);
    }
    out.extend(silu_mul(g, u)?);
    out.push(rmsnorm_add(g)?);
    out.extend(sampling(g)?);
    out.extend(masked_sampling(g)?);
    Ok(out)
}

fn embed(g: &Gpu) -> Result<CheckResult, CudaError> {
    let (v, h) = (1000, 96);
    let mut r = Rng::new(2);
    let table = bf(&r.vec(v * h, 2.0));
    let toks: Vec<i32> = (0..17).map(|i| (i * 97 + 5) % v as i32).collect();
    let (dt, dk, dx) = (g.upload(&table)?, g.upload(&toks)?, g.zeros::<f32>(toks.len() * h)?);
    let hi = h as i32;
    let cfg = LaunchConfig {
        grid_dim: (toks.len() as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // Gemma scales its embeddings by √hidden (a power of two here, so exact).
    let scale = 16f32;
    // SAFETY: embed(const int*, const h16*, float*, int, float) over these buffers.
    unsafe { g.launch(&g.k.embed, cfg, &[&ptr(&dk), &ptr(&dt), &ptr(&dx), &hi, &scale])? };
    let got = g.read(&dx, toks.len() * h)?;
    let want: Vec<f32> = toks
        .iter()
        .flat_map(|&t| unbf(&table[t as usize * h..(t as usize + 1) * h]))
        .map(|v| v * scale)
        .collect();
    Ok(result("embed, scaled (exact)", abs_err(&got, &want), 0.0))
}

/// Tokens per block in the KV-store check.
const BS: usize = 16;

#[allow(clippy::too_many_arguments)]
fn qkv_rope_store(
    g: &Gpu,
    u: f64,
    qwen: bool,
    bias: bool,
    nh: usize,
    nkv: usize,
    hd: usize,
    general: bool,
) -> Result<Vec<CheckResult>, CudaError> {
    let t = 11;
    let width = (nh + 2 * nkv) * hd;
    let eps = 1e-6f32;
    let mut r = Rng::new(4 + hd as u64);
    let qkv = r.vec(t * width, 2.0);
    let qkv_bias = r.vec(width, 1.0);
    let pos: Vec<i32> = (0..t as i32).map(|i| i * 377 + 3).collect();
    let num_slots = 64;
    let slots: Vec<i32> =
        (0..t as i32).map(|i| if i == 4 { -1 } else { (i * 5 + 1) % num_slots }).collect();
    let (qn, kn) = (r.vec(hd, 1.0), r.vec(hd, 1.0));
    let theta = if qwen { 1_000_000.0 } else { 100_000.0 };
    let rope = ops::Rope::new(hd, theta, !qwen);
    let inv: Vec<f32> = (0..hd / 2)
        .map(|i| (1.0 / (theta as f64).powf(2.0 * i as f64 / hd as f64)) as f32)
        .collect();
    // CPU exact: norm, rope.
    let (mut want_q, mut want_k, mut want_v) = (
        Vec::new(),
        vec![0f32; num_slots as usize * nkv * hd],
        vec![0f32; num_slots as usize * nkv * hd],
    );
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for ti in 0..t {
        let mut row = qkv[ti * width..(ti + 1) * width].to_vec();
        if bias {
            row.iter_mut().zip(&qkv_bias).for_each(|(x, b)| *x += b);
        }
        let (mut q, mut k) = (row[..nh * hd].to_vec(), row[nh * hd..(nh + nkv) * hd].to_vec());
        if qwen {
            q.chunks_exact_mut(hd).for_each(|h| ops::rms_norm_inplace(h, &qn, eps));
            k.chunks_exact_mut(hd).for_each(|h| ops::rms_norm_inplace(h, &kn, eps));
        }
        rope.angles(pos[ti] as u32, &mut c, &mut s);
        rope.apply_with(&mut q, &c, &s);
        rope.apply_with(&mut k, &c, &s);
        want_q.extend(q);
        if slots[ti] >= 0 {
            let (kr, vr) = (round_bf(&k), round_bf(&row[(nh + nkv) * hd..]));
            for h in 0..nkv {
                let o = kv_index(slots[ti] as usize, h, nkv, hd, BS);
                want_k[o..o + hd].copy_from_slice(&kr[h * hd..(h + 1) * hd]);
                want_v[o..o + hd].copy_from_slice(&vr[h * hd..(h + 1) * hd]);
            }
        }
    }
    let dq = g.upload(&qkv)?;
    let (dp, ds, di) = (g.upload(&pos)?, g.upload(&slots)?, g.upload(&inv)?);
    let (dqn, dkn) = (g.upload(&qn)?, g.upload(&kn)?);
    let (qnp, knp) = if qwen { (ptr(&dqn), ptr(&dkn)) } else { (0, 0) };
    let db = g.upload(&qkv_bias)?;
    let bp = if bias { ptr(&db) } else { 0 };
    let (nhi, nkvi, hdi, il, bsi) = (nh as i32, nkv as i32, hd as i32, (!qwen) as i32, BS as i32);
    let tag = match (qwen, bias) {
        (true, _) => "Qwen3 (q/k norm, neox)",
        (false, false) => "Llama (interleaved)",
        (false, true) => "q|k|v bias (Qwen2), interleaved",
    };
    // One token a warp (decode steps), and the most the kernel takes (prefills): 11 tokens
    // leave the last warp's group short.
    let most = if general { 1 } else { crate::device::rope_tokens(hd) };
    let mut out = Vec::new();
    for per_warp in [1, most] {
        let (qo, kc, vc) = (
            g.zeros::<f32>(t * nh * hd)?,
            g.zeros::<u16>(want_k.len())?,
            g.zeros::<u16>(want_v.len())?,
        );
        let q16 = g.zeros::<u16>(t * nh * hd)?;
        let cfg = crate::device::rope_config_with(t, nh + 2 * nkv, hd, per_warp);
        let kernel = if general { &g.k.qkv_rope_store } else { g.rope_for(hd, per_warp) };
        let (ti, pw) = (t as i32, per_warp as i32);
        // SAFETY: qkv_rope_store's parameter list, buffers sized for t tokens and 64 slots.
        unsafe {
            g.launch(
                kernel,
                cfg,
                &[
                    &ptr(&dq),
                    &ptr(&dp),
                    &ptr(&ds),
                    &ptr(&di),
                    &qnp,
                    &knp,
                    &ptr(&qo),
                    &ptr(&q16),
                    &ptr(&kc),
                    &ptr(&vc),
                    &nhi,
                    &nkvi,
                    &hdi,
                    &il,
                    &eps,
                    &bsi,
                    &bp,
                    &ti,
                    &pw,
                ],
            )?
        };
        let got_q = g.read(&qo, t * nh * hd)?;
        let got_q16: Vec<f32> =
            g.read(&q16, t * nh * hd)?.iter().map(|&b| Dtype::F16.to_f32(b)).collect();
        let got_k = unbf(&g.read(&kc, want_k.len())?);
        let got_v = unbf(&g.read(&vc, want_v.len())?);
        let tag = format!(
            "{tag}, hd {hd}{}, {per_warp} token(s) a warp",
            if general { ", general kernel" } else { "" }
        );
        out.extend([
            // f32 both sides; sincosf vs the CPU's f32 sin/cos differ by an ulp or two of the angle.
            result(&format!("q norm+rope {tag}, f32"), abs_err(&got_q, &want_q), 1e-4),
            // The GEMM path's half-precision copy: one rounding of the kernel's own f32 q.
            result(
                &format!("q norm+rope {tag}, IEEE-half copy (tol 2^-11)"),
                rel_err(&got_q16, &got_q, 1e-2),
                Dtype::F16.unit_roundoff(),
            ),
            // K rounded to 16 bits on both sides: at most one step (2u) apart.
            result(
                &format!("k norm+rope+store {tag}, 16-bit (tol 2u)"),
                rel_err(&got_k, &want_k, 1e-2),
                2.0 * u,
            ),
            result(
                &format!("v store {tag} (exact), skipped slot untouched"),
                abs_err(&got_v, &want_v),
                0.0,
            ),
        ]);
        if most == 1 {
            break;
        }
    }
    Ok(out)
}

/// f64 paged attention for one query row over positions `0..=qpos` of a sequence's blocks.
#[allow(clippy::too_many_arguments)]
fn attend_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bt: &[i32],
    bs: usize,
    qpos: usize,
    nkv: usize,
    kvh: usize,
    hd: usize,
    window: Option<usize>,
) -> Vec<f32> {
    let slot = |p: usize| bt[p / bs] as usize * bs + p % bs;
    let scale = 1.0 / (hd as f64).sqrt();
    // Positions seen: all up to qpos, or the last `window` of them.
    let first = window.map_or(0, |w| (qpos + 1).saturating_sub(w));
    let scores: Vec<f64> = (first..=qpos)
        .map(|p| {
            let o = kv_index(slot(p), kvh, nkv, hd, bs);
            (0..hd).map(|d| q[d] as f64 * k[o + d] as f64).sum::<f64>() * scale
        })
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let z: f64 = e.iter().sum();
    (0..hd)
        .map(|d| {
            (first..=qpos)
                .map(|p| e[p - first] * v[kv_index(slot(p), kvh, nkv, hd, bs) + d] as f64)
                .sum::<f64>()
                / z
        })
        .map(|x| x as f32)
        .collect()
}

/// Which paged-attention kernel a check runs.
#[derive(Clone, Copy, PartialEq)]
enum AttKernel {
    /// CUDA cores, up to 16 rows per tile.
    Tile,
    /// CUDA cores, small tiles (decode steps only).
    Decode,
    /// Tensor cores.
    Mma,
    /// Tensor cores, small tiles (decode steps only), positions on the mma's M.
    Dec,
    /// Tensor cores, 64-row tiles of long chunks (flash-attention prefill).
    Prefill,
}

#[allow(clippy::too_many_arguments)]
fn attention(
    g: &Gpu,
    u: f64,
    nh: usize,
    nkv: usize,
    hd: usize,
    splits: usize,
    kernel: AttKernel,
    window: Option<usize>,
) -> Result<CheckResult, CudaError> {
    let decode_only = matches!(kernel, AttKernel::Decode | AttKernel::Dec);
    use crate::plan::BatchPlan;
    use tandem_engine::backend::{ForwardBatch, Logits};
    let bs = 16;
    let num_blocks = 200;
    let mut r = Rng::new(7 + nh as u64 * 31 + splits as u64);
    let kc = round_bf(&r.vec(num_blocks * bs * nkv * hd, 2.0));
    let vc = round_bf(&r.vec(num_blocks * bs * nkv * hd, 1.0));
    // A 40-token chunk after 260 cached tokens; a decode step at context 1000; a fresh
    // 5-token prompt. Blocks scattered through the pool.
    let mut b = ForwardBatch::default();
    let table = |start: u32, n: usize| -> Vec<u32> {
        (0..n as u32).map(|i| (start + i * 7) % num_blocks as u32).collect()
    };
    let prefill = kernel == AttKernel::Prefill;
    if prefill {
        // A 200-token chunk after 260 cached tokens (a prefix-cache hit) and a fresh 150-token
        // prompt: long chunks, as the prefill kernel gets them.
        b.push_seq(&[0; 200], 260, &table(3, 29), bs, Logits::None);
        b.push_seq(&[0; 150], 0, &table(150, 10), bs, Logits::None);
    } else if decode_only {
        b.push_seq(&[0], 999, &table(11, 63), bs, Logits::None);
        b.push_seq(&[0], 17, &table(5, 2), bs, Logits::None);
        b.push_seq(&[0], 0, &table(150, 1), bs, Logits::None);
    } else {
        b.push_seq(&[0; 40], 260, &table(3, 19), bs, Logits::None);
        b.push_seq(&[0], 999, &table(11, 63), bs, Logits::None);
        b.push_seq(&[0; 5], 0, &table(150, 1), bs, Logits::None);
    }
    let t = b.num_tokens();
    let q = r.vec(t * nh * hd, 1.0);
    let mut p = BatchPlan::new(&b, nh / nkv, if prefill { 64 } else { usize::MAX });
    // `splits` 0: cut by length ([`BatchPlan::split_balanced`]), up to 16 pieces a context.
    if splits > 1 {
        p.split_contexts(splits, None);
    } else if splits == 0 {
        p.split_balanced(32, p.num_tiles() * 4);
    }
    let kept = if splits == 0 { crate::plan::MAX_SPLITS } else { splits };
    let (tiles, num_tiles) =
        if prefill { (&p.long_tiles, p.num_long_tiles()) } else { (&p.tiles, p.num_tiles()) };
    let (dq, dk, dv) = (g.upload(&q)?, g.upload(&bf(&kc))?, g.upload(&bf(&vc))?);
    let (dt, dbt) = (g.upload(tiles)?, g.upload(&p.block_tables)?);
    // The kernels' per-(tile, KV head) split counters: zero before, re-armed to zero after.
    let count = g.zeros::<i32>(t * nkv)?;
    let out = g.zeros::<u16>(t * nh * hd)?;
    let (pa, pm) = (g.zeros::<f32>(kept * t * nh * hd)?, g.zeros::<f32>(kept * t * nh * 2)?);
    let (ti, nhi, nkvi, hdi, bsi, scale) =
        (t as i32, nh as i32, nkv as i32, hd as i32, bs as i32, 1.0 / (hd as f32).sqrt());
    let threads = match kernel {
        AttKernel::Mma => 64,
        AttKernel::Dec => 32 * crate::plan::dec_warps(hd) as u32,
        AttKernel::Prefill => crate::plan::prefill_threads(),
        _ => 128,
    };
    assert!(!prefill || (splits == 1 && num_tiles > 0), "the prefill kernel takes one split");
    let wi = window.map_or(i32::MAX, |w| w as i32);
    let cfg = LaunchConfig {
        grid_dim: (nkv as u32, num_tiles as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: match kernel {
            AttKernel::Mma => crate::plan::decode_smem_bytes(hd),
            AttKernel::Dec => crate::plan::dec_smem_bytes(hd),
            _ => 0,
        },
    };
    // SAFETY: attention's parameter list over buffers sized for this batch and these splits.
    // Twice: the second launch finds the counters the first left (zero, if they re-arm).
    for _ in 0..2 {
        let f = match kernel {
            AttKernel::Tile => &g.k.attention,
            AttKernel::Decode => &g.k.attention_decode,
            AttKernel::Mma if hd == 64 => &g.k.attention_mma64,
            AttKernel::Mma => &g.k.attention_mma128,
            AttKernel::Dec if hd == 64 => &g.k.attention_dec64,
            AttKernel::Dec => &g.k.attention_dec128,
            AttKernel::Prefill if hd == 64 => &g.k.attention_prefill64,
            AttKernel::Prefill => &g.k.attention_prefill128,
        };
        let (qp, kp, vp, tp, bp, op) =
            (ptr(&dq), ptr(&dk), ptr(&dv), ptr(&dt), ptr(&dbt), ptr(&out));
        let (pap, pmp, cp) = (ptr(&pa), ptr(&pm), ptr(&count));
        let args: [&dyn crate::device::KernelArg; 16] = [
            &qp, &kp, &vp, &tp, &bp, &op, &pap, &pmp, &cp, &ti, &nhi, &nkvi, &hdi, &bsi, &scale,
            &wi,
        ];
        unsafe { g.launch(f, cfg, &args)? };
    }
    let left = g.read(&count, t * nkv)?;
    if left.iter().any(|&c| c != 0) {
        return Err(CudaError::Driver(format!("split counters left at {left:?}")));
    }
    let got = unbf(&g.read(&out, t * nh * hd)?);
    let mut err = 0f64;
    for s in &b.seqs {
        let bt: Vec<i32> = s.block_table.iter().map(|&x| x as i32).collect();
        for i in 0..s.query_len {
            let row = s.query_start + i;
            let qpos = s.context_len - s.query_len + i;
            for h in 0..nh {
                let qr = &q[(row * nh + h) * hd..(row * nh + h + 1) * hd];
                let want = attend_ref(qr, &kc, &vc, &bt, bs, qpos, nkv, h / (nh / nkv), hd, window);
                err = err.max(abs_err(&got[(row * nh + h) * hd..(row * nh + h + 1) * hd], &want));
            }
        }
    }
    // Output in 16 bits (values within ±1): one rounding plus f32 softmax error.
    let what = match kernel {
        AttKernel::Decode => "decode steps at 1000, 18, 1 (small-tile kernel)",
        AttKernel::Tile => "prefill+prefix, decode 1000, fresh prompt",
        AttKernel::Mma => "prefill+prefix, decode 1000, fresh prompt (tensor cores)",
        AttKernel::Dec => "decode steps at 1000, 18, 1 (tensor cores, small tiles)",
        AttKernel::Prefill => "200 after 260 cached, fresh 150 (prefill kernel)",
    };
    let seen = window.map_or(String::new(), |w| format!(", window {w}"));
    Ok(result(
        &format!(
            "paged attention nh={nh} nkv={nkv} hd={hd} splits={}{seen}: {what}; tol 1.3u abs",
            if splits == 0 { "by length".to_string() } else { splits.to_string() }
        ),
        err,
        1.3 * u,
    ))
}

fn silu_mul(g: &Gpu, u: f64) -> Result<Vec<CheckResult>, CudaError> {
    let mut out = Vec::new();
    // A width of a multiple of 8 (16-byte loads) and one that is not (scalar loads); gate|up in
    // the 16-bit type, rounded alike for the reference.
    for (f, gelu) in [(1536, 0i32), (1536, 1), (1534, 0)] {
        let t = 7;
        let mut r = Rng::new(9);
        let gu = round_bf(&r.vec(t * 2 * f, 4.0));
        let mut want = Vec::new();
        for row in gu.chunks_exact(2 * f) {
            let mut a = row[..f].to_vec();
            if gelu == 1 {
                ops::gelu_tanh_mul(&mut a, &row[f..]);
            } else {
                ops::silu_mul(&mut a, &row[f..]);
            }
            want.extend(a);
        }
        let (dg, dout) = (g.upload(&bf(&gu))?, g.zeros::<u16>(t * f)?);
        let fi = f as i32;
        let cfg = LaunchConfig {
            grid_dim: (2, t as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: silu_mul(const h16*, h16*, int, int).
        unsafe { g.launch(&g.k.silu_mul, cfg, &[&ptr(&dg), &ptr(&dout), &fi, &gelu])? };
        let got = unbf(&g.read(&dout, t * f)?);
        let name = if gelu == 1 { "gelu(tanh)·mul" } else { "silu·mul" };
        out.push(result(
            &format!("{name} 16-bit→16-bit, width {f} (tol 2u)"),
            rel_err(&got, &want, 1e-2),
            2.0 * u,
        ));
    }
    Ok(out)
}

/// `sample_rows` over `logits` (rows named by `order`, sampled as `specs` say): the tokens, then
/// their log-probabilities' bits.
fn sample_rows(
    g: &Gpu,
    logits: &cudarc::driver::CudaSlice<f32>,
    order: &[u32],
    specs: &[tandem_engine::backend::RowSampling],
    vocab: usize,
) -> Result<Vec<i32>, CudaError> {
    let rows = specs.len();
    let da = g.upload(&crate::backend::sampling_args(order, specs))?;
    let dout = g.zeros::<i32>(2 * rows)?;
    let (ni, vi) = (rows as i32, vocab as i32);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: sample_rows(logits, args, out, n, vocab) with 7n argument words and 2n outputs.
    unsafe { g.launch(&g.k.sample_rows, cfg, &[&ptr(logits), &ptr(&da), &ptr(&dout), &ni, &vi])? };
    g.read(&dout, 2 * rows)
}

/// Structured outputs on the device: random token masks (about one token in eight allowed,
/// some rows unmasked, one row allowing a single token) applied by `mask_rows`, then
/// `sample_rows`; every token equals the host sampler's on the masked row (minus infinity where
/// the mask is clear, as the engine masks before sampling), and so does its log-probability.
fn masked_sampling(g: &Gpu) -> Result<Vec<CheckResult>, CudaError> {
    use tandem_engine::backend::RowSampling;
    use tandem_engine::sampling::sampler::gumbel_max;
    let vocab: usize = 49_152;
    let words = vocab.div_ceil(32);
    let t = RowSampling::new;
    let specs: Vec<RowSampling> = vec![
        t(0.0, 0),
        t(0.7, 1),
        t(1.0, 2),
        RowSampling { top_k: 20, ..t(1.0, 3) },
        RowSampling { top_p: 0.9, ..t(0.8, 4) },
        t(0.0, 5),
        t(1.0, 6),
        t(0.0, 7),
    ];
    let rows = specs.len();
    let mut r = Rng::new(23);
    let logits = r.vec(rows * vocab, 8.0);
    let mut bits_rng = tandem_engine::sampling::sampler::Rng::new(29);
    let mut word = move || (bits_rng.next_u64() & bits_rng.next_u64() & bits_rng.next_u64()) as u32;
    // Masks for rows 0..4 and 6 (5 and 7 unmasked); row 6 allows token 4321 only.
    let mut masks: Vec<Option<Vec<u32>>> = (0..rows)
        .map(|i| (i < 5).then(|| (0..words).map(|_| word()).collect::<Vec<u32>>()))
        .collect();
    let mut one = vec![0u32; words];
    one[4321 / 32] |= 1 << (4321 % 32);
    masks[6] = Some(one);
    let masked_logits: Vec<f32> = logits
        .chunks_exact(vocab)
        .zip(&masks)
        .flat_map(|(row, m)| {
            row.iter().enumerate().map(move |(i, &l)| match m {
                Some(m) if (m[i / 32] >> (i % 32)) & 1 == 0 => f32::NEG_INFINITY,
                _ => l,
            })
        })
        .collect();
    let want: Vec<_> =
        masked_logits.chunks_exact(vocab).zip(&specs).map(|(l, s)| gumbel_max(l, s)).collect();
    let order: Vec<u32> = (0..rows as u32).collect();
    let masked: Vec<(u32, &Vec<u32>)> =
        masks.iter().enumerate().filter_map(|(i, m)| m.as_ref().map(|m| (i as u32, m))).collect();
    let which: Vec<u32> = masked.iter().map(|m| m.0).collect();
    let bits: Vec<u32> = masked.iter().flat_map(|m| m.1.iter().copied()).collect();
    let dl = g.upload(&logits)?;
    let (dw, db) = (g.upload(&which)?, g.upload(&bits)?);
    let (vi, wi) = (vocab as i32, words as i32);
    let cfg = LaunchConfig {
        grid_dim: (which.len() as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: mask_rows(logits, rows, masks, vocab, words) over the named rows of `dl`.
    unsafe { g.launch(&g.k.mask_rows, cfg, &[&ptr(&dl), &ptr(&dw), &ptr(&db), &vi, &wi])? };
    let out = sample_rows(g, &dl, &order, &specs, vocab)?;
    let (mut wrong, mut disallowed, mut lp_err) = (0usize, 0usize, 0f64);
    for k in 0..rows {
        let tok = out[k] as u32;
        if tok != want[k].token_id {
            wrong += 1;
        }
        if let Some(m) = &masks[k] {
            if (m[tok as usize / 32] >> (tok % 32)) & 1 == 0 {
                disallowed += 1;
            }
        }
        lp_err = lp_err.max((f32::from_bits(out[rows + k] as u32) - want[k].logprob).abs() as f64);
    }
    Ok(vec![
        result("masked sampling: tokens ≠ CPU on the masked rows", wrong as f64, 0.0),
        result("masked sampling: tokens outside their mask", disallowed as f64, 0.0),
        result("masked sampling: chosen log-prob vs CPU (abs)", lp_err, 1e-4),
    ])
}

fn sampling(g: &Gpu) -> Result<Vec<CheckResult>, CudaError> {
    use tandem_engine::backend::RowSampling;
    use tandem_engine::sampling::sampler::gumbel_max;
    let vocab = 151_936;
    // Greedy rows (one with a tie: the lower id wins), tempered rows with their seeds, then
    // min-p, top-k and top-p alone and together.
    let t = RowSampling::new;
    let specs: Vec<RowSampling> = vec![
        t(0.0, 0),
        t(0.0, 0),
        t(0.0, 0),
        t(0.6, 1),
        t(0.6, 2),
        t(1.0, 3),
        t(0.3, 4),
        t(0.6, 5),
        RowSampling { top_k: 50, ..t(1.0, 6) },
        RowSampling { top_p: 0.95, ..t(1.0, 7) },
        RowSampling { min_p: 0.5, ..t(1.0, 8) },
        RowSampling { top_k: 1000, top_p: 0.9, min_p: 0.05, ..t(0.8, 9) },
        RowSampling { top_k: 1, ..t(1.0, 10) },
    ];
    let rows = specs.len();
    let mut r = Rng::new(11);
    let mut logits = r.vec(rows * vocab, 10.0);
    logits[2 * vocab + 140_000] = 50.0;
    logits[2 * vocab + 123] = 50.0;
    let want: Vec<_> =
        logits.chunks_exact(vocab).zip(&specs).map(|(l, r)| gumbel_max(l, r)).collect();
    let order: Vec<u32> = (0..rows as u32).rev().collect(); // rows named out of order
    let named: Vec<RowSampling> = order.iter().map(|&i| specs[i as usize]).collect();
    let out = sample_rows(g, &g.upload(&logits)?, &order, &named, vocab)?;
    let (mut wrong, mut lp_err) = (0usize, 0f64);
    for (k, &i) in order.iter().enumerate() {
        let w = want[i as usize];
        if out[k] as u32 != w.token_id {
            wrong += 1;
        }
        lp_err = lp_err.max((f32::from_bits(out[rows + k] as u32) - w.logprob).abs() as f64);
    }
    Ok(vec![
        result(
            "sampling: tokens ≠ CPU Gumbel-max (greedy with a tie, T 0.3–1, min-p, top-k, top-p)",
            wrong as f64,
            0.0,
        ),
        result("sampling: chosen log-prob vs CPU (abs)", lp_err, 1e-4),
    ])
}
