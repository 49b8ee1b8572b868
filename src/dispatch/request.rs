//! The request level: freeze the candidates, walk them with one [`Attempt`] each, and answer
//! for the whole request — including when every candidate is gone (no fail-open: a known-bad
//! account is never tried) — then keep its record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use serde_json::{Map, json};
use tracing::Instrument;

use super::attempt::{Attempt, End, Trace};
use super::{Dispatcher, ErrorReply, Frame, Mode, RequestCtx, frames};
use crate::base::duration::human_duration;
use crate::fleet::affinity::{Decision, Rebound, refusal_scope};
use crate::fleet::scheduler::{QueueOutcome, Wait};
use crate::fleet::{Lease, Plan, SkipReason};
use crate::keys::policy::Refusal;
use crate::keys::usage::Counters;
use crate::keys::{Denied, KeyPermit};
use crate::telemetry::records::{Outcome, QueueRecord, RequestLog, RequestRecord, TerminalSource};
use crate::upstream::Transport;

/// Where a request's walk over its candidates stands.
struct Walk {
    /// Candidates not tried yet, in order.
    remaining: Vec<Arc<str>>,
    /// The session has waited for its own account once.
    sticky_waited: bool,
    /// When the request must have a first answer by.
    deadline: Instant,
    /// The reset-credit counter before the request was planned, and whether the request
    /// already looked for a credit to spend.
    credits_seen: u64,
    credit_tried: bool,
}

