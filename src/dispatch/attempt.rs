//! One attempt: a try of a request on one account. [`Attempt`] owns what the try needs — the
//! slot's lease, the account's identity, the client's channel, its start time and its part of
//! the request's trace — and ends in a typed [`End`]. It ensures a fresh token, sends over HTTP
//! or an upstream WebSocket, has every failure judged by the fleet (the one classifier), and
//! hands the answer to its commit boundary (`stream.rs`).

use std::sync::Arc;
use std::time::Instant;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::{Dispatcher, ErrorReply, Frame, Mode, RequestCtx, Unsent, frames};
use crate::fleet::affinity::{Rebound, refusal_scope};
use crate::fleet::health::{Blame, Class};
use crate::fleet::refresh::TokenError;
use crate::fleet::rules::Scope;
use crate::fleet::scheduler::SkipReason;
use crate::fleet::{Lease, Origin};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::records::{AttemptRecord, Outcome, QueueRecord, TerminalSource, Usage};
use crate::upstream::event::Event;
use crate::upstream::failure::{Endpoint, Facts, Phase};
use crate::upstream::quota::QuotaSnapshot;
use crate::upstream::stream::EventStream;
use crate::upstream::ws::{DIAL_BUDGET, DialError, TurnSocket, turn};
use crate::upstream::{Identity, MAX_ERROR_BODY, Overflow, Transport, relayed};

/// How an attempt ended.
#[derive(Debug)]
pub(crate) enum End {
    /// The request is answered: its outcome, the status the client got, the frames still to
    /// send (they go out after the record is kept), and whose its last event is.
    Done {
        outcome: Outcome,
        status: u16,
        tail: Vec<Frame>,
        source: TerminalSource,
    },
    /// Nothing reached the client; the failure was applied to the account: try the next one.
    Next,
    /// Answer the client with this error (nothing was committed).
    Reply(ErrorReply, Outcome),
    /// The client went away.
    ClientGone,
    /// The client stopped reading its answer.
    ClientStalled,
}

/// The account that answered a request.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    /// Shared with the lease it was served on.
    pub id: Arc<str>,
    pub chatgpt_account_id: Arc<str>,
    /// Shared with the stream that read it (its commit and its end each name it).
    pub response_id: Option<Arc<str>>,
}

/// What is known about a request while it runs; each attempt adds to it.
#[derive(Debug)]
pub(crate) struct Trace {
    pub key: u64,
    pub started_ms: u64,
    pub attempts: Vec<AttemptRecord>,
    pub served: Option<Served>,
    pub ttft_ms: Option<u64>,
    pub usage: Option<Usage>,
    /// Accounts left out (`chatgpt_account_id`) and why.
    pub skipped: Vec<(String, SkipReason)>,
    pub queue: Option<QueueRecord>,
    /// Why the session left its bound account, if it did.
    pub rebound: Option<Rebound>,
    /// How the last attempt reached the backend.
    pub transport: Option<Transport>,
    pub ws_connect_ms: Option<u64>,
    /// What this prompt may still do to accounts (one cooldown for an unexplained failure).
    pub blame: Blame,
    /// The last policy refusal, answered when no candidate is left.
    pub refusal: Option<ErrorReply>,
    /// Attempts that showed nothing within the first-output timeout.
    pub first_output_timeouts: u32,
    /// The reset-credit spend this request's need made.
    pub credit: Option<crate::telemetry::records::CreditSpend>,
    /// The `service_tier` the answer claimed.
    pub served_tier: Option<String>,
    /// When the dispatcher took the request, and the time its attempts and waits took: the
    /// rest is the gateway's own.
    pub begun: Instant,
    pub elsewhere: std::time::Duration,
}

impl Trace {
    pub fn new(key: u64, started_ms: u64) -> Trace {
        Trace {
            key,
            started_ms,
            // Most requests take one attempt.
            attempts: Vec::with_capacity(1),
            served: None,
            ttft_ms: None,
            usage: None,
            skipped: Vec::new(),
            queue: None,
            rebound: None,
            transport: None,
            ws_connect_ms: None,
            blame: Blame::default(),
            refusal: None,
            first_output_timeouts: 0,
            credit: None,
            served_tier: None,
            begun: Instant::now(),
            elsewhere: std::time::Duration::ZERO,
        }
    }

