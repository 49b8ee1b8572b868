//! The Responses WebSocket (protocol §E): `GET /backend-api/codex/responses` upgraded.
//!
//! The handshake is checked like an HTTP request (the same 401s, then `OpenAI-Beta`), takes
//! the handshake faults (`WsRefuse426`, `WsSlowHandshake`) and is answered 101 with the
//! turn-state and rate-limit headers. Each `response.create` text frame is then one turn,
//! decided by `backend::decide` like an HTTP request and played as text frames: a
//! `codex.rate_limits` frame, then the §D events. Errors are one `{"type":"error",…}` frame;
//! those about the account or the backend are followed by a close, request errors
//! (`previous_response_not_found`, unsupported model, context length, a malformed frame) are
//! not. The socket stays open across turns.
//!
//! The other faults, per `response.create`: `FailedEvent` streams `response.failed` (the
//! socket stays open), and `FailedMidStream` does so after some deltas; `ResetMidStream` drops the TCP connection without a close frame after
//! N deltas, `HangMidStream` goes silent, `WsCloseMidTurn` sends close 1011, `SlowFirstToken`
//! pauses before the first delta and `SlowHeaders` before the turn's first frame;
//! `ResetBeforeHeaders` and `Cloudflare403` drop the connection without a frame (the edge does
//! not speak frames). Every turn re-checks the handshake's access token, so a token that
//! expires (or an account deactivated) while the socket is open gets a 401 error frame.
//!
//! Connection-local state, as with `store:false` on the real backend: the last response this
//! socket produced, remembered with its context (its request's input followed by its output),
//! so that a `previous_response_id` continues it with only the new items — and is unknown on
//! any other socket, and once another response followed it on this one.
//!
//! A connection is two halves in one task: the reader (frames in, turns decided at once, pings
//! answered by tungstenite as it reads) and the writer, which plays what the reader queued
//! (frames, pauses, a hang, a close, a drop) in order.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hyper::header::{CONNECTION, HeaderMap, HeaderValue, UPGRADE};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper::{Method, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_util::sync::CancellationToken;

use super::backend::{self, Ctx, Decision, SESSION_HEADERS, TurnRequest};
use super::catalog;
use super::faults::{self, Cut, Endpoint, ErrorAnswer, FaultKind};
use super::responses::{self, Beat};
use super::server::{Outcome, Reply, SimBody, SimRequest, full, recorded_headers, set_header};
use super::state::{Account, AuthFailure};
use super::{RecordedRequest, Sim};

/// The `OpenAI-Beta` value a handshake must carry.
pub(crate) const BETA: &str = "responses_websockets=2026-02-06";
/// The only path that upgrades.
const PATH: &str = "/backend-api/codex/responses";
/// Responses remembered per socket for `previous_response_id`: the backend keeps one, its
/// last (codex-protocol §K8), so a continuation of any earlier one is not found.
const MAX_CONTEXTS: usize = 1;
/// How long a server-initiated close waits for the client's close frame.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// A `GET` of the responses path asking for `Upgrade: websocket`.
pub(crate) fn wants_upgrade(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    method == Method::GET
        && path == PATH
        && headers
            .get(UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(',')
                    .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
            })
}

