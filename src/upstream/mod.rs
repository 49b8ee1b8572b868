//! The Codex backend's protocol and transports. Sends what it is given with the identity it is
//! given and reports typed facts; it never picks accounts and knows nothing of their health.

pub mod config;
pub mod egress;
pub mod encoding;
pub mod event;
pub mod failure;
pub mod headers;
pub mod identity;
pub mod login;
pub mod pool;
pub mod quota;
pub mod routing;
pub mod sse;
pub mod stream;
pub mod ws;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use hyper::Uri;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use self::config::UpstreamConfig;
use crate::base::cores;
use crate::base::names::named;

use self::egress::{EgressError, ProxyUrl, TunnelConnector};
use self::failure::{Endpoint, Facts, Phase};
use self::pool::Pool;

/// The headers that name a session, in the order they are looked at.
pub static SESSION_HEADERS: [HeaderName; 4] = [
    HeaderName::from_static("session-id"),
    HeaderName::from_static("session_id"),
    HeaderName::from_static("thread-id"),
    HeaderName::from_static("conversation_id"),
];

/// The sticky-routing token a turn's answer carries and its next request sends back.
pub static TURN_STATE: HeaderName = HeaderName::from_static("x-codex-turn-state");

/// The account's own identity headers, named once (a name given as text is checked each time).
static ACCOUNT_ID: HeaderName = HeaderName::from_static("chatgpt-account-id");
static INSTALLATION_ID: HeaderName = HeaderName::from_static("x-codex-installation-id");

pub use self::headers::relayed;

named! {
    /// How a turn reached the backend.
    pub enum Transport {
        /// `POST /responses` (SSE).
        Http => "http",
        /// A pooled upstream WebSocket of the session.
        WsReused => "ws_reused",
        /// A WebSocket dialled for this turn.
        WsConnected => "ws_connected",
        /// A WebSocket dialled for this turn whose handshake the backend refused (401, 429,
        /// 5xx…): judged like an HTTP answer.
        WsRejected => "ws_rejected",
        /// No socket within the dial budget: HTTP.
        HttpWsBudgetExhausted => "http_ws_budget_exhausted",
        /// The origin breaker is open: HTTP.
        HttpBreakerOpen => "http_breaker_open",
        /// The backend refused the upgrade (426) or the socket failed before the turn: HTTP.
        HttpWsFailed => "http_ws_failed",
    }
}

/// The account-side identity of one attempt.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Shared with the account's entry (see `fleet::Entry`), not copied per request.
    pub access_token: Arc<str>,
    /// The token as an `Authorization` value, when it was made before (see [`bearer`]).
    pub bearer: Option<HeaderValue>,
    /// `chatgpt_account_id` and `installation_id` as header values, when made before.
    pub values: Option<IdValues>,
    /// Shared with the account's entry, as the token is.
    pub chatgpt_account_id: Arc<str>,
    /// Per-account device id (`x-codex-installation-id`), shared the same way.
    pub installation_id: Arc<str>,
    /// The account's own egress proxy (else `[upstream] proxy`, else straight out).
    pub proxy: Option<Arc<ProxyUrl>>,
    /// A data-residency workspace's origin and override ([`routing`]), when it has one.
    pub route: Option<Arc<routing::Route>>,
}

/// An account's identity headers' values (`chatgpt-account-id`, `x-codex-installation-id`),
/// made once per account rather than copied and checked per request.
#[derive(Debug, Clone)]
pub struct IdValues {
    pub account: HeaderValue,
    pub installation: HeaderValue,
}

impl IdValues {
    /// The values of `account` and `installation`; `None` when either cannot be a header value.
    pub fn of(account: &str, installation: &str) -> Option<IdValues> {
        Some(IdValues {
            account: HeaderValue::try_from(account).ok()?,
            installation: HeaderValue::try_from(installation).ok()?,
        })
    }

    /// Whether these are the values of `account` and `installation`.
    pub fn are(&self, account: &str, installation: &str) -> bool {
        self.account.as_bytes() == account.as_bytes()
            && self.installation.as_bytes() == installation.as_bytes()
    }
}

