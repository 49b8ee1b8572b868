//! The account pool: which accounts exist, their tokens, health, quota and in-flight work.
//! One owner with a small API; callers never hold its lock across an `.await`.
//!
//! Changes are persisted through the store's writer. Imports are written before they appear
//! in memory (a failed write leaves no ghost account); disabling and health transitions take
//! effect in memory first, so no request can lease an account that is known to be bad while
//! the write is in flight.

mod accounts;
pub mod affinity;
pub mod auth_file;
pub mod credits;
pub mod health;
pub mod refresh;
pub mod rules;
pub mod scheduler;
pub mod settings;
mod table;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use reqwest::header::HeaderValue;
use sha2::{Digest, Sha256};

use crate::base::clock::SharedClock;
use crate::base::duration::human_duration;
use crate::store::records::{AccountRecord, AccountSecrets};
use crate::store::{Store, StoreError};
use crate::upstream::Identity;
use crate::upstream::egress::ProxyUrl;
use crate::upstream::failure::{Endpoint, Facts};
use crate::upstream::quota::QuotaSnapshot;

pub use self::accounts::{AccountView, Imported};
use self::auth_file::AuthFileError;
use self::health::{AccountState, Class, Effective, Health, State, Transition};
pub use self::scheduler::{Lease, Plan, SkipReason};
use self::settings::{Settings, SettingsPatch};

/// The redb settings key holding operators' live changes to `[scheduling]`.
pub const SETTINGS_KEY: &str = "scheduling";

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("no account matches `{0}`")]
    NotFound(String),
    #[error("`{selector}` matches {count} accounts; use the account id")]
    Ambiguous { selector: String, count: usize },
    #[error("auth file {0}")]
    AuthFile(#[from] AuthFileError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("refresh failed: {0}")]
    Refresh(String),
    #[error("invalid {0}")]
    Invalid(String),
    /// The auth server did not say whose an access token is: `refused` when it answered that
    /// the token is not valid.
    #[error("the auth server {}: {why}", if *refused { "refused the access token" } else { "could not validate the access token" })]
    AccessToken { refused: bool, why: String },
}

/// The attempt a failure came from: the model it asked for ("" for none) and when it began
/// (unix ms).
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub model: &'a str,
    pub started_ms: u64,
}

/// What the pool made of a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub class: Class,
    /// The operator's rule that decided it.
    pub rule: Option<String>,
    /// Where its effect landed: for `Session` the caller keeps the session away from the
    /// account (for `cooldown`, at most an hour).
    pub scope: rules::Scope,
    pub cooldown: Option<Duration>,
    /// A failure a `pass_through` rule answered the client with as it was: what the built-in
    /// classification makes of it (the request's record says this, so the failure counts as
    /// the upstream's when it is one, under its account and its rule), while `class` — the
    /// effect — is `Caller`: no failover, no cooldown.
    pub passed: Option<Class>,
}

/// How long an (account, model) pair stays marked unsupported.
pub const UNSUPPORTED_TTL: Duration = Duration::from_secs(3600);

pub(crate) struct Entry {
    record: AccountRecord,
    health: Health,
    secrets: Option<AccountSecrets>,
    quota: Option<QuotaSnapshot>,
    in_flight: u32,
    probing: bool,
    /// The adaptive concurrency limit (AIMD); `floor` of it is the number of slots.
    limit: f64,
    /// Sessions waiting for this account's slot (sticky waits), FIFO.
    waiters: VecDeque<scheduler::Waiter>,
    /// Models this account answered "not supported" for, until when (unix ms).
    unsupported: HashMap<String, u64>,
    /// Takes no new sessions (operator action; not persisted).
    draining: bool,
    /// Its own egress proxy (stored sealed).
    proxy: Option<Arc<ProxyUrl>>,
    /// Its `x-codex-installation-id`, derived once.
    installation_id: Arc<str>,
    /// Its `chatgpt_account_id`, shared with the records that name it as a candidate.
    chatgpt_id: Arc<str>,
    /// Its id (which never changes), shared with the leases on it.
    shared_id: Arc<str>,
    /// Where its requests go (its workspace's origin), as last discovered; not persisted.
    route: Route,
    /// Its row in the scheduler's table (see [`table`]).
    slot: usize,
    /// Its access token shared, as an `Authorization` value, and its identity headers' values:
    /// made once, not per request (see [`Made`]).
    made: std::sync::Mutex<Made>,
}

/// Header values an account's requests carry, made on the first request that needs them and
/// remade only when what they are made of has changed.
#[derive(Default)]
struct Made {
    /// The access token the values below were made of (a real one is about 2 KB: shared with
    /// each request, not copied for it).
    token: Option<Arc<str>>,
    bearer: Option<HeaderValue>,
    values: Option<crate::upstream::IdValues>,
}

