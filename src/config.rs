//! The TOML configuration: every key optional with a documented default, unknown keys refused,
//! environment overrides for the upstream URLs, and errors that name the key and line.
//!
//! Precedence, lowest first: built-in defaults, the config file, environment variables, CLI
//! flags (which clap also reads from `SWITCHYARD_*` variables).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::base::duration::text as duration;
use crate::telemetry::LogConfig;
use crate::upstream::config::{UpstreamConfig, check_http_url};

use crate::store::secrets::Secret;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_STATE_DIR: &str = "./switchyard-data";
pub const ADMIN_SOCKET_FILE: &str = "admin.sock";

/// Upstream URL overrides read from the environment.
pub const ENV_UPSTREAM_BASE_URL: &str = "SWITCHYARD_UPSTREAM_BASE_URL";
pub const ENV_UPSTREAM_USAGE_URL: &str = "SWITCHYARD_UPSTREAM_USAGE_URL";
pub const ENV_OAUTH_TOKEN_URL: &str = "SWITCHYARD_OAUTH_TOKEN_URL";
pub const ENV_AUTH_BASE_URL: &str = "SWITCHYARD_AUTH_BASE_URL";

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub upstream: UpstreamConfig,
    pub admin: AdminConfig,
    pub models: ModelsConfig,
    pub scheduling: crate::fleet::settings::Settings,
    pub log: LogConfig,
    /// USD per million tokens by model, for the "API-equivalent cost" of `switchyard usage`.
    pub pricing: std::collections::BTreeMap<String, Price>,
    /// Operators' rules for failures, checked in order before the built-in classification.
    #[serde(deserialize_with = "crate::fleet::rules::unique_names")]
    pub rules: Vec<crate::fleet::rules::Rule>,
    /// When rate-limit reset credits are spent without an operator.
    pub credits: crate::dispatch::credits::CreditsConfig,
    /// `[front_doors.*]`: how the other front doors map onto the pool.
    pub front_doors: FrontDoors,
    /// `[warmup]`: idle accounts' 5-hour windows started early, at these local times.
    pub warmup: crate::dispatch::warmup::WarmupConfig,
    /// `[[notify]]`: where the operator is told of dead logins, a dry pool, spent credits.
    #[serde(deserialize_with = "crate::notify::checked_targets")]
    pub notify: Vec<crate::notify::NotifyTarget>,
}

/// The front doors beside `/v1/responses`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FrontDoors {
    /// `/v1/messages`: Anthropic model names -> pool models.
    pub anthropic: crate::dispatch::ModelMap,
    /// `/v1/images/*`: image model names -> the pool model that runs the image tool
    /// (default: `[upstream] probe_model`).
    pub images: crate::dispatch::ModelMap,
}

/// A model's API price in USD per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub cached_input: f64,
    pub output: f64,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Extra model names and the upstream model each stands for, e.g. `{ "gpt-5" = "gpt-5.5" }`.
    pub aliases: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address of the client-facing listener (`/v1`, `/healthz`, `/metrics`).
    pub listen: SocketAddr,
    /// Largest accepted request body.
    #[serde(deserialize_with = "positive_u64")]
    pub max_body_bytes: u64,
    /// A request body must have arrived whole within this long after its head...
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// ...and, after its first 5 s (half the timeout, when that is less), at this many bytes
    /// a second on average at least.
    pub body_min_rate: u64,
    /// How long SIGTERM waits for in-flight requests before cutting them.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// An SSE client that would wait longer than this for its first event (queue, slow first
    /// token) gets 200 headers and `: keep-alive` comments meanwhile.
    #[serde(with = "duration")]
    pub keepalive_after: Duration,
    /// A Responses WebSocket must send its first request within this long...
    #[serde(with = "duration")]
    pub ws_first_message_timeout: Duration,
    /// ...and is closed after this long without one.
    #[serde(with = "duration")]
    pub ws_idle_timeout: Duration,
    /// Open Responses WebSockets allowed per client key.
    pub ws_max_connections_per_key: usize,
    /// A client that reads nothing of its answer for this long is cut (`client_stalled`).
    #[serde(with = "duration")]
    pub client_write_timeout: Duration,
    /// A connection that has not sent a whole request head within this long is closed.
    #[serde(with = "duration")]
    pub header_read_timeout: Duration,
    /// A kept-alive connection with no request for this long is closed.
    #[serde(with = "duration")]
    pub keepalive_idle_timeout: Duration,
    /// Open client connections; beyond it the oldest idle one is closed, else the new one is
    /// refused.
    #[serde(deserialize_with = "positive_usize")]
    pub max_connections: usize,
    /// What one client key may hold in memory at once, in MiB: its request bodies while they
    /// are read and run, its WebSocket frames and its connections' history (never less than
    /// one body of `max_body_bytes`).
    #[serde(deserialize_with = "positive_usize")]
    pub key_memory_mib: usize,
}

