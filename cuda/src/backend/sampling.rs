//! Token choice on the GPU: the logits rows of a pass sampled by the `sample_rows` kernel
//! (Gumbel-max with each row's temperature, filters and seed), so only tokens reach the host.

use cudarc::driver::LaunchConfig;
use tandem_engine::backend::{ForwardBatch, RowSampling};
use tandem_engine::sampling::sampler::TokenLogprob;

use super::{CudaBackend, Pass};

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use crate::device::ptr;
use crate::CudaError;

/// A pass [`CudaBackend::launch_pass`] left for [`CudaBackend::collect_pass`].
pub(crate) enum Launched {
    /// The sampling kernel is queued over `rows` rows, its output copied to `samples_host[slot]`.
    Queued { rows: usize, slot: usize },
    /// The tokens are already on the host.
    Ready(Vec<TokenLogprob>),
}

/// Page-locked memory a queued pass's tokens and log-probabilities are copied to, the event
/// that copy completes and the one queued before the pass (the two time the pass on the device).
pub(crate) struct SampleSlot {
    buf: PinnedHostSlice<i32>,
    started: CudaEvent,
    copied: CudaEvent,
}

impl CudaBackend {
    /// Runs a full pass and chooses each logits row's token on the device; only the tokens and
    /// their log-probabilities are copied out.
    pub(crate) fn run_sampled(
        &mut self,
        b: &ForwardBatch,
        rows: &[RowSampling],
        masks: &mut dyn FnMut() -> Vec<Option<Vec<u32>>>,
    ) -> Result<Vec<TokenLogprob>, CudaError> {
        let pass = self.pass(b, self.cfg.num_layers)?;
        // The pass is queued: the host computes the token masks while the device runs it.
        let masks = masks();
        if !masks.is_empty() && masks.len() != rows.len() {
            return Err(CudaError::Unsupported(format!(
                "{} token masks for {} sampling rows",
                masks.len(),
                rows.len()
            )));
        }
        let masks: Vec<Option<&[u32]>> = masks.iter().map(|m| m.as_deref()).collect();
        let mask =
            |from: usize, to: usize| if masks.is_empty() { &[][..] } else { &masks[from..to] };
        let first = match pass {
            Pass::Graph => {
                let idx: Vec<u32> = b.logits_indices.iter().map(|&r| r as u32).collect();
                return self.sample(&idx, rows, &masks);
            }
            Pass::Eager(first) => first,
        };
        self.mark("sampling")?;
        let idx: Vec<u32> = (0..first as u32).collect();
        let mut out = self.sample(&idx, &rows[..first], mask(0, first))?;
        let mut done = first;
        while done < rows.len() {
            let m = (rows.len() - done).min(self.logits_cap);
            self.head_only(m, done)?;
            let idx: Vec<u32> = (0..m as u32).collect();
            out.extend(self.sample(&idx, &rows[done..done + m], mask(done, done + m))?);
            done += m;
        }
        Ok(out)
    }

