//! The Responses WebSocket towards the backend: dialled within a budget (800 ms), pooled per
//! (account, session) for reuse by the next downstream connection of the same session, and
//! guarded by an origin breaker. A turn's frames are handed to the dispatcher as events, like
//! an SSE body's, so the commit boundary, classification and records are the HTTP ones.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::egress::{self, EgressStream};
use super::event::Event;
use super::failure::{Endpoint, Facts, Phase};
use super::stream::{Item, StreamError};
use super::{Identity, Upstream};
use crate::base::clock::SharedClock;
use crate::base::names::named;

type Socket = WebSocketStream<MaybeTlsStream<EgressStream>>;

/// Largest frame or message of a Responses WebSocket, either way (the downstream closes with
/// 1009 beyond it).
pub const MAX_FRAME: usize = 16 * 1024 * 1024;
/// Read and write buffer of each WebSocket (they grow only while a large message passes).
pub const SOCKET_BUFFER: usize = 4 * 1024;

/// The `OpenAI-Beta` value of the Responses WebSocket.
pub const BETA: &str = "responses_websockets=2026-02-06";
/// No socket within this long: the turn goes over HTTP.
pub const DIAL_BUDGET: Duration = Duration::from_millis(800);
/// Sockets are retired after this long (the backend ends them at 60 minutes).
pub const MAX_LIFE: Duration = Duration::from_secs(55 * 60);
/// An idle pooled socket older than this is pinged before reuse...
pub const PING_AFTER: Duration = Duration::from_secs(25);
/// ...and dropped if the pong does not come within this long.
pub const PONG_DEADLINE: Duration = Duration::from_secs(5);
/// An idle socket not used for this long is closed.
pub const IDLE_LIFE: Duration = Duration::from_secs(300);
/// Idle sockets kept per account, over all its sessions (the least recently used go first).
pub const MAX_IDLE_PER_ACCOUNT: usize = 8;

/// How a socket could not be had.
#[derive(Debug)]
pub enum DialError {
    /// Not within the budget: use HTTP for this turn (the dial goes on).
    Budget(LateDial),
    /// The backend answered 426: use HTTP.
    Refused,
    /// The handshake was answered with another status: classify it like an HTTP answer.
    Rejected(Facts),
    /// The connection failed (refused, reset, TLS).
    Transport(Facts),
}

/// An open upstream socket.
pub struct UpstreamSocket {
    socket: Socket,
    opened: Instant,
    /// When it went idle (unix ms, on the pool's clock).
    last_used_ms: u64,
    /// The handshake's answer headers (turn state, rate limits).
    pub headers: HeaderMap,
    /// The last response this socket produced: the backend keeps one response's state per
    /// socket, so only that one can be continued on it.
    last_response: Option<Arc<str>>,
    /// The client connection whose turns it carries (`None`: none now; it may go to any).
    owner: Option<u64>,
}

impl UpstreamSocket {
    /// Whether a continuation of `response_id` can go on this socket as sent.
    pub fn holds(&self, response_id: &str) -> bool {
        self.last_response.as_deref() == Some(response_id)
    }
}

/// (account id, session key) -> its idle sockets.
type IdleSockets = HashMap<(String, String), Vec<UpstreamSocket>>;

/// Idle sockets by (account, session): bounded per account, swept when idle too long, and
/// evicted when their account goes bad.
#[derive(Clone)]
pub struct WsPool {
    idle: Arc<Mutex<IdleSockets>>,
    clock: SharedClock,
}

