//! `/metrics` in the Prometheus text format. Counters and histograms are updated on the
//! request path with one short lock or an atomic add; per-account gauges are read from the
//! fleet at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::fleet::affinity::Decision;
use crate::fleet::health::Class;
use crate::fleet::scheduler::{QueueKind, QueueOutcome};
use crate::fleet::{AccountView, Fleet};
use crate::store::Store;
use crate::telemetry::records::Outcome;
use crate::upstream::Transport;
use crate::upstream::ws::BreakerState;

/// Upper bounds (seconds) of the latency buckets.
const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Upper bounds (seconds) of the gateway's own overhead per request: tens of microseconds up.
const OVERHEAD_BUCKETS: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new() -> Self {
        Self::with(&LATENCY_BUCKETS)
    }

    fn with(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Counts `d` in the one bucket it falls in (the lowest bound at or above it; above all
    /// of them, only in the count): one atomic add, where counting it in every bucket at or
    /// above it took one per bucket. The exposition sums them up.
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|bound| secs <= *bound) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        // Each bucket's line counts everything at or below its bound. `+Inf` is at least
        // their sum: an observation may be in its bucket and not yet in the count.
        let mut below = 0;
        for (bound, c) in self.bounds.iter().zip(&self.counts) {
            below += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {below}");
        }
        let count = self.count.load(Ordering::Relaxed).max(below);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braces} {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// A counter per label value.
#[derive(Debug, Default)]
struct Labeled(Mutex<BTreeMap<String, u64>>);

impl Labeled {
    fn inc(&self, label: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // A label seen before (nearly every one) is counted without copying it.
        match m.get_mut(label) {
            Some(n) => *n += 1,
            None => {
                m.insert(label.to_string(), 1);
            }
        }
    }

    fn render(&self, out: &mut String, name: &str, label: &str) {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in m.iter() {
            if label.contains('=') {
                let _ = writeln!(out, "{name}{{{k}}} {v}");
            } else {
                let _ = writeln!(out, "{name}{{{label}=\"{k}\"}} {v}");
            }
        }
    }
}

/// A counter per value of a named enum, by its index: an atomic add each, no lock. The
/// exposition shows the values counted at least once, in the order of their names, as
/// [`Labeled`] does.
#[derive(Debug)]
struct Tally {
    names: Vec<&'static str>,
    counts: Box<[AtomicU64]>,
}

impl Tally {
    fn of(names: impl IntoIterator<Item = &'static str>) -> Self {
        let names: Vec<_> = names.into_iter().collect();
        let counts = names.iter().map(|_| AtomicU64::new(0)).collect();
        Self { names, counts }
    }

    fn inc(&self, index: usize) {
        if let Some(c) = self.counts.get(index) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn render(&self, out: &mut String, name: &str, label: &str) {
        let mut seen: Vec<(&str, u64)> = self
            .names
            .iter()
            .zip(self.counts.iter())
            .map(|(k, c)| (*k, c.load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        seen.sort_unstable_by_key(|&(k, _)| k);
        for (k, v) in seen {
            let _ = writeln!(out, "{name}{{{label}=\"{k}\"}} {v}");
        }
    }
}

/// The gateway's counters.
#[derive(Debug)]
pub struct Metrics {
    requests: Tally,
    attempts: Tally,
    failovers: AtomicU64,
    affinity: Tally,
    queue_outcomes: Labeled,
    queue_wait_account: Histogram,
    queue_wait_pool: Histogram,
    upstream_headers: Histogram,
    upstream_first_output: Histogram,
    transports: Tally,
    ws_connect: Histogram,
    overhead: Histogram,
    credit_spends: Labeled,
    notifications: Labeled,
    warmups: Labeled,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Tally::of(Outcome::ALL.iter().map(|o| o.as_str())),
            attempts: Tally::of(Class::ALL.iter().map(|c| c.as_str())),
            failovers: AtomicU64::new(0),
            affinity: Tally::of(Decision::KINDS),
            queue_outcomes: Labeled::default(),
            queue_wait_account: Histogram::new(),
            queue_wait_pool: Histogram::new(),
            upstream_headers: Histogram::new(),
            upstream_first_output: Histogram::new(),
            transports: Tally::of(Transport::ALL.iter().map(|t| t.as_str())),
            ws_connect: Histogram::new(),
            overhead: Histogram::with(&OVERHEAD_BUCKETS),
            credit_spends: Labeled::default(),
            notifications: Labeled::default(),
            warmups: Labeled::default(),
        }
    }
}

/// One gauge line per account.
fn per_account(
    out: &mut String,
    accounts: &[AccountView],
    name: &str,
    help: &str,
    value: impl Fn(&AccountView) -> f64,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for a in accounts {
        let _ = writeln!(
            out,
            "{name}{{account=\"{}\"}} {}",
            escape(&a.chatgpt_account_id),
            value(a)
        );
    }
}

pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    pub fn request(&self, outcome: Outcome, affinity: &Decision) {
        self.requests.inc(outcome.index());
        self.affinity.inc(affinity.kind_index());
    }

    pub fn attempt(&self, class: Class) {
        self.attempts.inc(class.index());
    }

    /// A reset-credit spend ended with this outcome.
    pub fn credit_spend(&self, outcome: &str) {
        self.credit_spends.inc(outcome);
    }

    /// A warm-up request ended with this class.
    pub fn warmup(&self, class: &str) {
        self.warmups.inc(class);
    }

    /// A notification to a target was delivered (`delivered`) or given up (`failed`).
    pub fn notification(&self, target: &str, outcome: &str) {
        self.notifications
            .inc(&format!("target=\"{target}\",outcome=\"{outcome}\""));
    }

    pub fn failover(&self) {
        self.failovers.fetch_add(1, Ordering::Relaxed);
    }

    pub fn queue_wait(&self, kind: QueueKind, outcome: QueueOutcome, waited: Duration) {
        self.queue_outcomes.inc(&format!(
            "queue=\"{}\",outcome=\"{}\"",
            kind.as_str(),
            outcome.as_str()
        ));
        match kind {
            QueueKind::Account => self.queue_wait_account.observe(waited),
            QueueKind::Pool => self.queue_wait_pool.observe(waited),
        }
    }

    /// Time from sending an attempt to the upstream's response headers.
    pub fn upstream_headers(&self, d: Duration) {
        self.upstream_headers.observe(d);
    }

    /// Time from sending an attempt to its first committing event.
    pub fn upstream_first_output(&self, d: Duration) {
        self.upstream_first_output.observe(d);
    }

    /// How a turn reached the backend.
    pub fn transport(&self, decision: Transport) {
        self.transports.inc(decision.index());
    }

    pub fn ws_connect(&self, d: Duration) {
        self.ws_connect.observe(d);
    }

    /// A request's time in the gateway's own hands: from the dispatcher taking it to its
    /// record, less its attempts' time (the upstream's, and the stream's forwarding) and its
    /// waits for a slot.
    pub fn overhead(&self, d: Duration) {
        self.overhead.observe(d);
    }

    /// The whole exposition. `ws` is (idle pooled upstream sockets, breaker state).
    pub fn render(&self, fleet: &Fleet, store: &Store, ws: (usize, BreakerState)) -> String {
        let mut out = String::with_capacity(8192);
        let h = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        h(
            &mut out,
            "switchyard_requests_total",
            "counter",
            "Requests by outcome.",
        );
        self.requests
            .render(&mut out, "switchyard_requests_total", "outcome");
        h(
            &mut out,
            "switchyard_attempts_total",
            "counter",
            "Upstream attempts by failure class.",
        );
        self.attempts
            .render(&mut out, "switchyard_attempts_total", "class");
        h(
            &mut out,
            "switchyard_credit_spends_total",
            "counter",
            "Rate-limit reset credit spends by outcome.",
        );
        self.credit_spends
            .render(&mut out, "switchyard_credit_spends_total", "outcome");
        h(
            &mut out,
            "switchyard_notifications_total",
            "counter",
            "Notifications by target and delivery outcome.",
        );
        self.notifications.render(
            &mut out,
            "switchyard_notifications_total",
            "target=,outcome=",
        );
        h(
            &mut out,
            "switchyard_warmups_total",
            "counter",
            "Warm-up requests by the class of their answer.",
        );
        self.warmups
            .render(&mut out, "switchyard_warmups_total", "class");
        h(
            &mut out,
            "switchyard_failovers_total",
            "counter",
            "Moves of a request to another account.",
        );
        let _ = writeln!(
            out,
            "switchyard_failovers_total {}",
            self.failovers.load(Ordering::Relaxed)
        );
        h(
            &mut out,
            "switchyard_affinity_decisions_total",
            "counter",
            "Session affinity decisions.",
        );
        self.affinity
            .render(&mut out, "switchyard_affinity_decisions_total", "decision");
        h(
            &mut out,
            "switchyard_queue_outcomes_total",
            "counter",
            "How waits for a slot ended.",
        );
        self.queue_outcomes
            .render(&mut out, "switchyard_queue_outcomes_total", "queue=");
        h(
            &mut out,
            "switchyard_queue_wait_seconds",
            "histogram",
            "Time spent waiting for a slot.",
        );
        self.queue_wait_account.render(
            &mut out,
            "switchyard_queue_wait_seconds",
            "queue=\"account\"",
        );
        self.queue_wait_pool
            .render(&mut out, "switchyard_queue_wait_seconds", "queue=\"pool\"");
        h(
            &mut out,
            "switchyard_upstream_headers_seconds",
            "histogram",
            "Time to the upstream's response headers.",
        );
        self.upstream_headers
            .render(&mut out, "switchyard_upstream_headers_seconds", "");
        h(
            &mut out,
            "switchyard_upstream_first_output_seconds",
            "histogram",
            "Time to the first event a client renders.",
        );
        self.upstream_first_output
            .render(&mut out, "switchyard_upstream_first_output_seconds", "");

        h(
            &mut out,
            "switchyard_transport_decisions_total",
            "counter",
            "How turns reached the backend.",
        );
        self.transports.render(
            &mut out,
            "switchyard_transport_decisions_total",
            "transport",
        );
        h(
            &mut out,
            "switchyard_ws_connect_seconds",
            "histogram",
            "Time to open an upstream WebSocket.",
        );
        self.ws_connect
            .render(&mut out, "switchyard_ws_connect_seconds", "");
        h(
            &mut out,
            "switchyard_request_overhead_seconds",
            "histogram",
            "The gateway's own time per request: its total less its attempts and queue waits.",
        );
        self.overhead
            .render(&mut out, "switchyard_request_overhead_seconds", "");
        h(
            &mut out,
            "switchyard_ws_pool_idle",
            "gauge",
            "Idle upstream WebSockets kept for reuse.",
        );
        let _ = writeln!(out, "switchyard_ws_pool_idle {}", ws.0);
        h(
            &mut out,
            "switchyard_ws_breaker_open",
            "gauge",
            "1 while the WebSocket origin breaker is open or half-open.",
        );
        let _ = writeln!(
            out,
            "switchyard_ws_breaker_open {}",
            u8::from(ws.1 != BreakerState::Closed)
        );

        let accounts = fleet.list();
        h(
            &mut out,
            "switchyard_account_state",
            "gauge",
            "1 for the state each account is in.",
        );
        for a in &accounts {
            let _ = writeln!(
                out,
                "switchyard_account_state{{account=\"{}\",state=\"{}\"}} 1",
                escape(&a.chatgpt_account_id),
                a.state.as_str()
            );
        }
        per_account(
            &mut out,
            &accounts,
            "switchyard_account_limit",
            "Adaptive concurrency limit per account.",
            |a| (a.limit * 100.0).round() / 100.0,
        );
        per_account(
            &mut out,
            &accounts,
            "switchyard_account_in_flight",
            "Requests running per account.",
            |a| f64::from(a.in_flight),
        );
        h(
            &mut out,
            "switchyard_account_quota_used_percent",
            "gauge",
            "Usage of each account's windows.",
        );
        for a in &accounts {
            if let Some(q) = &a.quota {
                for (window, v) in [
                    ("primary", q.primary_used_percent),
                    ("secondary", q.secondary_used_percent),
                ] {
                    if let Some(v) = v {
                        let _ = writeln!(
                            out,
                            "switchyard_account_quota_used_percent{{account=\"{}\",window=\"{window}\"}} {v}",
                            escape(&a.chatgpt_account_id)
                        );
                    }
                }
            }
        }
        h(
            &mut out,
            "switchyard_account_reset_credits",
            "gauge",
            "Rate-limit reset credits each account can spend, as its last usage poll said.",
        );
        for a in &accounts {
            if let Some(n) = a.quota.as_ref().and_then(|q| q.reset_credits) {
                let _ = writeln!(
                    out,
                    "switchyard_account_reset_credits{{account=\"{}\"}} {n}",
                    escape(&a.chatgpt_account_id)
                );
            }
        }
        let (pool, sticky) = fleet.waiting();
        h(
            &mut out,
            "switchyard_queue_waiting",
            "gauge",
            "Requests waiting for a slot now.",
        );
        let _ = writeln!(out, "switchyard_queue_waiting{{queue=\"pool\"}} {pool}");
        let _ = writeln!(
            out,
            "switchyard_queue_waiting{{queue=\"account\"}} {sticky}"
        );
        h(
            &mut out,
            "switchyard_telemetry_dropped_total",
            "counter",
            "Telemetry writes dropped because the store writer was behind.",
        );
        let _ = writeln!(
            out,
            "switchyard_telemetry_dropped_total {}",
            store.dropped_writes()
        );
        h(
            &mut out,
            "switchyard_store_unsynced",
            "gauge",
            "1 while committed telemetry waits for its fsync (at most a second), else 0.",
        );
        let _ = writeln!(
            out,
            "switchyard_store_unsynced {}",
            u8::from(store.unsynced())
        );
        h(
            &mut out,
            "switchyard_store_undecodable_rows_total",
            "counter",
            "Stored rows that could not be decoded (each logged with its key and left out).",
        );
        let _ = writeln!(
            out,
            "switchyard_store_undecodable_rows_total {}",
            store.undecodable_rows()
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_shows_cumulative_buckets_from_one_count_per_observation() {
        let h = Histogram::with(&[0.001, 0.01, 0.1]);
        for ms in [0, 1, 5, 5, 50, 500] {
            h.observe(Duration::from_millis(ms));
        }
        let mut out = String::new();
        h.render(&mut out, "t", "q=\"a\"");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "t_bucket{q=\"a\",le=\"0.001\"} 2",
                "t_bucket{q=\"a\",le=\"0.01\"} 4",
                "t_bucket{q=\"a\",le=\"0.1\"} 5",
                "t_bucket{q=\"a\",le=\"+Inf\"} 6",
                "t_sum{q=\"a\"} 0.561",
                "t_count{q=\"a\"} 6",
            ]
        );
    }

    #[test]
    fn a_tally_shows_what_a_labeled_counter_shows() {
        let tally = Tally::of(Outcome::ALL.iter().map(|o| o.as_str()));
        let labeled = Labeled::default();
        let counted = [
            Outcome::Success,
            Outcome::Success,
            Outcome::QuotaExhausted,
            Outcome::ClientCancelled,
            Outcome::Success,
        ];
        for o in counted {
            tally.inc(o.index());
            labeled.inc(o.as_str());
        }
        let (mut a, mut b) = (String::new(), String::new());
        tally.render(&mut a, "r", "outcome");
        labeled.render(&mut b, "r", "outcome");
        assert_eq!(a, b);
        assert_eq!(a.lines().count(), 3, "{a}");
        // Every name is at its value's index.
        for o in Outcome::ALL {
            assert_eq!(tally.names[o.index()], o.as_str());
        }
        for d in [
            Decision::Reused,
            Decision::NewBind,
            Decision::Rebound(crate::fleet::affinity::Rebound::Failover),
            Decision::None,
        ] {
            assert_eq!(Decision::KINDS[d.kind_index()], d.kind());
        }
    }
}
