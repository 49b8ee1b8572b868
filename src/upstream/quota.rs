//! The account's usage windows as the backend reports them: `x-codex-*` headers on every
//! response, and the `wham/usage` document.

use reqwest::header::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::failure::Facts;

/// The rate-limit headers' names after their common prefix, in the order of [`Read`]'s slots.
const PREFIX: &str = "x-codex-";
const NAMES: [&str; 9] = [
    "primary-used-percent",
    "primary-window-minutes",
    // A reset as a time, or else as seconds from now.
    "primary-reset-at",
    "primary-reset-after-seconds",
    "secondary-used-percent",
    "secondary-window-minutes",
    "secondary-reset-at",
    "secondary-reset-after-seconds",
    "plan-type",
];

/// The first value of each rate-limit header, found in one pass over an answer's headers
/// (instead of one hashed lookup per name: every response is read for them).
struct Read<'a>([Option<&'a HeaderValue>; 9]);

impl<'a> Read<'a> {
    fn of(h: &'a HeaderMap) -> Read<'a> {
        let mut slots = [None; 9];
        for (name, value) in h {
            let Some(rest) = name.as_str().strip_prefix(PREFIX) else {
                continue;
            };
            if let Some(i) = NAMES.iter().position(|n| *n == rest) {
                // A name's values come in order: its first is what a lookup would give.
                slots[i].get_or_insert(value);
            }
        }
        Read(slots)
    }

    fn text(&self, i: usize) -> Option<&'a str> {
        self.0[i].and_then(|v| v.to_str().ok()).map(str::trim)
    }

    fn float(&self, i: usize) -> Option<f64> {
        self.text(i).and_then(|v| v.parse::<f64>().ok())
    }

    fn whole(&self, i: usize) -> Option<u64> {
        self.float(i).map(|v| v.max(0.0) as u64)
    }
}

/// The last known usage of an account's windows (primary: 5 hours, secondary: weekly).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QuotaSnapshot {
    pub primary_used_percent: Option<f64>,
    pub primary_window_minutes: Option<u64>,
    /// Unix seconds.
    pub primary_reset_at: Option<u64>,
    pub secondary_used_percent: Option<f64>,
    pub secondary_window_minutes: Option<u64>,
    pub secondary_reset_at: Option<u64>,
    pub plan: Option<String>,
    /// Rate-limit reset credits the account can spend (`rate_limit_reset_credits.
    /// available_count` of the usage; answer headers do not carry it).
    pub reset_credits: Option<u64>,
    /// When the soonest of them expires (unix seconds), from the credits list.
    #[serde(default)]
    pub credit_expires_at: Option<u64>,
    /// Unix ms when this was observed.
    pub observed_ms: u64,
}

impl QuotaSnapshot {
    /// Reads the rate-limit headers; `None` when the response carries none.
    pub fn from_headers(h: &HeaderMap, now_ms: u64) -> Option<QuotaSnapshot> {
        let r = Read::of(h);
        let now_s = now_ms / 1000;
        let reset = |at: usize| r.whole(at).or_else(|| r.whole(at + 1).map(|s| now_s + s));
        let snap = QuotaSnapshot {
            primary_used_percent: r.float(0),
            primary_window_minutes: r.whole(1),
            primary_reset_at: reset(2),
            secondary_used_percent: r.float(4),
            secondary_window_minutes: r.whole(5),
            secondary_reset_at: reset(6),
            plan: r.text(8).map(str::to_string),
            reset_credits: None,
            credit_expires_at: None,
            observed_ms: now_ms,
        };
        (snap.primary_used_percent.is_some()
            || snap.secondary_used_percent.is_some()
            || snap.plan.is_some())
        .then_some(snap)
    }

    /// Reads a `wham/usage` document.
    pub fn from_usage(v: &Value, now_ms: u64) -> QuotaSnapshot {
        let now_s = now_ms / 1000;
        let window = |w: &Value| {
            let used = w["used_percent"].as_f64();
            let minutes = w["limit_window_seconds"].as_u64().map(|s| s / 60);
            let reset = w["reset_at"]
                .as_u64()
                .or_else(|| w["reset_after_seconds"].as_u64().map(|s| now_s + s));
            (used, minutes, reset)
        };
        let (pu, pm, pr) = window(&v["rate_limit"]["primary_window"]);
        let (su, sm, sr) = window(&v["rate_limit"]["secondary_window"]);
        QuotaSnapshot {
            primary_used_percent: pu,
            primary_window_minutes: pm,
            primary_reset_at: pr,
            secondary_used_percent: su,
            secondary_window_minutes: sm,
            secondary_reset_at: sr,
            plan: v["plan_type"].as_str().map(str::to_string),
            reset_credits: v["rate_limit_reset_credits"]["available_count"].as_u64(),
            credit_expires_at: None,
            observed_ms: now_ms,
        }
    }