impl WsPool {
    pub fn new(clock: SharedClock) -> WsPool {
        WsPool {
            idle: Arc::new(Mutex::new(HashMap::new())),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IdleSockets> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn expired(&self, s: &UpstreamSocket, now_ms: u64) -> bool {
        s.opened.elapsed() >= MAX_LIFE || now_ms.saturating_sub(s.last_used_ms) >= ms(IDLE_LIFE)
    }

    pub fn put(&self, account: &str, session: &str, mut s: UpstreamSocket) {
        if s.opened.elapsed() >= MAX_LIFE {
            return;
        }
        let now = self.clock.now_ms();
        s.last_used_ms = now;
        let mut idle = self.lock();
        let v = idle
            .entry((account.to_string(), session.to_string()))
            .or_default();
        if v.len() < 4 {
            v.push(s);
        }
        // Idle too long anywhere, and beyond the account's bound: the least recently used go.
        idle.retain(|_, v| {
            v.retain(|s| !self.expired(s, now));
            !v.is_empty()
        });
        loop {
            let of_account = idle
                .iter()
                .filter(|((a, _), _)| a == account)
                .map(|(_, v)| v.len())
                .sum::<usize>();
            if of_account <= MAX_IDLE_PER_ACCOUNT {
                break;
            }
            let oldest = idle
                .iter()
                .filter(|((a, _), _)| a == account)
                .flat_map(|(k, v)| {
                    v.iter()
                        .enumerate()
                        .map(move |(i, s)| (s.last_used_ms, k, i))
                })
                .min_by_key(|(t, _, _)| *t)
                .map(|(_, k, i)| (k.clone(), i));
            let Some((key, i)) = oldest else { break };
            if let Some(v) = idle.get_mut(&key) {
                v.remove(i);
                if v.is_empty() {
                    idle.remove(&key);
                }
            }
        }
    }

    /// Drops idle sockets that are too old, idle too long, closed by the backend (read without
    /// waiting: pings are answered on the way), or of an account `usable` says no to.
    pub fn sweep(&self, usable: impl Fn(&str) -> bool) -> usize {
        use futures_util::FutureExt;
        let now = self.clock.now_ms();
        let mut dropped = 0;
        self.lock().retain(|(account, _), v| {
            let keep_account = usable(account);
            v.retain_mut(|s| {
                let alive = keep_account
                    && !self.expired(s, now)
                    && loop {
                        match s.socket.next().now_or_never() {
                            None => break true,
                            Some(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
                            Some(_) => break false,
                        }
                    };
                dropped += usize::from(!alive);
                alive
            });
            !v.is_empty()
        });
        dropped
    }

    /// An idle socket for the client connection `owner`: its own one holding `want`, else
    /// its own, else one no connection holds. A socket another connection holds is never
    /// handed out: its chain is that connection's.
    fn take(
        &self,
        account: &str,
        session: &str,
        want: Option<&str>,
        owner: Option<u64>,
    ) -> Option<UpstreamSocket> {
        let mut idle = self.lock();
        let key = (account.to_string(), session.to_string());
        let v = idle.get_mut(&key)?;
        let own = |s: &UpstreamSocket| owner.is_some() && s.owner == owner;
        let pick = want
            .and_then(|w| v.iter().position(|s| own(s) && s.holds(w)))
            .or_else(|| v.iter().rposition(own))
            .or_else(|| v.iter().rposition(|s| s.owner.is_none()));
        let s = pick.map(|i| v.remove(i));
        if v.is_empty() {
            idle.remove(&key);
        }
        s
    }

    /// An idle socket for this account and session that is still alive, for the client
    /// connection `owner` (see [`WsPool::take`]), preferring the one that produced `want`.
    pub async fn checkout(
        &self,
        account: &str,
        session: &str,
        want: Option<&str>,
        owner: Option<u64>,
    ) -> Option<UpstreamSocket> {
        while let Some(mut s) = self.take(account, session, want, owner) {
            let now = self.clock.now_ms();
            if self.expired(&s, now) {
                continue;
            }
            if now.saturating_sub(s.last_used_ms) < ms(PING_AFTER) || ping(&mut s.socket).await {
                return Some(s);
            }
        }
        None
    }

    /// Idle sockets held.
    pub fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    /// Idle sockets held per account.
    pub fn per_account(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for ((account, _), v) in self.lock().iter() {
            *m.entry(account.clone()).or_insert(0) += v.len();
        }
        m
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A client connection ended: its idle sockets may serve any connection of their session
    /// now (their next turn goes with its full input).
    pub fn disown(&self, owner: u64) {
        for s in self.lock().values_mut().flatten() {
            if s.owner == Some(owner) {
                s.owner = None;
            }
        }
    }

    /// Drops every idle socket of an account (it was found bad).
    pub fn evict(&self, account: &str) {
        self.lock().retain(|(a, _), _| a != account);
    }
}

async fn ping(socket: &mut Socket) -> bool {
    if socket
        .send(Message::Ping(Bytes::from_static(b"sy")))
        .await
        .is_err()
    {
        return false;
    }
    let wait = async {
        while let Some(Ok(m)) = socket.next().await {
            if matches!(m, Message::Pong(_)) {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(PONG_DEADLINE, wait)
        .await
        .unwrap_or(false)
}

named! {
    /// The origin breaker's state.
    pub enum BreakerState {
        Closed => "closed",
        Open => "open",
        /// Open, with its time up: the next turn probes.
        HalfOpen => "half_open",
    }
}

/// The origin breaker: 3 degraded openings within 30 s open it for 30 s; then one probe.
#[derive(Debug)]
pub struct Breaker {
    clock: SharedClock,
    inner: Mutex<BreakerInner>,
}

#[derive(Debug, Default)]
struct BreakerInner {
    /// Unix ms of recent degraded openings.
    degraded: Vec<u64>,
    open_until: Option<u64>,
    probing: bool,
}

pub const BREAKER_WINDOW: Duration = Duration::from_secs(30);
pub const BREAKER_OPEN: Duration = Duration::from_secs(30);
pub const BREAKER_THRESHOLD: usize = 3;

use crate::base::duration::whole_ms as ms;

impl Breaker {
    pub fn new(clock: SharedClock) -> Self {
        Self {
            clock,
            inner: Mutex::new(BreakerInner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BreakerInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this turn may try a socket: a permit to report what the origin did, or `None`
    /// while the breaker is open (a half-open breaker lets one probe through).
    pub fn allow(&self) -> Option<Permit<'_>> {
        let now = self.clock.now_ms();
        let mut s = self.lock();
        let probe = match s.open_until {
            None => false,
            Some(t) if now < t => return None,
            Some(_) if s.probing => return None,
            Some(_) => {
                s.probing = true;
                true
            }
        };
        Some(Permit {
            breaker: self,
            probe,
            resolved: false,
        })
    }

    fn success(&self) {
        *self.lock() = BreakerInner::default();
    }

    fn degraded(&self) {
        let now = self.clock.now_ms();
        let mut s = self.lock();
        if s.open_until.is_some() {
            // The probe failed: open again.
            s.open_until = Some(now + ms(BREAKER_OPEN));
            s.probing = false;
            return;
        }
        s.degraded
            .retain(|t| now.saturating_sub(*t) < ms(BREAKER_WINDOW));
        s.degraded.push(now);
        if s.degraded.len() >= BREAKER_THRESHOLD {
            tracing::warn!("WebSocket breaker open: turns go over HTTP for {BREAKER_OPEN:?}");
            s.open_until = Some(now + ms(BREAKER_OPEN));
            s.degraded.clear();
        }
    }

    pub fn state(&self) -> BreakerState {
        let now = self.clock.now_ms();
        let s = self.lock();
        match s.open_until {
            None => BreakerState::Closed,
            Some(t) if now < t => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }
}

/// A turn's permission to try a socket. Every way it ends reports: `success` (a socket
/// opened, or the origin answered the handshake at all), `degraded` (no socket in time, a
/// 426, a failed connection), or — dropped unresolved, when a pooled socket was reused and no
/// dial said anything about the origin — nothing, handing a half-open breaker's probe to the
/// next turn instead of keeping it forever.
pub struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
    resolved: bool,
}

impl Permit<'_> {
    pub fn success(mut self) {
        self.resolved = true;
        self.breaker.success();
    }

    pub fn degraded(mut self) {
        self.resolved = true;
        self.breaker.degraded();
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.resolved && self.probe {
            self.breaker.lock().probing = false;
        }
    }
}

impl Upstream {
    /// `ws(s)://…/responses` for the configured base URL.
    pub fn ws_url(&self) -> String {
        ws_url_of(&self.config().base_url)
    }

    /// Opens a socket with the account's identity within `budget`.
    pub async fn dial(
        &self,
        id: &Identity,
        headers: &[(HeaderName, HeaderValue)],
        budget: Duration,
    ) -> Result<UpstreamSocket, DialError> {
        let url = match &id.route {
            Some(r) => ws_url_of(&r.base_url),
            None => self.ws_url(),
        };
        self.dial_at(&url, id, headers, budget).await
    }
}

/// `ws(s)://…/responses` for a base URL.
fn ws_url_of(base: &str) -> String {
    let base = base
        .strip_prefix("https://")
        .map(|r| format!("wss://{r}"))
        .or_else(|| base.strip_prefix("http://").map(|r| format!("ws://{r}")))
        .unwrap_or_else(|| base.to_string());
    format!("{base}/responses")
}

impl Upstream {
    /// Opens a socket to `url` with the account's identity within `budget`.
    async fn dial_at(
        &self,
        url: &str,
        id: &Identity,
        headers: &[(HeaderName, HeaderValue)],
        budget: Duration,
    ) -> Result<UpstreamSocket, DialError> {
        let mut req = url.into_client_request().map_err(|e| {
            DialError::Transport(
                Facts::transport(Phase::Connect, e.to_string()).at(Endpoint::WebSocket),
            )
        })?;
        let h = req.headers_mut();
        let mut put = |k: &'static str, v: &str| {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(k, v);
            }
        };
        put("authorization", &format!("Bearer {}", id.access_token));
        put("chatgpt-account-id", &id.chatgpt_account_id);
        put("x-codex-installation-id", &id.installation_id);
        put("openai-beta", BETA);
        if let Some(r) = &id.route {
            put(super::routing::OVERRIDE_HEADER, &r.override_value);
        }
        for (k, v) in headers {
            if k != "openai-beta" {
                h.insert(k.clone(), v.clone());
            }
        }
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(SOCKET_BUFFER)
            .write_buffer_size(SOCKET_BUFFER)
            .max_message_size(Some(MAX_FRAME))
            .max_frame_size(Some(MAX_FRAME));
        let transport = |what: String| {
            DialError::Transport(Facts::transport(Phase::Connect, what).at(Endpoint::WebSocket))
        };
        let uri = req.uri();
        let tls = uri.scheme_str() == Some("wss");
        let host = uri
            .host()
            .unwrap_or("")
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let proxy = self.route(id.proxy.as_ref(), tls, || &host).cloned();
        let timeout = self.config.connect_timeout;
        // The way out (straight, or a proxy's tunnel), then TLS to the backend for wss.
        let connect = async move {
            let stream = egress::connect(proxy.as_deref(), &host, port, timeout)
                .await
                .map_err(|e| Err(e.to_string()))?;
            tokio_tungstenite::client_async_tls_with_config(req, stream, Some(config), None)
                .await
                .map_err(Ok)
        };
        // The dial runs on its own, up to the connect timeout: past the budget the turn goes
        // over HTTP, and a socket that still comes can serve the session's next turn.
        let mut dial = tokio::spawn(async move {
            match tokio::time::timeout(timeout, connect).await {
                Ok(r) => socket_of(r),
                Err(_) => Err(transport(format!("no WebSocket within {timeout:?}"))),
            }
        });
        match tokio::time::timeout(budget, &mut dial).await {
            Err(_) => Err(DialError::Budget(LateDial(dial))),
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(transport(format!("the dial stopped: {e}"))),
        }
    }
}

type Connected = Result<
    (
        Socket,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    // A handshake's error, or (`Err`) why there was no connection to shake hands on.
    Result<tokio_tungstenite::tungstenite::Error, String>,
>;

/// A dial's end as a socket, or why there is none (the same error `dial` returns, facts and
/// all: it is made once per dial, not on a hot path).
#[allow(clippy::result_large_err)]
fn socket_of(r: Connected) -> Result<UpstreamSocket, DialError> {
    let transport = |what: String| {
        DialError::Transport(Facts::transport(Phase::Connect, what).at(Endpoint::WebSocket))
    };
    match r {
        Ok((socket, resp)) => Ok(UpstreamSocket {
            socket,
            opened: Instant::now(),
            last_used_ms: 0,
            headers: resp.headers().clone(),
            last_response: None,
            owner: None,
        }),
        Err(Err(egress)) => Err(transport(egress)),
        Err(Ok(tokio_tungstenite::tungstenite::Error::Http(resp))) => {
            let status = resp.status().as_u16();
            if status == 426 {
                return Err(DialError::Refused);
            }
            let body = resp.body().clone().map(Bytes::from).unwrap_or_default();
            let mut facts =
                Facts::from_response(status, resp.headers(), body).at(Endpoint::WebSocket);
            facts.phase = Some(Phase::PreHeaders);
            Err(DialError::Rejected(facts))
        }
        Err(Ok(e)) => Err(transport(super::describe(&e))),
    }
}

/// A dial that missed its budget and goes on in the background.
pub struct LateDial(tokio::task::JoinHandle<Result<UpstreamSocket, DialError>>);

impl std::fmt::Debug for LateDial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LateDial")
    }
}

impl LateDial {
    /// Puts the socket, if it comes within the connect timeout, in the pool for the session's
    /// next turn; gives up without a session (nothing could take it).
    /// It carries no chain yet, so any client connection of the session may take it.
    pub fn pool_when_open(self, pool: WsPool, account: String, session: Option<String>) {
        let Some(session) = session else {
            self.0.abort();
            return;
        };
        tokio::spawn(async move {
            match self.0.await {
                Ok(Ok(socket)) => {
                    tracing::info!(account = %account, "a WebSocket dialled too late for its turn joins the pool");
                    pool.put(&account, &session, socket);
                }
                Ok(Err(e)) => {
                    tracing::debug!(account = %account, error = ?e, "a late WebSocket dial failed")
                }
                Err(_) => {}
            }
        });
    }
}

/// A socket about to carry a turn, and where it goes back to when the turn completes.
pub struct TurnSocket {
    pub socket: UpstreamSocket,
    pub pool: WsPool,
    pub account: String,
    pub session: Option<String>,
    /// The client connection the turn is for: the socket is its own from now on.
    pub owner: Option<u64>,
}

/// The frames of one turn, read as events. At a completed (or incomplete) terminal the socket
/// goes back to the pool for the session's next turn; after an error frame or a failure it is
/// dropped.
pub struct WsTurn {
    socket: Option<TurnSocket>,
}

/// A `response.create` larger than this goes out in fragments of this size, so that the
/// socket's write buffer never holds a second copy of a large turn.
pub const FRAGMENT_BYTES: usize = 256 << 10;

/// Sends `response.create` with `body` and returns the turn's frames.
pub async fn turn(mut t: TurnSocket, body: &Bytes) -> Result<WsTurn, Facts> {
    t.socket.owner = t.owner;
    let failed = |what: String| Facts::transport(Phase::PreHeaders, what).at(Endpoint::WebSocket);
    let messages = create_messages(body).map_err(|e| failed(format!("bad request body: {e}")))?;
    for m in messages {
        t.socket
            .socket
            .send(m)
            .await
            .map_err(|e| failed(format!("websocket send failed: {e}")))?;
    }
    Ok(WsTurn { socket: Some(t) })
}

/// The messages that send the object `body` as `response.create`. The body is read as raw
/// members (the input is forwarded, never built into a tree). One past [`FRAGMENT_BYTES`]
/// that has no `type` of its own is not copied: the member goes ahead of it in a first
/// fragment, and the body follows as slices of itself.
fn create_messages(body: &Bytes) -> Result<Vec<Message>, String> {
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let mut frame = crate::base::raw_json::RawObject::parse(body).map_err(|e| e.to_string())?;
    let open = text.len() - text.trim_start().len();
    if body.len() <= FRAGMENT_BYTES || frame.raw("type").is_some() {
        frame.set("type", &"response.create");
        let text = tokio_tungstenite::tungstenite::Utf8Bytes::try_from(frame.encode())
            .map_err(|e| e.to_string())?;
        return Ok(vec![Message::Text(text)]);
    }
    let empty = frame.is_empty();
    drop(frame);
    // After the object's `{`.
    let rest = body.slice(open + 1..);
    let head: &'static [u8] = if empty {
        br#"{"type":"response.create""#
    } else {
        br#"{"type":"response.create","#
    };
    let mut messages = vec![Message::Frame(Frame::message(
        Bytes::from_static(head),
        OpCode::Data(Data::Text),
        false,
    ))];
    let mut at = 0;
    while at < rest.len() {
        let mut end = (at + FRAGMENT_BYTES).min(rest.len());
        // A fragment ends where a character does.
        while end < rest.len() && (rest[end] & 0xC0) == 0x80 {
            end -= 1;
        }
        let last = end == rest.len();
        messages.push(Message::Frame(Frame::message(
            rest.slice(at..end),
            OpCode::Data(Data::Continue),
            last,
        )));
        at = end;
    }
    Ok(messages)
}

impl WsTurn {
    /// The next frame as an event; `None` once the turn ended (a terminal event was given).
    pub async fn next(&mut self) -> Option<Result<Item, StreamError>> {
        let t = self.socket.as_mut()?;
        loop {
            let msg = match t.socket.socket.next().await {
                None => {
                    self.socket = None;
                    return Some(Err("websocket closed before response.completed".into()));
                }
                Some(Err(e)) => {
                    self.socket = None;
                    return Some(Err(format!("websocket error: {e}")));
                }
                Some(Ok(m)) => m,
            };
            match msg {
                Message::Text(text) => {
                    let event = Event::from_data(Bytes::from(text));
                    match event.kind() {
                        "response.created" => {
                            if let Some(id) = event.response_id() {
                                t.socket.last_response = Some(id);
                            }
                        }
                        "response.completed" | "response.incomplete" => {
                            if let Some(t) = self.socket.take()
                                && let Some(session) = &t.session
                            {
                                t.pool.put(&t.account, session, t.socket);
                            }
                        }
                        "response.failed" | "error" => self.socket = None,
                        _ => {}
                    }
                    return Some(Ok(Item::Event(event)));
                }
                Message::Close(frame) => {
                    self.socket = None;
                    let why = frame
                        .map(|f| format!("{} {}", u16::from(f.code), f.reason))
                        .unwrap_or_default();
                    return Some(Err(format!(
                        "websocket closed by the backend before response.completed {why}"
                    )));
                }
                Message::Binary(_) => {
                    self.socket = None;
                    return Some(Err("unexpected binary frame".into()));
                }
                _ => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::ManualClock;

    /// The text a peer reassembles from the messages, and the largest payload among them.
    fn reassembled(messages: Vec<Message>) -> (String, usize) {
        let mut text = Vec::new();
        let mut largest = 0;
        let n = messages.len();
        for (i, m) in messages.into_iter().enumerate() {
            match m {
                Message::Text(t) => {
                    assert_eq!(n, 1, "a whole message comes alone");
                    largest = t.len();
                    text.extend_from_slice(t.as_bytes());
                }
                Message::Frame(f) => {
                    assert_eq!(f.header().is_final, i + 1 == n, "only the last is final");
                    largest = largest.max(f.payload().len());
                    assert!(
                        std::str::from_utf8(f.payload()).is_ok(),
                        "ends where a character does"
                    );
                    text.extend_from_slice(f.payload());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        (String::from_utf8(text).expect("whole characters"), largest)
    }

    #[test]
    fn a_large_turn_goes_out_as_slices_of_its_body_and_means_what_a_small_one_does() {
        // Multi-byte characters everywhere, so that fragment ends fall inside some.
        let item = format!(
            r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":"é{}"}}]}}"#,
            "日本✓".repeat(40)
        );
        let items: Vec<&str> =
            std::iter::repeat_n(item.as_str(), (3 * FRAGMENT_BYTES) / item.len()).collect();
        let body = Bytes::from(format!(
            r#"{{"model":"gpt-5.5","stream":true,"input":[{}]}}"#,
            items.join(",")
        ));
        let messages = create_messages(&body).unwrap();
        assert!(messages.len() >= 4, "{} messages", messages.len());
        // Continuations are slices of the body: no copy of it is made.
        for m in &messages[1..] {
            let Message::Frame(f) = m else {
                panic!("{m:?}")
            };
            let p = f.payload();
            let within = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
            assert!(
                within.contains(&(p.as_ptr() as usize)),
                "a slice of the body"
            );
        }
        let (text, largest) = reassembled(messages);
        assert!(largest <= FRAGMENT_BYTES, "{largest}");
        let mut expected: serde_json::Value = serde_json::from_slice(&body).unwrap();
        expected["type"] = "response.create".into();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            expected
        );

        // A small body, and a large one that has a `type` of its own, go whole, typed once.
        for body in [
            Bytes::from_static(br#"{"model":"gpt-5.5","input":[]}"#),
            Bytes::from(format!(r#"{{"type":"x","input":[{}]}}"#, items.join(","))),
        ] {
            let (text, _) = reassembled(create_messages(&body).unwrap());
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["type"], "response.create");
            assert_eq!(text.matches(r#""type":"response.create""#).count(), 1);
        }
        // An empty object, large only by its spaces, and bodies that are no object.
        let spaced = Bytes::from(format!("{{{}}}", " ".repeat(FRAGMENT_BYTES + 1)));
        let (text, _) = reassembled(create_messages(&spaced).unwrap());
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            serde_json::json!({"type": "response.create"})
        );
        assert!(create_messages(&Bytes::from_static(b"[1]")).is_err());
        assert!(create_messages(&Bytes::from_static(b"{\"a\":\"\xff\"}")).is_err());
    }

    #[test]
    fn every_way_a_permit_ends_settles_a_half_open_breaker() {
        let clock = ManualClock::new(1_000_000);
        let b = Breaker::new(Arc::new(clock.clone()));
        for _ in 0..BREAKER_THRESHOLD {
            b.allow().unwrap().degraded();
        }
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.allow().is_none());
        clock.advance(BREAKER_OPEN);
        let probe = b.allow().unwrap();
        assert!(b.allow().is_none(), "one probe at a time");
        // A turn that reused a pooled socket says nothing: the next turn probes.
        drop(probe);
        let probe = b.allow().unwrap();
        probe.degraded();
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "a failed probe opens it again"
        );
        clock.advance(BREAKER_OPEN);
        b.allow().unwrap().success();
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
