//! The request level: freeze the candidates, walk them, and answer for the whole request —
//! including when every candidate is gone (no fail-open: a known-bad account is never tried).

use std::time::Instant;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, json};
use switchyard_tui::wire;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::{Dispatcher, ErrorReply, Frame, RequestCtx};
use crate::clock;
use crate::fleet::human_duration;
use crate::fleet::refresh::TokenError;
use crate::telemetry::records::RequestLog;

/// How an attempt ended.
pub enum AttemptEnd {
    /// The request is finished; `tail` is sent after the record is kept.
    Done {
        outcome: &'static str,
        status: u16,
        tail: Vec<Frame>,
    },
    /// Try the next candidate.
    Next,
    /// The access token was refused as expired: refresh it and try this account once more.
    RetrySame { rejected_token: String },
    /// Answer the client with this error (a caller error, returned as it is).
    Reply(ErrorReply, &'static str),
    /// The client went away.
    ClientGone,
}

/// What is known about a request while it runs.
pub struct Trace {
    pub key: u64,
    pub started_ms: u64,
    pub attempts: Vec<wire::Attempt>,
    pub account: Option<String>,
    pub ttft_ms: Option<u64>,
    pub usage: Option<wire::Usage>,
}

impl Dispatcher {
    pub async fn run(&self, ctx: RequestCtx, tx: mpsc::Sender<Frame>) {
        let key = self.log.next_key();
        let span = tracing::info_span!("request", id = %RequestLog::id_of(key), model = %ctx.model, key = %ctx.key_name);
        self.run_traced(ctx, tx, key).instrument(span).await;
    }

    async fn run_traced(&self, ctx: RequestCtx, tx: mpsc::Sender<Frame>, key: u64) {
        let mut trace = Trace {
            key,
            started_ms: self.fleet.clock().now_ms(),
            attempts: Vec::new(),
            account: None,
            ttft_ms: None,
            usage: None,
        };
        let candidates = self.fleet.candidates(&ctx.model);
        tracing::debug!(
            candidates = ?candidates.order,
            skipped = ?candidates.skipped.iter().map(|(id, r)| format!("{id}:{}", r.as_str())).collect::<Vec<_>>(),
            "candidate_pool"
        );
        let mut end = None;
        'candidates: for id in &candidates.order {
            let lease = match self.fleet.lease(id, &ctx.model) {
                Ok(l) => l,
                Err(reason) => {
                    tracing::debug!(account = %id, reason = reason.as_str(), "candidate_skip");
                    continue;
                }
            };
            let mut rejected: Option<String> = None;
            let mut retried = false;
            loop {
                let started = Instant::now();
                let identity = match self
                    .fleet
                    .ensure_fresh(id, rejected.as_deref(), self.upstream.as_ref())
                    .await
                {
                    Ok(i) => i,
                    Err(e) => {
                        let (class, why) = match &e {
                            TokenError::Dead(w) => ("auth_dead", w.clone()),
                            TokenError::Unavailable(w) => ("transient", w.clone()),
                            TokenError::Missing => ("auth_dead", "no tokens".to_string()),
                        };
                        if let TokenError::Unavailable(_) = e {
                            let facts = crate::upstream::failure::Facts::transport(
                                crate::upstream::failure::Phase::Connect,
                                format!("token refresh failed: {why}"),
                            );
                            self.fleet.report(
                                id,
                                crate::fleet::health::Class::Transient,
                                Some(&facts),
                                &ctx.model,
                            );
                        }
                        trace.attempts.push(wire::Attempt {
                            account: lease.chatgpt_account_id.clone(),
                            class: class.into(),
                            status: None,
                            phase: Some("connect".into()),
                            ms: ms_since(started),
                            error: Some(why),
                        });
                        continue 'candidates;
                    }
                };
                match self.attempt(&ctx, &lease, identity, &tx, &mut trace).await {
                    AttemptEnd::Next => continue 'candidates,
                    AttemptEnd::RetrySame { rejected_token } if !retried => {
                        retried = true;
                        rejected = Some(rejected_token);
                    }
                    AttemptEnd::RetrySame { .. } => continue 'candidates,
                    other => {
                        end = Some(other);
                        break 'candidates;
                    }
                }
            }
        }
        let end = end.unwrap_or_else(|| AttemptEnd::Reply(self.exhausted(&ctx.model), ""));
        let (outcome, status, tail) = match end {
            AttemptEnd::Done {
                outcome,
                status,
                tail,
            } => (outcome, status, tail),
            AttemptEnd::Reply(reply, outcome) => {
                let outcome = if outcome.is_empty() {
                    exhaustion_outcome(&reply)
                } else {
                    outcome
                };
                (outcome, reply.status, vec![Frame::Error(reply)])
            }
            AttemptEnd::ClientGone => ("client_cancelled", 499, Vec::new()),
            AttemptEnd::Next | AttemptEnd::RetrySame { .. } => ("no_account", 503, Vec::new()),
        };
        let duration_ms = self.fleet.clock().now_ms().saturating_sub(trace.started_ms);
        tracing::info!(
            outcome,
            status,
            account = trace.account.as_deref().unwrap_or(""),
            attempts = trace.attempts.len(),
            duration_ms,
            "request_final"
        );
        self.log.push(
            trace.key,
            wire::RequestRecord {
                id: RequestLog::id_of(trace.key),
                started_at: clock::rfc3339_ms(trace.started_ms),
                key: ctx.key_name.clone(),
                model: ctx.model.clone(),
                stream: ctx.mode == super::Mode::Stream,
                outcome: outcome.to_string(),
                status,
                account: trace.account.clone(),
                attempts: trace.attempts,
                ttft_ms: trace.ttft_ms,
                duration_ms,
                usage: trace.usage,
                path: ctx.path.to_string(),
                session: ctx.session.as_deref().map(session_hash),
            },
        );
        for frame in tail {
            if tx.send(frame).await.is_err() {
                break;
            }
        }
    }

