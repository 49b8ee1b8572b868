//! The simulated Codex backend. It lives in the product because `switchyard demo` and the
//! tests use it; it never starts unless asked.

pub mod auth;