    /// Queues a full pass and its sampling (no token masks) and returns without waiting;
    /// [`CudaBackend::collect_pass`] reads the tokens. Everything the host copies up (plan,
    /// sampling arguments) is copied before the pass's first kernel is queued, so no copy
    /// waits for the device.
    pub(crate) fn launch_pass(
        &mut self,
        b: &ForwardBatch,
        rows: &[RowSampling],
    ) -> Result<(), CudaError> {
        if self.launched.len() >= 2 {
            return Err(CudaError::Unsupported("two launched passes are not collected".into()));
        }
        let patched;
        let b = match self.launched.back() {
            _ if b.deferred.is_empty() => b,
            None => {
                return Err(CudaError::Unsupported(
                    "deferred tokens without a launched pass".into(),
                ))
            }
            Some(Launched::Ready(prev)) => {
                // That pass's tokens are on the host already: they go up with the batch.
                let mut c = b.clone();
                for (tok, row) in std::mem::take(&mut c.deferred) {
                    let t = prev.get(row as usize).ok_or_else(|| {
                        CudaError::Unsupported(format!("deferred row {row} beyond the pass"))
                    })?;
                    c.token_ids[tok as usize] = t.token_id;
                }
                patched = c;
                &patched
            }
            Some(Launched::Queued { rows, .. }) => {
                if let Some(&(_, r)) = b.deferred.iter().find(|&&(_, r)| r as usize >= *rows) {
                    return Err(CudaError::Unsupported(format!(
                        "deferred row {r} beyond the pass"
                    )));
                }
                b
            }
        };
        let n = rows.len();
        // Every pass leaves the rows asked for at 0..n of the logits buffer, in the batch's
        // order: an eager or mixed-step pass gathers them there, and a decode graph (taken only
        // when every token is asked for, in order) leaves token i's in row i. So steps with
        // prompt chunks are queued too: run synchronously, each one's host work (its plan and
        // kernel launches) waited for the device and the device for it.
        if n > self.logits_cap || (sync_prompt_steps() && !b.logits_in_order()) {
            // Rows beyond the logits buffer are sampled chunk by chunk: all at once, now.
            let tokens = self.run_sampled(b, rows, &mut Vec::new)?;
            self.launched.push_back(Launched::Ready(tokens));
            return Ok(());
        }
        if self.samples_host.is_empty() {
            for _ in 0..2 {
                // SAFETY: page-locked memory written only by the copies below, read after
                // their event.
                let buf = unsafe { self.gpu.ctx.alloc_pinned::<i32>(2 * self.logits_cap) }?;
                // Timed events (the default flags), unlike cudarc's default.
                let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                let (started, copied) =
                    (self.gpu.ctx.new_event(timed)?, self.gpu.ctx.new_event(timed)?);
                self.samples_host.push(SampleSlot { buf, started, copied });
            }
        }
        // The slot the pass still in flight (if any) does not use.
        let slot = match self.launched.front() {
            Some(Launched::Queued { slot, .. }) => 1 - slot,
            _ => 0,
        };
        let idx: Vec<u32> = (0..n as u32).collect();
        // Reached on the device when the pass before this one is done: the device's time on
        // this pass runs from there to its tokens' copy.
        self.samples_host[slot].started.record(&self.gpu.stream)?;
        self.gpu.write(&mut self.a.sample_args, &sampling_args(&idx, rows))?;
        self.pass(b, self.cfg.num_layers)?;
        let clock = std::time::Instant::now();
        self.queue_sample_rows(n)?;
        // The tokens leave for the host right away: a pass launched behind this one samples
        // into the same device buffer.
        let s = &mut self.samples_host[slot];
        self.gpu.stream.memcpy_dtoh(&self.a.sample_out.slice(..2 * n), &mut s.buf)?;
        s.copied.record(&self.gpu.stream)?;
        self.host_times.sample += clock.elapsed().as_secs_f64();
        self.launched.push_back(Launched::Queued { rows: n, slot });
        Ok(())
    }

    /// The tokens of the oldest pass [`CudaBackend::launch_pass`] queued (waits for that pass
    /// only).
    pub(crate) fn collect_pass(&mut self) -> Result<Vec<TokenLogprob>, CudaError> {
        match self.launched.pop_front() {
            Some(Launched::Ready(tokens)) => Ok(tokens),
            Some(Launched::Queued { rows, slot }) => {
                let s = &self.samples_host[slot];
                s.copied.synchronize()?;
                self.device_seconds += f64::from(s.started.elapsed_ms(&s.copied)?) / 1e3;
                Ok(tokens_of(&s.buf.as_slice()?[..2 * rows]))
            }
            None => Err(CudaError::Unsupported("no pass was launched".into())),
        }
    }

    /// Queues the copy of a launched pass's deferred tokens from the tokens the pass before it
    /// sampled (still in `sample_out`: this pass has not sampled yet) into the uploaded plan.
    pub(super) fn take_deferred(&mut self, b: &ForwardBatch) -> Result<(), CudaError> {
        if b.deferred.is_empty() {
            return Ok(());
        }
        let pairs: Vec<u32> = b.deferred.iter().flat_map(|&(t, r)| [t, r]).collect();
        self.gpu.write(&mut self.a.take_pairs, &pairs)?;
        let g = &self.gpu;
        let n = b.deferred.len() as i32;
        let cfg = LaunchConfig::for_num_elems(n as u32);
        // SAFETY: take_sampled(tokens, sampled, pairs, n): `pairs` holds n (token, row) pairs,
        // tokens of this batch (checked by `validate`) and rows of the previous pass's samples.
        unsafe {
            g.launch(
                &g.k.take_sampled,
                cfg,
                &[&ptr(&self.a.tokens), &ptr(&self.a.sample_out), &ptr(&self.a.take_pairs), &n],
            )
        }
    }

