//! The one owner of failure classification and account health (DESIGN §5).
//!
//! [`classify`] turns upstream facts — from any endpoint: responses, the WebSocket, the token
//! endpoint, the usage document — into a [`Class`]; [`Health::apply`] applies the class's
//! effect on the account at a given time. Pure functions of their inputs and the clock, so the
//! ladders are tested without sleeping.

use std::time::Duration;

use crate::base::names::named;
use crate::store::records::HealthRecord;
use crate::upstream::failure::{Endpoint, Facts};

named! {
    /// What an attempt's outcome says about the account.
    pub enum Class {
        Success => "success",
        Quota => "quota",
        RateLimited => "rate_limited",
        AuthExpired => "auth_expired",
        AuthDead => "auth_dead",
        EdgeChallenge => "edge_challenge",
        ModelUnsupported => "model_unsupported",
        /// A policy refusal of this prompt on this account (`cyber_policy`): not the account's
        /// state; the session avoids the account for a while.
        Policy => "policy",
        Caller => "caller",
        Transient => "transient",
        ClientCancelled => "client_cancelled",
        /// The client stopped reading its answer: neutral.
        ClientStalled => "client_stalled",
        /// The gateway gave the attempt up (the request's deadline, shutdown): neutral.
        Abandoned => "abandoned",
    }
}

named! {
    /// Why an account needs a new login.
    pub enum Reauth {
        RefreshTokenReused => "refresh_token_reused",
        RefreshTokenExpired => "refresh_token_expired",
        RefreshTokenInvalidated => "refresh_token_invalidated",
        InvalidGrant => "invalid_grant",
        TokenInvalidated => "token_invalidated",
        AccountDeactivated => "account_deactivated",
        /// A workspace access token (never refreshed) expired, or the backend stopped
        /// accepting it.
        AccessTokenExpired => "access_token_expired",
        /// The token endpoint answered 401 without one of the codes above.
        Refused => "refused",
        /// Written before the reason was kept.
        Unknown => "unknown",
    }
}

impl Reauth {
    /// What happened, for the operator.
    pub fn describe(self) -> &'static str {
        match self {
            Reauth::RefreshTokenReused => {
                "this login's refresh token had already been used: another holder of the same \
                 login refreshed it first (a Codex CLI or another gateway using the same \
                 auth.json, or a copy exported with --keep), or a copy older than the login this \
                 account held was imported over it"
            }
            Reauth::RefreshTokenExpired => "this login's refresh token has expired",
            Reauth::RefreshTokenInvalidated => {
                "this login's refresh token was revoked (a logout, or a newer login replaced it)"
            }
            Reauth::InvalidGrant => {
                "the token endpoint no longer accepts this login (invalid_grant)"
            }
            Reauth::TokenInvalidated => "the backend invalidated this login's tokens",
            Reauth::AccountDeactivated => "the ChatGPT account behind this login was deactivated",
            Reauth::Refused => "the token endpoint refused this login's refresh token",
            Reauth::AccessTokenExpired => {
                "the access token expired (a workspace access token is never refreshed)"
            }
            Reauth::Unknown => "this login stopped working",
        }
    }

    /// What happened and what to do about it, for a login of this kind (a workspace access
    /// token is imported again, never logged in).
    pub fn advice_for(self, account_id: &str, access_token_only: bool) -> String {
        if access_token_only && self != Reauth::AccessTokenExpired {
            return format!(
                "{} — import a new access token with `switchyard account import --access-token`",
                self.describe()
            );
        }
        self.advice(account_id)
    }

    /// What happened and what to do about it.
    pub fn advice(self, account_id: &str) -> String {
        match self {
            // A new login cannot bring a deactivated account back.
            Reauth::AccountDeactivated => self.describe().to_string(),
            Reauth::AccessTokenExpired => format!(
                "{} — import a new one with `switchyard account import --access-token`",
                self.describe()
            ),
            _ => format!(
                "{} — run `switchyard account login --account {account_id}`",
                self.describe()
            ),
        }
    }
}

impl Class {
    /// Whether the class takes the account out of service for a while.
    pub fn cools_account(self) -> bool {
        matches!(
            self,
            Class::Quota
                | Class::RateLimited
                | Class::EdgeChallenge
                | Class::Transient
                | Class::AuthDead
        )
    }
}

const QUOTA_CODES: [&str; 5] = [
    "usage_limit_reached",
    "insufficient_quota",
    "usage_not_included",
    "organization_usage_limit_exceeded",
    "organization_spend_limit_exceeded",
];
/// Refusals of the prompt's content by a policy: the backend's verdict on the prompt, the same
/// on every account.
const POLICY_CODES: [&str; 2] = ["cyber_policy", "bio_policy"];
/// Rate limits by another name.
const RATE_CODES: [&str; 2] = ["rate_limit_exceeded", "slow_down"];
/// What the request asked for is not available now on any account (the flex service tier
/// has no capacity): the client's to hear and decide, not the account's fault.
const UNAVAILABLE_CODES: [&str; 1] = ["flex_unavailable"];
/// Codes that mean the login itself is dead, wherever they come from.
const DEAD_AUTH_CODES: [&str; 7] = [
    "access_token_expired",
    "token_invalidated",
    "account_deactivated",
    "refresh_token_reused",
    "refresh_token_expired",
    "refresh_token_invalidated",
    "invalid_grant",
];

/// The prompt's own problem, in whatever carrier (a 400, or a `response.failed` in a 200).
const CALLER_CODES: [&str; 2] = ["context_length_exceeded", "invalid_prompt"];
/// Failure events whose meaning is known: the backend is overloaded or failed.
const KNOWN_TRANSIENT_CODES: [&str; 2] = ["server_is_overloaded", "server_error"];

