//! Decode worker: continuous batching over the paged KV cache.
//!
//! This crate is a placeholder in the workspace layout; its service lands in a later change.
