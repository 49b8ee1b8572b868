//! The shapes persisted in the store, each with its version history (see `codec.rs`). These are
//! the store's own types: the domain converts to and from them (in `fleet` and `telemetry`),
//! and the admin API's wire types never reach the disk. Enums are stored by name.
//!
//! An old version's shape is kept here, frozen, for as long as a file may hold it: its decoder
//! turns it into the current shape. Never change a shape that was released; add a version.

use serde::{Deserialize, Serialize};

use super::codec::{CodecError, Versioned, Wire, body, unknown, versioned_once};
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

#[cfg(test)]
impl AccountRecord {
    /// An enabled account record for tests.
    pub(crate) fn for_test(id: &str) -> AccountRecord {
        AccountRecord {
            id: id.into(),
            label: "l".into(),
            email: Some("a@example.com".into()),
            plan: Some("plus".into()),
            chatgpt_account_id: format!("acc-{id}"),
            chatgpt_user_id: None,
            enabled: true,
            priority: 0,
            max_concurrency: None,
            created_at: 1,
            updated_at: 1,
        }
    }
}

/// An account's OAuth tokens; stored only sealed.
///
/// Version 2 (0.5.0): the logins it replaced. Version 1 (0.1.0): the tokens only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountSecrets {
    pub access_token: Secret,
    pub refresh_token: Secret,
    pub id_token: Secret,
    /// `exp` of the access token (unix seconds) when it could be read.
    pub access_expires_at: Option<u64>,
    /// When the tokens were last obtained (unix seconds).
    pub refreshed_at: u64,
    /// The refresh tokens this login replaced (by a refresh, which spends the old one, or by
    /// an import), newest last, at most [`REPLACED_KEPT`]: an auth file that brings one of
    /// them back is older than what the account holds.
    pub replaced: Vec<ReplacedLogin>,
}

/// Replaced logins an account remembers.
pub const REPLACED_KEPT: usize = 8;

/// A refresh token an account no longer holds: its SHA-256, and when it was replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacedLogin {
    pub refresh_sha256: [u8; 32],
    /// Unix seconds.
    pub at: u64,
}

#[derive(Deserialize)]
struct AccountSecretsV1 {
    access_token: Secret,
    refresh_token: Secret,
    id_token: Secret,
    access_expires_at: Option<u64>,
    refreshed_at: u64,
}

impl Versioned for AccountSecrets {
    const NAME: &'static str = "account tokens";
    const VERSION: u8 = 2;
    fn decode_version(version: u8, b: &[u8]) -> Result<Self, CodecError> {
        match version {
            2 => body(b),
            1 => {
                let v: AccountSecretsV1 = body(b)?;
                Ok(AccountSecrets {
                    access_token: v.access_token,
                    refresh_token: v.refresh_token,
                    id_token: v.id_token,
                    access_expires_at: v.access_expires_at,
                    refreshed_at: v.refreshed_at,
                    replaced: Vec::new(),
                })
            }
            found => Err(unknown::<Self>(found)),
        }
    }
}

fn sha256(s: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(s.as_bytes()).into()
}

impl AccountSecrets {
    /// Whether the login can be refreshed: a workspace access token comes without a refresh
    /// token and is used until it expires.
    pub fn refreshable(&self) -> bool {
        !self.refresh_token.expose().is_empty()
    }

    /// `next`, remembering that it replaced this login at `at` (with what this one replaced).
    pub fn succeeded_by(&self, mut next: AccountSecrets, at: u64) -> AccountSecrets {
        let mut replaced = self.replaced.clone();
        if self.refreshable() && self.refresh_token != next.refresh_token {
            let refresh_sha256 = sha256(self.refresh_token.expose());
            replaced.retain(|r| r.refresh_sha256 != refresh_sha256);
            replaced.push(ReplacedLogin { refresh_sha256, at });
        }
        let next_sha = sha256(next.refresh_token.expose());
        replaced.retain(|r| r.refresh_sha256 != next_sha);
        let extra = replaced.len().saturating_sub(REPLACED_KEPT);
        replaced.drain(..extra);
        next.replaced = replaced;
        next
    }

    /// When `refresh_token` was replaced in this login's chain, if it was.
    pub fn replaced_at(&self, refresh_token: &str) -> Option<u64> {
        if refresh_token.is_empty() {
            return None;
        }
        let sha = sha256(refresh_token);
        self.replaced
            .iter()
            .find(|r| r.refresh_sha256 == sha)
            .map(|r| r.at)
    }
}

/// A client key: only its SHA-256 is kept.
///
/// Version 3 (0.5.0): the service tiers its policy allows. Version 2 (0.3.0): its policy.
/// Version 1 (0.1.0): no policy.
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
    pub policy: KeyPolicyRow,
}

