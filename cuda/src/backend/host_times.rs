//! The host's time launching passes, by part: where a step's launch goes.

use std::time::Instant;

/// The host's time launching passes, by part, summed in seconds (what
/// `ModelBackend::host_seconds` reports).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct HostTimes {
    /// Checking the batch and its sampling rows.
    pub(super) validate: f64,
    /// Planning the pass (tiles, splits, padding to a graph).
    pub(super) plan: f64,
    /// Copying the plan and sampling arguments up.
    pub(super) upload: f64,
    /// Launching a decode graph.
    pub(super) graph: f64,
    /// Uploading and launching a mixed step's graph (or its eager run while capturing).
    pub(super) mixed: f64,
    /// Queueing an eager pass kernel by kernel.
    pub(super) eager: f64,
    /// Queueing the sampling kernel and the tokens' copy.
    pub(super) sample: f64,
}

impl HostTimes {
    /// Adds the time since `clock` to `part` and restarts it.
    pub(super) fn lap(part: &mut f64, clock: &mut Instant) {
        let now = Instant::now();
        *part += now.duration_since(*clock).as_secs_f64();
        *clock = now;
    }

    /// The parts by name, as `ModelBackend::host_seconds` reports them.
    pub(super) fn parts(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("validate", self.validate),
            ("plan", self.plan),
            ("upload", self.upload),
            ("graph", self.graph),
            ("mixed", self.mixed),
            ("eager", self.eager),
            ("sample", self.sample),
        ]
    }
}
