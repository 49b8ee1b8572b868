//! Usage accounting: every finished request adds to an hourly bucket keyed by (key, model,
//! account) — requests, errors, tokens by kind, time.
//!
//! The hot path only takes a short lock on a map in memory (no await under it, no write per
//! request). A flusher writes the buckets that changed, each with its whole totals (so writing
//! one twice is harmless), every [`FLUSH_EVERY`]; a SIGKILL loses at most that much. The buckets
//! of the last [`KEEP_HOURS`] hours stay in memory (loaded at start) for the key budgets'
//! rolling windows; reports read the store and overlay what is not flushed yet.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::base::clock::SharedClock;
use crate::base::job::{self, Ticker};
use crate::keys::Hasher;
use crate::keys::policy::Window;
use crate::store::records::UsageBucketRow;
use crate::store::schema::Table;
use crate::store::writer::Mutation;
use crate::store::{Store, StoreError};

/// How often changed buckets are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// Hours kept in memory: the longest budget window (a week) and its starting hour.
pub const KEEP_HOURS: u64 = 7 * 24 + 1;

/// What one finished request adds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    pub errors: u64,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    pub duration_ms: u64,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.input_tokens += o.input_tokens;
        self.cached_tokens += o.cached_tokens;
        self.output_tokens += o.output_tokens;
        self.reasoning_tokens += o.reasoning_tokens;
        self.duration_ms += o.duration_ms;
    }

    fn of_row(r: &UsageBucketRow) -> Counters {
        Counters {
            requests: r.requests,
            errors: r.errors,
            input_tokens: r.input_tokens,
            cached_tokens: r.cached_tokens,
            output_tokens: r.output_tokens,
            reasoning_tokens: r.reasoning_tokens,
            duration_ms: r.duration_ms,
        }
    }

    /// What budgets count: input + output, as the upstream reported them.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct BucketKey {
    hour: u64,
    key_id: String,
    account: String,
    model: String,
}

/// A [`BucketKey`] borrowed: it hashes as the owned key does (the same fields in the same
/// order, `&str` hashing as `String`), so a bucket is found without building one.
#[derive(Hash)]
struct BucketRef<'a> {
    hour: u64,
    key_id: &'a str,
    account: &'a str,
    model: &'a str,
}

impl hashbrown::Equivalent<BucketKey> for BucketRef<'_> {
    fn equivalent(&self, k: &BucketKey) -> bool {
        self.hour == k.hour
            && self.key_id == k.key_id
            && self.account == k.account
            && self.model == k.model
    }
}

impl BucketRef<'_> {
    fn to_owned(&self) -> BucketKey {
        BucketKey {
            hour: self.hour,
            key_id: self.key_id.to_string(),
            account: self.account.to_string(),
            model: self.model.to_string(),
        }
    }
}

impl BucketKey {
    fn row(&self, c: &Counters) -> UsageBucketRow {
        UsageBucketRow {
            hour: self.hour,
            key_id: self.key_id.clone(),
            model: self.model.clone(),
            account: self.account.clone(),
            requests: c.requests,
            errors: c.errors,
            input_tokens: c.input_tokens,
            cached_tokens: c.cached_tokens,
            output_tokens: c.output_tokens,
            reasoning_tokens: c.reasoning_tokens,
            duration_ms: c.duration_ms,
        }
    }
}

#[derive(Default)]
struct Book {
    buckets: hashbrown::HashMap<BucketKey, Counters, Hasher>,
    dirty: hashbrown::HashSet<BucketKey, Hasher>,
    /// Key id -> hour -> tokens, for the budget windows.
    tokens: HashMap<String, BTreeMap<u64, u64>, Hasher>,
    /// Key id -> totals since this process started (the metrics' counters).
    since_start: HashMap<String, Counters, Hasher>,
    /// Key id -> tokens reserved by its requests in flight, settled when each ends.
    reserved: HashMap<String, u64, Hasher>,
    /// Key id -> the output tokens of its recent answers (a moving average), for estimates.
    recent_output: HashMap<String, u64, Hasher>,
}

/// Output tokens a request is expected to take when its key has no answers to go by yet.
pub const DEFAULT_ANSWER_TOKENS: u64 = 1024;

/// Bytes of request body counted as one input token in an estimate.
const BYTES_PER_TOKEN: u64 = 4;

