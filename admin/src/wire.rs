//! The admin API's JSON shapes, shared by the daemon (which fills them) and the console and
//! CLI (which read them), and the console feed. Every field that holds one of a known set of
//! names is an enum with an `Unknown` fallback ([`crate::names`]): readers decide on values,
//! and a newer daemon's new names reach an older reader intact.

use serde::{Deserialize, Serialize};

use crate::names::wire_enum;

wire_enum! {
    /// Where an account stands.
    pub enum AccountState {
        Ready => "ready",
        Cooling => "cooling",
        HalfOpen => "half_open",
        /// Imported or logged in again, and not yet proved by one request.
        Probing => "probing",
        NeedsReauth => "needs_reauth",
        Disabled => "disabled",
    }
}

wire_enum! {
    /// How an attempt ended, as the classifier judged it (also why an account is not ready).
    pub enum Class {
        Success => "success",
        Quota => "quota",
        RateLimited => "rate_limited",
        AuthExpired => "auth_expired",
        AuthDead => "auth_dead",
        EdgeChallenge => "edge_challenge",
        ModelUnsupported => "model_unsupported",
        Policy => "policy",
        Caller => "caller",
        Transient => "transient",
        ClientCancelled => "client_cancelled",
        ClientStalled => "client_stalled",
        Abandoned => "abandoned",
    }
}

wire_enum! {
    /// How far an attempt got before it failed.
    pub enum Phase {
        Connect => "connect",
        PreHeaders => "pre_headers",
        PreCommit => "pre_commit",
        MidStream => "mid_stream",
    }
}

wire_enum! {
    /// How a request ended for its client.
    pub enum Outcome {
        Success => "success",
        Incomplete => "incomplete",
        Failed => "failed",
        StreamError => "stream_error",
        CallerError => "caller_error",
        QuotaExhausted => "quota_exhausted",
        NoAccount => "no_account",
        ModelNotFound => "model_not_found",
        ClientCancelled => "client_cancelled",
        ClientStalled => "client_stalled",
        PoolBusy => "pool_busy",
        PreviousResponseNotFound => "previous_response_not_found",
        PolicyRefused => "policy_refused",
        DeadlineExceeded => "deadline_exceeded",
        FirstOutputTimeout => "first_output_timeout",
        ShuttingDown => "shutting_down",
        KeyRevoked => "key_revoked",
        KeyExpired => "key_expired",
        ModelNotAllowed => "model_not_allowed",
        TierNotAllowed => "tier_not_allowed",
        KeyRateLimited => "key_rate_limited",
        KeyBudgetExhausted => "key_budget_exhausted",
        KeyConcurrencyExceeded => "key_concurrency_exceeded",
    }
}

wire_enum! {
    /// How a turn reached the backend.
    pub enum Transport {
        /// HTTP/SSE.
        Http => "http",
        WsReused => "ws_reused",
        WsConnected => "ws_connected",
        WsRejected => "ws_rejected",
        HttpWsBudgetExhausted => "http_ws_budget_exhausted",
        HttpBreakerOpen => "http_breaker_open",
        HttpWsFailed => "http_ws_failed",
    }
}

wire_enum! {
    /// Where the answer that ended a request came from.
    pub enum TerminalSource {
        /// The backend's own, forwarded.
        Upstream => "upstream",
        /// Made by the gateway (`upstream_stream_error`, an exhaustion answer, a refusal, …).
        Synthetic => "synthetic",
        /// The client left or stopped reading first.
        Nothing => "none",
    }
}

wire_enum! {
    /// Why an account was left out of a request's candidates.
    pub enum SkipReason {
        Disabled => "disabled",
        NeedsReauth => "needs_reauth",
        Cooling => "cooling",
        /// Half-open, with its one probe request already running.
        Probing => "half_open_probe",
        /// Not yet proved.
        Unproven => "probing",
        ModelUnsupported => "model_unsupported",
        NoTokens => "no_tokens",
        QuotaCeiling => "quota_ceiling",
        SessionExcluded => "session_excluded",
        PolicyExcluded => "policy_excluded",
        Full => "full",
        Draining => "draining",
    }
}

wire_enum! {
    /// Which queue a request waited in.
    pub enum QueueKind {
        /// A sticky session waiting for its own account.
        Account => "account",
        Pool => "pool",
    }
}