/// Part of version 3 of [`ClientKeyRecord`]: frozen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPolicyRow {
    /// Model globs; empty allows every model.
    pub models: Vec<String>,
    pub max_concurrency: Option<u32>,
    pub rpm: Option<u32>,
    pub tokens_per_5h: Option<u64>,
    pub tokens_per_day: Option<u64>,
    pub tokens_per_week: Option<u64>,
    /// Unix seconds.
    pub expires_at: Option<u64>,
    pub note: Option<String>,
    /// Service tiers a request may ask for (`default` for none asked); empty allows every one.
    pub tiers: Vec<String>,
}

/// The policy as version 2 of [`ClientKeyRecord`] holds it: frozen.
#[derive(Deserialize)]
struct KeyPolicyRowV2 {
    models: Vec<String>,
    max_concurrency: Option<u32>,
    rpm: Option<u32>,
    tokens_per_5h: Option<u64>,
    tokens_per_day: Option<u64>,
    tokens_per_week: Option<u64>,
    expires_at: Option<u64>,
    note: Option<String>,
}

#[derive(Deserialize)]
struct ClientKeyRecordV2 {
    id: String,
    name: String,
    prefix: String,
    sha256: [u8; 32],
    enabled: bool,
    created_at: u64,
    revoked_at: Option<u64>,
    policy: KeyPolicyRowV2,
}

#[derive(Deserialize)]
struct ClientKeyRecordV1 {
    id: String,
    name: String,
    prefix: String,
    sha256: [u8; 32],
    enabled: bool,
    created_at: u64,
    revoked_at: Option<u64>,
}

impl Versioned for ClientKeyRecord {
    const NAME: &'static str = "client key";
    const VERSION: u8 = 3;
    fn decode_version(version: u8, b: &[u8]) -> Result<Self, CodecError> {
        match version {
            3 => body(b),
            2 => {
                let v: ClientKeyRecordV2 = body(b)?;
                let p = v.policy;
                Ok(ClientKeyRecord {
                    id: v.id,
                    name: v.name,
                    prefix: v.prefix,
                    sha256: v.sha256,
                    enabled: v.enabled,
                    created_at: v.created_at,
                    revoked_at: v.revoked_at,
                    policy: KeyPolicyRow {
                        models: p.models,
                        max_concurrency: p.max_concurrency,
                        rpm: p.rpm,
                        tokens_per_5h: p.tokens_per_5h,
                        tokens_per_day: p.tokens_per_day,
                        tokens_per_week: p.tokens_per_week,
                        expires_at: p.expires_at,
                        note: p.note,
                        tiers: Vec::new(),
                    },
                })
            }
            1 => {
                let v: ClientKeyRecordV1 = body(b)?;
                Ok(ClientKeyRecord {
                    id: v.id,
                    name: v.name,
                    prefix: v.prefix,
                    sha256: v.sha256,
                    enabled: v.enabled,
                    created_at: v.created_at,
                    revoked_at: v.revoked_at,
                    policy: KeyPolicyRow::default(),
                })
            }
            found => Err(unknown::<Self>(found)),
        }
    }
}

/// One hour of one key's use of one model on one account: the totals of the requests that
/// finished in it. Version 1 (0.3.0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageBucketRow {
    /// The hour's start, unix seconds.
    pub hour: u64,
    pub key_id: String,
    pub model: String,
    /// The `chatgpt_account_id` that served; empty when none did.
    pub account: String,
    pub requests: u64,
    pub errors: u64,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    pub duration_ms: u64,
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

/// An account's own egress proxy, its whole URL (credentials included); stored only sealed.
/// Version 1 (0.4.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountProxyRecord {
    pub url: Secret,
}

/// One spend of a reset credit, written (and synced) before the consume call, so a crash or
/// a timeout mid-call resolves by asking again with the same redeem id, never by spending
/// another credit. Version 1 (0.5.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreditSpendRecord {
    pub account: String,
    /// The credit asked for (the soonest to expire), when the list named one.
    pub credit_id: Option<String>,
    /// `when_dry`, `before_expiry` or `operator`.
    pub need: String,
    /// The request record whose need it met, if a request's.
    pub request: Option<u64>,
    pub started_ms: u64,
    /// `None` while the answer is not known; else `reset`, `nothing_to_reset`, `no_credit`,
    /// `already_redeemed` or `failed`.
    pub outcome: Option<String>,
    pub windows_reset: u64,
    pub finished_ms: Option<u64>,
    /// Why it failed, or what the last try that left it unresolved met.
    pub error: Option<String>,
}

versioned_once!(
    AccountRecord => "account",
    CreditSpendRecord => "credit spend",
    AccountProxyRecord => "account proxy",
    SnapshotRecord => "snapshot",
    UsageBucketRow => "usage bucket",
);

// ---- account health ------------------------------------------------------------------------