fn is_any(v: Option<&str>, set: &[&str]) -> bool {
    v.is_some_and(|v| set.contains(&v))
}

/// Classifies the facts of a failed exchange with any endpoint of the backend; `model` is the
/// model the request asked for ("" when it asked for none).
pub fn classify(f: &Facts, model: &str) -> Class {
    let code = f.error_code.as_deref();
    let kind = f.error_type.as_deref();
    let either = |set: &[&str]| is_any(code, set) || is_any(kind, set);
    if f.transport.is_some() && f.status.is_none() {
        return Class::Transient;
    }
    if either(&DEAD_AUTH_CODES) {
        return Class::AuthDead;
    }
    if f.endpoint == Endpoint::Token {
        return classify_token_answer(f);
    }
    if either(&QUOTA_CODES) {
        return Class::Quota;
    }
    if either(&POLICY_CODES) {
        return Class::Policy;
    }
    if either(&CALLER_CODES) || either(&UNAVAILABLE_CODES) {
        return Class::Caller;
    }
    if either(&["token_expired"]) {
        return Class::AuthExpired;
    }
    if either(&RATE_CODES) {
        return Class::RateLimited;
    }
    if is_unsupported_model(f.message.as_deref(), model) {
        return Class::ModelUnsupported;
    }
    match f.status.unwrap_or(0) {
        200..=299 => Class::Transient, // a failure event inside a 200 stream, not a caller problem
        429 => Class::RateLimited,
        401 => Class::AuthExpired,
        403 => Class::EdgeChallenge,
        408 | 409 | 425 => Class::Transient,
        400..=499 => Class::Caller,
        _ => Class::Transient,
    }
}

/// A failure event inside a 200 (or a WebSocket error frame of one) whose code means nothing
/// known: transient for the attempt, but no reason to believe the account is at fault. One
/// prompt may cool at most one account for such failures ([`Blame`]).
pub fn is_unexplained(f: &Facts, class: Class) -> bool {
    class == Class::Transient
        && f.transport.is_none()
        && f.status.is_some_and(|s| (200..300).contains(&s))
        && !is_any(f.error_code.as_deref(), &KNOWN_TRANSIENT_CODES)
        && !is_any(f.error_type.as_deref(), &KNOWN_TRANSIENT_CODES)
}

/// What one prompt may still do to the accounts it is tried on.
#[derive(Debug, Default)]
pub struct Blame {
    /// An unexplained failure of this prompt has cooled an account already.
    unexplained_spent: bool,
}

impl Blame {
    /// Whether a failure judged `class` may have its effect on the account.
    pub fn allows(&mut self, f: &Facts, class: Class) -> bool {
        if !is_unexplained(f, class) {
            return true;
        }
        !std::mem::replace(&mut self.unexplained_spent, true)
    }
}

/// The token endpoint's answer to a refresh (the dead-login codes are handled before). Our
/// request to it is always the same, so a 4xx is not a caller error: only a 401 says the
/// refresh token itself was refused; a challenge page, a 400 with an unknown error or a 5xx
/// says nothing about the login.
fn classify_token_answer(f: &Facts) -> Class {
    match f.status.unwrap_or(0) {
        401 => Class::AuthDead,
        403 => Class::EdgeChallenge,
        429 => Class::RateLimited,
        _ => Class::Transient,
    }
}

/// Why the facts of an [`Class::AuthDead`] answer mean a new login is needed.
pub fn reauth_reason(f: &Facts) -> Reauth {
    [f.error_code.as_deref(), f.error_type.as_deref()]
        .into_iter()
        .flatten()
        .find_map(Reauth::from_name)
        .unwrap_or(Reauth::Refused)
}

/// The backend's answer for a model this ChatGPT account may not use (codex-protocol §J5): the
/// whole sentence, naming the requested model. Anything looser would take a caller's mistake
/// ("Unsupported parameter: 'temperature' is not supported with this model.") for a verdict on
/// the model, for every caller.
fn is_unsupported_model(message: Option<&str>, model: &str) -> bool {
    const BEFORE: &str = "The '";
    const AFTER: &str = "' model is not supported when using Codex with a ChatGPT account.";
    message.is_some_and(|m| {
        m.trim()
            .strip_prefix(BEFORE)
            .and_then(|rest| rest.strip_suffix(AFTER))
            == Some(model)
    })
}

named! {
    /// An account's persisted health state (`disabled` is the account's enabled flag).
    pub enum State {
        Ready => "ready",
        Cooling => "cooling",
        NeedsReauth => "needs_reauth",
    }
}

named! {
    /// An account's state as operators see it.
    pub enum AccountState {
        Ready => "ready",
        Cooling => "cooling",
        /// Cooling whose time is up: one request (or probe) decides.
        HalfOpen => "half_open",
        /// Not known to be healthy (new, logged in again, or back from a long cooldown): a
        /// background probe decides before it takes requests.
        Probing => "probing",
        NeedsReauth => "needs_reauth",
        Disabled => "disabled",
    }
}

/// Cooldown ladders.
pub const TRANSIENT_LADDER: [Duration; 4] = [
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
    Duration::from_secs(1800),
];
pub const RATE_LADDER: [Duration; 4] = [
    Duration::from_secs(5),
    Duration::from_secs(15),
    Duration::from_secs(60),
    Duration::from_secs(300),
];
pub const EDGE_LADDER: [Duration; 4] = [
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(90),
    Duration::from_secs(120),
];
/// A failure within this long of the account's last recovery escalates its ladder.
pub const STREAK_WINDOW: Duration = Duration::from_secs(300);
/// Quota cooldown when the upstream gives no reset time, and the longest one accepted.
pub const QUOTA_DEFAULT: Duration = Duration::from_secs(3600);
pub const QUOTA_CAP: Duration = Duration::from_secs(7 * 24 * 3600);
/// Successes in a row needed to clear an escalated account.
pub const CLEAN_SUCCESSES: u8 = 2;
/// An account back from a cooldown longer than this is probed before it takes requests.
pub const LONG_COOLDOWN: Duration = Duration::from_secs(30 * 60);

