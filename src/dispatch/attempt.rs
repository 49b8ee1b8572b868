//! One attempt on one account: build the upstream request with the account's identity, send
//! it, and turn the result into facts and a decision.

use std::time::Instant;

use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use switchyard_tui::wire;
use tokio::sync::mpsc;

use super::request::{AttemptEnd, Trace, ms_since};
use super::{Dispatcher, ErrorReply, Frame, Mode, RequestCtx};
use crate::fleet::Lease;
use crate::fleet::health::{Class, classify};
use crate::upstream::failure::Facts;
use crate::upstream::quota::QuotaSnapshot;
use crate::upstream::{Identity, MAX_ERROR_BODY, read_limited};

/// Client headers passed through to the backend (session topology, telemetry, routing).
pub const PASS_THROUGH: [&str; 14] = [
    "session-id",
    "session_id",
    "thread-id",
    "conversation_id",
    "x-client-request-id",
    "originator",
    "user-agent",
    "version",
    "x-codex-window-id",
    "x-codex-turn-metadata",
    "x-codex-beta-features",
    "x-openai-subagent",
    "x-codex-parent-thread-id",
    "openai-beta",
];

/// Upstream response headers relayed to the client.
pub fn relayed(h: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    h.iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            k.starts_with("x-codex-") || k == "openai-model" || k == "x-models-etag"
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl Dispatcher {
    /// Headers for an attempt on `account_id`: the client's pass-through headers, and the
    /// turn-state token only when this account issued it.
    fn attempt_headers(
        &self,
        ctx: &RequestCtx,
        account_id: &str,
    ) -> Vec<(HeaderName, HeaderValue)> {
        let mut h = ctx.pass_headers.clone();
        if let Some(ts) = &ctx.turn_state {
            let same_account = self
                .turn_states
                .get(ts)
                .is_some_and(|owner| owner == account_id);
            if same_account && let Ok(v) = HeaderValue::from_str(ts) {
                h.push((HeaderName::from_static("x-codex-turn-state"), v));
            }
        }
        h
    }

    pub(crate) async fn attempt(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        identity: Identity,
        tx: &mpsc::Sender<Frame>,
        trace: &mut Trace,
    ) -> AttemptEnd {
        let started = Instant::now();
        tracing::debug!(account = %lease.id, "attempt_start");
        let headers = self.attempt_headers(ctx, &lease.id);
        if ctx.ws && ctx.mode == Mode::Stream {
            // `Err` means this turn goes over HTTP.
            if let Ok(end) = self
                .ws_attempt(ctx, lease, &identity, &headers, tx, trace, started)
                .await
            {
                return end;
            }
            if ctx.ws_turn.as_ref().is_some_and(|t| t.warmup) {
                return self.local_warmup(ctx, lease, trace, started);
            }
        } else {
            trace.transport = Some("http");
        }
        let path = if ctx.mode == Mode::Compact {
            "/responses/compact"
        } else {
            "/responses"
        };
        let send = self.upstream.post(
            path,
            &identity,
            &headers,
            ctx.body.clone(),
            ctx.mode != Mode::Compact,
        );
        let resp = tokio::select! {
            r = send => r,
            _ = tx.closed() => return self.client_gone(lease, started, trace, None),
        };
        let resp = match resp {
            Ok(r) => r,
            Err(facts) => return self.attempt_failed(ctx, lease, &identity, facts, started, trace),
        };
        self.metrics.upstream_headers(started.elapsed());
        let now_ms = self.fleet.clock().now_ms();
        if let Some(q) = QuotaSnapshot::from_headers(resp.headers(), now_ms) {
            self.fleet.update_quota(&lease.id, q);
        }
        let status = resp.status().as_u16();
        let resp_headers = resp.headers().clone();
        if !(200..300).contains(&status) {
            let body = tokio::select! {
                b = read_limited(resp, MAX_ERROR_BODY) => b.unwrap_or_default(),
                _ = tx.closed() => return self.client_gone(lease, started, trace, Some(status)),
            };
            let facts = Facts::from_response(status, &resp_headers, body);
            return self.attempt_failed(ctx, lease, &identity, facts, started, trace);
        }
        if let Some(ts) = resp_headers
            .get("x-codex-turn-state")
            .and_then(|v| v.to_str().ok())
        {
            self.turn_states.insert(ts.to_string(), lease.id.clone());
        }
        if ctx.mode == Mode::Compact {
            return self
                .finish_unary(ctx, lease, resp, &resp_headers, started, trace)
                .await;
        }
        let body = resp
            .bytes_stream()
            .map(|r| r.map_err(|e| crate::upstream::describe(&e)))
            .boxed();
        self.pump(ctx, lease, body, relayed(&resp_headers), tx, trace, started)
            .await
    }

    /// A downstream WebSocket turn over an upstream socket: reused from the pool, or dialled
    /// within the budget. `Err(())` sends the turn over HTTP instead (breaker open, no socket
    /// in time, 426); a rejected handshake or a failed dial is classified and fails over like
    /// an HTTP answer.
    #[allow(clippy::too_many_arguments)]
    async fn ws_attempt(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        identity: &Identity,
        headers: &[(HeaderName, HeaderValue)],
        tx: &mpsc::Sender<Frame>,
        trace: &mut Trace,
        started: Instant,
    ) -> Result<AttemptEnd, ()> {
        use crate::upstream::ws::{DIAL_BUDGET, DialError, TurnSocket, turn};
        if !self.breaker.allow() {
            trace.transport = Some("http_breaker_open");
            return Err(());
        }
        let want = ctx
            .ws_turn
            .as_ref()
            .and_then(|t| t.previous_response_id.as_deref());
        let pooled = match &ctx.session {
            Some(s) => self.ws_pool.checkout(&lease.id, s, want).await,
            None => None,
        };
        let socket = match pooled {
            Some(s) => {
                trace.transport = Some("ws_reused");
                s
            }
            None => {
                let t0 = Instant::now();
                match self.upstream.dial(identity, headers, DIAL_BUDGET).await {
                    Ok(s) => {
                        self.breaker.success();
                        trace.transport = Some("ws_connected");
                        trace.ws_connect_ms = Some(ms_since(t0));
                        s
                    }
                    Err(DialError::Budget) => {
                        self.breaker.degraded();
                        trace.transport = Some("http_ws_budget_exhausted");
                        return Err(());
                    }
                    Err(DialError::Refused) => {
                        self.breaker.degraded();
                        trace.transport = Some("http_ws_failed");
                        return Err(());
                    }
                    Err(DialError::Rejected(facts)) => {
                        trace.transport = Some("ws_connected");
                        return Ok(self.attempt_failed(ctx, lease, identity, facts, started, trace));
                    }
                    Err(DialError::Transport(facts)) => {
                        self.breaker.degraded();
                        trace.transport = Some("http_ws_failed");
                        return Ok(self.attempt_failed(ctx, lease, identity, facts, started, trace));
                    }
                }
            }
        };
        self.metrics.upstream_headers(started.elapsed());
        if let Some(q) = QuotaSnapshot::from_headers(&socket.headers, self.fleet.clock().now_ms()) {
            self.fleet.update_quota(&lease.id, q);
        }
        if let Some(ts) = socket
            .headers
            .get("x-codex-turn-state")
            .and_then(|v| v.to_str().ok())
        {
            self.turn_states.insert(ts.to_string(), lease.id.clone());
        }
        let relay = relayed(&socket.headers);
        // The socket that produced the previous response holds its state: the frame goes as
        // sent. Anywhere else the turn carries its full history.
        let body = match &ctx.ws_turn {
            Some(t)
                if t.previous_response_id
                    .as_deref()
                    .is_some_and(|p| socket.holds(p)) =>
            {
                t.frame.clone()
            }
            Some(t) if t.warmup => {
                with_field(&ctx.body, "generate", serde_json::Value::Bool(false))
            }
            _ => ctx.body.clone(),
        };
        let t = TurnSocket {
            socket,
            pool: self.ws_pool.clone(),
            account: lease.id.clone(),
            session: ctx.session.clone(),
        };
        match turn(t, &body).await {
            Ok(stream) => Ok(self
                .pump(ctx, lease, stream, relay, tx, trace, started)
                .await),
            Err(_) => {
                // A pooled socket that died while idle: this turn goes over HTTP.
                trace.transport = Some("http_ws_failed");
                Err(())
            }
        }
    }

    /// A warm-up that could not reach an upstream socket: over HTTP there is nothing to prime,
    /// so it is answered here (the connection remembers its input for the real turn).
    fn local_warmup(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        trace: &mut Trace,
        started: Instant,
    ) -> AttemptEnd {
        let id = format!(
            "resp_{}",
            crate::keys::random_base62(24)
                .unwrap_or_default()
                .to_lowercase()
        );
        let response = |status: &str| {
            serde_json::json!({"id": id, "object": "response", "created_at": self.fleet.clock().now_secs(),
                "status": status, "model": ctx.model, "output": [],
                "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}})
        };
        let created = serde_json::json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress")});
        let completed = serde_json::json!({"type": "response.completed", "sequence_number": 1, "response": response("completed")});
        self.push_attempt(
            trace,
            lease,
            Class::Success,
            None,
            None,
            started,
            Some("warm-up answered by the gateway".into()),
        );
        trace.account = Some(lease.chatgpt_account_id.clone());
        trace.served_by = Some(lease.id.clone());
        trace.response_id = Some(id.clone());
        let events = format!(
            "event: response.created\ndata: {created}\n\nevent: response.completed\ndata: {completed}\n\n"
        );
        AttemptEnd::Done {
            outcome: "success",
            status: 200,
            tail: vec![
                Frame::Head {
                    status: 200,
                    headers: Vec::new(),
                },
                Frame::Data(bytes::Bytes::from(events)),
            ],
        }
    }

    async fn finish_unary(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        resp: reqwest::Response,
        resp_headers: &HeaderMap,
        started: Instant,
        trace: &mut Trace,
    ) -> AttemptEnd {
        let status = resp.status().as_u16();
        match read_limited(resp, self.config.max_event_bytes).await {
            Ok(body) => {
                self.fleet
                    .report(&lease.id, Class::Success, None, &ctx.model);
                self.push_attempt(
                    trace,
                    lease,
                    Class::Success,
                    Some(status),
                    None,
                    started,
                    None,
                );
                trace.account = Some(lease.chatgpt_account_id.clone());
                let mut headers = relayed(resp_headers);
                headers.push((
                    HeaderName::from_static("content-type"),
                    HeaderValue::from_static("application/json"),
                ));
                AttemptEnd::Done {
                    outcome: "success",
                    status,
                    tail: vec![Frame::Head { status, headers }, Frame::Data(body)],
                }
            }
            Err(facts) => self.report_and_next(ctx, lease, facts, started, trace),
        }
    }

    /// Classifies a failure before commit and decides what happens next.
    pub(crate) fn attempt_failed(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        identity: &Identity,
        facts: Facts,
        started: Instant,
        trace: &mut Trace,
    ) -> AttemptEnd {
        let class = classify(&facts);
        if matches!(class, Class::AuthExpired | Class::Caller) {
            self.push_failed(trace, lease, class, &facts, started);
        }
        match class {
            Class::AuthExpired => AttemptEnd::RetrySame {
                rejected_token: identity.access_token.clone(),
            },
            Class::Caller => {
                trace.account = Some(lease.chatgpt_account_id.clone());
                trace.served_by = Some(lease.id.clone());
                AttemptEnd::Reply(caller_reply(&facts), "caller_error")
            }
            _ => self.report_and_next(ctx, lease, facts, started, trace),
        }
    }

    /// Applies the failure to the account and moves on.
    pub(crate) fn report_and_next(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        facts: Facts,
        started: Instant,
        trace: &mut Trace,
    ) -> AttemptEnd {
        let class = classify(&facts);
        self.fleet
            .report(&lease.id, class, Some(&facts), &ctx.model);
        tracing::info!(
            account = %lease.id,
            class = class.as_str(),
            status = facts.status.unwrap_or(0),
            phase = facts.phase.map_or("", |p| p.as_str()),
            error = %facts.summary(),
            "attempt_result"
        );
        self.push_failed(trace, lease, class, &facts, started);
        AttemptEnd::Next
    }

    pub(crate) fn client_gone(
        &self,
        lease: &Lease,
        started: Instant,
        trace: &mut Trace,
        status: Option<u16>,
    ) -> AttemptEnd {
        tracing::info!(account = %lease.id, "client went away");
        self.push_attempt(
            trace,
            lease,
            Class::ClientCancelled,
            status,
            None,
            started,
            None,
        );
        AttemptEnd::ClientGone
    }

    /// Records a failed attempt from its facts.
    pub(crate) fn push_failed(
        &self,
        trace: &mut Trace,
        lease: &Lease,
        class: Class,
        facts: &Facts,
        started: Instant,
    ) {
        self.push_attempt(
            trace,
            lease,
            class,
            facts.status,
            facts.phase,
            started,
            Some(facts.summary()),
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_attempt(
        &self,
        trace: &mut Trace,
        lease: &Lease,
        class: Class,
        status: Option<u16>,
        phase: Option<crate::upstream::failure::Phase>,
        started: Instant,
        error: Option<String>,
    ) {
        self.metrics.attempt(class.as_str());
        trace.attempts.push(wire::Attempt {
            account: lease.chatgpt_account_id.clone(),
            class: class.as_str().into(),
            status,
            phase: phase.map(|p| p.as_str().to_string()),
            ms: ms_since(started),
            error,
        });
    }
}

/// A JSON object body with one field set.
fn with_field(body: &bytes::Bytes, key: &str, value: serde_json::Value) -> bytes::Bytes {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(mut v) => {
            v[key] = value;
            serde_json::to_vec(&v)
                .map(bytes::Bytes::from)
                .unwrap_or_else(|_| body.clone())
        }
        Err(_) => body.clone(),
    }
}

/// A caller error returned to the client as the backend gave it.
fn caller_reply(f: &Facts) -> ErrorReply {
    let status = f.status.filter(|s| (400..500).contains(s)).unwrap_or(400);
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
        },
        _ => ErrorReply::openai(
            status,
            "invalid_request_error",
            &code,
            message,
            serde_json::Map::new(),
        ),
    }
}
