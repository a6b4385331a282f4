//! The scheduling core (seed 000's state machine, seed 002's Scheduler → BlockManager): a
//! request's [`sequence::Sequence`]s, the [`scheduler::Scheduler`] that plans each step and
//! records what it produced, the [`block_manager::BlockManager`] that owns the paged KV blocks
//! and the prefix cache (keyed by [`block_hash`]), and the [`request_output`] types the engine
//! reports. It decides; it never runs the model.

pub mod block_hash;
pub mod block_manager;
pub mod request_output;
pub mod scheduler;
pub mod sequence;