impl ServerConfig {
    /// `key_memory_mib` in bytes, raised to one whole body when it is less.
    pub fn key_memory_bytes(&self) -> usize {
        self.key_memory_mib
            .saturating_mul(1 << 20)
            .max(usize::try_from(self.max_body_bytes).unwrap_or(usize::MAX))
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 16 * 1024 * 1024,
            body_timeout: Duration::from_secs(60),
            body_min_rate: 16 * 1024,
            shutdown_grace: Duration::from_secs(30),
            keepalive_after: Duration::from_secs(10),
            ws_first_message_timeout: Duration::from_secs(30),
            ws_idle_timeout: Duration::from_secs(300),
            ws_max_connections_per_key: 32,
            client_write_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(10),
            keepalive_idle_timeout: Duration::from_secs(75),
            max_connections: 4096,
            key_memory_mib: 256,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Where `switchyard.redb` and `secret.key` live. Default: `$STATE_DIRECTORY` under
    /// systemd, else `./switchyard-data`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// Request records older than this are pruned.
    pub request_retention_days: u32,
    /// Hourly usage buckets older than this are pruned.
    pub usage_retention_days: u32,
    /// The store's page cache in MiB: what of `switchyard.redb` the daemon keeps in memory.
    #[serde(deserialize_with = "positive_usize")]
    pub cache_mib: usize,
}

impl StorageConfig {
    /// `cache_mib` in bytes.
    pub fn cache_bytes(&self) -> usize {
        self.cache_mib.saturating_mul(1 << 20)
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            state_dir: None,
            request_retention_days: 7,
            usage_retention_days: 400,
            cache_mib: crate::store::DEFAULT_CACHE_BYTES >> 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The admin Unix socket. Default: `$RUNTIME_DIRECTORY/admin.sock` under systemd, else
    /// `admin.sock` in the state directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// When set, the admin API is also served on the main listener with this bearer token.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::store::secrets::masked",
        deserialize_with = "non_empty_secret"
    )]
    pub token: Option<Secret>,
    /// When set, `/metrics` answers only requests with this bearer token (or the admin token).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::store::secrets::masked",
        deserialize_with = "non_empty_secret"
    )]
    pub metrics_token: Option<Secret>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}{}", read_remedy(source))]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {}{message}", key.as_ref().map(|k| format!("`{k}`: ")).unwrap_or_default())]
    Parse {
        path: PathBuf,
        line: usize,
        key: Option<String>,
        message: String,
    },
    #[error("environment variable {var}: {message}")]
    Env { var: &'static str, message: String },
}

/// Where the configuration came from, so that a reload reads it again the way the start did:
/// the file, then the environment, then the command line's `--state-dir` and `--listen`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Source {
    pub path: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
}

