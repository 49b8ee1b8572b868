//! The error report (`switchyard report`, and the console's `R` overlay): what an operator
//! reads off a pool's request records, per time window — the clients' and the upstream's
//! error rates, how often failover saved a request, which requests ran out of candidates and
//! through which attempts, the models no account serves, failures after the answer had begun,
//! the slow failures that ate the clients' time, each account's failures by cause, and the
//! suggestions that follow from the numbers. The daemon computes it; this is its wire shape and
//! its text.

use serde::{Deserialize, Serialize};

use crate::names::wire_enum;
use crate::wire::{Class, Outcome};

wire_enum! {
    /// What a suggestion proposes.
    pub enum SuggestionKind {
        /// Put an account behind the others (`account set --priority`).
        LowerPriority => "lower_priority",
        /// An operator rule for failures the classification leaves as they are.
        AddRule => "add_rule",
    }
}

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// RFC 3339.
    pub generated_at: String,
    /// A failed attempt slower than this is a slow failure.
    #[serde(default)]
    pub slow_ms: u64,
    pub windows: Vec<WindowReport>,
    /// From the widest window.
    pub suggestions: Vec<Suggestion>,
}

/// One window's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowReport {
    pub minutes: u64,
    /// Requests that reached the pool (key refusals left out).
    pub requests: u64,
    pub client_errors: u64,
    pub client_error_rate: Option<f64>,
    /// Attempts the upstream failed.
    pub upstream_errors: u64,
    /// Per request.
    pub upstream_error_rate: Option<f64>,
    /// Requests that failed over after an upstream error.
    pub failovers: u64,
    /// Of those, the ones that ended well.
    pub failovers_saved: u64,
    pub failover_success_rate: Option<f64>,
    /// Requests that ran out of candidates (no account, or every one on quota).
    pub exhausted: u64,
    /// The attempt chains that led there, most frequent first.
    pub exhaustion_chains: Vec<Chain>,
    /// `model_not_found` answers by model.
    pub model_not_found: Vec<ModelMiss>,
    /// Failures after the answer had begun (nothing could be replayed).
    pub post_commit_failures: Vec<PostCommit>,
    /// Failed attempts that took longer than 30 s.
    pub slow_failures: Vec<SlowFailure>,
    /// Per account, its failures by class and message.
    pub accounts: Vec<AccountFailures>,
    /// Requests and tokens by the service tier asked for and the one the answer claimed.
    #[serde(default)]
    pub tiers: Vec<TierUsage>,
    /// Rate-limit reset credits spent (or tried), oldest first.
    #[serde(default)]
    pub credit_spends: Vec<CreditSpendLine>,
}