    /// The answer when no candidate is left.
    pub fn exhausted(&self, model: &str) -> ErrorReply {
        if self.fleet.model_marked_everywhere(model) {
            return ErrorReply::openai(
                404,
                "invalid_request_error",
                "model_not_found",
                format!("The model `{model}` is not supported by any account in the pool"),
                Map::new(),
            );
        }
        let (all_quota, earliest, summary) = self.fleet.exhaustion_summary();
        let now = self.fleet.clock().now_ms();
        let wait_s = earliest.map(|u| u.saturating_sub(now).div_ceil(1000).max(1));
        let mut reply = if all_quota {
            let mut extra = Map::new();
            if let Some(s) = wait_s {
                extra.insert("resets_in_seconds".into(), json!(s));
                extra.insert("resets_at".into(), json!((now / 1000) + s));
            }
            let message = match wait_s {
                Some(s) => format!(
                    "The usage limit has been reached on every account ({summary}); the earliest resets in {}",
                    human_duration(s * 1000)
                ),
                None => format!("The usage limit has been reached on every account ({summary})"),
            };
            ErrorReply::openai(
                429,
                "usage_limit_reached",
                "usage_limit_reached",
                message,
                extra,
            )
        } else {
            ErrorReply::openai(
                503,
                "server_error",
                "no_available_account",
                summary,
                Map::new(),
            )
        };
        if let Some(s) = wait_s
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            reply
                .headers
                .push((HeaderName::from_static("retry-after"), v));
        }
        reply
    }
}

fn exhaustion_outcome(reply: &ErrorReply) -> &'static str {
    match reply.code.as_str() {
        "model_not_found" => "model_not_found",
        "usage_limit_reached" => "quota_exhausted",
        _ => "no_account",
    }
}

pub fn ms_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A short, stable, non-reversible tag for a session key.
pub fn session_hash(s: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(s.as_bytes())[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
