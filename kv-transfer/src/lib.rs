//! KV page wire format and transports (TCP, NCCL).
//!
//! This crate is a placeholder in the workspace layout; its service lands in a later change.