impl Walk {
    /// A wait for a slot, cut to what is left before the deadline; `None` once it passed.
    fn bounded(&self, wait: Duration) -> Option<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        (!left.is_zero()).then(|| wait.min(left))
    }

    fn past_deadline(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

/// How the search for a slot ended.
enum Acquire {
    Lease(Box<Lease>),
    /// Every remaining candidate stayed full: the wait timed out or its queue was full.
    Busy,
    ClientLeft,
    /// No candidate is left.
    Exhausted,
    /// The request's deadline passed while it waited.
    Deadline,
}

impl Dispatcher {
    /// Admits the request of key `key_id` received at `received` on its head alone, before
    /// its body is read: revoked, expired, budgets, rate and a slot among the key's own,
    /// waiting in the key's queue as [`Dispatcher::run`] would. A refusal is recorded like any
    /// other, with the context `head` makes (no model or body yet; made only then), and its
    /// answer returned.
    pub async fn admit_head(
        &self,
        (key_id, received): (&str, Instant),
        head: impl FnOnce() -> RequestCtx,
        body_bytes: u64,
        gone: impl std::future::Future<Output = ()>,
    ) -> Result<Arc<KeyPermit>, Vec<Frame>> {
        let settings = self.fleet.settings();
        let wait = self.key_wait(settings.queue_wait, received);
        let admitted = self
            .keys
            .admit_head(
                (key_id, body_bytes),
                &self.usage,
                wait,
                settings.queue_max_waiting,
                gone,
            )
            .await;
        admitted.map(Arc::new).map_err(|denied| {
            let trace = Trace::new(self.log.next_key(), self.fleet.clock().now_ms());
            let end = self.denied(denied);
            self.finish(&head(), None, trace, Vec::new(), end)
        })
    }

    /// How a request the key's policy did not admit ends.
    fn denied(&self, denied: Denied) -> End {
        match denied {
            Denied::Refused(r) => {
                tracing::info!(code = r.code(), "refused by the key's policy");
                End::Reply(refusal_reply(&r), refusal_outcome(&r))
            }
            Denied::Gone if self.is_cut() => {
                End::Reply(shutting_down_reply(), Outcome::ShuttingDown)
            }
            Denied::Gone => End::ClientGone,
        }
    }

    pub async fn run(&self, ctx: RequestCtx, tx: frames::Sender) {
        let key = self.log.next_key();
        // A debug span: the request path costs no formatting at `info` unless something goes
        // wrong (failures name the request themselves).
        let span = tracing::debug_span!("request", id = %RequestLog::id_of(key), model = %ctx.model, key = %ctx.key_name);
        // A disabled span (the usual case) does not wrap the request: wrapping moves its
        // whole future once more.
        if span.is_disabled() {
            self.run_traced(ctx, tx, key).await;
        } else {
            self.run_traced(ctx, tx, key).instrument(span).await;
        }
    }

    /// How long a request received at `received` may wait for one of its key's slots: the
    /// queue's wait, within what is left of its deadline.
    fn key_wait(&self, queue_wait: std::time::Duration, received: Instant) -> std::time::Duration {
        let deadline = received + self.config.request_deadline;
        queue_wait.min(deadline.saturating_duration_since(Instant::now()))
    }

    async fn run_traced(&self, ctx: RequestCtx, tx: frames::Sender, key: u64) {
        let mut trace = Trace::new(key, self.fleet.clock().now_ms());
        // The key's policy first: a refused request touches no account and joins no queue.
        let settings = self.fleet.settings();
        // A request admitted from its head (HTTP) has its slot already: only its model is
        // left to check.
        let admitted = match ctx.key_permit.clone() {
            Some(permit) => self
                .keys
                .allow_model(&permit, &ctx.model, ctx.service_tier.as_deref())
                .map(|()| permit)
                .map_err(Denied::Refused),
            None => {
                let wait = self.key_wait(settings.queue_wait, ctx.received);
                let admitted = self
                    .keys
                    .admit(
                        (
                            &ctx.key_id,
                            &ctx.model,
                            ctx.service_tier.as_deref(),
                            ctx.body.len() as u64,
                        ),
                        &self.usage,
                        wait,
                        settings.queue_max_waiting,
                        self.gone(&tx),
                    )
                    .await
                    .map(Arc::new);
                // A wait for one of the key's slots is the key's, not the gateway's.
                trace.begun = Instant::now();
                admitted
            }
        };
        let _permit = match admitted {
            Ok(permit) => permit,
            Err(denied) => {
                let end = self.denied(denied);
                let tail = self.finish(&ctx, None, trace, Vec::new(), end);
                self.send_tail(&tx, tail).await;
                return;
            }
        };
        // Before the plan: a reset made after this may serve a request its plan found dry.
        let credits_seen = self.credits.resets();
        let (plan, refused) = match &ctx.previous_response_id {
            None => {
                let scope = ctx
                    .session
                    .as_deref()
                    .map(|s| refusal_scope(&ctx.key_id, s));
                let plan =
                    self.fleet
                        .plan_for(&ctx.model, ctx.session.as_deref(), scope.as_deref());
                (plan, None)
            }
            Some(prev) => match self.fleet.plan_owner(&ctx.model, prev) {
                Ok(p) => (p, None),
                Err(message) => (Plan::default(), Some(previous_response_not_found(message))),
            },
        };
        for (id, reason) in &plan.skipped {
            self.skip(&mut trace, id, *reason);
        }
        if plan.bound.is_some() && plan.sticky.is_none() {
            let why = plan
                .skipped
                .iter()
                .find(|(id, _)| Some(id) == plan.bound.as_ref())
                .map_or(Rebound::Gone, |(_, r)| Rebound::Skipped(*r));
            trace.rebound = Some(why);
        }
        let candidate_pool = self.fleet.chatgpt_account_ids(&plan.order);
        tracing::debug!(candidates = ?candidate_pool, skipped = trace.skipped.len(), "candidate_pool");
        let end = match refused {
            Some(end) => end,
            None => self.walk(&ctx, &plan, &tx, &mut trace, credits_seen).await,
        };
        let tail = self.finish(&ctx, Some(&plan), trace, candidate_pool, end);
        self.send_tail(&tx, tail).await;
    }

    /// Sends a request's last frames, each within the client write timeout.
    async fn send_tail(&self, tx: &frames::Sender, tail: Vec<Frame>) {
        for frame in tail {
            if super::send_within(tx, frame, self.config.client_write_timeout)
                .await
                .is_err()
            {
                break;
            }
        }
    }

    /// Tries the candidates in order, one attempt each, until one answers.
    async fn walk(
        &self,
        ctx: &RequestCtx,
        plan: &Plan,
        tx: &frames::Sender,
        trace: &mut Trace,
        credits_seen: u64,
    ) -> End {
        let mut walk = Walk {
            remaining: plan.order.clone(),
            sticky_waited: false,
            deadline: ctx.received + self.config.request_deadline,
            credits_seen,
            credit_tried: false,
        };
        loop {
            if self.is_cut() {
                return End::Reply(shutting_down_reply(), Outcome::ShuttingDown);
            }
            let lease = match self.acquire(&ctx.model, plan, &mut walk, tx, trace).await {
                Acquire::Lease(l) => *l,
                Acquire::ClientLeft if self.is_cut() => {
                    return End::Reply(shutting_down_reply(), Outcome::ShuttingDown);
                }
                Acquire::Busy => return End::Reply(self.pool_busy(plan), Outcome::PoolBusy),
                Acquire::Deadline => {
                    let reply = self.deadline_reply(trace.attempts.len());
                    return End::Reply(reply, Outcome::DeadlineExceeded);
                }
                Acquire::ClientLeft => return End::ClientGone,
                Acquire::Exhausted => {
                    return match trace.refusal.take() {
                        // An account refused the prompt for policy: that is the answer.
                        Some(refusal) => End::Reply(refusal, Outcome::PolicyRefused),
                        None => {
                            let (reply, outcome) = self.exhausted(&ctx.model);
                            // Boxed: a spend holds an upstream call, and the walk's
                            // future should not carry its size on every request.
                            let (walk, trace) = (&mut walk, &mut *trace);
                            if super::boxed(move || {
                                self.credit_revived(ctx, plan, walk, trace, outcome)
                            })
                            .await
                            {
                                continue;
                            }
                            End::Reply(reply, outcome)
                        }
                    };
                }
            };
            let id = lease.id.clone();
            match Attempt::run(self, ctx, tx, trace, lease).await {
                End::Next => {}
                end => return end,
            }
            if plan.sticky.as_deref() == Some(&*id) {
                let why = trace
                    .attempts
                    .last()
                    .map_or(Rebound::Failover, |a| Rebound::Failed(a.class));
                trace.rebound.get_or_insert(why);
            }
            if plan.owner_only {
                // A continuation cannot move: its history lives on the owner.
                return previous_response_not_found(
                    "Previous response not found: its account failed; resend the full request."
                        .into(),
                );
            }
            self.metrics.failover();
        }
    }

    /// The pool is dry for lack of quota: under `[credits] auto = "when_dry"`, a reset credit
    /// spent now (or by another request since this one was planned) may bring an account
    /// back. True when the walk should go on over a fresh plan. Once per request.
    async fn credit_revived(
        &self,
        ctx: &RequestCtx,
        plan: &Plan,
        walk: &mut Walk,
        trace: &mut Trace,
        outcome: Outcome,
    ) -> bool {
        let dry = matches!(outcome, Outcome::QuotaExhausted | Outcome::NoAccount);
        if !dry || walk.credit_tried || plan.owner_only || !self.config.credits.auto.when_dry() {
            return false;
        }
        walk.credit_tried = true;
        // Shutdown cuts a spend as a crash would: its record, written before the call, is
        // settled with the same redeem id after the start.
        let asked = Instant::now();
        let spend = tokio::select! {
            spend = self.spend_when_dry(walk.credits_seen, trace.key) => spend,
            () = self.cut_off() => return false,
        };
        trace.elsewhere += asked.elapsed();
        let served = match spend {
            Ok(spend) => {
                let reset = spend.reset();
                trace.credit = Some(spend);
                reset
            }
            Err(crate::dispatch::credits::NoSpend::Served) => true,
            Err(crate::dispatch::credits::NoSpend::NoCandidate(why)) => {
                tracing::debug!(why = %why, "no reset credit to spend");
                false
            }
        };
        if served {
            let scope = ctx
                .session
                .as_deref()
                .map(|s| refusal_scope(&ctx.key_id, s));
            let fresh = self
                .fleet
                .plan_for(&ctx.model, ctx.session.as_deref(), scope.as_deref());
            walk.remaining = fresh.order;
        }
        served
    }

    /// Turns the request's end into its record (kept before the last frames go out, so a
    /// client that read its whole answer finds it) and returns those frames.
    fn finish(
        &self,
        ctx: &RequestCtx,
        plan: Option<&Plan>,
        trace: Trace,
        candidate_pool: Vec<Arc<str>>,
        end: End,
    ) -> Vec<Frame> {
        let nothing = TerminalSource::Nothing;
        let (outcome, status, tail, terminal_source) = match end {
            End::Done {
                outcome,
                status,
                tail,
                source,
            } => (outcome, status, tail, source),
            End::Reply(reply, outcome) => {
                let source = reply.source;
                (
                    outcome,
                    reply.status,
                    vec![Frame::Error(Box::new(reply))],
                    source,
                )
            }
            End::ClientGone => (Outcome::ClientCancelled, 499, Vec::new(), nothing),
            End::ClientStalled => (Outcome::ClientStalled, 499, Vec::new(), nothing),
            End::Next => (Outcome::NoAccount, 503, Vec::new(), nothing),
        };
        // A request its key's policy refused was never scheduled: no affinity either way.
        let affinity = match plan {
            Some(plan) => self.settle_affinity(ctx, plan, &trace, outcome),
            None => Decision::None,
        };
        self.metrics
            .overhead(trace.begun.elapsed().saturating_sub(trace.elsewhere));
        let now_ms = self.fleet.clock().now_ms();
        let duration_ms = now_ms.saturating_sub(trace.started_ms);
        match outcome {
            Outcome::QuotaExhausted | Outcome::NoAccount => {
                if let Some(Frame::Error(e)) = tail.first() {
                    self.notifier().pool_dry(&ctx.model, now_ms, &e.message);
                }
            }
            Outcome::Success => self.notifier().served(&ctx.model, now_ms),
            _ => {}
        }
        let transport = trace.transport.unwrap_or(Transport::Http);
        self.metrics.request(outcome, &affinity);
        self.metrics.transport(transport);
        if let Some(ms) = trace.ws_connect_ms {
            self.metrics
                .ws_connect(std::time::Duration::from_millis(ms));
        }
        let account = trace.served.map(|s| String::from(&*s.chatgpt_account_id));
        macro_rules! request_final {
            ($level:ident) => {
                tracing::$level!(
                    target: "switchyard::access",
                    id = %RequestLog::id_of(trace.key),
                    key = %ctx.key_name,
                    model = %ctx.model,
                    outcome = outcome.as_str(),
                    status,
                    account = account.as_deref().unwrap_or(""),
                    attempts = trace.attempts.len(),
                    affinity = %affinity.label(),
                    duration_ms,
                    "request_final"
                )
            };
        }
        if self.config.access_log {
            request_final!(info);
        } else {
            request_final!(debug);
        }
        let usage = trace.usage.unwrap_or_default();
        self.usage.add(
            trace.started_ms,
            (&ctx.key_id, &ctx.model, account.as_deref()),
            Counters {
                requests: 1,
                errors: u64::from(outcome.is_error()),
                input_tokens: usage.input_tokens,
                cached_tokens: usage.cached_tokens,
                output_tokens: usage.output_tokens,
                reasoning_tokens: usage.reasoning_tokens,
                duration_ms,
            },
        );
        self.log.push(RequestRecord {
            key: trace.key,
            started_ms: trace.started_ms,
            key_name: String::from(&*ctx.key_name),
            model: ctx.model.clone(),
            path: std::borrow::Cow::Borrowed(ctx.path),
            stream: ctx.mode == Mode::Stream,
            ws: ctx.ws,
            outcome,
            status,
            account,
            attempts: trace.attempts,
            ttft_ms: trace.ttft_ms,
            duration_ms,
            usage: trace.usage,
            session: ctx.session.as_deref().map(session_hash),
            candidate_pool,
            skipped: trace.skipped,
            affinity,
            queue: trace.queue,
            transport,
            ws_connect_ms: trace.ws_connect_ms,
            terminal_source: Some(terminal_source),
            service_tier: ctx.service_tier.clone(),
            served_tier: trace.served_tier,
            credit: trace.credit,
        });
        tail
    }

    fn skip(&self, trace: &mut Trace, id: &str, reason: SkipReason) {
        let account = self
            .fleet
            .chatgpt_account_id(id)
            .unwrap_or_else(|| id.to_string());
        tracing::debug!(account = %account, reason = reason.as_str(), "candidate_skip");
        if !trace
            .skipped
            .iter()
            .any(|(a, r)| *a == account && *r == reason)
        {
            trace.skipped.push((account, reason));
        }
    }

    fn note_wait(&self, trace: &mut Trace, w: Wait) {
        trace.elsewhere += w.waited;
        let total =
            trace.queue.map_or(0, |q| q.wait_ms) + crate::base::duration::whole_ms(w.waited);
        self.metrics.queue_wait(w.kind, w.outcome, w.waited);
        tracing::info!(
            queue = w.kind.as_str(),
            outcome = w.outcome.as_str(),
            wait_ms = total,
            "queue_wait"
        );
        trace.queue = Some(QueueRecord {
            kind: w.kind,
            outcome: w.outcome,
            wait_ms: total,
        });
    }

    /// Finds a slot on the first remaining candidate that has one; when all are full, waits —
    /// for the session's own account first (sticky), then for any of them (pool).
    async fn acquire(
        &self,
        model: &str,
        plan: &Plan,
        walk: &mut Walk,
        tx: &frames::Sender,
        trace: &mut Trace,
    ) -> Acquire {
        let settings = self.fleet.settings();
        loop {
            // A sticky session tries only its own account until it has waited for it.
            let sticky_first = plan.sticky.as_ref().is_some_and(|s| {
                !walk.sticky_waited && walk.remaining.first().is_some_and(|f| **f == **s)
            });
            let mut i = 0;
            while i < walk.remaining.len() && (!sticky_first || i == 0) {
                match self.fleet.try_lease(&walk.remaining[i], model) {
                    Ok(lease) => {
                        walk.remaining.remove(i);
                        return Acquire::Lease(Box::new(lease));
                    }
                    // Busy (or deciding its half-open probe, or being proven): worth waiting
                    // for.
                    Err(
                        reason @ (SkipReason::Full | SkipReason::Probing | SkipReason::Unproven),
                    ) => {
                        let id = walk.remaining[i].clone();
                        self.skip(trace, &id, reason);
                        i += 1;
                    }
                    Err(reason) => {
                        let id = walk.remaining.remove(i);
                        if plan.sticky.as_deref() == Some(&*id) {
                            // The session's account became unusable since the plan.
                            trace.rebound.get_or_insert(Rebound::Skipped(reason));
                        }
                        self.skip(trace, &id, reason);
                    }
                }
            }
            if walk.remaining.is_empty() {
                return Acquire::Exhausted;
            }
            if let Some(sticky) = plan.sticky.as_ref().filter(|s| {
                sticky_first
                    && walk
                        .remaining
                        .first()
                        .is_some_and(|f| f.as_ref() == s.as_str())
            }) {
                walk.sticky_waited = true;
                let Some(wait_for) = walk.bounded(settings.sticky_wait) else {
                    return Acquire::Deadline;
                };
                let (lease, wait) = self
                    .fleet
                    .wait_for_account(
                        sticky,
                        model,
                        wait_for,
                        settings.sticky_max_waiting,
                        self.gone(tx),
                    )
                    .await;
                self.note_wait(trace, wait);
                match (lease, wait.outcome) {
                    (Some(l), _) => {
                        walk.remaining.retain(|id| **id != *l.id);
                        return Acquire::Lease(Box::new(l));
                    }
                    (None, QueueOutcome::ClientLeft) => return Acquire::ClientLeft,
                    (None, _) if walk.past_deadline() => return Acquire::Deadline,
                    // It became unusable: the next round skips it, with its reason.
                    (None, QueueOutcome::Withdrawn) => continue,
                    (None, _) if plan.owner_only => return Acquire::Busy,
                    (None, _) => {
                        // Busy for too long: the session moves on.
                        trace.rebound.get_or_insert(Rebound::Busy);
                        walk.remaining.retain(|id| **id != **sticky);
                        continue;
                    }
                }
            }
            let Some(wait_for) = walk.bounded(settings.queue_wait) else {
                return Acquire::Deadline;
            };
            let (lease, wait) = self
                .fleet
                .wait_for_pool(
                    &walk.remaining,
                    model,
                    wait_for,
                    settings.queue_max_waiting,
                    self.gone(tx),
                )
                .await;
            self.note_wait(trace, wait);
            return match (lease, wait.outcome) {
                (Some(l), _) => {
                    walk.remaining.retain(|id| **id != *l.id);
                    Acquire::Lease(Box::new(l))
                }
                (None, QueueOutcome::ClientLeft) => Acquire::ClientLeft,
                (None, _) if walk.past_deadline() => Acquire::Deadline,
                // Every account it waited for became unusable: the next round finds out why.
                (None, QueueOutcome::Withdrawn) => continue,
                (None, _) => Acquire::Busy,
            };
        }
    }

    /// Binds the session to the account that served it and says what the affinity did.
    fn settle_affinity(
        &self,
        ctx: &RequestCtx,
        plan: &Plan,
        trace: &Trace,
        outcome: Outcome,
    ) -> Decision {
        if let Some(served) = &trace.served
            && let Some(resp) = &served.response_id
        {
            self.fleet
                .affinity
                .own(Arc::clone(resp), Arc::clone(&served.id));
        }
        let Some(session) = &ctx.session else {
            return Decision::None;
        };
        if outcome == Outcome::StreamError
            && let Some(served) = &trace.served
        {
            // The account broke this session's stream: the session avoids it for a while.
            self.fleet.affinity.exclude(session, &served.id);
        }
        let Some(served) = &trace.served else {
            return match (&plan.bound, trace.rebound) {
                (None, _) => Decision::NewBind,
                (Some(_), Some(why)) => Decision::Rebound(why),
                (Some(_), None) => Decision::Reused,
            };
        };
        let decision = match &plan.bound {
            None => Decision::NewBind,
            Some(b) if **b == *served.id => Decision::Reused,
            Some(_) => Decision::Rebound(trace.rebound.unwrap_or(Rebound::Failover)),
        };
        self.fleet.affinity.bind(session, &served.id);
        decision
    }

    /// Resolves when a waiting request has no one to wait for: its client left, or shutdown
    /// cut it.
    async fn gone(&self, tx: &frames::Sender) {
        tokio::select! {
            _ = super::client_left(tx) => {}
            _ = self.cut_off() => {}
        }
    }

    /// 504 `request_deadline_exceeded`: no account answered in time.
    pub(crate) fn deadline_reply(&self, attempts: usize) -> ErrorReply {
        ErrorReply::openai(
            504,
            "server_error",
            "request_deadline_exceeded",
            format!(
                "no account answered within {} ({attempts} attempts); retry later",
                human_duration(crate::base::duration::whole_ms(
                    self.config.request_deadline
                ))
            ),
            Map::new(),
        )
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
        reply
            .headers
            .push((reqwest::header::RETRY_AFTER, HeaderValue::from_static("2")));
        reply
    }

    /// The answer when no candidate is left, and its outcome.
    pub fn exhausted(&self, model: &str) -> (ErrorReply, Outcome) {
        if self.fleet.model_marked_everywhere(model) {
            let reply = ErrorReply::openai(
                404,
                "invalid_request_error",
                "model_not_found",
                format!("The model `{model}` is not supported by any account in the pool"),
                Map::new(),
            );
            return (reply, Outcome::ModelNotFound);
        }
        let (all_quota, earliest, summary) = self.fleet.exhaustion_summary();
        let now = self.fleet.clock().now_ms();
        let wait_s = earliest.map(|u| u.saturating_sub(now).div_ceil(1000).max(1));
        let (mut reply, outcome) = if all_quota {
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
            let reply = ErrorReply::openai(
                429,
                "usage_limit_reached",
                "usage_limit_reached",
                message,
                extra,
            );
            (reply, Outcome::QuotaExhausted)
        } else {
            let reply = ErrorReply::openai(
                503,
                "server_error",
                "no_available_account",
                summary,
                Map::new(),
            );
            (reply, Outcome::NoAccount)
        };
        if let Some(s) = wait_s
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            reply.headers.push((reqwest::header::RETRY_AFTER, v));
        }
        (reply, outcome)
    }
}

