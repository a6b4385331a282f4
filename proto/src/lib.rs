//! gRPC contracts between router, prefill and decode workers.
//!
//! This crate is a placeholder in the workspace layout; its service lands in a later change.