/// `Sec-WebSocket-Key` of a well-formed (version 13) upgrade request.
fn websocket_key(req: &SimRequest) -> Option<&str> {
    if req.header("sec-websocket-version").map(str::trim) != Some("13") {
        return None;
    }
    req.header("sec-websocket-key")
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

fn has_beta(req: &SimRequest) -> bool {
    req.headers
        .get_all("openai-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|b| b.trim() == BETA)
}

/// The 101, without the backend's headers.
fn switching_protocols(key: &str) -> Response<SimBody> {
    let mut r = full(101, "", "");
    // No content type on a 101.
    r.headers_mut().clear();
    r.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static("websocket"));
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    set_header(
        &mut r,
        "sec-websocket-accept",
        &derive_accept_key(key.as_bytes()),
    );
    // The largest message the backend takes (Codex 0.171 reads it).
    set_header(
        &mut r,
        "x-codex-websocket-max-message-bytes",
        &MAX_MESSAGE_BYTES.to_string(),
    );
    r
}

/// What the upgrade answer says of the largest message.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Answers an upgrade request: a refusal as a plain HTTP response, or a 101 after which the
/// connection is served on its own task (until the client leaves or `shutdown`).
pub(crate) fn handshake(
    sim: &Sim,
    req: &SimRequest,
    on_upgrade: OnUpgrade,
    shutdown: &CancellationToken,
) -> Outcome {
    let now = sim.now_secs();
    let mut st = sim.lock();
    let ray = backend::cf_ray(sim, &mut st);
    let Some(key) = websocket_key(req) else {
        return backend::respond(faults::bad_upgrade(), None, now, &ray).into();
    };
    let idx = match backend::authenticate(&st, req, now) {
        Ok(idx) => idx,
        Err((answer, idx)) => {
            let account = idx.and_then(|i| st.accounts.get(i));
            return backend::respond(answer, account, now, &ray).into();
        }
    };
    let Some(account) = st.accounts.get_mut(idx) else {
        let answer = ErrorAnswer::json(500, json!({"detail": "account vanished"}));
        return backend::respond(answer, None, now, &ray).into();
    };
    account.roll_windows(now);
    if !has_beta(req) {
        return backend::respond(faults::missing_beta(BETA), Some(account), now, &ray).into();
    }
    let mut delay = None;
    match account.take_fault(Endpoint::WsHandshake) {
        Some(FaultKind::WsRefuse426) => {
            return backend::respond(faults::upgrade_required(), Some(account), now, &ray).into();
        }
        Some(FaultKind::WsSlowHandshake { ms }) => delay = Some(Duration::from_millis(ms)),
        Some(FaultKind::WsHandshakeError { status }) => {
            let answer = if status == 429 {
                faults::burst(1)
            } else {
                ErrorAnswer::json(
                    status,
                    json!({"error": {"type": "server_error", "code": "server_error", "message": "the upgrade was refused"}}),
                )
            };
            return backend::respond(answer, Some(account), now, &ray).into();
        }
        _ => {}
    }
    account.ws_connections += 1;
    account.ws_open += 1;
    let session = SESSION_HEADERS.iter().find_map(|h| req.header(h));
    let mut r = switching_protocols(key);
    backend::decorate(&mut r, account, now, &ray);
    let turn_state = backend::turn_state(sim.nonce(), account.id(), session);
    set_header(&mut r, "x-codex-turn-state", &turn_state);
    set_header(&mut r, "x-models-etag", &catalog::models(account).1);
    let headers = recorded_headers(&req.headers);
    let conn = Conn {
        sim: sim.clone(),
        account: account.id().to_string(),
        token: backend::bearer(req).unwrap_or_default().to_string(),
        session: session.map(str::to_string),
        template: RecordedRequest {
            at_ms: 0,
            method: "WS".to_string(),
            path: req.path.clone(),
            query: req.query.clone(),
            account_id: headers.get("chatgpt-account-id").cloned(),
            headers,
            body: Value::Null,
            status: 0,
            peer: req.peer.clone(),
        },
        contexts: VecDeque::new(),
    };
    drop(st);
    sim.ws_changed();
    tokio::spawn(conn.serve(on_upgrade, shutdown.clone()));
    Outcome {
        reply: Reply::Response(r),
        headers_delay: delay,
    }
}

/// What the writer does next.
#[derive(Debug)]
enum Out {
    Text(String),
    Pause(Duration),
    /// Nothing more is ever sent.
    Hang,
    /// A close frame; the connection ends when the client answers it (or after a grace).
    Close(CloseCode, &'static str),
    /// The TCP connection is dropped without a close frame.
    Drop,
}

impl Out {
    /// Nothing is played after it.
    fn ends(&self) -> bool {
        matches!(self, Out::Close(..) | Out::Drop)
    }
}

/// How the writer stopped.
enum WriterEnd {
    Closed,
    Dropped,
}

/// Counts the socket as open until dropped.
struct OpenGuard {
    sim: Sim,
    account: String,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.sim.ws_closed(&self.account);
    }
}

/// One accepted WebSocket.
struct Conn {
    sim: Sim,
    account: String,
    /// The access token of the handshake; every turn re-checks it.
    token: String,
    session: Option<String>,
    /// The handshake as a frame's record starts from.
    template: RecordedRequest,
    /// Responses produced here, newest last: id and the context a continuation builds on.
    contexts: VecDeque<(String, Value)>,
}

impl Conn {
    async fn serve(mut self, on_upgrade: OnUpgrade, shutdown: CancellationToken) {
        let _open = OpenGuard {
            sim: self.sim.clone(),
            account: self.account.clone(),
        };
        let upgraded = tokio::select! {
            r = on_upgrade => match r {
                Ok(u) => u,
                Err(_) => return,
            },
            () = shutdown.cancelled() => return,
        };
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(4096)
            .write_buffer_size(4096);
        let socket =
            Socket::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
        let (sink, mut stream) = socket.split();
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = write(sink, rx);
        tokio::pin!(writer);
        let mut writing = true;
        // Set once nothing more will be played: later frames are ignored.
        let mut ending = false;
        let mut close_by: Option<tokio::time::Instant> = None;
        loop {
            let grace = async {
                match close_by {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = grace => return,
                end = &mut writer, if writing => {
                    writing = false;
                    match end {
                        WriterEnd::Dropped => return,
                        WriterEnd::Closed => {
                            close_by = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                        }
                    }
                }
                msg = stream.next() => {
                    let outs = match msg {
                        None | Some(Err(_)) => return,
                        Some(Ok(Message::Text(text))) if !ending => self.on_frame(text.as_str()),
                        Some(Ok(Message::Binary(_))) if !ending => {
                            vec![Out::Close(CloseCode::Unsupported, "binary frames are not supported")]
                        }
                        // Close: tungstenite answers it, and the stream ends after.
                        // Ping/pong: answered by tungstenite while reading.
                        Some(Ok(_)) => Vec::new(),
                    };
                    for out in outs {
                        ending |= out.ends();
                        // The writer only stops after an `Out` that ends, and then nothing
                        // more is sent.
                        let _ = tx.send(out);
                    }
                }
            }
        }
    }

    /// One client text frame: decides the turn (under the lock, at once), records it, and
    /// returns what to play.
    fn on_frame(&mut self, text: &str) -> Vec<Out> {
        let at_ms = self.sim.now_ms();
        let frame: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let (outs, status) = self.turn(&frame);
        let mut record = self.template.clone();
        record.at_ms = at_ms;
        record.body = frame;
        record.status = status;
        self.sim.record(record);
        outs
    }

    /// The frames of one `response.create`, and the status to record.
    fn turn(&mut self, frame: &Value) -> (Vec<Out>, u16) {
        let sim = self.sim.clone();
        let now = sim.now_secs();
        if frame["type"].as_str() != Some("response.create") {
            let answer = faults::bad_frame("Expected a JSON text frame of type 'response.create'.");
            return self.refusal(&answer, true, now);
        }
        let previous = frame["previous_response_id"].as_str();
        let context = match previous {
            None => None,
            Some(id) => match self.contexts.iter().find(|(k, _)| k == id) {
                Some((_, c)) => Some(c),
                None => {
                    let answer = faults::previous_response_not_found(id);
                    return self.refusal(&answer, true, now);
                }
            },
        };
        let body = effective(frame, context);
        let size = body.to_string().len();
        let mut st = sim.lock();
        let ray = backend::cf_ray(&sim, &mut st);
        let id = st.next_id();
        let Some(account) = st.account_mut(&self.account) else {
            return (vec![Out::Drop], 0);
        };
        account.roll_windows(now);
        if let Err(failure) = account.check_access(&self.token, now) {
            let answer = match failure {
                AuthFailure::Expired => faults::token_expired(),
                AuthFailure::Deactivated => faults::account_deactivated(),
                AuthFailure::Invalidated => {
                    faults::token_invalidated("not a token of this account")
                }
            };
            return (
                error_outs(&answer, Some(account), false, now),
                answer.status,
            );
        }
        let ctx = Ctx {
            nonce: sim.nonce(),
            now,
            id,
            ray: &ray,
        };
        let req = TurnRequest {
            body: &body,
            size,
            session: self.session.as_deref(),
            endpoint: Endpoint::WsTurn,
            unary: false,
            compact: false,
            generate: frame["generate"].as_bool().unwrap_or(true),
            previous_response_id: previous,
        };
        let served = match backend::decide(account, &req, &ctx) {
            // The Cloudflare edge does not speak WebSocket frames: it cuts the socket.
            Decision::Refuse { answer, .. } if !answer.from_backend => {
                return (vec![Out::Drop], 0);
            }
            Decision::Refuse {
                answer,
                keeps_socket,
            } => {
                let outs = error_outs(&answer, Some(account), keeps_socket, now);
                return (outs, answer.status);
            }
            Decision::Reset => return (vec![Out::Drop], 0),
            Decision::Serve(served) => served,
        };
        let mut outs = Vec::with_capacity(served.turn.events.len() + 3);
        if let Some(d) = served.shape.headers_delay {
            outs.push(Out::Pause(d));
        }
        outs.push(Out::Text(catalog::rate_limits_event(account).to_string()));
        let mut completes = served.turn.response["status"] == "completed";
        for beat in responses::beats(&served.turn, &served.shape, served.delta_pause) {
            outs.push(match beat {
                Beat::Event(ev) => Out::Text(ev.data.to_string()),
                Beat::Pause(d) => Out::Pause(d),
                Beat::Cut(cut) => {
                    completes = false;
                    match cut {
                        Cut::Reset { .. } => Out::Drop,
                        Cut::Hang { .. } => Out::Hang,
                        Cut::Close { .. } => Out::Close(CloseCode::Error, "stream interrupted"),
                    }
                }
            });
        }
        drop(st);
        if completes && let Some(id) = served.turn.response["id"].as_str() {
            let mut context = body;
            if let (Some(input), Some(output)) = (
                context["input"].as_array_mut(),
                served.turn.response["output"].as_array(),
            ) {
                input.extend(output.iter().cloned());
            }
            if self.contexts.len() >= MAX_CONTEXTS {
                self.contexts.pop_front();
            }
            self.contexts.push_back((id.to_string(), context));
        }
        (outs, 200)
    }

    /// An error frame about the request itself, with the account's headers.
    fn refusal(&self, answer: &ErrorAnswer, keeps_socket: bool, now: u64) -> (Vec<Out>, u16) {
        let mut st = self.sim.lock();
        let account = st.account_mut(&self.account).map(|a| {
            a.roll_windows(now);
            &*a
        });
        let outs = error_outs(answer, account, keeps_socket, now);
        (outs, answer.status)
    }
}

/// `{"type":"error","status":N,"error":{…},"headers":{…}}`, then a close unless the socket
/// survives the error.
fn error_outs(
    answer: &ErrorAnswer,
    account: Option<&Account>,
    keeps_socket: bool,
    now: u64,
) -> Vec<Out> {
    let mut outs: Vec<Out> = answer.delay.map(Out::Pause).into_iter().collect();
    outs.push(Out::Text(error_frame(answer, account, now).to_string()));
    if !keeps_socket {
        outs.push(Out::Close(CloseCode::Normal, ""));
    }
    outs
}

/// The error frame of an answer: its `error` object (a `{"detail":…}` body becomes one) and
/// the headers the HTTP answer would carry that a client reads (rate limits, `retry-after`).
fn error_frame(answer: &ErrorAnswer, account: Option<&Account>, now: u64) -> Value {
    let body: Value = serde_json::from_str(&answer.body).unwrap_or(Value::Null);
    let error = match body.get("error") {
        Some(e) if e.is_object() => e.clone(),
        _ => json!({
            "type": "invalid_request_error",
            "message": body["detail"].as_str().unwrap_or(&answer.body),
        }),
    };
    let mut headers = Map::new();
    if let Some(account) = account {
        for (name, value) in catalog::rate_limit_headers(account, now) {
            headers.insert(name.to_string(), Value::String(value));
        }
    }
    for (name, value) in &answer.headers {
        headers.insert(name.to_string(), Value::String(value.clone()));
    }
    json!({"type": "error", "status": answer.status, "error": error, "headers": headers})
}

/// The request a frame stands for: its fields over the context of its
/// `previous_response_id` (the request that produced it, with its output appended to its
/// input), and its `input` appended; without the frame-only fields.
fn effective(frame: &Value, context: Option<&Value>) -> Value {
    let mut body = context.cloned().unwrap_or_else(|| json!({}));
    let mut input: Vec<Value> = body["input"].as_array().cloned().unwrap_or_default();
    if let (Value::Object(b), Some(f)) = (&mut body, frame.as_object()) {
        for (k, v) in f {
            if !matches!(
                k.as_str(),
                "type" | "input" | "previous_response_id" | "generate"
            ) {
                b.insert(k.clone(), v.clone());
            }
        }
    }
    match &frame["input"] {
        Value::Array(items) => input.extend(items.iter().cloned()),
        Value::String(text) => input.push(json!({"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": text}]})),
        _ => {}
    }
    body["input"] = Value::Array(input);
    body
}

