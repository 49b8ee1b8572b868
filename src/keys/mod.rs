//! Client keys: `sk-sy-` + 32 random base62 characters, shown once at creation and stored only
//! as SHA-256. Authentication is a lookup of the presented key's hash in memory. Each key has a
//! policy (`policy.rs`) applied before scheduling by [`KeyRing::admit`], with the key's live
//! state (`gate.rs`).

pub mod gate;
pub mod memory;
pub mod policy;
pub mod usage;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use self::gate::KeyPermit;
use self::gate::{Gates, KeyNow, NoSlot};
use self::policy::{Policy, PolicyPatch, Refusal};
use self::usage::UsageBook;
use crate::base::clock::SharedClock;
use crate::store::records::ClientKeyRecord;
use crate::store::{Store, StoreError};

pub const KEY_PREFIX: &str = "sk-sy-";
const KEY_RANDOM_LEN: usize = 32;
const SHOWN_PREFIX_LEN: usize = KEY_PREFIX.len() + 4;
const MAX_NAME_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no key with id or name `{0}`")]
    NotFound(String),
    #[error("`{name}` names more than one key ({}); use an id", ids.join(", "))]
    Ambiguous { name: String, ids: Vec<String> },
    #[error("invalid key name: {0}")]
    BadName(String),
    #[error("an active key named `{0}` already exists")]
    Duplicate(String),
    #[error("invalid policy: {0}")]
    BadPolicy(String),
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
    /// Shared with the key's entry: a request takes it without a copy.
    pub id: Arc<str>,
    pub name: Arc<str>,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    Refused(Refusal),
    /// The client left (or shutdown cut the request) while it waited for a slot.
    Gone,
}

struct Entry {
    record: ClientKeyRecord,
    policy: Arc<Policy>,
    /// The record's id and name, as every request that authenticates with it takes them.
    identity: KeyIdentity,
}

impl Entry {
    fn new(record: ClientKeyRecord, policy: Arc<Policy>) -> Entry {
        Entry {
            identity: KeyIdentity {
                id: Arc::from(record.id.as_str()),
                name: Arc::from(record.name.as_str()),
            },
            record,
            policy,
        }
    }
}

/// The hasher of the keys' maps, looked up several times per request: foldhash, seeded per
/// process, instead of SipHash.
pub(crate) type Hasher = hashbrown::DefaultHashBuilder;

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Entry, Hasher>,
    by_hash: HashMap<[u8; 32], String, Hasher>,
    /// Secrets that have authenticated, to their key's id, so that a key seen before is found
    /// without hashing its secret again. Only a secret whose hash matched an active key gets
    /// in (so at most one per active key), and it leaves when its key is revoked.
    seen: HashMap<Box<str>, String, Hasher>,
}

impl Inner {
    fn identity(&self, id: &str) -> Option<KeyIdentity> {
        Some(self.by_id.get(id)?.identity.clone())
    }
}

/// The client keys. Cloning shares them.
#[derive(Clone)]
pub struct KeyRing {
    inner: Arc<RwLock<Inner>>,
    store: Store,
    clock: SharedClock,
    gates: Gates,
    /// Held from a new key's name check to its insertion: of concurrent creates under one
    /// name exactly one wins.
    naming: Arc<tokio::sync::Mutex<()>>,
}