wire_enum! {
    /// How a wait for a slot ended.
    pub enum QueueOutcome {
        Acquired => "acquired",
        Timeout => "timeout",
        QueueFull => "queue_full",
        ClientLeft => "client_left",
        Withdrawn => "withdrawn",
    }
}

wire_enum! {
    /// The upstream WebSocket breaker.
    pub enum BreakerState {
        Closed => "closed",
        Open => "open",
        HalfOpen => "half_open",
    }
}

wire_enum! {
    /// What kind of login an account has.
    pub enum Login {
        /// A ChatGPT login: refreshed before its access token expires.
        Chatgpt => "chatgpt",
        /// A workspace access token: used until it expires, never refreshed.
        AccessToken => "access_token",
    }
}

wire_enum! {
    /// A token budget's rolling window.
    pub enum BudgetWindow {
        FiveHours => "5h",
        Day => "day",
        Week => "week",
    }
}

/// What session affinity decided for a request: `reused`, `new_bind`, `rebound(<why>)` (the
/// skip reason or failure class that moved the session) or `none`; empty in records written
/// before it was kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Affinity {
    /// The session's bound account served it.
    Reused,
    /// The session had no account; it is now bound to the one that served it.
    NewBind,
    /// The session moved to another account, and why.
    Rebound(String),
    /// No session key.
    None,
    /// A name this side does not know (or none), as it came.
    Unknown(String),
}

impl Default for Affinity {
    fn default() -> Affinity {
        Affinity::Unknown(String::new())
    }
}

impl Affinity {
    /// The value a name stands for.
    pub fn from_name(name: &str) -> Affinity {
        match name {
            "reused" => Affinity::Reused,
            "new_bind" => Affinity::NewBind,
            "none" => Affinity::None,
            other => match other
                .strip_prefix("rebound(")
                .and_then(|r| r.strip_suffix(')'))
            {
                Some(why) => Affinity::Rebound(why.to_string()),
                None => Affinity::Unknown(other.to_string()),
            },
        }
    }

    /// The name on the wire.
    pub fn name(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Affinity::Reused => "reused".into(),
            Affinity::NewBind => "new_bind".into(),
            Affinity::Rebound(why) => format!("rebound({why})").into(),
            Affinity::None => "none".into(),
            Affinity::Unknown(name) => name.as_str().into(),
        }
    }
}

impl From<&str> for Affinity {
    fn from(name: &str) -> Affinity {
        Affinity::from_name(name)
    }
}

impl std::fmt::Display for Affinity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl Serialize for Affinity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for Affinity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Affinity, D::Error> {
        Ok(Affinity::from_name(&String::deserialize(d)?))
    }
}

/// Version of the admin API and console feed; a console refuses a daemon of another one.
pub const PROTOCOL_VERSION: u32 = 1;

/// `POST /reload`: what a re-read configuration changed at once, and what waits for a
/// restart (dotted keys, e.g. `scheduling`, `server.listen`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reloaded {
    pub applied: Vec<String>,
    pub restart_needed: Vec<String>,
}

/// A row left out because it cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantinedRow {
    pub table: String,
    pub key: String,
    pub error: String,
}

/// `GET /doctor`: the daemon's view of its store, for `switchyard doctor`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StoreReport {
    pub state_dir: String,
    /// Rows read per table by a full scan just now.
    pub rows: Vec<(String, u64)>,
    /// Every row left out since the daemon started (the scan's included).
    pub quarantined: Vec<QuarantinedRow>,
    /// Accounts with no tokens stored.
    pub without_tokens: Vec<String>,
    /// The id of the key the store is sealed with.
    pub key_id: String,
}

/// `GET /status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub protocol: u32,
    pub pid: u32,
    pub uptime_s: u64,
    /// The client-facing listener.
    pub listen: String,
    /// Number of accounts in the pool.
    pub accounts: usize,
    /// Accounts per state (`ready`, `disabled`, ...).
    #[serde(default)]
    pub accounts_by_state: std::collections::BTreeMap<String, usize>,
    pub in_flight: u64,
    pub waiting: u64,
    /// The scheduling strategy in force.
    #[serde(default)]
    pub strategy: String,
    /// Pool-wide error rates over the last 20 and 60 minutes.
    #[serde(default)]
    pub error_rates: Vec<ErrorRates>,
}

