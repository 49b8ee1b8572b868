//! The admin API's JSON shapes, shared by the daemon (which fills them) and the console and
//! CLI (which read them), and the console feed.

use serde::{Deserialize, Serialize};

/// Version of the admin API and console feed; a console refuses a daemon of another one.
pub const PROTOCOL_VERSION: u32 = 1;

/// `POST /api/admin/reload`: what a re-read configuration changed at once, and what waits for a
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

/// `GET /api/admin/doctor`: the daemon's view of its store, for `switchyard doctor`.
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

/// `GET /api/admin/status`.
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
    /// `ready | cooling | half_open | needs_reauth | disabled`.
    pub state: String,
    /// RFC 3339.
    pub created_at: String,
    /// Why it is not ready (`quota`, `transient`, `auth_dead`, …).
    #[serde(default)]
    pub reason: Option<String>,
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
}

/// `POST /api/admin/accounts`: the account, and whether it was new or updated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportedAccount {
    #[serde(flatten)]
    pub account: Account,
    pub created: bool,
}

/// `POST /api/admin/accounts/{id}/export`: the login as a Codex `auth.json`, and the account
/// as it is now (disabled unless kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedAccount {
    pub auth: serde_json::Value,
    pub account: Account,
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
}

/// A change to a key's policy (`PATCH /api/admin/keys/{id}`, and the policy part of a
/// creation): an absent field stays as it is, `null` removes the limit, a value sets it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPolicyPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
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
    /// `5h`, `day` or `week`.
    pub window: String,
    pub limit: u64,
    pub used: u64,
    /// When enough of the window's tokens age out for the key to be under its limit again;
    /// `None` while it is under.
    pub resets_in_s: Option<u64>,
}

/// One hour of one key's use of one model on one account (`GET /api/admin/usage`).
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

/// `POST /api/admin/keys`: the new key, with its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedKey {
    #[serde(flatten)]
    pub info: Key,
    /// The client key (`sk-sy-…`), shown this once.
    pub key: String,
}

/// `POST /api/admin/keys` body.
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
    /// `success, quota, rate_limited, auth_expired, auth_dead, edge_challenge, model_unsupported,
    /// caller, transient, client_cancelled`.
    pub class: String,
    pub status: Option<u16>,
    /// `connect | pre_headers | pre_commit | mid_stream`.
    pub phase: Option<String>,
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

/// `GET /api/admin/requests`: one `/v1` request, with its attempt chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: String,
    /// RFC 3339 with milliseconds.
    pub started_at: String,
    /// The client key's name.
    pub key: String,
    pub model: String,
    pub stream: bool,
    /// `success | incomplete | failed | stream_error | caller_error | quota_exhausted |
    /// no_account | model_not_found | client_cancelled`.
    pub outcome: String,
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
    /// Accounts left out, and why (`cooling`, `needs_reauth`, `disabled`, `model_unsupported`,
    /// `quota_ceiling`, `session_excluded`, `full`, …).
    #[serde(default)]
    pub skipped: Vec<Skip>,
    /// `reused | new_bind | rebound(reason) | none`.
    #[serde(default)]
    pub affinity: String,
    /// The wait for a slot, if there was one.
    #[serde(default)]
    pub queue: Option<QueueWait>,
    /// Prompt-cache hits of the serving attempt.
    #[serde(default)]
    pub cached_tokens: Option<u64>,
    /// How the turn reached the backend: `http` (SSE), or for WebSocket turns one of
    /// `ws_reused | ws_connected | http | http_ws_budget_exhausted | http_breaker_open |
    /// http_ws_failed`.
    #[serde(default)]
    pub transport: String,
    /// A turn of a downstream WebSocket connection.
    #[serde(default)]
    pub ws: bool,
    /// Time to open an upstream WebSocket, when one was opened for this turn.
    #[serde(default)]
    pub ws_connect_ms: Option<u64>,
    /// Where the answer that ended the request came from: `upstream` (the backend's own,
    /// forwarded), `synthetic` (made by the gateway: `upstream_stream_error`, an exhaustion
    /// answer, a key's refusal, …) or `none` (the client left or stopped reading first);
    /// null in records written before it was kept.
    #[serde(default)]
    pub terminal_source: Option<String>,
}

/// An account left out of a request's candidates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skip {
    pub account: String,
    pub reason: String,
}

/// A request's wait for a slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueWait {
    /// `account` (a sticky session waiting for its account) or `pool`.
    pub queue: String,
    /// `acquired | timeout | queue_full | client_left`.
    pub outcome: String,
    pub wait_ms: u64,
}

/// One message of the console feed (`GET /api/admin/console`, WebSocket). The first is always
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
    /// `closed | open | half_open`.
    #[serde(default)]
    pub breaker: String,
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
}