/// 400 `previous_response_not_found`: the client then resends the full request.
fn previous_response_not_found(message: String) -> End {
    let mut extra = Map::new();
    extra.insert("param".into(), json!("previous_response_id"));
    let reply = ErrorReply::openai(
        400,
        "invalid_request_error",
        "previous_response_not_found",
        message,
        extra,
    );
    End::Reply(reply, Outcome::PreviousResponseNotFound)
}

/// A short, stable, non-reversible tag for a session key.
pub fn session_hash(s: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(s.as_bytes())[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// 503 `server_shutting_down`: the gateway stopped before this request had an answer.
/// The answer to a request its key's policy refused, in the OpenAI shape; `Retry-After` when
/// waiting helps, and for a token budget `resets_in_seconds` in the error.
fn refusal_reply(r: &Refusal) -> ErrorReply {
    let mut extra = Map::new();
    if let Refusal::BudgetExhausted { resets_in_s, .. } = r {
        extra.insert("resets_in_seconds".into(), json!(resets_in_s));
    }
    let mut reply = ErrorReply::openai(r.status(), r.kind(), r.code(), r.message(), extra);
    if let Some(s) = r.retry_after_s()
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        reply.headers.push((reqwest::header::RETRY_AFTER, v));
    }
    reply
}

fn refusal_outcome(r: &Refusal) -> Outcome {
    match r {
        Refusal::Revoked => Outcome::KeyRevoked,
        Refusal::Expired { .. } => Outcome::KeyExpired,
        Refusal::ModelNotAllowed { .. } => Outcome::ModelNotAllowed,
        Refusal::TierNotAllowed { .. } => Outcome::TierNotAllowed,
        Refusal::RateLimited { .. } => Outcome::KeyRateLimited,
        Refusal::BudgetExhausted { .. } => Outcome::KeyBudgetExhausted,
        Refusal::ConcurrencyExceeded { .. } => Outcome::KeyConcurrencyExceeded,
    }
}

pub(crate) fn shutting_down_reply() -> ErrorReply {
    let mut reply = ErrorReply::openai(
        503,
        "server_error",
        "server_shutting_down",
        "the gateway is shutting down; retry in a moment",
        Map::new(),
    );
    reply
        .headers
        .push((reqwest::header::RETRY_AFTER, HeaderValue::from_static("5")));
    reply
}