/// What workspace routing discovery says of an account (memory only: it is asked again at
/// start, after an import or a login, and after each refresh).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Route {
    /// Not asked yet (or since its tokens changed): the configured origin meanwhile.
    #[default]
    Unknown,
    /// No constraint: the configured origin.
    Default,
    /// A data-residency workspace's origin.
    Workspace(Arc<crate::upstream::routing::Route>),
    /// Discovery failed or was refused, with why (the configured origin meanwhile).
    Failed(String),
}

impl Entry {
    fn new(
        record: AccountRecord,
        health: Health,
        secrets: Option<AccountSecrets>,
        limit: f64,
    ) -> Self {
        Entry {
            health,
            secrets,
            quota: None,
            in_flight: 0,
            probing: false,
            limit,
            waiters: VecDeque::new(),
            unsupported: HashMap::new(),
            draining: false,
            proxy: None,
            installation_id: Arc::from(installation_id(&record.id)),
            chatgpt_id: Arc::from(record.chatgpt_account_id.as_str()),
            shared_id: Arc::from(record.id.as_str()),
            route: Route::Unknown,
            slot: 0,
            made: std::sync::Mutex::default(),
            record,
        }
    }

    /// `token` shared, its `Authorization` value (`None` when the token cannot be a header
    /// value) and the values of the account's identity headers: the ones made before while
    /// what they are made of is the same.
    fn made(
        &self,
        token: &str,
    ) -> (
        Arc<str>,
        Option<HeaderValue>,
        Option<crate::upstream::IdValues>,
    ) {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        let token = match &made.token {
            Some(t) if **t == *token => Arc::clone(t),
            _ => {
                let t: Arc<str> = Arc::from(token);
                made.token = Some(Arc::clone(&t));
                made.bearer = crate::upstream::bearer(token).ok();
                t
            }
        };
        let (account, installation) = (&self.record.chatgpt_account_id, &self.installation_id);
        if !made
            .values
            .as_ref()
            .is_some_and(|v| v.are(account, installation))
        {
            made.values = crate::upstream::IdValues::of(account, installation);
        }
        (token, made.bearer.clone(), made.values.clone())
    }

    pub(crate) fn is_unsupported(&self, model: &str, now_ms: u64) -> bool {
        // Most accounts have no marks: skip hashing the model for them (a plan asks every
        // account).
        !self.unsupported.is_empty()
            && self
                .unsupported
                .get(model)
                .is_some_and(|until| *until > now_ms)
    }
}

pub(crate) struct Inner {
    accounts: table::Accounts,
    /// Requests waiting for a slot on any of their candidates, FIFO.
    pool: VecDeque<scheduler::Waiter>,
    next_waiter: u64,
}

/// The pool of accounts. Cloning shares it.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<RwLock<Inner>>,
    store: Store,
    clock: SharedClock,
    rr: Arc<AtomicUsize>,
    refresh: refresh::RefreshState,
    settings: Arc<RwLock<SettingsState>>,
    /// Operators' rules, consulted before the built-in classification.
    rules: Arc<RwLock<Arc<Vec<rules::Rule>>>>,
    pub affinity: affinity::Affinity,
}

/// The settings in force, and how they came to be.
struct SettingsState {
    /// From the config file.
    base: Settings,
    /// Changed live by operators (persisted).
    patch: SettingsPatch,
    effective: Settings,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("accounts", &self.len())
            .finish()
    }
}

