//! Token choice on the GPU: the logits rows of a pass sampled by the `sample_rows` kernel
//! (Gumbel-max with each row's temperature, filters and seed), so only tokens reach the host.

use cudarc::driver::LaunchConfig;
use tandem_engine::backend::{ForwardBatch, RowSampling};
use tandem_engine::sampling::sampler::TokenLogprob;

use super::{CudaBackend, Pass};

/// A pass [`CudaBackend::launch_pass`] left for [`CudaBackend::collect_pass`].
pub(crate) enum Launched {
    /// The sampling kernel is queued over this many rows.
    Queued(usize),
    /// The tokens are already on the host.
    Ready(Vec<TokenLogprob>),
}
use crate::device::ptr;
use crate::CudaError;

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
        if self.launched.is_some() {
            return Err(CudaError::Unsupported("the launched pass was not collected".into()));
        }
        let n = rows.len();
        // A runner's batch asks for rows 0..n in order; an eager pass leaves them there, and a
        // decode graph leaves token i's in row i.
        let in_order = b.logits_indices.iter().enumerate().all(|(i, &r)| i == r);
        if n > self.logits_cap || !in_order {
            // Rows beyond the logits buffer are sampled chunk by chunk: all at once, now.
            let tokens = self.run_sampled(b, rows, &mut Vec::new)?;
            self.launched = Some(Launched::Ready(tokens));
            return Ok(());
        }
        let idx: Vec<u32> = (0..n as u32).collect();
        self.gpu.write(&mut self.a.sample_args, &sampling_args(&idx, rows))?;
        self.pass(b, self.cfg.num_layers)?;
        self.queue_sample_rows(n)?;
        self.launched = Some(Launched::Queued(n));
        Ok(())
    }

    /// The tokens of the pass [`CudaBackend::launch_pass`] queued (waits for the device).
    pub(crate) fn collect_pass(&mut self) -> Result<Vec<TokenLogprob>, CudaError> {
        match self.launched.take() {
            Some(Launched::Ready(tokens)) => Ok(tokens),
            Some(Launched::Queued(n)) => self.read_samples(n),
            None => Err(CudaError::Unsupported("no pass was launched".into())),
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
        let out = self.gpu.read(&self.a.sample_out, 2 * n)?;
        Ok((0..n)
            .map(|i| TokenLogprob {
                token_id: out[i] as u32,
                logprob: f32::from_bits(out[n + i] as u32),
            })
            .collect())
    }
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
