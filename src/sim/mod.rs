//! The simulated Codex backend. It lives in the product because `switchyard demo` and the
//! tests use it; it never starts unless asked.
//!
//! It serves the real paths (`/backend-api/codex/responses`, `/responses/compact`, `/models`,
//! `/backend-api/wham/usage`, `/oauth/token`) over HTTP/1.1 on loopback, and the Responses
//! WebSocket (protocol §E) on `/backend-api/codex/responses`, with the wire shapes
//! of `shared/codex-protocol.md`: per-account tokens that expire by the sim clock and rotate on
//! refresh, `x-codex-*` rate-limit headers, the §D event sequence, a per-account prompt cache,
//! and scriptable faults (§F) — queued per account ([`Sim::push_fault`], `POST /sim/...`) or
//! scheduled by a named [`Profile`].
//!
//! Its base URL is also the auth server's issuer for the logins of §J1/§J2:
//! `POST /api/accounts/deviceauth/usercode` and `/api/accounts/deviceauth/token` (device code),
//! `GET /oauth/authorize` (browser PKCE) and the `authorization_code` grant of `/oauth/token`.
//! The sim plays the user through controls ([`Sim::approve_device_code`],
//! [`Sim::set_authorize_answer`], …, or `/sim/login/...`); each login is a new refresh-token
//! family of its account. Every request to the backend and auth paths is recorded.
//!
//! Deliberate departures from "always the same answer", because the real backend behaves so:
//! a refresh does not revoke the previous access token (it stays valid until its `exp`), 401s
//! for unknown credentials and the Cloudflare challenge carry no `x-codex-*` headers (no
//! account is known / the request never reached the backend), and `stream:false` failures
//! are HTTP errors, not a `response.failed` event.
//!
//! Layout: this file (the API), `runner` (handle, `switchyard sim`), `state` (accounts,
//! tokens, windows, request log), `server` (hyper loop, routing, bodies), `backend` (auth,
//! faults and answers of `/backend-api/*`; `decide` is a turn for both transports), `ws` (the
//! WebSocket handshake and connections), `responses` (event generation), `catalog`
//! (models, usage, rate-limit headers), `oauth` (the token endpoint), `login` (device code,
//! authorize, code exchange, and their controls), `faults`, `profile`, `control` (`/sim/*`); and for the demo, `traffic` (synthetic clients)
//! and `injector` (faults that keep coming).

pub mod auth;
mod backend;
mod catalog;
mod control;
mod credits;
mod faults;
pub mod injector;
mod login;
mod oauth;
mod profile;
mod responses;
mod runner;
mod server;
mod sink;
mod state;
pub mod traffic;
mod ws;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::base::clock::{self, SharedClock};

pub use faults::{Fault, FaultKind};
pub use login::{
    AUTH_CODE_TTL_MS, AuthorizeAnswer, DEVICE_REDIRECT_URI, DeviceCode, DeviceCodeState,
    DeviceSettings, LoginControlError, POLL_GRACE_MS, REDIRECT_URIS, pkce_challenge,
};
pub use oauth::CLIENT_ID;
pub use profile::Profile;
pub use runner::{SimHandle, run_standalone};
pub use sink::SinkDelivery;

use state::{Account, State};

/// One request the simulator received on `/backend-api/*` or an auth server path
/// (`/oauth/token`, `/oauth/authorize`, `/api/accounts/deviceauth/*`). A WebSocket is
/// recorded as its handshake (`GET`, status 101 or the refusal) and then one entry per
/// client frame: `method: "WS"`, the handshake's path, query and headers, the frame as `body`,
/// and as `status` 200 for a turn that was served, the error frame's status, or 0 when the
/// connection was dropped instead.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// Arrival, by the sim clock (unix ms).
    pub at_ms: u64,
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// The `ChatGPT-Account-ID` header.
    pub account_id: Option<String>,
    /// Lower-case names; repeated headers joined with ", ".
    pub headers: BTreeMap<String, String>,
    /// The body as JSON; a form-encoded body (`content-type:
    /// application/x-www-form-urlencoded`) as an object of its fields; else `Null`.
    pub body: Value,
    /// The status answered; 0 when the connection was reset before any headers.
    pub status: u16,
    /// The address the request came from (`ip:port`): which connection carried it.
    #[serde(default)]
    pub peer: String,
}