/// An account's health, written through on every transition.
///
/// Version 3 (0.4.0): whether it still waits for the probe that proves it. Version 2 (0.2.0):
/// the state by name, and why a `needs_reauth` account needs a new login. Version 1 (0.1.0):
/// the state as an enum index, no `reauth`.
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
    /// Not proven healthy yet (new, or logged in again): probed before it takes requests.
    pub unproven: bool,
}

#[derive(Deserialize)]
struct HealthRecordV2 {
    state: String,
    reason: Option<String>,
    reauth: Option<String>,
    cooldown_until_ms: u64,
    levels: [u8; 3],
    last_failure_ms: u64,
    clean_successes: u8,
    last_error: Option<String>,
    last_error_ms: u64,
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
    const VERSION: u8 = 3;
    fn decode_version(version: u8, b: &[u8]) -> Result<Self, CodecError> {
        match version {
            3 => body(b),
            2 => {
                let v: HealthRecordV2 = body(b)?;
                Ok(HealthRecord {
                    state: v.state,
                    reason: v.reason,
                    reauth: v.reauth,
                    cooldown_until_ms: v.cooldown_until_ms,
                    levels: v.levels,
                    last_failure_ms: v.last_failure_ms,
                    clean_successes: v.clean_successes,
                    last_error: v.last_error,
                    last_error_ms: v.last_error_ms,
                    unproven: false,
                })
            }
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
                    unproven: false,
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
/// Version 4 (0.5.0): the service tier asked for and the one claimed, and the reset-credit
/// spend the request's need made. Version 3 (0.4.0): where its terminal answer came from, and the operator rule that judged
/// each attempt. Version 2 (0.2.0): the start
/// as unix ms, no id, no `cached_tokens` (it is in `usage`). Version 1 (0.1.0): the admin
/// API's JSON shape of the time, in postcard.
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
    /// `upstream`, `synthetic` or `none`; absent from versions 1 and 2.
    pub terminal_source: Option<String>,
    /// The operator rule that judged each attempt, by the attempt's index (so [`AttemptRow`]
    /// stays as versions 1 and 2 wrote it); empty before version 3.
    pub attempt_rules: Vec<Option<String>>,
    /// The `service_tier` the client asked for, and the one the answer claimed; absent before
    /// version 4.
    pub service_tier: Option<String>,
    pub served_tier: Option<String>,
    /// The reset-credit spend this request's need made; absent before version 4.
    pub credit: Option<CreditRow>,
}

/// A version-4 [`RequestRow`] written from borrowed parts, with no string copied: the same
/// fields in the same order and of the same encoding (a `&str` is written as a `String` is, a
/// [`MapSeq`] as a `Vec`), so that its bytes are the row's ([`RequestRowOut::encode`]). What a
/// request's record costs to keep is then the encoding alone.
pub struct RequestRowOut<'a, A, R> {
    pub started_ms: u64,
    pub key_name: &'a str,
    pub model: &'a str,
    pub path: &'a str,
    pub stream: bool,
    pub ws: bool,
    pub outcome: &'a str,
    pub status: u16,
    pub account: Option<&'a str>,
    pub attempts: MapSeq<'a, A, AttemptRowOut<'a>>,
    pub ttft_ms: Option<u64>,
    pub duration_ms: u64,
    pub usage: Option<UsageRow>,
    pub session: Option<&'a str>,
    pub candidate_pool: MapSeq<'a, std::sync::Arc<str>, &'a str>,
    pub skipped: MapSeq<'a, R, SkipRowOut<'a>>,
    pub affinity: std::borrow::Cow<'a, str>,
    pub queue: Option<QueueRowOut<'a>>,
    pub transport: &'a str,
    pub ws_connect_ms: Option<u64>,
    pub terminal_source: Option<&'a str>,
    pub attempt_rules: MapSeq<'a, A, Option<&'a str>>,
    pub service_tier: Option<&'a str>,
    pub served_tier: Option<&'a str>,
    pub credit: Option<CreditRowOut<'a>>,
}

impl<A, R> RequestRowOut<'_, A, R> {
    /// The row's bytes as [`super::codec::encode`] writes a [`RequestRow`] with these fields,
    /// written by hand ([`Wire`]): serde's layers were most of what a record cost to encode.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Wire::of::<RequestRow>();
        w.varint(self.started_ms);
        w.str(self.key_name);
        w.str(self.model);
        w.str(self.path);
        w.bool(self.stream);
        w.bool(self.ws);
        w.str(self.outcome);
        w.varint(u64::from(self.status));
        w.opt_str(self.account);
        w.seq(self.attempts.iter(), |w, a| {
            w.str(a.account);
            w.str(a.class);
            w.opt(a.status, |w, s| w.varint(u64::from(s)));
            w.opt_str(a.phase);
            w.varint(a.ms);
            w.opt_str(a.error);
        });
        w.opt_varint(self.ttft_ms);
        w.varint(self.duration_ms);
        w.opt(self.usage.as_ref(), |w, u| {
            w.varint(u.input_tokens);
            w.varint(u.cached_tokens);
            w.varint(u.output_tokens);
            w.varint(u.reasoning_tokens);
        });
        w.opt_str(self.session);
        w.seq(self.candidate_pool.iter(), Wire::str);
        w.seq(self.skipped.iter(), |w, skip| {
            w.str(skip.account);
            w.str(skip.reason);
        });
        w.str(&self.affinity);
        w.opt(self.queue.as_ref(), |w, q| {
            w.str(q.queue);
            w.str(q.outcome);
            w.varint(q.wait_ms);
        });
        w.str(self.transport);
        w.opt_varint(self.ws_connect_ms);
        w.opt_str(self.terminal_source);
        w.seq(self.attempt_rules.iter(), Wire::opt_str);
        w.opt_str(self.service_tier);
        w.opt_str(self.served_tier);
        w.opt(self.credit.as_ref(), |w, c| {
            w.str(c.account);
            w.str(c.redeem_id);
            w.str(c.outcome);
            w.varint(c.windows_reset);
        });
        w.into_bytes()
    }
}

