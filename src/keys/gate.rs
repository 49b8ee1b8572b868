//! What each key is doing now: requests running and waiting in its own queue, requests admitted
//! in the last minute, its last refusal. In memory only; the policy itself is in the key's
//! record.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// A minute, in ms: the `--rpm` window.
const MINUTE_MS: u64 = 60_000;

#[derive(Default)]
struct KeyState {
    in_flight: u32,
    /// The concurrency limit when it was last looked at (`None`: none).
    limit: Option<u32>,
    /// Waiting for a slot, oldest first.
    waiters: VecDeque<(u64, oneshot::Sender<()>)>,
    /// Admission times (unix ms) within the last minute, kept only while the key has an rpm
    /// limit (so at most that many).
    admitted: VecDeque<u64>,
    /// Admissions per second of the last minute, for the console: (second, count).
    per_second: VecDeque<(u64, u32)>,
    last_refusal: Option<(&'static str, u64)>,
    /// Refusals since start, by code.
    refusals: HashMap<&'static str, u64>,
}

impl KeyState {
    fn prune(&mut self, now_ms: u64) {
        let since = now_ms.saturating_sub(MINUTE_MS);
        while self.admitted.front().is_some_and(|t| *t <= since) {
            self.admitted.pop_front();
        }
        let since_s = since / 1000;
        while self.per_second.front().is_some_and(|(s, _)| *s <= since_s) {
            self.per_second.pop_front();
        }
    }
}

/// What the console and `/metrics` show of a key now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyNow {
    pub in_flight: u32,
    pub waiting: usize,
    /// Requests admitted in the last 60 s.
    pub rpm: u32,
    /// Of them, those counted against the key's `rpm` (counted only while it has one: after
    /// `--rpm` is set, the minute starts empty).
    pub rpm_counted: u32,
    /// When the oldest of them leaves the minute (ms).
    pub rpm_resets_in_ms: Option<u64>,
    pub last_refusal: Option<(&'static str, u64)>,
    pub refusals: Vec<(&'static str, u64)>,
}

/// How a wait for one of the key's slots ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSlot {
    /// The wait ran out (`waited`).
    Timeout(Duration),
    /// The client left, or shutdown cut the request.
    Gone,
}

/// The live state of every key. Cloning shares it.
#[derive(Clone, Default)]
pub struct Gates {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    keys: hashbrown::HashMap<String, KeyState, super::Hasher>,
    next_waiter: u64,
}

impl Inner {
    /// The key's state, made on its first use: its id is copied only then, not on every
    /// request.
    fn key(&mut self, key_id: &str) -> &mut KeyState {
        self.keys.entry_ref(key_id).or_default()
    }
}

/// One of a key's running requests; dropping it frees the slot (to the next waiter first).
pub struct KeyPermit {
    gates: Gates,
    key_id: String,
    /// When its request was counted against the key's rate (unix ms).
    pub(super) counted_at_ms: Option<u64>,
    /// What its request holds of the key's token budgets until it ends.
    pub(super) reservation: Option<super::usage::Reservation>,
}

impl Drop for KeyPermit {
    fn drop(&mut self) {
        self.gates.release(&self.key_id);
    }
}

impl KeyPermit {
    pub fn key_id(&self) -> &str {
        &self.key_id
    }
}

impl std::fmt::Debug for KeyPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPermit")
            .field("key_id", &self.key_id)
            .finish()
    }
}

impl Gates {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits one request against `rpm` (a rolling minute) and counts it; over the limit, the
    /// seconds until the oldest admission leaves the minute.
    pub fn admit_rate(&self, key_id: &str, rpm: Option<u32>, now_ms: u64) -> Result<(), u64> {
        let mut inner = self.lock();
        let k = inner.key(key_id);
        k.prune(now_ms);
        match rpm {
            Some(limit) => {
                if k.admitted.len() >= limit as usize {
                    let oldest = k.admitted.front().copied().unwrap_or(now_ms);
                    let wait_ms = (oldest + MINUTE_MS).saturating_sub(now_ms);
                    return Err(wait_ms.div_ceil(1000).max(1));
                }
                k.admitted.push_back(now_ms);
            }
            None => k.admitted.clear(),
        }
        let second = now_ms / 1000;
        match k.per_second.back_mut() {
            Some((s, n)) if *s == second => *n += 1,
            _ => k.per_second.push_back((second, 1)),
        }
        Ok(())
    }