#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Number of accounts, `sim-acct-1` ….
    pub accounts: u32,
    /// Lifetime of issued access tokens (by `clock`).
    pub access_ttl: Duration,
    /// A named fault schedule; `None` = healthy.
    pub profile: Option<Profile>,
    pub clock: SharedClock,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            accounts: 3,
            access_ttl: Duration::from_secs(3600),
            profile: None,
            clock: clock::system(),
        }
    }
}

/// The simulator. Cloning shares it.
#[derive(Clone)]
pub struct Sim {
    inner: Arc<Inner>,
}

struct Inner {
    clock: SharedClock,
    ttl_secs: u64,
    profile: Option<Profile>,
    /// Makes this instance's tokens and ids its own.
    nonce: String,
    state: Mutex<State>,
    /// Bumped whenever a WebSocket opens or closes (wakes `wait_ws_open`).
    ws_changed: watch::Sender<u64>,
    /// Device codes issued so far (wakes `wait_device_codes`).
    device_codes_issued: watch::Sender<usize>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("accounts", &self.account_ids())
            .field("profile", &self.inner.profile)
            .finish()
    }
}

fn random_nonce(clock: &SharedClock) -> String {
    let n = getrandom::u32().unwrap_or_else(|_| {
        // No OS randomness: the time still tells instances apart.
        (clock.now_ms() & 0xffff_ffff) as u32
    });
    format!("{n:08x}")
}

impl Sim {
    pub fn new(opts: SimOptions) -> Sim {
        let now = opts.clock.now_secs();
        let ttl_secs = opts.access_ttl.as_secs().max(1);
        let nonce = random_nonce(&opts.clock);
        let profile = opts.profile.unwrap_or(Profile::Healthy);
        let accounts = (1..=opts.accounts)
            .map(|n| Account::new(n, now, ttl_secs, &nonce, profile.script(n)))
            .collect();
        Sim {
            inner: Arc::new(Inner {
                clock: opts.clock,
                ttl_secs,
                profile: opts.profile,
                nonce,
                state: Mutex::new(State {
                    accounts,
                    ..State::default()
                }),
                ws_changed: watch::Sender::new(0),
                device_codes_issued: watch::Sender::new(0),
            }),
        }
    }