/// The three ladders an account climbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ladder {
    Transient = 0,
    Rate = 1,
    Edge = 2,
}

impl Ladder {
    fn steps(self) -> &'static [Duration; 4] {
        match self {
            Ladder::Transient => &TRANSIENT_LADDER,
            Ladder::Rate => &RATE_LADDER,
            Ladder::Edge => &EDGE_LADDER,
        }
    }
}

/// Persisted health of one account (written through on every transition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub state: State,
    /// The class that put the account in its state.
    pub reason: Option<Class>,
    /// Why a `needs_reauth` account needs a new login.
    pub reauth: Option<Reauth>,
    /// Unix ms; meaningful while cooling.
    pub cooldown_until_ms: u64,
    /// Next step on each ladder, indexed by [`Ladder`].
    pub levels: [u8; 3],
    /// Unix ms of the last failure that counted towards a ladder.
    pub last_failure_ms: u64,
    pub clean_successes: u8,
    pub last_error: Option<String>,
    pub last_error_ms: u64,
    /// When the running cooldown began (unix ms; kept in memory only: after a restart no
    /// attempt from before it is in flight).
    pub cooled_at_ms: u64,
    /// Not known to be healthy (new, or logged in again) until a background probe passes.
    pub unproven: bool,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            state: State::Ready,
            reason: None,
            reauth: None,
            cooldown_until_ms: 0,
            levels: [0; 3],
            last_failure_ms: 0,
            clean_successes: 0,
            last_error: None,
            last_error_ms: 0,
            cooled_at_ms: 0,
            unproven: false,
        }
    }
}

/// The part of [`Health`] that decides its [`Effective`] state at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    state: State,
    unproven: bool,
    /// The running (or ended) cooldown lasted longer than [`LONG_COOLDOWN`]. After a restart
    /// its start is unknown, which counts as long.
    long_cooldown: bool,
    cooldown_until_ms: u64,
}

impl Gate {
    pub fn effective(&self, now_ms: u64) -> Effective {
        match self.state {
            State::Ready if self.unproven => Effective::Probing,
            State::Ready => Effective::Ready,
            State::NeedsReauth => Effective::NeedsReauth,
            State::Cooling if now_ms < self.cooldown_until_ms => Effective::Cooling {
                until_ms: self.cooldown_until_ms,
            },
            State::Cooling if self.unproven || self.long_cooldown => Effective::Probing,
            State::Cooling => Effective::HalfOpen,
        }
    }

    /// Ready at any moment (a state that does not change with time).
    pub fn ready(&self) -> bool {
        self.state == State::Ready && !self.unproven
    }
}

/// The state as seen at a moment: cooling turns half-open when its time is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effective {
    Ready,
    Cooling {
        until_ms: u64,
    },
    HalfOpen,
    /// Takes no request until a background probe passes.
    Probing,
    NeedsReauth,
}

impl Effective {
    pub fn state(self) -> AccountState {
        match self {
            Effective::Ready => AccountState::Ready,
            Effective::Cooling { .. } => AccountState::Cooling,
            Effective::HalfOpen => AccountState::HalfOpen,
            Effective::Probing => AccountState::Probing,
            Effective::NeedsReauth => AccountState::NeedsReauth,
        }
    }
}

/// A change of state worth an event and a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub from: AccountState,
    pub to: AccountState,
    pub class: Class,
    pub reason: Option<Class>,
}

use crate::base::duration::whole_ms as ms;

impl Health {
    pub fn effective(&self, now_ms: u64) -> Effective {
        self.gate().effective(now_ms)
    }

    /// What [`Health::effective`] depends on, small enough to copy into the scheduler's table.
    pub fn gate(&self) -> Gate {
        Gate {
            state: self.state,
            unproven: self.unproven,
            long_cooldown: self.cooldown_until_ms.saturating_sub(self.cooled_at_ms)
                > ms(LONG_COOLDOWN),
            cooldown_until_ms: self.cooldown_until_ms,
        }
    }

    /// A new login for this account: a dead login is alive again, cooldowns and ladders stay
    /// (its quota did not reset), and it is unproven until a probe passes.
    pub fn relogin(&mut self) {
        if self.state == State::NeedsReauth {
            self.state = State::Ready;
            self.reason = None;
            self.reauth = None;
        }
        self.unproven = true;
    }

    /// The background probe passed: the account takes requests again. True when that changed
    /// the state.
    pub fn proven(&mut self, now_ms: u64) -> bool {
        if self.effective(now_ms) != Effective::Probing {
            return false;
        }
        self.state = State::Ready;
        self.unproven = false;
        true
    }

    /// The level shown to operators: the highest ladder step reached.
    pub fn level(&self) -> u8 {
        self.levels.iter().copied().max().unwrap_or(0)
    }

    /// Applies one attempt's class at `now_ms`, for an attempt that began now (see
    /// [`Health::apply_from`]).
    pub fn apply(
        &mut self,
        class: Class,
        facts: Option<&Facts>,
        now_ms: u64,
    ) -> Option<Transition> {
        self.apply_from(class, facts, now_ms, now_ms)
    }

