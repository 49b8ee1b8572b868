//! Error rates over the last 20 and 60 minutes, pool-wide and per account: the two windows an
//! operator reads to tell the clients' experience from the upstream's noise.
//!
//! - A request counts when it finishes, unless its key's policy refused it (it never reached
//!   the pool). Its client got an error when its outcome is one ([`Outcome::is_error`]).
//! - An attempt is an upstream error when the backend (or the way to it) failed it: any class
//!   but success, the caller's own, a policy refusal, and the neutral ones (the client left or
//!   stalled, the gateway gave up).
//! - Pool-wide, both rates are per request: client errors / requests, upstream errors /
//!   requests (so failovers that saved the request still show upstream). Per account, the
//!   client rate is over the requests that ended on it (their last attempt), the upstream
//!   rate over its attempts.
//!
//! Kept in one-minute buckets on the clock, 60 of them; the same functions judge stored
//! records for `switchyard report`.

use std::collections::{BTreeMap, VecDeque};

use super::records::{AttemptRecord, Outcome, RequestRecord};
use crate::fleet::health::Class;

/// The windows, in minutes.
pub const WINDOWS: [u64; 2] = [20, 60];

/// Counts of one window (or minute).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub requests: u64,
    pub client_errors: u64,
    pub attempts: u64,
    pub upstream_errors: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.requests += o.requests;
        self.client_errors += o.client_errors;
        self.attempts += o.attempts;
        self.upstream_errors += o.upstream_errors;
    }

    fn ratio(n: u64, d: u64) -> Option<f64> {
        (d > 0).then(|| n as f64 / d as f64)
    }

    /// Client errors per request.
    pub fn client_rate(&self) -> Option<f64> {
        Self::ratio(self.client_errors, self.requests)
    }

    /// Pool-wide: upstream errors per request.
    pub fn upstream_rate_per_request(&self) -> Option<f64> {
        Self::ratio(self.upstream_errors, self.requests)
    }

    /// Per account: upstream errors per attempt.
    pub fn upstream_rate_per_attempt(&self) -> Option<f64> {
        Self::ratio(self.upstream_errors, self.attempts)
    }
}

/// Whether a request counts for the pool's rates (its key's policy did not refuse it).
pub fn counts(r: &RequestRecord) -> bool {
    !matches!(
        r.outcome,
        Outcome::KeyRevoked
            | Outcome::KeyExpired
            | Outcome::ModelNotAllowed
            | Outcome::TierNotAllowed
            | Outcome::KeyRateLimited
            | Outcome::KeyBudgetExhausted
            | Outcome::KeyConcurrencyExceeded
    )
}

/// Whether the backend (or the way to it) failed this attempt.
pub fn is_upstream_error(a: &AttemptRecord) -> bool {
    !matches!(
        a.class,
        Class::Success
            | Class::Caller
            | Class::Policy
            | Class::ClientCancelled
            | Class::ClientStalled
            | Class::Abandoned
    )
}

/// A request's counts pool-wide.
pub fn tally(r: &RequestRecord) -> Tally {
    Tally {
        requests: 1,
        client_errors: u64::from(r.outcome.is_error()),
        attempts: r.attempts.len() as u64,
        upstream_errors: r.attempts.iter().filter(|a| is_upstream_error(a)).count() as u64,
    }
}

/// What each of a request's attempts adds to its account's counts (`chatgpt_account_id`):
/// the attempt, and with the last one the request, which ended there.
fn per_attempt(r: &RequestRecord) -> impl Iterator<Item = (&str, Tally)> {
    let client_error = u64::from(r.outcome.is_error());
    let last = r.attempts.len().saturating_sub(1);
    r.attempts.iter().enumerate().map(move |(i, a)| {
        let ended = i == last;
        let t = Tally {
            requests: u64::from(ended),
            client_errors: if ended { client_error } else { 0 },
            attempts: 1,
            upstream_errors: u64::from(is_upstream_error(a)),
        };
        (&*a.account, t)
    })
}

struct Minute {
    at_min: u64,
    pool: Tally,
    accounts: BTreeMap<String, Tally>,
}

/// The last 60 minutes of counts, by minute.
#[derive(Default)]
pub struct ErrorWindows {
    minutes: VecDeque<Minute>,
}

/// The windows of `records` (in any order) at `now_ms`: what a daemon that kept them would
/// show — for a restarted daemon and for commands that read the store.
pub fn of_records<'a>(
    records: impl IntoIterator<Item = &'a RequestRecord>,
    now_ms: u64,
) -> Vec<Window> {
    let mut sorted: Vec<&RequestRecord> = records.into_iter().collect();
    sorted.sort_by_key(|r| finished_ms(r));
    let mut w = ErrorWindows::default();
    for r in sorted {
        w.add(finished_ms(r), r);
    }
    WINDOWS.iter().map(|m| w.window(now_ms, *m)).collect()
}

