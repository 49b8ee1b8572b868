//! The HTTP contract: routes, authentication, encoding. No policy and no storage logic: the
//! handlers call the fleet, the key ring and (for health) the store's ping.

pub mod admin;
pub mod error;
pub mod front;
pub mod health;
pub mod models;
pub mod responses;
pub mod server;
pub mod usage;
pub mod view;
pub mod ws;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use switchyard_admin::wire;

use self::error::ApiError;
use crate::base::clock::SharedClock;
use crate::dispatch::Dispatcher;
use crate::fleet::Fleet;
use crate::keys::KeyRing;
use crate::store::Store;
use crate::store::secrets::Secret;

/// What every handler can reach.
pub struct AppState {
    pub store: Store,
    pub fleet: Fleet,
    pub keys: KeyRing,
    pub dispatcher: Dispatcher,
    pub clock: SharedClock,
    pub started_at_ms: u64,
    /// The client-facing listener's address, as bound.
    pub listen: String,
    pub admin_token: Option<Secret>,
    /// `[admin] metrics_token`; live, a reload changes it.
    pub metrics_token: std::sync::RwLock<Option<Secret>>,
    pub max_body_bytes: usize,
    /// How long a request body may take, and how slowly it may come.
    pub body_limits: BodyLimits,
    /// What each key holds in memory: bodies, frames and WebSocket history.
    pub key_memory: Arc<crate::keys::memory::MemoryLedger>,
    /// Downstream WebSocket limits and open connections per key.
    pub ws: ws::WsLimits,
    pub ws_connections: ws::ConnectionCounts,
    /// Console feed subscribers.
    pub feed: crate::telemetry::feed::FeedHub,
    /// The last fetched model catalog and when (unix ms).
    pub models_cache: std::sync::Mutex<Option<(u64, serde_json::Value)>>,
    /// Cancelled when shutdown begins.
    draining: tokio_util::sync::CancellationToken,
    /// The open downstream WebSocket connections.
    pub ws_open: tokio_util::task::TaskTracker,
    /// Client connections: open, and closed by the gateway.
    pub edge: Arc<server::EdgeStats>,
    /// What the admin API's reload calls: the daemon's own configuration, read again.
    pub reloader: Option<Arc<dyn Reloader>>,
}

/// `[server] body_timeout` and `body_min_rate`.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub timeout: std::time::Duration,
    /// Bytes a second on average, after [`BodyLimits::grace`].
    pub min_rate: u64,
}

impl BodyLimits {
    /// The start of a body when its rate is not judged yet (a connection's first round
    /// trips, a client assembling what it sends): 5 s, or half the timeout when that is less.
    pub fn grace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(5).min(self.timeout / 2)
    }
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            timeout: std::time::Duration::from_secs(60),
            min_rate: 16 * 1024,
        }
    }
}

/// Reads the daemon's configuration again and applies it (`text`, when given, is the file's
/// contents as sent by `switchyard reload`); the error is said to the caller in words.
pub trait Reloader: Send + Sync {
    fn reload(&self, state: &AppState, text: Option<&str>) -> Result<wire::Reloaded, String>;
}