/// The account an access token belongs to, as the auth server's whoami says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Whoami {
    pub chatgpt_account_id: String,
    #[serde(default)]
    pub chatgpt_user_id: Option<String>,
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    pub chatgpt_plan_type: Option<String>,
    #[serde(default)]
    pub chatgpt_account_is_fedramp: bool,
}

/// New tokens from the OAuth endpoint.
#[derive(Debug, Clone)]
pub struct TokenSet {
    pub access_token: String,
    pub refresh_token: String,
    pub id_token: Option<String>,
}

/// The gateway's own `User-Agent` towards the backend (a client's is passed through).
const USER_AGENT: &str = concat!("switchyard/", env!("CARGO_PKG_VERSION"));

/// Largest error body read from the upstream.
pub const MAX_ERROR_BODY: usize = 64 * 1024;

/// The pools through proxies: by the proxy's URL and the serving thread's slot.
type Tunnels = HashMap<(String, usize), Arc<Pool>>;

/// How long a connection to the backend may stay idle and still be used.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Clone)]
pub struct Upstream {
    http: reqwest::Client,
    /// The request path's clients (`/responses`, `/responses/compact`): hyper's own, straight
    /// to the backend (HTTP/2 where TLS agrees on it). One per serving thread, each with its
    /// own pool, so a request and its upstream connection share a thread (`base::cores`),
    /// and one (the first) for every other thread.
    direct: Arc<[Pool]>,
    config: UpstreamConfig,
    /// `[upstream] proxy`: the way out of accounts without a proxy of their own.
    default_proxy: Option<Arc<ProxyUrl>>,
    /// The proxy environment variables, when `use_env_proxy` says to honour them.
    env_proxies: Option<Arc<egress::EnvProxies>>,
    /// One pool per proxy in use and thread (as `direct`), by its URL and the thread's slot.
    tunnels: Arc<Mutex<Tunnels>>,
    /// `{base}/responses` and `{base}/responses/compact`, parsed once.
    responses_url: Target,
    compact_url: Target,
}

/// The backend's answer on the request path (`/responses`, `/responses/compact`), as hyper's
/// client gives it. Handed on as a reqwest response it took its body boxed twice, and a URL
/// to be named by, copied for each answer.
pub type Answer = hyper::Response<hyper::body::Incoming>;

/// An answer whose body is read chunk by chunk: the request path's or reqwest's.
pub trait ReadBody {
    /// The body's data (trailers left out); a failure as the transport describes it.
    fn chunks(self) -> impl futures_util::Stream<Item = Result<Bytes, String>> + Send + 'static;
}

impl ReadBody for Answer {
    fn chunks(self) -> impl futures_util::Stream<Item = Result<Bytes, String>> + Send + 'static {
        http_body_util::BodyDataStream::new(self.into_body()).map(|r| r.map_err(|e| describe(&e)))
    }
}

impl ReadBody for reqwest::Response {
    fn chunks(self) -> impl futures_util::Stream<Item = Result<Bytes, String>> + Send + 'static {
        self.bytes_stream().map(|r| r.map_err(|e| describe(&e)))
    }
}

/// A request path's URL, parsed once, as hyper sends to it.
#[derive(Clone)]
struct Target {
    uri: Uri,
    /// The `Host` of a plain-HTTP URL, made once. Plain HTTP is always HTTP/1.1, where hyper's
    /// client would otherwise format it per request (2,200 instructions); over TLS the
    /// protocol is only known on the connection (HTTP/2 names the host otherwise), so there
    /// it is left to the client.
    host: Option<HeaderValue>,
}

impl Target {
    fn of(uri: Uri) -> Target {
        let host = (uri.scheme() == Some(&hyper::http::uri::Scheme::HTTP))
            .then(|| host_value(&uri))
            .flatten();
        Target { uri, host }
    }
}

