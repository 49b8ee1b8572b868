//! Client keys: `sk-sy-` + 32 random base62 characters, shown once at creation and stored only
//! as SHA-256. Authentication is a lookup of the presented key's hash in memory.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use sha2::{Digest, Sha256};

use crate::clock::SharedClock;
use crate::store::records::ClientKeyRecord;
use crate::store::{Store, StoreError};

pub const KEY_PREFIX: &str = "sk-sy-";
const KEY_RANDOM_LEN: usize = 32;
const SHOWN_PREFIX_LEN: usize = KEY_PREFIX.len() + 4;
const MAX_NAME_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no key with id `{0}`")]
    NotFound(String),
    #[error("invalid key name: {0}")]
    BadName(String),
    #[error("an active key named `{0}` already exists")]
    Duplicate(String),
    #[error("no randomness available: {0}")]
    Random(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A new key: its record, and the key itself, known only now (no `Debug`: it is a secret).
#[derive(Clone)]
pub struct CreatedKey {
    pub info: ClientKeyRecord,
    pub key: String,
}

/// Who a request authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyIdentity {
    pub id: String,
    pub name: String,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, ClientKeyRecord>,
    by_hash: HashMap<[u8; 32], String>,
}

/// The client keys. Cloning shares them.
#[derive(Clone)]
pub struct KeyRing {
    inner: Arc<RwLock<Inner>>,
    store: Store,
    clock: SharedClock,
}

fn sha256(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// `n` random characters from `[0-9A-Za-z]`, without modulo bias.
pub fn random_base62(n: usize) -> Result<String, KeyError> {
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(n);
    let mut buf = [0u8; 64];
    while out.len() < n {
        getrandom::fill(&mut buf).map_err(|e| KeyError::Random(e.to_string()))?;
        for b in buf {
            // 248 = 4 * 62: values at or above it would favour the first characters.
            if b < 248 && out.len() < n {
                out.push(char::from(ALPHABET[usize::from(b % 62)]));
            }
        }
    }
    Ok(out)
}

impl KeyRing {
    pub fn load(store: Store, clock: SharedClock) -> Result<KeyRing, StoreError> {
        let mut inner = Inner::default();
        for k in store.load_keys()? {
            if k.enabled {
                inner.by_hash.insert(k.sha256, k.id.clone());
            }
            inner.by_id.insert(k.id.clone(), k);
        }
        Ok(KeyRing {
            inner: Arc::new(RwLock::new(inner)),
            store,
            clock,
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every key, oldest first.
    pub fn list(&self) -> Vec<ClientKeyRecord> {
        let inner = self.read();
        let mut v: Vec<ClientKeyRecord> = inner.by_id.values().cloned().collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// Creates a key; the returned value carries the key itself, the only time it is known.
    pub async fn create(&self, name: &str) -> Result<CreatedKey, KeyError> {
        let name = name.trim();
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return Err(KeyError::BadName(format!(
                "`{name}` (use 1 to {MAX_NAME_LEN} printable characters)"
            )));
        }
        if self
            .read()
            .by_id
            .values()
            .any(|k| k.enabled && k.name == name)
        {
            return Err(KeyError::Duplicate(name.to_string()));
        }
        let secret = format!("{KEY_PREFIX}{}", random_base62(KEY_RANDOM_LEN)?);
        let record = ClientKeyRecord {
            id: format!("key_{}", random_base62(8)?.to_lowercase()),
            name: name.to_string(),
            prefix: secret[..SHOWN_PREFIX_LEN].to_string(),
            sha256: sha256(&secret),
            enabled: true,
            created_at: self.clock.now_secs(),
            revoked_at: None,
        };
        self.store.put_key(&record).await?;
        let mut inner = self.write();
        inner.by_hash.insert(record.sha256, record.id.clone());
        inner.by_id.insert(record.id.clone(), record.clone());
        Ok(CreatedKey {
            info: record,
            key: secret,
        })
    }

    /// Revokes a key: it stops authenticating at once and stays listed as revoked. Revoking a
    /// revoked key changes nothing.
    pub async fn revoke(&self, id: &str) -> Result<ClientKeyRecord, KeyError> {
        let record = {
            let mut inner = self.write();
            let k = inner
                .by_id
                .get_mut(id)
                .ok_or_else(|| KeyError::NotFound(id.to_string()))?;
            if !k.enabled {
                return Ok(k.clone());
            }
            k.enabled = false;
            k.revoked_at = Some(self.clock.now_secs());
            let record = k.clone();
            inner.by_hash.remove(&record.sha256);
            record
        };
        self.store.put_key(&record).await?;
        Ok(record)
    }

    /// The key a presented secret belongs to, if it is known and active.
    pub fn authenticate(&self, presented: &str) -> Option<KeyIdentity> {
        let inner = self.read();
        let id = inner.by_hash.get(&sha256(presented))?;
        let k = inner.by_id.get(id)?;
        Some(KeyIdentity {
            id: k.id.clone(),
            name: k.name.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn ring() -> KeyRing {
        KeyRing::load(
            Store::open_in_memory().unwrap(),
            Arc::new(ManualClock::new(5_000)),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn created_keys_authenticate_until_revoked_and_are_stored_hashed() {
        let r = ring();
        let created = r.create("laptop").await.unwrap();
        assert!(created.key.starts_with(KEY_PREFIX));
        assert_eq!(created.key.len(), KEY_PREFIX.len() + KEY_RANDOM_LEN);
        assert!(created.key.starts_with(&created.info.prefix));
        assert_eq!(r.authenticate(&created.key).unwrap().name, "laptop");
        assert!(r.authenticate("sk-sy-wrong").is_none());
        let stored = r.store.load_keys().unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].sha256, sha256(&created.key));

        let revoked = r.revoke(&created.info.id).await.unwrap();
        assert!(!revoked.enabled && revoked.revoked_at.is_some());
        assert!(r.authenticate(&created.key).is_none());
        // Reloading keeps it revoked.
        let again = KeyRing::load(r.store.clone(), Arc::new(ManualClock::new(0))).unwrap();
        assert!(again.authenticate(&created.key).is_none());
        assert_eq!(again.list().len(), 1);
    }

    #[tokio::test]
    async fn bad_names_duplicates_and_unknown_ids_are_refused() {
        let r = ring();
        assert!(matches!(r.create("  ").await, Err(KeyError::BadName(_))));
        assert!(matches!(r.create("a\nb").await, Err(KeyError::BadName(_))));
        r.create("ci").await.unwrap();
        assert!(matches!(r.create("ci").await, Err(KeyError::Duplicate(_))));
        assert!(matches!(
            r.revoke("key_nope").await,
            Err(KeyError::NotFound(_))
        ));
    }

    #[test]
    fn base62_is_the_requested_length_and_alphabet() {
        let s = random_base62(500).unwrap();
        assert_eq!(s.len(), 500);
        assert!(s.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
