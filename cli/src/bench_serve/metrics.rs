//! What `tandem bench serve` reports, computed from each request's timeline the way
//! `vllm bench serve` does: request / output / total token throughput, TTFT, TPOT, ITL and
//! end-to-end latency (mean, median, p90, p99), goodput against SLOs, and errors by kind.

use std::collections::BTreeMap;

use serde::Serialize;

/// One finished (or failed) request, times in seconds from its start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Output tokens (the server's usage, else one per streamed chunk with text).
    pub output_tokens: usize,
    /// When each streamed chunk with output arrived.
    pub chunk_times: Vec<f64>,
    /// When the response ended.
    pub end: f64,
    /// Why it failed, if it did (e.g. `http_503`, `timeout`, `connect`, `stream_error`).
    pub error: Option<String>,
}

impl Timeline {
    /// Time to first token.
    pub fn ttft(&self) -> Option<f64> {
        self.chunk_times.first().copied()
    }

    /// Time per output token after the first: `(end − ttft) / (output_tokens − 1)`.
    pub fn tpot(&self) -> Option<f64> {
        let t = self.ttft()?;
        (self.output_tokens > 1).then(|| (self.end - t) / (self.output_tokens - 1) as f64)
    }

    /// Gaps between successive chunks.
    pub fn itls(&self) -> impl Iterator<Item = f64> + '_ {
        self.chunk_times.windows(2).map(|w| w[1] - w[0])
    }
}

/// Mean, median, p90, p99 of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// 50th percentile.
    pub median_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
}

/// The `p`-th percentile (0..=100) of sorted `xs`, interpolating linearly (numpy's default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let k = (sorted.len() - 1) as f64 * p / 100.0;
    let (lo, hi) = (k.floor() as usize, k.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (k - lo as f64)
}

/// Statistics of `xs` (seconds), reported in milliseconds.
pub fn stats(xs: &[f64]) -> Stats {
    if xs.is_empty() {
        return Stats::default();
    }
    let mut v: Vec<f64> = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let ms = |x: f64| x * 1000.0;
    Stats {
        mean_ms: ms(v.iter().sum::<f64>() / v.len() as f64),
        median_ms: ms(percentile(&v, 50.0)),
        p90_ms: ms(percentile(&v, 90.0)),
        p99_ms: ms(percentile(&v, 99.0)),
    }
}

/// Service-level objectives for goodput.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    /// Longest acceptable TTFT, ms.
    pub ttft_ms: Option<f64>,
    /// Longest acceptable TPOT, ms.
    pub tpot_ms: Option<f64>,
    /// Longest acceptable end-to-end latency, ms.
    pub e2e_ms: Option<f64>,
}

impl Slo {
    /// Parses `ttft:500 tpot:50 e2e:10000` (milliseconds; any subset).
    pub fn parse(items: &[String]) -> Result<Slo, String> {
        let mut s = Slo::default();
        for it in items {
            let (k, v) =
                it.split_once(':').ok_or_else(|| format!("SLO '{it}' is not name:milliseconds"))?;
            let v: f64 = v
                .parse()
                .map_err(|_| format!("SLO '{it}': '{v}' is not a number of milliseconds"))?;
            match k {
                "ttft" => s.ttft_ms = Some(v),
                "tpot" => s.tpot_ms = Some(v),
                "e2e" => s.e2e_ms = Some(v),
                _ => return Err(format!("unknown SLO '{k}' (ttft, tpot, e2e)")),
            }
        }
        Ok(s)
    }

    /// Whether a successful request met every objective.
    pub fn met(&self, t: &Timeline) -> bool {
        let ok = |limit: Option<f64>, v: Option<f64>| {
            limit.is_none_or(|l| v.is_some_and(|v| v * 1000.0 <= l))
        };
        ok(self.ttft_ms, t.ttft())
            && ok(self.tpot_ms, t.tpot().or(Some(0.0)))
            && ok(self.e2e_ms, Some(t.end))
    }

