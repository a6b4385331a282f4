//! Prefill worker: chunked prefill and KV page shipping.
//!
//! This crate is a placeholder in the workspace layout; its service lands in a later change.