/// Tokens held for a request in flight against its key's budgets; given back when dropped, as
/// its real usage is added.
pub struct Reservation {
    book: Arc<Mutex<Book>>,
    key_id: String,
    tokens: u64,
}

impl Reservation {
    pub fn tokens(&self) -> u64 {
        self.tokens
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = book.reserved.get_mut(&self.key_id) {
            *r = r.saturating_sub(self.tokens);
            if *r == 0 {
                book.reserved.remove(&self.key_id);
            }
        }
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("key_id", &self.key_id)
            .field("tokens", &self.tokens)
            .finish()
    }
}

/// How a key stands against one of its token budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetState {
    pub window: Window,
    pub limit: u64,
    pub used: u64,
    /// Reserved by the key's requests in flight.
    pub reserved: u64,
    /// At or over the limit: requests are refused.
    pub exhausted: bool,
    /// When exhausted, seconds until enough tokens age out for the key to be under its limit;
    /// otherwise until the oldest counted hour leaves the window (`None`: nothing counted).
    pub resets_in_s: Option<u64>,
}

/// [`UsageBook::estimate`], from the book.
fn estimate_of(book: &Book, key_id: &str, input_bytes: u64) -> u64 {
    let answer = book
        .recent_output
        .get(key_id)
        .copied()
        .unwrap_or(DEFAULT_ANSWER_TOKENS);
    input_bytes.div_ceil(BYTES_PER_TOKEN) + answer
}

/// How `key_id` stands against one budget, from the book.
fn budget_of(book: &Book, now: u64, key_id: &str, window: Window, limit: u64) -> BudgetState {
    let start = now.saturating_sub(window.secs());
    let hours: Vec<(u64, u64)> = book
        .tokens
        .get(key_id)
        .map(|t| {
            t.range(hour_of(start)..)
                .filter(|(h, _)| **h + 3600 > start)
                .map(|(h, n)| (*h, *n))
                .collect()
        })
        .unwrap_or_default();
    let reserved = book.reserved.get(key_id).copied().unwrap_or(0);
    let used: u64 = hours.iter().map(|(_, n)| n).sum();
    // An hour leaves the window when the window's start passes the hour's end.
    let leaves = |h: u64| (h + 3600 + window.secs()).saturating_sub(now).max(1);
    let exhausted = used >= limit;
    let resets_in_s = if exhausted {
        let mut left = used;
        let mut at = 1;
        for (h, n) in &hours {
            left -= n;
            if left < limit {
                at = leaves(*h);
                break;
            }
        }
        Some(at)
    } else {
        hours.iter().find(|(_, n)| *n > 0).map(|(h, _)| leaves(*h))
    };
    BudgetState {
        window,
        limit,
        used,
        reserved,
        exhausted,
        resets_in_s,
    }
}

/// The usage book. Cloning shares it.
#[derive(Clone)]
pub struct UsageBook {
    book: Arc<Mutex<Book>>,
    store: Store,
    clock: SharedClock,
    flushes: Arc<AtomicU64>,
}

fn hour_of(secs: u64) -> u64 {
    secs - secs % 3600
}

