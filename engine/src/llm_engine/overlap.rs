//! Steps that overlap the device: the engine's side of a launched step — collecting its
//! tokens and applying them ([`LLMEngine::step`] launches it; anything that must see its
//! sequences settled first calls [`LLMEngine::settle`]).

use super::{now_secs, LLMEngine};
use crate::llm_engine::api::EngineError;
use crate::scheduling::scheduler::StepUpdate;

impl LLMEngine {
    /// Collects the step in flight, if any: waits for the tokens the device chose, applies them
    /// to their sequences and wipes what that freed (secure mode), before anything is scheduled
    /// that could take those blocks. Its news is left to the caller.
    pub(super) fn complete_in_flight(&mut self) -> Result<Option<StepUpdate>, EngineError> {
        let Some(sampled) = self.in_flight.take() else { return Ok(None) };
        let start = std::time::Instant::now();
        let rows = self.runner.collect(sampled)?;
        let sampled = self.sample(rows);
        let collected = std::time::Instant::now();
        self.stats.phase_seconds.forward += collected.duration_since(start).as_secs_f64();
        // The launched step's plan is `last_schedule`.
        let plan = &self.last_schedule;
        let update =
            self.scheduler.update_from_output(plan, sampled, &self.tokenizer, now_secs())?;
        self.wipe_freed();
        self.stats.phase_seconds.update += collected.elapsed().as_secs_f64();
        Ok(Some(update))
    }

    /// Completes the step in flight (its news kept for the next step, a failure returned by
    /// it): before a change to the sequences it samples.
    pub(super) fn settle(&mut self) {
        match self.complete_in_flight() {
            Ok(Some(update)) => self.pending = self.outputs(update),
            Ok(None) => {}
            Err(e) => self.deferred_error = Some(e),
        }
    }
}