/// Usage of one (asked, claimed) pair of service tiers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TierUsage {
    /// The tier the request asked for (`default` when it named none).
    pub asked: String,
    /// The tier the answer claimed (`unknown` when it said none).
    pub claimed: String,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// One reset-credit spend.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreditSpendLine {
    /// RFC 3339.
    pub at: String,
    pub account: String,
    /// `when_dry`, `before_expiry` or `operator`.
    pub need: String,
    /// `reset`, `already_redeemed`, `nothing_to_reset`, `no_credit`, `failed` or `unsettled`.
    pub outcome: String,
    pub windows_reset: u64,
    /// The request whose need it met.
    pub request: Option<String>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Chain {
    /// `acct-1 503 transient → acct-2 429 rate_limited → none`.
    pub chain: String,
    pub count: u64,
    /// Some of the requests (at most 5).
    pub requests: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelMiss {
    pub model: String,
    pub count: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PostCommit {
    pub request: String,
    pub account: Option<String>,
    pub outcome: Outcome,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlowFailure {
    pub request: String,
    pub account: String,
    pub class: Class,
    pub ms: u64,
    /// Whether another attempt followed (the time was lost before failing over).
    pub failed_over: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AccountFailures {
    /// Its name as the operator knows it.
    pub account: String,
    pub attempts: u64,
    pub failures: Vec<FailureGroup>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailureGroup {
    pub class: Class,
    pub status: Option<u16>,
    /// The message with numbers and ids taken out, so repeats group together.
    pub message: String,
    pub count: u64,
    /// The operator rule that judged them, if one did.
    pub rule: Option<String>,
}

/// Something the numbers suggest doing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Suggestion {
    pub kind: SuggestionKind,
    pub text: String,
    /// A command to run, or a rule to consider (TOML).
    pub action: String,
}

fn pct(r: Option<f64>) -> String {
    r.map_or("–".to_string(), |r| format!("{:.1}%", r * 100.0))
}

/// The report as text for the terminal.
pub fn render_text(r: &Report) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "Switchyard error report · {}", r.generated_at);
    for w in &r.windows {
        let _ = writeln!(o, "\n== last {} minutes ==", w.minutes);
        let _ = writeln!(
            o,
            "requests {} · client errors {} ({}) · upstream errors {} ({} per request)",
            w.requests,
            w.client_errors,
            pct(w.client_error_rate),
            w.upstream_errors,
            pct(w.upstream_error_rate)
        );
        let _ = writeln!(
            o,
            "failovers {} · saved {} ({})",
            w.failovers,
            w.failovers_saved,
            pct(w.failover_success_rate)
        );
        let _ = writeln!(o, "ran out of candidates: {}", w.exhausted);
        for c in &w.exhaustion_chains {
            let _ = writeln!(o, "  {}× {}  ({})", c.count, c.chain, c.requests.join(", "));
        }
        if !w.model_not_found.is_empty() {
            let _ = writeln!(o, "models no account serves:");
            for m in &w.model_not_found {
                let _ = writeln!(
                    o,
                    "  {}× {}: no account supports {}: fix the client's config, do not map it",
                    m.count, m.model, m.model
                );
            }
        }
        let _ = writeln!(
            o,
            "failures after the answer began: {}",
            w.post_commit_failures.len()
        );
        for p in &w.post_commit_failures {
            let _ = writeln!(
                o,
                "  {} {} on {}: {}",
                p.request,
                p.outcome,
                p.account.as_deref().unwrap_or("–"),
                p.error.as_deref().unwrap_or("")
            );
        }
        let _ = writeln!(
            o,
            "failures slower than {} s: {}",
            r.slow_ms as f64 / 1000.0,
            w.slow_failures.len()
        );
        for s in &w.slow_failures {
            let _ = writeln!(
                o,
                "  {} on {}: {} after {:.1} s{}",
                s.request,
                s.account,
                s.class,
                s.ms as f64 / 1000.0,
                if s.failed_over {
                    ", then failed over"
                } else {
                    ""
                }
            );
        }
        let _ = writeln!(o, "per account:");
        if w.accounts.is_empty() {
            let _ = writeln!(o, "  no attempts");
        }
        for a in &w.accounts {
            let failed: u64 = a.failures.iter().map(|f| f.count).sum();
            let _ = writeln!(
                o,
                "  {}: {} attempts, {} failed",
                a.account, a.attempts, failed
            );
            for f in &a.failures {
                let _ = writeln!(
                    o,
                    "    {}× {}{} {}{}",
                    f.count,
                    f.class,
                    f.status.map_or(String::new(), |s| format!(" {s}")),
                    f.message,
                    f.rule
                        .as_ref()
                        .map_or(String::new(), |r| format!(" [rule {r}]"))
                );
            }
        }
    }
    if let Some(w) = r.windows.iter().max_by_key(|w| w.minutes) {
        let _ = writeln!(o, "\n== service tiers, last {} minutes ==", w.minutes);
        let _ = writeln!(
            o,
            "asked → claimed by the answer (the answer's tier is the backend's claim, not proof of what ran)"
        );
        if w.tiers.is_empty() {
            let _ = writeln!(o, "  no answered requests");
        }
        for t in &w.tiers {
            let _ = writeln!(
                o,
                "  {} → {}: {} requests, {} input and {} output tokens",
                t.asked, t.claimed, t.requests, t.input_tokens, t.output_tokens
            );
        }
        let _ = writeln!(o, "\n== reset credits spent, last {} minutes ==", w.minutes);
        if w.credit_spends.is_empty() {
            let _ = writeln!(o, "  none");
        }
        for c in &w.credit_spends {
            let _ = writeln!(
                o,
                "  {} {} ({}): {}{}{}{}",
                c.at,
                c.account,
                c.need,
                c.outcome,
                if c.windows_reset > 0 {
                    format!(", {} window(s) reset", c.windows_reset)
                } else {
                    String::new()
                },
                c.request
                    .as_ref()
                    .map_or(String::new(), |r| format!(", for {r}")),
                c.error
                    .as_ref()
                    .map_or(String::new(), |e| format!(" ({e})"))
            );
        }
    }
    let _ = writeln!(o, "\n== suggestions ==");
    if r.suggestions.is_empty() {
        let _ = writeln!(o, "none: nothing in the numbers calls for a change");
    }
    for s in &r.suggestions {
        let _ = writeln!(o, "- {}", s.text);
        for line in s.action.lines() {
            let _ = writeln!(o, "    {line}");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_every_section() {
        let r = Report {
            generated_at: "2026-12-01T10:00:00Z".into(),
            slow_ms: 30_000,
            windows: vec![WindowReport {
                minutes: 20,
                requests: 10,
                client_errors: 1,
                client_error_rate: Some(0.1),
                upstream_errors: 3,
                upstream_error_rate: Some(0.3),
                failovers: 2,
                failovers_saved: 1,
                failover_success_rate: Some(0.5),
                exhausted: 1,
                exhaustion_chains: vec![Chain {
                    chain: "a 503 transient → none".into(),
                    count: 1,
                    requests: vec!["req_1".into()],
                }],
                model_not_found: vec![ModelMiss {
                    model: "gpt-x".into(),
                    count: 2,
                }],
                post_commit_failures: vec![PostCommit {
                    request: "req_2".into(),
                    account: Some("a".into()),
                    outcome: Outcome::StreamError,
                    error: Some("reset".into()),
                }],
                slow_failures: vec![SlowFailure {
                    request: "req_3".into(),
                    account: "a".into(),
                    class: Class::Transient,
                    ms: 31_500,
                    failed_over: true,
                }],
                accounts: vec![AccountFailures {
                    account: "a".into(),
                    attempts: 5,
                    failures: vec![FailureGroup {
                        class: Class::Transient,
                        status: Some(503),
                        message: "overloaded".into(),
                        count: 3,
                        rule: Some("soft".into()),
                    }],
                }],
                tiers: vec![TierUsage {
                    asked: "priority".into(),
                    claimed: "default".into(),
                    requests: 4,
                    input_tokens: 100,
                    output_tokens: 20,
                }],
                credit_spends: vec![CreditSpendLine {
                    at: "2026-12-01T09:59:00Z".into(),
                    account: "a".into(),
                    need: "when_dry".into(),
                    outcome: "reset".into(),
                    windows_reset: 2,
                    request: Some("req_4".into()),
                    error: None,
                }],
            }],
            suggestions: vec![Suggestion {
                kind: SuggestionKind::AddRule,
                text: "a rule to consider".into(),
                action: "[[rules]]\nname = \"x\"".into(),
            }],
        };
        let t = render_text(&r);
        for s in [
            "== last 20 minutes ==",
            "requests 10 · client errors 1 (10.0%) · upstream errors 3 (30.0% per request)",
            "failovers 2 · saved 1 (50.0%)",
            "1× a 503 transient → none  (req_1)",
            "2× gpt-x: no account supports gpt-x: fix the client's config, do not map it",
            "req_2 stream_error on a: reset",
            "req_3 on a: transient after 31.5 s, then failed over",
            "a: 5 attempts, 3 failed",
            "3× transient 503 overloaded [rule soft]",
            "not proof of what ran",
            "priority → default: 4 requests, 100 input and 20 output tokens",
            "2026-12-01T09:59:00Z a (when_dry): reset, 2 window(s) reset, for req_4",
            "- a rule to consider",
            "    [[rules]]",
        ] {
            assert!(t.contains(s), "`{s}` missing from:\n{t}");
        }
    }
}
