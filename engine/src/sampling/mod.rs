//! How tokens are chosen: [`sampling_params::SamplingParams`] with the one rule set every
//! entry point applies, and the host sampler (penalties, temperature, top-k/top-p/min-p,
//! log-probabilities, seeded random streams).

pub mod sampler;
pub mod sampling_params;