impl Source {
    /// The configuration in force: from `text` when given (the file's contents sent by
    /// `switchyard reload`), else from the file (or the defaults, without one).
    pub fn load(&self, text: Option<&str>, env: EnvLookup<'_>) -> Result<Config, ConfigError> {
        let mut config = match text {
            Some(t) => Config::parse(
                t,
                self.path
                    .as_deref()
                    .unwrap_or_else(|| Path::new("the sent configuration")),
            )?,
            None => Config::load(self.path.as_deref())?,
        };
        config.apply_env(env)?;
        if let Some(dir) = &self.state_dir {
            config.storage.state_dir = Some(dir.clone());
        }
        if let Some(listen) = self.listen {
            config.server.listen = listen;
        }
        Ok(config.resolved(env))
    }
}

/// What to do when the config file cannot be read.
fn read_remedy(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            "; pass the path of an existing file (or none, for the defaults)"
        }
        std::io::ErrorKind::PermissionDenied => {
            "; run as a user that may read it (the packaged config is root's: sudo)"
        }
        _ => "",
    }
}

/// What the process environment contributes; a function so tests need not touch the real one.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Config {
    /// Parses config text; `path` is only used in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let (line, key) = match e.span() {
                Some(span) => locate(text, span.start),
                None => (0, None),
            };
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                key,
                message: e.message().trim().to_string(),
            }
        })
    }

    /// Reads the file at `path`, or the defaults when there is none.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            None => Ok(Config::default()),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                Config::parse(&text, p)
            }
        }
    }

    /// Applies the environment overrides of the upstream URLs.
    pub fn apply_env(&mut self, env: EnvLookup<'_>) -> Result<(), ConfigError> {
        for (var, slot) in [
            (ENV_UPSTREAM_BASE_URL, &mut self.upstream.base_url),
            (ENV_UPSTREAM_USAGE_URL, &mut self.upstream.usage_url),
            (ENV_OAUTH_TOKEN_URL, &mut self.upstream.oauth_token_url),
            (ENV_AUTH_BASE_URL, &mut self.upstream.auth_base_url),
        ] {
            if let Some(v) = env(var) {
                check_http_url(&v).map_err(|message| ConfigError::Env { var, message })?;
                *slot = v;
            }
        }
        Ok(())
    }

    /// The state directory in force: the config value, else `$STATE_DIRECTORY` (the first of
    /// them when systemd sets several), else `./switchyard-data`.
    pub fn state_dir(&self, env: EnvLookup<'_>) -> PathBuf {
        if let Some(d) = &self.storage.state_dir {
            return d.clone();
        }
        env("STATE_DIRECTORY")
            .and_then(|v| v.split(':').next().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
    }

    /// The admin socket in force: the config value, else `$RUNTIME_DIRECTORY/admin.sock`, else
    /// `admin.sock` in the state directory.
    pub fn admin_socket(&self, env: EnvLookup<'_>) -> PathBuf {
        if let Some(s) = &self.admin.socket {
            return s.clone();
        }
        match env("RUNTIME_DIRECTORY").and_then(|v| v.split(':').next().map(PathBuf::from)) {
            Some(dir) => dir.join(ADMIN_SOCKET_FILE),
            None => self.state_dir(env).join(ADMIN_SOCKET_FILE),
        }
    }

    /// Fills the environment-dependent defaults in, so the value printed by `config check` is
    /// the one the daemon would use.
    pub fn resolved(mut self, env: EnvLookup<'_>) -> Config {
        let state_dir = self.state_dir(env);
        let socket = self.admin_socket(env);
        self.storage.state_dir = Some(state_dir);
        self.admin.socket = Some(socket);
        self
    }

    /// The effective configuration as TOML, secrets masked.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

/// Line number (1-based) of byte `offset`, and the dotted key on that line if there is one.
fn locate(text: &str, offset: usize) -> (usize, Option<String>) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("").trim();
    let mut table: Option<String> = None;
    for l in before.lines() {
        let l = l.trim();
        if let Some(h) = l.strip_prefix('[') {
            table = Some(
                h.trim_start_matches('[')
                    .split(']')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            );
        }
    }
    if let Some(h) = line.strip_prefix('[') {
        let name = h
            .trim_start_matches('[')
            .split(']')
            .next()
            .unwrap_or("")
            .trim();
        return (line_no, Some(name.to_string()));
    }
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .filter(|k| !k.is_empty() && !k.starts_with('#'));
    let key = match (table, key) {
        (Some(t), Some(k)) if line_start > 0 && !t.is_empty() => Some(format!("{t}.{k}")),
        (_, k) => k,
    };
    (line_no, key)
}