    /// Samples `rows[i]` from row `buf_rows[i]` of the logits buffer (at most `logits_cap`).
    fn sample(
        &mut self,
        buf_rows: &[u32],
        rows: &[RowSampling],
        masks: &[Option<&[u32]>],
    ) -> Result<Vec<TokenLogprob>, CudaError> {
        let n = rows.len();
        let g = &self.gpu;
        // Constrained rows: their disallowed tokens to minus infinity first.
        let masked: Vec<(u32, &[u32])> =
            masks.iter().zip(buf_rows).filter_map(|(m, &r)| m.map(|m| (r, m))).collect();
        if !masked.is_empty() {
            let words = self.cfg.vocab_size.div_ceil(32);
            let mut bits = vec![0u32; masked.len() * words];
            for (k, (_, m)) in masked.iter().enumerate() {
                let w = m.len().min(words);
                bits[k * words..k * words + w].copy_from_slice(&m[..w]);
            }
            let which: Vec<u32> = masked.iter().map(|&(r, _)| r).collect();
            let (dw, db) = (g.upload(&which)?, g.upload(&bits)?);
            let (vi, wi) = (self.cfg.vocab_size as i32, words as i32);
            let cfg = LaunchConfig {
                grid_dim: (masked.len() as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: mask_rows(logits, rows, masks, vocab, words): `which` names rows of the
            // logits buffer, `bits` holds `words` words per named row.
            unsafe {
                g.launch(
                    &g.k.mask_rows,
                    cfg,
                    &[&ptr(&self.a.logits), &ptr(&dw), &ptr(&db), &vi, &wi],
                )?
            };
        }
        g.write(&mut self.a.sample_args, &sampling_args(buf_rows, rows))?;
        self.queue_sample_rows(n)?;
        self.read_samples(n)
    }

    /// Queues the `sample_rows` kernel over the first `n` entries of the uploaded sampling
    /// arguments.
    fn queue_sample_rows(&self, n: usize) -> Result<(), CudaError> {
        let g = &self.gpu;
        let (ni, vi) = (n as i32, self.cfg.vocab_size as i32);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: sample_rows(logits, args, out, n, vocab) over n ≤ logits_cap rows of the logits
        // buffer; args holds 7n words, out 2n ints.
        unsafe {
            g.launch(
                &g.k.sample_rows,
                cfg,
                &[
                    &ptr(&self.a.logits),
                    &ptr(&self.a.sample_args),
                    &ptr(&self.a.sample_out),
                    &ni,
                    &vi,
                ],
            )
        }
    }

    /// The `n` tokens the last `sample_rows` kernel chose, with their log-probabilities
    /// (waits for the device).
    fn read_samples(&self, n: usize) -> Result<Vec<TokenLogprob>, CudaError> {
        Ok(tokens_of(&self.gpu.read(&self.a.sample_out, 2 * n)?))
    }
}

/// `sample_rows`' output for n rows (n tokens, then the bits of their log-probabilities) as
/// tokens.
fn tokens_of(out: &[i32]) -> Vec<TokenLogprob> {
    let n = out.len() / 2;
    (0..n)
        .map(|i| TokenLogprob {
            token_id: out[i] as u32,
            logprob: f32::from_bits(out[n + i] as u32),
        })
        .collect()
}

/// The `sample_rows` kernel's arguments, one upload: seven arrays of `rows.len()` words — the
/// logits buffer row, temperature, top-k, top-p, min-p (floats as bits), the seed's low and high
/// words.
pub(crate) fn sampling_args(buf_rows: &[u32], rows: &[RowSampling]) -> Vec<u32> {
    let mut a = Vec::with_capacity(7 * rows.len());
    a.extend_from_slice(&buf_rows[..rows.len()]);
    a.extend(rows.iter().map(|r| r.temperature.to_bits()));
    a.extend(rows.iter().map(|r| r.top_k as u32));
    a.extend(rows.iter().map(|r| r.top_p.to_bits()));
    a.extend(rows.iter().map(|r| r.min_p.to_bits()));
    a.extend(rows.iter().map(|r| r.seed as u32));
    a.extend(rows.iter().map(|r| (r.seed >> 32) as u32));
    a
}

/// `TANDEM_SYNC_PROMPT_STEPS=1` runs steps whose logits rows are not the batch's first rows
/// (steps with prompt chunks) synchronously, as before they were queued (for comparison).
fn sync_prompt_steps() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_SYNC_PROMPT_STEPS").is_ok_and(|v| v == "1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_args_are_seven_arrays_in_the_kernels_order() {
        let rows = [
            RowSampling {
                top_k: 50,
                top_p: 0.9,
                min_p: 0.05,
                ..RowSampling::new(0.6, 0x1234_5678_9abc_def0)
            },
            RowSampling::new(0.0, 7),
        ];
        let a = sampling_args(&[3, 1], &rows);
        assert_eq!(a.len(), 14);
        assert_eq!(&a[0..2], &[3, 1]);
        assert_eq!(f32::from_bits(a[2]), 0.6);
        assert_eq!(a[4] as i32, 50);
        assert_eq!(f32::from_bits(a[6]), 0.9);
        assert_eq!(f32::from_bits(a[8]), 0.05);
        assert_eq!((a[10] as u64) | ((a[12] as u64) << 32), 0x1234_5678_9abc_def0);
        assert_eq!((a[11] as u64) | ((a[13] as u64) << 32), 7);
    }
}
