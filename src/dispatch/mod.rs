//! One `/v1` request's lifecycle: Request -> Attempt -> Stream (DESIGN §4).
//!
//! `request.rs` freezes the candidates and walks them; `attempt.rs` holds [`attempt::Attempt`],
//! the value that owns one try on one account (its lease, identity, channel, clock and its
//! part of the trace) and ends in a typed [`attempt::End`]; `stream.rs` is the attempt's commit
//! boundary: it holds pre-commit events, commits, forwards and records the terminal outcome.
//! The edge receives [`Frame`]s over a channel — a head, events, a whole body, or an error — and
//! encodes them once: as SSE (`api::responses`) or as WebSocket text frames (`api::ws`).

pub mod attempt;
pub mod credits;
pub mod cut;
pub mod frames;
pub mod probe;
pub mod request;
pub mod stream;
pub mod warmup;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use crate::base::job::{self, Ticker};
use crate::fleet::Fleet;
use crate::keys::KeyRing;
use crate::keys::usage::UsageBook;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::records::{RequestLog, TerminalSource};
use crate::ttl::{TtlConfig, TtlMap};
use crate::upstream::Upstream;
use crate::upstream::event::Event;

/// How often idle upstream WebSockets are looked at.
const WS_SWEEP_EVERY: Duration = Duration::from_secs(15);

/// Tunables of the lifecycle.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchConfig {
    /// After this long without a commit, an SSE client gets 200 headers and keep-alive comments.
    pub keepalive_after: Duration,
    /// Longest silence inside an upstream stream.
    pub stream_idle_timeout: Duration,
    /// Fails over an account that produced nothing to show within this long (off when `None`).
    pub first_output_timeout: Option<Duration>,
    /// Largest pre-commit buffer; reaching it commits.
    pub max_precommit_bytes: usize,
    /// Largest single upstream event.
    pub max_event_bytes: usize,
    /// Model aliases: requested name -> upstream name.
    pub aliases: BTreeMap<String, String>,
    /// The longest a request may take to get a first answer, failovers and waits included.
    pub request_deadline: Duration,
    /// How long a frame may wait for the client to take it before the client counts as
    /// stalled.
    pub client_write_timeout: Duration,
    /// The model of the minimal request that proves an account before it takes requests.
    pub probe_model: String,
    /// Failovers a request may make for a first-output timeout; the next one is answered.
    pub first_output_switches: u32,
    /// Log each finished request at `info` (the access log).
    pub access_log: bool,
    /// `[credits]`: when reset credits are spent on their own.
    pub credits: credits::CreditsConfig,
    /// `[warmup]`: when idle accounts' windows are started early.
    pub warmup: warmup::WarmupConfig,
    /// `[front_doors.anthropic]`: which pool model an Anthropic model name means.
    pub anthropic: ModelMap,
    /// `[front_doors.images]`: which pool model runs the image tool for an image model name.
    pub images: ModelMap,
}

/// A front door's model names -> pool models: globs (`claude-sonnet-*`), tried in name
/// order, then `default`; a name neither covers is used as it is.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelMap {
    pub models: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

impl ModelMap {
    pub fn resolve(&self, name: &str) -> String {
        self.models
            .get(name)
            .or_else(|| {
                self.models
                    .iter()
                    .find(|(pattern, _)| crate::base::glob::glob_match(pattern, name))
                    .map(|(_, m)| m)
            })
            .or(self.default.as_ref())
            .cloned()
            .unwrap_or_else(|| name.to_string())
    }
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            keepalive_after: Duration::from_secs(10),
            stream_idle_timeout: Duration::from_secs(300),
            first_output_timeout: None,
            max_precommit_bytes: 256 * 1024,
            max_event_bytes: 16 * 1024 * 1024,
            aliases: BTreeMap::new(),
            request_deadline: Duration::from_secs(600),
            client_write_timeout: Duration::from_secs(60),
            probe_model: crate::upstream::config::DEFAULT_PROBE_MODEL.into(),
            first_output_switches: 1,
            access_log: false,
            credits: credits::CreditsConfig::default(),
            warmup: warmup::WarmupConfig::default(),
            anthropic: ModelMap::default(),
            images: ModelMap::default(),
        }
    }
}

/// What the client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `POST /v1/responses` with `stream: true`: SSE.
    Stream,
    /// `POST /v1/responses` without streaming: streamed upstream, one JSON answer.
    Json,
    /// `POST /v1/responses/compact`: a unary upstream call relayed as it is.
    Compact,
}