/// Error rates over one window: the share of requests whose client got an error, and of
/// upstream errors (pool-wide per request; for an account per attempt on it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRates {
    pub window_minutes: u64,
    /// Requests counted (for an account: those that ended on it).
    pub requests: u64,
    /// Attempts counted.
    pub attempts: u64,
    pub client_error_rate: Option<f64>,
    pub upstream_error_rate: Option<f64>,
}

/// One account as the admin API shows it. Never carries a token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    pub id: String,
    pub label: String,
    pub email: Option<String>,
    pub plan: Option<String>,
    pub chatgpt_account_id: String,
    pub enabled: bool,
    pub state: AccountState,
    /// RFC 3339.
    pub created_at: String,
    /// Why it is not ready (the class of the failure that put it there).
    #[serde(default)]
    pub reason: Option<Class>,
    /// What happened, in words, when that needs the operator (why it needs a new login).
    #[serde(default)]
    pub detail: Option<String>,
    /// When a cooling account half-opens (RFC 3339).
    #[serde(default)]
    pub cooldown_until: Option<String>,
    #[serde(default)]
    pub cooldown_remaining_s: Option<u64>,
    /// Highest step reached on a cooldown ladder (0 = not escalated).
    #[serde(default)]
    pub level: u8,
    #[serde(default)]
    pub last_error: Option<String>,
    /// Requests running on the account now.
    #[serde(default)]
    pub in_flight: u32,
    /// The adaptive concurrency limit now, in slots.
    #[serde(default)]
    pub limit: u32,
    /// The adaptive limit before rounding down (it grows by 1/limit per success).
    #[serde(default)]
    pub limit_exact: f64,
    /// The account's own cap, when it overrides the pool's `max_concurrency`.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Lower goes first under `fill_first`.
    #[serde(default)]
    pub priority: i32,
    /// Sessions waiting for this account's slot.
    #[serde(default)]
    pub waiting: usize,
    /// How long the oldest of them has waited (ms).
    #[serde(default)]
    pub oldest_wait_ms: Option<u64>,
    /// Takes no new sessions; serves the ones bound to it.
    #[serde(default)]
    pub draining: bool,
    /// Models the backend said this account may not use, for now (cleared by clear-cooldown
    /// and after an hour).
    #[serde(default)]
    pub unsupported_models: Vec<String>,
    /// The last usage windows the backend reported.
    #[serde(default)]
    pub quota: Option<Quota>,
    /// Its own egress proxy, password hidden (`socks5h://user:***@host:1080`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// The kind of login (empty from a daemon that did not say).
    #[serde(default)]
    pub login: Login,
    /// When its access token expires (RFC 3339), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires_at: Option<String>,
    /// Its data-residency workspace's own backend origin, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Why workspace routing could not be discovered, when it could not (the configured
    /// origin is used meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_error: Option<String>,
    /// Its error rates over the last 20 and 60 minutes (empty where the daemon did not say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_rates: Vec<ErrorRates>,
}

/// An account's usage windows: primary is the 5-hour window, secondary the weekly one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quota {
    pub primary_used_percent: Option<f64>,
    /// RFC 3339.
    pub primary_reset_at: Option<String>,
    pub secondary_used_percent: Option<f64>,
    pub secondary_reset_at: Option<String>,
    pub plan: Option<String>,
    /// When the backend reported it (RFC 3339).
    pub observed_at: Option<String>,
    /// Rate-limit reset credits the account can spend, as its last usage poll said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_credits: Option<u64>,
    /// When the soonest of them expires (RFC 3339), from the credits list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_credit_expires_at: Option<String>,
}

/// `POST /accounts`: the account, and whether it was new or updated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportedAccount {
    #[serde(flatten)]
    pub account: Account,
    pub created: bool,
    /// Why the import changed nothing: the file's login is the account's own, or older.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchanged: Option<String>,
}

/// `POST /accounts/{id}/export`: the login as a Codex `auth.json`, and the account
/// as it is now (disabled unless kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedAccount {
    pub auth: serde_json::Value,
    pub account: Account,
}

/// `PUT /accounts/{id}`: what to change of an account; an absent field stays as it
/// is, `null` removes the account's own value (its own concurrency cap, its own proxy). A
/// field this side does not know is refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Lower goes first under `fill_first`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// At least 1.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_concurrency: Option<Option<u32>>,
    /// An egress proxy URL (`http://`, `https://`, `socks5://`, `socks5h://`).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub proxy: Option<Option<String>>,
}

impl AccountPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == AccountPatch::default()
    }
}

