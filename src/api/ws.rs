//! `GET /v1/responses` upgraded to the Responses WebSocket. The client key is checked at the
//! handshake; each `response.create` frame is one turn, dispatched like an HTTP request (the
//! same candidates, failover, queues, health and records) and its events relayed as text
//! frames. The connection stays open across turns.
//!
//! Connection-local state is kept here: the full input of every response this connection
//! produced (its request's input plus its output). A continuation (`previous_response_id`) is
//! dispatched with both the frame as sent — used as is on the upstream socket that holds the
//! previous response — and the same turn expanded into the full history, used anywhere else
//! (another socket, another account, HTTP). An id this connection did not produce gets
//! `previous_response_not_found`, after which Codex resends the full request: never a replay
//! without the history. Warm-ups (`generate: false`) go to an upstream socket; over HTTP,
//! where there is nothing to prime, the dispatcher answers them itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade, close_code};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::responses::{Turn, authenticate, body_ids, normalise_ids, request_ctx};
use crate::base::raw_json::{RawObject, array_inner};
use crate::dispatch::{Frame, WsTurn};
use crate::keys::KeyIdentity;
use crate::keys::memory::{Charge, OverBudget};
use crate::upstream::event::Event;
use crate::upstream::identity;
use crate::upstream::ws::{MAX_FRAME, SOCKET_BUFFER};

/// Bytes of history remembered per connection for continuations (the newest response is
/// always kept).
const MAX_HISTORY_BYTES: usize = 16 * 1024 * 1024;
/// Requests a client may send while one of its turns runs; they run in order after it.
const MAX_QUEUED_TURNS: usize = 8;

pub async fn upgrade(
    State(state): State<Arc<AppState>>,
    conn: super::responses::Conn,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let stalled = conn.map(|c| c.stall_flag());
    let key = match authenticate(&state, &headers) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    if let Some(at) = state.keys.expired(&key.id) {
        let r = crate::keys::policy::Refusal::Expired { at };
        return ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            r.kind(),
            Some(r.code()),
            r.message(),
        )
        .into_response();
    }
    if state.is_draining() {
        let mut resp = ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("server_shutting_down"),
            "the gateway is shutting down; retry in a moment",
        )
        .into_response();
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("5"),
        );
        return resp;
    }
    let Some(slot) = state.try_open_ws(&key.id) else {
        return ApiError::new(
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Some("websocket_connection_limit_reached"),
            format!(
                "this key already has {} open WebSocket connections",
                state.ws.max_connections_per_key
            ),
        )
        .into_response();
    };
    let mut resp = ws
        .max_message_size(MAX_FRAME)
        .max_frame_size(MAX_FRAME)
        // Small buffers keep idle connections cheap; they grow only for large messages.
        .read_buffer_size(SOCKET_BUFFER)
        .write_buffer_size(SOCKET_BUFFER)
        .on_upgrade(move |socket| async move {
            let _slot = slot;
            let _open = state.ws_open.token();
            Connection::new(state, key, headers, stalled)
                .run(socket)
                .await;
        });
    // What the backend says on its own upgrade, said of this hop: the largest message the
    // gateway takes.
    resp.headers_mut().insert(
        "x-codex-websocket-max-message-bytes",
        axum::http::HeaderValue::from(MAX_FRAME),
    );
    resp
}

/// A piece of a response's history: the text between the brackets of an array of items (a
/// request's input, or a response's output), and how many bytes it keeps in memory. A piece
/// is a slice of the frame or event it came in (no copy) when it is most of it, else a copy.
#[derive(Debug, Clone)]
struct Piece {
    text: Bytes,
    held: usize,
}

impl Piece {
    /// `inner` (a slice of `whole`) as a piece.
    fn of(whole: &Bytes, inner: &str) -> Piece {
        if inner.len() * 2 >= whole.len() {
            Piece {
                text: whole.slice_ref(inner.as_bytes()),
                held: whole.len(),
            }
        } else {
            Piece {
                text: Bytes::copy_from_slice(inner.as_bytes()),
                held: inner.len(),
            }
        }
    }

    fn copied(text: String) -> Piece {
        let held = text.len();
        Piece {
            text: Bytes::from(text),
            held,
        }
    }
}

