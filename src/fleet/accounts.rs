//! The operator's side of the pool: each account as a typed view (converted to the wire shape
//! only at the edge, `api::view`), finding accounts by any of their names, and the actions on
//! them — import, enable and disable, drain, remove, clear a cooldown.

use std::collections::BTreeMap;

use super::auth_file::{self, ParsedAuth};
use super::health::{AccountState, Class, Effective, Health, Reauth, State};
use super::{Entry, Fleet, FleetError, account_id};
use crate::store::Store;
use crate::store::records::{AccountRecord, AccountSecrets};
use crate::upstream::quota::QuotaSnapshot;

/// One account as the pool sees it at a moment. The admin API and the console get it
/// converted to their wire shape at the edge (`api::view`).
#[derive(Debug, Clone, PartialEq)]
pub struct AccountView {
    pub id: String,
    pub label: String,
    pub email: Option<String>,
    /// The plan the backend last reported, else the one in the login's claims.
    pub plan: Option<String>,
    pub chatgpt_account_id: String,
    pub enabled: bool,
    pub state: AccountState,
    /// Unix seconds.
    pub created_at: u64,
    /// Why it is not ready (also kept while an escalated account climbs back down).
    pub reason: Option<Class>,
    /// Why it needs a new login.
    pub reauth: Option<Reauth>,
    /// While cooling: when it half-opens (unix ms).
    pub cooldown_until_ms: Option<u64>,
    /// Highest step reached on a cooldown ladder (0 = not escalated).
    pub level: u8,
    pub last_error: Option<String>,
    pub in_flight: u32,
    /// The adaptive concurrency limit (slots are its floor).
    pub limit: f64,
    pub max_concurrency: Option<u32>,
    pub priority: i32,
    /// Sessions waiting for its slot, and how long the oldest has (ms).
    pub waiting: usize,
    pub oldest_wait_ms: Option<u64>,
    pub draining: bool,
    /// Models the backend said this account may not use, while the marks last (sorted).
    pub unsupported_models: Vec<String>,
    pub quota: Option<QuotaSnapshot>,
    /// Its own egress proxy, password hidden.
    pub proxy: Option<String>,
    /// A workspace access token (never refreshed) rather than a refreshable login.
    pub access_token_only: bool,
    /// Its data-residency workspace's own origin, when it has one.
    pub origin: Option<String>,
    /// Why routing discovery failed, when it did (the configured origin is used meanwhile).
    pub routing_error: Option<String>,
    /// When its access token expires, when known (unix seconds).
    pub token_expires_at: Option<u64>,
    /// The clock when the view was taken (unix ms).
    pub at_ms: u64,
}

/// An account after an import: new, or an update of one already in the pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    pub account: AccountView,
    pub created: bool,
    /// Why nothing changed: the file's login is the account's own, or older than it.
    pub unchanged: Option<String>,
}

/// Why an auth file's login must not replace what the account holds (`alive`: the account's
/// login works), if it must not: the same login, a refresh token the account's chain has
/// already spent or replaced, or tokens that expire before the account's do.
fn stale_login(holds: &AccountSecrets, file: &AccountSecrets, alive: bool) -> Option<String> {
    let date = crate::base::clock::rfc3339;
    let same = if file.refreshable() {
        file.refresh_token == holds.refresh_token
    } else {
        file.access_token == holds.access_token
    };
    if same {
        return Some("already imported: the account holds this very login".into());
    }
    if let Some(at) = holds.replaced_at(file.refresh_token.expose()) {
        return Some(format!(
            "already imported; this file's tokens were replaced on {} (a refresh spent its \
             refresh token, which cannot be used again)",
            date(at)
        ));
    }
    match (file.access_expires_at, holds.access_expires_at) {
        (Some(file_exp), Some(holds_exp)) if alive && file_exp < holds_exp => Some(format!(
            "this file's login is older than the account's (its access token expires {}, the \
             account's {})",
            date(file_exp),
            date(holds_exp)
        )),
        _ => None,
    }
}