impl AppState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        fleet: Fleet,
        keys: KeyRing,
        dispatcher: Dispatcher,
        clock: SharedClock,
        listen: String,
        admin_token: Option<Secret>,
        max_body_bytes: usize,
    ) -> Self {
        Self {
            started_at_ms: clock.now_ms(),
            store,
            fleet,
            keys,
            dispatcher,
            clock,
            listen,
            admin_token,
            metrics_token: std::sync::RwLock::new(None),
            max_body_bytes,
            body_limits: BodyLimits::default(),
            key_memory: crate::keys::memory::MemoryLedger::new(
                crate::config::ServerConfig::default()
                    .key_memory_bytes()
                    .max(max_body_bytes),
            ),
            ws: ws::WsLimits::default(),
            ws_connections: ws::ConnectionCounts::default(),
            feed: crate::telemetry::feed::FeedHub::default(),
            models_cache: std::sync::Mutex::new(None),
            draining: tokio_util::sync::CancellationToken::new(),
            ws_open: tokio_util::task::TaskTracker::new(),
            edge: Arc::default(),
            reloader: None,
        }
    }

    /// Marks the gateway as shutting down: `/readyz` answers 503 from now on, and WebSocket
    /// connections close (after the turn they are in).
    pub fn start_draining(&self) {
        self.draining.cancel();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// Resolves when shutdown begins.
    pub async fn drained(&self) {
        self.draining.cancelled().await;
    }

    /// The state the console shows, with `requests` as its request list.
    pub fn feed_state(&self, requests: &[crate::telemetry::records::RequestRecord]) -> wire::Feed {
        // Counts keyed by account id, re-keyed by `chatgpt_account_id` (what the console shows).
        let by_chatgpt_id = |counts: Vec<(String, usize)>| {
            let (ids, counts): (Vec<String>, Vec<usize>) = counts.into_iter().unzip();
            self.fleet
                .chatgpt_account_ids(&ids)
                .into_iter()
                .map(|id| id.to_string())
                .zip(counts)
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let sessions = by_chatgpt_id(
            self.fleet
                .affinity
                .sessions_per_account()
                .into_iter()
                .collect(),
        );
        let ws_pool = by_chatgpt_id(self.dispatcher.ws_pool.per_account().into_iter().collect());
        let ws_pool_idle = ws_pool.values().sum();
        let (pool_waiting, pool_oldest_wait_ms) = self.fleet.pool_queue();
        wire::Feed {
            status: self.status(),
            accounts: self.accounts(),
            requests: view::requests(requests),
            sessions,
            ws_pool_idle,
            ws_pool,
            pool_waiting,
            pool_oldest_wait_ms,
            now_ms: self.clock.now_ms(),
            breaker: self.dispatcher.breaker.state().as_str().into(),
            dropped_subscribers: self.feed.dropped(),
            keys: self.keys_live(),
        }
    }

    /// The error-rate windows as gauges: pool-wide, and per account (label `account` = its
    /// `chatgpt_account_id`) where it had requests or attempts in the window.
    pub fn render_error_rates(&self, out: &mut String) {
        use std::fmt::Write;
        let windows = self.dispatcher.log.windows();
        let _ = writeln!(
            out,
            "# HELP switchyard_client_error_rate Share of requests whose client got an error, over the window.\n\
             # TYPE switchyard_client_error_rate gauge\n\
             # HELP switchyard_upstream_error_rate Upstream errors per request, over the window.\n\
             # TYPE switchyard_upstream_error_rate gauge"
        );
        for w in &windows {
            let m = w.minutes;
            let _ = writeln!(
                out,
                "switchyard_client_error_rate{{window=\"{m}m\"}} {}\n\
                 switchyard_upstream_error_rate{{window=\"{m}m\"}} {}",
                w.pool.client_rate().unwrap_or(0.0),
                w.pool.upstream_rate_per_request().unwrap_or(0.0)
            );
        }
        let _ = writeln!(
            out,
            "# HELP switchyard_account_client_error_rate Share of the requests that ended on an account whose client got an error, over the window.\n\
             # TYPE switchyard_account_client_error_rate gauge\n\
             # HELP switchyard_account_upstream_error_rate Share of an account's attempts the upstream failed, over the window.\n\
             # TYPE switchyard_account_upstream_error_rate gauge"
        );
        for w in &windows {
            for (account, t) in &w.accounts {
                let a = crate::telemetry::metrics::escape(account);
                let m = w.minutes;
                if let Some(r) = t.client_rate() {
                    let _ = writeln!(
                        out,
                        "switchyard_account_client_error_rate{{account=\"{a}\",window=\"{m}m\"}} {r}"
                    );
                }
                if let Some(r) = t.upstream_rate_per_attempt() {
                    let _ = writeln!(
                        out,
                        "switchyard_account_upstream_error_rate{{account=\"{a}\",window=\"{m}m\"}} {r}"
                    );
                }
            }
        }
    }

    /// Per-key counters since start (label `key` = the key's name) and the usage writer's
    /// backlog, in the text format.
    pub fn render_key_metrics(&self, out: &mut String) {
        use crate::keys::usage::Counters;
        use std::fmt::Write;
        let names = self.keys.names();
        let name =
            |id: &str| crate::telemetry::metrics::escape(names.get(id).map_or(id, String::as_str));
        let usage = &self.dispatcher.usage;
        let totals = usage.since_start();
        type Family = (&'static str, &'static str, fn(&Counters) -> u64);
        let counters: [Family; 2] = [
            (
                "switchyard_key_requests_total",
                "Finished requests per client key, since start.",
                |c| c.requests,
            ),
            (
                "switchyard_key_errors_total",
                "Requests per client key whose client got an error, since start.",
                |c| c.errors,
            ),
        ];
        for (metric, help, value) in counters {
            let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} counter");
            for (id, c) in &totals {
                let _ = writeln!(out, "{metric}{{key=\"{}\"}} {}", name(id), value(c));
            }
        }
        let _ = writeln!(
            out,
            "# HELP switchyard_key_tokens_total Tokens per client key and kind as the upstream reported them, since start.\n\
             # TYPE switchyard_key_tokens_total counter"
        );
        for (id, c) in &totals {
            for (kind, n) in [
                ("input", c.input_tokens),
                ("cached", c.cached_tokens),
                ("output", c.output_tokens),
                ("reasoning", c.reasoning_tokens),
            ] {
                let _ = writeln!(
                    out,
                    "switchyard_key_tokens_total{{key=\"{}\",kind=\"{kind}\"}} {n}",
                    name(id)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP switchyard_key_refusals_total Requests refused by their key's policy, by code, since start.\n\
             # TYPE switchyard_key_refusals_total counter\n\
             # HELP switchyard_key_in_flight Requests running per client key.\n\
             # TYPE switchyard_key_in_flight gauge\n\
             # HELP switchyard_key_memory_bytes What each client key holds in memory: request bodies, WebSocket frames and history.\n\
             # TYPE switchyard_key_memory_bytes gauge\n\
             # HELP switchyard_key_memory_limit_bytes What one client key may hold in memory ([server] key_memory_mib).\n\
             # TYPE switchyard_key_memory_limit_bytes gauge\n\
             switchyard_key_memory_limit_bytes {}",
            self.key_memory.limit()
        );
        for (k, _) in self.keys.active() {
            let now = self.keys.now(&k.id);
            for (code, n) in &now.refusals {
                let _ = writeln!(
                    out,
                    "switchyard_key_refusals_total{{key=\"{}\",code=\"{code}\"}} {n}",
                    name(&k.id)
                );
            }
            let _ = writeln!(
                out,
                "switchyard_key_in_flight{{key=\"{}\"}} {}",
                name(&k.id),
                now.in_flight
            );
            let _ = writeln!(
                out,
                "switchyard_key_memory_bytes{{key=\"{}\"}} {}",
                name(&k.id),
                self.key_memory.held(&k.id)
            );
        }
        let _ = writeln!(
            out,
            "# HELP switchyard_usage_unflushed_buckets Usage buckets changed since they were last written.\n\
             # TYPE switchyard_usage_unflushed_buckets gauge\n\
             switchyard_usage_unflushed_buckets {}\n\
             # HELP switchyard_usage_flushes_total Usage writes completed since start.\n\
             # TYPE switchyard_usage_flushes_total counter\n\
             switchyard_usage_flushes_total {}",
            usage.unflushed(),
            usage.flushes()
        );
    }

    /// The active keys as the console shows them: running, waiting, rate, tokens today, each
    /// budget, the last refusal.
    pub fn keys_live(&self) -> Vec<wire::KeyLive> {
        let usage = &self.dispatcher.usage;
        let midnight = self.clock.now_secs() / 86_400 * 86_400;
        self.keys
            .active()
            .into_iter()
            .map(|(k, policy)| {
                let now = self.keys.now(&k.id);
                wire::KeyLive {
                    in_flight: now.in_flight,
                    max_concurrency: policy.max_concurrency,
                    waiting: now.waiting,
                    rpm: now.rpm,
                    rpm_limit: policy.rpm,
                    tokens_today: usage.tokens_since(&k.id, midnight),
                    budgets: policy
                        .budgets()
                        .map(|(w, limit)| view::budget(&usage.budget(&k.id, w, limit)))
                        .collect(),
                    last_refusal: now.last_refusal.map(|(code, _)| code.to_string()),
                    last_refusal_ms: now.last_refusal.map(|(_, ms)| ms),
                    id: k.id,
                    name: k.name,
                    enabled: k.enabled,
                }
            })
            .collect()
    }

    pub fn status(&self) -> wire::Status {
        wire::Status {
            version: env!("CARGO_PKG_VERSION").to_string(),
            protocol: wire::PROTOCOL_VERSION,
            pid: std::process::id(),
            uptime_s: self.clock.now_ms().saturating_sub(self.started_at_ms) / 1000,
            listen: self.listen.clone(),
            accounts: self.fleet.len(),
            accounts_by_state: view::by_state(self.fleet.count_by_state()),
            in_flight: self.fleet.in_flight(),
            waiting: {
                let (pool, sticky) = self.fleet.waiting();
                (pool + sticky) as u64
            },
            strategy: self.fleet.settings().strategy.as_str().to_string(),
            error_rates: view::pool_rates(&self.dispatcher.log.windows()),
        }
    }

    /// Every account as the admin API and the console show it, with its error rates.
    pub fn accounts(&self) -> Vec<wire::Account> {
        view::accounts_with_rates(&self.fleet.list(), &self.dispatcher.log.windows())
    }
}

/// The client-facing router. The admin API is mounted here only when an admin token is set.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/responses", post(responses::create).get(ws::upgrade))
        .route("/v1/responses/compact", post(responses::compact))
        .route("/v1/chat/completions", post(front::chat::completions))
        .route("/v1/messages", post(front::messages::create))
        .route(
            "/v1/messages/count_tokens",
            post(front::messages::count_tokens),
        )
        .route("/v1/images/generations", post(front::images::generations))
        .route("/v1/images/edits", post(front::images::edits))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::retrieve))
        .route("/v1/usage", get(usage::usage))
        // The handlers read the body themselves, with the cap and a JSON 413.
        .layer(DefaultBodyLimit::disable());
    let mut r = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics))
        .merge(v1);
    if state.admin_token.is_some() {
        r = r.merge(admin::routes().layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_admin_token,
        )));
    }
    r.fallback(not_found)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