    /// Takes back an admission counted by [`Gates::admit_rate`] at `at_ms`: its request was
    /// refused after all (its model, known only once its body was read).
    pub fn uncount(&self, key_id: &str, at_ms: u64) {
        let mut inner = self.lock();
        let Some(k) = inner.keys.get_mut(key_id) else {
            return;
        };
        if let Some(i) = k.admitted.iter().rposition(|t| *t == at_ms) {
            k.admitted.remove(i);
        }
        let second = at_ms / 1000;
        if let Some(i) = k.per_second.iter().rposition(|(s, _)| *s == second) {
            k.per_second[i].1 -= 1;
            if k.per_second[i].1 == 0 {
                k.per_second.remove(i);
            }
        }
    }

    /// A slot among the key's `limit` (none: always), waiting in the key's own queue for at
    /// most `wait` (and at most `max_waiting` waiting) when they are all taken.
    pub async fn acquire(
        &self,
        key_id: &str,
        limit: Option<u32>,
        wait: Duration,
        max_waiting: usize,
        gone: impl Future<Output = ()>,
    ) -> Result<KeyPermit, NoSlot> {
        let permit = || KeyPermit {
            gates: self.clone(),
            key_id: key_id.to_string(),
            counted_at_ms: None,
            reservation: None,
        };
        let (id, rx) = {
            let mut inner = self.lock();
            inner.next_waiter += 1;
            let id = inner.next_waiter;
            let k = inner.key(key_id);
            k.limit = limit;
            let free = limit.is_none_or(|l| k.in_flight < l);
            if free && k.waiters.is_empty() {
                k.in_flight += 1;
                return Ok(permit());
            }
            if k.waiters.len() >= max_waiting || wait.is_zero() {
                return Err(NoSlot::Timeout(Duration::ZERO));
            }
            let (tx, rx) = oneshot::channel();
            k.waiters.push_back((id, tx));
            (id, rx)
        };
        // Read only by a request that waits: one let in at once asks the clock nothing.
        let started = Instant::now();
        let mut rx = rx;
        let outcome = tokio::select! {
            r = &mut rx => match r {
                Ok(()) => return Ok(permit()),
                Err(_) => NoSlot::Timeout(started.elapsed()),
            },
            _ = tokio::time::sleep(wait) => NoSlot::Timeout(started.elapsed()),
            _ = gone => NoSlot::Gone,
        };
        {
            let mut inner = self.lock();
            if let Some(k) = inner.keys.get_mut(key_id) {
                k.waiters.retain(|(w, _)| *w != id);
            }
        }
        // A slot handed over in the last instant: kept after a timeout, given back if gone.
        if rx.try_recv().is_ok() {
            let p = permit();
            if outcome == NoSlot::Gone {
                drop(p);
            } else {
                return Ok(p);
            }
        }
        Err(outcome)
    }

    /// Frees a slot: the oldest waiter gets it while the key is within its limit.
    fn release(&self, key_id: &str) {
        let mut inner = self.lock();
        let Some(k) = inner.keys.get_mut(key_id) else {
            return;
        };
        // A lowered limit lets running requests finish and hands over nothing until under it.
        if k.limit.is_none_or(|l| k.in_flight <= l) {
            while let Some((_, tx)) = k.waiters.pop_front() {
                if tx.send(()).is_ok() {
                    return;
                }
            }
        }
        k.in_flight = k.in_flight.saturating_sub(1);
    }

    /// A new limit, applied at once: waiters get the slots it frees.
    pub fn set_limit(&self, key_id: &str, limit: Option<u32>) {
        let mut inner = self.lock();
        let Some(k) = inner.keys.get_mut(key_id) else {
            return;
        };
        k.limit = limit;
        while k.limit.is_none_or(|l| k.in_flight < l) {
            let Some((_, tx)) = k.waiters.pop_front() else {
                break;
            };
            if tx.send(()).is_ok() {
                k.in_flight += 1;
            }
        }
    }

