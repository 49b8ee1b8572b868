//! The commit boundary. Before the first event a client would render or act on, events are
//! held and any failure (a transport error, or a `response.failed`/`error` event inside the
//! 200) fails over invisibly. After it, events are forwarded as they arrive and nothing is
//! replayed; the terminal outcome is still classified, and a stream that dies without one gets
//! a synthetic `response.failed` (`upstream_stream_error`).
//!
//! Non-streaming clients never see a partial answer, so for them the commit is the terminal
//! event itself: a failure anywhere before it fails over.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;
use switchyard_tui::wire;
use tokio::sync::mpsc;

use super::request::{AttemptEnd, Trace, ms_since};
use super::{Dispatcher, ErrorReply, Frame, Mode, RequestCtx, failed_event};
use crate::fleet::Lease;
use crate::fleet::health::{Class, classify};
use crate::upstream::failure::{Facts, Phase};
use crate::upstream::sse::SseSplitter;

/// Events that carry nothing a client renders or acts on: held before the commit.
pub fn is_precommit(kind: &str) -> bool {
    matches!(
        kind,
        "" | "response.created"
            | "response.in_progress"
            | "response.queued"
            | "codex.rate_limits"
            | "response.output_item.added"
            | "response.content_part.added"
            | "response.reasoning_summary_part.added"
    )
}

pub fn is_terminal(kind: &str) -> bool {
    matches!(
        kind,
        "response.completed" | "response.failed" | "response.incomplete" | "error"
    )
}

enum Next {
    Chunk(Bytes),
    End,
    Failed(String),
    ClientGone,
}

fn usage_of(response: &Value) -> Option<wire::Usage> {
    let u = response.get("usage")?;
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    Some(wire::Usage {
        input_tokens: n(&u["input_tokens"]),
        cached_tokens: n(&u["input_tokens_details"]["cached_tokens"]),
        output_tokens: n(&u["output_tokens"]),
        reasoning_tokens: n(&u["output_tokens_details"]["reasoning_tokens"]),
    })
}