/// The responses a connection produced: each one's full input (its request's input plus its
/// output) as pieces of the frames and events they came in, within a budget of what they
/// really hold (a piece shared by several responses counts once). Past the budget the oldest
/// go first; the newest always stays, whatever its size.
struct History {
    /// Response id -> the pieces of the full input that led to it, plus its output.
    entries: HashMap<String, Vec<Piece>>,
    /// Oldest first.
    order: std::collections::VecDeque<String>,
    /// What the entries hold, each buffer counted once.
    bytes: usize,
    max_bytes: usize,
    /// The key's memory the entries take: past the key's budget the oldest are forgotten,
    /// the newest as well when it alone does not fit.
    charge: Charge,
    /// The last responses forgotten for the key's budget, for the error a continuation of
    /// one of them gets.
    forgotten: std::collections::VecDeque<String>,
}

/// A frame's place in its key's memory budget, or why it has none.
type Paid = Result<Charge, OverBudget>;

/// Responses a connection remembers having forgotten for its key's budget.
const FORGOTTEN_KEPT: usize = 16;

impl History {
    fn new(max_bytes: usize, charge: Charge) -> History {
        History {
            entries: HashMap::new(),
            order: std::collections::VecDeque::new(),
            bytes: 0,
            max_bytes,
            charge,
            forgotten: std::collections::VecDeque::new(),
        }
    }

    fn get(&self, id: &str) -> Option<&Vec<Piece>> {
        self.entries.get(id)
    }

    /// Whether `id` was forgotten for the key's memory budget.
    fn forgot_for_budget(&self, id: &str) -> bool {
        self.forgotten.iter().any(|f| f == id)
    }

    /// The bytes the entries keep in memory, each piece counted once however many entries
    /// share it.
    fn held(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .values()
            .flatten()
            .filter(|p| seen.insert((p.text.as_ptr() as usize, p.text.len())))
            .map(|p| p.held)
            .sum()
    }

    /// Keeps a response's history, dropping the oldest entries beyond the connection's cap
    /// (the newest always stays within it) and beyond the key's budget (the newest too).
    fn remember(&mut self, id: String, pieces: Vec<Piece>) {
        if self.entries.insert(id.clone(), pieces).is_some() {
            self.order.retain(|o| *o != id);
        }
        self.order.push_back(id);
        loop {
            let held = self.held();
            if held <= self.max_bytes || self.order.len() <= 1 {
                if self.charge.set(held).is_ok() {
                    self.bytes = held;
                    return;
                }
                if let Some(old) = self.order.front() {
                    if self.forgotten.len() >= FORGOTTEN_KEPT {
                        self.forgotten.pop_front();
                    }
                    self.forgotten.push_back(old.clone());
                }
            }
            match self.order.pop_front() {
                Some(old) => {
                    self.entries.remove(&old);
                }
                None => {
                    self.bytes = 0;
                    return;
                }
            }
        }
    }
}

/// The parts of `response.completed` a history keeps, borrowed from the event.
#[derive(serde::Deserialize)]
struct CompletedView<'a> {
    #[serde(borrow)]
    response: CompletedResponse<'a>,
}

#[derive(serde::Deserialize)]
struct CompletedResponse<'a> {
    #[serde(borrow, default)]
    id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    output: Option<&'a serde_json::value::RawValue>,
}

/// What one downstream connection remembers between turns.
struct Connection {
    state: Arc<AppState>,
    key: KeyIdentity,
    headers: HeaderMap,
    /// The connection is a session: its turns without a session key of their own keep one
    /// account and one upstream socket while it is healthy.
    session: String,
    /// Set when a write to the client made no progress for the write timeout.
    stalled: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The responses it produced, for continuations.
    history: History,
    /// Requests that arrived while a turn ran (a client may send its next request the moment
    /// it has read `response.completed`, before the turn has ended here).
    /// Each paid for in the key's memory budget when it arrived, or refused then.
    queued: std::collections::VecDeque<(Utf8Bytes, Paid)>,
    /// This connection's number: the upstream sockets it uses are its own while it lasts.
    id: u64,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Its idle upstream sockets may serve another connection of the session now.
        self.state.dispatcher.ws_pool.disown(self.id);
    }
}