/// A parsed client request.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    /// The client key's id and name.
    pub key_id: Arc<str>,
    pub key_name: Arc<str>,
    pub model: String,
    pub mode: Mode,
    /// The body to send upstream (serialized once).
    pub body: Bytes,
    /// The client's device ids, replaced by the account's in what each attempt sends.
    pub client_ids: crate::upstream::identity::ClientIds,
    /// Client headers passed through to the backend (`upstream::headers`).
    pub pass_headers: Vec<(HeaderName, HeaderValue)>,
    /// `x-codex-turn-state` from the client, forwarded only to the account that issued it.
    pub turn_state: Option<String>,
    /// The session key (header or `prompt_cache_key`), if any.
    pub session: Option<String>,
    /// A continuation: only the account that produced this response may serve it.
    pub previous_response_id: Option<String>,
    /// A turn of a downstream WebSocket connection.
    pub ws: bool,
    /// For WebSocket turns: the frame as the client sent it, for an upstream socket that
    /// holds its previous response (`body` is the same turn with the full history instead).
    pub ws_turn: Option<WsTurn>,
    /// Set by the edge when a write to the client made no progress for the write timeout: a
    /// client gone that way stalled rather than left.
    pub stalled: Option<Arc<std::sync::atomic::AtomicBool>>,
    pub path: &'static str,
    pub received: Instant,
    /// The key's slot, when the request was admitted from its head (HTTP, before its body
    /// was read); otherwise the dispatcher admits it.
    pub key_permit: Option<Arc<crate::keys::KeyPermit>>,
    /// The key's memory its body (or frame) holds while the request runs.
    pub memory: Option<Arc<crate::keys::memory::Charge>>,
    /// The `service_tier` the request asked for, as sent (it is forwarded unchanged).
    pub service_tier: Option<String>,
    /// The edge writes the stream as SSE in the backend's own form: events after the commit
    /// may come to it as [`Frame::Sse`]. Other edges get every event as an [`Event`].
    pub sse_out: bool,
}

/// What a downstream WebSocket turn carries beyond its expanded body.
#[derive(Debug, Clone)]
pub struct WsTurn {
    /// The `response.create` as sent (incremental input, `previous_response_id`, `generate`).
    pub frame: Bytes,
    pub previous_response_id: Option<String>,
    /// `generate: false`: prime the upstream socket, produce nothing.
    pub warmup: bool,
    /// The downstream connection it came on: an upstream socket carries one connection's
    /// chain at a time.
    pub connection: u64,
}

/// An error for the client, renderable as an HTTP answer or as a `response.failed` event.
#[derive(Debug, Clone)]
pub struct ErrorReply {
    pub status: u16,
    pub body: Bytes,
    pub content_type: String,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// For the event form.
    pub code: String,
    pub message: String,
    /// Whether it is the backend's own error or one the gateway made.
    pub source: TerminalSource,
}

impl ErrorReply {
    /// An error in the OpenAI shape; `extra` fields are merged into the `error` object.
    pub fn openai(
        status: u16,
        kind: &str,
        code: &str,
        message: impl Into<String>,
        extra: Map<String, Value>,
    ) -> Self {
        let message = message.into();
        let mut error = Map::new();
        error.insert("message".into(), Value::String(message.clone()));
        error.insert("type".into(), Value::String(kind.into()));
        error.insert("code".into(), Value::String(code.into()));
        error.insert("param".into(), Value::Null);
        error.extend(extra);
        ErrorReply {
            status,
            body: Bytes::from(json!({ "error": error }).to_string()),
            content_type: "application/json".into(),
            headers: Vec::new(),
            code: code.into(),
            message,
            source: TerminalSource::Synthetic,
        }
    }

    /// The same error, saying what the backend said (reframed, not made up).
    pub fn from_upstream(self) -> Self {
        ErrorReply {
            source: TerminalSource::Upstream,
            ..self
        }
    }

    /// The `response.failed` event carrying this error.
    pub fn as_failed_event(&self) -> Event {
        Event::failed(None, &self.code, &self.message)
    }
}