    /// Applies the class of an attempt that began at `started_ms`, at `now_ms`. Returns the
    /// transition when the state changed (or a cooldown was set or extended), `None` when
    /// nothing worth persisting happened.
    ///
    /// A failure of an attempt begun before the running cooldown is part of the incident that
    /// started it: it climbs no ladder (several requests in flight failing together are one
    /// step, not several). And no failure shortens a running cooldown.
    pub fn apply_from(
        &mut self,
        class: Class,
        facts: Option<&Facts>,
        now_ms: u64,
        started_ms: u64,
    ) -> Option<Transition> {
        self.apply_for(class, facts, now_ms, started_ms, None)
    }

    /// The same, with `cooldown` (an operator rule's) instead of the ladder or the quota's
    /// reset for a class that cools; it climbs no ladder.
    pub fn apply_for(
        &mut self,
        class: Class,
        facts: Option<&Facts>,
        now_ms: u64,
        started_ms: u64,
        cooldown: Option<Duration>,
    ) -> Option<Transition> {
        let before = self.clone();
        let from = self.effective(now_ms).state();
        let same_incident = matches!(self.effective(now_ms), Effective::Cooling { .. })
            && started_ms < self.cooled_at_ms;
        match class {
            // A success while a cooldown runs comes from an attempt that began before it (no
            // new attempt reaches a cooling account): it does not end the cooldown. Only one
            // after it — the half-open probe — does.
            Class::Success if matches!(self.effective(now_ms), Effective::Cooling { .. }) => {
                return None;
            }
            Class::Success => {
                if self.state == State::Cooling {
                    self.state = State::Ready;
                }
                if self.levels != [0; 3] {
                    self.clean_successes = self.clean_successes.saturating_add(1);
                    if self.clean_successes >= CLEAN_SUCCESSES {
                        self.levels = [0; 3];
                        self.clean_successes = 0;
                        self.reason = None;
                    }
                } else if self.state == State::Ready {
                    self.reason = None;
                }
            }
            _ if cooldown.is_some() && class.cools_account() && class != Class::AuthDead => {
                let wait = cooldown.unwrap_or_default();
                self.cool(now_ms.saturating_add(ms(wait)), class, now_ms);
            }
            Class::Quota => {
                let until = quota_reset_ms(facts, now_ms);
                self.cool(until, class, now_ms);
            }
            Class::RateLimited | Class::EdgeChallenge | Class::Transient if same_incident => {}
            Class::RateLimited => {
                let step = self.climb(Ladder::Rate, now_ms);
                let wait = facts
                    .and_then(|f| f.retry_after)
                    .map_or(step, |ra| ra.max(step));
                self.cool(now_ms.saturating_add(ms(wait)), class, now_ms);
            }
            Class::EdgeChallenge => {
                let step = self.climb(Ladder::Edge, now_ms);
                self.cool(now_ms.saturating_add(ms(step)), class, now_ms);
            }
            Class::Transient => {
                let step = self.climb(Ladder::Transient, now_ms);
                self.cool(now_ms.saturating_add(ms(step)), class, now_ms);
            }
            // The backend refused a token that was just refreshed: refreshing again will not
            // help for now; the account cools (reason `auth_expired`) on the transient ladder.
            Class::AuthExpired if facts.is_some_and(|f| f.after_refresh) && !same_incident => {
                let step = self.climb(Ladder::Transient, now_ms);
                self.cool(now_ms.saturating_add(ms(step)), class, now_ms);
            }
            Class::AuthDead => {
                self.state = State::NeedsReauth;
                self.reason = Some(class);
                self.reauth = Some(facts.map_or(Reauth::Unknown, reauth_reason));
                self.clean_successes = 0;
            }
            Class::AuthExpired
            | Class::ModelUnsupported
            | Class::Policy
            | Class::Caller
            | Class::ClientCancelled
            | Class::ClientStalled
            | Class::Abandoned => {}
        }
        if !matches!(
            class,
            Class::Success
                | Class::Caller
                | Class::Policy
                | Class::ClientCancelled
                | Class::ClientStalled
                | Class::Abandoned
                | Class::ModelUnsupported
                | Class::AuthExpired
        ) && let Some(f) = facts
        {
            self.note_error(class, f, now_ms);
        }
        if class == Class::AuthExpired
            && let Some(f) = facts.filter(|f| f.after_refresh)
        {
            self.note_error(class, f, now_ms);
        }
        if *self == before {
            return None;
        }
        let to = self.effective(now_ms).state();
        Some(Transition {
            from,
            to,
            class,
            reason: self.reason,
        })
    }

    /// A half-open account's probe showed output: the cooldown is over (the successes that
    /// clear an escalated ladder are still counted when answers complete). True when that
    /// changed the state.
    pub fn probe_passed(&mut self, now_ms: u64) -> bool {
        if self.effective(now_ms) != Effective::HalfOpen {
            return false;
        }
        self.state = State::Ready;
        true
    }

    /// Remembers a failure for the operator without changing the state.
    pub fn note_error(&mut self, class: Class, facts: &Facts, now_ms: u64) {
        self.last_error = Some(format!("{}: {}", class.as_str(), facts.summary()));
        self.last_error_ms = now_ms;
    }

    /// Steps `ladder` (escalating if the previous failure was recent) and returns the wait.
    fn climb(&mut self, ladder: Ladder, now_ms: u64) -> Duration {
        let idx = ladder as usize;
        let recovered_at = self.last_failure_ms.max(self.cooldown_until_ms.min(now_ms));
        let recent =
            self.last_failure_ms > 0 && now_ms.saturating_sub(recovered_at) <= ms(STREAK_WINDOW);
        if !recent {
            // A failure long after the last one starts the ladder over.
            self.levels[idx] = 0;
        }
        let steps = ladder.steps();
        let step = steps[usize::from(self.levels[idx]).min(steps.len() - 1)];
        self.levels[idx] = (self.levels[idx] + 1).min(steps.len() as u8);
        self.last_failure_ms = now_ms;
        self.clean_successes = 0;
        step
    }