/// Why a connection ends.
enum End {
    Closed,
    Close(u16, &'static str),
}

/// An event as a text frame: its data, as received.
fn text_frame(ev: &Event) -> Message {
    match axum::extract::ws::Utf8Bytes::try_from(ev.data_bytes()) {
        Ok(text) => Message::Text(text),
        Err(_) => Message::Text(String::from_utf8_lossy(ev.data()).into_owned().into()),
    }
}

/// An error's `error` object, for an error frame.
fn api_error(e: &ApiError) -> Value {
    serde_json::to_value(e.body().error).unwrap_or(Value::Null)
}

fn error_frame(status: u16, error: Value) -> Message {
    Message::Text(
        json!({"type": "error", "status": status, "error": error})
            .to_string()
            .into(),
    )
}

impl Connection {
    fn new(
        state: Arc<AppState>,
        key: KeyIdentity,
        headers: HeaderMap,
        stalled: Option<Arc<std::sync::atomic::AtomicBool>>,
    ) -> Self {
        static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let session = format!(
            "ws-{}",
            crate::keys::random_base62(16).unwrap_or_else(|_| n.to_string())
        );
        let history = History::new(MAX_HISTORY_BYTES, state.key_memory.charge(&key.id));
        Connection {
            state,
            key,
            headers,
            session,
            stalled,
            history,
            queued: std::collections::VecDeque::new(),
            id: n,
        }
    }

    async fn run(mut self, mut socket: WebSocket) {
        let first_timeout = self.state.ws.first_message_timeout;
        let idle_timeout = self.state.ws.idle_timeout;
        let mut first = true;
        // Set when a request has been answered (or at the start), never by a ping or a pong:
        // a socket that only pings holds its place no longer than one that says nothing.
        let mut deadline = tokio::time::Instant::now() + first_timeout;
        let end = loop {
            if let Some((text, paid)) = self.queued.pop_front() {
                if self.state.is_draining() {
                    break End::Close(close_code::AWAY, "server shutting down");
                }
                if let Err(end) = self.turn(&mut socket, text, paid).await {
                    break end;
                }
                deadline = tokio::time::Instant::now() + idle_timeout;
                continue;
            }
            let received = tokio::select! {
                r = tokio::time::timeout_at(deadline, socket.recv()) => r,
                _ = self.state.drained() => break End::Close(close_code::AWAY, "server shutting down"),
            };
            let msg = match received {
                Err(_) => {
                    break End::Close(
                        close_code::NORMAL,
                        if first { "no request received" } else { "idle" },
                    );
                }
                Ok(None) => break End::Closed,
                Ok(Some(Err(e))) => {
                    let too_big = e.to_string().contains("too long")
                        || e.to_string().to_lowercase().contains("capacity");
                    break if too_big {
                        End::Close(close_code::SIZE, "message too big")
                    } else {
                        End::Closed
                    };
                }
                Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
                Ok(Some(Ok(m))) => m,
            };
            first = false;
            match msg {
                Message::Text(text) => {
                    let paid = self.pay(&text);
                    if let Err(end) = self.turn(&mut socket, text, paid).await {
                        break end;
                    }
                    deadline = tokio::time::Instant::now() + idle_timeout;
                }
                Message::Binary(_) => {
                    break End::Close(close_code::UNSUPPORTED, "binary frames are not supported");
                }
                Message::Close(_) => break End::Closed,
                // Taken above: they are no activity.
                Message::Ping(_) | Message::Pong(_) => {}
            }
        };
        if let End::Close(code, reason) = end {
            let _ = socket
                .send(Message::Close(Some(CloseFrame {
                    code,
                    reason: reason.into(),
                })))
                .await;
        }
    }

    /// A frame paid for in the key's memory budget: it and the body made of it.
    fn pay(&self, text: &Utf8Bytes) -> Paid {
        let mut charge = self.state.key_memory.charge(&self.key.id);
        charge.grow(2 * text.len()).map(|()| charge)
    }