/// The `Host` header HTTP/1.1 sends for `uri`: its host, and its port unless it is the
/// scheme's own.
fn host_value(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let default = match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    match uri.port_u16() {
        Some(port) if port != default => HeaderValue::try_from(format!("{host}:{port}")).ok(),
        _ => HeaderValue::try_from(host).ok(),
    }
}

/// The extensions of an answer that name `url` (reqwest keeps its type for them private;
/// an answer that names none makes reqwest parse a placeholder URL for it).
fn answer_url(url: reqwest::Url) -> hyper::http::Extensions {
    use reqwest::ResponseBuilderExt;
    hyper::http::Response::builder()
        .url(url)
        .body(())
        .map(|r| r.into_parts().0.extensions)
        .unwrap_or_default()
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.config.base_url)
            .field("proxy", &self.default_proxy)
            .finish()
    }
}

/// An HTTP client builder for the upstream and its auth server: the connect timeout,
/// `[upstream] proxy` when set, and proxy environment variables only when `use_env_proxy`
/// says so.
pub fn http_client(config: &UpstreamConfig) -> reqwest::ClientBuilder {
    let b = reqwest::Client::builder().connect_timeout(config.connect_timeout);
    if let Some(p) = config.proxy.as_deref()
        && let Ok(proxy) = reqwest::Proxy::all(p)
    {
        return b.proxy(proxy);
    }
    if config.use_env_proxy {
        b
    } else {
        b.no_proxy()
    }
}