    fn cool(&mut self, until_ms: u64, class: Class, now_ms: u64) {
        if self.state == State::NeedsReauth {
            return;
        }
        let running = self.state == State::Cooling && now_ms < self.cooldown_until_ms;
        if running && until_ms <= self.cooldown_until_ms {
            // A milder failure never shortens a running cooldown, nor takes over its reason.
            return;
        }
        if !running {
            self.cooled_at_ms = now_ms;
        }
        self.state = State::Cooling;
        self.cooldown_until_ms = until_ms;
        self.reason = Some(class);
    }

    /// The stored shape.
    pub fn to_record(&self) -> HealthRecord {
        HealthRecord {
            state: self.state.as_str().into(),
            reason: self.reason.map(|c| c.as_str().into()),
            reauth: self.reauth.map(|r| r.as_str().into()),
            cooldown_until_ms: self.cooldown_until_ms,
            levels: self.levels,
            last_failure_ms: self.last_failure_ms,
            clean_successes: self.clean_successes,
            last_error: self.last_error.clone(),
            last_error_ms: self.last_error_ms,
            unproven: self.unproven,
        }
    }

    /// Reads the stored shape; a name this binary does not know is an error.
    pub fn from_record(r: HealthRecord) -> Result<Health, String> {
        let state = State::from_name(&r.state).ok_or_else(|| format!("state `{}`", r.state))?;
        let reason = r
            .reason
            .map(|n| Class::from_name(&n).ok_or_else(|| format!("reason `{n}`")))
            .transpose()?;
        let reauth = match r.reauth {
            Some(n) => Some(Reauth::from_name(&n).ok_or_else(|| format!("reauth `{n}`"))?),
            // Written before the reason was kept.
            None if state == State::NeedsReauth => Some(Reauth::Unknown),
            None => None,
        };
        Ok(Health {
            state,
            reason,
            reauth,
            cooldown_until_ms: r.cooldown_until_ms,
            levels: r.levels,
            last_failure_ms: r.last_failure_ms,
            clean_successes: r.clean_successes,
            last_error: r.last_error,
            last_error_ms: r.last_error_ms,
            cooled_at_ms: 0,
            unproven: r.unproven,
        })
    }

    /// An operator cleared the cooldown; an account not yet proven still waits for its probe.
    pub fn clear(&mut self) {
        *self = Health {
            last_error: self.last_error.take(),
            last_error_ms: self.last_error_ms,
            unproven: self.unproven,
            ..Health::default()
        };
    }
}