    /// Whether the account has one usage window only (the usage names no secondary): its
    /// windows cannot be reset with a credit.
    pub fn single_window(&self) -> bool {
        self.secondary_used_percent.is_none() && self.secondary_window_minutes.is_none()
    }

    /// The facts of a window still used up (the 5-hour one first), for the classifier: the
    /// quota is exhausted until that window resets. `None` while both have room.
    pub fn exhaustion(&self) -> Option<Facts> {
        let full = |p: Option<f64>| p.is_some_and(|p| p >= 100.0);
        let resets_at = if full(self.primary_used_percent) {
            self.primary_reset_at
        } else if full(self.secondary_used_percent) {
            self.secondary_reset_at
        } else {
            return None;
        };
        Some(Facts::usage_exhausted(resets_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rate_limit_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-codex-primary-used-percent", "12.5".parse().unwrap());
        h.insert("x-codex-primary-window-minutes", "300".parse().unwrap());
        h.insert("x-codex-primary-reset-after-seconds", "60".parse().unwrap());
        h.insert("x-codex-secondary-used-percent", "40".parse().unwrap());
        h.insert("x-codex-secondary-reset-at", "1767225600".parse().unwrap());
        h.insert("x-codex-plan-type", "plus".parse().unwrap());
        let q = QuotaSnapshot::from_headers(&h, 1_000_000).unwrap();
        assert_eq!(q.primary_used_percent, Some(12.5));
        assert_eq!(q.primary_reset_at, Some(1_060));
        assert_eq!(q.secondary_reset_at, Some(1_767_225_600));
        assert_eq!(q.plan.as_deref(), Some("plus"));
        assert!(QuotaSnapshot::from_headers(&HeaderMap::new(), 0).is_none());
        // A reset time wins over seconds from now.
        h.insert("x-codex-primary-reset-at", "1767225700".parse().unwrap());
        let q = QuotaSnapshot::from_headers(&h, 1_000_000).unwrap();
        assert_eq!(q.primary_reset_at, Some(1_767_225_700));
    }

    #[test]
    fn the_first_value_of_a_repeated_header_counts_as_a_lookup_would_give_it() {
        let mut h = HeaderMap::new();
        h.insert("x-codex-other", "7".parse().unwrap());
        h.insert(
            "x-codex-secondary-window-minutes",
            " 10080 ".parse().unwrap(),
        );
        h.append("x-codex-primary-used-percent", "30".parse().unwrap());
        h.append("x-codex-primary-used-percent", "99".parse().unwrap());
        h.append("x-codex-plan-type", "pro".parse().unwrap());
        h.append("x-codex-plan-type", "free".parse().unwrap());
        let q = QuotaSnapshot::from_headers(&h, 0).unwrap();
        assert_eq!(
            (
                q.primary_used_percent,
                q.secondary_window_minutes,
                q.plan.as_deref()
            ),
            (Some(30.0), Some(10_080), Some("pro"))
        );
        assert_eq!(
            (q.primary_window_minutes, q.secondary_used_percent),
            (None, None)
        );
    }

    #[test]
    fn reads_the_usage_document() {
        let v: Value = serde_json::from_str(r#"{"plan_type":"pro","rate_limit":{"primary_window":{"used_percent":12,"limit_window_seconds":18000,"reset_after_seconds":9000,"reset_at":1767225600},"secondary_window":{"used_percent":3,"limit_window_seconds":604800,"reset_after_seconds":100}}}"#).unwrap();
        let q = QuotaSnapshot::from_usage(&v, 5_000);
        assert_eq!(q.primary_used_percent, Some(12.0));
        assert_eq!(q.primary_window_minutes, Some(300));
        assert_eq!(q.secondary_reset_at, Some(105));
        assert_eq!(q.plan.as_deref(), Some("pro"));
        assert_eq!(q.reset_credits, None);
        assert!(q.exhaustion().is_none());
        let with: Value =
            serde_json::from_str(r#"{"rate_limit_reset_credits":{"available_count":2}}"#).unwrap();
        assert_eq!(
            QuotaSnapshot::from_usage(&with, 5_000).reset_credits,
            Some(2)
        );
        let full = QuotaSnapshot {
            secondary_used_percent: Some(100.0),
            ..q
        };
        assert_eq!(full.exhaustion().unwrap().resets_at, Some(105));
    }
}