/// What the key's policy says of what a request's body asks for: its model, then its service
/// tier.
fn body_refusal(policy: &Policy, model: &str, tier: Option<&str>) -> Option<Refusal> {
    if !policy.allows_model(model) {
        return Some(Refusal::ModelNotAllowed {
            model: model.to_string(),
            allowed: policy.models.clone(),
        });
    }
    if !policy.allows_tier(tier) {
        return Some(Refusal::TierNotAllowed {
            tier: tier.unwrap_or(policy::DEFAULT_TIER).to_string(),
            allowed: policy.tiers.clone(),
        });
    }
    None
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
            let policy = Arc::new(Policy::from_row(&k.policy));
            inner.by_id.insert(k.id.clone(), Entry::new(k, policy));
        }
        Ok(KeyRing {
            inner: Arc::new(RwLock::new(inner)),
            store,
            clock,
            gates: Gates::default(),
            naming: Arc::default(),
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
        let mut v: Vec<ClientKeyRecord> = inner.by_id.values().map(|e| e.record.clone()).collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// Key id -> name, for every key.
    pub fn names(&self) -> HashMap<String, String> {
        self.read()
            .by_id
            .iter()
            .map(|(id, e)| (id.clone(), e.record.name.clone()))
            .collect()
    }

    /// The key an id or a name stands for. A name is the active key's that bears it (names
    /// are unique among active keys; a revoked key keeps its name in history only); with no
    /// active one, the one revoked key of that name, and several are an error that lists
    /// their ids.
    pub fn resolve(&self, id_or_name: &str) -> Result<ClientKeyRecord, KeyError> {
        let inner = self.read();
        if let Some(e) = inner.by_id.get(id_or_name) {
            return Ok(e.record.clone());
        }
        let mut named: Vec<&ClientKeyRecord> = inner
            .by_id
            .values()
            .map(|e| &e.record)
            .filter(|r| r.name == id_or_name)
            .collect();
        named.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        let active: Vec<&ClientKeyRecord> = named.iter().copied().filter(|r| r.enabled).collect();
        match (active.as_slice(), named.as_slice()) {
            ([one], _) | ([], [one]) => Ok((*one).clone()),
            (_, []) => Err(KeyError::NotFound(id_or_name.to_string())),
            (_, many) => Err(KeyError::Ambiguous {
                name: id_or_name.to_string(),
                ids: many.iter().map(|r| r.id.clone()).collect(),
            }),
        }
    }

    /// The policy of a key.
    pub fn policy(&self, id: &str) -> Option<Arc<Policy>> {
        self.read().by_id.get(id).map(|e| Arc::clone(&e.policy))
    }

    /// Creates a key with a policy; the returned value carries the key itself, the only time
    /// it is known.
    pub async fn create(&self, name: &str, policy: &PolicyPatch) -> Result<CreatedKey, KeyError> {
        let name = name.trim();
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return Err(KeyError::BadName(format!(
                "`{name}` (use 1 to {MAX_NAME_LEN} printable characters)"
            )));
        }
        if name.starts_with("key_") {
            return Err(KeyError::BadName(format!(
                "`{name}` (names starting with `key_` would read as ids)"
            )));
        }
        let policy = Policy::default()
            .patched(policy)
            .map_err(KeyError::BadPolicy)?;
        let now = self.clock.now_secs();
        if let Some(at) = policy.expires_at.filter(|at| *at <= now) {
            return Err(KeyError::BadPolicy(format!(
                "it would expire at {}, which has passed: a key must expire in the future",
                crate::base::clock::rfc3339(at)
            )));
        }
        // The name is checked and the key inserted under one lock: a concurrent create of the
        // same name waits and then finds it taken.
        let _naming = self.naming.lock().await;
        if self
            .read()
            .by_id
            .values()
            .any(|e| e.record.enabled && e.record.name == name)
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
            created_at: now,
            revoked_at: None,
            policy: policy.to_row(),
        };
        self.store.put_key(&record).await?;
        let mut inner = self.write();
        inner.by_hash.insert(record.sha256, record.id.clone());
        inner.by_id.insert(
            record.id.clone(),
            Entry::new(record.clone(), Arc::new(policy)),
        );
        Ok(CreatedKey {
            info: record,
            key: secret,
        })
    }

    /// Changes a key's policy; it applies to the next request (running ones finish).
    pub async fn update(
        &self,
        id_or_name: &str,
        patch: &PolicyPatch,
    ) -> Result<ClientKeyRecord, KeyError> {
        let id = self.resolve(id_or_name)?.id;
        // Checked and stored under no lock; the in-memory change is made from what was stored.
        let (record, policy) = {
            let inner = self.read();
            let e = inner
                .by_id
                .get(&id)
                .ok_or_else(|| KeyError::NotFound(id.clone()))?;
            let policy = e.policy.patched(patch).map_err(KeyError::BadPolicy)?;
            let mut record = e.record.clone();
            record.policy = policy.to_row();
            (record, policy)
        };
        self.store.put_key(&record).await?;
        let limit = policy.max_concurrency;
        {
            let mut inner = self.write();
            inner
                .by_id
                .insert(id.clone(), Entry::new(record.clone(), Arc::new(policy)));
        }
        self.gates.set_limit(&id, limit);
        Ok(record)
    }

    /// Revokes a key: it stops authenticating at once and stays listed as revoked. Revoking a
    /// revoked key changes nothing.
    pub async fn revoke(&self, id_or_name: &str) -> Result<ClientKeyRecord, KeyError> {
        let id = self.resolve(id_or_name)?.id;
        let record = {
            let mut inner = self.write();
            let e = inner
                .by_id
                .get_mut(&id)
                .ok_or_else(|| KeyError::NotFound(id.clone()))?;
            if !e.record.enabled {
                return Ok(e.record.clone());
            }
            e.record.enabled = false;
            e.record.revoked_at = Some(self.clock.now_secs());
            let record = e.record.clone();
            inner.by_hash.remove(&record.sha256);
            inner.seen.retain(|_, id| *id != record.id);
            record
        };
        self.store.put_key(&record).await?;
        Ok(record)
    }

    /// The key a presented secret belongs to, if it is known and active (an expired key
    /// authenticates: its requests are refused as expired, which says why).
    pub fn authenticate(&self, presented: &str) -> Option<KeyIdentity> {
        // A secret of no active key is judged under the read lock alone.
        let digest = {
            let inner = self.read();
            if let Some(id) = inner.seen.get(presented) {
                return inner.identity(id);
            }
            let digest = sha256(presented);
            if !inner.by_hash.contains_key(&digest) {
                return None;
            }
            digest
        };
        let mut inner = self.write();
        // Checked again under the write lock: the key may have been revoked meanwhile.
        let id = inner.by_hash.get(&digest)?.clone();
        let identity = inner.identity(&id)?;
        inner.seen.insert(presented.into(), id);
        Some(identity)
    }

    /// When the key expired, if it has.
    pub fn expired(&self, id: &str) -> Option<u64> {
        let at = self.policy(id)?.expires_at?;
        (self.clock.now_secs() >= at).then_some(at)
    }

    /// Applies the key's policy to one request for `model`, before any account is looked at:
    /// expiry, models, token budgets, rate, then a slot among the key's concurrent requests
    /// (waiting in the key's own queue at most `wait`). The permit is held for the request's
    /// life. A refusal is counted for the console and the metrics.
    pub async fn admit(
        &self,
        (key_id, model, tier, input_bytes): (&str, &str, Option<&str>, u64),
        usage: &UsageBook,
        wait: Duration,
        max_waiting: usize,
        gone: impl Future<Output = ()>,
    ) -> Result<KeyPermit, Denied> {
        self.admit_for(
            (key_id, Some((model, tier)), input_bytes),
            usage,
            wait,
            max_waiting,
            gone,
        )
        .await
    }

    /// [`KeyRing::admit`] for a request whose model is not known yet: everything its head
    /// can be judged on (revoked, expired, budgets, rate, a slot), before its body is read.
    /// The model is checked once the body is ([`KeyRing::allow_model`]).
    pub async fn admit_head(
        &self,
        (key_id, input_bytes): (&str, u64),
        usage: &UsageBook,
        wait: Duration,
        max_waiting: usize,
        gone: impl Future<Output = ()>,
    ) -> Result<KeyPermit, Denied> {
        self.admit_for((key_id, None, input_bytes), usage, wait, max_waiting, gone)
            .await
    }

    /// The model and service tier check of a request admitted from its head. A refused one
    /// is not counted against the key's rate, as it would not have been had its body been
    /// known first.
    pub fn allow_model(
        &self,
        permit: &KeyPermit,
        model: &str,
        tier: Option<&str>,
    ) -> Result<(), Refusal> {
        let key_id = permit.key_id();
        let Some(policy) = self.active_policy(key_id) else {
            return Err(Refusal::Revoked);
        };
        let Some(refusal) = body_refusal(&policy, model, tier) else {
            return Ok(());
        };
        if let Some(at) = permit.counted_at_ms {
            self.gates.uncount(key_id, at);
        }
        self.gates
            .note_refusal(key_id, refusal.code(), self.clock.now_ms());
        Err(refusal)
    }

    /// `input_bytes`: the request body's size (as its head announces it, before it is read),
    /// for the estimate its key's token budgets reserve while it runs.
    async fn admit_for(
        &self,
        (key_id, asked, input_bytes): (&str, Option<(&str, Option<&str>)>, u64),
        usage: &UsageBook,
        wait: Duration,
        max_waiting: usize,
        gone: impl Future<Output = ()>,
    ) -> Result<KeyPermit, Denied> {
        let now_ms = self.clock.now_ms();
        let refused = |r: Refusal| {
            self.gates.note_refusal(key_id, r.code(), now_ms);
            Err(Denied::Refused(r))
        };
        let Some(policy) = self.active_policy(key_id) else {
            return refused(Refusal::Revoked);
        };
        if let Some(at) = policy.expires_at.filter(|at| now_ms / 1000 >= *at) {
            return refused(Refusal::Expired { at });
        }
        if let Some(r) = asked.and_then(|(model, tier)| body_refusal(&policy, model, tier)) {
            return refused(r);
        }
        // Requests in flight count at their estimate until they end: a burst on one budget
        // is refused once what was used and what is reserved reach the limit.
        let budgets: Vec<_> = policy.budgets().collect();
        let reservation = if budgets.is_empty() {
            None
        } else {
            match usage.reserve(key_id, &budgets, input_bytes) {
                Ok(r) => Some(r),
                Err(b) => {
                    return refused(Refusal::BudgetExhausted {
                        window: b.window,
                        limit: b.limit,
                        used: b.used,
                        reserved: b.reserved,
                        // Over by what is in flight only: retry when a request ends.
                        resets_in_s: b.resets_in_s.filter(|_| b.exhausted).unwrap_or(1),
                    });
                }
            }
        };
        if let Err(retry_after_s) = self.gates.admit_rate(key_id, policy.rpm, now_ms) {
            return refused(Refusal::RateLimited {
                rpm: policy.rpm.unwrap_or_default(),
                retry_after_s,
            });
        }
        match self
            .gates
            .acquire(key_id, policy.max_concurrency, wait, max_waiting, gone)
            .await
        {
            Ok(mut p) => {
                p.counted_at_ms = Some(now_ms);
                p.reservation = reservation;
                Ok(p)
            }
            Err(NoSlot::Gone) => Err(Denied::Gone),
            Err(NoSlot::Timeout(waited)) => {
                self.gates
                    .note_refusal(key_id, "key_concurrency_exceeded", self.clock.now_ms());
                Err(Denied::Refused(Refusal::ConcurrencyExceeded {
                    limit: policy.max_concurrency.unwrap_or_default(),
                    waited_ms: crate::base::duration::whole_ms(waited),
                }))
            }
        }
    }

    fn active_policy(&self, id: &str) -> Option<Arc<Policy>> {
        let inner = self.read();
        inner
            .by_id
            .get(id)
            .filter(|e| e.record.enabled)
            .map(|e| Arc::clone(&e.policy))
    }

    /// What a key is doing now.
    pub fn now(&self, id: &str) -> KeyNow {
        self.gates.now(id, self.clock.now_ms())
    }

    /// The active keys with their policies, oldest first.
    pub fn active(&self) -> Vec<(ClientKeyRecord, Arc<Policy>)> {
        let inner = self.read();
        let mut v: Vec<(ClientKeyRecord, Arc<Policy>)> = inner
            .by_id
            .values()
            .filter(|e| e.record.enabled)
            .map(|e| (e.record.clone(), Arc::clone(&e.policy)))
            .collect();
        v.sort_by(|a, b| {
            a.0.created_at
                .cmp(&b.0.created_at)
                .then(a.0.id.cmp(&b.0.id))
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::ManualClock;

    fn none() -> PolicyPatch {
        PolicyPatch::default()
    }

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
        let created = r.create("laptop", &none()).await.unwrap();
        assert!(created.key.starts_with(KEY_PREFIX));
        assert_eq!(created.key.len(), KEY_PREFIX.len() + KEY_RANDOM_LEN);
        assert!(created.key.starts_with(&created.info.prefix));
        assert_eq!(r.authenticate(&created.key).unwrap().name, "laptop".into());
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
    async fn only_secrets_that_matched_an_active_key_are_remembered_until_it_is_revoked() {
        let r = ring();
        let a = r.create("a", &none()).await.unwrap();
        let b = r.create("b", &none()).await.unwrap();
        let seen = |r: &KeyRing| r.read().seen.len();
        for _ in 0..3 {
            assert!(r.authenticate("sk-sy-wrong").is_none());
            assert!(r.authenticate(&a.key[..a.key.len() - 1]).is_none());
        }
        assert_eq!(seen(&r), 0, "a wrong secret is never remembered");
        for _ in 0..3 {
            assert_eq!(
                r.authenticate(&a.key).unwrap().id,
                a.info.id.as_str().into()
            );
            assert_eq!(r.authenticate(&b.key).unwrap().name, "b".into());
        }
        assert_eq!(seen(&r), 2, "one entry per key, however often it is used");
        r.revoke("a").await.unwrap();
        assert_eq!(seen(&r), 1);
        assert!(r.authenticate(&a.key).is_none());
        assert_eq!(
            r.authenticate(&b.key).unwrap().id,
            b.info.id.as_str().into()
        );
    }

    #[tokio::test]
    async fn bad_names_duplicates_and_unknown_ids_are_refused() {
        let r = ring();
        assert!(matches!(
            r.create("  ", &none()).await,
            Err(KeyError::BadName(_))
        ));
        assert!(matches!(
            r.create("a\nb", &none()).await,
            Err(KeyError::BadName(_))
        ));
        r.create("ci", &none()).await.unwrap();
        assert!(matches!(
            r.create("ci", &none()).await,
            Err(KeyError::Duplicate(_))
        ));
        assert!(matches!(
            r.revoke("key_nope").await,
            Err(KeyError::NotFound(_))
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_concurrent_creates_under_one_name_exactly_one_wins() {
        let r = ring();
        let tries: Vec<_> = (0..8)
            .map(|_| {
                let r = r.clone();
                tokio::spawn(async move { r.create("twin", &none()).await })
            })
            .collect();
        let mut won = 0;
        for t in tries {
            match t.await.unwrap() {
                Ok(_) => won += 1,
                Err(KeyError::Duplicate(name)) => assert_eq!(name, "twin"),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(won, 1);
        assert_eq!(r.list().iter().filter(|k| k.name == "twin").count(), 1);
    }

    #[tokio::test]
    async fn after_a_rotation_a_name_is_the_active_key() {
        let r = ring();
        let old = r.create("ci", &none()).await.unwrap().info;
        r.revoke("ci").await.unwrap();
        // Alone, a revoked key is still found by its name (its history).
        assert_eq!(r.resolve("ci").unwrap().id, old.id);
        let new = r.create("ci", &none()).await.unwrap().info;
        assert_eq!(r.resolve("ci").unwrap().id, new.id);
        let patch = PolicyPatch {
            rpm: Some(Some(3)),
            ..PolicyPatch::default()
        };
        assert_eq!(r.update("ci", &patch).await.unwrap().id, new.id);
        // Revoked again, and rotated again: two revoked and one active.
        r.revoke("ci").await.unwrap();
        let newest = r.create("ci", &none()).await.unwrap().info;
        assert_eq!(r.resolve("ci").unwrap().id, newest.id);
        // With none active, two revoked keys of one name are named by their ids.
        r.revoke("ci").await.unwrap();
        match r.resolve("ci") {
            Err(KeyError::Ambiguous { ids, .. }) => assert_eq!(ids.len(), 3),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.resolve(&new.id).unwrap().id, new.id);
    }

    #[tokio::test]
    async fn a_key_that_would_be_born_expired_is_refused() {
        let r = ring();
        let past = PolicyPatch {
            expires_at: Some(Some("1970-01-01T00:00:01Z".into())),
            ..PolicyPatch::default()
        };
        match r.create("late", &past).await {
            Err(KeyError::BadPolicy(why)) => {
                assert!(
                    why.contains("1970-01-01T00:00:01Z") && why.contains("passed"),
                    "{why}"
                )
            }
            other => panic!("{:?}", other.map(|k| k.info)),
        }
        assert!(r.list().is_empty());
        let future = PolicyPatch {
            expires_at: Some(Some("2999-01-01T00:00:00Z".into())),
            ..PolicyPatch::default()
        };
        r.create("later", &future).await.unwrap();
    }

    fn answer(output: u64) -> usage::Counters {
        usage::Counters {
            requests: 1,
            input_tokens: 10,
            output_tokens: output,
            ..usage::Counters::default()
        }
    }

    /// Six requests at once on a budget one answer (120 tokens) nearly fills: each in flight
    /// holds an estimate until it ends, so the burst cannot spend six answers. At most one is
    /// admitted beyond the budget.
    #[tokio::test]
    async fn a_burst_on_one_budget_is_admitted_against_used_and_reserved_tokens() {
        let clock = Arc::new(ManualClock::new(1_800_000_000_000));
        let store = Store::open_in_memory().unwrap();
        let r = KeyRing::load(store.clone(), clock.clone()).unwrap();
        let book = UsageBook::load(store, clock.clone()).unwrap();
        let patch = PolicyPatch {
            tokens_per_5h: Some(Some(130)),
            ..PolicyPatch::default()
        };
        let k = r.create("bot", &patch).await.unwrap().info;
        let admit = || {
            r.admit(
                (&k.id, "gpt-5.5", None, 40),
                &book,
                Duration::ZERO,
                0,
                std::future::pending(),
            )
        };
        // No answers yet: the first holds a whole answer's default estimate; the rest wait for it.
        let first = admit().await.unwrap();
        for _ in 0..5 {
            match admit().await {
                Err(Denied::Refused(r @ Refusal::BudgetExhausted { used: 0, .. })) => {
                    assert_eq!(r.retry_after_s(), Some(1));
                    assert!(
                        r.message().contains("in flight hold 1034 more"),
                        "{}",
                        r.message()
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        // It ends with its real usage: the estimate is given back, the usage counts.
        book.add(1_800_000_000_000, (&k.id, "gpt-5.5", None), answer(110));
        drop(first);
        assert_eq!(
            book.budget(&k.id, policy::Window::FiveHours, 130).reserved,
            0
        );
        // 120 of 130 used: one more is admitted, and that one is the most the key overshoots.
        // Its estimate follows the key's answers now (110 out, 10 in).
        let second = admit().await.unwrap();
        assert_eq!(book.estimate(&k.id, 40), 120);
        assert!(matches!(
            admit().await,
            Err(Denied::Refused(Refusal::BudgetExhausted {
                used: 120,
                reserved: 120,
                ..
            }))
        ));
        book.add(1_800_000_000_000, (&k.id, "gpt-5.5", None), answer(110));
        drop(second);
        match admit().await {
            Err(Denied::Refused(
                r @ Refusal::BudgetExhausted {
                    used: 240,
                    reserved: 0,
                    ..
                },
            )) => {
                assert!(
                    r.message()
                        .contains("used 240 of its 130 tokens per 5 hours"),
                    "{}",
                    r.message()
                );
            }
            other => panic!("{other:?}"),
        }
        // A key without budgets reserves nothing.
        let free = r
            .create("free", &PolicyPatch::default())
            .await
            .unwrap()
            .info;
        let p = r
            .admit(
                (&free.id, "gpt-5.5", None, 40),
                &book,
                Duration::ZERO,
                0,
                std::future::pending(),
            )
            .await
            .unwrap();
        assert!(p.reservation.is_none());
    }

    #[test]
    fn base62_is_the_requested_length_and_alphabet() {
        let s = random_base62(500).unwrap();
        assert_eq!(s.len(), 500);
        assert!(s.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