/// The client-facing service: [`router`], with a Responses turn (`POST /v1/responses` and
/// `/v1/responses/compact`: nearly every request a Codex client sends) handed to its handler
/// at once. The router would match the path, clone its boxed route service, and insert the
/// matched path and the (empty) path parameters into the request's extensions before calling
/// the same handler; those routes need none of it (their handlers read the body themselves,
/// under no body limit layer). Everything else goes through the router.
#[derive(Clone)]
pub struct Edge {
    router: Router,
    state: Arc<AppState>,
}

impl Edge {
    pub fn new(state: Arc<AppState>) -> Edge {
        Edge {
            router: router(Arc::clone(&state)),
            state,
        }
    }

    /// An edge whose every other route is `router` (tests of the server under it).
    #[cfg(test)]
    pub(crate) fn with_router(router: Router, state: Arc<AppState>) -> Edge {
        Edge { router, state }
    }

    /// Answers `req`, which came on the client connection `conn` (none in tests of the edge
    /// alone). The Responses routes are handed the connection; every other route finds it
    /// among the request's extensions, which cost a map of their own per request.
    pub async fn call(&self, mut req: Request, conn: Option<Arc<server::ClientConn>>) -> Response {
        if req.method() == axum::http::Method::POST {
            let state = Arc::clone(&self.state);
            match req.uri().path() {
                "/v1/responses" => return responses::create_on(state, conn, req, false).await,
                "/v1/responses/compact" => {
                    return responses::create_on(state, conn, req, true).await;
                }
                _ => {}
            }
        }
        if let Some(conn) = conn {
            req.extensions_mut().insert(conn);
        }
        let mut router = self.router.clone();
        match tower_service::Service::call(&mut router, req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        }
    }
}