/// [`AttemptRow`] borrowed.
pub struct AttemptRowOut<'a> {
    pub account: &'a str,
    pub class: &'a str,
    pub status: Option<u16>,
    pub phase: Option<&'a str>,
    pub ms: u64,
    pub error: Option<&'a str>,
}

/// [`SkipRow`] borrowed.
pub struct SkipRowOut<'a> {
    pub account: &'a str,
    pub reason: &'a str,
}

/// [`QueueRow`] borrowed.
pub struct QueueRowOut<'a> {
    pub queue: &'a str,
    pub outcome: &'a str,
    pub wait_ms: u64,
}

/// [`CreditRow`] borrowed.
pub struct CreditRowOut<'a> {
    pub account: &'a str,
    pub redeem_id: &'a str,
    pub outcome: &'a str,
    pub windows_reset: u64,
}

/// A sequence written as each of `items` mapped by `each`, as a `Vec` of the results would be.
pub struct MapSeq<'a, T, U> {
    pub items: &'a [T],
    pub each: fn(&'a T) -> U,
}

impl<'a, T, U> MapSeq<'a, T, U> {
    fn iter(&self) -> impl ExactSizeIterator<Item = U> + use<'a, T, U> {
        self.items.iter().map(self.each)
    }
}

/// A reset-credit spend as a request record tells it. Part of version 4 of [`RequestRow`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreditRow {
    pub account: String,
    pub redeem_id: String,
    pub outcome: String,
    pub windows_reset: u64,
}

/// Part of versions 1 to 3 of [`RequestRow`]: frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRow {
    pub account: String,
    pub class: String,
    pub status: Option<u16>,
    pub phase: Option<String>,
    pub ms: u64,
    pub error: Option<String>,
}

/// Part of versions 1 to 3 of [`RequestRow`]: frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

/// Part of versions 1 to 3 of [`RequestRow`]: frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipRow {
    pub account: String,
    pub reason: String,
}

/// Part of versions 1 to 3 of [`RequestRow`]: frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRow {
    pub queue: String,
    pub outcome: String,
    pub wait_ms: u64,
}

#[derive(Deserialize)]
struct RequestRowV3 {
    started_ms: u64,
    key_name: String,
    model: String,
    path: String,
    stream: bool,
    ws: bool,
    outcome: String,
    status: u16,
    account: Option<String>,
    attempts: Vec<AttemptRow>,
    ttft_ms: Option<u64>,
    duration_ms: u64,
    usage: Option<UsageRow>,
    session: Option<String>,
    candidate_pool: Vec<String>,
    skipped: Vec<SkipRow>,
    affinity: String,
    queue: Option<QueueRow>,
    transport: String,
    ws_connect_ms: Option<u64>,
    terminal_source: Option<String>,
    attempt_rules: Vec<Option<String>>,
}

