//! The account pool: which accounts exist, whether they are enabled, and (in later modules)
//! their health, scheduling, affinity and slots. One owner with a small API; callers never
//! hold its lock.
//!
//! Changes are persisted through the store's writer and acknowledged only once durable:
//! imports write before they appear in memory (a failed write leaves no ghost account);
//! disabling takes effect in memory first, so no request can lease the account while the write
//! is in flight.

pub mod auth_file;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use sha2::{Digest, Sha256};
use switchyard_tui::wire;

use crate::clock::{self, SharedClock};
use crate::store::records::AccountRecord;
use crate::store::{Store, StoreError};

use self::auth_file::{AuthFileError, ParsedAuth};

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
}

/// The pool of accounts. Cloning shares it.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<RwLock<BTreeMap<String, AccountRecord>>>,
    store: Store,
    clock: SharedClock,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("accounts", &self.read().len())
            .finish()
    }
}

/// The id of an account: stable across re-imports, derived from its ChatGPT identity.
pub fn account_id(chatgpt_account_id: &str, user: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(chatgpt_account_id.as_bytes());
    h.update(b"/");
    h.update(user.unwrap_or("").as_bytes());
    let digest = h.finalize();
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

impl Fleet {
    pub fn load(store: Store, clock: SharedClock) -> Result<Fleet, StoreError> {
        let accounts = store
            .load_accounts()?
            .into_iter()
            .map(|a| (a.id.clone(), a))
            .collect();
        Ok(Fleet {
            inner: Arc::new(RwLock::new(accounts)),
            store,
            clock,
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, AccountRecord>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, AccountRecord>> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn view(a: &AccountRecord) -> wire::Account {
        wire::Account {
            id: a.id.clone(),
            label: a.label.clone(),
            email: a.email.clone(),
            plan: a.plan.clone(),
            chatgpt_account_id: a.chatgpt_account_id.clone(),
            enabled: a.enabled,
            state: if a.enabled { "ready" } else { "disabled" }.to_string(),
            created_at: clock::rfc3339(a.created_at),
        }
    }

    /// Every account, oldest first.
    pub fn list(&self) -> Vec<wire::Account> {
        let accounts = self.read();
        let mut v: Vec<&AccountRecord> = accounts.values().collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v.into_iter().map(Self::view).collect()
    }

    /// Finds one account by id, ChatGPT account id, email or label.
    pub fn resolve(&self, selector: &str) -> Result<String, FleetError> {
        let accounts = self.read();
        if accounts.contains_key(selector) {
            return Ok(selector.to_string());
        }
        let matches: Vec<&String> = accounts
            .values()
            .filter(|a| {
                a.chatgpt_account_id == selector
                    || a.email.as_deref() == Some(selector)
                    || a.label == selector
            })
            .map(|a| &a.id)
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

    /// Adds the account of an auth.json, or updates the tokens (and claims) of the account it
    /// already is. Returns once durable.
    pub async fn import(&self, parsed: ParsedAuth) -> Result<wire::ImportedAccount, FleetError> {
        let id = account_id(
            &parsed.chatgpt_account_id,
            parsed.chatgpt_user_id.as_deref(),
        );
        let now = self.clock.now_secs();
        let existing = self.read().get(&id).cloned();
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
        self.store
            .put_account(&record, Some(&parsed.secrets))
            .await?;
        let view = Self::view(&record);
        self.write().insert(id, record);
        Ok(wire::ImportedAccount {
            account: view,
            created,
        })
    }

    pub async fn set_enabled(
        &self,
        selector: &str,
        enabled: bool,
    ) -> Result<wire::Account, FleetError> {
        let id = self.resolve(selector)?;
        let record = {
            let mut accounts = self.write();
            let a = accounts
                .get_mut(&id)
                .ok_or_else(|| FleetError::NotFound(selector.to_string()))?;
            a.enabled = enabled;
            a.updated_at = self.clock.now_secs();
            a.clone()
        };
        self.store.put_account(&record, None).await?;
        Ok(Self::view(&record))
    }

    /// Removes an account with its tokens and health. Takes effect in memory first.
    pub async fn remove(&self, selector: &str) -> Result<wire::Account, FleetError> {
        let id = self.resolve(selector)?;
        let record = self
            .write()
            .remove(&id)
            .ok_or_else(|| FleetError::NotFound(selector.to_string()))?;
        self.store.delete_account(&id).await?;
        Ok(Self::view(&record))
    }

    /// Number of accounts per state name.
    pub fn count_by_state(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for a in self.list() {
            *m.entry(a.state).or_insert(0) += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
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

    fn fleet() -> Fleet {
        Fleet::load(
            Store::open_in_memory().unwrap(),
            Arc::new(ManualClock::new(1_767_225_600_000)),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn reimport_updates_tokens_instead_of_duplicating() {
        let f = fleet();
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
        let f = fleet();
        let a = f
            .import(
                f.parse_auth(auth_json(&spec(1, "t")).to_string().as_bytes())
                    .unwrap(),
            )
            .await
            .unwrap()
            .account;
        for sel in [a.id.as_str(), "acc-1", "user1@example.com"] {
            assert_eq!(f.resolve(sel).unwrap(), a.id);
        }
        assert!(matches!(f.resolve("nobody"), Err(FleetError::NotFound(_))));
        let d = f.set_enabled("acc-1", false).await.unwrap();
        assert_eq!((d.enabled, d.state.as_str()), (false, "disabled"));
        f.remove(&a.id).await.unwrap();
        assert!(f.is_empty());
        assert!(f.store.load_accounts().unwrap().is_empty());
    }
}
