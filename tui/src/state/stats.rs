//! Figures the panes show, derived from the requests the console has seen.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use switchyard_admin::wire::{Affinity, Class, QueueOutcome, RequestRecord, Transport};

use super::{Finished, State};

pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Unix ms of an RFC 3339 time.
pub fn parse_ms(rfc3339: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(rfc3339).ok()?;
    t.duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// When a request finished (unix ms).
pub(crate) fn finished_ms(r: &RequestRecord) -> Option<u64> {
    parse_ms(&r.started_at).map(|s| s + r.duration_ms)
}

/// p50 and p95 of some values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Percentiles {
    pub p50: u64,
    pub p95: u64,
    pub n: usize,
}

impl Percentiles {
    pub fn of(mut values: Vec<u64>) -> Option<Percentiles> {
        if values.is_empty() {
            return None;
        }
        values.sort_unstable();
        let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
        Some(Percentiles {
            p50: at(0.5),
            p95: at(0.95),
            n: values.len(),
        })
    }
}

/// One account over the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AccountStats {
    /// Attempts on the account, and how many succeeded.
    pub attempts: usize,
    pub successes: usize,
    /// Time to first token of the requests it served.
    pub ttft: Option<Percentiles>,
}

impl AccountStats {
    pub fn success_rate(&self) -> Option<f64> {
        (self.attempts > 0).then(|| self.successes as f64 / self.attempts as f64)
    }
}

/// Session affinity over the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AffinityStats {
    /// `reused`, `new_bind`, `rebound`, `none` -> count.
    pub decisions: BTreeMap<String, usize>,
    /// Per account (`chatgpt_account_id`): (cached tokens, input tokens).
    pub cache: BTreeMap<String, (u64, u64)>,
}

/// Slot waits over the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueStats {
    pub outcomes: BTreeMap<QueueOutcome, usize>,
    pub wait: Option<Percentiles>,
}

/// Transport decisions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TransportStats {
    /// Decision -> count per minute, the current minute last.
    pub per_minute: BTreeMap<Transport, Vec<usize>>,
    pub minutes: usize,
}

impl TransportStats {
    pub fn total(&self, kind: &Transport) -> usize {
        self.per_minute.get(kind).map_or(0, |v| v.iter().sum())
    }
}

impl State {
    /// Attempts, success rate and time to first token of one account over the window.
    pub fn account_stats(&self, chatgpt_id: &str) -> AccountStats {
        let mut s = AccountStats::default();
        let mut ttft = Vec::new();
        for f in self.recent() {
            for a in f.record.attempts.iter().filter(|a| a.account == chatgpt_id) {
                if a.class == Class::ClientCancelled {
                    continue;
                }
                s.attempts += 1;
                s.successes += usize::from(a.class == Class::Success);
            }
            if f.record.account.as_deref() == Some(chatgpt_id)
                && let Some(t) = f.record.ttft_ms
            {
                ttft.push(t);
            }
        }
        s.ttft = Percentiles::of(ttft);
        s
    }

    /// Affinity decisions and prompt-cache hits over the window.
    pub fn affinity_stats(&self) -> AffinityStats {
        let mut s = AffinityStats::default();
        for f in self.recent() {
            let r = &f.record;
            let kind = affinity_kind(&r.affinity);
            *s.decisions.entry(kind.to_string()).or_insert(0) += 1;
            if let (Some(account), Some(usage)) = (&r.account, &r.usage) {
                let e = s.cache.entry(account.clone()).or_insert((0, 0));
                e.0 += usage.cached_tokens;
                e.1 += usage.input_tokens;
            }
        }
        s
    }

    /// The latest requests that had a session, newest first.
    pub fn affinity_decisions(&self, n: usize) -> impl Iterator<Item = &Finished> {
        self.requests
            .iter()
            .filter(|f| f.record.session.is_some())
            .take(n)
    }

    /// Wait outcomes and wait times over the window.
    pub fn queue_stats(&self) -> QueueStats {
        let mut s = QueueStats::default();
        let mut waits = Vec::new();
        for f in self.recent() {
            if let Some(q) = &f.record.queue {
                *s.outcomes.entry(q.outcome.clone()).or_insert(0) += 1;
                waits.push(q.wait_ms);
            }
        }
        s.wait = Percentiles::of(waits);
        s
    }

    /// Transport decisions per minute over the window.
    pub fn transport_stats(&self) -> TransportStats {
        let minutes = (super::WINDOW_MS / 60_000) as usize;
        let mut s = TransportStats {
            per_minute: BTreeMap::new(),
            minutes,
        };
        for f in self.recent() {
            let age = (self.now_ms.saturating_sub(f.at_ms) / 60_000) as usize;
            if age >= minutes {
                continue;
            }
            let v = s
                .per_minute
                .entry(transport(&f.record))
                .or_insert_with(|| vec![0; minutes]);
            v[minutes - 1 - age] += 1;
        }
        s
    }

    /// Requests and failed requests per second over the last `secs` seconds, oldest first.
    pub fn per_second(&self, secs: usize) -> (Vec<u64>, Vec<u64>) {
        let mut all = vec![0; secs];
        let mut failed = vec![0; secs];
        for f in &self.requests {
            let age = (self.now_ms.saturating_sub(f.at_ms) / 1000) as usize;
            if age >= secs {
                continue;
            }
            all[secs - 1 - age] += 1;
            if is_failure(&f.record) {
                failed[secs - 1 - age] += 1;
            }
        }
        (all, failed)
    }
}

/// A request the client saw fail (not its own mistake, not its own hang-up).
pub fn is_failure(r: &RequestRecord) -> bool {
    !matches!(
        r.outcome.as_str(),
        "success" | "incomplete" | "caller_error" | "client_cancelled" | "model_not_found"
    )
}

/// `rebound(quota)` -> `rebound`.
/// How a request's turn reached the backend; records written before the transport was kept
/// were all HTTP.
pub fn transport(r: &RequestRecord) -> Transport {
    match &r.transport {
        Transport::Unknown(name) if name.is_empty() => Transport::Http,
        t => t.clone(),
    }
}

pub fn affinity_kind(affinity: &Affinity) -> &str {
    match affinity {
        Affinity::Reused => "reused",
        Affinity::NewBind => "new_bind",
        Affinity::Rebound(_) => "rebound",
        Affinity::None => "none",
        Affinity::Unknown(name) if name.is_empty() => "none",
        Affinity::Unknown(name) => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_ranks() {
        let p = Percentiles::of((1..=100).collect()).unwrap();
        assert_eq!((p.p50, p.p95, p.n), (51, 95, 100));
        assert_eq!(Percentiles::of(vec![]), None);
    }

    #[test]
    fn rfc3339_with_milliseconds_parses() {
        assert_eq!(parse_ms("1970-01-01T00:00:01.250Z"), Some(1250));
        assert_eq!(parse_ms("nonsense"), None);
    }

    #[test]
    fn affinity_kinds_drop_the_reason() {
        let kind = |name: &str| affinity_kind(&Affinity::from_name(name)).to_string();
        assert_eq!(kind("rebound(quota)"), "rebound");
        assert_eq!(kind("reused"), "reused");
        assert_eq!(kind(""), "none");
    }
}
