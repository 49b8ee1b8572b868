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
use crate::fleet::affinity::Decision;
use crate::fleet::health::Class;
use crate::fleet::human_duration;
use crate::fleet::refresh::TokenError;
use crate::fleet::scheduler::{QueueOutcome, Wait};
use crate::fleet::{Lease, Plan, SkipReason};
use crate::telemetry::records::RequestLog;
use crate::upstream::failure::{Facts, Phase};

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
    /// The `chatgpt_account_id` that served it.
    pub account: Option<String>,
    /// The gateway id of the account that served it.
    pub served_by: Option<String>,
    pub response_id: Option<String>,
    pub ttft_ms: Option<u64>,
    pub usage: Option<wire::Usage>,
    pub skipped: Vec<wire::Skip>,
    pub queue: Option<wire::QueueWait>,
    /// Why the session left its bound account, if it did.
    pub rebound: Option<String>,
    /// How the last attempt reached the backend.
    pub transport: Option<&'static str>,
    pub ws_connect_ms: Option<u64>,
}

/// How the search for a slot ended.
enum Acquire {
    Lease(Box<Lease>),
    /// Every remaining candidate stayed full: the wait timed out or its queue was full.
    Busy,
    ClientLeft,
    /// No candidate is left.
    Exhausted,
}

impl Dispatcher {
    pub async fn run(&self, ctx: RequestCtx, tx: mpsc::Sender<Frame>) {
        let key = self.log.next_key();
        let span = tracing::info_span!("request", id = %RequestLog::id_of(key), model = %ctx.model, key = %ctx.key_name);
        self.run_traced(ctx, tx, key).instrument(span).await;
    }

    fn chatgpt_id(&self, id: &str) -> String {
        self.fleet
            .chatgpt_account_id(id)
            .unwrap_or_else(|| id.to_string())
    }

    fn skip(&self, trace: &mut Trace, id: &str, reason: SkipReason) {
        let account = self.chatgpt_id(id);
        tracing::debug!(account = %account, reason = reason.as_str(), "candidate_skip");
        if !trace
            .skipped
            .iter()
            .any(|s| s.account == account && s.reason == reason.as_str())
        {
            trace.skipped.push(wire::Skip {
                account,
                reason: reason.as_str().into(),
            });
        }
    }

    fn note_wait(&self, trace: &mut Trace, w: Wait) {
        let total = trace.queue.as_ref().map_or(0, |q| q.wait_ms)
            + u64::try_from(w.waited.as_millis()).unwrap_or(u64::MAX);
        self.metrics.queue_wait(w.kind, w.outcome, w.waited);
        tracing::info!(
            queue = w.kind.as_str(),
            outcome = w.outcome.as_str(),
            wait_ms = total,
            "queue_wait"
        );
        trace.queue = Some(wire::QueueWait {
            queue: w.kind.as_str().into(),
            outcome: w.outcome.as_str().into(),
            wait_ms: total,
        });
    }

    /// Finds a slot on the first remaining candidate that has one; when all are full, waits —
    /// for the session's own account first (sticky), then for any of them (pool).
    async fn acquire(
        &self,
        plan: &Plan,
        remaining: &mut Vec<String>,
        sticky_waited: &mut bool,
        tx: &mpsc::Sender<Frame>,
        trace: &mut Trace,
    ) -> Acquire {
        let settings = self.fleet.settings();
        loop {
            // A sticky session tries only its own account until it has waited for it.
            let sticky_first = plan
                .sticky
                .as_ref()
                .is_some_and(|s| !*sticky_waited && remaining.first() == Some(s));
            let mut i = 0;
            while i < remaining.len() && (!sticky_first || i == 0) {
                match self.fleet.try_lease(&remaining[i], &plan.model) {
                    Ok(lease) => {
                        remaining.remove(i);
                        return Acquire::Lease(Box::new(lease));
                    }
                    Err(SkipReason::Full) => {
                        let id = remaining[i].clone();
                        self.skip(trace, &id, SkipReason::Full);
                        i += 1;
                    }
                    Err(reason) => {
                        let id = remaining.remove(i);
                        self.skip(trace, &id, reason);
                    }
                }
            }
            if remaining.is_empty() {
                return Acquire::Exhausted;
            }
            if let Some(sticky) = plan
                .sticky
                .as_ref()
                .filter(|s| sticky_first && remaining.first() == Some(*s))
            {
                *sticky_waited = true;
                let (lease, wait) = self
                    .fleet
                    .wait_for_account(
                        sticky,
                        &plan.model,
                        settings.sticky_wait,
                        settings.sticky_max_waiting,
                        tx.closed(),
                    )
                    .await;
                self.note_wait(trace, wait);
                match (lease, wait.outcome) {
                    (Some(l), _) => {
                        remaining.retain(|id| id != &l.id);
                        return Acquire::Lease(Box::new(l));
                    }
                    (None, QueueOutcome::ClientLeft) => return Acquire::ClientLeft,
                    (None, _) if plan.owner_only => return Acquire::Busy,
                    (None, _) => {
                        // Busy for too long: the session moves on.
                        trace.rebound.get_or_insert_with(|| "busy".into());
                        remaining.retain(|id| id != sticky);
                        continue;
                    }
                }
            }
            let (lease, wait) = self
                .fleet
                .wait_for_pool(
                    remaining,
                    &plan.model,
                    settings.queue_wait,
                    settings.queue_max_waiting,
                    tx.closed(),
                )
                .await;
            self.note_wait(trace, wait);
            return match (lease, wait.outcome) {
                (Some(l), _) => {
                    remaining.retain(|id| id != &l.id);
                    Acquire::Lease(Box::new(l))
                }
                (None, QueueOutcome::ClientLeft) => Acquire::ClientLeft,
                (None, _) => Acquire::Busy,
            };
        }
    }