fn positive_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = u64::deserialize(d)?;
    if v == 0 {
        return Err(serde::de::Error::custom("must be greater than 0"));
    }
    Ok(v)
}

fn positive_usize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let v = usize::deserialize(d)?;
    if v == 0 {
        return Err(serde::de::Error::custom("must be greater than 0"));
    }
    Ok(v)
}

fn non_empty_secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Secret>, D::Error> {
    let s = String::deserialize(d)?;
    if s.len() < 16 {
        return Err(serde::de::Error::custom(
            "a token must be at least 16 characters",
        ));
    }
    Ok(Some(Secret::new(s)))
}

/// The documented default configuration, printed by `switchyard config default`.
pub const DEFAULT_TOML: &str = r#"# Switchyard configuration. Every key is optional; the values below are the defaults.
# Durations are written like "30s", "10m", "1h 30m".

[server]
# Address of the client-facing listener (/v1, /healthz, /readyz, /metrics).
listen = "127.0.0.1:8080"
# Largest accepted request body, in bytes (16 MiB).
max_body_bytes = 16777216
# A request body must arrive whole within body_timeout of its head and, after its first 5 s,
# at body_min_rate bytes a second on average; else 408 and the connection is closed.
body_timeout = "60s"
body_min_rate = 16384
# On SIGTERM, how long in-flight requests may finish before they are cut.
shutdown_grace = "30s"
# An SSE client that would wait longer than this for its first event gets 200 headers and
# ": keep-alive" comments while it waits (failover stays invisible).
keepalive_after = "10s"
# Responses WebSocket (GET /v1/responses): time allowed for the first request, idle time before
# the connection is closed, and open connections per client key.
ws_first_message_timeout = "30s"
ws_idle_timeout = "5m"
ws_max_connections_per_key = 32
# A client that reads nothing of its answer for this long is cut, and its account slot freed.
client_write_timeout = "1m"
# A connection that has not sent a whole request head within this long is closed; one kept
# alive with no request for keepalive_idle_timeout is closed; beyond max_connections open
# connections the oldest idle one is closed, else the new one is refused.
header_read_timeout = "10s"
keepalive_idle_timeout = "75s"
max_connections = 4096
# What one client key may hold in memory at once, in MiB: its request bodies, its WebSocket
# frames and the history its WebSocket connections keep for continuations. Past it the key's
# next body or frame gets 429 and its connections forget their oldest history first.
key_memory_mib = 256

[storage]
# Where switchyard.redb and secret.key live.
# Default: $STATE_DIRECTORY when run by systemd, else ./switchyard-data
# state_dir = "/var/lib/switchyard"
# Request records older than this many days are pruned.
request_retention_days = 7
# Hourly usage totals (per key, model and account) older than this many days are pruned.
usage_retention_days = 400
# What of switchyard.redb the daemon keeps in memory, in MiB (the OS caches the file as well).
cache_mib = 8

