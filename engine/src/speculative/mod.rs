//! Speculative decoding's parts that know nothing of the scheduler: the acceptance rule and the
//! per-sequence draft length ([`spec_decode`]) and where drafts come from ([`proposer`]). The
//! engine's `SpecDecoder` drives them over the scheduler and the runner.

pub mod proposer;
pub mod spec_decode;
