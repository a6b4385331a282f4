//! Where the CPU backend's time goes, by operation of the forward pass, with the thread pool's
//! region count: off unless `TANDEM_CPU_PROFILE=1`, and then read by `tandem bench` (`report`).
//! A span costs one relaxed check of a cached flag when profiling is off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// The operations timed.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// The whole forward pass (every other operation is inside it).
    Forward,
    /// Embedding rows and rotary angles.
    Embed,
    /// RMSNorms before the attention and the MLP.
    Norm,
    /// The fused q|k|v projection.
    Qkv,
    /// Bias, q/k norms and rotary embedding of q and k, and K and V written into the cache.
    Rope,
    /// Attention over the cached context.
    Attention,
    /// The attention output projection.
    OProj,
    /// Residual adds (with Gemma 3's post-norms).
    Residual,
    /// The fused gate|up projection.
    GateUp,
    /// The gated activation.
    Act,
    /// The MLP's down projection.
    Down,
    /// The final norm and the LM head.
    LmHead,
}

const OPS: [Op; 12] = [
    Op::Forward,
    Op::Embed,
    Op::Norm,
    Op::Qkv,
    Op::Rope,
    Op::Attention,
    Op::OProj,
    Op::Residual,
    Op::GateUp,
    Op::Act,
    Op::Down,
    Op::LmHead,
];

static NANOS: [AtomicU64; OPS.len()] = [const { AtomicU64::new(0) }; OPS.len()];
static REGIONS: AtomicU64 = AtomicU64::new(0);
static TASKS: AtomicU64 = AtomicU64::new(0);

/// Whether `TANDEM_CPU_PROFILE` is set to `1` (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CPU_PROFILE").is_ok_and(|v| v == "1"))
}

/// Times the enclosing scope as `op` while it lives.
pub struct Span(Option<(Op, Instant)>);

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((op, t0)) = self.0 {
            NANOS[op as usize].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// Starts timing `op` (a no-op unless profiling is on).
pub fn span(op: Op) -> Span {
    Span(enabled().then(|| (op, Instant::now())))
}

/// Runs `f`, timed as `op`.
pub fn timed<R>(op: Op, f: impl FnOnce() -> R) -> R {
    let _s = span(op);
    f()
}

/// Counts one parallel region of `tasks` tasks handed to the pool's workers.
pub(crate) fn count_region(tasks: usize) {
    if enabled() {
        REGIONS.fetch_add(1, Ordering::Relaxed);
        TASKS.fetch_add(tasks as u64, Ordering::Relaxed);
    }
}

/// What was measured since the start (or the last [`reset`]), as JSON: seconds per operation,
/// parallel regions and their tasks; `None` when profiling is off.
pub fn report() -> Option<serde_json::Value> {
    if !enabled() {
        return None;
    }
    let mut secs = serde_json::Map::new();
    for op in OPS {
        let s = NANOS[op as usize].load(Ordering::Relaxed) as f64 * 1e-9;
        secs.insert(format!("{op:?}"), serde_json::json!(s));
    }
    Some(serde_json::json!({
        "seconds": secs,
        "pool_regions": REGIONS.load(Ordering::Relaxed),
        "pool_tasks": TASKS.load(Ordering::Relaxed),
    }))
}

/// Zeroes every counter.
pub fn reset() {
    NANOS.iter().chain([&REGIONS, &TASKS]).for_each(|a| a.store(0, Ordering::Relaxed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_index_their_own_slot() {
        for (i, op) in OPS.iter().enumerate() {
            assert_eq!(*op as usize, i);
        }
    }
}