#[derive(Deserialize)]
struct RequestRowV2 {
    started_ms: u64,
    key_name: String,
    model: String,
    path: String,
    stream: bool,
    ws: bool,
    outcome: String,
    status: u16,
    account: Option<String>,
    attempts: Vec<AttemptRow>,
    ttft_ms: Option<u64>,
    duration_ms: u64,
    usage: Option<UsageRow>,
    session: Option<String>,
    candidate_pool: Vec<String>,
    skipped: Vec<SkipRow>,
    affinity: String,
    queue: Option<QueueRow>,
    transport: String,
    ws_connect_ms: Option<u64>,
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
    const VERSION: u8 = 4;
    fn decode_version(version: u8, b: &[u8]) -> Result<Self, CodecError> {
        match version {
            4 => body(b),
            3 => {
                let v: RequestRowV3 = body(b)?;
                Ok(RequestRow {
                    started_ms: v.started_ms,
                    key_name: v.key_name,
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
                    terminal_source: v.terminal_source,
                    attempt_rules: v.attempt_rules,
                    service_tier: None,
                    served_tier: None,
                    credit: None,
                })
            }
            2 => {
                let v: RequestRowV2 = body(b)?;
                Ok(RequestRow {
                    started_ms: v.started_ms,
                    key_name: v.key_name,
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
                    terminal_source: None,
                    attempt_rules: Vec::new(),
                    service_tier: None,
                    served_tier: None,
                    credit: None,
                })
            }
            1 => {
                let v: RequestRowV1 = body(b)?;
                let started_ms =
                    crate::base::clock::parse_rfc3339_ms(&v.started_at).ok_or_else(|| {
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
                    terminal_source: None,
                    attempt_rules: Vec::new(),
                    service_tier: None,
                    served_tier: None,
                    credit: None,
                })
            }
            found => Err(unknown::<Self>(found)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec::{decode, encode};

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn to_hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn health_v2() -> HealthRecord {
        HealthRecord {
            state: "needs_reauth".into(),
            reason: Some("auth_dead".into()),
            reauth: Some("refresh_token_reused".into()),
            cooldown_until_ms: 0,
            levels: [1, 0, 2],
            last_failure_ms: 1_767_225_600_000,
            clean_successes: 0,
            last_error: Some("auth_dead: token refresh: 401 refresh_token_reused".into()),
            last_error_ms: 1_767_225_600_000,
            unproven: false,
        }
    }

    fn settings_v2() -> SettingsRecord {
        SettingsRecord {
            strategy: Some("fill_first".into()),
            max_concurrency: Some(4),
            queue_wait: Some("45s".into()),
            ..SettingsRecord::default()
        }
    }

    fn request_v2() -> RequestRow {
        RequestRow {
            started_ms: 1_767_225_600_123,
            key_name: "alice".into(),
            model: "gpt-5.5".into(),
            path: "/v1/responses".into(),
            stream: true,
            ws: true,
            outcome: "stream_error".into(),
            status: 200,
            account: Some("acc-2".into()),
            attempts: vec![AttemptRow {
                account: "acc-2".into(),
                class: "transient".into(),
                status: Some(200),
                phase: Some("mid_stream".into()),
                ms: 12,
                error: Some("reset".into()),
            }],
            ttft_ms: Some(5),
            duration_ms: 20,
            usage: None,
            session: Some("abcdef012345".into()),
            candidate_pool: vec!["acc-2".into()],
            skipped: vec![SkipRow {
                account: "acc-1".into(),
                reason: "cooling".into(),
            }],
            affinity: "rebound(cooling)".into(),
            queue: Some(QueueRow {
                queue: "pool".into(),
                outcome: "acquired".into(),
                wait_ms: 3,
            }),
            transport: "ws_reused".into(),
            ws_connect_ms: None,
            terminal_source: None,
            attempt_rules: Vec::new(),
            service_tier: None,
            served_tier: None,
            credit: None,
        }
    }

    /// Bytes 0.1.0 wrote (read out of `tests/fixtures/state-0.1.0`).
    mod v1 {
        pub const ACCOUNT: &str = "010861353264613930391073696d31406578616d706c652e636f6d011073696d31406578616d706c652e636f6d0104706c75730a73696d2d616363742d31010a73696d2d757365722d310100009096b8d8069096b8d806";
        pub const HEALTH: &str = "0101010571756f746183c2a2e5a4340000000000013f71756f74613a203432392075736167655f6c696d69745f7265616368656420546865207573616765206c696d697420686173206265656e207265616368656483f8ecf6a234";
        pub const KEY: &str = "010c6b65795f67706561336c683903626f620a736b2d73792d4334434b1b77826ecf9f38da1b86899c66ab6938b23ead00d9684a2c42a7153936349c66009096b8d806019196b8d806";
        pub const SETTINGS: &str = "01010201050000010334357300000000";
        pub const SNAPSHOT: &str = "01040973657373696f6e2d32083435323862313665d2f7ecf6a234d2f7ecf6a2340973657373696f6e2d3308303035303863643497f8ecf6a23497f8ecf6a2340973657373696f6e2d31083030353038636434d4f8ecf6a234d4f8ecf6a2340973657373696f6e2d39083030353038636434a8f9ecf6a234a8f9ecf6a234";
        pub const REQUEST: &str = "01147265715f3031613232656462336330303030303218323032362d31312d33305432333a34373a32392e3430385a05616c696365076770742d352e35010773756363657373c801010a73696d2d616363742d34020a73696d2d616363742d310571756f746101ad03010a7072655f636f6d6d69740501383432392075736167655f6c696d69745f7265616368656420546865207573616765206c696d697420686173206265656e20726561636865640a73696d2d616363742d34077375636365737301c80100100001101701140043360d2f76312f726573706f6e736573010c656232373834373566363036030a73696d2d616363742d310a73696d2d616363742d340a73696d2d616363742d32010a73696d2d616363742d330864697361626c6564086e65775f62696e6400010004687474700000";
    }

    /// Bytes 0.2.0 writes.
    mod v2 {
        pub const HEALTH: &str = "020c6e656564735f7265617574680109617574685f646561640114726566726573685f746f6b656e5f7265757365640001000280d0eab6b733000132617574685f646561643a20746f6b656e20726566726573683a2034303120726566726573685f746f6b656e5f72657573656480d0eab6b733";
        pub const SETTINGS: &str = "02010a66696c6c5f666972737401040000010334357300000000";
        pub const REQUEST: &str = "02fbd0eab6b73305616c696365076770742d352e350d2f76312f726573706f6e73657301010c73747265616d5f6572726f72c80101056163632d3201056163632d32097472616e7369656e7401c801010a6d69645f73747265616d0c0105726573657401051400010c61626364656630313233343501056163632d3201056163632d3107636f6f6c696e67107265626f756e6428636f6f6c696e67290104706f6f6c086163717569726564030977735f72657573656400";
    }

    #[test]
    fn account_key_and_snapshot_version_1_decode_and_are_still_written() {
        let a: AccountRecord = decode(&hex(v1::ACCOUNT)).unwrap();
        assert_eq!(
            (
                a.id.as_str(),
                a.label.as_str(),
                a.plan.as_deref(),
                a.enabled
            ),
            ("a52da909", "sim1@example.com", Some("plus"), true)
        );
        assert_eq!(a.chatgpt_account_id, "sim-acct-1");
        assert_eq!(to_hex(&encode(&a).unwrap()), v1::ACCOUNT);

        let k: ClientKeyRecord = decode(&hex(v1::KEY)).unwrap();
        assert_eq!((k.name.as_str(), k.enabled), ("bob", false));
        assert_eq!(k.revoked_at.map(|r| r - k.created_at), Some(1));
        assert_eq!(k.policy, KeyPolicyRow::default());
        // Written again, it is version 3: version 1 with an empty policy after it.
        let again = encode(&k).unwrap();
        assert_eq!(
            to_hex(&again[1..]),
            format!("{}{}", &v1::KEY[2..], "000000000000000000")
        );
        assert_eq!(again[0], 3);
        assert_eq!(decode::<ClientKeyRecord>(&again).unwrap(), k);

        let SnapshotRecord(rows) = decode(&hex(v1::SNAPSHOT)).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(
            (rows[0].key.as_str(), rows[0].value.as_str()),
            ("session-2", "4528b16e")
        );
        assert_eq!(
            to_hex(&encode(&SnapshotRecord(rows)).unwrap()),
            v1::SNAPSHOT
        );

        // Tokens as 0.1.0 to 0.4.0 wrote them: they read with no replaced logins.
        let secrets = AccountSecrets {
            access_token: Secret::new("at"),
            refresh_token: Secret::new("rt"),
            id_token: Secret::new("it"),
            access_expires_at: Some(7),
            refreshed_at: 5,
            replaced: Vec::new(),
        };
        assert_eq!(
            decode::<AccountSecrets>(&hex("01026174027274026974010705")).unwrap(),
            secrets
        );
        let bytes = encode(&secrets).unwrap();
        assert_eq!(to_hex(&bytes), "0202617402727402697401070500");
        assert_eq!(decode::<AccountSecrets>(&bytes).unwrap(), secrets);
    }

    #[test]
    fn health_version_1_decodes_into_version_2() {
        let h: HealthRecord = decode(&hex(v1::HEALTH)).unwrap();
        assert_eq!(h.state, "cooling");
        assert_eq!(h.reason.as_deref(), Some("quota"));
        assert_eq!(h.reauth, None);
        assert_eq!(h.cooldown_until_ms, 1_796_582_449_411);
        assert_eq!(h.levels, [0, 0, 0]);
        assert!(
            h.last_error
                .unwrap()
                .starts_with("quota: 429 usage_limit_reached")
        );
        // 0.1.0's three states by their index.
        assert_eq!(
            decode::<HealthRecord>(&hex("0100000000000000000000"))
                .unwrap()
                .state,
            "ready"
        );
        assert_eq!(
            decode::<HealthRecord>(&hex("01020109617574685f646561640000000000000000"))
                .unwrap()
                .state,
            "needs_reauth"
        );
    }

    #[test]
    fn health_version_2_decodes_as_proven_and_version_3_adds_the_flag() {
        assert_eq!(
            decode::<HealthRecord>(&hex(v2::HEALTH)).unwrap(),
            health_v2()
        );
        // Version 3 is version 2's bytes and one for `unproven`.
        let unproven = HealthRecord {
            unproven: true,
            ..health_v2()
        };
        let bytes = encode(&unproven).unwrap();
        assert_eq!(bytes[0], 3);
        assert_eq!(to_hex(&bytes[1..]), format!("{}01", &v2::HEALTH[2..]));
        assert_eq!(decode::<HealthRecord>(&bytes).unwrap(), unproven);
    }

    #[test]
    fn settings_version_1_decodes_its_strategy_index() {
        let s: SettingsRecord = decode(&hex(v1::SETTINGS)).unwrap();
        assert_eq!(s.strategy.as_deref(), Some("least_loaded"));
        assert_eq!(s.max_concurrency, Some(5));
        assert_eq!(s.queue_wait.as_deref(), Some("45s"));
        assert_eq!(s.sticky_wait, None);
        assert_eq!(
            decode::<SettingsRecord>(&hex(v2::SETTINGS)).unwrap(),
            settings_v2()
        );
        assert_eq!(to_hex(&encode(&settings_v2()).unwrap()), v2::SETTINGS);
    }

    #[test]
    fn request_version_1_decodes_into_version_2() {
        let r: RequestRow = decode(&hex(v1::REQUEST)).unwrap();
        assert_eq!(
            Some(r.started_ms),
            crate::base::clock::parse_rfc3339_ms("2026-11-30T23:47:29.408Z")
        );
        assert_eq!(
            (r.key_name.as_str(), r.outcome.as_str(), r.status),
            ("alice", "success", 200)
        );
        let chain: Vec<(&str, &str)> = r
            .attempts
            .iter()
            .map(|a| (a.account.as_str(), a.class.as_str()))
            .collect();
        assert_eq!(chain, [("sim-acct-1", "quota"), ("sim-acct-4", "success")]);
        assert_eq!(r.attempts[0].status, Some(429));
        assert_eq!(r.attempts[0].phase.as_deref(), Some("pre_commit"));
        assert_eq!(
            r.skipped,
            vec![SkipRow {
                account: "sim-acct-3".into(),
                reason: "disabled".into()
            }]
        );
        assert_eq!(
            (r.affinity.as_str(), r.transport.as_str()),
            ("new_bind", "http")
        );
        assert_eq!(r.usage.map(|u| u.cached_tokens), Some(0));
        assert_eq!(r.path, "/v1/responses");
        assert!(!r.ws);
        assert_eq!(r.terminal_source, None);
    }

    #[test]
    fn request_version_2_decodes_into_version_3_without_a_terminal_source() {
        assert_eq!(
            decode::<RequestRow>(&hex(v2::REQUEST)).unwrap(),
            request_v2()
        );
        // Written again, it is version 4: version 2 with no terminal source, no rules, no
        // tiers and no credit spend after it.
        let again = encode(&request_v2()).unwrap();
        assert_eq!(again[0], 4);
        assert_eq!(
            to_hex(&again[1..]),
            format!("{}0000000000", &v2::REQUEST[2..])
        );
    }

    /// Bytes 0.4.0 writes.
    mod v4 {
        pub const REQUEST: &str = "03fbd0eab6b73305616c696365076770742d352e350d2f76312f726573706f6e73657301010c73747265616d5f6572726f72c80101056163632d3201056163632d32097472616e7369656e7401c801010a6d69645f73747265616d0c0105726573657401051400010c61626364656630313233343501056163632d3201056163632d3107636f6f6c696e67107265626f756e6428636f6f6c696e67290104706f6f6c086163717569726564030977735f72657573656400010973796e74686574696301010472757368";
    }

    #[test]
    fn request_version_3_decodes_into_version_4_without_tiers_or_a_spend() {
        let r = RequestRow {
            terminal_source: Some("synthetic".into()),
            attempt_rules: vec![Some("rush".into())],
            ..request_v2()
        };
        assert_eq!(decode::<RequestRow>(&hex(v4::REQUEST)).unwrap(), r);
        let again = encode(&r).unwrap();
        assert_eq!(again[0], 4);
        assert_eq!(to_hex(&again[1..]), format!("{}000000", &v4::REQUEST[2..]));
    }

    /// Bytes 0.5.0 writes.
    mod v5 {
        pub const REQUEST: &str = "04fbd0eab6b73305616c696365076770742d352e350d2f76312f726573706f6e73657301010c73747265616d5f6572726f72c80101056163632d3201056163632d32097472616e7369656e7401c801010a6d69645f73747265616d0c0105726573657401051400010c61626364656630313233343501056163632d3201056163632d3107636f6f6c696e67107265626f756e6428636f6f6c696e67290104706f6f6c086163717569726564030977735f72657573656400000001087072696f72697479010764656661756c7401056163632d3204723a2d3105726573657402";
    }

    #[test]
    fn request_version_4_round_trips_exactly() {
        let r = RequestRow {
            service_tier: Some("priority".into()),
            served_tier: Some("default".into()),
            credit: Some(CreditRow {
                account: "acc-2".into(),
                redeem_id: "r:-1".into(),
                outcome: "reset".into(),
                windows_reset: 2,
            }),
            ..request_v2()
        };
        let bytes = to_hex(&encode(&r).unwrap());
        assert_eq!(bytes, v5::REQUEST);
        assert_eq!(decode::<RequestRow>(&hex(&bytes)).unwrap(), r);
    }

    /// Bytes 0.3.0 writes.
    mod v3 {
        pub const KEY: &str = "02076b65795f616263047465616d0a736b2d73792d416243640707070707070707070707070707070707070707070707070707070707070707018092b3d8060001066770742d352a0104013c01c09a0c0001c096b1020180f3f9da0601066167656e7473";
        pub const USAGE: &str =
            "01c08cb9d806076b65795f616263076770742d352e350a73696d2d616363742d3103017860280cc413";
    }

    fn key_v2() -> ClientKeyRecord {
        ClientKeyRecord {
            id: "key_abc".into(),
            name: "team".into(),
            prefix: "sk-sy-AbCd".into(),
            sha256: [7; 32],
            enabled: true,
            created_at: 1_796_000_000,
            revoked_at: None,
            policy: KeyPolicyRow {
                models: vec!["gpt-5*".into()],
                max_concurrency: Some(4),
                rpm: Some(60),
                tokens_per_5h: Some(200_000),
                tokens_per_day: None,
                tokens_per_week: Some(5_000_000),
                expires_at: Some(1_801_353_600),
                note: Some("agents".into()),
                tiers: Vec::new(),
            },
        }
    }

    fn usage_v1() -> UsageBucketRow {
        UsageBucketRow {
            hour: 1_796_097_600,
            key_id: "key_abc".into(),
            model: "gpt-5.5".into(),
            account: "sim-acct-1".into(),
            requests: 3,
            errors: 1,
            input_tokens: 120,
            cached_tokens: 96,
            output_tokens: 40,
            reasoning_tokens: 12,
            duration_ms: 2500,
        }
    }

    #[test]
    fn key_version_2_decodes_and_usage_version_1_round_trips_exactly() {
        // A key as 0.3.0 and 0.4.0 wrote it: no tier restriction.
        assert_eq!(decode::<ClientKeyRecord>(&hex(v3::KEY)).unwrap(), key_v2());
        let mut k = key_v2();
        k.policy.tiers = vec!["default".into()];
        let bytes = encode(&k).unwrap();
        assert_eq!(bytes[0], 3);
        assert_eq!(
            to_hex(&bytes[1..]),
            format!("{}0107{}", &v3::KEY[2..], to_hex(b"default"))
        );
        assert_eq!(decode::<ClientKeyRecord>(&bytes).unwrap(), k);
        assert_eq!(to_hex(&encode(&usage_v1()).unwrap()), v3::USAGE);
        assert_eq!(
            decode::<UsageBucketRow>(&hex(v3::USAGE)).unwrap(),
            usage_v1()
        );
    }

    /// Bytes 0.5.0 writes for a reset-credit spend.
    const CREDIT_SPEND_V1: &str =
        "01046163633101026331087768656e5f647279012a80d0c4cfa2340105726573657402018ad0c4cfa23400";

    #[test]
    fn a_credit_spend_round_trips_exactly() {
        let r = CreditSpendRecord {
            account: "acc1".into(),
            credit_id: Some("c1".into()),
            need: "when_dry".into(),
            request: Some(42),
            started_ms: 1_796_000_000_000,
            outcome: Some("reset".into()),
            windows_reset: 2,
            finished_ms: Some(1_796_000_000_010),
            error: None,
        };
        let bytes = to_hex(&encode(&r).unwrap());
        assert_eq!(bytes, CREDIT_SPEND_V1);
        assert_eq!(decode::<CreditSpendRecord>(&hex(&bytes)).unwrap(), r);
        // Unsettled: no outcome yet.
        let pending = CreditSpendRecord {
            outcome: None,
            finished_ms: None,
            ..r
        };
        assert_eq!(
            decode::<CreditSpendRecord>(&encode(&pending).unwrap()).unwrap(),
            pending
        );
    }

    #[test]
    fn a_version_newer_than_the_binary_is_refused_by_name() {
        let mut bytes = hex(v4::REQUEST);
        bytes[0] = 5;
        let e = decode::<RequestRow>(&bytes).unwrap_err();
        assert!(e.to_string().contains("newer than this binary"), "{e}");
    }
}
