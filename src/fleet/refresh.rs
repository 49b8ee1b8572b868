//! Access tokens: refreshed before they expire (JWT `exp` minus 5 minutes) and when the backend
//! says `token_expired`; one refresh at a time per account (single flight); the rotated refresh
//! token is committed to the store before the new access token is used.
//!
//! The token endpoint's answer is classified by `health::classify` like any other: a dead
//! login (`refresh_token_reused`, `invalid_grant`, …, or a 401) puts the account in
//! `needs_reauth` with the reason. An answer that asks to be tried later (a transport failure,
//! 429, 5xx) is the refresh being degraded: the account keeps its current access token while
//! that is still usable, with the failure shown on it. Anything else — a challenge page, an
//! error the gateway does not know — and any failure once the token can no longer be used
//! (expired, or just refused by the backend) applies the class's effect: a challenge page cools
//! the account on the edge ladder, an unknown error or a 5xx on the transient one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::health::{Class, Reauth, State, classify};
use super::{AccountView, Fleet, FleetError};
use crate::store::records::AccountSecrets;
use crate::store::secrets::Secret;
use crate::upstream::egress::ProxyUrl;
use crate::upstream::failure::{Endpoint, Facts};
use crate::upstream::{Identity, TokenSet, Upstream, Whoami};

/// Refresh this long before the access token's `exp`.
pub const REFRESH_SKEW: Duration = Duration::from_secs(300);

/// Whoever exchanges refresh tokens (the upstream in production, fakes in tests). A failure is
/// the token endpoint's answer as facts.
pub trait Refresher: Send + Sync {
    /// `proxy`: the account's own way out.
    fn refresh<'a>(
        &'a self,
        refresh_token: &'a str,
        proxy: Option<&'a Arc<ProxyUrl>>,
    ) -> BoxFuture<'a, Result<TokenSet, Facts>>;

    /// Whose a workspace access token is (the auth server's whoami).
    fn whoami<'a>(
        &'a self,
        access_token: &'a str,
        proxy: Option<&'a Arc<ProxyUrl>>,
    ) -> BoxFuture<'a, Result<Whoami, Facts>>;
}

impl Refresher for Upstream {
    fn refresh<'a>(
        &'a self,
        refresh_token: &'a str,
        proxy: Option<&'a Arc<ProxyUrl>>,
    ) -> BoxFuture<'a, Result<TokenSet, Facts>> {
        Box::pin(Upstream::refresh(self, refresh_token, proxy))
    }

    fn whoami<'a>(
        &'a self,
        access_token: &'a str,
        proxy: Option<&'a Arc<ProxyUrl>>,
    ) -> BoxFuture<'a, Result<Whoami, Facts>> {
        Box::pin(Upstream::whoami(self, access_token, proxy))
    }
}

/// After a refresh that failed while the current token stays in use, the next one waits this
/// long, doubling with each failure up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_secs(30);
pub const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Per-account single-flight locks, and the backoff of failing refreshes.
#[derive(Clone, Default)]
pub(crate) struct RefreshState {
    locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// Account -> (failures in a row, no refresh before this unix ms).
    backoff: Arc<Mutex<HashMap<String, (u32, u64)>>>,
}

impl RefreshState {
    fn lock_for(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(locks.entry(id.to_string()).or_default())
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u32, u64)>> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn backing_off(&self, id: &str, now_ms: u64) -> bool {
        self.backoff()
            .get(id)
            .is_some_and(|(_, until)| now_ms < *until)
    }

    fn failed(&self, id: &str, now_ms: u64) {
        let mut b = self.backoff();
        let (failures, until) = b.entry(id.to_string()).or_insert((0, 0));
        *failures = failures.saturating_add(1);
        let wait = BACKOFF_FIRST
            .saturating_mul(1 << (*failures - 1).min(10))
            .min(BACKOFF_MAX);
        *until = now_ms.saturating_add(crate::base::duration::whole_ms(wait));
    }

    fn succeeded(&self, id: &str) {
        self.backoff().remove(id);
    }
}

/// Why no usable access token could be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// The refresh failed and the current access token cannot be used: the failure, judged as
    /// `class`, has been applied to the account.
    Failed { class: Class, why: String },
    /// The account is gone or has no tokens.
    Missing,
}