/// The id of an account: stable across re-imports, derived from its ChatGPT identity.
pub fn account_id(chatgpt_account_id: &str, user: Option<&str>) -> String {
    let digest = Sha256::digest(format!("{chatgpt_account_id}/{}", user.unwrap_or("")).as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// A per-account device id for `x-codex-installation-id`, stable and UUID-shaped.
pub fn installation_id(id: &str) -> String {
    let d = Sha256::digest(format!("switchyard-installation/{id}").as_bytes());
    let h: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

impl Fleet {
    pub fn load(store: Store, clock: SharedClock) -> Result<Fleet, StoreError> {
        Self::load_with(store, clock, Settings::default())
    }

    /// Loads the pool; `base` is the config's `[scheduling]`, over which operators' stored
    /// changes apply.
    pub fn load_with(
        store: Store,
        clock: SharedClock,
        base: Settings,
    ) -> Result<Fleet, StoreError> {
        let patch = match store.get_settings(SETTINGS_KEY)? {
            Some(r) => SettingsPatch::from_record(r).unwrap_or_else(|e| {
                store.note_undecodable("settings", SETTINGS_KEY, &e);
                SettingsPatch::default()
            }),
            None => SettingsPatch::default(),
        };
        let effective = patch.apply(&base);
        let mut health: HashMap<String, Health> = HashMap::new();
        for (id, record) in store.load_health()? {
            match Health::from_record(record) {
                Ok(h) => {
                    health.insert(id, h);
                }
                Err(e) => store.note_undecodable("account_health", &id, &e),
            }
        }
        let mut accounts = BTreeMap::new();
        for record in store.load_accounts()? {
            // Tokens that cannot be opened are counted and logged by the store; the account
            // stays listed, without tokens.
            let mut secrets = store.account_secrets(&record.id).unwrap_or(None);
            let id = record.id.clone();
            // An account whose proxy cannot be opened must not go out another way: it is kept
            // without tokens (the store counted and logged why) until its proxy is set again.
            let proxy = match store.account_proxy(&id) {
                Ok(None) => None,
                Ok(Some(url)) => match ProxyUrl::parse(&url) {
                    Ok(p) => Some(Arc::new(p)),
                    Err(e) => {
                        store.note_undecodable("account_proxies", &id, &e);
                        secrets = None;
                        None
                    }
                },
                Err(_) => {
                    secrets = None;
                    None
                }
            };
            let limit = f64::from(
                record
                    .max_concurrency
                    .unwrap_or(effective.max_concurrency)
                    .max(1),
            );
            let mut entry = Entry::new(
                record,
                health.remove(&id).unwrap_or_default(),
                secrets,
                limit,
            );
            entry.proxy = proxy;
            accounts.insert(id.clone(), entry);
        }

        let affinity = affinity::Affinity::new(Arc::clone(&clock), effective.affinity_idle_ttl);
        Ok(Fleet {
            inner: Arc::new(RwLock::new(Inner {
                accounts: accounts.into(),
                pool: VecDeque::new(),
                next_waiter: 0,
            })),
            store,
            clock,
            rr: Arc::new(AtomicUsize::new(0)),
            refresh: refresh::RefreshState::default(),
            settings: Arc::new(RwLock::new(SettingsState {
                base,
                patch,
                effective,
            })),
            rules: Arc::default(),
            affinity,
        })
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// One sweeper per TTL map of the pool.
    pub fn spawn_sweepers(
        &self,
        every: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        vec![
            self.affinity.sessions.spawn_sweeper(every, stop.clone()),
            self.affinity.responses.spawn_sweeper(every, stop.clone()),
            self.affinity.spawn_exclusion_sweeper(every, stop.clone()),
            self.affinity.spawn_refusal_sweeper(every, stop),
        ]
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn len(&self) -> usize {
        self.read().accounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the account could serve a request now (slots aside).
    pub fn usable(&self, id: &str) -> bool {
        let now = self.clock.now_ms();
        self.read()
            .accounts
            .get(id)
            .is_some_and(|e| self.skip_reason(e, "", now).is_none())
    }

    pub fn in_flight(&self) -> u64 {
        self.read()
            .accounts
            .values()
            .map(|e| u64::from(e.in_flight))
            .sum()
    }

    /// The identity of an account's attempt (its current access token).
    pub fn identity(&self, id: &str) -> Option<Identity> {
        let inner = self.read();
        let e = inner.accounts.get(id)?;
        let s = e.secrets.as_ref()?;
        Some(Self::identity_of(e, s))
    }

    /// The identity of an account (`e`) with its secrets (`s`).
    fn identity_of(e: &Entry, s: &AccountSecrets) -> Identity {
        let (access_token, bearer, values) = e.made(s.access_token.expose());
        Identity {
            bearer,
            values,
            access_token,
            chatgpt_account_id: Arc::clone(&e.chatgpt_id),
            installation_id: Arc::clone(&e.installation_id),
            proxy: e.proxy.clone(),
            route: match &e.route {
                Route::Workspace(r) => Some(Arc::clone(r)),
                _ => None,
            },
        }
    }

    /// Whether the account's route is yet to be asked (or asking failed: asked again).
    pub fn routing_unknown(&self, id: &str) -> bool {
        self.read()
            .accounts
            .get(id)
            .is_some_and(|e| matches!(e.route, Route::Unknown | Route::Failed(_)))
    }

    /// Keeps what routing discovery found for an account.
    pub fn set_route(&self, id: &str, found: Result<crate::upstream::routing::Discovery, String>) {
        let route = match found {
            Ok(None) => Route::Default,
            Ok(Some(r)) => Route::Workspace(Arc::new(r)),
            Err(why) => Route::Failed(why),
        };
        let mut inner = self.write();
        if let Some(mut e) = inner.accounts.get_mut(id) {
            if e.route != route {
                match &route {
                    Route::Workspace(r) => {
                        tracing::info!(account = %id, origin = %r.origin, over = %r.override_value, "workspace routing: the account has its own origin")
                    }
                    Route::Failed(why) => {
                        tracing::warn!(account = %id, reason = %why, "workspace routing could not be discovered; the configured origin is used")
                    }
                    _ => {}
                }
            }
            e.route = route;
        }
    }

    /// The `chatgpt_account_id`s of several accounts, under one lock.
    pub fn chatgpt_account_ids(&self, ids: &[impl AsRef<str>]) -> Vec<Arc<str>> {
        let inner = self.read();
        ids.iter()
            .map(|id| {
                let id = id.as_ref();
                inner
                    .accounts
                    .get(id)
                    .map_or_else(|| Arc::from(id), |e| Arc::clone(&e.chatgpt_id))
            })
            .collect()
    }

    pub fn chatgpt_account_id(&self, id: &str) -> Option<String> {
        self.read()
            .accounts
            .get(id)
            .map(|e| e.record.chatgpt_account_id.clone())
    }

    /// Classifies a failure (the one classifier, `health::classify`) and applies it to its
    /// account, unless the prompt's `blame` is spent (an unexplained failure that already
    /// cooled another account for it); returns the class, which decides what the caller does
    /// next.
    pub fn report_failure(
        &self,
        id: &str,
        facts: &Facts,
        origin: Origin<'_>,
        blame: &mut health::Blame,
    ) -> Class {
        self.judge(id, facts, origin, blame).class
    }

    /// The operators' rules in force.
    pub fn rules(&self) -> Arc<Vec<rules::Rule>> {
        Arc::clone(&self.rules.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the operators' rules (at start and on reload); the next failure is judged by
    /// them.
    pub fn set_rules(&self, rules: Vec<rules::Rule>) {
        tracing::info!(rules = rules.len(), "operator rules in force");
        *self.rules.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
    }

    /// Judges a failure of a request on account `id`: the first operator rule that matches
    /// decides (its class, cooldown and scope, or a pass-through), else the built-in
    /// classification. The effect is applied within the prompt's blame (an unexplained failure
    /// cools at most one account per prompt).
    pub fn judge(
        &self,
        id: &str,
        facts: &Facts,
        origin: Origin<'_>,
        blame: &mut health::Blame,
    ) -> Verdict {
        let rules = self.rules();
        let Some(rule) = rules::first_match(&rules, facts, origin.model) else {
            let class = health::classify(facts, origin.model);
            self.apply_judged(id, class, facts, origin, blame, None);
            return Verdict {
                class,
                rule: None,
                scope: rules::Scope::Account,
                cooldown: None,
                passed: None,
            };
        };
        let verdict = Verdict {
            class: if rule.pass_through {
                Class::Caller
            } else {
                rule.class
                    .unwrap_or_else(|| health::classify(facts, origin.model))
            },
            rule: Some(rule.name.clone()),
            scope: rule.scope,
            cooldown: rule.cooldown,
            passed: rule
                .pass_through
                .then(|| health::classify(facts, origin.model)),
        };
        tracing::info!(account = %id, rule = %rule.name, class = verdict.class.as_str(), scope = rule.scope.as_str(), "operator rule matched");
        match rule.scope {
            _ if rule.pass_through => {}
            rules::Scope::Account => {
                self.apply_judged(id, verdict.class, facts, origin, blame, rule.cooldown)
            }
            // The caller keeps this key's session away from the account.
            rules::Scope::Session => {}
            rules::Scope::Model => {
                self.mark_unsupported(id, origin.model, rule.cooldown.unwrap_or(UNSUPPORTED_TTL))
            }
        }
        verdict
    }

    fn apply_judged(
        &self,
        id: &str,
        class: Class,
        facts: &Facts,
        origin: Origin<'_>,
        blame: &mut health::Blame,
        cooldown: Option<Duration>,
    ) {
        if blame.allows(facts, class) {
            self.report_with(id, class, Some(facts), origin, cooldown);
        } else {
            tracing::info!(account = %id, error = %facts.summary(), "unexplained failure: this prompt already cooled an account for one; this one is not cooled");
        }
    }

    /// Leaves `model` out of the account's candidates for `ttl` (visible in its
    /// `unsupported_models`, cleared by clear-cooldown).
    fn mark_unsupported(&self, id: &str, model: &str, ttl: Duration) {
        let now = self.clock.now_ms();
        if let Some(mut e) = self.write().accounts.get_mut(id) {
            e.unsupported.retain(|_, until| *until > now);
            e.unsupported.insert(
                model.to_string(),
                now.saturating_add(crate::base::duration::whole_ms(ttl)),
            );
        }
        tracing::info!(account = %id, model, "model marked unsupported for this account");
    }

    /// Applies the class of an attempt that began now to its account (see
    /// [`Fleet::report_from`]).
    pub fn report(
        &self,
        id: &str,
        class: Class,
        facts: Option<&Facts>,
        model: &str,
    ) -> Option<Transition> {
        let started_ms = self.clock.now_ms();
        self.report_from(id, class, facts, Origin { model, started_ms })
    }

    /// Applies an attempt's class to its account (the effects of DESIGN §5), persisting any
    /// transition without making the caller wait for the disk.
    pub fn report_from(
        &self,
        id: &str,
        class: Class,
        facts: Option<&Facts>,
        origin: Origin<'_>,
    ) -> Option<Transition> {
        self.report_with(id, class, facts, origin, None)
    }

    /// The same, with an operator rule's `cooldown` instead of the class's ladder.
    fn report_with(
        &self,
        id: &str,
        class: Class,
        facts: Option<&Facts>,
        origin: Origin<'_>,
        cooldown: Option<Duration>,
    ) -> Option<Transition> {
        let Origin { model, started_ms } = origin;
        let now = self.clock.now_ms();
        if class == Class::ModelUnsupported {
            self.mark_unsupported(id, model, UNSUPPORTED_TTL);
        }
        let mut grew = false;
        let applied = {
            let mut inner = self.write();
            let mut e = inner.accounts.get_mut(id)?;
            // A burst limit on the responses endpoints halves the account's concurrency; one
            // from the token or usage endpoint says nothing about how much it may run at once.
            let on_responses = facts
                .is_none_or(|f| matches!(f.endpoint, Endpoint::Responses | Endpoint::WebSocket));
            match class {
                Class::RateLimited if on_responses => Self::shrink_limit(&mut e),
                Class::Success => grew = self.grow_limit(&mut e),
                _ => {}
            }
            e.health
                .apply_for(class, facts, now, started_ms, cooldown)
                .map(|t| (t, e.health.clone()))
        };
        if grew {
            self.hand_off(id);
        }
        let (transition, health) = applied?;
        tracing::info!(
            account = %id,
            from = transition.from.as_str(),
            to = transition.to.as_str(),
            class = class.as_str(),
            reason = transition.reason.map_or("", Class::as_str),
            cooldown_until_ms = health.cooldown_until_ms,
            "account transition"
        );
        self.persist_health(id, &health);
        if matches!(
            transition.to,
            AccountState::Cooling | AccountState::NeedsReauth
        ) {
            self.withdraw_waiters(id);
        }
        Some(transition)
    }

    /// The account proved healthy (its background probe passed; or whoever added it vouches
    /// for it, as the demo does for its simulated accounts): it takes requests from now on,
    /// and the requests waiting for it get its slots. True when it was waiting for that.
    pub fn proven(&self, id: &str) -> bool {
        let now = self.clock.now_ms();
        let health = {
            let mut inner = self.write();
            let Some(mut e) = inner.accounts.get_mut(id) else {
                return false;
            };
            e.health.proven(now).then(|| e.health.clone())
        };
        let Some(h) = health else { return false };
        tracing::info!(account = %id, "account proven; it takes requests");
        self.persist_health(id, &h);
        self.hand_off(id);
        true
    }

    /// Shows a failure on the account without changing its state (a refresh that failed while
    /// the current access token is still usable).
    pub(crate) fn note_failure(&self, id: &str, class: Class, facts: &Facts) {
        let now = self.clock.now_ms();
        let health = {
            let mut inner = self.write();
            let Some(mut e) = inner.accounts.get_mut(id) else {
                return;
            };
            e.health.note_error(class, facts, now);
            e.health.clone()
        };
        self.persist_health(id, &health);
    }

    /// Queues a health write; the request path never waits for it.
    pub(crate) fn persist_health(&self, id: &str, health: &Health) {
        match Store::health_mutation(id, &health.to_record()) {
            Ok(m) => self.store.enqueue(vec![m]),
            Err(e) => tracing::error!(error = %e, "cannot encode account health"),
        }
    }

    /// Whether any account supports `model` now or could once its marks expire.
    pub fn model_marked_everywhere(&self, model: &str) -> bool {
        let now = self.clock.now_ms();
        let inner = self.read();
        let usable: Vec<&Entry> = inner
            .accounts
            .values()
            .filter(|e| e.record.enabled && e.health.state != State::NeedsReauth)
            .collect();
        !usable.is_empty() && usable.iter().all(|e| e.is_unsupported(model, now))
    }

    /// Records the usage windows the backend reported for an account. The count of reset
    /// credits comes from the usage poll only: an answer's headers keep the last one known.
    pub fn update_quota(&self, id: &str, mut q: QuotaSnapshot) {
        if let Some(mut e) = self.write().accounts.get_mut(id) {
            if q.reset_credits.is_none() {
                q.reset_credits = e.quota.as_ref().and_then(|old| old.reset_credits);
            }
            if q.credit_expires_at.is_none() && q.reset_credits != Some(0) {
                q.credit_expires_at = e.quota.as_ref().and_then(|old| old.credit_expires_at);
            }
            e.quota = Some(q);
        }
    }

    /// A summary of why nothing is available: `(all_on_quota, earliest_reset_ms, text)`.
    pub fn exhaustion_summary(&self) -> (bool, Option<u64>, String) {
        let now = self.clock.now_ms();
        let inner = self.read();
        let total = inner.accounts.len();
        let mut groups: BTreeMap<String, (usize, Option<u64>)> = BTreeMap::new();
        let mut usable = 0;
        let mut on_quota = 0;
        let mut earliest_quota: Option<u64> = None;
        let mut earliest_any: Option<u64> = None;
        for e in inner.accounts.values() {
            let (label, until) = match (e.record.enabled, e.health.effective(now)) {
                (false, _) => ("disabled".to_string(), None),
                (true, Effective::NeedsReauth) => ("need re-login".to_string(), None),
                (true, Effective::Cooling { until_ms }) => {
                    usable += 1;
                    let reason = e.health.reason.map_or("cooling", Class::as_str);
                    if e.health.reason == Some(Class::Quota) {
                        on_quota += 1;
                        earliest_quota =
                            Some(earliest_quota.map_or(until_ms, |x: u64| x.min(until_ms)));
                    }
                    earliest_any = Some(earliest_any.map_or(until_ms, |x: u64| x.min(until_ms)));
                    (format!("cooling ({reason}"), Some(until_ms))
                }
                (true, Effective::HalfOpen) => {
                    usable += 1;
                    ("half-open, probe running".to_string(), None)
                }
                (true, Effective::Probing) => {
                    usable += 1;
                    ("being probed".to_string(), None)
                }
                (true, Effective::Ready) => {
                    usable += 1;
                    ("ready but unavailable for this request".to_string(), None)
                }
            };
            let g = groups.entry(label).or_insert((0, None));
            g.0 += 1;
            if let Some(u) = until {
                g.1 = Some(g.1.map_or(u, |x: u64| x.min(u)));
            }
        }
        let parts: Vec<String> = groups
            .into_iter()
            .map(|(label, (n, until))| match until {
                Some(u) => format!(
                    "{n} {label}, resets in {})",
                    human_duration(u.saturating_sub(now))
                ),
                None => format!("{n} {label}"),
            })
            .collect();
        let noun = if total == 1 { "account" } else { "accounts" };
        let text = if total == 0 {
            "no accounts in the pool".to_string()
        } else {
            format!("{total} {noun}: {}", parts.join(", "))
        };
        let all_quota = usable > 0 && on_quota == usable;
        (
            all_quota,
            if all_quota {
                earliest_quota
            } else {
                earliest_any
            },
            text,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::health::AccountState;
    use super::*;
    use crate::base::clock::ManualClock;
    use crate::sim::auth::{AuthSpec, auth_json};

    fn spec(n: u32, tag: &str) -> AuthSpec {
        AuthSpec {
            email: format!("user{n}@example.com"),
            chatgpt_account_id: format!("acc-{n}"),
            chatgpt_user_id: format!("user-{n}"),
            plan: "plus".into(),
            access_exp: 2_000_000_000,
            token_tag: tag.into(),
        }
    }

    fn fleet() -> (Fleet, ManualClock) {
        let clock = ManualClock::new(1_767_225_600_000);
        let f = Fleet::load(Store::open_in_memory().unwrap(), Arc::new(clock.clone())).unwrap();
        (f, clock)
    }

    /// A plan's candidates as owned ids.
    fn order_of(plan: &Plan) -> Vec<String> {
        plan.order.iter().map(|id| id.to_string()).collect()
    }

    /// Imports an account and vouches for it (it takes requests at once).
    async fn import(f: &Fleet, n: u32) -> AccountView {
        let a = import_unproven(f, n).await;
        assert!(f.proven(&a.id));
        f.get(&a.id).unwrap()
    }

    async fn import_unproven(f: &Fleet, n: u32) -> AccountView {
        f.import(
            f.parse_auth(auth_json(&spec(n, "t")).to_string().as_bytes())
                .unwrap(),
        )
        .await
        .unwrap()
        .account
    }

    #[tokio::test]
    async fn an_account_is_probed_before_it_takes_requests_new_relogged_or_long_cooled() {
        let store = Store::open_in_memory().unwrap();
        let clock = ManualClock::new(1_767_225_600_000);
        let f = Fleet::load(store.clone(), Arc::new(clock.clone())).unwrap();
        // New: a candidate that is busy until its probe passes.
        let a = import_unproven(&f, 1).await.id;
        assert_eq!(f.get(&a).unwrap().state, AccountState::Probing);
        assert_eq!(order_of(&f.plan("m", None)), vec![a.clone()]);
        assert_eq!(f.lease(&a, "m").unwrap_err(), SkipReason::Unproven);
        // Unproven survives a restart.
        store.flush().await.unwrap();
        let f = Fleet::load(store.clone(), Arc::new(clock.clone())).unwrap();
        assert_eq!(f.get(&a).unwrap().state, AccountState::Probing);
        assert!(f.proven(&a));
        assert!(!f.proven(&a), "only an unproven account is proven");
        assert_eq!(f.get(&a).unwrap().state, AccountState::Ready);
        drop(f.lease(&a, "m").unwrap());

        // Logged in again while cooling on quota: the cooldown stays, then a probe decides.
        f.report(&a, Class::Quota, None, "m");
        import_unproven(&f, 1).await;
        let v = f.get(&a).unwrap();
        assert_eq!(
            (v.state, v.reason),
            (AccountState::Cooling, Some(Class::Quota))
        );
        clock.advance(Duration::from_secs(3601));
        assert_eq!(f.get(&a).unwrap().state, AccountState::Probing);
        assert!(f.proven(&a));

        // Back from a long cooldown (the 1 h quota default): probed; from a short one:
        // half-open, decided by one request.
        f.report(&a, Class::Quota, None, "m");
        clock.advance(Duration::from_secs(3601));
        assert_eq!(f.get(&a).unwrap().state, AccountState::Probing);
        assert!(f.proven(&a));
        f.report(&a, Class::Transient, None, "m");
        clock.advance(Duration::from_secs(31));
        assert_eq!(f.get(&a).unwrap().state, AccountState::HalfOpen);
    }

    #[tokio::test]
    async fn reimport_updates_tokens_instead_of_duplicating() {
        let (f, _) = fleet();
        let first = f
            .import(
                f.parse_auth(auth_json(&spec(1, "old")).to_string().as_bytes())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert!(first.created);
        let again = f
            .import(
                f.parse_auth(auth_json(&spec(1, "new")).to_string().as_bytes())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert!(!again.created);
        assert_eq!(again.account.id, first.account.id);
        assert_eq!(f.len(), 1);
        let secrets = f.store.account_secrets(&first.account.id).unwrap().unwrap();
        assert!(secrets.refresh_token.expose().ends_with("_new"));
    }

    #[tokio::test]
    async fn accounts_are_found_by_id_account_id_email_or_label() {
        let (f, _) = fleet();
        let a = import(&f, 1).await;
        for sel in [a.id.as_str(), "acc-1", "user1@example.com"] {
            assert_eq!(f.resolve(sel).unwrap(), a.id);
        }
        assert!(matches!(f.resolve("nobody"), Err(FleetError::NotFound(_))));
        let d = f.set_enabled("acc-1", false).await.unwrap();
        assert_eq!((d.enabled, d.state), (false, AccountState::Disabled));
        f.remove(&a.id).await.unwrap();
        assert!(f.is_empty());
        assert!(f.store.load_accounts().unwrap().is_empty());
    }

    /// A pool larger than the failover budget: the plan keeps the best `MAX_CANDIDATES` by
    /// the strategy, and accounts it ranks equal still take turns, one step per plan.
    #[tokio::test]
    async fn a_pool_larger_than_the_budget_ranks_by_quota_and_rotates_among_equals() {
        let (f, _clock) = fleet();
        let n = scheduler::MAX_CANDIDATES as u32 + 8;
        let mut ids = Vec::new();
        for i in 0..n {
            ids.push(import(&f, i).await.id);
        }
        ids.sort();
        // Equal keys: each plan is the next MAX_CANDIDATES accounts in id order, wrapping,
        // starting one further on each time.
        let mut firsts = Vec::new();
        for _ in 0..n {
            let order = f.plan("m", None).order;
            assert_eq!(order.len(), scheduler::MAX_CANDIDATES);
            let at = ids.iter().position(|id| *id == *order[0]).unwrap();
            let expected: Vec<String> = (0..scheduler::MAX_CANDIDATES)
                .map(|k| ids[(at + k) % ids.len()].clone())
                .collect();
            assert_eq!(
                order.iter().map(|id| id.to_string()).collect::<Vec<_>>(),
                expected
            );
            firsts.push(at);
        }
        firsts.sort();
        assert_eq!(
            firsts,
            (0..ids.len()).collect::<Vec<_>>(),
            "every account leads once"
        );

        // Distinct quota use: the least used first, the most used left out, whatever the
        // rotation; an account over the ceiling is skipped while others have headroom.
        let used = |i: usize| ((i * 7) % ids.len()) as f64 * 3.0;
        for (i, id) in ids.iter().enumerate() {
            f.update_quota(
                id,
                QuotaSnapshot {
                    primary_used_percent: Some(used(i)),
                    ..QuotaSnapshot::default()
                },
            );
        }
        let mut by_use: Vec<usize> = (0..ids.len()).filter(|&i| used(i) < 99.0).collect();
        by_use.sort_by(|&a, &b| used(a).total_cmp(&used(b)));
        let expected: Vec<String> = by_use
            .iter()
            .take(scheduler::MAX_CANDIDATES)
            .map(|&i| ids[i].clone())
            .collect();
        for _ in 0..3 {
            let plan = f.plan("m", None);
            assert_eq!(order_of(&plan), expected);
            let over: Vec<&String> = plan
                .skipped
                .iter()
                .filter(|(_, r)| *r == SkipReason::QuotaCeiling)
                .map(|(id, _)| id)
                .collect();
            assert_eq!(
                over.len(),
                (0..ids.len()).filter(|&i| used(i) >= 99.0).count()
            );
        }
    }

    #[tokio::test]
    async fn candidates_rotate_and_skip_bad_accounts_with_reasons() {
        let (f, clock) = fleet();
        let a = import(&f, 1).await.id;
        let b = import(&f, 2).await.id;
        let c = import(&f, 3).await.id;
        let first: Vec<String> = (0..3)
            .map(|_| f.plan("m", None).order[0].to_string())
            .collect();
        let mut sorted = first.clone();
        sorted.sort();
        let mut all = vec![a.clone(), b.clone(), c.clone()];
        all.sort();
        assert_eq!(sorted, all, "round robin starts at each account once");

        f.report(&a, Class::Quota, None, "m");
        f.set_enabled(&b, false).await.unwrap();
        let cands = f.plan("m", None);
        assert_eq!(order_of(&cands), vec![c.clone()]);
        assert!(cands.skipped.contains(&(a.clone(), SkipReason::Cooling)));
        assert!(cands.skipped.contains(&(b.clone(), SkipReason::Disabled)));

        f.report(&c, Class::ModelUnsupported, None, "m");
        assert!(f.plan("m", None).order.is_empty());
        assert_eq!(order_of(&f.plan("other", None)), vec![c.clone()]);

        let (all_quota, _, text) = f.exhaustion_summary();
        assert!(!all_quota);
        assert!(text.starts_with("3 accounts:"), "{text}");
        // Back from an hour's cooldown it is proved by a probe before it takes requests.
        clock.advance(Duration::from_secs(3600));
        assert_eq!(f.get(&a).unwrap().state, AccountState::Probing);
    }

    #[tokio::test]
    async fn a_half_open_account_admits_one_probe_and_leases_release_on_drop() {
        let (f, clock) = fleet();
        let a = import(&f, 1).await.id;
        f.report(&a, Class::Transient, None, "m");
        assert_eq!(f.lease(&a, "m").unwrap_err(), SkipReason::Cooling);
        clock.advance(Duration::from_secs(31));
        let probe = f.lease(&a, "m").unwrap();
        assert_eq!(f.lease(&a, "m").unwrap_err(), SkipReason::Probing);
        assert_eq!(f.in_flight(), 1);
        drop(probe);
        assert_eq!(f.in_flight(), 0);
        assert!(f.lease(&a, "m").is_ok());
    }

    #[tokio::test]
    async fn health_survives_a_reload() {
        let store = Store::open_in_memory().unwrap();
        let clock = ManualClock::new(1_767_225_600_000);
        let f = Fleet::load(store.clone(), Arc::new(clock.clone())).unwrap();
        let a = import(&f, 1).await.id;
        f.report(&a, Class::Quota, None, "m");
        store.flush().await.unwrap();
        let g = Fleet::load(store, Arc::new(clock)).unwrap();
        let view = g.get(&a).unwrap();
        assert_eq!(
            (view.state, view.reason),
            (AccountState::Cooling, Some(Class::Quota))
        );
    }

    #[test]
    fn installation_ids_are_stable_and_uuid_shaped() {
        let a = installation_id("abcd1234");
        assert_eq!(a, installation_id("abcd1234"));
        assert_ne!(a, installation_id("other"));
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }
}