/// What the dispatcher sends to the edge.
#[derive(Debug)]
pub enum Frame {
    /// The response head; events or a body follow.
    Head {
        status: u16,
        headers: Vec<(HeaderName, HeaderValue)>,
    },
    /// Events of the stream, in order (those of one upstream read together).
    Events(Vec<Event>),
    /// Events of the stream already in SSE form, for an edge that asked for them so
    /// ([`RequestCtx::sse_out`]): after the commit, the blocks of one upstream read pass as
    /// they came, without being made into events one by one.
    Sse(Bytes),
    /// A whole body: a JSON client's final `response`, or a unary upstream answer.
    Body(Bytes),
    /// The upstream's keep-alive comment after the commit.
    KeepAlive,
    /// The request failed before anything was committed (boxed: an error is rare and large,
    /// and every frame of a request's channel is as large as the largest kind).
    Error(Box<ErrorReply>),
}

/// Why a frame did not reach the client's side of the channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsent {
    /// The reader is gone.
    Gone,
    /// No room came within the write timeout: the client stalled.
    Stalled,
}

/// Resolves once the request's client has left (its frames' reader is gone). Nothing is
/// registered to wake on it: the only reader is a [`frames::Frames`], which drives the request
/// itself while it lives and, when it goes, closes the channel and then hands the request to a
/// task of its own, whose first poll finds the channel closed. (`Sender::closed` would enter
/// a waiter list and leave it again at every wait for the upstream.)
pub(crate) fn client_left(tx: &frames::Sender) -> impl std::future::Future<Output = ()> + '_ {
    std::future::poll_fn(|_| {
        if tx.is_closed() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
}

/// Sends `frame` to the edge, waiting at most `limit` for room. A frame that finds room at once
/// (the usual case) goes without a timer.
pub(crate) async fn send_within(
    tx: &frames::Sender,
    frame: Frame,
    limit: Duration,
) -> Result<(), Unsent> {
    let frame = match tx.try_send(frame) {
        Ok(()) => return Ok(()),
        Err(frames::TrySendError::Closed(_)) => return Err(Unsent::Gone),
        Err(frames::TrySendError::Full(frame)) => frame,
    };
    match tokio::time::timeout(limit, tx.send(frame)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(Unsent::Gone),
        Err(_) => Err(Unsent::Stalled),
    }
}

/// Runs requests. Cloning shares it: a request's copy is four counted references (what it
/// shares, the tunables it runs with, shutdown's cut and its own part of it), however many
/// parts the dispatcher has.
#[derive(Clone)]
pub struct Dispatcher {
    shared: Arc<Shared>,
    /// The tunables this request runs with (a snapshot of `live` taken when it started, so a
    /// reload never changes a request half-way).
    pub config: Arc<DispatchConfig>,
    /// Made when shutdown's grace period is over: every request still running ends. A
    /// request's copy holds its own part of it ([`cut::Cut::join`]): its checks are an atomic
    /// load, and its waits keep its task's waker where no other request looks.
    cut: cut::Cut,
}

impl std::ops::Deref for Dispatcher {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// What every copy of a [`Dispatcher`] shares.
pub struct Shared {
    pub fleet: Fleet,
    pub upstream: Arc<Upstream>,
    pub log: RequestLog,
    /// The tunables in force, replaced by a reload.
    live: std::sync::RwLock<Arc<DispatchConfig>>,
    pub metrics: Metrics,
    /// Idle upstream WebSockets per (account, session), and the origin breaker.
    pub ws_pool: crate::upstream::ws::WsPool,
    pub breaker: crate::upstream::ws::Breaker,
    /// Turn-state token -> the account that issued it.
    turn_states: TtlMap<String, String>,
    /// The running requests.
    tasks: tokio_util::task::TaskTracker,
    /// The client keys, whose policies admit requests before they are scheduled.
    pub keys: KeyRing,
    /// Usage per key, model and account, by the hour.
    pub usage: UsageBook,
    /// Wakes the usage poller, which proves unproven accounts.
    prober: tokio::sync::Notify,
    /// The accounts whose proof runs.
    proving: probe::ProvingSet,
    /// Reset-credit spends: one at a time, each settled before another.
    pub credits: credits::Pilot,
    /// Where the operator is told (set once by the daemon; off until then).
    notify: std::sync::OnceLock<crate::notify::Notifier>,
}

/// The future `make` makes, made in a box allocated first: `Box::pin(future)` builds the
/// future on the stack and copies it into its box, kilobytes for a request's or an attempt's
/// (the copy into freshly allocated memory cost more than the work of a small request).
pub(crate) fn boxed<F: std::future::Future>(make: impl FnOnce() -> F) -> std::pin::Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

impl Dispatcher {
    pub fn new(
        fleet: Fleet,
        upstream: Arc<Upstream>,
        log: RequestLog,
        (keys, usage): (KeyRing, UsageBook),
        config: DispatchConfig,
    ) -> Self {
        let clock = Arc::clone(fleet.clock());
        let turn_states = TtlMap::new(
            TtlConfig {
                idle: Some(Duration::from_secs(3600)),
                absolute: None,
                max_entries: 100_000,
            },
            Arc::clone(fleet.clock()),
        );
        let config = Arc::new(config);
        let shared = Shared {
            fleet,
            upstream,
            log,
            live: std::sync::RwLock::new(Arc::clone(&config)),
            metrics: Metrics::default(),
            ws_pool: crate::upstream::ws::WsPool::new(Arc::clone(&clock)),
            breaker: crate::upstream::ws::Breaker::new(Arc::clone(&clock)),
            turn_states,
            tasks: tokio_util::task::TaskTracker::new(),
            keys,
            usage,
            prober: tokio::sync::Notify::default(),
            proving: probe::ProvingSet::default(),
            credits: credits::Pilot::default(),
            notify: std::sync::OnceLock::new(),
        };
        Dispatcher {
            shared: Arc::new(shared),
            config,
            cut: cut::Cut::default(),
        }
    }

    /// Sets where the operator is told; once (a later call changes nothing).
    pub fn set_notifier(&self, notifier: crate::notify::Notifier) {
        let _ = self.notify.set(notifier);
    }

    /// Where the operator is told.
    pub fn notifier(&self) -> &crate::notify::Notifier {
        self.notify.get_or_init(crate::notify::Notifier::off)
    }

    /// Shutdown's grace period is over: every request still running ends now and is recorded
    /// — a committed stream with `response.failed` (`server_shutting_down`), anything else
    /// with a 503 of that code. Requests that arrive later get the 503 at once.
    pub fn cut(&self) {
        self.cut.cut();
    }

    /// Whether shutdown has cut the requests.
    pub fn is_cut(&self) -> bool {
        self.cut.is_cut()
    }

    /// Resolves when shutdown cuts the requests.
    pub(crate) async fn cut_off(&self) {
        self.cut.cut_off().await;
    }

    /// Waits until every request has ended (its last frame handed to the edge, its record
    /// kept).
    pub async fn settled(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// The sweepers of the dispatcher's own state: turn-state tokens, and idle upstream
    /// WebSockets (too old, idle too long, closed by the backend, or of an account that is
    /// no longer usable).
    pub fn spawn_sweepers(
        &self,
        every: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let sockets = {
            let d = self.clone();
            job::spawn(
                "ws pool sweep",
                Ticker::new(WS_SWEEP_EVERY, stop.clone()),
                move || {
                    let dropped = d.ws_pool.sweep(|account| d.fleet.usable(account));
                    if dropped > 0 {
                        tracing::debug!(dropped, "idle upstream WebSockets swept");
                    }
                    std::future::ready(())
                },
            )
        };
        vec![self.turn_states.spawn_sweeper(every, stop), sockets]
    }

    /// The tunables in force now.
    pub fn current(&self) -> Arc<DispatchConfig> {
        Arc::clone(&self.live.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the tunables for the requests that start from now on.
    pub fn set_config(&self, config: DispatchConfig) {
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    /// Resolves a model alias.
    pub fn resolve_model(&self, model: &str) -> String {
        self.current()
            .aliases
            .get(model)
            .cloned()
            .unwrap_or_else(|| model.to_string())
    }

    /// Starts one request: it runs as its frames are read (on the reader's task), and on a
    /// task of its own if the reader goes before it ends.
    pub fn start(&self, ctx: RequestCtx) -> frames::Frames {
        let mut d = self.clone();
        d.config = self.current();
        d.cut = self.cut.join();
        let (tx, rx) = frames::channel(64);
        // The tracker's token is held inside the future rather than wrapped around it, and the
        // future (4.5 KB) is made in its box.
        let token = self.tasks.token();
        let run = boxed(move || async move {
            let _tracked = token;
            d.run(ctx, tx).await
        });
        frames::Frames::new(rx, run)
    }
}