impl TokenError {
    /// What went wrong, in a few words.
    pub fn summary(&self) -> String {
        match self {
            TokenError::Failed { why, .. } => why.clone(),
            TokenError::Missing => "the account has no tokens".into(),
        }
    }
}

impl Fleet {
    /// Due when less than the skew is left — or, for tokens issued with a lifetime shorter
    /// than twice the skew, less than half their lifetime (else every use would refresh).
    fn needs_refresh(s: &AccountSecrets, now_s: u64) -> bool {
        s.access_expires_at.is_some_and(|exp| {
            let lifetime = exp.saturating_sub(s.refreshed_at);
            let skew = REFRESH_SKEW.as_secs().min(lifetime / 2);
            exp <= now_s + skew
        })
    }

    fn token_valid(s: &AccountSecrets, now_s: u64) -> bool {
        s.access_expires_at.is_none_or(|exp| exp > now_s)
    }

    /// An identity with a usable access token: refreshes first when the token is close to
    /// expiry, or when `rejected` (the token the backend just refused) is still current.
    pub async fn ensure_fresh(
        &self,
        id: &str,
        rejected: Option<&str>,
        refresher: &dyn Refresher,
    ) -> Result<Identity, TokenError> {
        // The usual case, in one look at the account: a token that can be refreshed, is not
        // due, and was not refused. It is what the checks below find for it too.
        if rejected.is_none() {
            let inner = self.read();
            let e = inner.accounts.get(id).ok_or(TokenError::Missing)?;
            let s = e.secrets.as_ref().ok_or(TokenError::Missing)?;
            if s.refreshable() && !Self::needs_refresh(s, self.clock.now_secs()) {
                return Ok(Self::identity_of(e, s));
            }
        }
        if let Some(dead) = self.unrefreshable_end(id, rejected) {
            return dead;
        }
        let due = |fleet: &Fleet| -> Result<bool, TokenError> {
            let inner = fleet.read();
            let e = inner.accounts.get(id).ok_or(TokenError::Missing)?;
            let s = e.secrets.as_ref().ok_or(TokenError::Missing)?;
            let now_ms = fleet.clock.now_ms();
            let now = now_ms / 1000;
            // While a failing refresh backs off, a still-valid token is used as it is.
            Ok(rejected.is_some_and(|r| r == s.access_token.expose())
                || (Self::needs_refresh(s, now)
                    && !(fleet.refresh.backing_off(id, now_ms) && Self::token_valid(s, now))))
        };
        if !due(self)? {
            return self.identity(id).ok_or(TokenError::Missing);
        }
        let lock = self.refresh.lock_for(id);
        let _single_flight = lock.lock().await;
        // Someone else may have refreshed while we waited.
        if !due(self)? {
            return self.identity(id).ok_or(TokenError::Missing);
        }
        self.refresh_now(id, rejected, refresher)
            .await
            .map(|(identity, _)| identity)
    }

    /// For a login that cannot be refreshed (a workspace access token): `None` while its
    /// token is usable; once it has expired, or the backend refused it (`rejected`), the
    /// account needs a new token — the end of such a login, said once.
    fn unrefreshable_end(
        &self,
        id: &str,
        rejected: Option<&str>,
    ) -> Option<Result<Identity, TokenError>> {
        let expired = {
            let inner = self.read();
            let e = inner.accounts.get(id)?;
            let s = e.secrets.as_ref()?;
            if s.refreshable() {
                return None;
            }
            rejected == Some(s.access_token.expose())
                || !Self::token_valid(s, self.clock.now_secs())
        };
        if !expired {
            return None;
        }
        let facts = Facts {
            endpoint: Endpoint::Token,
            status: Some(401),
            error_code: Some(Reauth::AccessTokenExpired.as_str().into()),
            message: Some(Reauth::AccessTokenExpired.describe().into()),
            ..Facts::default()
        };
        if self.get(id).is_some_and(|a| a.reauth.is_none()) {
            tracing::warn!(account = %id, "the access token expired; the account needs a new one");
            self.report(id, Class::AuthDead, Some(&facts), "");
        }
        Some(Err(TokenError::Failed {
            class: Class::AuthDead,
            why: Reauth::AccessTokenExpired.advice(id),
        }))
    }