/// A state with no accounts and no keys, on an in-memory store, for tests.
#[cfg(test)]
pub(crate) fn test_state() -> Arc<AppState> {
    crate::upstream::install_crypto_provider();
    let store = crate::store::Store::open_in_memory().unwrap();
    let clock: SharedClock = Arc::new(crate::base::clock::ManualClock::new(0));
    let fleet = crate::fleet::Fleet::load(store.clone(), Arc::clone(&clock)).unwrap();
    let keys = crate::keys::KeyRing::load(store.clone(), Arc::clone(&clock)).unwrap();
    let usage = crate::keys::usage::UsageBook::load(store.clone(), Arc::clone(&clock)).unwrap();
    let dispatcher = crate::dispatch::Dispatcher::new(
        fleet.clone(),
        Arc::new(
            crate::upstream::Upstream::new(&crate::upstream::config::UpstreamConfig::default())
                .unwrap(),
        ),
        crate::telemetry::records::RequestLog::load(store.clone(), Arc::clone(&clock)),
        (keys.clone(), usage),
        crate::dispatch::DispatchConfig::default(),
    );
    Arc::new(AppState::new(
        store,
        fleet,
        keys,
        dispatcher,
        clock,
        "127.0.0.1:0".into(),
        None,
        1 << 20,
    ))
}

