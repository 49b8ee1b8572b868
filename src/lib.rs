//! Switchyard: one binary that pools Codex (ChatGPT) accounts behind one
//! OpenAI-Responses-compatible endpoint. See `docs/architecture.md`.

pub mod api;
pub mod base;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod dispatch;
pub mod fleet;
pub mod keys;
pub mod notify;
pub mod sim;
pub mod store;
pub mod telemetry;
pub mod ttl;
pub mod upstream;
