//! The simulator's mutable state: accounts (tokens, usage windows, fault queues, prompt
//! cache) and the request log. Only `Sim` touches it, under one lock that is never held
//! across an `.await`.

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::{Value, json};

use super::RecordedRequest;
use super::auth::{self, AuthSpec};
use super::faults::{Endpoint, Fault, FaultKind};
use super::profile::Script;

/// The 5-hour window, in seconds.
pub(crate) const PRIMARY_WINDOW_SECS: u64 = 5 * 3600;
/// The weekly window, in seconds.
pub(crate) const SECONDARY_WINDOW_SECS: u64 = 7 * 24 * 3600;
/// Oldest entries of the request log are dropped past this many.
pub(crate) const MAX_RECORDED: usize = 10_000;
/// Access tokens remembered per account (older generations are forgotten = invalid).
const MAX_ACCESS_TOKENS: usize = 8;
/// Prompt-cache keys remembered per account before the cache is flushed.
const MAX_CACHE_KEYS: usize = 10_000;

/// The models every simulated account serves; `gpt-6.1-sol` is Codex CLI 0.169's default.
pub(crate) const DEFAULT_MODELS: [&str; 5] = [
    "gpt-6.1-sol",
    "gpt-5.5",
    "gpt-5.4",
    "gpt-5.4-mini",
    "gpt-5.3-codex",
];

/// Why a request's credentials were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthFailure {
    Invalidated,
    Expired,
    Deactivated,
}

/// What a refresh-token lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefreshLookup {
    /// The current token of (account index, family id).
    Current(usize, u32),
    Reused(usize),
    Invalidated,
}

/// One rolling usage window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub used_percent: f64,
    pub reset_at: u64,
    pub len_secs: u64,
}

impl Window {
    fn new(now: u64, len_secs: u64) -> Self {
        Self {
            used_percent: 0.0,
            reset_at: now + len_secs,
            len_secs,
        }
    }

    /// Starts a new window (usage back to 0) once the clock has passed the reset.
    pub fn roll(&mut self, now: u64) {
        if now >= self.reset_at {
            let behind = (now - self.reset_at) / self.len_secs + 1;
            self.reset_at += behind * self.len_secs;
            self.used_percent = 0.0;
        }
    }

    pub fn reset_after(&self, now: u64) -> u64 {
        self.reset_at.saturating_sub(now)
    }
}

#[derive(Debug, Clone)]
struct IssuedAccess {
    token: String,
    exp: u64,
    forced_expired: bool,
    /// The refresh family that issued it.
    family: u32,
}

/// What workspace routing discovery answers for an account.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Routing {
    /// `NO_CONSTRAINT`: the usual origin.
    #[default]
    Unconstrained,
    /// A data-residency workspace: `workspace_backend_origin` and `account_routing_override`.
    Workspace { origin: String, constraint: String },
    /// The check is answered with this error status.
    Refuse { status: u16 },
}

/// The family of workspace access tokens: none of them comes with a refresh token.
const WORKSPACE_FAMILY: u32 = u32::MAX;

/// One login's chain of rotating refresh tokens.
#[derive(Debug)]
struct Family {
    id: u32,
    /// The refresh token that works now.
    refresh: String,
    /// Refresh tokens rotated away (using one again is `refresh_token_reused`).
    used: HashSet<String>,
}