    /// Whether any objective is set.
    pub fn any(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2e_ms.is_some()
    }
}

/// The benchmark's result.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// Requests that completed.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Failures by kind.
    pub errors: BTreeMap<String, usize>,
    /// Wall time of the run, s.
    pub duration_s: f64,
    /// Prompt tokens of completed requests.
    pub total_input_tokens: usize,
    /// Output tokens of completed requests.
    pub total_output_tokens: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Prompt plus output tokens per second.
    pub total_token_throughput: f64,
    /// Requests meeting every SLO, per second (when SLOs are given).
    pub goodput: Option<f64>,
    /// Time to first token.
    pub ttft: Stats,
    /// Time per output token (after the first).
    pub tpot: Stats,
    /// Inter-token (inter-chunk) latency.
    pub itl: Stats,
    /// End-to-end latency.
    pub e2e: Stats,
}

/// Aggregates timelines over a run of `duration` seconds.
pub fn report(timelines: &[Timeline], duration: f64, slo: &Slo) -> Report {
    let ok: Vec<&Timeline> = timelines.iter().filter(|t| t.error.is_none()).collect();
    let mut errors = BTreeMap::new();
    for t in timelines {
        if let Some(e) = &t.error {
            *errors.entry(e.clone()).or_insert(0) += 1;
        }
    }
    let d = duration.max(1e-9);
    let input: usize = ok.iter().map(|t| t.prompt_tokens).sum();
    let output: usize = ok.iter().map(|t| t.output_tokens).sum();
    let ttft: Vec<f64> = ok.iter().filter_map(|t| t.ttft()).collect();
    let tpot: Vec<f64> = ok.iter().filter_map(|t| t.tpot()).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|t| t.itls()).collect();
    let e2e: Vec<f64> = ok.iter().map(|t| t.end).collect();
    Report {
        completed: ok.len(),
        failed: timelines.len() - ok.len(),
        errors,
        duration_s: duration,
        total_input_tokens: input,
        total_output_tokens: output,
        request_throughput: ok.len() as f64 / d,
        output_throughput: output as f64 / d,
        total_token_throughput: (input + output) as f64 / d,
        goodput: slo.any().then(|| ok.iter().filter(|t| slo.met(t)).count() as f64 / d),
        ttft: stats(&ttft),
        tpot: stats(&tpot),
        itl: stats(&itl),
        e2e: stats(&e2e),
    }
}