/// An operator action on one account: `POST /accounts/{id}/{action}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountAction {
    Enable,
    Disable,
    /// Takes no new sessions; serves the ones bound to it.
    Drain,
    Undrain,
    ClearCooldown,
    /// Refreshes its tokens now.
    Refresh,
    /// Polls its usage now (and, half-open or unproven, runs its probe).
    Probe,
}

impl AccountAction {
    /// The action's path segment.
    pub fn segment(self) -> &'static str {
        match self {
            AccountAction::Enable => "enable",
            AccountAction::Disable => "disable",
            AccountAction::Drain => "drain",
            AccountAction::Undrain => "undrain",
            AccountAction::ClearCooldown => "clear-cooldown",
            AccountAction::Refresh => "refresh",
            AccountAction::Probe => "probe",
        }
    }
}

/// One client key as listed. The key itself is shown only once, at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub id: String,
    pub name: String,
    /// The key's first characters, to recognise it.
    pub prefix: String,
    pub enabled: bool,
    pub created_at: String,
    pub revoked_at: Option<String>,
    /// What the key may do; every limit absent means unlimited.
    #[serde(default)]
    pub policy: KeyPolicy,
}

/// A client key's policy. Absent limits do not apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPolicy {
    /// Model globs (`gpt-5*`) the key may use; empty means every model.
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Requests per rolling minute.
    #[serde(default)]
    pub rpm: Option<u32>,
    /// Input + output tokens per rolling window.
    #[serde(default)]
    pub tokens_per_5h: Option<u64>,
    #[serde(default)]
    pub tokens_per_day: Option<u64>,
    #[serde(default)]
    pub tokens_per_week: Option<u64>,
    /// RFC 3339; the key stops authenticating requests then (401 `key_expired`).
    #[serde(default)]
    pub expires_at: Option<String>,
    #[serde(default)]
    pub note: Option<String>,
    /// Service tiers (`default`, `priority`, …) a request may ask for; empty means every one.
    #[serde(default)]
    pub tiers: Vec<String>,
}

/// A change to a key's policy (`PATCH /keys/{id}`, and the policy part of a
/// creation): an absent field stays as it is, `null` removes the limit, a value sets it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPolicyPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Service tiers; an empty list allows every one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<Vec<String>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_concurrency: Option<Option<u32>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub rpm: Option<Option<u32>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tokens_per_5h: Option<Option<u64>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tokens_per_day: Option<Option<u64>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tokens_per_week: Option<Option<u64>>,
    /// RFC 3339, or `null` for a key that never expires.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub expires_at: Option<Option<String>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub note: Option<Option<String>>,
}

impl KeyPolicyPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == KeyPolicyPatch::default()
    }
}

/// A field that is present in the JSON: `null` becomes `Some(None)`, a value `Some(Some(v))`.
fn present<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// One client key as the console shows it, live.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyLive {
    pub id: String,
    pub name: String,
    pub enabled: bool,
    /// Requests of this key running now.
    pub in_flight: u32,
    pub max_concurrency: Option<u32>,
    /// Requests waiting in the key's own queue.
    #[serde(default)]
    pub waiting: usize,
    /// Requests admitted in the last 60 s.
    pub rpm: u32,
    pub rpm_limit: Option<u32>,
    /// Input + output tokens since 00:00 UTC.
    pub tokens_today: u64,
    /// Each token budget the key has, with what it used of it.
    #[serde(default)]
    pub budgets: Vec<Budget>,
    /// The last refusal (`key_rate_limited`, `key_budget_exhausted`, …) and when (unix ms).
    #[serde(default)]
    pub last_refusal: Option<String>,
    #[serde(default)]
    pub last_refusal_ms: Option<u64>,
}

/// A token budget over a rolling window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    pub window: BudgetWindow,
    pub limit: u64,
    pub used: u64,
    /// When enough of the window's tokens age out for the key to be under its limit again;
    /// `None` while it is under.
    pub resets_in_s: Option<u64>,
}

/// One hour of one key's use of one model on one account (`GET /usage`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageBucket {
    /// The hour's start, unix seconds.
    pub hour: u64,
    pub key_id: String,
    /// The key's name (its id when the key is gone).
    pub key: String,
    pub model: String,
    /// The `chatgpt_account_id` that served (empty for requests no account served).
    pub account: String,
    pub requests: u64,
    /// Requests whose client got an error.
    pub errors: u64,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    /// Summed request durations.
    pub duration_ms: u64,
}