/// Plays what the reader queues, in order, until an `Out` that ends the connection.
async fn write(
    mut sink: futures_util::stream::SplitSink<Socket, Message>,
    mut rx: mpsc::UnboundedReceiver<Out>,
) -> WriterEnd {
    while let Some(out) = rx.recv().await {
        match out {
            Out::Text(text) => {
                if sink.send(Message::text(text)).await.is_err() {
                    return WriterEnd::Dropped;
                }
            }
            Out::Pause(d) => tokio::time::sleep(d).await,
            Out::Hang => std::future::pending::<()>().await,
            Out::Close(code, reason) => {
                let frame = CloseFrame {
                    code,
                    reason: reason.into(),
                };
                return match sink.send(Message::Close(Some(frame))).await {
                    Ok(()) => WriterEnd::Closed,
                    Err(_) => WriterEnd::Dropped,
                };
            }
            Out::Drop => return WriterEnd::Dropped,
        }
    }
    // The reader holds the sender for as long as this runs.
    WriterEnd::Dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_get_of_the_responses_path_upgrades() {
        let mut h = HeaderMap::new();
        h.insert(UPGRADE, HeaderValue::from_static("WebSocket"));
        assert!(wants_upgrade(&Method::GET, PATH, &h));
        assert!(!wants_upgrade(&Method::POST, PATH, &h));
        assert!(!wants_upgrade(
            &Method::GET,
            "/backend-api/codex/models",
            &h
        ));
        assert!(!wants_upgrade(&Method::GET, PATH, &HeaderMap::new()));
    }

    #[test]
    fn a_continuation_extends_its_context_and_drops_frame_only_fields() {
        let context = json!({"model": "gpt-5.5", "tools": [{"name": "exec_command"}],
            "input": [{"type": "message", "role": "user"}, {"type": "function_call"}]});
        let frame = json!({"type": "response.create", "model": "gpt-5.4",
            "previous_response_id": "resp_1", "generate": true,
            "input": [{"type": "function_call_output"}]});
        let body = effective(&frame, Some(&context));
        assert_eq!(body["model"], "gpt-5.4");
        assert_eq!(body["tools"], context["tools"]);
        let kinds: Vec<&str> = body["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["message", "function_call", "function_call_output"]);
        for k in ["type", "previous_response_id", "generate"] {
            assert!(body.get(k).is_none(), "{k}");
        }
        let body = effective(&json!({"input": "hi"}), None);
        assert_eq!(body["input"][0]["content"][0]["text"], "hi");
    }
}
