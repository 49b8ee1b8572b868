//! An in-memory map whose entries expire: the gateway's replacement for Redis.
//!
//! - idle TTL (since the last read or write) and absolute TTL (since insertion), either optional;
//! - a bound on the number of entries, evicting the least recently used one;
//! - expiry is checked on every read, so a stale entry is never returned even between sweeps;
//! - one sweeper task per map ([`TtlMap::spawn_sweeper`]) reclaims memory, not a task per entry;
//! - time comes from a [`Clock`], so tests move time instead of sleeping;
//! - [`TtlMap::snapshot`] / [`TtlMap::restore`] carry the entries (with their ages) across a
//!   restart through the store.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, hash_map};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::base::clock::SharedClock;
use crate::base::job::{self, Ticker};
use crate::store::records::{SnapshotRecord, SnapshotRow};
use crate::store::{Store, StoreError};

/// Limits of one map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlConfig {
    /// An entry not read or written for this long is gone.
    pub idle: Option<Duration>,
    /// An entry older than this (since insertion) is gone, however often it is read.
    pub absolute: Option<Duration>,
    /// At most this many entries; inserting one more evicts the least recently used.
    pub max_entries: usize,
}

/// One entry as carried through a snapshot, in least-recently-used-first order.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotEntry<K, V> {
    pub key: K,
    pub value: V,
    pub created_ms: u64,
    pub touched_ms: u64,
}

/// Counters for the console and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TtlStats {
    pub len: usize,
    pub expired: u64,
    pub evicted: u64,
}

struct Entry<V> {
    value: V,
    created_ms: u64,
    touched_ms: u64,
    /// Position in the LRU order; larger is more recent.
    seq: u64,
}

struct Inner<K, V> {
    config: TtlConfig,
    entries: HashMap<K, Entry<V>>,
    lru: BTreeMap<u64, K>,
    next_seq: u64,
    expired: u64,
    evicted: u64,
}

/// A bounded map with idle/absolute expiry. Cloning shares the same map.
pub struct TtlMap<K, V> {
    inner: Arc<Mutex<Inner<K, V>>>,
    clock: SharedClock,
}

impl<K, V> Clone for TtlMap<K, V> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            clock: Arc::clone(&self.clock),
        }
    }
}

use crate::base::duration::whole_ms as ms;