/// `POST /keys`: the new key, with its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedKey {
    #[serde(flatten)]
    pub info: Key,
    /// The client key (`sk-sy-…`), shown this once.
    pub key: String,
}

/// `POST /keys` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateKey {
    pub name: String,
    #[serde(default)]
    pub policy: KeyPolicyPatch,
}

/// Error body of every admin and `/v1` error: `{"error": {...}}`, the OpenAI shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub code: Option<String>,
    #[serde(default)]
    pub param: Option<String>,
}

/// One attempt of a request, in its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// The account's `chatgpt_account_id`.
    pub account: String,
    pub class: Class,
    pub status: Option<u16>,
    pub phase: Option<Phase>,
    pub ms: u64,
    #[serde(default)]
    pub error: Option<String>,
    /// The operator rule (`[[rules]]`) that judged it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// Token counts of a response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

/// `GET /requests`: one `/v1` request, with its attempt chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: String,
    /// RFC 3339 with milliseconds.
    pub started_at: String,
    /// The client key's name.
    pub key: String,
    pub model: String,
    pub stream: bool,
    pub outcome: Outcome,
    /// The HTTP status the client got (200 for a stream that later failed).
    pub status: u16,
    /// The `chatgpt_account_id` that served it, if any.
    pub account: Option<String>,
    pub attempts: Vec<Attempt>,
    pub ttft_ms: Option<u64>,
    pub duration_ms: u64,
    pub usage: Option<Usage>,
    #[serde(default)]
    pub path: String,
    /// A short hash of the session key, if the request had one.
    #[serde(default)]
    pub session: Option<String>,
    /// The accounts the request could use, in the order they were to be tried
    /// (`chatgpt_account_id`s).
    #[serde(default)]
    pub candidate_pool: Vec<String>,
    /// Accounts left out, and why.
    #[serde(default)]
    pub skipped: Vec<Skip>,
    #[serde(default)]
    pub affinity: Affinity,
    /// The wait for a slot, if there was one.
    #[serde(default)]
    pub queue: Option<QueueWait>,
    /// Prompt-cache hits of the serving attempt.
    #[serde(default)]
    pub cached_tokens: Option<u64>,
    /// How the turn reached the backend (empty in records written before it was kept).
    #[serde(default)]
    pub transport: Transport,
    /// A turn of a downstream WebSocket connection.
    #[serde(default)]
    pub ws: bool,
    /// Time to open an upstream WebSocket, when one was opened for this turn.
    #[serde(default)]
    pub ws_connect_ms: Option<u64>,
    /// Where the answer that ended the request came from; null in records written before it
    /// was kept.
    #[serde(default)]
    pub terminal_source: Option<TerminalSource>,
    /// The `service_tier` the request asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// The `service_tier` the answer claimed: what the backend says, not proof of what ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_tier: Option<String>,
    /// The reset-credit spend this request's need made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credit_spend: Option<CreditSpend>,
}

/// A spend of a rate-limit reset credit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreditSpend {
    /// The account's `chatgpt_account_id` (or id).
    pub account: String,
    pub redeem_id: String,
    /// `reset`, `already_redeemed`, `nothing_to_reset`, `no_credit`, `failed` or `unsettled`.
    pub outcome: String,
    pub windows_reset: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why it was spent: `when_dry`, `before_expiry` or `operator`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub need: Option<String>,
    /// When it started (RFC 3339), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// An account left out of a request's candidates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skip {
    pub account: String,
    pub reason: SkipReason,
}

/// A request's wait for a slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueWait {
    pub queue: QueueKind,
    pub outcome: QueueOutcome,
    pub wait_ms: u64,
}

/// One message of the console feed (`GET /console`, WebSocket). The first is always
/// a snapshot; then updates follow at most 10 times a second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedMessage {
    /// [`PROTOCOL_VERSION`] of the daemon.
    pub protocol: u32,
    /// Messages this subscriber missed so far (always 0 for a live subscriber: one that falls
    /// behind is disconnected and reconnects to a fresh snapshot; the daemon's total is in
    /// `Feed::dropped_subscribers`).
    pub dropped: u64,
    /// Sequence number of this message on this subscription.
    pub seq: u64,
    #[serde(flatten)]
    pub body: FeedBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FeedBody {
    /// The whole state.
    Snapshot(Feed),
    /// What changed since the previous message: the current status and accounts, and the
    /// requests finished since.
    Update(Feed),
}