    async fn run_traced(&self, ctx: RequestCtx, tx: mpsc::Sender<Frame>, key: u64) {
        let mut trace = Trace {
            key,
            started_ms: self.fleet.clock().now_ms(),
            attempts: Vec::new(),
            account: None,
            served_by: None,
            response_id: None,
            ttft_ms: None,
            usage: None,
            skipped: Vec::new(),
            queue: None,
            rebound: None,
            transport: None,
            ws_connect_ms: None,
        };
        let plan = match &ctx.previous_response_id {
            None => Ok(self.fleet.plan(&ctx.model, ctx.session.as_deref())),
            Some(prev) => self
                .fleet
                .plan_owner(&ctx.model, ctx.session.as_deref(), prev),
        };
        let (plan, mut end) = match plan {
            Ok(p) => (p, None),
            Err(message) => {
                let mut extra = Map::new();
                extra.insert("param".into(), json!("previous_response_id"));
                let reply = ErrorReply::openai(
                    400,
                    "invalid_request_error",
                    "previous_response_not_found",
                    message,
                    extra,
                );
                (
                    Plan::default(),
                    Some(AttemptEnd::Reply(reply, "previous_response_not_found")),
                )
            }
        };
        for (id, reason) in &plan.skipped {
            self.skip(&mut trace, id, *reason);
        }
        if plan.bound.is_some() && plan.sticky.is_none() {
            let why = plan
                .skipped
                .iter()
                .find(|(id, _)| Some(id) == plan.bound.as_ref())
                .map_or("gone", |(_, r)| r.as_str());
            trace.rebound = Some(why.to_string());
        }
        let candidate_pool: Vec<String> = self.fleet.chatgpt_account_ids(&plan.order);
        tracing::info!(candidates = ?candidate_pool, skipped = trace.skipped.len(), "candidate_pool");

        let mut remaining = plan.order.clone();
        let mut sticky_waited = false;
        while end.is_none() {
            let lease = match self
                .acquire(&plan, &mut remaining, &mut sticky_waited, &tx, &mut trace)
                .await
            {
                Acquire::Lease(l) => *l,
                Acquire::Busy => {
                    end = Some(AttemptEnd::Reply(self.pool_busy(&plan), "pool_busy"));
                    break;
                }
                Acquire::ClientLeft => {
                    end = Some(AttemptEnd::ClientGone);
                    break;
                }
                Acquire::Exhausted => break,
            };
            let id = lease.id.clone();
            let mut rejected: Option<String> = None;
            let mut retried = false;
            loop {
                let started = Instant::now();
                let identity = match self
                    .fleet
                    .ensure_fresh(&id, rejected.as_deref(), self.upstream.as_ref())
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
                            let facts = Facts::transport(
                                Phase::Connect,
                                format!("token refresh failed: {why}"),
                            );
                            self.fleet
                                .report(&id, Class::Transient, Some(&facts), &ctx.model);
                        }
                        self.metrics.attempt(class);
                        trace.attempts.push(wire::Attempt {
                            account: lease.chatgpt_account_id.clone(),
                            class: class.into(),
                            status: None,
                            phase: Some("connect".into()),
                            ms: ms_since(started),
                            error: Some(why),
                        });
                        if plan.sticky.as_deref() == Some(id.as_str()) {
                            trace.rebound.get_or_insert_with(|| class.to_string());
                        }
                        break;
                    }
                };
                match self.attempt(&ctx, &lease, identity, &tx, &mut trace).await {
                    AttemptEnd::Next => {
                        if plan.sticky.as_deref() == Some(id.as_str()) {
                            let class = trace
                                .attempts
                                .last()
                                .map_or("failed".to_string(), |a| a.class.clone());
                            trace.rebound.get_or_insert(class);
                        }
                        break;
                    }
                    AttemptEnd::RetrySame { rejected_token } if !retried => {
                        retried = true;
                        rejected = Some(rejected_token);
                    }
                    AttemptEnd::RetrySame { .. } => break,
                    other => {
                        end = Some(other);
                        break;
                    }
                }
            }
            if plan.owner_only && end.is_none() {
                // A continuation cannot move: its history lives on the owner.
                let reply = ErrorReply::openai(
                    400,
                    "invalid_request_error",
                    "previous_response_not_found",
                    "Previous response not found: its account failed; resend the full request.",
                    Map::new(),
                );
                end = Some(AttemptEnd::Reply(reply, "previous_response_not_found"));
            }
            if end.is_none() {
                self.metrics.failover();
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
        let affinity = self.settle_affinity(&ctx, &plan, &trace, outcome);
        let duration_ms = self.fleet.clock().now_ms().saturating_sub(trace.started_ms);
        self.metrics.request(outcome, &affinity);
        tracing::info!(
            outcome,
            status,
            account = trace.account.as_deref().unwrap_or(""),
            attempts = trace.attempts.len(),
            affinity = %affinity.label(),
            duration_ms,
            "request_final"
        );
        let cached_tokens = trace.usage.as_ref().map(|u| u.cached_tokens);
        self.metrics.transport(trace.transport.unwrap_or("http"));
        if let Some(ms) = trace.ws_connect_ms {
            self.metrics
                .ws_connect(std::time::Duration::from_millis(ms));
        }
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
                candidate_pool,
                skipped: trace.skipped,
                affinity: affinity.label(),
                queue: trace.queue,
                cached_tokens,
                transport: trace.transport.unwrap_or("http").into(),
                ws: ctx.ws,
                ws_connect_ms: trace.ws_connect_ms,
            },
        );
        for frame in tail {
            if tx.send(frame).await.is_err() {
                break;
            }
        }
    }

    /// Binds the session to the account that served it and says what the affinity did.
    fn settle_affinity(
        &self,
        ctx: &RequestCtx,
        plan: &Plan,
        trace: &Trace,
        outcome: &str,
    ) -> Decision {
        if let (Some(resp), Some(owner)) = (&trace.response_id, &trace.served_by) {
            self.fleet.affinity.own(resp, owner);
        }
        let Some(session) = &ctx.session else {
            return Decision::None;
        };
        if outcome == "stream_error"
            && let Some(last) = trace.attempts.last()
            && let Some(id) = self.fleet.resolve(&last.account).ok()
        {
            self.fleet.affinity.exclude(session, &id);
        }
        let Some(served) = &trace.served_by else {
            return match (&plan.bound, &trace.rebound) {
                (None, _) => Decision::NewBind,
                (Some(_), Some(why)) => Decision::Rebound(why.clone()),
                (Some(_), None) => Decision::Reused,
            };
        };
        let decision = match &plan.bound {
            None => Decision::NewBind,
            Some(b) if b == served => Decision::Reused,
            Some(_) => {
                Decision::Rebound(trace.rebound.clone().unwrap_or_else(|| "failover".into()))
            }
        };
        self.fleet.affinity.bind(session, served);
        decision
    }

    /// 503 `pool_busy`: every candidate stayed full for the whole wait.
    fn pool_busy(&self, plan: &Plan) -> ErrorReply {
        let settings = self.fleet.settings();
        let wait = if plan.owner_only {
            settings.sticky_wait
        } else {
            settings.queue_wait
        };
        let mut reply = ErrorReply::openai(
            503,
            "server_error",
            "pool_busy",
            format!(
                "every account that can serve this request is busy ({} candidates; waited up to {}s); retry shortly",
                plan.order.len(),
                wait.as_secs()
            ),
            Map::new(),
        );
        reply.headers.push((
            HeaderName::from_static("retry-after"),
            HeaderValue::from_static("2"),
        ));
        reply
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
        "pool_busy" => "pool_busy",
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