/// Installs the TLS crypto provider once per process (ring).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Upstream {
    pub fn new(config: &UpstreamConfig) -> Result<Upstream, String> {
        install_crypto_provider();
        // The environment's proxies are applied here (`Upstream::route`), as tunnels like any
        // proxy, so the shared client never reads them itself.
        let http = http_client(config)
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let default_proxy = match config.proxy.as_deref() {
            Some(p) => Some(Arc::new(
                ProxyUrl::parse(p).map_err(|e| format!("[upstream] proxy: {e}"))?,
            )),
            None => None,
        };
        let env_proxies = config
            .use_env_proxy
            .then(|| Arc::new(egress::EnvProxies::from_env(|k| std::env::var(k).ok())));
        let url = |path: &str| {
            format!("{}{path}", config.base_url)
                .parse::<Uri>()
                .map_err(|e| format!("[upstream] base_url: {e}"))
        };
        Ok(Upstream {
            http,
            direct: (0..=cores::count())
                .map(|_| {
                    Pool::new(
                        TunnelConnector::direct(config.connect_timeout),
                        IDLE_TIMEOUT,
                    )
                })
                .collect(),
            config: config.clone(),
            default_proxy,
            env_proxies,
            tunnels: Arc::default(),
            responses_url: Target::of(url("/responses")?),
            compact_url: Target::of(url("/responses/compact")?),
        })
    }

    /// The way out of an account to `https`-or-not `host`: its own proxy, else
    /// `[upstream] proxy`, else (with `use_env_proxy`) the environment's, else straight.
    pub fn route<'a, 'h>(
        &'a self,
        own: Option<&'a Arc<ProxyUrl>>,
        https: bool,
        host: impl FnOnce() -> &'h str,
    ) -> Option<&'a Arc<ProxyUrl>> {
        own.or(self.default_proxy.as_ref())
            .or_else(|| self.env_proxies.as_ref()?.for_target(https, host()))
    }

    /// This thread's connections straight to the backend.
    fn direct_pool(&self) -> &Pool {
        let slot = cores::slot().min(self.direct.len() - 1);
        &self.direct[slot]
    }

    /// This thread's connections through `proxy`.
    fn tunnel_pool(&self, proxy: &Arc<ProxyUrl>) -> Arc<Pool> {
        let mut tunnels = self.tunnels.lock().unwrap_or_else(|e| e.into_inner());
        tunnels
            .entry((proxy.as_url(), cores::slot()))
            .or_insert_with(|| {
                Arc::new(Pool::new(
                    TunnelConnector::new(Arc::clone(proxy), self.config.connect_timeout),
                    IDLE_TIMEOUT,
                ))
            })
            .clone()
    }

    pub fn config(&self) -> &UpstreamConfig {
        &self.config
    }

    fn authed(&self, req: reqwest::RequestBuilder, id: &Identity) -> reqwest::RequestBuilder {
        let req = req
            .bearer_auth(&id.access_token)
            .header("chatgpt-account-id", &*id.chatgpt_account_id)
            .header("x-codex-installation-id", &*id.installation_id);
        match &id.route {
            Some(r) => req.header(routing::OVERRIDE_HEADER, &r.override_value),
            None => req,
        }
    }

    /// The base URL an account's requests go to: its workspace's origin, else the configured.
    fn base_of<'a>(&'a self, id: &'a Identity) -> &'a str {
        id.route
            .as_ref()
            .map_or(self.config.base_url.as_str(), |r| r.base_url.as_str())
    }

    /// `GET wham/accounts/check` (on the configured origin): where the account's requests go.
    pub async fn discover_route(&self, id: &Identity) -> Result<routing::Discovery, Facts> {
        let plain = Identity {
            route: None,
            ..id.clone()
        };
        let url = routing::check_url(&self.config.usage_url);
        let req = self.authed(self.http.get(url), &plain);
        let v = self
            .json_answer(req, id.proxy.as_ref())
            .await
            .map_err(|f| f.at(Endpoint::Usage))?;
        routing::discovery(
            &v,
            &id.chatgpt_account_id,
            &self.config.base_url,
            &self.config.usage_url,
        )
        .map_err(|what| {
            Facts {
                status: Some(200),
                message: Some(format!("workspace routing: {what}")),
                ..Facts::default()
            }
            .at(Endpoint::Usage)
        })
    }

    /// `POST {base}{path}` with a JSON body; returns the response once its headers arrive
    /// (any status), or the facts of a transport failure. The request is built for hyper
    /// itself: the request path pays for no URL parsing, redirect or retry layers.
    pub async fn post(
        &self,
        path: &str,
        id: &Identity,
        headers: &[(HeaderName, HeaderValue)],
        body: Bytes,
        sse: bool,
    ) -> Result<Answer, Facts> {
        // The request path's URLs are parsed once, at start (a routed account's each time).
        let target = match (path, &id.route) {
            ("/responses", None) => self.responses_url.clone(),
            ("/responses/compact", None) => self.compact_url.clone(),
            _ => format!("{}{path}", self.base_of(id))
                .parse::<Uri>()
                .map(Target::of)
                .map_err(|e| {
                    Facts::transport(Phase::Connect, format!("upstream URL for {path}: {e}"))
                })?,
        };
        let Target { uri, host } = target;
        let mut req = hyper::Request::new(reqwest::Body::from(body));
        *req.method_mut() = hyper::Method::POST;
        // Room for all of them at once (the gateway's eight and the client's): grown one by
        // one, the map is rebuilt on the way.
        *req.headers_mut() = HeaderMap::with_capacity(8 + headers.len());
        let h = req.headers_mut();
        let bearer = match &id.bearer {
            Some(made) => made.clone(),
            None => bearer(&id.access_token)
                .map_err(|e| Facts::transport(Phase::Connect, format!("access token: {e}")))?,
        };
        h.insert(reqwest::header::AUTHORIZATION, bearer);
        let bad = |e: reqwest::header::InvalidHeaderValue| {
            Facts::transport(Phase::Connect, format!("header value: {e}"))
        };
        let text = |v: &str| HeaderValue::try_from(v);
        match &id.values {
            Some(v) => {
                h.insert(&ACCOUNT_ID, v.account.clone());
                h.insert(&INSTALLATION_ID, v.installation.clone());
            }
            None => {
                h.insert(&ACCOUNT_ID, text(&id.chatgpt_account_id).map_err(bad)?);
                h.insert(&INSTALLATION_ID, text(&id.installation_id).map_err(bad)?);
            }
        }
        if let Some(r) = &id.route {
            h.insert(
                routing::OVERRIDE_HEADER,
                text(&r.override_value).map_err(bad)?,
            );
        }
        h.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static(if sse {
                "text/event-stream"
            } else {
                "application/json"
            }),
        );
        for (k, v) in headers {
            h.append(k, v.clone());
        }
        h.entry(reqwest::header::USER_AGENT)
            .or_insert(HeaderValue::from_static(USER_AGENT));
        if let Some(host) = host {
            // Last, where the client would have put it.
            h.insert(reqwest::header::HOST, host);
        }
        let https = uri.scheme_str() == Some("https");
        let tunnel;
        let pool = match self.route(id.proxy.as_ref(), https, || uri.host().unwrap_or("")) {
            None => self.direct_pool(),
            Some(p) => {
                tunnel = self.tunnel_pool(p);
                &tunnel
            }
        };
        *req.uri_mut() = uri;
        self.within_header_timeout(exchange(pool, req)).await
    }

    /// Sends a request on the account's way out (`proxy`: its own, see [`Upstream::route`])
    /// and waits for the answer's headers within the header timeout.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        proxy: Option<&Arc<ProxyUrl>>,
    ) -> Result<reqwest::Response, Facts> {
        let sent = async {
            let req = req
                .build()
                .map_err(|e| Facts::transport(Phase::Connect, describe(&e)))?;
            let (https, host) = (req.url().scheme() == "https", req.url().host_str());
            match self.route(proxy, https, || host.unwrap_or("")) {
                None => self.http.execute(req).await.map_err(|e| {
                    let phase = if e.is_connect() {
                        Phase::Connect
                    } else {
                        Phase::PreHeaders
                    };
                    Facts::transport(phase, describe(&e))
                }),
                Some(p) => self.send_through(req, p).await,
            }
        };
        self.within_header_timeout(sent).await
    }

    /// An exchange, given up when its answer's headers have not come within the header
    /// timeout.
    async fn within_header_timeout<T>(
        &self,
        sent: impl Future<Output = Result<T, Facts>>,
    ) -> Result<T, Facts> {
        match crate::base::deadline::timeout(self.config.header_timeout, sent).await {
            Err(_) => Err(Facts::transport(
                Phase::PreHeaders,
                format!(
                    "no response headers within {:?}",
                    self.config.header_timeout
                ),
            )),
            Ok(r) => r,
        }
    }

    /// A request through a proxy's tunnel; its answer is handed on as reqwest's, named by its
    /// URL.
    async fn send_through(
        &self,
        req: reqwest::Request,
        proxy: &Arc<ProxyUrl>,
    ) -> Result<reqwest::Response, Facts> {
        let url = answer_url(req.url().clone());
        let mut req = hyper::Request::<reqwest::Body>::try_from(req)
            .map_err(|e| Facts::transport(Phase::Connect, describe(&e)))?;
        req.headers_mut()
            .entry(reqwest::header::USER_AGENT)
            .or_insert(HeaderValue::from_static(USER_AGENT));
        let (mut parts, body) = exchange(&self.tunnel_pool(proxy), req).await?.into_parts();
        parts.extensions.extend(url);
        let resp = hyper::http::Response::from_parts(parts, reqwest::Body::wrap(body));
        Ok(reqwest::Response::from(resp))
    }

    /// `GET {base}/models?client_version=…`.
    pub async fn models(&self, id: &Identity, client_version: &str) -> Result<Value, Facts> {
        let req = self.authed(
            self.http.get(format!(
                "{}/models?client_version={}",
                self.base_of(id),
                client_version
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
                    .collect::<String>()
            )),
            id,
        );
        self.json_answer(req, id.proxy.as_ref())
            .await
            .map_err(|f| f.at(Endpoint::Models))
    }

    /// `GET wham/usage`.
    pub async fn usage(&self, id: &Identity) -> Result<Value, Facts> {
        let url = id
            .route
            .as_ref()
            .map_or(self.config.usage_url.as_str(), |r| r.usage_url.as_str());
        let req = self.authed(self.http.get(url), id);
        self.json_answer(req, id.proxy.as_ref())
            .await
            .map_err(|f| f.at(Endpoint::Usage))
    }

    /// `GET wham/rate-limit-reset-credits`: the account's banked reset credits.
    pub async fn reset_credits(&self, id: &Identity) -> Result<Value, Facts> {
        let req = self.authed(self.http.get(self.credits_url(id, "")), id);
        self.json_answer(req, id.proxy.as_ref())
            .await
            .map_err(|f| f.at(Endpoint::Credits))
    }

    /// `POST wham/rate-limit-reset-credits/consume`: spends one credit. `redeem_request_id`
    /// makes it idempotent: the same id again spends nothing more.
    pub async fn consume_credit(
        &self,
        id: &Identity,
        redeem_request_id: &str,
        credit_id: Option<&str>,
    ) -> Result<Value, Facts> {
        let mut body = serde_json::json!({ "redeem_request_id": redeem_request_id });
        if let Some(c) = credit_id {
            body["credit_id"] = c.into();
        }
        let req = self.authed(self.http.post(self.credits_url(id, "/consume")), id);
        self.json_answer(req.json(&body), id.proxy.as_ref())
            .await
            .map_err(|f| f.at(Endpoint::Credits))
    }

    /// `wham/rate-limit-reset-credits{tail}`, next to the account's `wham/usage`.
    fn credits_url(&self, id: &Identity, tail: &str) -> String {
        let usage = id
            .route
            .as_ref()
            .map_or(self.config.usage_url.as_str(), |r| r.usage_url.as_str());
        let wham = usage.strip_suffix("/usage").unwrap_or(usage);
        format!("{wham}/rate-limit-reset-credits{tail}")
    }

    /// Asks the auth server whose an access token is (`GET {auth_base_url}/api/accounts/v1/
    /// user-auth-credential/whoami`, the token as the bearer): how Codex validates a
    /// workspace's access token, which comes without a refresh token.
    pub async fn whoami(
        &self,
        access_token: &str,
        proxy: Option<&Arc<ProxyUrl>>,
    ) -> Result<Whoami, Facts> {
        let url = format!(
            "{}/api/accounts/v1/user-auth-credential/whoami",
            self.config.auth_base_url
        );
        let (status, bytes) = self
            .auth_server(self.http.get(url).bearer_auth(access_token), proxy)
            .await?;
        serde_json::from_slice::<Whoami>(&bytes).map_err(|e| {
            Facts {
                status: Some(status),
                message: Some(format!("the whoami answer is not one: {e}")),
                ..Facts::default()
            }
            .at(Endpoint::Token)
        })
    }

    /// One exchange with the auth server: the status and body of a 2xx answer, else the
    /// answer's (or the transport's) facts, from the token endpoint.
    async fn auth_server(
        &self,
        req: reqwest::RequestBuilder,
        proxy: Option<&Arc<ProxyUrl>>,
    ) -> Result<(u16, Bytes), Facts> {
        let at_token = |f: Facts| f.at(Endpoint::Token);
        let resp = self.send(req, proxy).await.map_err(at_token)?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = self
            .read_body(resp, MAX_ERROR_BODY, Overflow::Truncate)
            .await
            .map_err(at_token)?;
        if !(200..300).contains(&status) {
            return Err(Facts::from_response(status, &headers, bytes).at(Endpoint::Token));
        }
        Ok((status, bytes))
    }

    /// Exchanges a refresh token for new tokens (the refresh token rotates), on the account's
    /// way out (`proxy`). A failure is the token endpoint's answer (or the transport's) as
    /// facts, for the classifier.
    pub async fn refresh(
        &self,
        refresh_token: &str,
        proxy: Option<&Arc<ProxyUrl>>,
    ) -> Result<TokenSet, Facts> {
        let body = json!({
            "client_id": self.config.oauth_client_id,
            "grant_type": "refresh_token",
            "refresh_token": refresh_token,
            "scope": "openid profile email",
        });
        let (status, bytes) = self
            .auth_server(
                self.http.post(&self.config.oauth_token_url).json(&body),
                proxy,
            )
            .await?;
        let unusable = |what: String| {
            Facts {
                status: Some(status),
                message: Some(what),
                ..Facts::default()
            }
            .at(Endpoint::Token)
        };
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| unusable(format!("token answer is not JSON: {e}")))?;
        let s = |k: &str| v[k].as_str().filter(|s| !s.is_empty()).map(str::to_string);
        match (s("access_token"), s("refresh_token")) {
            (Some(access_token), Some(refresh_token)) => Ok(TokenSet {
                access_token,
                refresh_token,
                id_token: s("id_token"),
            }),
            _ => Err(unusable("token answer lacks tokens".into())),
        }
    }
}