    /// Adds an attempt to the chain (and counts it).
    pub fn push_attempt(&mut self, metrics: &Metrics, a: AttemptRecord) {
        metrics.attempt(a.class);
        self.attempts.push(a);
    }
}

/// What ended the wait for an answer's head before it came.
enum Interrupted {
    ClientLeft,
    Deadline,
    Cut,
}

/// What sending ended in.
enum Sent {
    End(End),
    /// The backend refused the access token as expired.
    TokenRefused(String),
}

pub(crate) fn ms_since(t: Instant) -> u64 {
    ms_between(t, Instant::now())
}

/// Whole milliseconds from `t` to `now` (one clock reading serves several measures).
pub(crate) fn ms_between(t: Instant, now: Instant) -> u64 {
    crate::base::duration::whole_ms(now.saturating_duration_since(t))
}

/// One try of a request on one account.
pub(crate) struct Attempt<'a> {
    pub(super) d: &'a Dispatcher,
    pub(super) ctx: &'a RequestCtx,
    pub(super) tx: &'a frames::Sender,
    pub(super) trace: &'a mut Trace,
    pub(super) lease: Lease,
    identity: Identity,
    /// When the current try began (a refused token makes a second one), and the same on the
    /// clock.
    pub(super) started: Instant,
    started_ms: u64,
    /// The access token was refreshed for this try (after the backend refused the first).
    refreshed: bool,
    /// A frame waited for the client for the whole write timeout.
    pub(super) client_stalled: bool,
    /// The backend refused the access token as expired inside the answer (a WebSocket error
    /// frame, or an event in a 200) before anything was shown.
    pub(super) token_refused: bool,
    /// The backend endpoint this try talks to (for the facts of its failures).
    pub(super) endpoint: Endpoint,
    /// The operator's rule that judged the last failure, for its record.
    rule: Option<String>,
    /// What the built-in classification made of a failure a rule passed through, for its
    /// record.
    passed: Option<Class>,
}