    /// Refreshes the account's tokens unconditionally (the caller holds the single-flight
    /// lock). When the refresh fails but the current access token is still usable (not
    /// expired, and not the `rejected` one), returns that token and the reason the refresh
    /// failed.
    async fn refresh_now(
        &self,
        id: &str,
        rejected: Option<&str>,
        refresher: &dyn Refresher,
    ) -> Result<(Identity, Option<String>), TokenError> {
        let (current, proxy) = {
            let inner = self.read();
            let e = inner.accounts.get(id).ok_or(TokenError::Missing)?;
            (
                e.secrets.clone().ok_or(TokenError::Missing)?,
                e.proxy.clone(),
            )
        };
        tracing::info!(account = %id, "refreshing access token");
        match refresher
            .refresh(current.refresh_token.expose(), proxy.as_ref())
            .await
        {
            Ok(tokens) => {
                self.refresh.succeeded(id);
                let fresh = self.rotated(&current, tokens);
                // Commit the rotated refresh token before using the new access token: the old
                // refresh token is dead from now on.
                match self.store.secrets_mutation(id, &fresh) {
                    Ok(m) => {
                        if let Err(e) = self.store.write(vec![m]).await {
                            tracing::error!(account = %id, error = %e, "rotated tokens could not be persisted; keeping them in memory");
                        }
                    }
                    Err(e) => {
                        tracing::error!(account = %id, error = %e, "cannot seal rotated tokens")
                    }
                }
                let revived = {
                    let mut inner = self.write();
                    let mut e = inner.accounts.get_mut(id).ok_or(TokenError::Missing)?;
                    e.secrets = Some(fresh);
                    // Routing is asked again after a refresh.
                    e.route = super::Route::Unknown;
                    let revived = e.health.state == State::NeedsReauth;
                    if revived {
                        e.health.clear();
                    }
                    revived.then(|| e.health.clone())
                };
                if let Some(h) = revived {
                    self.persist_health(id, &h);
                }
                self.identity(id)
                    .map(|i| (i, None))
                    .ok_or(TokenError::Missing)
            }
            Err(facts) => {
                self.refresh.failed(id, self.clock.now_ms());
                let class = classify(&facts, "");
                let why = facts.summary();
                let now = self.clock.now_secs();
                // Only an answer that asks to be tried later (a transport failure, 429, 5xx)
                // leaves the account on its current token; one that refuses this refresh for
                // any other reason (a challenge page, an error we do not know) cools it.
                let usable = class != Class::AuthDead
                    && facts.asks_to_retry_later()
                    && Self::token_valid(&current, now)
                    && rejected != Some(current.access_token.expose());
                if usable {
                    tracing::warn!(account = %id, class = class.as_str(), reason = %why, "refresh failed; the current access token stays in use");
                    self.note_failure(id, class, &facts);
                    return self
                        .identity(id)
                        .map(|i| (i, Some(why)))
                        .ok_or(TokenError::Missing);
                }
                tracing::warn!(account = %id, class = class.as_str(), reason = %why, "refresh failed");
                self.report(id, class, Some(&facts), "");
                // A dead login says why and what to run, in the request's record too.
                let why = match self.get(id).and_then(|a| a.reauth) {
                    Some(r) if class == Class::AuthDead => format!("{why}: {}", r.advice(id)),
                    _ => why,
                };
                Err(TokenError::Failed { class, why })
            }
        }
    }

    fn rotated(&self, current: &AccountSecrets, t: TokenSet) -> AccountSecrets {
        let exp = super::auth_file::decode_claims(&t.access_token)
            .ok()
            .and_then(|c| c.exp);
        let now = self.clock.now_secs();
        // The spent refresh token is remembered: an auth file that brings it back is older.
        current.succeeded_by(
            AccountSecrets {
                access_token: Secret::new(t.access_token),
                refresh_token: Secret::new(t.refresh_token),
                id_token: t
                    .id_token
                    .map(Secret::new)
                    .unwrap_or_else(|| current.id_token.clone()),
                access_expires_at: exp,
                refreshed_at: now,
                replaced: Vec::new(),
            },
            now,
        )
    }

