//! How tokens are chosen (or, with [`beam`] search, which continuations are kept): [`sampling_params::SamplingParams`] with the one rule set every
//! entry point applies, and the host sampler (penalties, temperature, top-k/top-p/min-p,
//! log-probabilities, seeded random streams), and [`structured`] outputs (token masks that hold
//! the output to a JSON schema, regex, choice or grammar; [`gbnf`] grammars are translated into llguidance's Lark).

pub mod beam;
pub mod gbnf;
pub mod sampler;
pub mod sampling_params;
pub mod structured;