impl<'a> Attempt<'a> {
    /// Runs an attempt on the leased account to its end. The attempt's future is most of a
    /// request's state (its upstream call and stream, about 9 KB): it lives on the heap, so the
    /// request's own future stays small and spawning it copies little.
    pub(crate) fn run(
        d: &'a Dispatcher,
        ctx: &'a RequestCtx,
        tx: &'a frames::Sender,
        trace: &'a mut Trace,
        lease: Lease,
    ) -> std::pin::Pin<Box<impl std::future::Future<Output = End> + Send + 'a>> {
        super::boxed(move || Self::run_inline(d, ctx, tx, trace, lease))
    }

    async fn run_inline(
        d: &'a Dispatcher,
        ctx: &'a RequestCtx,
        tx: &'a frames::Sender,
        trace: &'a mut Trace,
        lease: Lease,
    ) -> End {
        let started = Instant::now();
        let identity = match d
            .fleet
            .ensure_fresh(&lease.id, None, d.upstream.as_ref())
            .await
        {
            Ok(i) => i,
            Err(e) => return token_failed(d, trace, &lease, e, started),
        };
        let mut a = Attempt {
            d,
            ctx,
            tx,
            trace,
            lease,
            identity,
            started,
            started_ms: d.fleet.clock().now_ms(),
            refreshed: false,
            client_stalled: false,
            token_refused: false,
            endpoint: Endpoint::Responses,
            rule: None,
            passed: None,
        };
        tracing::debug!(account = %a.lease.id, "attempt_start");
        let rejected = match a.send().await {
            Sent::End(end) => return end,
            Sent::TokenRefused(token) => token,
        };
        // The access token was refused as expired: one refresh, one more try.
        a.started = Instant::now();
        a.started_ms = d.fleet.clock().now_ms();
        match d
            .fleet
            .ensure_fresh(&a.lease.id, Some(&rejected), d.upstream.as_ref())
            .await
        {
            Ok(i) => a.identity = i,
            Err(e) => return token_failed(d, a.trace, &a.lease, e, a.started),
        }
        a.refreshed = true;
        match a.send().await {
            Sent::End(end) => end,
            Sent::TokenRefused(_) => End::Next,
        }
    }

    async fn send(&mut self) -> Sent {
        match self.send_once().await {
            Sent::End(End::Next) if std::mem::take(&mut self.token_refused) => {
                Sent::TokenRefused(String::from(&*self.identity.access_token))
            }
            sent => sent,
        }
    }

    async fn send_once(&mut self) -> Sent {
        let headers = self.headers();
        if self.ctx.ws && self.ctx.mode == Mode::Stream {
            match self.over_websocket(&headers).await {
                Ok(sent) => return sent,
                Err(fallback) => {
                    self.via(fallback);
                    if self.ctx.ws_turn.as_ref().is_some_and(|t| t.warmup) {
                        return Sent::End(self.local_warmup());
                    }
                }
            }
        } else {
            self.via(Transport::Http);
        }
        self.over_http(&headers).await
    }

    /// Records how this try reaches the backend.
    fn via(&mut self, transport: Transport) {
        self.trace.transport = Some(transport);
        self.endpoint = match transport {
            Transport::WsReused | Transport::WsConnected | Transport::WsRejected => {
                Endpoint::WebSocket
            }
            _ => Endpoint::Responses,
        };
    }

    /// `bytes` as this account sends them: the client's device ids replaced by the account's.
    fn own(&self, bytes: &bytes::Bytes) -> bytes::Bytes {
        self.ctx
            .client_ids
            .rewrite(bytes, &self.identity.installation_id)
    }

    /// The client's pass-through headers (the device ids in them the account's), and the
    /// turn-state token only when this account issued it.
    fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut h: Vec<(HeaderName, HeaderValue)> = if self.ctx.client_ids.is_empty() {
            self.ctx.pass_headers.clone()
        } else {
            let account = &self.identity.installation_id;
            self.ctx
                .pass_headers
                .iter()
                .map(|(k, v)| (k.clone(), self.ctx.client_ids.rewrite_header(v, account)))
                .collect()
        };
        if let Some(ts) = &self.ctx.turn_state {
            let same_account = self
                .d
                .turn_states
                .get(ts)
                .is_some_and(|owner| *owner == *self.lease.id);
            if same_account && let Ok(v) = HeaderValue::from_str(ts) {
                h.push((crate::upstream::TURN_STATE.clone(), v));
            }
        }
        h
    }

    /// What the backend's answer headers say: the account's usage windows, and the turn-state
    /// token this account issued.
    fn observe(&self, h: &HeaderMap) {
        if let Some(q) = QuotaSnapshot::from_headers(h, self.d.fleet.clock().now_ms()) {
            self.d.fleet.update_quota(&self.lease.id, q);
        }
        if let Some(ts) = h
            .get(&crate::upstream::TURN_STATE)
            .and_then(|v| v.to_str().ok())
        {
            self.d
                .turn_states
                .insert(ts.to_string(), String::from(&*self.lease.id));
        }
    }

    async fn over_http(&mut self, headers: &[(HeaderName, HeaderValue)]) -> Sent {
        let compact = self.ctx.mode == Mode::Compact;
        let path = if compact {
            "/responses/compact"
        } else {
            "/responses"
        };
        // The upstream's header timeout ends the wait first unless the request's deadline is
        // nearer (with the defaults, 60 s against 600): then no timer is made for the deadline
        // (a disabled branch's future is still made, so the timer is made inside it).
        let deadline = self.deadline();
        let deadline_first =
            tokio::time::Instant::now() + self.d.upstream.config().header_timeout > deadline;
        let waited = {
            // Pinned where it is made: the wait polls it in place instead of moving it.
            let send = std::pin::pin!(self.d.upstream.post(
                path,
                &self.identity,
                headers,
                self.own(&self.ctx.body),
                !compact,
            ));
            tokio::select! {
                r = send => Ok(r),
                _ = super::client_left(self.tx) => Err(Interrupted::ClientLeft),
                _ = async { tokio::time::sleep_until(deadline).await }, if deadline_first => {
                    Err(Interrupted::Deadline)
                }
                _ = self.d.cut_off() => Err(Interrupted::Cut),
            }
        };
        let resp = match waited {
            Ok(Ok(r)) => r,
            Ok(Err(facts)) => return self.failed(facts),
            Err(Interrupted::ClientLeft) => return Sent::End(self.client_gone(None)),
            Err(Interrupted::Deadline) => return Sent::End(self.abandon()),
            Err(Interrupted::Cut) => return Sent::End(self.shut_down(None, None)),
        };
        self.d.metrics.upstream_headers(self.started.elapsed());
        self.observe(resp.headers());
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let resp_headers = resp.headers().clone();
            let body = tokio::select! {
                b = self.d.upstream.read_body(resp, MAX_ERROR_BODY, Overflow::Truncate) => b.unwrap_or_default(),
                _ = super::client_left(self.tx) => return Sent::End(self.client_gone(Some(status))),
                _ = self.d.cut_off() => return Sent::End(self.shut_down(None, None)),
            };
            return self.failed(Facts::from_response(status, &resp_headers, body));
        }
        // What the client is told of the answer's headers: taken before the body is, so that
        // a good answer's header map is not copied.
        let relay = relayed(resp.headers());
        if compact {
            return Sent::End(self.finish_unary(resp, relay).await);
        }
        let events = EventStream::sse(resp, self.d.config.max_event_bytes);
        Sent::End(self.pump(events, relay).await)
    }

    /// A downstream WebSocket turn over an upstream socket: reused from the pool, or dialled
    /// within the budget. `Err` sends the turn over HTTP instead, with the reason (breaker
    /// open, no socket in time, 426, a pooled socket that died); a rejected handshake or a
    /// failed dial is judged and fails over like an HTTP answer.
    async fn over_websocket(
        &mut self,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<Sent, Transport> {
        let d = self.d;
        let Some(permit) = d.breaker.allow() else {
            return Err(Transport::HttpBreakerOpen);
        };
        let want = self
            .ctx
            .ws_turn
            .as_ref()
            .and_then(|t| t.previous_response_id.as_deref());
        let owner = self.ctx.ws_turn.as_ref().map(|t| t.connection);
        let pooled = match &self.ctx.session {
            Some(s) => d.ws_pool.checkout(&self.lease.id, s, want, owner).await,
            None => None,
        };
        let socket = match pooled {
            // No dial: the permit says nothing about the origin.
            Some(s) => {
                self.via(Transport::WsReused);
                s
            }
            None => {
                let t0 = Instant::now();
                match d.upstream.dial(&self.identity, headers, DIAL_BUDGET).await {
                    Ok(s) => {
                        permit.success();
                        self.via(Transport::WsConnected);
                        self.trace.ws_connect_ms = Some(ms_since(t0));
                        s
                    }
                    Err(DialError::Budget(late)) => {
                        permit.degraded();
                        late.pool_when_open(
                            d.ws_pool.clone(),
                            String::from(&*self.lease.id),
                            self.ctx.session.clone(),
                        );
                        return Err(Transport::HttpWsBudgetExhausted);
                    }
                    Err(DialError::Refused) => {
                        permit.degraded();
                        return Err(Transport::HttpWsFailed);
                    }
                    // The origin answered: the breaker's question is settled; the account's
                    // is judged like an HTTP answer.
                    Err(DialError::Rejected(facts)) => {
                        permit.success();
                        self.via(Transport::WsRejected);
                        return Ok(self.failed(facts));
                    }
                    Err(DialError::Transport(facts)) => {
                        permit.degraded();
                        self.via(Transport::HttpWsFailed);
                        return Ok(self.failed(facts));
                    }
                }
            }
        };
        d.metrics.upstream_headers(self.started.elapsed());
        self.observe(&socket.headers);
        let relay = relayed(&socket.headers);
        // The socket that produced the previous response holds its state: the frame goes as
        // sent. Anywhere else the turn carries its full history.
        let body = match &self.ctx.ws_turn {
            Some(t)
                if t.previous_response_id
                    .as_deref()
                    .is_some_and(|p| socket.holds(p)) =>
            {
                self.own(&t.frame)
            }
            Some(t) if t.warmup => with_field(&self.own(&self.ctx.body), "generate", &false),
            _ => self.own(&self.ctx.body),
        };
        let t = TurnSocket {
            socket,
            pool: d.ws_pool.clone(),
            account: String::from(&*self.lease.id),
            session: self.ctx.session.clone(),
            owner,
        };
        match turn(t, &body).await {
            Ok(frames) => Ok(Sent::End(self.pump(EventStream::ws(frames), relay).await)),
            // A pooled socket that died while idle: this turn goes over HTTP.
            Err(_) => Err(Transport::HttpWsFailed),
        }
    }

    /// A warm-up that could not reach an upstream socket: over HTTP there is nothing to prime,
    /// so it is answered here (the connection remembers its input for the real turn).
    fn local_warmup(&mut self) -> End {
        let id = format!(
            "resp_{}",
            crate::keys::random_base62(24)
                .unwrap_or_default()
                .to_lowercase()
        );
        let created_at = self.d.fleet.clock().now_secs();
        let response = |status: &str| {
            serde_json::json!({"id": id, "object": "response", "created_at": created_at,
                "status": status, "model": self.ctx.model, "output": [],
                "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}})
        };
        let created = serde_json::json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress")});
        let completed = serde_json::json!({"type": "response.completed", "sequence_number": 1, "response": response("completed")});
        self.record(
            Class::Success,
            None,
            None,
            Some("warm-up answered by the gateway".into()),
        );
        self.serve(Some(Arc::from(id.as_str())));
        End::Done {
            outcome: Outcome::Success,
            status: 200,
            tail: vec![
                Frame::Head {
                    status: 200,
                    headers: Vec::new(),
                },
                Frame::Events(vec![
                    Event::from_value(&created),
                    Event::from_value(&completed),
                ]),
            ],
            source: TerminalSource::Synthetic,
        }
    }

    /// A unary answer (`/responses/compact`), relayed as it is.
    async fn finish_unary(
        &mut self,
        resp: crate::upstream::Answer,
        mut headers: Vec<(HeaderName, HeaderValue)>,
    ) -> End {
        let status = resp.status().as_u16();
        let read = self
            .d
            .upstream
            .read_body(resp, self.d.config.max_event_bytes, Overflow::Refuse);
        match read.await {
            Ok(body) => {
                self.d
                    .fleet
                    .report(&self.lease.id, Class::Success, None, &self.ctx.model);
                self.record(Class::Success, Some(status), None, None);
                self.serve(None);
                headers.push((
                    reqwest::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ));
                End::Done {
                    outcome: Outcome::Success,
                    status,
                    tail: vec![Frame::Head { status, headers }, Frame::Body(body)],
                    source: TerminalSource::Upstream,
                }
            }
            Err(facts) => self.fail_over(facts),
        }
    }

    /// Has the fleet judge a failure (and apply it to the account), records it, and returns
    /// its class.
    pub(super) fn judge(&mut self, facts: &Facts) -> Class {
        let class = self.verdict(facts);
        self.record_failure(class, facts);
        class
    }

    /// The fleet's verdict on a failure, applied to the account within the prompt's blame. A
    /// policy refusal keeps this key's session away from the account and is remembered, to
    /// answer with if no candidate is left.
    pub(super) fn verdict(&mut self, facts: &Facts) -> Class {
        let refreshed;
        let facts = if self.refreshed && !facts.after_refresh {
            refreshed = Facts {
                after_refresh: true,
                ..facts.clone()
            };
            &refreshed
        } else {
            facts
        };
        let origin = Origin {
            model: &self.ctx.model,
            started_ms: self.started_ms,
        };
        let verdict = self
            .d
            .fleet
            .judge(&self.lease.id, facts, origin, &mut self.trace.blame);
        let class = verdict.class;
        let on_session = verdict.scope == Scope::Session;
        if class.cools_account() && verdict.scope == Scope::Account {
            // Its idle upstream sockets are no use while it cools.
            self.d.ws_pool.evict(&self.lease.id);
        }
        if (class == Class::Policy || on_session)
            && let Some(session) = &self.ctx.session
        {
            let ttl = verdict
                .cooldown
                .filter(|_| on_session)
                .unwrap_or(crate::fleet::affinity::REFUSAL_TTL);
            self.d.fleet.affinity.refuse_for(
                &refusal_scope(&self.ctx.key_id, session),
                &self.lease.id,
                ttl,
            );
        }
        if class == Class::Policy {
            self.trace.refusal = Some(caller_reply(facts));
        }
        self.rule = verdict.rule;
        self.passed = verdict.passed;
        class
    }

    /// Logs and records a failure the fleet judged as `class`.
    pub(super) fn record_failure(&mut self, class: Class, facts: &Facts) {
        tracing::info!(
            request = %crate::telemetry::records::RequestLog::id_of(self.trace.key),
            account = %self.lease.id,
            class = class.as_str(),
            status = facts.status.unwrap_or(0),
            phase = facts.phase.map_or("", Phase::as_str),
            error = %facts.summary(),
            "attempt_result"
        );
        self.record(class, facts.status, facts.phase, Some(facts.summary()));
    }

    /// A failure while sending (a transport error, a non-2xx answer, a rejected handshake):
    /// a refused token is refreshed and tried again, a caller error goes back as it is, and
    /// anything else moves on.
    fn failed(&mut self, facts: Facts) -> Sent {
        let facts = Facts {
            after_refresh: self.refreshed,
            ..facts
        };
        match self.judge(&facts) {
            Class::AuthExpired => Sent::TokenRefused(String::from(&*self.identity.access_token)),
            Class::Caller => {
                self.serve(None);
                Sent::End(End::Reply(caller_reply(&facts), Outcome::CallerError))
            }
            _ => Sent::End(End::Next),
        }
    }

    /// A failure before anything reached the client: judged, then the next candidate.
    pub(super) fn fail_over(&mut self, facts: Facts) -> End {
        self.judge(&facts);
        End::Next
    }

    /// When the request must have a first answer by.
    pub(super) fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.ctx.received + self.d.config.request_deadline)
    }

    /// The request's deadline passed before anything was shown: the attempt is given up
    /// (neutral for the account) and the client told.
    pub(super) fn abandon(&mut self) -> End {
        tracing::info!(account = %self.lease.id, "request deadline reached; attempt given up");
        self.record(
            Class::Abandoned,
            None,
            None,
            Some("the request's deadline passed".into()),
        );
        End::Reply(
            self.d.deadline_reply(self.trace.attempts.len()),
            Outcome::DeadlineExceeded,
        )
    }

    /// The client is gone: it left, or it stopped reading (a frame waited for it for the
    /// whole write timeout, or the edge found a write to it stuck). Neutral for the account
    /// either way; dropping the attempt frees the slot and the upstream request.
    pub(super) fn client_gone(&mut self, status: Option<u16>) -> End {
        let stalled = self.client_stalled
            || self
                .ctx
                .stalled
                .as_ref()
                .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst));
        if stalled {
            tracing::info!(account = %self.lease.id, "client stopped reading; request cut");
            self.record(Class::ClientStalled, status, None, None);
            End::ClientStalled
        } else {
            tracing::info!(account = %self.lease.id, "client went away");
            self.record(Class::ClientCancelled, status, None, None);
            End::ClientGone
        }
    }

    /// Shutdown cut the request (neutral for the account). A committed stream (`Some` with its
    /// response id) is told with `response.failed` `server_shutting_down`; anything else gets
    /// a 503 of that code.
    pub(super) fn shut_down(
        &mut self,
        committed: Option<Option<Arc<str>>>,
        phase: Option<Phase>,
    ) -> End {
        tracing::info!(account = %self.lease.id, "shutdown cut the request");
        let status = committed.as_ref().map(|_| 200);
        self.record(
            Class::Abandoned,
            status,
            phase,
            Some("the gateway shut down".into()),
        );
        match committed {
            Some(response_id) => End::Done {
                outcome: Outcome::ShuttingDown,
                status: 200,
                tail: vec![Frame::Events(vec![Event::failed(
                    response_id.as_deref(),
                    "server_shutting_down",
                    "the gateway shut down before the response completed; resend the request",
                )])],
                source: TerminalSource::Synthetic,
            },
            None => End::Reply(super::request::shutting_down_reply(), Outcome::ShuttingDown),
        }
    }

    /// Sends a frame to the client, waiting at most the write timeout for room. False when
    /// the client is gone (or stalled).
    pub(super) async fn emit(&mut self, frame: Frame) -> bool {
        match super::send_within(self.tx, frame, self.d.config.client_write_timeout).await {
            Ok(()) => true,
            Err(Unsent::Stalled) => {
                self.client_stalled = true;
                false
            }
            Err(Unsent::Gone) => false,
        }
    }

    /// Adds this try to the request's attempt chain.
    pub(super) fn record(
        &mut self,
        class: Class,
        status: Option<u16>,
        phase: Option<Phase>,
        error: Option<String>,
    ) {
        let took = self.started.elapsed();
        let record = AttemptRecord {
            account: String::from(&*self.lease.chatgpt_account_id),
            class: self.passed.take().unwrap_or(class),
            status,
            phase,
            ms: crate::base::duration::whole_ms(took),
            error,
            rule: self.rule.take(),
        };
        self.trace.elsewhere += took;
        self.trace.push_attempt(&self.d.metrics, record);
    }

    /// This attempt answers the request.
    pub(super) fn serve(&mut self, response_id: Option<Arc<str>>) {
        match &mut self.trace.served {
            // Served since its commit: its end names the response it gave.
            Some(s) if s.id == self.lease.id => s.response_id = response_id,
            served => {
                *served = Some(Served {
                    id: self.lease.id.clone(),
                    chatgpt_account_id: self.lease.chatgpt_account_id.clone(),
                    response_id,
                })
            }
        }
    }
}

