//! Front doors other than the Responses API, each a translation onto the Responses request the
//! pool serves (so each inherits key policy, budgets, scheduling, affinity, failover and the
//! request record): Chat Completions, Anthropic Messages and Images.

pub mod chat;
pub mod images;
pub mod messages;