impl UsageBook {
    /// Loads the buckets of the last [`KEEP_HOURS`] hours.
    pub fn load(store: Store, clock: SharedClock) -> Result<UsageBook, StoreError> {
        let now = clock.now_secs();
        let from = hour_of(now).saturating_sub(KEEP_HOURS * 3600);
        let mut book = Book::default();
        for r in store.usage_between(from, u64::MAX / 2)? {
            let key = BucketKey {
                hour: r.hour,
                key_id: r.key_id.clone(),
                account: r.account.clone(),
                model: r.model.clone(),
            };
            let c = Counters::of_row(&r);
            *book
                .tokens
                .entry(r.key_id)
                .or_default()
                .entry(r.hour)
                .or_default() += c.tokens();
            book.buckets.insert(key, c);
        }
        Ok(UsageBook {
            book: Arc::new(Mutex::new(book)),
            store,
            clock,
            flushes: Arc::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a finished request to the bucket of the hour it started in (`started_ms`, as its
    /// record says), so that usage and records group alike.
    pub fn add(
        &self,
        started_ms: u64,
        (key_id, model, account): (&str, &str, Option<&str>),
        c: Counters,
    ) {
        let hour = hour_of(started_ms / 1000);
        let key = BucketRef {
            hour,
            key_id,
            account: account.unwrap_or_default(),
            model,
        };
        let mut book = self.lock();
        let book = &mut *book;
        if let Some(tokens) = book.tokens.get_mut(key_id) {
            *tokens.entry(hour).or_default() += c.tokens();
        } else {
            book.tokens
                .insert(key_id.to_string(), BTreeMap::from([(hour, c.tokens())]));
        }
        if c.output_tokens > 0 {
            match book.recent_output.get_mut(key_id) {
                Some(recent) => *recent = (*recent * 3 + c.output_tokens).div_ceil(4),
                None => {
                    book.recent_output
                        .insert(key_id.to_string(), c.output_tokens);
                }
            }
        }
        match book.since_start.get_mut(key_id) {
            Some(t) => t.add(&c),
            None => {
                book.since_start.insert(key_id.to_string(), c);
            }
        }
        if let Some(b) = book.buckets.get_mut(&key) {
            b.add(&c);
        } else {
            book.buckets.insert(key.to_owned(), c);
        }
        if !book.dirty.contains(&key) {
            book.dirty.insert(key.to_owned());
        }
    }

    /// Tokens of `key_id` counted by a window ending now: every hour that ends after the
    /// window's start counts whole. With the limit, when the key is at or over it, how long
    /// until enough hours age out.
    pub fn budget(&self, key_id: &str, window: Window, limit: u64) -> BudgetState {
        budget_of(&self.lock(), self.clock.now_secs(), key_id, window, limit)
    }

    /// What a request of `input_bytes` is expected to take: its input (a token per 4 bytes)
    /// and an answer as long as the key's recent ones ([`DEFAULT_ANSWER_TOKENS`] before it
    /// has any).
    pub fn estimate(&self, key_id: &str, input_bytes: u64) -> u64 {
        estimate_of(&self.lock(), key_id, input_bytes)
    }

    /// Reserves the [`UsageBook::estimate`] of a request of `input_bytes` for `key_id` under
    /// each of its `budgets`, unless one of them has already reached its limit with what was
    /// used and what its requests in flight reserved; then that budget's state. Estimated,
    /// checked and reserved under one lock, so concurrent requests see each other's
    /// reservations.
    pub fn reserve(
        &self,
        key_id: &str,
        budgets: &[(Window, u64)],
        input_bytes: u64,
    ) -> Result<Reservation, BudgetState> {
        let now = self.clock.now_secs();
        let mut book = self.lock();
        let tokens = estimate_of(&book, key_id, input_bytes);
        for (window, limit) in budgets {
            let b = budget_of(&book, now, key_id, *window, *limit);
            if b.used + b.reserved >= b.limit {
                return Err(b);
            }
        }
        *book.reserved.entry(key_id.to_string()).or_default() += tokens;
        Ok(Reservation {
            book: self.book.clone(),
            key_id: key_id.to_string(),
            tokens,
        })
    }

    /// Tokens of `key_id` since `from` (unix seconds, counted by whole hours from its hour).
    pub fn tokens_since(&self, key_id: &str, from: u64) -> u64 {
        let book = self.lock();
        book.tokens
            .get(key_id)
            .map(|t| t.range(hour_of(from)..).map(|(_, n)| n).sum())
            .unwrap_or(0)
    }

    /// The totals of `key_id` over the hours starting at or after `from`.
    pub fn totals_since(&self, key_id: &str, from: u64) -> Counters {
        let from = hour_of(from);
        let book = self.lock();
        let mut total = Counters::default();
        for (k, c) in &book.buckets {
            if k.key_id == key_id && k.hour >= from {
                total.add(c);
            }
        }
        total
    }

    /// Each key's totals since this process started.
    pub fn since_start(&self) -> Vec<(String, Counters)> {
        let book = self.lock();
        let mut v: Vec<(String, Counters)> = book
            .since_start
            .iter()
            .map(|(k, c)| (k.clone(), *c))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Buckets changed since their last write.
    pub fn unflushed(&self) -> usize {
        self.lock().dirty.len()
    }

    /// Writes completed since start.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Writes the buckets that changed (whole totals) and forgets the clean ones that are too
    /// old for any window. A failed write leaves them to the next flush.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let mut pending = Pending {
            book: self,
            keys: Vec::new(),
            written: false,
        };
        let rows: Vec<UsageBucketRow> = {
            let mut book = self.lock();
            let book = &mut *book;
            book.dirty
                .drain()
                .filter_map(|k| {
                    let row = book.buckets.get(&k).map(|c| k.row(c));
                    pending.keys.push(k);
                    row
                })
                .collect()
        };
        if !rows.is_empty() {
            let muts = rows
                .iter()
                .map(Store::usage_mutation)
                .collect::<Result<Vec<Mutation>, StoreError>>()?;
            self.store.write(muts).await?;
        }
        pending.written = true;
        drop(pending);
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let oldest = hour_of(self.clock.now_secs()).saturating_sub(KEEP_HOURS * 3600);
        let mut book = self.lock();
        let book = &mut *book;
        let dirty = &book.dirty;
        book.buckets
            .retain(|k, _| k.hour >= oldest || dirty.contains(k));
        for t in book.tokens.values_mut() {
            t.retain(|h, _| *h >= oldest);
        }
        Ok(())
    }

    /// Flushes every [`FLUSH_EVERY`] until `stop`, then once more.
    pub fn spawn_flusher(
        &self,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let book = self.clone();
        job::spawn("usage flush", Ticker::new(FLUSH_EVERY, stop), move || {
            let book = book.clone();
            async move {
                if let Err(e) = book.flush().await {
                    tracing::warn!(error = %e, "cannot write usage; will retry");
                }
            }
        })
    }

    /// The buckets of the hours starting in `[from, to)`: the stored ones, each replaced by the
    /// book's own when it holds it. The book's totals are the newest (it loads what is stored
    /// and adds to it), and overlaying only the unflushed ones would lose a bucket whose write
    /// is under way: out of the dirty set already, not yet in the store.
    pub fn between(&self, from: u64, to: u64) -> Result<Vec<UsageBucketRow>, StoreError> {
        let mut rows: BTreeMap<String, UsageBucketRow> = self
            .store
            .usage_between(from, to)?
            .into_iter()
            .map(|r| (Store::usage_key(&r), r))
            .collect();
        let book = self.lock();
        for (k, c) in &book.buckets {
            if k.hour >= from && k.hour < to {
                let r = k.row(c);
                rows.insert(Store::usage_key(&r), r);
            }
        }
        Ok(rows.into_values().collect())
    }

    /// Deletes stored buckets older than `days`.
    pub fn prune(&self, days: u32) {
        let cutoff = hour_of(
            self.clock
                .now_secs()
                .saturating_sub(u64::from(days) * 24 * 3600),
        );
        self.store.try_write(vec![Mutation::DeleteTextBelow(
            Table::UsageHourly,
            format!("{cutoff:010}/"),
        )]);
    }
}

/// Buckets taken out of the dirty set for a write: put back unless the write succeeded (it
/// failed, or the flush was cancelled half way).
struct Pending<'a> {
    book: &'a UsageBook,
    keys: Vec<BucketKey>,
    written: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.written {
            self.book.lock().dirty.extend(self.keys.drain(..));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::clock::{Clock, ManualClock};

    const T0: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    #[test]
    fn a_bucket_is_found_by_its_borrowed_key_and_kept_once_in_the_book() {
        let r = BucketRef {
            hour: 7,
            key_id: "key_a",
            account: "acc",
            model: "gpt-5.5",
        };
        use std::hash::BuildHasher;
        let h = Hasher::default();
        assert_eq!(h.hash_one(&r), h.hash_one(r.to_owned()));
        let mut book = Book::default();
        book.buckets.insert(r.to_owned(), Counters::default());
        assert!(book.buckets.get(&r).is_some());
        let other = BucketRef {
            model: "gpt-5",
            ..r
        };
        assert!(book.buckets.get(&other).is_none());
        assert!(book.buckets.get(&BucketRef { hour: 8, ..r }).is_none());
        // The same request counted twice: one bucket, one dirty entry, both totals.
        let u = UsageBook::load(
            Store::open_in_memory().unwrap(),
            Arc::new(ManualClock::new(T0)),
        )
        .unwrap();
        for _ in 0..2 {
            u.add(T0, ("key_a", "gpt-5.5", Some("acc")), tokens(10));
        }
        u.add(T0, ("key_a", "gpt-5", Some("acc")), tokens(4));
        let book = u.lock();
        assert_eq!((book.buckets.len(), book.dirty.len()), (2, 2));
        let k = BucketRef {
            hour: hour_of(T0 / 1000),
            ..r
        };
        assert_eq!(
            book.buckets.get(&k).map(|c| (c.requests, c.tokens())),
            Some((2, 20))
        );
    }

    fn tokens(n: u64) -> Counters {
        Counters {
            requests: 1,
            input_tokens: n / 2,
            output_tokens: n - n / 2,
            ..Counters::default()
        }
    }

    /// A report read while a flush is writing sees the bucket being written: taken out of the
    /// unflushed set, it is still the book's.
    #[tokio::test]
    async fn usage_read_during_a_flush_misses_nothing() {
        let clock = Arc::new(ManualClock::new(T0));
        let book = UsageBook::load(Store::open_in_memory().unwrap(), clock.clone()).unwrap();
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(10));
        book.flush().await.unwrap();
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(10));
        // What a flush does before its write: the bucket leaves the unflushed set, and the
        // store still holds the total before the second request.
        book.lock().dirty.clear();
        let rows = book.between(0, u64::MAX / 2).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].requests, 2, "{rows:?}");
    }

    #[tokio::test]
    async fn a_budget_counts_whole_hours_and_says_when_it_resets() {
        let clock = Arc::new(ManualClock::new(T0 + 30 * 60 * 1000)); // 00:30
        let book = UsageBook::load(Store::open_in_memory().unwrap(), clock.clone()).unwrap();
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(600));
        clock.advance(Duration::from_secs(2 * 3600)); // 02:30
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(500));
        let b = book.budget("k", Window::FiveHours, 1000);
        assert_eq!((b.used, b.resets_in_s), (1100, Some(3 * 3600 + 30 * 60)));
        assert!(b.exhausted);
        let under = book.budget("k", Window::FiveHours, 2000);
        assert!(!under.exhausted);
        // Under the limit: when the first hour's tokens leave the window.
        assert_eq!(under.resets_in_s, Some(3 * 3600 + 30 * 60));
        assert_eq!(book.budget("other", Window::Day, 5).resets_in_s, None);
        // 06:00 is the end of the first hour plus 5 h: it has left the window.
        clock.set_ms(T0 + 6 * 3600 * 1000);
        assert_eq!(book.budget("k", Window::FiveHours, 1000).used, 500);
        assert_eq!(book.budget("k", Window::Day, 1000).used, 1100);
        assert_eq!(book.budget("other", Window::Day, 1).used, 0);
    }

    #[tokio::test]
    async fn flushed_buckets_survive_a_reload_and_unflushed_ones_show_in_reports() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = Store::open_in_memory().unwrap();
        let book = UsageBook::load(store.clone(), clock.clone()).unwrap();
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(10));
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(20));
        book.add(clock.now_ms(), ("k", "m", None), tokens(0));
        assert_eq!(book.unflushed(), 2);
        book.flush().await.unwrap();
        assert_eq!(book.unflushed(), 0);
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(5));
        // Not written yet, but reports see it.
        let rows = book.between(0, u64::MAX / 2).unwrap();
        let a = rows.iter().find(|r| r.account == "a").unwrap();
        assert_eq!((a.requests, a.input_tokens + a.output_tokens), (3, 35));
        assert_eq!(store.usage_between(0, u64::MAX / 2).unwrap().len(), 2);
        book.flush().await.unwrap();
        let again = UsageBook::load(store, clock).unwrap();
        assert_eq!(again.budget("k", Window::Day, 1).used, 35);
        assert_eq!(again.totals_since("k", 0).requests, 4);
    }

    #[tokio::test]
    async fn retention_deletes_old_buckets_only() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = Store::open_in_memory().unwrap();
        let book = UsageBook::load(store.clone(), clock.clone()).unwrap();
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(10));
        book.flush().await.unwrap();
        clock.advance(Duration::from_secs(10 * 24 * 3600));
        book.add(clock.now_ms(), ("k", "m", Some("a")), tokens(10));
        book.flush().await.unwrap();
        assert_eq!(store.usage_between(0, u64::MAX / 2).unwrap().len(), 2);
        book.prune(5);
        store.flush().await.unwrap();
        let left = store.usage_between(0, u64::MAX / 2).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].hour, (T0 / 1000) + 10 * 24 * 3600);
    }
}