[upstream]
# The Codex backend. Environment overrides: SWITCHYARD_UPSTREAM_BASE_URL,
# SWITCHYARD_UPSTREAM_USAGE_URL, SWITCHYARD_OAUTH_TOKEN_URL, SWITCHYARD_AUTH_BASE_URL.
base_url = "https://chatgpt.com/backend-api/codex"
usage_url = "https://chatgpt.com/backend-api/wham/usage"
oauth_token_url = "https://auth.openai.com/oauth/token"
# `account login` (device code and browser): the auth server. Env: SWITCHYARD_AUTH_BASE_URL.
auth_base_url = "https://auth.openai.com"
oauth_client_id = "app_EMoamEEZ73f0CkXaXp7hrann"
# Time to open a connection, to receive response headers, and the longest silence in a stream.
connect_timeout = "10s"
header_timeout = "1m"
stream_idle_timeout = "5m"
# Fail over an account that shows nothing (no text, reasoning or tool call) within this long;
# "0s" turns it off.
first_output_timeout = "0s"
# At most this many failovers per request for that timeout; the next one is answered (504
# first_output_timeout) instead of eating the client's time on more accounts.
first_output_switches = 1
# The longest a request may take to get a first answer from any account, failovers and waits
# included (504 request_deadline_exceeded).
request_deadline = "10m"
# client_version sent when fetching the model catalog.
client_version = "0.169.0"
# Honour HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY for upstream traffic (off: ignored).
use_env_proxy = false
# The egress proxy of accounts without their own (`account set ID --proxy URL`): http://,
# https://, socks5:// or socks5h://, with optional user:password@. Backend traffic goes through
# it as a tunnel (CONNECT or SOCKS5), HTTP and WebSocket alike.
# proxy = "socks5h://127.0.0.1:1080"
# A new, logged-in-again or long-cooled (> 30 min) account is proved before it takes requests:
# its usage, then one minimal streamed request with this model.
probe_model = "gpt-5.5"

[models]
# Extra model names clients may use, and the upstream model each stands for.
# aliases = { "gpt-5" = "gpt-5.5" }

[admin]
# The admin Unix socket (mode 0660; file permissions are its access control).
# Default: $RUNTIME_DIRECTORY/admin.sock when run by systemd, else admin.sock in the state dir.
# socket = "/run/switchyard/admin.sock"
# Set a token (16+ characters) to also serve /api/admin on the main listener, with
# "Authorization: Bearer <token>". Unset: the admin API is only on the socket.
# token = "change-me-to-a-long-random-string"
# Set a token (16+ characters) to require "Authorization: Bearer <token>" on /metrics (the admin
# token works too). Unset: any client of the listener may read /metrics, account ids included.
# metrics_token = "another-long-random-string"

[scheduling]
# These keys can also be changed live through the admin API (PUT settings; a live change is
# kept in the state directory and wins over this file until it is set back to null).
# quota_aware (most headroom first), round_robin, least_loaded, or fill_first (account priority).
strategy = "quota_aware"
# Concurrent requests per account; the adaptive limit halves on a burst 429 and grows back.
max_concurrency = 3
# A session whose account is busy waits this long for it (at most sticky_max_waiting sessions
# per account) before moving to another account.
sticky_wait = "30s"
sticky_max_waiting = 3
# A request that finds every account full waits this long (at most queue_max_waiting requests).
queue_wait = "30s"
queue_max_waiting = 100
# Accounts whose 5-hour or weekly window is used beyond this are skipped while others have room.
quota_ceiling_percent = 99.0
# How often each account's usage is polled.
usage_poll_interval = "10m"
# A session not seen for this long forgets its account.
affinity_idle_ttl = "1day"

[log]
# tracing filter; RUST_LOG overrides it.
level = "info"
# auto (JSON when stderr is not a terminal), json, or text.
format = "auto"
# One line per finished request (outcome, status, account, attempts, time) at info, target
# switchyard::access. Off, those lines are debug: the request path writes no log line unless
# something goes wrong.
access = false

# API prices per model, in USD per million tokens: with them, `switchyard usage` adds an
# "API-equivalent cost" column (what the same tokens would cost on the metered API). None are
# shipped; an example (check current prices yourself):
# [pricing."gpt-5.5"]
# input = 1.25
# cached_input = 0.125
# output = 10.0

