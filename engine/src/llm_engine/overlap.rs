//! Steps that overlap the device: the engine's side of a launched step — collecting its
//! tokens and applying them ([`LLMEngine::step`] launches it; anything that must see its
//! sequences settled first calls [`LLMEngine::settle`]).

use super::{now_secs, LLMEngine};
use crate::llm_engine::api::EngineError;
use crate::llm_engine::model_runner::RowOutput;
use crate::scheduling::request_output::RequestOutput;
use crate::scheduling::scheduler::{SchedulerOutput, StepUpdate};
use crate::scheduling::sequence::SeqId;

/// How a step was planned ([`LLMEngine::plan_step`]).
pub(super) enum PlannedStep {
    /// Planned ahead and launched behind the step in flight, which was then collected: its
    /// news.
    Launched(Vec<RequestOutput>),
    /// The step in flight (if any) was collected and applied (its news), and the plan, without
    /// the sequences that ended meanwhile, is left to run now.
    ToRun(Option<StepUpdate>, Box<SchedulerOutput>),
}

impl LLMEngine {
    /// Whether a launched step's tokens are still to be collected (the device may be running it).
    pub fn step_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// [`LLMEngine::step`], running `between` once on the way: right after the step's pass is
    /// launched where the backend overlaps steps (so it runs while the device computes),
    /// otherwise before the pass runs. A server hands out the previous step's news there, off
    /// the host's path from one step's tokens to the next step's launch. Not run when the step
    /// fails before launching.
    pub fn step_with(
        &mut self,
        between: &mut dyn FnMut(&LLMEngine),
    ) -> Result<Vec<RequestOutput>, EngineError> {
        let mut hook = Some(between);
        let out = self.step_hooked(&mut hook);
        if out.is_ok() {
            Self::run_hook(self, &mut hook);
        }
        out
    }

    /// Runs the step hook if it has not run yet.
    pub(super) fn run_hook(&self, hook: &mut Option<&mut dyn FnMut(&LLMEngine)>) {
        if let Some(h) = hook.take() {
            h(self);
        }
    }

    /// Collects the step in flight, if any: waits for the tokens the device chose, applies them
    /// to their sequences and wipes what that freed (secure mode), before anything is scheduled
    /// that could take those blocks. Its news is left to the caller.
    pub(super) fn complete_in_flight(&mut self) -> Result<Option<StepUpdate>, EngineError> {
        let Some(sampled) = self.in_flight.take() else { return Ok(None) };
        let start = std::time::Instant::now();
        let rows = self.runner.collect(sampled)?;
        let sampled = self.sample(self.live_rows(rows));
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

    /// A collected step's rows without those of sequences that ended while it ran (it was
    /// planned ahead of their last token, which ended them): nothing is owed for those.
    fn live_rows(&self, mut rows: Vec<(SeqId, RowOutput)>) -> Vec<(SeqId, RowOutput)> {
        rows.retain(|(id, _)| self.scheduler.seqs.contains_key(id));
        rows
    }

    /// Plans the step: ahead of the step in flight when [`LLMEngine::plans_ahead`], otherwise
    /// after collecting it.
    /// `hook` runs once the step ahead is launched (see [`LLMEngine::step_with`]).
    pub(super) fn plan_step(
        &mut self,
        hook: &mut Option<&mut dyn FnMut(&LLMEngine)>,
    ) -> Result<PlannedStep, EngineError> {
        if self.plans_ahead() {
            return self.step_ahead(hook);
        }
        let done = self.complete_in_flight()?;
        let start = std::time::Instant::now();
        let plan = self.schedule()?;
        self.stats.steps += 1;
        self.stats.phase_seconds.schedule += start.elapsed().as_secs_f64();
        Ok(PlannedStep::ToRun(done, Box::new(plan)))
    }

    /// Whether the next step is planned before the step in flight is collected: async
    /// scheduling on, a step in flight, no speculation, and a backend that reads the pending
    /// tokens on the device.
    fn plans_ahead(&self) -> bool {
        self.async_scheduling
            && self.in_flight.is_some()
            && self.spec.is_none()
            && self.runner.backend.takes_deferred_tokens()
    }

    /// Plans step N+1 while step N runs: N's KV is recorded as computed and each of its
    /// sampled sequences that its token cannot end counts that token as pending; the plan is
    /// launched behind N (its pending tokens read on the device) when every row it samples can
    /// be chosen there. Then N is collected and applied. The device runs N+1 while the host
    /// applies N, returns its news and plans N+2; tokens and outputs are those of steps that
    /// wait (the seeds count the pending token). A sequence that N's token ends (a stop, EOS)
    /// was planned for nothing: its row of N+1 is dropped when collected.
    fn step_ahead(
        &mut self,
        hook: &mut Option<&mut dyn FnMut(&LLMEngine)>,
    ) -> Result<PlannedStep, EngineError> {
        let flight = self.in_flight.take().expect("plans_ahead: a step in flight");
        let launched = std::mem::take(&mut self.last_schedule);
        let start = std::time::Instant::now();
        let prefill_tokens = self.scheduler.mark_step_computed(&launched, &[]);
        self.scheduler.expect_tokens(&flight);
        let mut plan = self.schedule()?;
        self.stats.steps += 1;
        let planned = std::time::Instant::now();
        self.stats.phase_seconds.schedule += planned.duration_since(start).as_secs_f64();
        let next = self.runner.launch(&plan, &self.scheduler.seqs, &flight)?;
        self.stats.phase_seconds.launch += planned.elapsed().as_secs_f64();
        if next.is_some() {
            self.run_hook(hook);
        }
        let rows = self.runner.collect(flight)?;
        let collected = std::time::Instant::now();
        self.stats.phase_seconds.forward += collected.duration_since(planned).as_secs_f64();
        let rows = self.live_rows(rows);
        let sampled = self.sample(rows);
        let update =
            self.scheduler.apply_sampled(sampled, &self.tokenizer, now_secs(), prefill_tokens)?;
        self.wipe_freed();
        self.stats.phase_seconds.update += collected.elapsed().as_secs_f64();
        let Some(ids) = next else {
            let seqs = &self.scheduler.seqs;
            plan.scheduled.retain(|s| seqs.contains_key(&s.seq_id));
            plan.num_batched_tokens = plan.scheduled.iter().map(|s| s.num_tokens).sum();
            return Ok(PlannedStep::ToRun(Some(update), Box::new(plan)));
        };
        self.in_flight = Some(ids);
        self.last_schedule = plan;
        let outputs_start = std::time::Instant::now();
        let outputs = self.outputs(update);
        self.stats.phase_seconds.outputs += outputs_start.elapsed().as_secs_f64();
        Ok(PlannedStep::Launched(outputs))
    }
}