impl Fleet {
    fn state_of(e: &Entry, now_ms: u64) -> AccountState {
        if !e.record.enabled {
            AccountState::Disabled
        } else {
            e.health.effective(now_ms).state()
        }
    }

    fn view(e: &Entry, now_ms: u64) -> AccountView {
        let a = &e.record;
        let effective = e.health.effective(now_ms);
        AccountView {
            id: a.id.clone(),
            label: a.label.clone(),
            email: a.email.clone(),
            plan: e
                .quota
                .as_ref()
                .and_then(|q| q.plan.clone())
                .or_else(|| a.plan.clone()),
            chatgpt_account_id: a.chatgpt_account_id.clone(),
            enabled: a.enabled,
            state: Self::state_of(e, now_ms),
            created_at: a.created_at,
            reason: match effective {
                Effective::Ready if e.health.level() == 0 => None,
                _ => e.health.reason,
            },
            reauth: match effective {
                Effective::NeedsReauth => e.health.reauth,
                _ => None,
            },
            cooldown_until_ms: match effective {
                Effective::Cooling { until_ms } => Some(until_ms),
                _ => None,
            },
            level: e.health.level(),
            last_error: e.health.last_error.clone(),
            in_flight: e.in_flight,
            limit: e.limit,
            max_concurrency: a.max_concurrency,
            priority: a.priority,
            waiting: e.waiters.len(),
            oldest_wait_ms: e.waiters.front().map(|w| now_ms.saturating_sub(w.since_ms)),
            draining: e.draining,
            unsupported_models: {
                let mut m: Vec<String> = e
                    .unsupported
                    .iter()
                    .filter(|(_, until)| **until > now_ms)
                    .map(|(model, _)| model.clone())
                    .collect();
                m.sort();
                m
            },
            quota: e.quota.clone(),
            proxy: e.proxy.as_ref().map(|p| p.redacted()),
            access_token_only: e.secrets.as_ref().is_some_and(|s| !s.refreshable()),
            origin: match &e.route {
                super::Route::Workspace(r) => Some(r.origin.clone()),
                _ => None,
            },
            routing_error: match &e.route {
                super::Route::Failed(why) => Some(why.clone()),
                _ => None,
            },
            token_expires_at: e.secrets.as_ref().and_then(|s| s.access_expires_at),
            at_ms: now_ms,
        }
    }

    /// Every account, oldest first.
    pub fn list(&self) -> Vec<AccountView> {
        let now = self.clock.now_ms();
        let inner = self.read();
        let mut v: Vec<&Entry> = inner.accounts.values().collect();
        v.sort_by(|a, b| {
            a.record
                .created_at
                .cmp(&b.record.created_at)
                .then(a.record.id.cmp(&b.record.id))
        });
        v.into_iter().map(|e| Self::view(e, now)).collect()
    }

    pub fn get(&self, id: &str) -> Option<AccountView> {
        let now = self.clock.now_ms();
        self.read().accounts.get(id).map(|e| Self::view(e, now))
    }

    /// Finds one account by id, ChatGPT account id, email or label.
    pub fn resolve(&self, selector: &str) -> Result<String, FleetError> {
        let inner = self.read();
        if inner.accounts.contains_key(selector) {
            return Ok(selector.to_string());
        }
        let matches: Vec<&String> = inner
            .accounts
            .values()
            .filter(|e| {
                let a = &e.record;
                a.chatgpt_account_id == selector
                    || a.email.as_deref() == Some(selector)
                    || a.label == selector
            })
            .map(|e| &e.record.id)
            .collect();
        match matches.as_slice() {
            [id] => Ok((*id).clone()),
            [] => Err(FleetError::NotFound(selector.to_string())),
            many => Err(FleetError::Ambiguous {
                selector: selector.to_string(),
                count: many.len(),
            }),
        }
    }

    /// Parses an auth.json (nothing is written if it is bad).
    pub fn parse_auth(&self, bytes: &[u8]) -> Result<ParsedAuth, FleetError> {
        Ok(auth_file::parse(bytes, self.clock.now_secs())?)
    }

