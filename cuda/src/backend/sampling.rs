//! Token choice on the GPU: the logits rows of a pass sampled by the `sample_rows` kernel
//! (Gumbel-max with each row's temperature and seed), so only tokens reach the host.

use cudarc::driver::LaunchConfig;
use tandem_engine::backend::{ForwardBatch, RowSampling};
use tandem_engine::sampler::TokenLogprob;

use super::{CudaBackend, Pass};
use crate::device::ptr;
use crate::CudaError;

impl CudaBackend {
    /// Runs a full pass and chooses each logits row's token on the device; only the tokens and
    /// their log-probabilities are copied out.
    pub(super) fn run_sampled(&mut self, b: &ForwardBatch, rows: &[RowSampling]) -> Result<Vec<TokenLogprob>, CudaError> {
        let first = match self.pass(b, self.cfg.num_layers)? {
            Pass::Graph => {
                let idx: Vec<i32> = b.logits_indices.iter().map(|&r| r as i32).collect();
                return self.sample(&idx, rows);
            }
            Pass::Eager(first) => first,
        };
        self.mark("sampling")?;
        let mut out = self.sample(&(0..first as i32).collect::<Vec<_>>(), &rows[..first])?;
        let mut done = first;
        while done < rows.len() {
            let m = (rows.len() - done).min(self.logits_cap);
            self.head_only(m, done)?;
            out.extend(self.sample(&(0..m as i32).collect::<Vec<_>>(), &rows[done..done + m])?);
            done += m;
        }
        Ok(out)
    }

    /// Samples `rows[i]` from row `buf_rows[i]` of the logits buffer (at most `logits_cap`).
    fn sample(&mut self, buf_rows: &[i32], rows: &[RowSampling]) -> Result<Vec<TokenLogprob>, CudaError> {
        let n = rows.len();
        let temps: Vec<f32> = rows.iter().map(|r| r.temperature).collect();
        let seeds: Vec<u64> = rows.iter().map(|r| r.seed).collect();
        let top_k: Vec<i32> = rows.iter().map(|r| r.top_k).collect();
        let top_p: Vec<f32> = rows.iter().map(|r| r.top_p).collect();
        let min_p: Vec<f32> = rows.iter().map(|r| r.min_p).collect();
        let g = &self.gpu;
        g.write(&mut self.a.sample_rows, buf_rows)?;
        g.write(&mut self.a.sample_temps, &temps)?;
        g.write(&mut self.a.sample_seeds, &seeds)?;
        g.write(&mut self.a.sample_top_k, &top_k)?;
        g.write(&mut self.a.sample_top_p, &top_p)?;
        g.write(&mut self.a.sample_min_p, &min_p)?;
        let a = &self.a;
        let (ni, vi) = (n as i32, self.cfg.vocab_size as i32);
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        let args = [ptr(&a.logits), ptr(&a.sample_rows), ptr(&a.sample_temps), ptr(&a.sample_seeds), ptr(&a.sample_top_k), ptr(&a.sample_top_p), ptr(&a.sample_min_p), ptr(&a.sample_out)];
        // SAFETY: sample_rows over n ≤ logits_cap rows of the logits buffer, each per-row array
        // holding n entries; out holds 2n ints.
        unsafe { g.launch(&g.k.sample_rows, cfg, &[&args[0], &args[1], &args[2], &args[3], &args[4], &args[5], &args[6], &args[7], &ni, &vi])? };
        let out = g.read(&a.sample_out, 2 * n)?;
        Ok((0..n).map(|i| TokenLogprob { token_id: out[i] as u32, logprob: f32::from_bits(out[n + i] as u32) }).collect())
    }
}