/// The state the console shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Feed {
    pub status: Status,
    pub accounts: Vec<Account>,
    /// Requests finished (newest first): the recent ones in a snapshot, the new ones in an
    /// update.
    pub requests: Vec<RequestRecord>,
    /// Sessions bound per account (`chatgpt_account_id` -> count).
    #[serde(default)]
    pub sessions: std::collections::BTreeMap<String, usize>,
    /// Idle upstream WebSockets kept for reuse.
    #[serde(default)]
    pub ws_pool_idle: usize,
    /// The same per account (`chatgpt_account_id` -> idle sockets).
    #[serde(default)]
    pub ws_pool: std::collections::BTreeMap<String, usize>,
    /// Requests waiting for a slot on any of their candidates.
    #[serde(default)]
    pub pool_waiting: usize,
    /// How long the oldest of them has waited (ms).
    #[serde(default)]
    pub pool_oldest_wait_ms: Option<u64>,
    /// The daemon's clock when it sent this (unix ms): the console measures windows and
    /// countdowns against it.
    #[serde(default)]
    pub now_ms: u64,
    #[serde(default)]
    pub breaker: BreakerState,
    /// Subscribers the daemon disconnected for falling behind, since it started.
    #[serde(default)]
    pub dropped_subscribers: u64,
    /// The client keys, live (revoked ones left out).
    #[serde(default)]
    pub keys: Vec<KeyLive>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_reads_null_as_clear_and_absence_as_keep() {
        let patch: KeyPolicyPatch =
            serde_json::from_str(r#"{"rpm": null, "tokens_per_5h": 5}"#).unwrap();
        assert_eq!(patch.rpm, Some(None));
        assert_eq!(patch.tokens_per_5h, Some(Some(5)));
        assert_eq!(patch.max_concurrency, None);
        let back = serde_json::to_value(&patch).unwrap();
        assert_eq!(back, serde_json::json!({"rpm": null, "tokens_per_5h": 5}));
    }

    #[test]
    fn an_account_patch_clears_with_null_and_refuses_an_unknown_field() {
        let patch: AccountPatch =
            serde_json::from_str(r#"{"proxy": null, "priority": 3}"#).unwrap();
        assert_eq!(patch.proxy, Some(None));
        assert_eq!((patch.priority, patch.max_concurrency), (Some(3), None));
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            serde_json::json!({"priority": 3, "proxy": null})
        );
        let err = serde_json::from_str::<AccountPatch>(r#"{"labl": "x"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `labl`"), "{err}");
        assert!(AccountPatch::default().is_empty());
    }

    #[test]
    fn affinity_names_round_trip() {
        for name in [
            "reused",
            "new_bind",
            "rebound(quota)",
            "none",
            "",
            "sideways",
        ] {
            let a: Affinity = serde_json::from_value(serde_json::json!(name)).unwrap();
            assert_eq!(serde_json::to_value(&a).unwrap(), serde_json::json!(name));
        }
        assert_eq!(
            Affinity::from_name("rebound(half_open_probe)"),
            Affinity::Rebound("half_open_probe".into())
        );
        assert_eq!(
            Affinity::from_name("sideways"),
            Affinity::Unknown("sideways".into())
        );
    }

    #[test]
    fn a_record_of_a_newer_daemon_reads_with_its_new_names_kept() {
        let record = serde_json::json!({
            "id": "req_1", "started_at": "2026-12-01T00:00:00.000Z", "key": "k", "model": "m",
            "stream": true, "outcome": "some_new_outcome", "status": 200, "account": null,
            "attempts": [{"account": "a", "class": "a_new_class", "status": 500,
                          "phase": "mid_stream", "ms": 3}],
            "ttft_ms": null, "duration_ms": 5, "usage": null, "transport": "h3",
        });
        let r: RequestRecord = serde_json::from_value(record.clone()).unwrap();
        assert_eq!(r.outcome, Outcome::Unknown("some_new_outcome".into()));
        assert_eq!(r.attempts[0].class, Class::Unknown("a_new_class".into()));
        assert_eq!(r.attempts[0].phase, Some(Phase::MidStream));
        assert_eq!(r.affinity, Affinity::default());
        let back = serde_json::to_value(&r).unwrap();
        assert_eq!(back["outcome"], "some_new_outcome");
        assert_eq!(back["transport"], "h3");
    }
}