    /// One `response.create`. `Err` ends the connection.
    async fn turn(
        &mut self,
        socket: &mut WebSocket,
        text: Utf8Bytes,
        paid: Paid,
    ) -> Result<(), End> {
        let received = Instant::now();
        let flight = match paid {
            Ok(charge) => charge,
            Err(e) => {
                let e = super::responses::over_budget(e, "this request");
                return self
                    .send(socket, error_frame(e.status.as_u16(), api_error(&e)))
                    .await;
            }
        };
        let text = Bytes::from(text);
        // Read once, its members kept as sent: the input is never built into a tree.
        let Ok(mut obj) = RawObject::parse(&text) else {
            let e = json!({"type": "invalid_request_error", "code": "invalid_json", "message": "a frame must be a JSON object", "param": null});
            return self.send(socket, error_frame(400, e)).await;
        };
        let kind = obj.str("type").map(std::borrow::Cow::into_owned);
        if kind.as_deref() != Some("response.create") {
            let message = match kind {
                Some(kind) => format!(
                    "the message type `{kind}` is not supported here; send `response.create`"
                ),
                None => "a message needs a `type`; send `response.create`".to_string(),
            };
            let e = json!({"type": "invalid_request_error", "code": "unsupported_message", "message": message, "param": "type"});
            return self.send(socket, error_frame(400, e)).await;
        }
        obj.remove("type");
        // A device id that cannot be replaced in bytes is replaced in the body first, in the
        // frame as sent and in the expanded body alike.
        if !identity::ClientIds::of(body_ids(&obj).iter().map(String::as_str)).all_searchable() {
            normalise_ids(&mut obj);
        }
        let input = match obj.raw("input") {
            Some(raw) => match array_inner(raw) {
                Some(inner) => Piece::of(&text, inner),
                None => match obj.str("input") {
                    Some(s) => Piece::copied(
                        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": s}]})
                            .to_string(),
                    ),
                    None => Piece::copied(String::new()),
                },
            },
            None => Piece::copied(String::new()),
        };
        // Expand a continuation produced on this connection into the full input.
        let previous = obj
            .str("previous_response_id")
            .map(std::borrow::Cow::into_owned);
        // The frame as sent, for an upstream socket that holds its previous response.
        let mut frame = previous.is_some().then(|| obj.clone());
        let mut full: Vec<Piece> = Vec::new();
        if let Some(prev) = &previous {
            match self.history.get(prev) {
                Some(history) => full.extend(history.iter().cloned()),
                None => {
                    let why = if self.history.forgot_for_budget(prev) {
                        " It was forgotten: this key's memory budget ([server] key_memory_mib) was full; send the whole input."
                    } else {
                        ""
                    };
                    let e = json!({
                        "type": "invalid_request_error",
                        "code": "previous_response_not_found",
                        "message": format!("Previous response with id '{prev}' not found.{why}"),
                        "param": "previous_response_id",
                    });
                    return self.send(socket, error_frame(400, e)).await;
                }
            }
        }
        obj.remove("previous_response_id");
        full.push(input);
        obj.set_joined("input", full.iter().map(|p| p.text.clone()).collect());
        let warmup = obj.bool("generate") == Some(false);
        obj.remove("generate");
        let ctx = match request_ctx(
            &self.state,
            &self.key,
            &self.headers,
            obj,
            Turn::WebSocket,
            received,
        ) {
            Ok(c) => c,
            Err(e) => {
                return self
                    .send(socket, error_frame(e.status.as_u16(), api_error(&e)))
                    .await;
            }
        };
        let mut ctx = ctx;
        ctx.session.get_or_insert_with(|| self.session.clone());
        ctx.stalled.clone_from(&self.stalled);
        let frame = frame.as_mut().map(|f| {
            f.set("model", &ctx.model);
            f.set("stream", &true);
            Bytes::from(f.encode())
        });
        drop(text);
        ctx.ws_turn = Some(WsTurn {
            frame: frame.unwrap_or_default(),
            previous_response_id: previous,
            warmup,
            connection: self.id,
        });
        let mut rx = self.state.dispatcher.start(ctx);
        let mut output: Option<Piece> = None;
        let mut completed_id: Option<String> = None;
        loop {
            tokio::select! {
                frame = rx.recv() => match frame {
                    None => break,
                    // Keep-alives and heads have no WebSocket form; a turn is always streamed
                    // (and as events: this edge does not ask for SSE frames).
                    Some(Frame::Head { .. } | Frame::KeepAlive | Frame::Body(_) | Frame::Sse(_)) => {}
                    Some(Frame::Error(reply)) => {
                        let error = serde_json::from_slice::<Value>(&reply.body)
                            .ok()
                            .and_then(|v| v.get("error").cloned())
                            .unwrap_or_else(|| json!({"code": reply.code, "message": reply.message}));
                        self.send(socket, error_frame(reply.status, error)).await?;
                    }
                    Some(Frame::Events(events)) => {
                        for ev in events {
                            if ev.kind() == "response.completed"
                                && let Ok(v) = crate::base::raw_json::from_bytes::<CompletedView<'_>>(ev.data())
                            {
                                completed_id = v.response.id.map(std::borrow::Cow::into_owned);
                                output = v
                                    .response
                                    .output
                                    .and_then(|raw| array_inner(raw.get()))
                                    .map(|inner| Piece::of(&ev.data_bytes(), inner));
                            }
                            self.send(socket, text_frame(&ev)).await?;
                        }
                    }
                },
                msg = socket.recv() => match msg {
                    // The client left mid-turn: dropping `rx` cancels the turn.
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Err(End::Closed),
                    Some(Ok(Message::Binary(_))) => return Err(End::Close(close_code::UNSUPPORTED, "binary frames are not supported")),
                    // The next request, sent before this turn ended here: it runs after it.
                    Some(Ok(Message::Text(next))) => {
                        if self.queued.len() >= MAX_QUEUED_TURNS {
                            return Err(End::Close(close_code::POLICY, "too many requests sent while one runs"));
                        }
                        // A frame the key cannot pay for is not kept: its turn is its refusal.
                        let paid = self.pay(&next);
                        let next = if paid.is_ok() { next } else { Utf8Bytes::from_static("") };
                        self.queued.push_back((next, paid));
                    }
                    Some(Ok(_)) => {}
                },
            }
        }
        // The frame is paid for until its turn ends; what it leaves is the history's to pay.
        drop(flight);
        if let Some(id) = completed_id {
            full.extend(output);
            self.history.remember(id, full);
        }
        Ok(())
    }