impl Dispatcher {
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn pump(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        mut body: futures_util::stream::BoxStream<'static, Result<Bytes, String>>,
        relay: Vec<(HeaderName, HeaderValue)>,
        tx: &mpsc::Sender<Frame>,
        trace: &mut Trace,
        started: Instant,
    ) -> AttemptEnd {
        let streaming = ctx.mode == Mode::Stream;
        let mut splitter = SseSplitter::new(self.config.max_event_bytes);
        let mut held: Vec<Bytes> = Vec::new();
        let mut held_bytes = 0usize;
        let mut committed = false;
        let mut response_id: Option<String> = None;
        let first_output_deadline = self.config.first_output_timeout.map(|t| started + t);
        let idle = self.config.stream_idle_timeout;

        loop {
            // Wait for the next chunk, the idle timeout, the first-output deadline, or the
            // client leaving.
            let wait = match (committed, first_output_deadline) {
                (false, Some(deadline)) => {
                    deadline.saturating_duration_since(Instant::now()).min(idle)
                }
                _ => idle,
            };
            let next = tokio::select! {
                r = tokio::time::timeout(wait, body.next()) => match r {
                    Err(_) if !committed && first_output_deadline.is_some_and(|d| Instant::now() >= d) => {
                        Next::Failed(format!("no output within {:?}", self.config.first_output_timeout.unwrap_or_default()))
                    }
                    Err(_) => Next::Failed(format!("no upstream data for {}s", wait.as_secs())),
                    Ok(None) => Next::End,
                    Ok(Some(Err(e))) => Next::Failed(e),
                    Ok(Some(Ok(b))) => Next::Chunk(b),
                },
                _ = tx.closed() => Next::ClientGone,
            };
            let chunk = match next {
                Next::Chunk(b) => b,
                Next::ClientGone => return self.client_gone(lease, started, trace, Some(200)),
                Next::End => {
                    return self.stream_broke(
                        ctx,
                        lease,
                        committed,
                        response_id.as_deref(),
                        "stream closed before response.completed".into(),
                        started,
                        trace,
                    );
                }
                Next::Failed(why) => {
                    return self.stream_broke(
                        ctx,
                        lease,
                        committed,
                        response_id.as_deref(),
                        why,
                        started,
                        trace,
                    );
                }
            };
            splitter.push(&chunk);
            // Whole events of this chunk are forwarded together: one write, not one per event.
            let mut pending = BytesMut::new();
            loop {
                let ev = match splitter.next_event() {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(e) => {
                        let end = self.stream_broke(
                            ctx,
                            lease,
                            committed,
                            response_id.as_deref(),
                            e.to_string(),
                            started,
                            trace,
                        );
                        return with_pending(pending, end);
                    }
                };
                let kind = ev.kind.as_str();
                if response_id.is_none() && kind == "response.created" {
                    response_id = ev
                        .json()
                        .and_then(|v| v["response"]["id"].as_str().map(str::to_string));
                }
                if is_terminal(kind) {
                    let json = ev.json().unwrap_or(Value::Null);
                    let end = self
                        .terminal(
                            ctx, lease, kind, ev.raw, json, &mut held, committed, &relay, trace,
                            started,
                        )
                        .await;
                    return with_pending(pending, end);
                }
                if !streaming {
                    continue; // a JSON client gets only the final response
                }
                if !committed
                    && is_precommit(kind)
                    && held_bytes + ev.raw.len() <= self.config.max_precommit_bytes
                {
                    if !kind.is_empty() {
                        held_bytes += ev.raw.len();
                        held.push(ev.raw);
                    }
                    continue;
                }
                if !committed {
                    committed = true;
                    trace.ttft_ms = Some(ms_since(ctx.received));
                    self.metrics.upstream_first_output(started.elapsed());
                    trace.account = Some(lease.chatgpt_account_id.clone());
                    trace.served_by = Some(lease.id.clone());
                    trace.response_id.clone_from(&response_id);
                    if !self
                        .commit(ctx, &relay, std::mem::take(&mut held), tx)
                        .await
                    {
                        return self.client_gone(lease, started, trace, Some(200));
                    }
                }
                pending.extend_from_slice(&ev.raw);
            }
            if !pending.is_empty() && tx.send(Frame::Data(pending.freeze())).await.is_err() {
                return self.client_gone(lease, started, trace, Some(200));
            }
        }
    }