/// When a record finished (unix ms).
pub fn finished_ms(r: &RequestRecord) -> u64 {
    r.started_ms.saturating_add(r.duration_ms)
}

/// One window's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    pub minutes: u64,
    pub pool: Tally,
    pub accounts: BTreeMap<String, Tally>,
}

impl ErrorWindows {
    /// Adds a record that finished at `now_ms`.
    pub fn add(&mut self, now_ms: u64, r: &RequestRecord) {
        if !counts(r) {
            return;
        }
        let at_min = now_ms / 60_000;
        let pool = tally(r);
        if self.minutes.back().is_none_or(|m| m.at_min != at_min) {
            self.minutes.push_back(Minute {
                at_min,
                pool: Tally::default(),
                accounts: BTreeMap::new(),
            });
        }
        let max = WINDOWS[WINDOWS.len() - 1];
        while self
            .minutes
            .front()
            .is_some_and(|m| m.at_min + max <= at_min)
        {
            self.minutes.pop_front();
        }
        let Some(m) = self.minutes.back_mut() else {
            return;
        };
        m.pool.add(&pool);
        for (id, t) in per_attempt(r) {
            // An account seen this minute already is found by its borrowed id.
            match m.accounts.get_mut(id) {
                Some(kept) => kept.add(&t),
                None => {
                    m.accounts.insert(id.to_string(), t);
                }
            }
        }
    }

    /// The last `minutes` minutes at `now_ms` (the current minute included).
    pub fn window(&self, now_ms: u64, minutes: u64) -> Window {
        let now_min = now_ms / 60_000;
        let mut w = Window {
            minutes,
            ..Window::default()
        };
        for m in self
            .minutes
            .iter()
            .filter(|m| m.at_min + minutes > now_min && m.at_min <= now_min)
        {
            w.pool.add(&m.pool);
            for (id, t) in &m.accounts {
                w.accounts.entry(id.clone()).or_default().add(t);
            }
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::affinity::Decision;
    use crate::telemetry::records::TerminalSource;
    use crate::upstream::Transport;

    fn attempt(account: &str, class: Class) -> AttemptRecord {
        AttemptRecord {
            account: account.into(),
            class,
            status: None,
            phase: None,
            ms: 1,
            error: None,
            rule: None,
        }
    }

    fn record(outcome: Outcome, attempts: Vec<AttemptRecord>) -> RequestRecord {
        RequestRecord {
            key: 0,
            started_ms: 0,
            key_name: "k".into(),
            model: "m".into(),
            path: "/v1/responses".into(),
            stream: true,
            ws: false,
            outcome,
            status: 200,
            account: None,
            attempts,
            ttft_ms: None,
            duration_ms: 1,
            usage: None,
            session: None,
            candidate_pool: Vec::new(),
            skipped: Vec::new(),
            affinity: Decision::None,
            queue: None,
            transport: Transport::Http,
            ws_connect_ms: None,
            terminal_source: Some(TerminalSource::Upstream),
            service_tier: None,
            served_tier: None,
            credit: None,
        }
    }

    #[test]
    fn rates_per_window_pool_wide_and_per_account() {
        let mut w = ErrorWindows::default();
        let t0 = 1_767_225_600_000;
        // 30 minutes ago: a failover that worked (a's 503, b's success).
        w.add(
            t0,
            &record(
                Outcome::Success,
                vec![attempt("a", Class::Transient), attempt("b", Class::Success)],
            ),
        );
        let now = t0 + 30 * 60_000;
        // Now: a caller error on b, an exhaustion on a, a success on b, a key refusal.
        w.add(
            now,
            &record(Outcome::CallerError, vec![attempt("b", Class::Caller)]),
        );
        w.add(
            now,
            &record(Outcome::NoAccount, vec![attempt("a", Class::Quota)]),
        );
        w.add(
            now,
            &record(Outcome::Success, vec![attempt("b", Class::Success)]),
        );
        w.add(now, &record(Outcome::KeyRateLimited, vec![]));

        let w20 = w.window(now, 20);
        assert_eq!(
            w20.pool,
            Tally {
                requests: 3,
                client_errors: 2,
                attempts: 3,
                upstream_errors: 1
            }
        );
        assert_eq!(w20.accounts["a"].upstream_rate_per_attempt(), Some(1.0));
        assert_eq!(w20.accounts["b"].client_rate(), Some(0.5));
        let w60 = w.window(now, 60);
        assert_eq!(w60.pool.requests, 4);
        assert_eq!(w60.pool.upstream_rate_per_request(), Some(0.5));
        assert_eq!(w60.accounts["a"].attempts, 2);
        assert_eq!(w60.accounts["a"].requests, 1, "the failover ended on b");
        // An hour on, it has all left the windows.
        assert_eq!(w.window(now + 60 * 60_000, 60).pool, Tally::default());
    }
}