#[derive(Debug)]
pub(crate) struct Account {
    /// Identity, and the tag and `exp` of the auth.json family's current tokens.
    pub spec: AuthSpec,
    generation: u32,
    access: Vec<IssuedAccess>,
    /// The auth.json login (`main_family`) and one family per login through `/oauth/token`
    /// (`authorization_code`); each rotates on its own and all stay valid together.
    families: Vec<Family>,
    main_family: u32,
    next_family: u32,
    revoked_refresh: HashSet<String>,
    pub deactivated: bool,
    pub faults: VecDeque<Fault>,
    pub primary: Window,
    pub secondary: Window,
    pub refresh_count: u32,
    pub supported_models: Vec<String>,
    /// prompt-cache key -> input tokens of the last request served with it.
    cache: HashMap<String, u64>,
    /// `/responses*` requests and `response.create` frames that passed authentication.
    pub served: u64,
    /// What `wham/accounts/check` answers for it.
    pub routing: Routing,
    /// WebSocket upgrades accepted (101) so far.
    pub ws_connections: u32,
    /// WebSockets open now.
    pub ws_open: u32,
    /// HTTP answers of `/responses*` whose body is being written now.
    pub http_open: u32,
    /// HTTP answers of `/responses*` whose connection ended before their body was written
    /// to the end (the client went away).
    pub http_cut: u32,
    pub script: Script,
    /// Profile quota: exhausted until (unix s), and requests since the last reset.
    pub script_quota_until: Option<u64>,
    pub script_since_reset: u64,
    /// Banked rate-limit reset credits, and the answers given per redeem id.
    pub credits: Vec<super::credits::Credit>,
    pub redemptions: HashMap<String, Value>,
    /// Only the primary window exists (`secondary_window` null in the usage).
    pub single_window: bool,
    /// Requests for the `priority` tier run on it (else on `default`, as the answer says).
    pub priority_tier: bool,
}

impl Account {
    pub fn new(n: u32, now: u64, ttl_secs: u64, nonce: &str, script: Script) -> Self {
        let id = format!("sim-acct-{n}");
        let spec = AuthSpec {
            email: format!("sim{n}@example.com"),
            chatgpt_account_id: id,
            chatgpt_user_id: format!("sim-user-{n}"),
            plan: if n % 2 == 1 { "plus" } else { "pro" }.to_string(),
            access_exp: 0,
            token_tag: String::new(),
        };
        let mut a = Self {
            spec,
            generation: 0,
            access: Vec::new(),
            families: Vec::new(),
            main_family: 0,
            next_family: 0,
            revoked_refresh: HashSet::new(),
            deactivated: false,
            faults: VecDeque::new(),
            primary: Window::new(now, PRIMARY_WINDOW_SECS),
            secondary: Window::new(now, SECONDARY_WINDOW_SECS),
            refresh_count: 0,
            supported_models: DEFAULT_MODELS.iter().map(|m| m.to_string()).collect(),
            cache: HashMap::new(),
            served: 0,
            routing: Routing::default(),
            ws_connections: 0,
            ws_open: 0,
            http_open: 0,
            http_cut: 0,
            script_quota_until: None,
            script_since_reset: 0,
            script,
            credits: Vec::new(),
            redemptions: HashMap::new(),
            single_window: false,
            priority_tier: true,
        };
        if let Some((p, s)) = a.script.initial_usage {
            a.primary.used_percent = p;
            a.secondary.used_percent = s;
        }
        a.main_family = a.new_family();
        a.mint(a.main_family, now, ttl_secs, nonce);
        a
    }

    pub fn id(&self) -> &str {
        &self.spec.chatgpt_account_id
    }

    fn new_family(&mut self) -> u32 {
        self.next_family += 1;
        self.families.push(Family {
            id: self.next_family,
            refresh: String::new(),
            used: HashSet::new(),
        });
        self.next_family
    }

    /// Issues a new generation of all three tokens in `family` and returns them as the token
    /// endpoint answers. The auth.json (`spec`) follows the main family.
    fn mint(&mut self, family: u32, now: u64, ttl_secs: u64, nonce: &str) -> Value {
        self.generation += 1;
        let spec = AuthSpec {
            access_exp: now + ttl_secs,
            token_tag: format!("{nonce}g{}", self.generation),
            ..self.spec.clone()
        };
        if let Some(f) = self.families.iter_mut().find(|f| f.id == family) {
            f.refresh = auth::refresh_token(&spec);
        }
        self.access.push(IssuedAccess {
            token: auth::access_token(&spec),
            exp: spec.access_exp,
            forced_expired: false,
            family,
        });
        let issued = self.access.iter().filter(|a| a.family == family).count();
        if issued > MAX_ACCESS_TOKENS
            && let Some(oldest) = self.access.iter().position(|a| a.family == family)
        {
            self.access.remove(oldest);
        }
        let tokens = tokens_json(&spec, ttl_secs);
        if family == self.main_family {
            self.spec = spec;
        }
        tokens
    }