    /// Imports an auth.json (see [`Fleet::import`]). One that holds only an access token (a
    /// workspace's `at-…`) is validated first with the auth server's whoami, which names its
    /// account.
    pub async fn import_auth(
        &self,
        bytes: &[u8],
        refresher: &dyn super::refresh::Refresher,
    ) -> Result<Imported, FleetError> {
        let now = self.clock.now_secs();
        let parsed = match auth_file::parse(bytes, now) {
            Err(auth_file::AuthFileError::AccessTokenOnly(token)) => {
                let who = refresher.whoami(token.expose(), None).await.map_err(|f| {
                    FleetError::AccessToken {
                        refused: f.status.is_some_and(|s| (400..500).contains(&s)),
                        why: f.summary(),
                    }
                })?;
                auth_file::from_whoami(token, &who, now)?
            }
            other => other?,
        };
        self.import(parsed).await
    }

    /// Adds the account of an auth.json, or updates the tokens (and claims) of the account it
    /// already is. Either way it is unproven — probed in the background before it takes
    /// requests; a re-login keeps its health otherwise (a cooldown on its quota stays, a dead
    /// login is alive again). Returns once durable.
    pub async fn import(&self, parsed: ParsedAuth) -> Result<Imported, FleetError> {
        let id = account_id(
            &parsed.chatgpt_account_id,
            parsed.chatgpt_user_id.as_deref(),
        );
        let now = self.clock.now_secs();
        let (existing, holds, alive, view) = match self.read().accounts.get(&id) {
            Some(e) => (
                Some(e.record.clone()),
                e.secrets.clone(),
                e.health.state != State::NeedsReauth,
                Some(Self::view(e, self.clock.now_ms())),
            ),
            None => (None, None, false, None),
        };
        // A login is never replaced by an older one (a provisioning script run again brings
        // back the file whose refresh token the first import's refresh spent).
        if let (Some(holds), Some(account)) = (&holds, view)
            && let Some(why) = stale_login(holds, &parsed.secrets, alive)
        {
            tracing::info!(account = %id, "import changed nothing: {why}");
            return Ok(Imported {
                account,
                created: false,
                unchanged: Some(why),
            });
        }
        let secrets = match &holds {
            Some(holds) => holds.succeeded_by(parsed.secrets, now),
            None => parsed.secrets,
        };
        let created = existing.is_none();
        let record = match existing {
            Some(mut a) => {
                a.email = parsed.email.clone().or(a.email);
                a.plan = parsed.plan.clone().or(a.plan);
                a.chatgpt_user_id = parsed.chatgpt_user_id.clone().or(a.chatgpt_user_id);
                a.updated_at = now;
                a
            }
            None => AccountRecord {
                label: parsed
                    .email
                    .clone()
                    .unwrap_or_else(|| format!("account-{id}")),
                id: id.clone(),
                email: parsed.email.clone(),
                plan: parsed.plan.clone(),
                chatgpt_account_id: parsed.chatgpt_account_id.clone(),
                chatgpt_user_id: parsed.chatgpt_user_id.clone(),
                enabled: true,
                priority: 0,
                max_concurrency: None,
                created_at: now,
                updated_at: now,
            },
        };
        let mut health = self
            .read()
            .accounts
            .get(&id)
            .map(|e| e.health.clone())
            .unwrap_or_default();
        health.relogin();
        self.store
            .write(vec![
                Store::account_mutation(&record)?,
                self.store.secrets_mutation(&record.id, &secrets)?,
                Store::health_mutation(&record.id, &health.to_record())?,
            ])
            .await?;
        let now_ms = self.clock.now_ms();
        let mut inner = self.write();
        let limit = f64::from(
            record
                .max_concurrency
                .unwrap_or(self.settings().max_concurrency)
                .max(1),
        );
        let first = record.clone();
        let account = inner.accounts.upsert(
            id,
            || Entry::new(first, Health::default(), None, limit),
            |entry| {
                entry.chatgpt_id = std::sync::Arc::from(record.chatgpt_account_id.as_str());
                entry.record = record;
                entry.secrets = Some(secrets);
                // Its routing is asked again with the new login.
                entry.route = super::Route::Unknown;
                entry.health = health;
                Self::view(entry, now_ms)
            },
        );
        Ok(Imported {
            account,
            created,
            unchanged: None,
        })
    }