# Rules for failures, checked in order before the built-in classification (the first that
# matches decides; a success is never matched). Match on any of: status (a code, a list, or
# "500-599"), code (the error's code or type), message_contains (any, case-insensitive),
# header (name = substring), model (a glob), transport ("http" or "websocket"). Then one or
# more of: class (quota, rate_limited, auth_expired, auth_dead, edge_challenge,
# model_unsupported, policy, caller, transient), cooldown (instead of the ladder), scope
# ("account", "session": this key's session avoids the account, "model": the account is
# avoided for this model), or pass_through = true (the client gets the answer as is, no
# failover, no effect). `switchyard report` suggests rules for frequent messages.
# [[rules]]
# name = "upstream rate limit text"
# status = [429]
# message_contains = ["upstream rate limit exceeded"]
# class = "rate_limited"
# cooldown = "1m"

[credits]
# Spend rate-limit reset credits without an operator: off, when_dry (a request would
# otherwise get 429 usage_limit_reached / 503 no_available_account), before_expiry (a spent
# account's credit would expire before its window resets anyway), or both. A credit is only
# spent on an account whose window is spent and that has two windows, and each spend exactly
# once (recorded before its call; an unanswered one is asked again with the same id).
auto = "off"
# A consume unanswered for this long is left unsettled and asked again before any other.
consume_timeout = "20s"

[warmup]
# Local times (HH:MM) at which each chosen account whose 5-hour window is not running gets one
# minimal request, so the window starts (and resets) early; never an account that is not
# ready or whose weekly window is 90% used. Off while empty.
at = []
# The accounts (id, email, label); empty: all.
accounts = []
# utc_offset = "+02:00"   # default: the system's time zone (/etc/localtime)