fn quota_reset_ms(facts: Option<&Facts>, now_ms: u64) -> u64 {
    let now_s = now_ms / 1000;
    let secs = facts
        .and_then(|f| {
            f.resets_in_seconds
                .or_else(|| f.resets_at.map(|at| at.saturating_sub(now_s)))
        })
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        // Without a reset time the limit lasts at most its window (when the answer says it).
        .unwrap_or_else(|| {
            facts
                .and_then(|f| f.limit_window_minutes)
                .map_or(QUOTA_DEFAULT, |m| {
                    QUOTA_DEFAULT.min(Duration::from_secs(m.saturating_mul(60)))
                })
        })
        .min(QUOTA_CAP);
    now_ms.saturating_add(ms(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::failure::{Endpoint, Phase};

    fn facts(status: u16, code: &str) -> Facts {
        Facts {
            phase: Some(Phase::PreCommit),
            status: Some(status),
            error_code: (!code.is_empty()).then(|| code.to_string()),
            ..Facts::default()
        }
    }

    #[test]
    fn the_codes_codex_0_171_knows_are_classified() {
        for (status, code, class) in [
            (503, "slow_down", Class::RateLimited),
            (200, "slow_down", Class::RateLimited),
            (400, "bio_policy", Class::Policy),
            (429, "organization_usage_limit_exceeded", Class::Quota),
            (429, "organization_spend_limit_exceeded", Class::Quota),
            (503, "flex_unavailable", Class::Caller),
            (200, "flex_unavailable", Class::Caller),
        ] {
            assert_eq!(classify(&facts(status, code), ""), class, "{status} {code}");
        }
    }

    #[test]
    fn a_quota_without_a_reset_time_lasts_at_most_its_window() {
        let windowed = Facts {
            error_type: Some("usage_limit_reached".into()),
            limit_window_minutes: Some(15),
            ..facts(429, "")
        };
        assert_eq!(quota_reset_ms(Some(&windowed), 1_000), 1_000 + 15 * 60_000);
        let long = Facts {
            limit_window_minutes: Some(300),
            ..windowed.clone()
        };
        assert_eq!(quota_reset_ms(Some(&long), 0), ms(QUOTA_DEFAULT));
        let told = Facts {
            resets_in_seconds: Some(120),
            ..windowed
        };
        assert_eq!(quota_reset_ms(Some(&told), 0), 120_000);
    }

    #[test]
    fn the_classification_table() {
        let quota = Facts {
            error_type: Some("usage_limit_reached".into()),
            ..facts(429, "")
        };
        assert_eq!(classify(&quota, ""), Class::Quota);
        assert_eq!(
            classify(&facts(429, "usage_not_included"), ""),
            Class::Quota
        );
        assert_eq!(
            classify(&facts(200, "insufficient_quota"), ""),
            Class::Quota
        );
        assert_eq!(classify(&facts(429, ""), ""), Class::RateLimited);
        assert_eq!(
            classify(&facts(200, "rate_limit_exceeded"), ""),
            Class::RateLimited
        );
        assert_eq!(
            classify(&facts(401, "token_expired"), ""),
            Class::AuthExpired
        );
        assert_eq!(
            classify(&facts(401, "token_invalidated"), ""),
            Class::AuthDead
        );
        assert_eq!(
            classify(&facts(401, "account_deactivated"), ""),
            Class::AuthDead
        );
        assert_eq!(
            classify(&facts(401, "refresh_token_reused"), ""),
            Class::AuthDead
        );
        let cf = Facts {
            cloudflare: true,
            ..facts(403, "")
        };
        assert_eq!(classify(&cf, ""), Class::EdgeChallenge);
        let unsupported = Facts {
            message: Some(
                "The 'gpt-x' model is not supported when using Codex with a ChatGPT account."
                    .into(),
            ),
            ..facts(400, "")
        };
        assert_eq!(classify(&unsupported, "gpt-x"), Class::ModelUnsupported);
        assert_eq!(
            classify(&facts(400, "context_length_exceeded"), ""),
            Class::Caller
        );
        assert_eq!(
            classify(&facts(200, "context_length_exceeded"), ""),
            Class::Caller
        );
        assert_eq!(classify(&facts(400, ""), ""), Class::Caller);
        assert_eq!(classify(&facts(413, ""), ""), Class::Caller);
        assert_eq!(classify(&facts(422, ""), ""), Class::Caller);
        assert_eq!(classify(&facts(500, ""), ""), Class::Transient);
        assert_eq!(
            classify(&facts(503, "server_is_overloaded"), ""),
            Class::Transient
        );
        assert_eq!(
            classify(&facts(200, "server_is_overloaded"), ""),
            Class::Transient
        );
        assert_eq!(
            classify(&Facts::transport(Phase::Connect, "refused"), ""),
            Class::Transient
        );
        assert_eq!(
            classify(&Facts::transport(Phase::MidStream, "reset"), ""),
            Class::Transient
        );
    }

    #[test]
    fn policy_refusals_and_unexplained_failures() {
        assert_eq!(classify(&facts(400, "cyber_policy"), ""), Class::Policy);
        assert_eq!(classify(&facts(200, "cyber_policy"), ""), Class::Policy);
        assert_eq!(classify(&facts(200, "invalid_prompt"), ""), Class::Caller);
        let mystery = facts(200, "mystery_error");
        assert_eq!(classify(&mystery, ""), Class::Transient);
        assert!(is_unexplained(&mystery, Class::Transient));
        assert!(!is_unexplained(
            &facts(200, "server_is_overloaded"),
            Class::Transient
        ));
        assert!(!is_unexplained(&facts(502, ""), Class::Transient));
        let mut blame = Blame::default();
        assert!(
            blame.allows(&mystery, Class::Transient),
            "the first one cools"
        );
        assert!(
            !blame.allows(&mystery, Class::Transient),
            "a second one does not"
        );
        assert!(
            blame.allows(&facts(502, ""), Class::Transient),
            "a 5xx always does"
        );
        let mut h = Health::default();
        assert_eq!(
            h.apply(Class::Policy, Some(&facts(400, "cyber_policy")), T0),
            None
        );
    }

    #[test]
    fn only_the_backends_sentence_for_the_requested_model_marks_a_model() {
        let said = |status, message: &str| Facts {
            message: Some(message.into()),
            ..facts(status, "")
        };
        let sentence =
            "The 'gpt-x' model is not supported when using Codex with a ChatGPT account.";
        assert_eq!(
            classify(&said(400, sentence), "gpt-x"),
            Class::ModelUnsupported
        );
        // The same sentence about another model, or a looser one, is the caller's.
        assert_eq!(classify(&said(400, sentence), "gpt-y"), Class::Caller);
        for caller in [
            "Unsupported parameter: 'temperature' is not supported with this model.",
            "Unsupported parameter: context_management",
            "The model `gpt-x` does not exist or you do not have access to it.",
            "model gpt-x is not supported",
        ] {
            assert_eq!(
                classify(&said(400, caller), "gpt-x"),
                Class::Caller,
                "{caller}"
            );
        }
        let platform = Facts {
            error_code: Some("unsupported_parameter".into()),
            ..said(
                400,
                "Unsupported parameter: 'temperature' is not supported with this model.",
            )
        };
        assert_eq!(classify(&platform, "gpt-x"), Class::Caller);
        // The empty model is a model too (a client that sent `""`).
        let empty = said(
            400,
            "The '' model is not supported when using Codex with a ChatGPT account.",
        );
        assert_eq!(classify(&empty, ""), Class::ModelUnsupported);
    }

    #[test]
    fn token_endpoint_answers_are_judged_by_what_they_say_about_the_login() {
        let token = |status, code: &str| Facts {
            endpoint: Endpoint::Token,
            ..facts(status, code)
        };
        assert_eq!(
            classify(&token(401, "refresh_token_reused"), ""),
            Class::AuthDead
        );
        assert_eq!(classify(&token(400, "invalid_grant"), ""), Class::AuthDead);
        assert_eq!(
            classify(&token(400, "refresh_token_expired"), ""),
            Class::AuthDead
        );
        assert_eq!(classify(&token(401, ""), ""), Class::AuthDead);
        let challenge = Facts {
            cloudflare: true,
            ..token(403, "")
        };
        assert_eq!(classify(&challenge, ""), Class::EdgeChallenge);
        assert_eq!(
            classify(&token(400, "unsupported_country"), ""),
            Class::Transient
        );
        assert_eq!(classify(&token(404, ""), ""), Class::Transient);
        assert_eq!(classify(&token(429, ""), ""), Class::RateLimited);
        assert_eq!(classify(&token(503, ""), ""), Class::Transient);
        assert_eq!(
            classify(
                &Facts::transport(Phase::Connect, "refused").at(Endpoint::Token),
                ""
            ),
            Class::Transient
        );
        // The same 400 from the responses endpoint is the caller's.
        assert_eq!(
            classify(&facts(400, "unsupported_country"), ""),
            Class::Caller
        );
        assert_eq!(
            reauth_reason(&token(401, "refresh_token_reused")),
            Reauth::RefreshTokenReused
        );
        assert_eq!(reauth_reason(&token(401, "")), Reauth::Refused);
    }

    #[test]
    fn health_is_stored_by_name_and_read_back() {
        let mut h = Health::default();
        h.apply(
            Class::AuthDead,
            Some(&facts(401, "refresh_token_reused")),
            T0,
        );
        let r = h.to_record();
        assert_eq!(r.state, "needs_reauth");
        assert_eq!(r.reauth.as_deref(), Some("refresh_token_reused"));
        assert_eq!(Health::from_record(r.clone()).unwrap(), h);
        // 0.1.0 did not keep why an account needed a login.
        let old = HealthRecord {
            reauth: None,
            ..r.clone()
        };
        assert_eq!(
            Health::from_record(old).unwrap().reauth,
            Some(Reauth::Unknown)
        );
        let newer = HealthRecord {
            reason: Some("solar_flare".into()),
            ..r
        };
        assert!(Health::from_record(newer).is_err());
    }

    const T0: u64 = 1_767_225_600_000;

    #[test]
    fn quota_cools_until_the_reset_then_half_opens_or_after_a_long_one_is_probed() {
        let mut h = Health::default();
        let f = Facts {
            resets_in_seconds: Some(1200),
            ..facts(429, "usage_limit_reached")
        };
        let t = h.apply(Class::Quota, Some(&f), T0).unwrap();
        assert_eq!((t.from, t.to), (AccountState::Ready, AccountState::Cooling));
        assert_eq!(
            h.effective(T0 + 1_199_000),
            Effective::Cooling {
                until_ms: T0 + 1_200_000
            }
        );
        assert_eq!(h.effective(T0 + 1_200_000), Effective::HalfOpen);
        h.apply(Class::Success, None, T0 + 1_200_001).unwrap();
        assert_eq!(h.effective(T0 + 1_200_001), Effective::Ready);
        assert_eq!(h.reason, None);

        // Over 30 minutes: not a request but the background probe decides.
        let f = Facts {
            resets_in_seconds: Some(3600),
            ..facts(429, "usage_limit_reached")
        };
        h.apply(Class::Quota, Some(&f), T0 + 2_000_000).unwrap();
        assert_eq!(h.effective(T0 + 5_600_000), Effective::Probing);
        assert!(h.proven(T0 + 5_600_000));
        assert_eq!(h.effective(T0 + 5_600_000), Effective::Ready);
    }

    #[test]
    fn quota_without_a_reset_uses_the_default_and_caps_long_ones() {
        let mut h = Health::default();
        h.apply(Class::Quota, Some(&facts(429, "usage_limit_reached")), T0);
        assert_eq!(h.cooldown_until_ms, T0 + 3_600_000);
        let f = Facts {
            resets_in_seconds: Some(30 * 24 * 3600),
            ..facts(429, "usage_limit_reached")
        };
        h.apply(Class::Quota, Some(&f), T0);
        assert_eq!(h.cooldown_until_ms, T0 + ms(QUOTA_CAP));
    }

    #[test]
    fn transient_ladder_escalates_within_the_window_and_needs_two_successes_to_clear() {
        let mut h = Health::default();
        let mut now = T0;
        for expected in TRANSIENT_LADDER {
            h.apply(Class::Transient, Some(&facts(502, "")), now);
            assert_eq!(h.cooldown_until_ms, now + ms(expected));
            // It fails again right when it half-opens.
            now = h.cooldown_until_ms;
        }
        // The top step repeats.
        h.apply(Class::Transient, Some(&facts(502, "")), now);
        assert_eq!(h.cooldown_until_ms, now + ms(TRANSIENT_LADDER[3]));
        now = h.cooldown_until_ms;

        h.apply(Class::Success, None, now);
        assert_eq!(h.effective(now), Effective::Ready);
        assert_eq!(
            h.level(),
            4,
            "one success does not clear an escalated account"
        );
        h.apply(Class::Success, None, now + 1);
        assert_eq!(h.level(), 0, "two do");
    }

    #[test]
    fn a_success_from_before_the_cooldown_does_not_end_it() {
        let mut h = Health::default();
        let f = Facts {
            resets_in_seconds: Some(3600),
            ..facts(429, "usage_limit_reached")
        };
        h.apply(Class::Quota, Some(&f), T0);
        // Another stream on the account, begun before the quota answer, completes.
        assert_eq!(h.apply(Class::Success, None, T0 + 500), None);
        assert_eq!(
            h.effective(T0 + 500),
            Effective::Cooling {
                until_ms: T0 + 3_600_000
            }
        );
        // Once it half-opens, a success (the probe) ends it.
        let back = h.cooldown_until_ms;
        h.apply(Class::Success, None, back);
        assert_eq!(h.effective(back), Effective::Ready);
    }

    #[test]
    fn a_failure_between_two_successes_keeps_the_escalation() {
        let mut h = Health::default();
        h.apply(Class::Transient, None, T0);
        let back = h.cooldown_until_ms;
        h.apply(Class::Success, None, back);
        h.apply(Class::Transient, None, back + 1000);
        assert_eq!(h.cooldown_until_ms, back + 1000 + ms(TRANSIENT_LADDER[1]));
    }

    #[test]
    fn a_failure_long_after_recovery_starts_the_ladder_over() {
        let mut h = Health::default();
        h.apply(Class::Transient, None, T0);
        h.apply(Class::Success, None, h.cooldown_until_ms);
        let later = h.cooldown_until_ms + ms(STREAK_WINDOW) + 1000;
        h.apply(Class::Transient, None, later);
        assert_eq!(h.cooldown_until_ms, later + ms(TRANSIENT_LADDER[0]));
    }

    #[test]
    fn rate_limit_ladder_honours_retry_after() {
        let mut h = Health::default();
        h.apply(Class::RateLimited, None, T0);
        assert_eq!(h.cooldown_until_ms, T0 + 5_000);
        let f = Facts {
            retry_after: Some(Duration::from_secs(40)),
            ..facts(429, "")
        };
        h.apply(Class::RateLimited, Some(&f), T0 + 5_000);
        assert_eq!(h.cooldown_until_ms, T0 + 5_000 + 40_000);
        h.apply(Class::RateLimited, None, T0 + 45_000);
        assert_eq!(h.cooldown_until_ms, T0 + 45_000 + 60_000);
    }

    #[test]
    fn edge_ladder_and_auth_dead() {
        let mut h = Health::default();
        h.apply(Class::EdgeChallenge, None, T0);
        assert_eq!(h.cooldown_until_ms, T0 + 10_000);
        h.apply(Class::EdgeChallenge, None, T0 + 10_000);
        assert_eq!(h.cooldown_until_ms, T0 + 10_000 + 30_000);
        let t = h
            .apply(
                Class::AuthDead,
                Some(&facts(401, "token_invalidated")),
                T0 + 50_000,
            )
            .unwrap();
        assert_eq!(t.to, AccountState::NeedsReauth);
        assert_eq!(h.reauth, Some(Reauth::TokenInvalidated));
        assert_eq!(h.effective(u64::MAX), Effective::NeedsReauth);
        // Nothing but a re-login brings it back: a later transient does not change it.
        h.apply(Class::Transient, None, T0 + 60_000);
        assert_eq!(h.effective(T0 + 60_000), Effective::NeedsReauth);
        h.clear();
        assert_eq!(h.effective(T0), Effective::Ready);
    }

    #[test]
    fn neutral_classes_change_nothing() {
        let mut h = Health::default();
        for c in [
            Class::Caller,
            Class::ClientCancelled,
            Class::ModelUnsupported,
            Class::AuthExpired,
        ] {
            assert_eq!(h.apply(c, Some(&facts(400, "")), T0), None);
        }
        assert_eq!(h, Health::default());
    }

    #[test]
    fn failures_of_attempts_begun_before_the_cooldown_climb_nothing() {
        let mut h = Health::default();
        // Three attempts begun at T0; they fail one after the other.
        h.apply_from(Class::Transient, None, T0 + 100, T0);
        h.apply_from(Class::Transient, None, T0 + 200, T0);
        h.apply_from(Class::RateLimited, None, T0 + 300, T0);
        assert_eq!(h.level(), 1);
        assert_eq!(h.cooldown_until_ms, T0 + 100 + ms(TRANSIENT_LADDER[0]));
        assert_eq!(h.reason, Some(Class::Transient));
        // A quota answer from one of them still counts: it is longer.
        h.apply_from(
            Class::Quota,
            Some(&facts(429, "usage_limit_reached")),
            T0 + 400,
            T0,
        );
        assert_eq!(h.reason, Some(Class::Quota));
    }

    #[test]
    fn a_milder_failure_never_shortens_a_running_cooldown() {
        let mut h = Health::default();
        let mut now = T0;
        for _ in 0..3 {
            h.apply(Class::Transient, None, now);
            now = h.cooldown_until_ms;
        }
        let _ = now;
        // Ten minutes on the transient ladder; a burst limit a second in must not cut them.
        let until = h.cooldown_until_ms;
        let soon = h.cooled_at_ms + 1_000;
        h.apply(Class::RateLimited, None, soon);
        assert_eq!(
            (h.cooldown_until_ms, h.reason),
            (until, Some(Class::Transient))
        );
        h.apply(Class::EdgeChallenge, None, soon);
        assert_eq!(h.cooldown_until_ms, until);
    }

    #[test]
    fn a_token_refused_right_after_a_refresh_cools_the_account() {
        let mut h = Health::default();
        assert_eq!(
            h.apply(Class::AuthExpired, Some(&facts(401, "token_expired")), T0),
            None
        );
        let again = Facts {
            after_refresh: true,
            ..facts(401, "token_expired")
        };
        let t = h.apply(Class::AuthExpired, Some(&again), T0).unwrap();
        assert_eq!(
            (t.to, t.reason),
            (AccountState::Cooling, Some(Class::AuthExpired))
        );
        assert_eq!(h.cooldown_until_ms, T0 + ms(TRANSIENT_LADDER[0]));
    }

    #[test]
    fn huge_waits_are_capped_and_never_overflow() {
        let mut h = Health::default();
        let f = Facts {
            retry_after: Some(Duration::MAX),
            ..facts(429, "")
        };
        h.apply(Class::RateLimited, Some(&f), u64::MAX - 10);
        assert_eq!(h.cooldown_until_ms, u64::MAX);
        let mut h = Health::default();
        let f = Facts {
            resets_in_seconds: Some(u64::MAX),
            ..facts(429, "usage_limit_reached")
        };
        h.apply(Class::Quota, Some(&f), T0);
        assert_eq!(h.cooldown_until_ms, T0 + ms(QUOTA_CAP));
    }

    #[test]
    fn a_burst_limit_does_not_shorten_a_quota_cooldown() {
        let mut h = Health::default();
        h.apply(
            Class::Quota,
            Some(&Facts {
                resets_in_seconds: Some(3600),
                ..facts(429, "usage_limit_reached")
            }),
            T0,
        );
        h.apply(Class::RateLimited, None, T0 + 1000);
        assert_eq!(h.cooldown_until_ms, T0 + 3_600_000);
    }
}