    pub async fn set_enabled(
        &self,
        selector: &str,
        enabled: bool,
    ) -> Result<AccountView, FleetError> {
        let (id, (record, view)) = self.update_entry(selector, |e, now_ms| {
            e.record.enabled = enabled;
            e.record.updated_at = now_ms / 1000;
            (e.record.clone(), Self::view(e, now_ms))
        })?;
        self.store
            .write(vec![Store::account_mutation(&record)?])
            .await?;
        tracing::info!(account = %id, enabled, "account {}", if enabled { "enabled" } else { "disabled" });
        Ok(view)
    }

    /// The account's login as a Codex `auth.json` (what `codex login` writes), and — unless
    /// `keep` — the account disabled here, written before the login is handed out: a login
    /// lives in one place.
    pub async fn export(
        &self,
        selector: &str,
        keep: bool,
    ) -> Result<(AccountView, serde_json::Value), FleetError> {
        let id = self.resolve(selector)?;
        let auth = {
            let inner = self.read();
            let e = inner
                .accounts
                .get(&id)
                .ok_or_else(|| FleetError::NotFound(id.clone()))?;
            let s = e.secrets.as_ref().ok_or_else(|| {
                FleetError::Invalid(format!("login of {id}: its tokens cannot be opened"))
            })?;
            serde_json::json!({
                "auth_mode": "chatgpt",
                "OPENAI_API_KEY": null,
                "tokens": {
                    "id_token": s.id_token.expose(),
                    "access_token": s.access_token.expose(),
                    "refresh_token": s.refresh_token.expose(),
                    "account_id": e.record.chatgpt_account_id,
                },
                "last_refresh": crate::base::clock::rfc3339(s.refreshed_at),
            })
        };
        let view = if keep {
            self.get(&id)
                .ok_or_else(|| FleetError::NotFound(id.clone()))?
        } else {
            self.set_enabled(&id, false).await?
        };
        tracing::info!(account = %id, keep, "account login exported");
        Ok((view, auth))
    }

    /// Starts or ends draining: a draining account serves the sessions bound to it and takes
    /// no new ones. It lives in memory only: a restart ends it.
    pub fn set_draining(&self, selector: &str, draining: bool) -> Result<AccountView, FleetError> {
        let (id, view) = self.update_entry(selector, |e, now_ms| {
            e.draining = draining;
            Self::view(e, now_ms)
        })?;
        tracing::info!(account = %id, draining, "account {}", if draining { "draining" } else { "no longer draining" });
        Ok(view)
    }

    /// Changes one account in memory (under the pool lock) and returns its id and what `f`
    /// returned; the caller persists.
    pub(crate) fn update_entry<T>(
        &self,
        selector: &str,
        f: impl FnOnce(&mut Entry, u64) -> T,
    ) -> Result<(String, T), FleetError> {
        let id = self.resolve(selector)?;
        let now_ms = self.clock.now_ms();
        let mut inner = self.write();
        let mut e = inner
            .accounts
            .get_mut(&id)
            .ok_or_else(|| FleetError::NotFound(selector.to_string()))?;
        let out = f(&mut e, now_ms);
        drop(e);
        drop(inner);
        Ok((id, out))
    }

    /// Removes an account with its tokens and health. Takes effect in memory first.
    pub async fn remove(&self, selector: &str) -> Result<AccountView, FleetError> {
        let id = self.resolve(selector)?;
        let now_ms = self.clock.now_ms();
        let entry = self
            .write()
            .accounts
            .remove(&id)
            .ok_or_else(|| FleetError::NotFound(selector.to_string()))?;
        self.affinity.forget_account(&id);
        self.store.delete_account(&id).await?;
        Ok(Self::view(&entry, now_ms))
    }

