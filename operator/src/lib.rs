//! Kubernetes operator for the InferenceService resource.
//!
//! This crate is a placeholder in the workspace layout; its service lands in a later change.
