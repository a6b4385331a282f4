//! OpenAI-compatible gateway and prefix-aware router.
//!
//! This crate is a placeholder in the workspace layout; its service lands in a later change.