impl<K, V> TtlMap<K, V>
where
    K: Eq + Hash + Clone,
    V: Clone,
{
    pub fn new(config: TtlConfig, clock: SharedClock) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                config,
                entries: HashMap::new(),
                lru: BTreeMap::new(),
                next_seq: 0,
                expired: 0,
                evicted: 0,
            })),
            clock,
        }
    }

    pub fn config(&self) -> TtlConfig {
        self.lock().config
    }

    /// Changes the limits live (entries are judged by the new ones from now on; a smaller
    /// bound takes effect at the next insert).
    pub fn set_config(&self, config: TtlConfig) {
        self.lock().config = config;
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K, V>> {
        // A panic while holding this lock cannot leave the map half-updated in a way that
        // matters more than losing the whole gateway, so keep serving from it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_expired(config: &TtlConfig, created_ms: u64, touched_ms: u64, now: u64) -> bool {
        let idle = config
            .idle
            .is_some_and(|t| now.saturating_sub(touched_ms) >= ms(t));
        let absolute = config
            .absolute
            .is_some_and(|t| now.saturating_sub(created_ms) >= ms(t));
        idle || absolute
    }

    /// The value for `key` if present and not expired; counts as a use (refreshes idle TTL
    /// and LRU position).
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        let (created, touched, old_seq) = {
            let e = inner.entries.get(key)?;
            (e.created_ms, e.touched_ms, e.seq)
        };
        if Self::is_expired(&inner.config, created, touched, now) {
            inner.remove_entry(key);
            inner.expired += 1;
            return None;
        }
        let seq = inner.bump_seq();
        // The LRU's copy of the key moves to its new place: no copy is made per use.
        let k = inner.lru.remove(&old_seq).unwrap_or_else(|| key.to_owned());
        inner.lru.insert(seq, k);
        let e = inner.entries.get_mut(key)?;
        e.touched_ms = now;
        e.seq = seq;
        Some(e.value.clone())
    }

    /// The value for `key` if present and not expired, without counting as a use.
    pub fn peek<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.clock.now_ms();
        let inner = self.lock();
        let e = inner.entries.get(key)?;
        if Self::is_expired(&inner.config, e.created_ms, e.touched_ms, now) {
            return None;
        }
        Some(e.value.clone())
    }

    /// Inserts or replaces; a replaced entry starts a new life. Returns the previous live value.
    pub fn insert(&self, key: K, value: V) -> Option<V> {
        let now = self.clock.now_ms();
        self.insert_at(key, value, (now, now), now)
    }

    /// Inserts an entry made at `created_ms` and last used at `touched_ms`, as of `now`.
    fn insert_at(
        &self,
        key: K,
        value: V,
        (created_ms, touched_ms): (u64, u64),
        now: u64,
    ) -> Option<V> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let config = inner.config;
        if config.max_entries == 0 {
            return None;
        }
        let seq = inner.bump_seq();
        let fresh = Entry {
            value,
            created_ms,
            touched_ms,
            seq,
        };
        // The key is hashed once: a replaced entry starts its new life in its old place.
        let previous = match inner.entries.entry(key) {
            hash_map::Entry::Occupied(mut o) => {
                let old = std::mem::replace(o.get_mut(), fresh);
                let k = inner
                    .lru
                    .remove(&old.seq)
                    .unwrap_or_else(|| o.key().clone());
                inner.lru.insert(seq, k);
                (!Self::is_expired(&config, old.created_ms, old.touched_ms, now))
                    .then_some(old.value)
            }
            hash_map::Entry::Vacant(v) => {
                inner.lru.insert(seq, v.key().clone());
                v.insert(fresh);
                None
            }
        };
        // The new entry is the most recent: the least recently used go until the bound holds.
        while inner.entries.len() > config.max_entries {
            let Some((_, oldest)) = inner.lru.pop_first() else {
                break;
            };
            inner.entries.remove(&oldest);
            inner.evicted += 1;
        }
        previous
    }

    pub fn remove(&self, key: &K) -> Option<V> {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        let config = inner.config;
        inner
            .remove_entry(key)
            .filter(|e| !Self::is_expired(&config, e.created_ms, e.touched_ms, now))
            .map(|e| e.value)
    }

    /// Removes every entry for which `f` returns false (expired entries go too).
    pub fn retain(&self, mut f: impl FnMut(&K, &V) -> bool) {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        let config = inner.config;
        let doomed: Vec<K> = inner
            .entries
            .iter()
            .filter(|(k, e)| {
                Self::is_expired(&config, e.created_ms, e.touched_ms, now) || !f(k, &e.value)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            inner.remove_entry(&k);
        }
    }

    /// Number of entries held, including expired ones not yet swept.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> TtlStats {
        let inner = self.lock();
        TtlStats {
            len: inner.entries.len(),
            expired: inner.expired,
            evicted: inner.evicted,
        }
    }

    /// Drops every expired entry; returns how many went.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        let config = inner.config;
        let doomed: Vec<K> = inner
            .entries
            .iter()
            .filter(|(_, e)| Self::is_expired(&config, e.created_ms, e.touched_ms, now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &doomed {
            inner.remove_entry(k);
        }
        inner.expired += doomed.len() as u64;
        doomed.len()
    }

    /// Live entries, least recently used first (so [`restore`](Self::restore) rebuilds the
    /// same LRU order).
    pub fn snapshot(&self) -> Vec<SnapshotEntry<K, V>> {
        let now = self.clock.now_ms();
        let inner = self.lock();
        inner
            .lru
            .values()
            .filter_map(|k| {
                let e = inner.entries.get(k)?;
                if Self::is_expired(&inner.config, e.created_ms, e.touched_ms, now) {
                    return None;
                }
                Some(SnapshotEntry {
                    key: k.clone(),
                    value: e.value.clone(),
                    created_ms: e.created_ms,
                    touched_ms: e.touched_ms,
                })
            })
            .collect()
    }

    /// Adds the entries of a snapshot, keeping their ages; entries that expired while the
    /// process was down are skipped. Returns how many were restored.
    pub fn restore(&self, entries: Vec<SnapshotEntry<K, V>>) -> usize {
        let now = self.clock.now_ms();
        let config = self.config();
        let mut restored = 0;
        for e in entries {
            if Self::is_expired(&config, e.created_ms, e.touched_ms, now) {
                continue;
            }
            self.insert_at(e.key, e.value, (e.created_ms, e.touched_ms.min(now)), now);
            restored += 1;
        }
        restored
    }

    /// Starts this map's one sweeper; it stops when `shutdown` is cancelled.
    pub fn spawn_sweeper(
        &self,
        every: Duration,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()>
    where
        K: Send + 'static,
        V: Send + 'static,
    {
        let map = self.clone();
        job::spawn("ttl sweep", Ticker::new(every, shutdown), move || {
            map.sweep();
            std::future::ready(())
        })
    }
}

/// A map of text to text (a `String` or a shared `Arc<str>` each) persists as such.
impl<K, V> TtlMap<K, V>
where
    K: Eq + Hash + Clone + AsRef<str> + From<String>,
    V: Clone + AsRef<str> + From<String>,
{
    /// Persists the live entries under `name` (waits for the commit).
    pub async fn save_to(&self, store: &Store, name: &str) -> Result<usize, StoreError> {
        let rows: Vec<SnapshotRow> = self
            .snapshot()
            .into_iter()
            .map(|e| SnapshotRow {
                key: e.key.as_ref().to_owned(),
                value: e.value.as_ref().to_owned(),
                created_ms: e.created_ms,
                touched_ms: e.touched_ms,
            })
            .collect();
        let n = rows.len();
        store.put_snapshot(name, &SnapshotRecord(rows)).await?;
        Ok(n)
    }

    /// Restores the entries saved under `name`, if any.
    pub fn load_from(&self, store: &Store, name: &str) -> Result<usize, StoreError> {
        match store.get_snapshot(name)? {
            Some(SnapshotRecord(rows)) => Ok(self.restore(
                rows.into_iter()
                    .map(|r| SnapshotEntry {
                        key: K::from(r.key),
                        value: V::from(r.value),
                        created_ms: r.created_ms,
                        touched_ms: r.touched_ms,
                    })
                    .collect(),
            )),
            None => Ok(0),
        }
    }
}

impl<K: Eq + Hash, V> Inner<K, V> {
    fn bump_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn remove_entry<Q>(&mut self, key: &Q) -> Option<Entry<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let e = self.entries.remove(key)?;
        self.lru.remove(&e.seq);
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::{Clock, ManualClock};

    fn map(
        idle: Option<u64>,
        absolute: Option<u64>,
        max: usize,
    ) -> (TtlMap<String, u32>, ManualClock) {
        let clock = ManualClock::new(1_000_000);
        let m = TtlMap::new(
            TtlConfig {
                idle: idle.map(Duration::from_secs),
                absolute: absolute.map(Duration::from_secs),
                max_entries: max,
            },
            Arc::new(clock.clone()),
        );
        (m, clock)
    }

    #[test]
    fn idle_ttl_expires_unused_entries_and_reads_refresh_it() {
        let (m, clock) = map(Some(10), None, 100);
        m.insert("a".into(), 1);
        m.insert("b".into(), 2);
        clock.advance(Duration::from_secs(6));
        assert_eq!(m.get("a"), Some(1)); // refreshes a
        clock.advance(Duration::from_secs(6));
        assert_eq!(m.get("a"), Some(1));
        assert_eq!(m.get("b"), None, "b idle for 12s > 10s");
        assert_eq!(m.stats().expired, 1);
    }

    #[test]
    fn peek_does_not_refresh_idle_ttl() {
        let (m, clock) = map(Some(10), None, 100);
        m.insert("a".into(), 1);
        clock.advance(Duration::from_secs(6));
        assert_eq!(m.peek("a"), Some(1));
        clock.advance(Duration::from_secs(6));
        assert_eq!(m.peek("a"), None);
    }

    #[test]
    fn absolute_ttl_expires_even_when_read() {
        let (m, clock) = map(Some(10), Some(15), 100);
        m.insert("a".into(), 1);
        for _ in 0..3 {
            clock.advance(Duration::from_secs(5));
            if clock.now_ms() - 1_000_000 < 15_000 {
                assert_eq!(m.get("a"), Some(1));
            }
        }
        assert_eq!(m.get("a"), None);
    }

    #[test]
    fn max_entries_evicts_least_recently_used() {
        let (m, _clock) = map(None, None, 2);
        m.insert("a".into(), 1);
        m.insert("b".into(), 2);
        assert_eq!(m.get("a"), Some(1)); // b is now the LRU
        m.insert("c".into(), 3);
        assert_eq!(m.len(), 2);
        assert_eq!(m.peek("b"), None);
        assert_eq!(m.peek("a"), Some(1));
        assert_eq!(m.peek("c"), Some(3));
        assert_eq!(m.stats().evicted, 1);
    }

    /// Any mix of reads, writes and evictions keeps the LRU order naming each entry once, at
    /// its own place, and evicts in the order a model of uses gives.
    #[test]
    fn the_lru_order_follows_every_use() {
        let (m, _clock) = map(None, None, 5);
        // The model: keys from least to most recently used.
        let mut order: Vec<String> = Vec::new();
        let mut seed = 7u64;
        for _ in 0..2_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let key = format!("k{}", (seed >> 33) % 9);
            let used = if (seed >> 20).is_multiple_of(2) {
                m.insert(key.clone(), 1);
                true
            } else {
                m.get(&key).is_some()
            };
            if used {
                order.retain(|k| *k != key);
                order.push(key);
                if order.len() > 5 {
                    order.remove(0);
                }
            }
            let inner = m.lock();
            assert_eq!(inner.lru.len(), inner.entries.len());
            for (seq, k) in &inner.lru {
                assert_eq!(inner.entries.get(k).map(|e| e.seq), Some(*seq));
            }
            let kept: Vec<&String> = inner.lru.values().collect();
            assert_eq!(kept, order.iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn replacing_a_key_does_not_evict_another() {
        let (m, _clock) = map(None, None, 2);
        m.insert("a".into(), 1);
        m.insert("b".into(), 2);
        assert_eq!(m.insert("a".into(), 10), Some(1));
        assert_eq!(m.len(), 2);
        assert_eq!(m.peek("b"), Some(2));
    }

    #[test]
    fn a_replaced_entry_is_the_most_recent_and_gives_back_only_a_live_value() {
        let (m, clock) = map(Some(60), None, 2);
        m.insert("a".into(), 1);
        m.insert("b".into(), 2);
        // Replacing a makes b the least recently used.
        assert_eq!(m.insert("a".into(), 10), Some(1));
        m.insert("c".into(), 3);
        assert_eq!(m.peek("b"), None);
        assert_eq!(m.peek("a"), Some(10));
        // A value that expired is not given back, and its replacement lives anew.
        clock.advance(Duration::from_secs(61));
        assert_eq!(m.insert("a".into(), 20), None);
        assert_eq!(m.get("a"), Some(20));
        // A lower bound takes effect at the next insert, the least recent going first.
        m.set_config(TtlConfig {
            idle: Some(Duration::from_secs(60)),
            absolute: None,
            max_entries: 1,
        });
        m.insert("d".into(), 4);
        assert_eq!(m.len(), 1);
        assert_eq!(m.peek("d"), Some(4));
    }

    #[test]
    fn sweep_removes_only_expired_entries() {
        let (m, clock) = map(Some(10), None, 100);
        m.insert("old".into(), 1);
        clock.advance(Duration::from_secs(8));
        m.insert("new".into(), 2);
        clock.advance(Duration::from_secs(3));
        assert_eq!(m.len(), 2, "expired entries linger until read or swept");
        assert_eq!(m.sweep(), 1);
        assert_eq!(m.len(), 1);
        assert_eq!(m.peek("new"), Some(2));
    }

    #[test]
    fn snapshot_restore_keeps_ages_order_and_drops_what_expired_meanwhile() {
        let (m, clock) = map(Some(100), None, 3);
        m.insert("a".into(), 1);
        clock.advance(Duration::from_secs(50));
        m.insert("b".into(), 2);
        m.insert("c".into(), 3);
        let snap = m.snapshot();
        assert_eq!(
            snap.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );

        let clock2 = ManualClock::new(clock.now_ms() + 60_000); // 60 s "downtime"
        let m2: TtlMap<String, u32> = TtlMap::new(m.config(), Arc::new(clock2.clone()));
        assert_eq!(m2.restore(snap), 2, "a was idle 110 s > 100 s");
        assert_eq!(m2.peek("a"), None);
        assert_eq!(m2.peek("b"), Some(2));
        // b keeps its age: 40 s more of idleness expires it.
        clock2.advance(Duration::from_secs(40));
        assert_eq!(m2.peek("b"), None);
    }

    #[test]
    fn retain_and_remove() {
        let (m, _clock) = map(None, None, 10);
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            m.insert((*k).into(), i as u32);
        }
        m.retain(|_, v| *v != 1);
        assert_eq!(m.peek("b"), None);
        assert_eq!(m.remove(&"a".into()), Some(0));
        assert_eq!(m.len(), 1);
    }

    #[tokio::test]
    async fn snapshots_round_trip_through_the_store() {
        let store = Store::open_in_memory().unwrap();
        let clock = ManualClock::new(1_000_000);
        let config = TtlConfig {
            idle: Some(Duration::from_secs(100)),
            absolute: None,
            max_entries: 10,
        };
        let m: TtlMap<String, String> = TtlMap::new(config, Arc::new(clock.clone()));
        m.insert("a".into(), "1".into());
        m.insert("b".into(), "2".into());
        assert_eq!(m.save_to(&store, "affinity").await.unwrap(), 2);
        let m2: TtlMap<String, String> = TtlMap::new(config, Arc::new(clock.clone()));
        assert_eq!(m2.load_from(&store, "affinity").unwrap(), 2);
        assert_eq!(m2.peek("b"), Some("2".into()));
        assert_eq!(m2.load_from(&store, "nothing-saved").unwrap(), 0);
        // Shared strings persist as text too: a snapshot one kind of map wrote, the other
        // reads (the response owners' map changed kind with its snapshot in place).
        let shared: TtlMap<Arc<str>, Arc<str>> = TtlMap::new(config, Arc::new(clock.clone()));
        assert_eq!(shared.load_from(&store, "affinity").unwrap(), 2);
        assert_eq!(shared.peek("a"), Some(Arc::from("1")));
        shared.insert(Arc::from("c"), Arc::from("3"));
        assert_eq!(shared.save_to(&store, "shared").await.unwrap(), 3);
        let m3: TtlMap<String, String> = TtlMap::new(config, Arc::new(clock.clone()));
        assert_eq!(m3.load_from(&store, "shared").unwrap(), 3);
        assert_eq!(m3.peek("c"), Some("3".into()));
    }

    #[tokio::test]
    async fn sweeper_runs_and_stops_on_shutdown() {
        let (m, clock) = map(Some(1), None, 10);
        m.insert("a".into(), 1);
        clock.advance(Duration::from_secs(2));
        let stop = CancellationToken::new();
        let handle = m.spawn_sweeper(Duration::from_millis(1), stop.clone());
        // The first interval tick fires at once; wait until it has swept.
        while !m.is_empty() {
            tokio::task::yield_now().await;
        }
        stop.cancel();
        handle.await.unwrap();
        assert_eq!(m.stats().expired, 1);
    }
}