/// The admin router served on the Unix socket (file permissions are its access control).
pub fn admin_router(state: Arc<AppState>) -> Router {
    admin::routes()
        .route("/healthz", get(health::healthz))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

async fn metrics(State(state): State<Arc<AppState>>, headers: axum::http::HeaderMap) -> Response {
    let required = state
        .metrics_token
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(token) = required {
        let presented = bearer(&headers);
        let ok = presented.is_some_and(|p| {
            constant_time_eq(token.expose().as_bytes(), p.as_bytes())
                || state
                    .admin_token
                    .as_ref()
                    .is_some_and(|a| constant_time_eq(a.expose().as_bytes(), p.as_bytes()))
        });
        if !ok {
            return ApiError::unauthorized(
                "/metrics needs the metrics token ([admin] metrics_token)",
            )
            .into_response();
        }
    }
    let mut text = state.dispatcher.metrics.render(
        &state.fleet,
        &state.store,
        (
            state.dispatcher.ws_pool.len(),
            state.dispatcher.breaker.state(),
        ),
    );
    state.edge.render(&mut text);
    state.render_key_metrics(&mut text);
    state.render_error_rates(&mut text);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}

/// The bearer token of a request, if it has one.
fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn require_admin_token(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let presented = bearer(req.headers());
    match (&state.admin_token, presented) {
        (Some(expected), Some(p))
            if constant_time_eq(expected.expose().as_bytes(), p.as_bytes()) =>
        {
            next.run(req).await
        }
        _ => ApiError::unauthorized("a valid admin token is required").into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// What the client-facing service answers, whole.
    async fn answer(resp: Response) -> (u16, Option<String>, bytes::Bytes) {
        let status = resp.status().as_u16();
        let ctype = resp
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        (
            status,
            ctype,
            resp.into_body().collect().await.unwrap().to_bytes(),
        )
    }

    /// The Responses routes taken before the router answer as the router does, and what only
    /// looks like them still goes to the router.
    #[tokio::test]
    async fn the_responses_routes_answer_as_the_router_does() {
        let state = test_state();
        let edge = Edge::new(Arc::clone(&state));
        let requests = [
            ("POST", "/v1/responses", None),
            ("POST", "/v1/responses?stream=true", None),
            ("POST", "/v1/responses/compact", None),
            ("POST", "/v1/responses", Some("Bearer sk-sy-unknown")),
            (
                "POST",
                "/v1/responses/compact",
                Some("Bearer sk-sy-unknown"),
            ),
            ("POST", "/v1/responses/", None),
            ("POST", "/v1/Responses", None),
            ("GET", "/v1/responses", None),
            ("PUT", "/v1/responses", None),
        ];
        let mut statuses = Vec::new();
        for (method, uri, auth) in requests {
            let make = || {
                let mut b = axum::http::Request::builder().method(method).uri(uri);
                if let Some(a) = auth {
                    b = b.header(AUTHORIZATION, a);
                }
                b.body(axum::body::Body::from("{}")).unwrap()
            };
            let direct = answer(edge.call(make(), None).await).await;
            let mut router = router(Arc::clone(&state));
            let routed = tower_service::Service::call(&mut router, make())
                .await
                .unwrap();
            assert_eq!(direct, answer(routed).await, "{method} {uri}");
            statuses.push(direct.0);
        }
        assert_eq!(statuses[..5], [401; 5], "no key is no answer");
        assert_eq!(statuses[5..7], [404; 2]);
        assert_eq!(statuses[8], 405);
    }
}