/// No usable token: the refresh failure was applied to the account by the fleet; the attempt
/// is recorded with its class and the request moves on.
fn token_failed(
    d: &Dispatcher,
    trace: &mut Trace,
    lease: &Lease,
    e: TokenError,
    started: Instant,
) -> End {
    match e {
        TokenError::Failed { class, why } => {
            if class.cools_account() {
                // It cools or needs a new login: its idle upstream sockets are no use.
                d.ws_pool.evict(&lease.id);
            }
            trace.elsewhere += started.elapsed();
            trace.push_attempt(
                &d.metrics,
                AttemptRecord {
                    account: String::from(&*lease.chatgpt_account_id),
                    class,
                    status: None,
                    phase: Some(Phase::Connect),
                    ms: ms_since(started),
                    error: Some(why),
                    rule: None,
                },
            );
        }
        // Removed (or its tokens gone) since the plan was made.
        TokenError::Missing => trace.skipped.push((
            String::from(&*lease.chatgpt_account_id),
            SkipReason::NoTokens,
        )),
    }
    End::Next
}

/// A JSON object body with one field set, its other members as sent.
fn with_field(body: &bytes::Bytes, key: &str, value: &impl serde::Serialize) -> bytes::Bytes {
    match crate::base::raw_json::RawObject::parse(body) {
        Ok(mut v) => {
            v.set(key, value);
            bytes::Bytes::from(v.encode())
        }
        Err(_) => body.clone(),
    }
}

/// A caller error returned to the client as the backend gave it.
fn caller_reply(f: &Facts) -> ErrorReply {
    // The backend's own status (an operator rule may pass a 5xx through as it is); a failure
    // event inside a 200 stream is a 400.
    let status = f.status.filter(|s| (400..600).contains(s)).unwrap_or(400);
    let message = f.message.clone().unwrap_or_else(|| f.summary());
    let code = f
        .error_code
        .clone()
        .or_else(|| f.error_type.clone())
        .unwrap_or_else(|| "invalid_request_error".into());
    match &f.body {
        Some(body) if !body.is_empty() && f.status.is_some_and(|s| s >= 400) => ErrorReply {
            status,
            body: body.clone(),
            content_type: f
                .content_type
                .clone()
                .unwrap_or_else(|| "application/json".into()),
            headers: Vec::new(),
            code,
            message,
            source: TerminalSource::Upstream,
        },
        _ => ErrorReply::openai(
            status,
            "invalid_request_error",
            &code,
            message,
            serde_json::Map::new(),
        )
        .from_upstream(),
    }
}