    /// Clears an account's cooldown, its ladders and its unsupported-model marks (operator
    /// action).
    pub async fn clear_cooldown(&self, selector: &str) -> Result<AccountView, FleetError> {
        let (id, (health, view)) = self.update_entry(selector, |e, now_ms| {
            if e.health.state != State::NeedsReauth {
                e.health.clear();
            }
            e.unsupported.clear();
            (e.health.clone(), Self::view(e, now_ms))
        })?;
        self.store
            .write(vec![Store::health_mutation(&id, &health.to_record())?])
            .await?;
        tracing::info!(account = %id, "cooldown cleared by operator");
        Ok(view)
    }

    /// Number of accounts in each state.
    pub fn count_by_state(&self) -> BTreeMap<AccountState, usize> {
        let now = self.clock.now_ms();
        let mut m = BTreeMap::new();
        for e in self.read().accounts.values() {
            *m.entry(Self::state_of(e, now)).or_insert(0) += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::secrets::Secret;

    fn login(refresh: &str, exp: u64) -> AccountSecrets {
        AccountSecrets {
            access_token: Secret::new(format!("at-{refresh}")),
            refresh_token: Secret::new(refresh),
            id_token: Secret::new("id"),
            access_expires_at: Some(exp),
            refreshed_at: exp - 3600,
            replaced: Vec::new(),
        }
    }

    #[test]
    fn a_login_is_kept_against_itself_its_spent_tokens_and_an_older_file() {
        let imported = login("rt-1", 10_000);
        // The import's ownership refresh spends rt-1, and a later refresh rt-2.
        let holds = imported
            .succeeded_by(login("rt-2", 20_000), 15_000)
            .succeeded_by(login("rt-3", 30_000), 25_000);
        assert_eq!(holds.replaced_at("rt-1"), Some(15_000));
        assert_eq!(holds.replaced_at("rt-2"), Some(25_000));
        assert_eq!(holds.replaced_at("rt-3"), None);
        // The file of the first import, again: its tokens were replaced, alive or not.
        for alive in [true, false] {
            let why = stale_login(&holds, &imported, alive).unwrap();
            assert!(
                why.contains(
                    "already imported; this file's tokens were replaced on 1970-01-01T04:10:00Z"
                ),
                "{why}"
            );
        }
        // The very login the account holds.
        let same = stale_login(&holds, &login("rt-3", 30_000), true).unwrap();
        assert!(same.contains("holds this very login"), "{same}");
        // Another login that expires before the account's: older while the account's works,
        // worth a try when it does not.
        let older = login("rt-other", 29_000);
        assert!(
            stale_login(&holds, &older, true)
                .unwrap()
                .contains("older than the account's")
        );
        assert_eq!(stale_login(&holds, &older, false), None);
        // A newer login replaces it.
        assert_eq!(stale_login(&holds, &login("rt-new", 40_000), true), None);
    }

    #[test]
    fn an_account_remembers_its_last_replaced_logins_only() {
        let mut holds = login("rt-0", 1_000_000);
        for n in 1..=20u64 {
            holds = holds.succeeded_by(login(&format!("rt-{n}"), 1_000_000 + n), n);
        }
        let kept = crate::store::records::REPLACED_KEPT as u64;
        assert_eq!(holds.replaced.len() as u64, kept);
        assert_eq!(holds.replaced_at("rt-19"), Some(20));
        assert_eq!(
            holds.replaced_at(&format!("rt-{}", 20 - kept)),
            Some(21 - kept)
        );
        assert_eq!(holds.replaced_at(&format!("rt-{}", 19 - kept)), None);
        // A login brought back is not its own replaced one.
        let back = holds.succeeded_by(login("rt-5", 2_000_000), 30);
        assert_eq!(back.replaced_at("rt-5"), None);
        assert_eq!(back.replaced_at("rt-20"), Some(30));
    }
}
