//! The shapes persisted in the store, each with its version history (see `codec.rs`). These are
//! the store's own types: the domain converts to and from them (in `fleet` and `telemetry`),
//! and the admin API's wire types never reach the disk. Enums are stored by name.
//!
//! An old version's shape is kept here, frozen, for as long as a file may hold it: its decoder
//! turns it into the current shape. Never change a shape that was released; add a version.

use serde::{Deserialize, Serialize};

use super::codec::{CodecError, Versioned, body, unknown, versioned_once};
use super::secrets::Secret;

/// An upstream ChatGPT account, without its tokens. Version 1 (0.1.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountRecord {
    /// Short stable id derived from the ChatGPT account and user ids.
    pub id: String,
    pub label: String,
    pub email: Option<String>,
    pub plan: Option<String>,
    pub chatgpt_account_id: String,
    pub chatgpt_user_id: Option<String>,
    pub enabled: bool,
    /// Lower goes first under the `fill_first` strategy.
    pub priority: i32,
    /// Per-account cap on concurrent requests; `None` uses the pool default.
    pub max_concurrency: Option<u32>,
    /// Unix seconds.
    pub created_at: u64,
    pub updated_at: u64,
}

/// An account's OAuth tokens; stored only sealed. Version 1 (0.1.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountSecrets {
    pub access_token: Secret,
    pub refresh_token: Secret,
    pub id_token: Secret,
    /// `exp` of the access token (unix seconds) when it could be read.
    pub access_expires_at: Option<u64>,
    /// When the tokens were last obtained (unix seconds).
    pub refreshed_at: u64,
}

/// A client key: only its SHA-256 is kept. Version 1 (0.1.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientKeyRecord {
    pub id: String,
    pub name: String,
    /// The first characters of the key, to recognise it in lists (`sk-sy-AbCd`).
    pub prefix: String,
    pub sha256: [u8; 32],
    pub enabled: bool,
    pub created_at: u64,
    pub revoked_at: Option<u64>,
}

/// The entries of a TTL map (session affinity, response ownership), least recently used
/// first. Version 1 (0.1.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord(pub Vec<SnapshotRow>);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRow {
    pub key: String,
    pub value: String,
    pub created_ms: u64,
    pub touched_ms: u64,
}

versioned_once!(
    AccountRecord => "account",
    AccountSecrets => "account tokens",
    ClientKeyRecord => "client key",
    SnapshotRecord => "snapshot",
);

// ---- account health ------------------------------------------------------------------------

/// An account's health, written through on every transition.
///
/// Version 2 (0.2.0): the state by name, and why a `needs_reauth` account needs a new login.
/// Version 1 (0.1.0): the state as an enum index, no `reauth`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthRecord {
    /// `ready`, `cooling` or `needs_reauth`.
    pub state: String,
    /// The failure class that put the account in its state (`quota`, `transient`, …).
    pub reason: Option<String>,
    /// Why it needs a new login (`refresh_token_reused`, …).
    pub reauth: Option<String>,
    /// Unix ms; meaningful while cooling.
    pub cooldown_until_ms: u64,
    pub levels: [u8; 3],
    pub last_failure_ms: u64,
    pub clean_successes: u8,
    pub last_error: Option<String>,
    pub last_error_ms: u64,
}

#[derive(Deserialize)]
enum HealthStateV1 {
    Ready,
    Cooling,
    NeedsReauth,
}

#[derive(Deserialize)]
struct HealthRecordV1 {
    state: HealthStateV1,
    reason: Option<String>,
    cooldown_until_ms: u64,
    levels: [u8; 3],
    last_failure_ms: u64,
    clean_successes: u8,
    last_error: Option<String>,
    last_error_ms: u64,
}

impl Versioned for HealthRecord {
    const NAME: &'static str = "account health";
    const VERSION: u8 = 2;
    fn decode_version(version: u8, b: &[u8]) -> Result<Self, CodecError> {
        match version {
            2 => body(b),
            1 => {
                let v: HealthRecordV1 = body(b)?;
                Ok(HealthRecord {
                    state: match v.state {
                        HealthStateV1::Ready => "ready",
                        HealthStateV1::Cooling => "cooling",
                        HealthStateV1::NeedsReauth => "needs_reauth",
                    }
                    .into(),
                    reason: v.reason,
                    reauth: None,
                    cooldown_until_ms: v.cooldown_until_ms,
                    levels: v.levels,
                    last_failure_ms: v.last_failure_ms,
                    clean_successes: v.clean_successes,
                    last_error: v.last_error,
                    last_error_ms: v.last_error_ms,
                })
            }
            found => Err(unknown::<Self>(found)),
        }
    }
}

// ---- settings ------------------------------------------------------------------------------

/// Operators' live changes to the scheduling settings (a patch over the config file).
///
/// Version 2 (0.2.0): the strategy by name. Version 1 (0.1.0): by its enum index.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SettingsRecord {
    pub strategy: Option<String>,
    pub max_concurrency: Option<u32>,
    pub sticky_wait: Option<String>,
    pub sticky_max_waiting: Option<u64>,
    pub queue_wait: Option<String>,
    pub queue_max_waiting: Option<u64>,
    pub quota_ceiling_percent: Option<f64>,
    pub usage_poll_interval: Option<String>,
    pub affinity_idle_ttl: Option<String>,
}

#[derive(Deserialize)]
enum StrategyV1 {
    QuotaAware,
    RoundRobin,
    LeastLoaded,
    FillFirst,
}