    /// Serves until `shutdown` is cancelled (HTTP/1.1 via hyper directly, so faults can reset
    /// connections). Open connections, WebSockets included, are closed when it is.
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        server::serve(self, listener, shutdown).await;
    }

    /// Binds 127.0.0.1:0, spawns `serve`, returns a handle. The socket accepts as soon as
    /// this returns.
    pub async fn start(opts: SimOptions) -> std::io::Result<SimHandle> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let sim = Sim::new(opts);
        let stop = CancellationToken::new();
        tokio::spawn(sim.clone().serve(listener, stop.clone()));
        Ok(SimHandle::new(addr, sim, stop))
    }

    pub fn profile(&self) -> Option<Profile> {
        self.inner.profile
    }

    /// `chatgpt_account_id`s in order: `sim-acct-1`, `sim-acct-2`, ….
    pub fn account_ids(&self) -> Vec<String> {
        self.lock()
            .accounts
            .iter()
            .map(|a| a.id().to_string())
            .collect()
    }

    /// The account's auth.json, with the current tokens of its first refresh family (the one
    /// the sim started with, or the one `revoke_tokens` issued; a login through
    /// `/oauth/token` starts a family of its own and does not change it).
    pub fn auth_json(&self, account_id: &str) -> Option<Value> {
        let now = self.now_secs();
        self.lock().account(account_id).map(|a| a.auth_json(now))
    }

    /// The auth.json of a new login of the account (what `codex login` writes after signing in
    /// again): a refresh family of its own, next to the ones already issued, which stay valid.
    pub fn fresh_login(&self, account_id: &str) -> Option<Value> {
        let (now, ttl) = (self.now_secs(), self.inner.ttl_secs);
        let nonce = self.nonce().to_string();
        let mut st = self.lock();
        let account = st.account_mut(account_id)?;
        let tokens = account.login(now, ttl, &nonce);
        let chatgpt_account_id = account.id().to_string();
        Some(serde_json::json!({
            "auth_mode": "chatgpt",
            "OPENAI_API_KEY": null,
            "tokens": {
                "id_token": tokens["id_token"],
                "access_token": tokens["access_token"],
                "refresh_token": tokens["refresh_token"],
                "account_id": chatgpt_account_id,
            },
            "last_refresh": crate::base::clock::rfc3339(now),
        }))
    }

    /// A workspace access token (`at-…`) for the account, valid for `ttl` by the sim clock:
    /// what a Business or Enterprise workspace hands out instead of a login. The whoami
    /// endpoint names its account; the backend accepts it until it expires.
    pub fn workspace_token(&self, account_id: &str, ttl: Duration) -> Option<String> {
        let now = self.now_secs();
        let nonce = self.nonce().to_string();
        self.lock()
            .account_mut(account_id)
            .map(|a| a.issue_workspace_token(now, ttl.as_secs(), &nonce))
    }

    /// What `wham/accounts/check` answers for the account from now on: `Some((origin,
    /// constraint))` for a data-residency workspace (`us`, `us_cr`), `None` for no constraint.
    pub fn set_routing(&self, account_id: &str, workspace: Option<(&str, &str)>) -> bool {
        let routing = match workspace {
            Some((origin, constraint)) => state::Routing::Workspace {
                origin: origin.to_string(),
                constraint: constraint.to_string(),
            },
            None => state::Routing::Unconstrained,
        };
        self.with_account(account_id, |a| a.routing = routing)
    }

    /// `wham/accounts/check` answers this error status for the account from now on.
    pub fn refuse_routing(&self, account_id: &str, status: u16) -> bool {
        self.with_account(account_id, |a| {
            a.routing = state::Routing::Refuse { status }
        })
    }

    /// Writes `<account_id>.json` (mode 0600) per account into `dir` (created if missing).
    pub fn write_auth_files(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::create_dir_all(dir)?;
        let mut paths = Vec::new();
        for id in self.account_ids() {
            let Some(v) = self.auth_json(&id) else {
                continue;
            };
            let path = dir.join(format!("{id}.json"));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)?;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            let mut text = serde_json::to_string_pretty(&v).map_err(std::io::Error::other)?;
            text.push('\n');
            f.write_all(text.as_bytes())?;
            paths.push(path);
        }
        Ok(paths)
    }

    /// Queues a fault on the account; false if there is no such account.
    pub fn push_fault(&self, account_id: &str, fault: Fault) -> bool {
        self.with_account(account_id, |a| a.faults.push_back(fault))
    }

    /// Drops the account's queued faults (a deactivated account stays deactivated).
    pub fn clear_faults(&self, account_id: &str) -> bool {
        self.with_account(account_id, |a| a.faults.clear())
    }

    pub fn clear_all_faults(&self) {
        for a in &mut self.lock().accounts {
            a.faults.clear();
        }
    }

    /// The account's queued faults, next first.
    pub fn faults(&self, account_id: &str) -> Vec<Fault> {
        self.lock()
            .account(account_id)
            .map(|a| a.faults.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The account's requests to `/backend-api/codex/responses*`, oldest first.
    pub fn requests(&self, account_id: &str) -> Vec<RecordedRequest> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.account_id.as_deref() == Some(account_id))
            .filter(|r| r.path.starts_with("/backend-api/codex/responses"))
            .cloned()
            .collect()
    }

    /// Every recorded request (`/backend-api/*` and the auth server's paths), oldest first.
    pub fn all_requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.iter().cloned().collect()
    }

    /// The current access token (of the auth.json family) and every workspace access token of
    /// the account become expired: their next use answers 401 `token_expired`.
    pub fn expire_access_token(&self, account_id: &str) -> bool {
        self.with_account(account_id, Account::expire_current_access)
    }

    /// Invalidates every token of the account, of every refresh family (as a password change
    /// would: 401 `token_invalidated`, refresh `refresh_token_invalidated`) and issues fresh
    /// ones, as a new login; `auth_json` then returns that login.
    pub fn revoke_tokens(&self, account_id: &str) -> bool {
        let (now, ttl) = (self.now_secs(), self.inner.ttl_secs);
        let nonce = self.inner.nonce.clone();
        self.with_account(account_id, |a| a.revoke(now, ttl, &nonce))
    }

    /// Ends the refresh family `refresh_token` belongs to (current or rotated away): its
    /// refresh tokens answer `refresh_token_invalidated`, its access tokens
    /// `token_invalidated`; the account's other families (the auth.json one, other logins)
    /// stay valid. False if the token is none of the account's.
    pub fn revoke_family(&self, account_id: &str, refresh_token: &str) -> bool {
        self.lock()
            .account_mut(account_id)
            .is_some_and(|a| a.revoke_family(refresh_token))
    }

    pub fn set_usage(
        &self,
        account_id: &str,
        primary_used_percent: f64,
        secondary_used_percent: f64,
    ) -> bool {
        let now = self.now_secs();
        self.with_account(account_id, |a| {
            a.roll_windows(now);
            a.primary.used_percent = primary_used_percent;
            a.secondary.used_percent = secondary_used_percent;
        })
    }

    /// Banks `count` reset credits on the account, each expiring `expires_in` from now (by
    /// the sim clock). Returns the ids, or `None` for an unknown account.
    pub fn grant_credits(
        &self,
        account_id: &str,
        count: u32,
        expires_in: Duration,
    ) -> Option<Vec<String>> {
        let now = self.now_secs();
        let nonce = self.nonce().to_string();
        let mut st = self.lock();
        let a = st.account_mut(account_id)?;
        let ids: Vec<String> = (0..count)
            .map(|_| {
                let id = format!("rlrc_{nonce}{:04}", a.credits.len());
                a.credits.push(credits::Credit {
                    id: id.clone(),
                    redeemed: false,
                    granted_at: now,
                    expires_at: now + expires_in.as_secs(),
                });
                id
            })
            .collect();
        Some(ids)
    }

    /// Everything the notification sink (`/sink/…`) received, refused deliveries included.
    pub fn sink(&self) -> Vec<SinkDelivery> {
        self.lock().sink.received.clone()
    }

    /// Refuses the sink's next `n` deliveries with 503 (a receiver that is down).
    pub fn fail_sink(&self, n: u32) {
        self.lock().sink.failures = n;
    }

    /// Whether `priority` requests run on the priority tier on this account (else on
    /// `default`, which its answers then say).
    pub fn set_priority_tier(&self, account_id: &str, priority: bool) -> bool {
        self.with_account(account_id, |a| a.priority_tier = priority)
    }

    /// Whether the account has only its primary window (its consume fails server-side).
    pub fn set_single_window(&self, account_id: &str, single: bool) -> bool {
        self.with_account(account_id, |a| a.single_window = single)
    }

    /// The account's reset credits as the backend lists them now.
    pub fn reset_credits(&self, account_id: &str) -> Option<Value> {
        let now = self.now_secs();
        let st = self.lock();
        st.account(account_id).map(|a| credits::list(a, now))
    }

    /// (primary, secondary) used percent, as the rate-limit headers would say now.
    pub fn usage(&self, account_id: &str) -> Option<(f64, f64)> {
        let now = self.now_secs();
        let mut st = self.lock();
        let a = st.account_mut(account_id)?;
        a.roll_windows(now);
        Some((a.primary.used_percent, a.secondary.used_percent))
    }

    /// Successful refreshes of the account so far.
    pub fn refresh_count(&self, account_id: &str) -> u32 {
        self.lock()
            .account(account_id)
            .map_or(0, |a| a.refresh_count)
    }

    pub fn set_supported_models(&self, account_id: &str, models: Vec<String>) -> bool {
        self.with_account(account_id, |a| a.supported_models = models)
    }

    /// Deactivates (401 `account_deactivated`) or reactivates the account.
    pub fn set_deactivated(&self, account_id: &str, deactivated: bool) -> bool {
        self.with_account(account_id, |a| a.deactivated = deactivated)
    }

    /// WebSocket upgrades of the account accepted (answered 101) so far.
    pub fn ws_connections(&self, account_id: &str) -> u32 {
        self.lock()
            .account(account_id)
            .map_or(0, |a| a.ws_connections)
    }

    /// The account's WebSockets open now (from the 101 until the connection ends).
    pub fn ws_open(&self, account_id: &str) -> u32 {
        self.lock().account(account_id).map_or(0, |a| a.ws_open)
    }

    /// Resolves once the account has exactly `n` open WebSockets (at once if it has). Tests
    /// wrap it in a timeout, e.g. to see a socket closed after its client left.
    pub async fn wait_ws_open(&self, account_id: &str, n: u32) {
        let mut changed = self.inner.ws_changed.subscribe();
        while self.ws_open(account_id) != n {
            // The sender lives as long as `self`: this never fails while we wait.
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// The account's HTTP answers of `/responses*` whose body is being written now (from the
    /// headers until the body ends or its connection does).
    pub fn http_open(&self, account_id: &str) -> u32 {
        self.lock().account(account_id).map_or(0, |a| a.http_open)
    }

    /// The account's HTTP answers of `/responses*` whose connection ended before their body
    /// was written to the end: the client gave the request up.
    pub fn http_cut(&self, account_id: &str) -> u32 {
        self.lock().account(account_id).map_or(0, |a| a.http_cut)
    }

    /// An HTTP answer's body of the account ended; `cut` when before its end.
    pub(crate) fn http_closed(&self, account_id: &str, cut: bool) {
        self.with_account(account_id, |a| {
            a.http_open = a.http_open.saturating_sub(1);
            a.http_cut += u32::from(cut);
        });
    }

    /// Wakes `wait_device_codes` (call without the lock held).
    pub(crate) fn device_code_issued(&self) {
        self.inner.device_codes_issued.send_modify(|n| *n += 1);
    }

    /// Wakes `wait_ws_open` (call without the lock held).
    pub(crate) fn ws_changed(&self) {
        self.inner.ws_changed.send_modify(|n| *n += 1);
    }

    /// A WebSocket of the account ended.
    pub(crate) fn ws_closed(&self, account_id: &str) {
        self.with_account(account_id, |a| a.ws_open = a.ws_open.saturating_sub(1));
        self.ws_changed();
    }

    fn with_account(&self, account_id: &str, f: impl FnOnce(&mut Account)) -> bool {
        match self.lock().account_mut(account_id) {
            Some(a) => {
                f(a);
                true
            }
            None => false,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    pub(crate) fn now_secs(&self) -> u64 {
        self.inner.clock.now_secs()
    }

    pub(crate) fn nonce(&self) -> &str {
        &self.inner.nonce
    }

    pub(crate) fn ttl_secs(&self) -> u64 {
        self.inner.ttl_secs
    }

    pub(crate) fn record(&self, r: RecordedRequest) {
        self.lock().record(r);
    }

    pub(crate) fn account_snapshot(&self, account_id: &str) -> Option<Value> {
        let now = self.now_secs();
        let mut st = self.lock();
        let a = st.account_mut(account_id)?;
        a.roll_windows(now);
        Some(a.snapshot(now))
    }

    pub(crate) fn accounts_snapshot(&self) -> Value {
        let now = self.now_secs();
        let mut st = self.lock();
        let accounts: Vec<Value> = st
            .accounts
            .iter_mut()
            .map(|a| {
                a.roll_windows(now);
                a.snapshot(now)
            })
            .collect();
        json!({"profile": self.inner.profile.map(Profile::name), "accounts": accounts})
    }
}
