//! What a request's subscriber on the engine thread is: the events it hears and the sink that
//! hears them (see [`crate::engine_loop::LoopState::subscribe`] and [`crate::outbox`]).

use tandem_engine::{LLMEngine, RequestOutput};

/// What a request's subscriber hears.
// `Output` comes every step and `Failed` once at most: boxing the output would put back an
// allocation per event that holding its completion inline saves.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum EngineEvent {
    /// One step's news about the request.
    Output(RequestOutput),
    /// The engine failed the request (the message says why); nothing follows.
    Failed(String),
}

/// Receives a request's events on the engine thread (it must not block), with read access to
/// the engine as the step left it (a finished prefill-only request's pages can be read then,
/// before the next step starts).
pub type Sink = Box<dyn FnMut(&LLMEngine, EngineEvent) + Send>;