    pub fn note_refusal(&self, key_id: &str, code: &'static str, now_ms: u64) {
        let mut inner = self.lock();
        let k = inner.key(key_id);
        k.last_refusal = Some((code, now_ms));
        *k.refusals.entry(code).or_default() += 1;
    }

    pub fn now(&self, key_id: &str, now_ms: u64) -> KeyNow {
        let mut inner = self.lock();
        let Some(k) = inner.keys.get_mut(key_id) else {
            return KeyNow::default();
        };
        k.prune(now_ms);
        let mut refusals: Vec<(&'static str, u64)> =
            k.refusals.iter().map(|(c, n)| (*c, *n)).collect();
        refusals.sort();
        KeyNow {
            in_flight: k.in_flight,
            waiting: k.waiters.len(),
            rpm: k.per_second.iter().map(|(_, n)| n).sum(),
            rpm_counted: u32::try_from(k.admitted.len()).unwrap_or(u32::MAX),
            rpm_resets_in_ms: k
                .admitted
                .front()
                .map(|t| t + MINUTE_MS)
                .or_else(|| {
                    k.per_second
                        .front()
                        .map(|(s, _)| (s + 1) * 1000 + MINUTE_MS)
                })
                .map(|at| at.saturating_sub(now_ms)),
            last_refusal: k.last_refusal,
            refusals,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_counts_a_rolling_minute() {
        let g = Gates::default();
        let t = 1_000_000;
        assert_eq!(g.admit_rate("k", Some(2), t), Ok(()));
        assert_eq!(g.admit_rate("k", Some(2), t + 10_000), Ok(()));
        assert_eq!(g.admit_rate("k", Some(2), t + 20_000), Err(40));
        assert_eq!(g.admit_rate("k", Some(2), t + 60_001), Ok(()));
        assert_eq!(g.now("k", t + 60_001).rpm, 2);
        // No limit: admitted and counted for the console.
        assert_eq!(g.admit_rate("free", None, t), Ok(()));
        assert_eq!(g.now("free", t).rpm, 1);
    }

    #[tokio::test]
    async fn a_full_key_queues_in_order_and_times_out() {
        let g = Gates::default();
        let never = std::future::pending::<()>;
        let first = g
            .acquire("k", Some(1), Duration::ZERO, 8, never())
            .await
            .unwrap();
        // Full, and no wait allowed.
        assert!(matches!(
            g.acquire("k", Some(1), Duration::ZERO, 8, never()).await,
            Err(NoSlot::Timeout(_))
        ));
        let g2 = g.clone();
        let waiter = tokio::spawn(async move {
            g2.acquire("k", Some(1), Duration::from_secs(30), 8, never())
                .await
                .map(|_| ())
        });
        // Once it is queued, freeing the slot hands it over.
        while g.now("k", 0).waiting == 0 {
            tokio::task::yield_now().await;
        }
        drop(first);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(g.now("k", 0).in_flight, 0);
        // A client that leaves while waiting takes nothing.
        let held = g
            .acquire("k", Some(1), Duration::ZERO, 8, never())
            .await
            .unwrap();
        let left = g
            .acquire("k", Some(1), Duration::from_secs(30), 8, async {})
            .await;
        assert!(matches!(left, Err(NoSlot::Gone)));
        drop(held);
        assert_eq!(g.now("k", 0), KeyNow::default());
    }

    #[tokio::test]
    async fn raising_the_limit_lets_waiters_in() {
        let g = Gates::default();
        let never = std::future::pending::<()>;
        let _held = g
            .acquire("k", Some(1), Duration::ZERO, 8, never())
            .await
            .unwrap();
        let g2 = g.clone();
        let waiter = tokio::spawn(async move {
            g2.acquire("k", Some(1), Duration::from_secs(30), 8, never())
                .await
                .map(std::mem::forget)
        });
        while g.now("k", 0).waiting == 0 {
            tokio::task::yield_now().await;
        }
        g.set_limit("k", Some(2));
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(g.now("k", 0).in_flight, 2);
    }
}