impl Report {
    /// The summary table, in `vllm bench serve`'s layout.
    pub fn table(&self, title: &str) -> String {
        let mut s = format!("{:=^60}\n", format!(" {title} "));
        let mut row = |k: &str, v: String| s.push_str(&format!("{k:<44}{v:>16}\n"));
        row("Successful requests:", self.completed.to_string());
        row("Failed requests:", self.failed.to_string());
        for (k, n) in &self.errors {
            row(&format!("  {k}:"), n.to_string());
        }
        row("Benchmark duration (s):", format!("{:.2}", self.duration_s));
        row("Total input tokens:", self.total_input_tokens.to_string());
        row("Total generated tokens:", self.total_output_tokens.to_string());
        row("Request throughput (req/s):", format!("{:.2}", self.request_throughput));
        if let Some(g) = self.goodput {
            row("Request goodput (req/s):", format!("{g:.2}"));
        }
        row("Output token throughput (tok/s):", format!("{:.2}", self.output_throughput));
        row("Total token throughput (tok/s):", format!("{:.2}", self.total_token_throughput));
        for (name, short, st) in [
            ("Time to First Token", "TTFT", self.ttft),
            ("Time per Output Token (excl. 1st token)", "TPOT", self.tpot),
            ("Inter-token Latency", "ITL", self.itl),
            ("End-to-end Latency", "E2EL", self.e2e),
        ] {
            s.push_str(&format!("{:-^60}\n", format!(" {name} ")));
            for (k, v) in [
                ("Mean", st.mean_ms),
                ("Median", st.median_ms),
                ("P90", st.p90_ms),
                ("P99", st.p99_ms),
            ] {
                s.push_str(&format!("{:<44}{:>16.2}\n", format!("{k} {short} (ms):"), v));
            }
        }
        s.push_str(&"=".repeat(60));
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tl(prompt: usize, chunks: &[f64], end: f64, out: usize) -> Timeline {
        Timeline {
            prompt_tokens: prompt,
            output_tokens: out,
            chunk_times: chunks.to_vec(),
            end,
            error: None,
        }
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 90.0) - 3.7).abs() < 1e-12);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&[5.0], 99.0), 5.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn per_request_latencies() {
        // First chunk at 0.5 s, then every 0.1 s, 5 tokens, done at 0.9 s.
        let t = tl(10, &[0.5, 0.6, 0.7, 0.8, 0.9], 0.9, 5);
        assert_eq!(t.ttft(), Some(0.5));
        assert!((t.tpot().unwrap() - 0.1).abs() < 1e-12);
        let itl: Vec<f64> = t.itls().collect();
        assert_eq!(itl.len(), 4);
        assert!(itl.iter().all(|x| (x - 0.1).abs() < 1e-12));
        // One token: no TPOT.
        assert_eq!(tl(1, &[0.2], 0.2, 1).tpot(), None);
    }

    #[test]
    fn a_synthetic_run() {
        let runs = vec![
            tl(100, &[1.0, 1.5, 2.0], 2.0, 3),
            tl(50, &[2.0, 2.1], 2.1, 2),
            Timeline { error: Some("http_503".into()), ..Default::default() },
            Timeline { error: Some("timeout".into()), ..Default::default() },
            Timeline { error: Some("http_503".into()), ..Default::default() },
        ];
        let slo = Slo::parse(&["ttft:1500".into()]).unwrap();
        let r = report(&runs, 4.0, &slo);
        assert_eq!((r.completed, r.failed), (2, 3));
        assert_eq!(r.errors.get("http_503"), Some(&2));
        assert_eq!(r.errors.get("timeout"), Some(&1));
        assert_eq!((r.total_input_tokens, r.total_output_tokens), (150, 5));
        assert_eq!(r.request_throughput, 0.5);
        assert_eq!(r.output_throughput, 1.25);
        assert_eq!(r.total_token_throughput, 155.0 / 4.0);
        // Only the first request met TTFT ≤ 1.5 s.
        assert_eq!(r.goodput, Some(0.25));
        assert_eq!(r.ttft.mean_ms, 1500.0);
        assert_eq!(r.ttft.median_ms, 1500.0);
        assert!((r.ttft.p99_ms - 1990.0).abs() < 1e-9);
        // TPOT: (2.0-1.0)/2 = 0.5 s and (2.1-2.0)/1 = 0.1 s.
        assert!((r.tpot.mean_ms - 300.0).abs() < 1e-9);
        // ITL over all gaps: 0.5, 0.5, 0.1.
        assert!((r.itl.median_ms - 500.0).abs() < 1e-9);
        assert_eq!(r.e2e.p90_ms, 2090.0);
        let table = r.table("Serving Benchmark Result");
        assert!(
            table.contains("Successful requests:")
                && table.contains("P99 TTFT (ms):")
                && table.contains("http_503")
        );
    }

    #[test]
    fn slos() {
        let s = Slo::parse(&["ttft:200".into(), "tpot:50".into()]).unwrap();
        assert!(s.met(&tl(1, &[0.1, 0.14], 0.14, 2)));
        assert!(!s.met(&tl(1, &[0.3, 0.31], 0.31, 2)));
        assert!(!s.met(&tl(1, &[0.1, 0.2], 0.2, 2)));
        assert!(Slo::parse(&["ttft=3".into()]).is_err());
        assert!(Slo::parse(&["lag:3".into()]).is_err());
        assert!(!Slo::default().any());
    }
}