    /// Rotates every token of `family` (a successful refresh) and returns the new ones.
    pub fn rotate(&mut self, family: u32, now: u64, ttl_secs: u64, nonce: &str) -> Value {
        if let Some(f) = self.families.iter_mut().find(|f| f.id == family) {
            let old = std::mem::take(&mut f.refresh);
            f.used.insert(old);
        }
        self.refresh_count += 1;
        self.mint(family, now, ttl_secs, nonce)
    }

    /// A new login (an `authorization_code` exchange): a new refresh family, next to the
    /// ones already issued, which stay valid. Returns its tokens.
    pub fn login(&mut self, now: u64, ttl_secs: u64, nonce: &str) -> Value {
        let family = self.new_family();
        self.mint(family, now, ttl_secs, nonce)
    }

    /// Invalidates every token issued so far and issues a fresh login.
    pub fn revoke(&mut self, now: u64, ttl_secs: u64, nonce: &str) {
        for f in self.families.drain(..) {
            self.revoked_refresh.insert(f.refresh);
            self.revoked_refresh.extend(f.used);
        }
        self.access.clear();
        self.main_family = self.new_family();
        self.mint(self.main_family, now, ttl_secs, nonce);
    }

    /// Invalidates the family `refresh_token` belongs to (its refresh and access tokens, as a
    /// sign-out of that one session); the others stay valid. False if it is none of ours.
    pub fn revoke_family(&mut self, refresh_token: &str) -> bool {
        let Some(idx) = self
            .families
            .iter()
            .position(|f| f.refresh == refresh_token || f.used.contains(refresh_token))
        else {
            return false;
        };
        let f = self.families.remove(idx);
        self.access.retain(|a| a.family != f.id);
        self.revoked_refresh.insert(f.refresh);
        self.revoked_refresh.extend(f.used);
        true
    }

    /// A workspace access token (`at-…`) for this account, valid for `ttl_secs`: no refresh
    /// token comes with it, and it never rotates.
    pub fn issue_workspace_token(&mut self, now: u64, ttl_secs: u64, nonce: &str) -> String {
        self.generation += 1;
        let token = format!(
            "at-{nonce}{:04x}-{}",
            self.generation, self.spec.chatgpt_account_id
        );
        self.access.push(IssuedAccess {
            token: token.clone(),
            exp: now + ttl_secs,
            forced_expired: false,
            family: WORKSPACE_FAMILY,
        });
        token
    }

    /// Expires the auth.json family's current access token (a login's stay as they are), and
    /// every workspace access token of the account.
    pub fn expire_current_access(&mut self) {
        let main = self.main_family;
        if let Some(a) = self.access.iter_mut().rev().find(|a| a.family == main) {
            a.forced_expired = true;
        }
        for a in self
            .access
            .iter_mut()
            .filter(|a| a.family == WORKSPACE_FAMILY)
        {
            a.forced_expired = true;
        }
    }

    /// Checks an access token like the backend: any token issued to this account and not yet
    /// expired is accepted (a refresh does not revoke the previous access token).
    pub fn check_access(&self, token: &str, now: u64) -> Result<(), AuthFailure> {
        let Some(issued) = self.access.iter().find(|a| a.token == token) else {
            return Err(AuthFailure::Invalidated);
        };
        if self.deactivated {
            return Err(AuthFailure::Deactivated);
        }
        if issued.forced_expired || now >= issued.exp {
            return Err(AuthFailure::Expired);
        }
        Ok(())
    }

    pub fn owns_access(&self, token: &str) -> bool {
        self.access.iter().any(|a| a.token == token)
    }

    pub fn auth_json(&self, now: u64) -> Value {
        let mut v = auth::auth_json(&self.spec);
        v["last_refresh"] = json!(crate::base::clock::rfc3339(now));
        v
    }

    pub fn roll_windows(&mut self, now: u64) {
        self.primary.roll(now);
        self.secondary.roll(now);
    }