# Where to tell the operator (none by default). kind = webhook (a JSON POST: event, at,
# account, model, message; signed with HMAC-SHA256 in x-switchyard-signature when `secret`
# is set), ntfy (url = the topic's URL, optional token) or telegram (bot_token, chat_id,
# api_base). events (default all): account_needs_login, account_deactivated,
# account_recovered, pool_exhausted, pool_recovered, pool_headroom_low, credit_spent. Each
# incident is told once; a delivery is tried `attempts` times, waiting `backoff`, doubling.
# Secrets can be sealed with this state directory's key: `switchyard notify seal` prints
# "sealed:…" to put here instead. `switchyard notify test` sends a test message.
# [[notify]]
# kind = "webhook"
# url = "http://127.0.0.1:9000/hook"
# secret = "sealed:…"
# events = ["account_needs_login", "account_deactivated", "account_recovered",
#           "pool_exhausted", "pool_recovered", "credit_spent"]
# headroom_below = 10.0
# attempts = 6
# backoff = "2s"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_default_text_is_exactly_the_defaults() {
        let c = Config::parse(DEFAULT_TOML, Path::new("default")).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn an_empty_file_is_the_defaults() {
        assert_eq!(
            Config::parse("", Path::new("x")).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = "[server]\nlisten = \"127.0.0.1:9000\"\nlisten_port = 9\n";
        let err = Config::parse(text, Path::new("s.toml")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("s.toml:3: `server.listen_port`: unknown field"),
            "{msg}"
        );
    }

    #[test]
    fn the_store_cache_is_small_by_default_and_sized_in_mib() {
        assert_eq!(Config::default().storage.cache_bytes(), 8 << 20);
        let c = Config::parse("[storage]\ncache_mib = 64\n", Path::new("s.toml")).unwrap();
        assert_eq!(c.storage.cache_bytes(), 64 << 20);
        let err = Config::parse("[storage]\ncache_mib = 0\n", Path::new("s.toml")).unwrap_err();
        assert!(err.to_string().contains("storage.cache_mib"), "{err}");
        // A key's memory: never less than one whole body.
        assert_eq!(Config::default().server.key_memory_bytes(), 256 << 20);
        let c = Config::parse("[server]\nkey_memory_mib = 1\n", Path::new("s.toml")).unwrap();
        assert_eq!(c.server.key_memory_bytes(), 16 << 20);
        let err = Config::parse("[server]\nkey_memory_mib = 0\n", Path::new("s.toml")).unwrap_err();
        assert!(err.to_string().contains("server.key_memory_mib"), "{err}");
    }

    #[test]
    fn unknown_table_is_refused() {
        let err = Config::parse("[servr]\nlisten = \"x\"\n", Path::new("s.toml")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("s.toml:1") && msg.contains("servr"), "{msg}");
    }

    #[test]
    fn bad_values_name_key_and_line() {
        for (text, line, key, needle) in [
            (
                "[server]\nlisten = \"nope\"\n",
                2,
                "server.listen",
                "invalid",
            ),
            (
                "[server]\nmax_body_bytes = 0\n",
                2,
                "server.max_body_bytes",
                "greater than 0",
            ),
            (
                "\n[upstream]\nheader_timeout = \"soon\"\n",
                3,
                "upstream.header_timeout",
                "not a duration",
            ),
            (
                "[upstream]\nbase_url = \"ftp://x\"\n",
                2,
                "upstream.base_url",
                "http",
            ),
            (
                "[admin]\ntoken = \"short\"\n",
                2,
                "admin.token",
                "16 characters",
            ),
            (
                "[log]\nformat = \"xml\"\n",
                2,
                "log.format",
                "unknown variant",
            ),
        ] {
            let msg = Config::parse(text, Path::new("c.toml"))
                .unwrap_err()
                .to_string();
            assert!(
                msg.starts_with(&format!("c.toml:{line}: `{key}`: ")),
                "{msg}"
            );
            assert!(msg.contains(needle), "{msg}");
        }
    }

    #[test]
    fn malformed_toml_names_the_line() {
        let msg = Config::parse("[server]\nlisten = \n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("c.toml:2:"), "{msg}");
    }

    #[test]
    fn env_overrides_upstream_urls_and_rejects_bad_ones() {
        let mut c = Config::default();
        let env = |k: &str| {
            (k == ENV_UPSTREAM_BASE_URL).then(|| "http://127.0.0.1:9/backend-api/codex".to_string())
        };
        c.apply_env(&env).unwrap();
        assert_eq!(c.upstream.base_url, "http://127.0.0.1:9/backend-api/codex");
        let bad = |k: &str| (k == ENV_OAUTH_TOKEN_URL).then(|| "nope".to_string());
        let err = c.apply_env(&bad).unwrap_err().to_string();
        assert!(err.contains(ENV_OAUTH_TOKEN_URL), "{err}");
    }

    #[test]
    fn state_dir_and_socket_follow_systemd_directories() {
        let c = Config::default();
        assert_eq!(c.state_dir(&no_env), PathBuf::from(DEFAULT_STATE_DIR));
        assert_eq!(
            c.admin_socket(&no_env),
            PathBuf::from(DEFAULT_STATE_DIR).join("admin.sock")
        );
        let sd = |k: &str| match k {
            "STATE_DIRECTORY" => Some("/var/lib/switchyard:/var/lib/other".to_string()),
            "RUNTIME_DIRECTORY" => Some("/run/switchyard".to_string()),
            _ => None,
        };
        assert_eq!(c.state_dir(&sd), PathBuf::from("/var/lib/switchyard"));
        assert_eq!(
            c.admin_socket(&sd),
            PathBuf::from("/run/switchyard/admin.sock")
        );
    }

    #[test]
    fn printed_config_masks_the_token_and_parses_back() {
        let text = "[admin]\ntoken = \"0123456789abcdef-secret\"\n";
        let c = Config::parse(text, Path::new("c"))
            .unwrap()
            .resolved(&no_env);
        let printed = c.to_toml();
        assert!(!printed.contains("0123456789abcdef-secret"), "{printed}");
        assert!(printed.contains("token = \"***\""), "{printed}");
        assert!(printed.contains("state_dir"), "{printed}");
        // Everything but the masked token parses back to the same values.
        let back = Config::parse(
            &printed.replace("\"***\"", "\"0123456789abcdef-secret\""),
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(back, c);
    }
}
