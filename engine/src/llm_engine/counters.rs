//! The engine's counters and step records: what benchmarks and metrics read of a running
//! engine.

use super::step_trace::{StepRecord, StepTrace};
use super::{EngineStats, LLMEngine, PhaseSeconds};

impl LLMEngine {
    /// Counters since start.
    pub fn stats(&self) -> EngineStats {
        let pc = self.scheduler.block_manager.stats();
        EngineStats {
            num_preemptions: self.scheduler.num_preemptions,
            prefix_cache_queries: pc.queries,
            prefix_cache_hits: pc.hits,
            phase_seconds: self.phase_seconds(),
            ..self.stats
        }
    }

    /// Wall time spent in each phase of [`LLMEngine::step`] since start (and the device's
    /// time, where the backend measures it).
    pub fn phase_seconds(&self) -> PhaseSeconds {
        let device = self.runner.backend.device_seconds().unwrap_or(0.0);
        PhaseSeconds { device, ..self.stats.phase_seconds }
    }

    /// The backend's host time launching passes, by part (see
    /// [`ModelBackend::host_seconds`](crate::backend::ModelBackend::host_seconds)).
    pub fn backend_host_seconds(&self) -> Vec<(&'static str, f64)> {
        self.runner.backend.host_seconds()
    }

    /// Starts recording every step the runner runs (again from nothing if it was on), for
    /// [`LLMEngine::take_step_records`].
    pub fn record_steps(&mut self) {
        let device = self.runner.backend.device_seconds();
        self.runner.trace = Some(StepTrace::new(device));
    }

    /// The records of the steps collected since recording started or since the last call;
    /// empty when not recording.
    pub fn take_step_records(&mut self) -> Vec<StepRecord> {
        self.runner.trace.as_mut().map(StepTrace::take).unwrap_or_default()
    }
}