impl Upstream {
    /// Sends `req` and reads a JSON answer; a non-2xx is an error's facts.
    async fn json_answer(
        &self,
        req: reqwest::RequestBuilder,
        proxy: Option<&Arc<ProxyUrl>>,
    ) -> Result<Value, Facts> {
        let resp = self.send(req, proxy).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = self
            .read_body(resp, 8 * 1024 * 1024, Overflow::Refuse)
            .await?;
        if !(200..300).contains(&status) {
            return Err(Facts::from_response(status, &headers, bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| Facts {
            status: Some(status),
            message: Some(format!("answer is not JSON: {e}")),
            phase: Some(Phase::PreCommit),
            ..Facts::default()
        })
    }
}

/// What a body longer than the limit comes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// The first `limit` bytes (an error body: enough to classify and show).
    Truncate,
    /// A failure (an answer: a cut one would be passed on as a success).
    Refuse,
}

impl Upstream {
    /// Reads a whole body, at most `limit` bytes, within the header timeout (a body that
    /// trickles or never ends is a failure, not a hang).
    pub async fn read_body(
        &self,
        resp: impl ReadBody,
        limit: usize,
        overflow: Overflow,
    ) -> Result<Bytes, Facts> {
        let within = self.config.header_timeout;
        match tokio::time::timeout(within, read_capped(resp, limit, overflow)).await {
            Ok(read) => read,
            Err(_) => Err(Facts::transport(
                Phase::PreCommit,
                format!("the answer's body was not read within {within:?}"),
            )),
        }
    }
}

async fn read_capped(
    resp: impl ReadBody,
    limit: usize,
    overflow: Overflow,
) -> Result<Bytes, Facts> {
    let mut out = Vec::new();
    let mut stream = std::pin::pin!(resp.chunks());
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Facts::transport(Phase::PreCommit, e))?;
        let room = limit.saturating_sub(out.len());
        if chunk.len() > room && overflow == Overflow::Refuse {
            return Err(Facts::transport(
                Phase::PreCommit,
                format!("the answer exceeds {limit} bytes"),
            ));
        }
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= limit {
            break;
        }
    }
    Ok(Bytes::from(out))
}