    /// Takes the first queued fault that applies to `endpoint`, counting down its `times`.
    pub fn take_fault(&mut self, endpoint: Endpoint) -> Option<FaultKind> {
        let idx = self
            .faults
            .iter()
            .position(|f| f.kind.applies_to(endpoint))?;
        let fault = self.faults.get_mut(idx)?;
        let kind = fault.kind.clone();
        match fault.times {
            None => {}
            Some(n) if n > 1 => fault.times = Some(n - 1),
            Some(_) => {
                self.faults.remove(idx);
            }
        }
        Some(kind)
    }

    /// Looks up (and then remembers) a prompt-cache key; returns the cached input tokens.
    pub fn cache_lookup(&mut self, key: Option<&str>, input_tokens: u64) -> u64 {
        let Some(key) = key.filter(|k| !k.is_empty()) else {
            return 0;
        };
        if self.cache.len() >= MAX_CACHE_KEYS && !self.cache.contains_key(key) {
            self.cache.clear();
        }
        let previous = self.cache.insert(key.to_string(), input_tokens);
        previous.map_or(0, |p| p.min(input_tokens))
    }

    /// What `GET /sim/accounts` shows.
    pub fn snapshot(&self, now: u64) -> Value {
        json!({
            "id": self.id(),
            "email": self.spec.email,
            "user_id": self.spec.chatgpt_user_id,
            "plan": self.spec.plan,
            "deactivated": self.deactivated,
            "refresh_count": self.refresh_count,
            "token_generation": self.generation,
            "refresh_families": self.families.len(),
            "access_expires_at": self.spec.access_exp,
            "usage": {
                "primary_used_percent": self.primary.used_percent,
                "primary_reset_at": self.primary.reset_at,
                "primary_reset_after_seconds": self.primary.reset_after(now),
                "secondary_used_percent": self.secondary.used_percent,
                "secondary_reset_at": self.secondary.reset_at,
                "secondary_reset_after_seconds": self.secondary.reset_after(now),
            },
            "supported_models": self.supported_models,
            "faults": self.faults,
            "served": self.served,
            "ws_connections": self.ws_connections,
            "ws_open": self.ws_open,
            "http_open": self.http_open,
            "http_cut": self.http_cut,
        })
    }
}

/// What the token endpoint answers for a login or a refresh.
fn tokens_json(spec: &AuthSpec, ttl_secs: u64) -> Value {
    json!({
        "id_token": auth::id_token(spec),
        "access_token": auth::access_token(spec),
        "refresh_token": auth::refresh_token(spec),
        "token_type": "Bearer",
        "expires_in": ttl_secs,
        "scope": "openid profile email offline_access",
    })
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub accounts: Vec<Account>,
    pub requests: VecDeque<RecordedRequest>,
    /// Source of response and item ids.
    pub next_id: u64,
    /// Device codes and authorization codes of the login flows.
    pub logins: super::login::Logins,
    /// The notification sink.
    pub sink: super::sink::Sink,
}

impl State {
    pub fn account(&self, id: &str) -> Option<&Account> {
        self.accounts.iter().find(|a| a.id() == id)
    }

    pub fn account_mut(&mut self, id: &str) -> Option<&mut Account> {
        self.accounts.iter_mut().find(|a| a.id() == id)
    }

    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.accounts.iter().position(|a| a.id() == id)
    }

    /// The account that issued this access token, if any.
    pub fn owner_of_access(&self, token: &str) -> Option<usize> {
        self.accounts.iter().position(|a| a.owns_access(token))
    }

    pub fn lookup_refresh(&self, token: &str) -> RefreshLookup {
        for (i, a) in self.accounts.iter().enumerate() {
            for f in &a.families {
                if f.refresh == token {
                    return RefreshLookup::Current(i, f.id);
                }
                if f.used.contains(token) {
                    return RefreshLookup::Reused(i);
                }
            }
        }
        RefreshLookup::Invalidated
    }

    pub fn record(&mut self, r: RecordedRequest) {
        if self.requests.len() >= MAX_RECORDED {
            self.requests.pop_front();
        }
        self.requests.push_back(r);
    }

    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}
