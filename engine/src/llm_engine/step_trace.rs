//! A record of every step the runner ran, for benchmarks that ask where a run's time goes: what
//! each step computed (prompt tokens, decode rows and the KV positions they attend), when it was
//! handed to the backend and when its tokens came back, and the device's own time on it where
//! the backend times its passes. Off unless
//! [`LLMEngine::record_steps`](super::LLMEngine::record_steps) turns it on.

use std::collections::VecDeque;
use std::time::Instant;

use crate::scheduling::scheduler::SchedulerOutput;
use crate::scheduling::sequence::SeqMap;

/// One step as the runner ran it.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StepRecord {
    /// When the runner was handed the step, seconds since recording started.
    pub launched: f64,
    /// When its tokens were back on the host, seconds since recording started.
    pub collected: f64,
    /// Prompt tokens computed (prompt chunks, and tokens recomputed after a preemption).
    pub prompt_tokens: usize,
    /// Sequences past their prompt, each computing its newest token (and any drafts).
    pub decode_rows: usize,
    /// KV positions the decode rows attend: each row's context, its new tokens included.
    pub decode_positions: usize,
    /// The device's own time on the step's pass, where the backend times it (a pass the
    /// backend ran synchronously has none).
    pub device: Option<f64>,
}

impl StepRecord {
    /// What `out` computes, from its sequences' state when it was planned.
    fn of(out: &SchedulerOutput, seqs: &SeqMap, launched: f64) -> StepRecord {
        let mut r = StepRecord { launched, ..StepRecord::default() };
        for s in &out.scheduled {
            let seq = &seqs[&s.seq_id];
            if seq.num_computed_tokens >= seq.prompt_len {
                r.decode_rows += 1;
                r.decode_positions += seq.num_computed_tokens + s.num_tokens;
            } else {
                r.prompt_tokens += s.num_tokens;
            }
        }
        r
    }
}

/// The runner's step records: steps are collected in the order they were launched.
#[derive(Debug)]
pub(crate) struct StepTrace {
    start: Instant,
    /// Every step handed to the backend so far; the last `open` are not yet collected.
    records: Vec<StepRecord>,
    /// Indices of launched, uncollected steps, oldest first.
    open: VecDeque<usize>,
    /// The backend's device seconds when the last step was collected.
    device_seen: f64,
}

impl StepTrace {
    /// Starts recording; `device` is the backend's device time so far.
    pub(crate) fn new(device: Option<f64>) -> Self {
        StepTrace {
            start: Instant::now(),
            records: Vec::new(),
            open: VecDeque::new(),
            device_seen: device.unwrap_or(0.0),
        }
    }

    /// Seconds since recording started.
    pub(crate) fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// A step handed to the backend at `at` ([`StepTrace::now`] before the call).
    pub(crate) fn launched(&mut self, out: &SchedulerOutput, seqs: &SeqMap, at: f64) {
        self.open.push_back(self.records.len());
        self.records.push(StepRecord::of(out, seqs, at));
    }

    /// The oldest uncollected step's tokens are back; `device` is the backend's device time so
    /// far (the step's share is what it grew by since the last collection).
    pub(crate) fn collected(&mut self, device: Option<f64>) {
        let Some(i) = self.open.pop_front() else { return };
        let r = &mut self.records[i];
        r.collected = self.start.elapsed().as_secs_f64();
        if let Some(d) = device {
            let grew = d - self.device_seen;
            self.device_seen = d;
            r.device = (grew > 0.0).then_some(grew);
        }
    }

    /// The collected steps' records so far (steps still in flight stay).
    pub(crate) fn take(&mut self) -> Vec<StepRecord> {
        let done = self.open.front().copied().unwrap_or(self.records.len());
        let taken: Vec<StepRecord> = self.records.drain(..done).collect();
        for i in self.open.iter_mut() {
            *i -= done;
        }
        taken
    }
}