#[derive(Deserialize)]
struct SettingsRecordV1 {
    strategy: Option<StrategyV1>,
    max_concurrency: Option<u32>,
    sticky_wait: Option<String>,
    sticky_max_waiting: Option<u64>,
    queue_wait: Option<String>,
    queue_max_waiting: Option<u64>,
    quota_ceiling_percent: Option<f64>,
    usage_poll_interval: Option<String>,
    affinity_idle_ttl: Option<String>,
}

impl Versioned for SettingsRecord {
    const NAME: &'static str = "settings";
    const VERSION: u8 = 2;
    fn decode_version(version: u8, b: &[u8]) -> Result<Self, CodecError> {
        match version {
            2 => body(b),
            1 => {
                let v: SettingsRecordV1 = body(b)?;
                Ok(SettingsRecord {
                    strategy: v.strategy.map(|s| {
                        match s {
                            StrategyV1::QuotaAware => "quota_aware",
                            StrategyV1::RoundRobin => "round_robin",
                            StrategyV1::LeastLoaded => "least_loaded",
                            StrategyV1::FillFirst => "fill_first",
                        }
                        .into()
                    }),
                    max_concurrency: v.max_concurrency,
                    sticky_wait: v.sticky_wait,
                    sticky_max_waiting: v.sticky_max_waiting,
                    queue_wait: v.queue_wait,
                    queue_max_waiting: v.queue_max_waiting,
                    quota_ceiling_percent: v.quota_ceiling_percent,
                    usage_poll_interval: v.usage_poll_interval,
                    affinity_idle_ttl: v.affinity_idle_ttl,
                })
            }
            found => Err(unknown::<Self>(found)),
        }
    }
}

// ---- request records -----------------------------------------------------------------------

/// One `/v1` request with its attempt chain. The row's key is the record's key (unix ms << 16
/// | a sequence number), so the id is not stored.
///
/// Version 2 (0.2.0): the start as unix ms, no id, no `cached_tokens` (it is in `usage`).
/// Version 1 (0.1.0): the admin API's JSON shape of the time, in postcard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRow {
    pub started_ms: u64,
    /// The client key's name.
    pub key_name: String,
    pub model: String,
    pub path: String,
    pub stream: bool,
    pub ws: bool,
    pub outcome: String,
    pub status: u16,
    pub account: Option<String>,
    pub attempts: Vec<AttemptRow>,
    pub ttft_ms: Option<u64>,
    pub duration_ms: u64,
    pub usage: Option<UsageRow>,
    pub session: Option<String>,
    pub candidate_pool: Vec<String>,
    pub skipped: Vec<SkipRow>,
    /// `reused`, `new_bind`, `rebound(<why>)` or `none`.
    pub affinity: String,
    pub queue: Option<QueueRow>,
    pub transport: String,
    pub ws_connect_ms: Option<u64>,
}

/// Part of versions 1 and 2 of [`RequestRow`]: frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRow {
    pub account: String,
    pub class: String,
    pub status: Option<u16>,
    pub phase: Option<String>,
    pub ms: u64,
    pub error: Option<String>,
}

/// Part of versions 1 and 2 of [`RequestRow`]: frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

/// Part of versions 1 and 2 of [`RequestRow`]: frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipRow {
    pub account: String,
    pub reason: String,
}

/// Part of versions 1 and 2 of [`RequestRow`]: frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRow {
    pub queue: String,
    pub outcome: String,
    pub wait_ms: u64,
}

#[derive(Deserialize)]
struct RequestRowV1 {
    _id: String,
    started_at: String,
    key: String,
    model: String,
    stream: bool,
    outcome: String,
    status: u16,
    account: Option<String>,
    attempts: Vec<AttemptRow>,
    ttft_ms: Option<u64>,
    duration_ms: u64,
    usage: Option<UsageRow>,
    path: String,
    session: Option<String>,
    candidate_pool: Vec<String>,
    skipped: Vec<SkipRow>,
    affinity: String,
    queue: Option<QueueRow>,
    _cached_tokens: Option<u64>,
    transport: String,
    ws: bool,
    ws_connect_ms: Option<u64>,
}

impl Versioned for RequestRow {
    const NAME: &'static str = "request record";
    const VERSION: u8 = 2;
    fn decode_version(version: u8, b: &[u8]) -> Result<Self, CodecError> {
        match version {
            2 => body(b),
            1 => {
                let v: RequestRowV1 = body(b)?;
                let started_ms =
                    crate::clock::parse_rfc3339_ms(&v.started_at).ok_or_else(|| {
                        CodecError::Malformed(format!("started_at `{}`", v.started_at))
                    })?;
                Ok(RequestRow {
                    started_ms,
                    key_name: v.key,
                    model: v.model,
                    path: v.path,
                    stream: v.stream,
                    ws: v.ws,
                    outcome: v.outcome,
                    status: v.status,
                    account: v.account,
                    attempts: v.attempts,
                    ttft_ms: v.ttft_ms,
                    duration_ms: v.duration_ms,
                    usage: v.usage,
                    session: v.session,
                    candidate_pool: v.candidate_pool,
                    skipped: v.skipped,
                    affinity: v.affinity,
                    queue: v.queue,
                    transport: v.transport,
                    ws_connect_ms: v.ws_connect_ms,
                })
            }
            found => Err(unknown::<Self>(found)),
        }
    }
}