    async fn send(&self, socket: &mut WebSocket, msg: Message) -> Result<(), End> {
        socket.send(msg).await.map_err(|_| End::Closed)
    }
}

/// Open downstream WebSocket connections per client key.
#[derive(Default)]
pub struct ConnectionCounts(std::sync::Mutex<HashMap<String, usize>>);

/// One open connection; dropping it frees the place.
pub struct ConnectionSlot {
    counts: Arc<AppState>,
    key: String,
}

impl ConnectionCounts {
    pub fn open(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }
}

impl ConnectionCounts {
    fn acquire(&self, key: &str, max: usize) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(key.to_string()).or_insert(0);
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    fn release(&self, key: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(key);
            }
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.counts.ws_connections.release(&self.key);
    }
}

/// WebSocket ingress limits.
#[derive(Debug, Clone)]
pub struct WsLimits {
    pub first_message_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections_per_key: usize,
}

impl Default for WsLimits {
    fn default() -> Self {
        Self {
            first_message_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
            max_connections_per_key: 32,
        }
    }
}

impl AppState {
    fn try_open_ws(self: &Arc<Self>, key: &str) -> Option<ConnectionSlot> {
        self.ws_connections
            .acquire(key, self.ws.max_connections_per_key)
            .then(|| ConnectionSlot {
                counts: Arc::clone(self),
                key: key.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unlimited() -> Charge {
        crate::keys::memory::MemoryLedger::new(usize::MAX).charge("k")
    }

    #[test]
    fn connections_of_one_key_share_its_budget_and_forget_first_what_does_not_fit() {
        let ledger = crate::keys::memory::MemoryLedger::new(100);
        let mut a = History::new(1000, ledger.charge("k"));
        let mut b = History::new(1000, ledger.charge("k"));
        a.remember("a1".into(), piece(1, 30));
        a.remember("a2".into(), piece(2, 30));
        assert_eq!(ledger.held("k"), 60);
        // Past the key's budget a connection forgets its own oldest first...
        b.remember("b1".into(), piece(3, 30));
        b.remember("b2".into(), piece(4, 30));
        assert!(b.get("b1").is_none() && b.get("b2").is_some());
        assert!(b.forgot_for_budget("b1"));
        assert_eq!((b.bytes, ledger.held("k")), (30, 90));
        // ...and its newest too when that alone does not fit.
        b.remember("b3".into(), piece(5, 50));
        assert!(b.get("b3").is_none() && b.get("b2").is_none());
        assert!(b.forgot_for_budget("b2") && b.forgot_for_budget("b3"));
        assert_eq!((b.bytes, ledger.held("k")), (0, 60));
        // A connection that closes gives its share back.
        drop(a);
        assert_eq!(ledger.held("k"), 0);
        b.remember("b4".into(), piece(6, 50));
        assert!(b.get("b4").is_some());
        assert_eq!(ledger.held("k"), 50);
        assert!(!b.forgot_for_budget("b4"));
    }

    fn piece(n: usize, len: usize) -> Vec<Piece> {
        let text = format!("{n:0len$}");
        vec![Piece::copied(text)]
    }

    fn texts(p: Option<&Vec<Piece>>) -> Option<Vec<Bytes>> {
        p.map(|v| v.iter().map(|p| p.text.clone()).collect())
    }

    #[test]
    fn past_its_budget_the_history_drops_the_oldest_and_keeps_the_newest() {
        let mut h = History::new(100, unlimited());
        for (i, id) in ["r1", "r2", "r3"].iter().enumerate() {
            h.remember((*id).into(), piece(i, 40));
        }
        // 120 bytes: the oldest went, the two newest stay.
        assert!(h.get("r1").is_none());
        assert_eq!(texts(h.get("r2")), texts(Some(&piece(1, 40))));
        assert_eq!(texts(h.get("r3")), texts(Some(&piece(2, 40))));
        assert_eq!(h.bytes, 80);
        // A response larger than the whole budget is still kept, alone.
        h.remember("big".into(), piece(9, 500));
        assert!(h.get("big").is_some());
        assert!(h.get("r2").is_none() && h.get("r3").is_none());
        assert_eq!((h.order.len(), h.bytes), (1, 500));
        // The next one pushes it out.
        h.remember("r4".into(), piece(4, 10));
        assert!(h.get("big").is_none());
        assert_eq!((h.order.len(), h.bytes), (1, 10));
    }

    #[test]
    fn the_same_response_again_is_counted_once() {
        let mut h = History::new(100, unlimited());
        h.remember("r1".into(), piece(1, 60));
        h.remember("r1".into(), piece(2, 30));
        assert_eq!((h.order.len(), h.bytes), (1, 30));
        assert_eq!(texts(h.get("r1")), texts(Some(&piece(2, 30))));
    }

    #[test]
    fn a_chain_counts_what_it_holds_once_and_a_slice_counts_its_whole_buffer() {
        let mut h = History::new(1000, unlimited());
        // A turn's input is most of its frame: a slice of it, holding the whole frame.
        let frame = Bytes::from(format!("{{\"input\":[{}]}}", "1,".repeat(99) + "1"));
        let inner = std::str::from_utf8(&frame[10..frame.len() - 2]).unwrap();
        let first = Piece::of(&frame, inner);
        assert_eq!(first.held, frame.len());
        assert_eq!(first.text.as_ptr(), frame[10..].as_ptr(), "no copy");
        // A small part of a large event is copied, holding only itself.
        let event = Bytes::from(format!(
            "{{\"output\":[2],\"pad\":\"{}\"}}",
            "x".repeat(500)
        ));
        let second = Piece::of(&event, "2");
        assert_eq!(second.held, 1);
        h.remember("r1".into(), vec![first.clone(), second.clone()]);
        // The continuation shares r1's pieces: they are counted once.
        let third = Piece::copied("3".into());
        h.remember("r2".into(), vec![first.clone(), second, third]);
        assert_eq!(h.bytes, frame.len() + 1 + 1);
    }
}
