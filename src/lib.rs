//! Switchyard: one binary that pools Codex (ChatGPT) accounts behind one
//! OpenAI-Responses-compatible endpoint. See `docs/architecture.md`.

pub mod admin_client;
pub mod api;
pub mod backup;
pub mod base;
pub mod cli;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod dispatch;
pub mod doctor;
pub mod fleet;
pub mod keys;
pub mod sim;
pub mod store;
pub mod telemetry;
pub mod ttl;
pub mod upstream;