    /// Operator-requested refresh (admin API).
    pub async fn refresh_account(
        &self,
        selector: &str,
        refresher: &dyn Refresher,
    ) -> Result<AccountView, FleetError> {
        let id = self.resolve(selector)?;
        let refreshable = {
            let inner = self.read();
            let e = inner
                .accounts
                .get(&id)
                .ok_or(FleetError::NotFound(id.clone()))?;
            e.secrets.as_ref().is_none_or(AccountSecrets::refreshable)
        };
        if !refreshable {
            return Err(FleetError::Refresh(
                "an access-token login has nothing to refresh: import a new token when it expires"
                    .into(),
            ));
        }
        let lock = self.refresh.lock_for(&id);
        let _single_flight = lock.lock().await;
        match self.refresh_now(&id, None, refresher).await {
            Ok((_, Some(why))) => Err(FleetError::Refresh(format!(
                "{why} (the current access token stays in use while it is valid)"
            ))),
            Ok((_, None)) => self.get(&id).ok_or(FleetError::NotFound(id)),
            Err(TokenError::Failed { why, .. }) => Err(FleetError::Refresh(why)),
            Err(TokenError::Missing) => Err(FleetError::NotFound(id)),
        }
    }

    /// Ids of accounts whose access token expires within the refresh skew (for the background
    /// refresher).
    pub fn due_for_refresh(&self) -> Vec<String> {
        let now_ms = self.clock.now_ms();
        let now = now_ms / 1000;
        self.read()
            .accounts
            .values()
            .filter(|e| e.record.enabled && e.health.state != State::NeedsReauth)
            .filter(|e| !self.refresh.backing_off(&e.record.id, now_ms))
            .filter(|e| {
                e.secrets
                    .as_ref()
                    .is_some_and(|s| s.refreshable() && Self::needs_refresh(s, now))
            })
            .map(|e| e.record.id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::ManualClock;
    use crate::fleet::health::{AccountState, Reauth};
    use crate::sim::auth::{AuthSpec, access_token, auth_json};
    use crate::store::Store;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Fake {
        calls: AtomicU32,
        answer: Mutex<Result<TokenSet, Facts>>,
        gate: tokio::sync::Semaphore,
    }

    impl Refresher for Fake {
        fn refresh<'a>(
            &'a self,
            _rt: &'a str,
            _proxy: Option<&'a Arc<ProxyUrl>>,
        ) -> BoxFuture<'a, Result<TokenSet, Facts>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                let _permit = self.gate.acquire().await;
                self.answer.lock().unwrap().clone()
            })
        }

        fn whoami<'a>(
            &'a self,
            token: &'a str,
            _proxy: Option<&'a Arc<ProxyUrl>>,
        ) -> BoxFuture<'a, Result<Whoami, Facts>> {
            Box::pin(async move {
                match token.strip_prefix("at-") {
                    Some(account) => Ok(Whoami {
                        chatgpt_account_id: account.to_string(),
                        chatgpt_user_id: Some("u".into()),
                        email: Some("ws@example.com".into()),
                        chatgpt_plan_type: Some("business".into()),
                        chatgpt_account_is_fedramp: false,
                    }),
                    None => Err(Facts {
                        status: Some(401),
                        error_code: Some("invalid_token".into()),
                        ..Facts::default()
                    }),
                }
            })
        }
    }

    fn spec(exp: u64, tag: &str) -> AuthSpec {
        AuthSpec {
            email: "a@example.com".into(),
            chatgpt_account_id: "acc-1".into(),
            chatgpt_user_id: "u".into(),
            plan: "plus".into(),
            access_exp: exp,
            token_tag: tag.into(),
        }
    }

    const NOW_S: u64 = 1_767_225_600;

    /// The same, with the clock.
    async fn setup_clock(exp: u64) -> (Fleet, String, ManualClock) {
        let store = Store::open_in_memory().unwrap();
        let clock = ManualClock::new((NOW_S - 3600) * 1000);
        let f = Fleet::load(store, Arc::new(clock.clone())).unwrap();
        let id = f
            .import(
                f.parse_auth(auth_json(&spec(exp, "old")).to_string().as_bytes())
                    .unwrap(),
            )
            .await
            .unwrap()
            .account
            .id;
        f.proven(&id);
        clock.set_ms(NOW_S * 1000);
        (f, id, clock)
    }

    /// An account whose tokens were obtained an hour ago and expire at `exp`.
    async fn setup(exp: u64) -> (Fleet, String, Store) {
        let (f, id, _) = setup_clock(exp).await;
        let store = f.store().clone();
        (f, id, store)
    }

    fn fake(answer: Result<TokenSet, Facts>, permits: usize) -> Fake {
        Fake {
            calls: AtomicU32::new(0),
            answer: Mutex::new(answer),
            gate: tokio::sync::Semaphore::new(permits),
        }
    }

    #[tokio::test]
    async fn a_workspace_access_token_is_validated_never_refreshed_and_ends_as_a_new_token_needed()
    {
        let store = Store::open_in_memory().unwrap();
        let clock = ManualClock::new(NOW_S * 1000);
        let f = Fleet::load(store, Arc::new(clock.clone())).unwrap();
        let up = fake(Ok(new_tokens()), 10);
        // Not one of the auth server's: refused, nothing imported.
        let bad = serde_json::json!({"tokens": {"access_token": "not-a-workspace-token"}});
        let err = f
            .import_auth(bad.to_string().as_bytes(), &up)
            .await
            .unwrap_err();
        assert!(
            matches!(err, FleetError::AccessToken { refused: true, .. }),
            "{err}"
        );
        assert!(f.list().is_empty());
        let auth = serde_json::json!({"tokens": {"access_token": "at-acc-ws"}});
        let imported = f
            .import_auth(auth.to_string().as_bytes(), &up)
            .await
            .unwrap();
        let id = imported.account.id.clone();
        assert!(imported.account.access_token_only);
        assert_eq!(imported.account.chatgpt_account_id, "acc-ws");
        assert_eq!(imported.account.email.as_deref(), Some("ws@example.com"));
        f.proven(&id);
        // Used as it is, never refreshed, never due.
        let identity = f.ensure_fresh(&id, None, &up).await.unwrap();
        assert_eq!(&*identity.access_token, "at-acc-ws");
        assert!(f.due_for_refresh().is_empty());
        assert!(matches!(
            f.refresh_account(&id, &up).await,
            Err(FleetError::Refresh(_))
        ));
        assert_eq!(up.calls.load(Ordering::SeqCst), 0);
        // The backend refused it: the account needs a new token, and says so.
        let end = f.ensure_fresh(&id, Some("at-acc-ws"), &up).await;
        assert!(matches!(
            end,
            Err(TokenError::Failed {
                class: Class::AuthDead,
                ..
            })
        ));
        let a = f.get(&id).unwrap();
        assert_eq!(a.state, AccountState::NeedsReauth);
        assert_eq!(a.reauth, Some(Reauth::AccessTokenExpired));
        assert_eq!(up.calls.load(Ordering::SeqCst), 0);
    }

    fn new_tokens() -> TokenSet {
        TokenSet {
            access_token: access_token(&spec(NOW_S + 3600, "new")),
            refresh_token: "rt-new".into(),
            id_token: None,
        }
    }

    #[tokio::test]
    async fn a_valid_token_is_used_as_is() {
        let (f, id, _) = setup(NOW_S + 3600).await;
        let r = fake(Ok(new_tokens()), 1);
        let ident = f.ensure_fresh(&id, None, &r).await.unwrap();
        assert_eq!(
            *ident.access_token,
            access_token(&spec(NOW_S + 3600, "old"))
        );
        assert_eq!(r.calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn concurrent_refreshes_are_single_flight_and_persist_the_rotated_token() {
        let (f, id, store) = setup(NOW_S + 60).await; // inside the 5-minute skew
        let r = Arc::new(fake(Ok(new_tokens()), 0));
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let f = f.clone();
            let id = id.clone();
            let r = Arc::clone(&r);
            tasks.push(tokio::spawn(async move {
                f.ensure_fresh(&id, None, r.as_ref()).await
            }));
        }
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while r.calls.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a refresh starts");
        r.gate.add_permits(10);
        for t in tasks {
            let ident = t.await.unwrap().unwrap();
            assert_eq!(*ident.access_token, new_tokens().access_token);
        }
        assert_eq!(r.calls.load(Ordering::SeqCst), 1);
        let stored = store.account_secrets(&id).unwrap().unwrap();
        assert_eq!(stored.refresh_token.expose(), "rt-new");
        assert_eq!(stored.access_expires_at, Some(NOW_S + 3600));
    }

    #[tokio::test]
    async fn a_rejected_token_forces_one_refresh() {
        let (f, id, _) = setup(NOW_S + 3600).await;
        let r = fake(Ok(new_tokens()), 1);
        let old = f.identity(&id).unwrap().access_token;
        let ident = f.ensure_fresh(&id, Some(&old), &r).await.unwrap();
        assert_ne!(ident.access_token, old);
        // The Authorization value follows the token, and is made once per token.
        let bearer = |i: &Identity| i.bearer.clone().unwrap();
        assert_eq!(
            bearer(&ident).as_bytes(),
            format!("Bearer {}", ident.access_token).as_bytes()
        );
        assert!(bearer(&ident).is_sensitive());
        let again = f.identity(&id).unwrap();
        assert_eq!(
            bearer(&again).as_bytes().as_ptr(),
            bearer(&ident).as_bytes().as_ptr()
        );
        // The token itself is shared with each identity, not copied.
        assert!(std::sync::Arc::ptr_eq(
            &again.access_token,
            &ident.access_token
        ));
        // So are the identity headers' values: the account's own ids, made once.
        let values = |i: &Identity| i.values.clone().unwrap();
        assert_eq!(
            values(&ident).account.as_bytes(),
            ident.chatgpt_account_id.as_bytes()
        );
        assert_eq!(
            values(&ident).installation.as_bytes(),
            ident.installation_id.as_bytes()
        );
        assert_eq!(
            values(&again).installation.as_bytes().as_ptr(),
            values(&ident).installation.as_bytes().as_ptr()
        );
        // The old token is no longer current: a late second report does not refresh again.
        f.ensure_fresh(&id, Some(&old), &r).await.unwrap();
        assert_eq!(r.calls.load(Ordering::SeqCst), 1);
    }

    /// The token endpoint's answer, as the upstream client reports it.
    fn token_answer(status: u16, headers: &[(&'static str, &'static str)], body: &str) -> Facts {
        let mut h = reqwest::header::HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, v.parse().unwrap());
        }
        Facts::from_response(status, &h, bytes::Bytes::from(body.to_string()))
            .at(crate::upstream::failure::Endpoint::Token)
    }

    #[tokio::test]
    async fn a_reused_refresh_token_needs_reauth_and_says_why() {
        let (f, id, _) = setup(NOW_S + 60).await;
        let r = fake(
            Err(token_answer(
                401,
                &[],
                r#"{"error":{"message":"Your refresh token has already been used to generate a new access token. Please try signing in again.","type":"invalid_request_error","param":null,"code":"refresh_token_reused"}}"#,
            )),
            1,
        );
        assert!(matches!(
            f.ensure_fresh(&id, None, &r).await,
            Err(TokenError::Failed {
                class: Class::AuthDead,
                ..
            })
        ));
        let a = f.get(&id).unwrap();
        assert_eq!(a.state, AccountState::NeedsReauth);
        assert_eq!(a.reauth, Some(Reauth::RefreshTokenReused));
        assert!(
            Reauth::RefreshTokenReused
                .describe()
                .contains("another holder of the same login")
        );
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_a_still_valid_token_and_shows_the_failure() {
        let (f, id, _) = setup(NOW_S + 60).await;
        let r = fake(Err(token_answer(503, &[], "upstream connect error")), 1);
        let ident = f.ensure_fresh(&id, None, &r).await.unwrap();
        assert_eq!(*ident.access_token, access_token(&spec(NOW_S + 60, "old")));
        let a = f.get(&id).unwrap();
        assert_eq!(a.state, AccountState::Ready);
        assert!(a.last_error.unwrap().contains("token refresh: 503"));
    }

    /// Answers that say nothing about the login: with a token that can no longer be used the
    /// account cools by the answer's class, never `needs_reauth`.
    #[tokio::test]
    async fn answers_that_are_not_about_the_login_cool_instead_of_needing_a_login() {
        let cases = [
            (
                token_answer(
                    403,
                    &[("content-type", "text/html"), ("cf-mitigated", "challenge")],
                    "<html><title>Just a moment...</title></html>",
                ),
                Class::EdgeChallenge,
            ),
            (
                token_answer(
                    400,
                    &[],
                    r#"{"error":"unsupported_country_region_territory"}"#,
                ),
                Class::Transient,
            ),
            (token_answer(502, &[], "bad gateway"), Class::Transient),
            (token_answer(429, &[], "{}"), Class::RateLimited),
        ];
        for (answer, class) in cases {
            // Expired ten seconds ago: the refresh is needed and the old token is no use.
            let (f, id, _) = setup(NOW_S - 10).await;
            let r = fake(Err(answer), 1);
            match f.ensure_fresh(&id, None, &r).await {
                Err(TokenError::Failed { class: got, .. }) => assert_eq!(got, class),
                other => panic!("expected a failed refresh, got {other:?}"),
            }
            let a = f.get(&id).unwrap();
            assert_eq!(a.state, AccountState::Cooling, "{class:?}");
            assert_eq!(a.reason, Some(class));
            assert!(a.last_error.unwrap().contains("token refresh"));
        }
    }

    /// With a token still good for a while, only "try later" answers keep the account serving;
    /// a challenge page or an unknown error cools it all the same.
    #[tokio::test]
    async fn a_refusal_that_is_not_a_retry_later_cools_even_a_still_valid_token() {
        let refused = [
            (
                token_answer(403, &[("cf-mitigated", "challenge")], "<html></html>"),
                Class::EdgeChallenge,
            ),
            (
                token_answer(400, &[], r#"{"error":"weird"}"#),
                Class::Transient,
            ),
        ];
        for (answer, class) in refused {
            let (f, id, _) = setup(NOW_S + 60).await;
            let r = fake(Err(answer), 1);
            assert!(matches!(
                f.ensure_fresh(&id, None, &r).await,
                Err(TokenError::Failed { .. })
            ));
            let a = f.get(&id).unwrap();
            assert_eq!((a.state, a.reason), (AccountState::Cooling, Some(class)));
        }
        let (f, id, _) = setup(NOW_S + 60).await;
        let r = fake(Err(token_answer(429, &[], "{}")), 1);
        assert!(f.ensure_fresh(&id, None, &r).await.is_ok());
        assert_eq!(f.get(&id).unwrap().state, AccountState::Ready);
    }

    #[tokio::test]
    async fn a_failing_refresh_backs_off_while_the_token_is_still_valid() {
        let (f, id, clock) = setup_clock(NOW_S + 240).await; // due, and valid for 4 minutes
        let r = fake(Err(token_answer(503, &[], "")), 10);
        for _ in 0..5 {
            f.ensure_fresh(&id, None, &r).await.unwrap();
        }
        assert_eq!(r.calls.load(Ordering::SeqCst), 1, "not once per request");
        assert!(
            f.due_for_refresh().is_empty(),
            "nor by the background refresher"
        );
        clock.advance_ms(BACKOFF_FIRST.as_millis() as u64);
        f.ensure_fresh(&id, None, &r).await.unwrap();
        f.ensure_fresh(&id, None, &r).await.unwrap();
        assert_eq!(
            r.calls.load(Ordering::SeqCst),
            2,
            "then once per (doubled) wait"
        );
        // A token the backend refuses is refreshed at once, backoff or not.
        let current = f.identity(&id).unwrap().access_token;
        assert!(f.ensure_fresh(&id, Some(&current), &r).await.is_err());
        assert_eq!(r.calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_token_the_backend_refused_is_not_kept_when_the_refresh_fails() {
        let (f, id, _) = setup(NOW_S + 3600).await;
        let r = fake(Err(token_answer(503, &[], "")), 1);
        let old = f.identity(&id).unwrap().access_token;
        assert!(matches!(
            f.ensure_fresh(&id, Some(&old), &r).await,
            Err(TokenError::Failed {
                class: Class::Transient,
                ..
            })
        ));
        assert_eq!(f.get(&id).unwrap().state, AccountState::Cooling);
    }
}