/// The egress failure behind a transport error, if that is what it was.
pub fn egress_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a EgressError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(x) = c.downcast_ref::<EgressError>() {
            return Some(x);
        }
        cur = c.source();
    }
    None
}

/// An access token as the `Authorization` value that carries it (marked sensitive).
pub fn bearer(token: &str) -> Result<HeaderValue, reqwest::header::InvalidHeaderValue> {
    let mut v = HeaderValue::try_from(format!("Bearer {token}"))?;
    v.set_sensitive(true);
    Ok(v)
}

/// One request on a pool of the backend's connections; a failure as the transport's facts (a proxy's own words
/// first: "proxy unreachable: …").
async fn exchange(pool: &Pool, req: hyper::Request<reqwest::Body>) -> Result<Answer, Facts> {
    match pool.request(req).await {
        Ok(resp) => Ok(resp),
        Err(pool::Failed::Connect(e)) => Err(Facts::transport(Phase::Connect, e.to_string())),
        Err(e @ pool::Failed::Handshake(_)) => Err(Facts::transport(Phase::Connect, describe(&e))),
        Err(e @ pool::Failed::Send(_)) => Err(Facts::transport(Phase::PreHeaders, describe(&e))),
    }
}

pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A peer on loopback that answers every request with `head` and `body`, then holds the
    /// connection open.
    async fn peer(head: &'static str, body: Vec<u8>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf).await;
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(&body).await;
                    std::future::pending::<()>().await;
                });
            }
        });
        format!("http://{addr}")
    }

    fn upstream(base: String) -> Upstream {
        let config = UpstreamConfig {
            base_url: base,
            header_timeout: Duration::from_millis(300),
            ..UpstreamConfig::default()
        };
        Upstream::new(&config).unwrap()
    }

    fn identity() -> Identity {
        Identity {
            access_token: "t".into(),
            bearer: None,
            values: None,
            chatgpt_account_id: "a".into(),
            installation_id: "i".into(),
            proxy: None,
            route: None,
        }
    }

    #[tokio::test]
    async fn an_answer_over_the_cap_is_refused_and_an_error_body_cut() {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2048\r\n\r\n";
        let u = upstream(peer(head, vec![b'x'; 2048]).await);
        let resp = u
            .post("/responses/compact", &identity(), &[], Bytes::new(), false)
            .await
            .unwrap();
        let err = u.read_body(resp, 1024, Overflow::Refuse).await.unwrap_err();
        assert!(
            err.summary().contains("exceeds 1024 bytes"),
            "{}",
            err.summary()
        );
        let u = upstream(peer(head, vec![b'x'; 2048]).await);
        let resp = u
            .post("/responses/compact", &identity(), &[], Bytes::new(), false)
            .await
            .unwrap();
        let cut = u.read_body(resp, 1024, Overflow::Truncate).await.unwrap();
        assert_eq!(cut.len(), 1024);
    }

    #[tokio::test]
    async fn a_body_that_never_comes_fails_within_the_header_timeout() {
        let head = "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 100\r\n\r\n";
        let u = upstream(peer(head, b"partial".to_vec()).await);
        let resp = u
            .post("/responses", &identity(), &[], Bytes::new(), true)
            .await
            .unwrap();
        let err = u
            .read_body(resp, MAX_ERROR_BODY, Overflow::Truncate)
            .await
            .unwrap_err();
        assert!(
            err.summary().contains("not read within"),
            "{}",
            err.summary()
        );
    }

    #[test]
    fn a_plain_http_url_names_its_host_as_http1_does() {
        let host = |u: &str| Target::of(u.parse().unwrap()).host;
        let text = |u: &str| host(u).map(|v| v.to_str().unwrap().to_string());
        assert_eq!(
            text("http://127.0.0.1:8080/x").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(text("http://example.com/x").as_deref(), Some("example.com"));
        assert_eq!(
            text("http://example.com:80/x").as_deref(),
            Some("example.com")
        );
        assert_eq!(text("http://[::1]:9/x").as_deref(), Some("[::1]:9"));
        // Over TLS the connection decides between HTTP/1.1 and HTTP/2: left to the client.
        assert!(host("https://example.com/x").is_none());
    }

    #[tokio::test]
    async fn a_request_carries_one_host_header_last() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(4);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    // Each request on the kept connection: its head (the bodies are empty).
                    let mut buf = [0u8; 4096];
                    loop {
                        let mut head = Vec::new();
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match conn.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        let _ = tx.send(String::from_utf8_lossy(&head).into_owned()).await;
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
                        if conn.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let u = upstream(format!("http://{addr}"));
        // Parsed once at start, and parsed per request.
        for path in ["/responses", "/responses/other"] {
            u.post(path, &identity(), &[], Bytes::new(), false)
                .await
                .unwrap();
            let head = rx.recv().await.unwrap();
            let hosts: Vec<&str> = head
                .lines()
                .filter(|l| l.to_ascii_lowercase().starts_with("host:"))
                .collect();
            assert_eq!(hosts, [format!("host: {addr}")], "{head}");
            let last = head.trim_end().lines().last().unwrap();
            assert!(last.starts_with("host:"), "{head}");
        }
    }
}