    /// Sends the head and the held events. False when the client is gone.
    async fn commit(
        &self,
        ctx: &RequestCtx,
        relay: &[(HeaderName, HeaderValue)],
        held: Vec<Bytes>,
        tx: &mpsc::Sender<Frame>,
    ) -> bool {
        tracing::debug!(mode = ?ctx.mode, "commit");
        let headers = sse_head(relay);
        if tx
            .send(Frame::Head {
                status: 200,
                headers,
            })
            .await
            .is_err()
        {
            return false;
        }
        for b in held {
            if tx.send(Frame::Data(b)).await.is_err() {
                return false;
            }
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    async fn terminal(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        kind: &str,
        raw: Bytes,
        json: Value,
        held: &mut Vec<Bytes>,
        committed: bool,
        relay: &[(HeaderName, HeaderValue)],
        trace: &mut Trace,
        started: Instant,
    ) -> AttemptEnd {
        let streaming = ctx.mode == Mode::Stream;
        let ok = matches!(kind, "response.completed" | "response.incomplete");
        let facts = (!ok).then(|| {
            Facts::from_event(
                if committed {
                    Phase::MidStream
                } else {
                    Phase::PreCommit
                },
                &json,
            )
        });
        let class = facts.as_ref().map_or(Class::Success, classify);

        // A failure before anything was shown fails over, unless it is the caller's own.
        if let Some(f) = &facts
            && class != Class::Caller
            && (!committed || !streaming)
        {
            return self.report_and_next(ctx, lease, f.clone(), started, trace);
        }

        trace.account = Some(lease.chatgpt_account_id.clone());
        trace.served_by = Some(lease.id.clone());
        if trace.response_id.is_none() {
            trace.response_id = json["response"]["id"].as_str().map(str::to_string);
        }
        let status = 200;
        let outcome = match (kind, class) {
            ("response.completed", _) => "success",
            ("response.incomplete", _) => "incomplete",
            (_, Class::Caller) => "caller_error",
            _ => "failed",
        };
        match kind {
            "response.completed" => {
                self.fleet
                    .report(&lease.id, Class::Success, None, &ctx.model);
                trace.usage = usage_of(&json["response"]);
            }
            "response.incomplete" => trace.usage = usage_of(&json["response"]),
            _ => {
                if let Some(f) = &facts {
                    self.fleet.report(&lease.id, class, Some(f), &ctx.model);
                }
            }
        }
        tracing::info!(account = %lease.id, class = class.as_str(), outcome, "attempt_result");
        let attempt_class = if ok { Class::Success } else { class };
        self.push_attempt(
            trace,
            lease,
            attempt_class,
            Some(200),
            facts.as_ref().and_then(|f| f.phase),
            started,
            facts.as_ref().map(Facts::summary),
        );

        if !streaming {
            if class == Class::Caller
                && let Some(f) = &facts
            {
                let reply = ErrorReply::openai(
                    400,
                    "invalid_request_error",
                    f.error_code.as_deref().unwrap_or("invalid_request_error"),
                    f.message.clone().unwrap_or_default(),
                    serde_json::Map::new(),
                );
                return AttemptEnd::Reply(reply, "caller_error");
            }
            let mut headers = relay.to_vec();
            headers.push((
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            ));
            let body = Bytes::from(json["response"].to_string());
            return AttemptEnd::Done {
                outcome,
                status,
                tail: vec![Frame::Head { status, headers }, Frame::Data(body)],
            };
        }
        let mut tail = Vec::new();
        if !committed {
            // A terminal event arrived before anything else worth showing: commit with it.
            trace.ttft_ms = Some(ms_since(ctx.received));
            let headers = sse_head(relay);
            tail.push(Frame::Head { status, headers });
            tail.extend(held.drain(..).map(Frame::Data));
        }
        tail.push(Frame::Data(raw));
        AttemptEnd::Done {
            outcome,
            status,
            tail,
        }
    }

    /// The upstream stream broke (EOF, reset, timeout, oversized event).
    #[allow(clippy::too_many_arguments)]
    fn stream_broke(
        &self,
        ctx: &RequestCtx,
        lease: &Lease,
        committed: bool,
        response_id: Option<&str>,
        why: String,
        started: Instant,
        trace: &mut Trace,
    ) -> AttemptEnd {
        let phase = if committed {
            Phase::MidStream
        } else {
            Phase::PreCommit
        };
        let facts = Facts {
            status: None,
            ..Facts::transport(phase, why.clone())
        };
        if !committed || ctx.mode != Mode::Stream {
            return self.report_and_next(ctx, lease, facts, started, trace);
        }
        // After the commit nothing is replayed: the account is marked, the client is told.
        self.fleet
            .report(&lease.id, Class::Transient, Some(&facts), &ctx.model);
        tracing::warn!(account = %lease.id, error = %why, "upstream stream broke after commit");
        self.push_attempt(
            trace,
            lease,
            Class::Transient,
            Some(200),
            Some(phase),
            started,
            Some(facts.summary()),
        );
        let message = format!("the upstream stream broke before response.completed: {why}");
        AttemptEnd::Done {
            outcome: "stream_error",
            status: 200,
            tail: vec![Frame::Data(failed_event(
                response_id,
                "upstream_stream_error",
                &message,
            ))],
        }
    }
}

/// Puts events already read (and not yet sent) in front of the final frames.
fn with_pending(pending: BytesMut, end: AttemptEnd) -> AttemptEnd {
    match end {
        AttemptEnd::Done {
            outcome,
            status,
            mut tail,
        } if !pending.is_empty() => {
            tail.insert(0, Frame::Data(pending.freeze()));
            AttemptEnd::Done {
                outcome,
                status,
                tail,
            }
        }
        other => other,
    }
}

/// The head of an SSE answer: the relayed upstream headers and the stream's own.
fn sse_head(relay: &[(HeaderName, HeaderValue)]) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = relay.to_vec();
    headers.push((
        HeaderName::from_static("content-type"),
        HeaderValue::from_static("text/event-stream"),
    ));
    headers.push((
        HeaderName::from_static("cache-control"),
        HeaderValue::from_static("no-cache"),
    ));
    headers
}
