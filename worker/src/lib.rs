//! What every Tandem worker process shares.
//!
//! - [`engine_loop`]: the engine on its own thread, driven by closures, with per-request sinks.
//! - [`sink`]: what a request's subscriber hears; [`outbox`]: its events handed to the async
//!   runtime once a step.
//! - [`core_share`]: workers on the same cores take turns a step at a time.
//! - [`snapshot`]: the engine's state as of its last step, for readers that must not wait.
//! - [`kv`]: the KV layout of the engine on the wire.
//! - [`convert`]: gRPC messages to engine types and back.
//! - [`metrics`]: the Prometheus recorder and the `tandem_` series.
//! - [`status`]: the `Worker` RPCs: status, loading and unloading models.
//! - [`models`]: models loaded and unloaded while the worker runs.
//! - [`serve`]: gRPC and HTTP on one port, the ready line, shutdown.
//! - [`step_log`]: every step written to a file (`TANDEM_STEP_LOG`), for benchmarks.

pub mod auth;
pub mod convert;
pub mod core_share;
pub mod engine_loop;
pub mod kv;
pub mod kv_events;
pub mod metrics;
pub mod models;
pub mod outbox;
pub mod process_metrics;
pub mod redis;
pub mod serve;
pub mod sink;
pub mod snapshot;
pub mod status;
pub mod step_log;

pub use engine_loop::{EngineEvent, EngineHandle, LoopState, Snapshot};
