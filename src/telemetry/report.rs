//! The error report (`switchyard report`): read off request records, per window, with the
//! definitions of [`super::windows`] — and what an operator would conclude from them. The wire
//! shape and its text live in `switchyard_admin::report`.

use std::collections::BTreeMap;

use switchyard_admin::report::{
    AccountFailures, Chain, CreditSpendLine, FailureGroup, ModelMiss, PostCommit, Report,
    SlowFailure, Suggestion, SuggestionKind, TierUsage, WindowReport,
};
use switchyard_admin::wire::Class;

use super::records::{Outcome, RequestRecord};
use super::windows::{counts, finished_ms, is_upstream_error, tally};
use crate::fleet::AccountView;

/// A failed attempt slower than this ate its client's time (the default of `--slow`).
pub const SLOW_FAILURE_MS: u64 = 30_000;
/// A message this frequent without a rule is worth one.
pub const RULE_WORTHY: u64 = 3;

/// How the report names accounts: `chatgpt_account_id` -> (account id, label, priority).
pub type Names = BTreeMap<String, (String, String, i32)>;

pub fn names(accounts: &[AccountView]) -> Names {
    accounts
        .iter()
        .map(|a| {
            (
                a.chatgpt_account_id.clone(),
                (a.id.clone(), a.label.clone(), a.priority),
            )
        })
        .collect()
}

/// How long before a window the records are read: a request that started that much earlier
/// may still have finished in it.
pub const LONGEST_REQUEST_MS: u64 = 3600 * 1000;

/// The report of the stored records and of `recent` (the newest, in memory, which the store
/// may not have committed yet).
pub fn from_store(
    store: &crate::store::Store,
    recent: &[RequestRecord],
    scope: &Scope,
    names: &Names,
) -> Result<Report, crate::store::StoreError> {
    let widest = scope.windows.iter().copied().max().unwrap_or(60);
    let from = scope
        .now_ms
        .saturating_sub(widest.saturating_mul(60_000) + LONGEST_REQUEST_MS);
    let mut by_key: BTreeMap<u64, RequestRecord> = BTreeMap::new();
    for (key, row) in store.requests_since(from)? {
        match RequestRecord::from_row(key, row) {
            Ok(r) => {
                by_key.insert(key, r);
            }
            Err(e) => store.note_undecodable("requests", &format!("{key:016x}"), &e),
        }
    }
    for r in recent {
        by_key.entry(r.key).or_insert_with(|| r.clone());
    }
    let records: Vec<RequestRecord> = by_key.into_values().collect();
    let label = |chatgpt_or_id: &str| {
        names
            .iter()
            .find(|(c, (id, _, _))| *c == chatgpt_or_id || id == chatgpt_or_id)
            .map_or_else(|| chatgpt_or_id.to_string(), |(_, (_, l, _))| l.clone())
    };
    let mut spends: Vec<(u64, CreditSpendLine)> = store
        .load_credit_spends()?
        .into_iter()
        .filter(|(_, s)| s.started_ms >= from)
        .map(|(redeem, s)| {
            let line = CreditSpendLine {
                at: crate::base::clock::rfc3339(s.started_ms / 1000),
                account: label(&s.account),
                need: s.need,
                outcome: s.outcome.unwrap_or_else(|| "unsettled".into()),
                windows_reset: s.windows_reset,
                request: s.request.map(super::records::RequestLog::id_of),
                error: s.error.map(|e| format!("{e}; redeem id {redeem}")),
            };
            (s.started_ms, line)
        })
        .collect();
    spends.sort_by_key(|(at, _)| *at);
    let mut report = build(&records, scope, names);
    for w in &mut report.windows {
        let since = scope
            .now_ms
            .saturating_sub(w.minutes.saturating_mul(60_000));
        w.credit_spends = spends
            .iter()
            .filter(|(at, _)| *at > since)
            .map(|(_, l)| l.clone())
            .collect();
    }
    Ok(report)
}

/// What a report covers: its windows (minutes, ending at `now_ms`) and how slow a failure
/// must be to count as slow.
#[derive(Debug, Clone)]
pub struct Scope {
    pub now_ms: u64,
    pub windows: Vec<u64>,
    pub slow_ms: u64,
}

/// Builds the report of `records`.
pub fn build(records: &[RequestRecord], scope: &Scope, names: &Names) -> Report {
    let now_ms = scope.now_ms;
    let label = |chatgpt_id: &str| {
        names
            .get(chatgpt_id)
            .map_or_else(|| chatgpt_id.to_string(), |(_, l, _)| l.clone())
    };
    let mut out = Report {
        generated_at: crate::base::clock::rfc3339(now_ms / 1000),
        slow_ms: scope.slow_ms,
        ..Report::default()
    };
    for &minutes in &scope.windows {
        let from = now_ms.saturating_sub(minutes.saturating_mul(60_000));
        let in_window: Vec<&RequestRecord> = records
            .iter()
            .filter(|r| counts(r))
            .filter(|r| {
                let f = finished_ms(r);
                f > from && f <= now_ms
            })
            .collect();
        out.windows
            .push(window(&in_window, minutes, scope.slow_ms, &label));
    }
    if let Some(widest) = out.windows.iter().max_by_key(|w| w.minutes) {
        out.suggestions = suggest(widest, names);
    }
    out
}

fn rate(n: u64, d: u64) -> Option<f64> {
    (d > 0).then(|| n as f64 / d as f64)
}

fn window(
    records: &[&RequestRecord],
    minutes: u64,
    slow_ms: u64,
    label: &dyn Fn(&str) -> String,
) -> WindowReport {
    let mut w = WindowReport {
        minutes,
        ..WindowReport::default()
    };
    let mut chains: BTreeMap<String, Chain> = BTreeMap::new();
    let mut models: BTreeMap<String, u64> = BTreeMap::new();
    // account -> (attempts, (class, status, message, rule) -> count)
    type Groups = BTreeMap<(String, Option<u16>, String, Option<String>), u64>;
    let mut accounts: BTreeMap<String, (u64, Groups)> = BTreeMap::new();
    let mut tiers: BTreeMap<(String, String), TierUsage> = BTreeMap::new();
    for r in records {
        if matches!(r.outcome, Outcome::Success | Outcome::Incomplete) {
            let asked = r.service_tier.clone().unwrap_or_else(|| "default".into());
            let claimed = r.served_tier.clone().unwrap_or_else(|| "unknown".into());
            let t = tiers
                .entry((asked.clone(), claimed.clone()))
                .or_insert(TierUsage {
                    asked,
                    claimed,
                    ..TierUsage::default()
                });
            t.requests += 1;
            if let Some(u) = r.usage {
                t.input_tokens += u.input_tokens;
                t.output_tokens += u.output_tokens;
            }
        }
        let pool = tally(r);
        w.requests += pool.requests;
        w.client_errors += pool.client_errors;
        w.upstream_errors += pool.upstream_errors;
        let last = r.attempts.len().saturating_sub(1);
        let failed_over = r
            .attempts
            .iter()
            .enumerate()
            .any(|(i, a)| i < last && is_upstream_error(a));
        if failed_over {
            w.failovers += 1;
            if matches!(r.outcome, Outcome::Success | Outcome::Incomplete) {
                w.failovers_saved += 1;
            }
        }
        match r.outcome {
            Outcome::NoAccount | Outcome::QuotaExhausted => {
                w.exhausted += 1;
                let mut steps: Vec<String> = r
                    .attempts
                    .iter()
                    .map(|a| {
                        let status = a.status.map_or(String::new(), |s| format!(" {s}"));
                        format!("{}{status} {}", label(&a.account), a.class.as_str())
                    })
                    .collect();
                steps.push(if r.attempts.is_empty() {
                    "no candidate to try".to_string()
                } else {
                    "none left".to_string()
                });
                let chain = steps.join(" → ");
                let c = chains.entry(chain.clone()).or_insert(Chain {
                    chain,
                    ..Chain::default()
                });
                c.count += 1;
                if c.requests.len() < 5 {
                    c.requests.push(r.id());
                }
            }
            Outcome::ModelNotFound => *models.entry(r.model.clone()).or_default() += 1,
            Outcome::Failed | Outcome::StreamError => w.post_commit_failures.push(PostCommit {
                request: r.id(),
                account: r.account.as_deref().map(label),
                outcome: r.outcome.as_str().into(),
                error: r.attempts.last().and_then(|a| a.error.clone()),
            }),
            _ => {}
        }
        for (i, a) in r.attempts.iter().enumerate() {
            let entry = accounts.entry(a.account.clone()).or_default();
            entry.0 += 1;
            if !is_upstream_error(a) {
                continue;
            }
            if a.ms > slow_ms {
                w.slow_failures.push(SlowFailure {
                    request: r.id(),
                    account: label(&a.account),
                    class: a.class.as_str().into(),
                    ms: a.ms,
                    failed_over: i < last,
                });
            }
            let message = normalise(a.error.as_deref().unwrap_or(""), a.status);
            *entry
                .1
                .entry((
                    a.class.as_str().to_string(),
                    a.status,
                    message,
                    a.rule.clone(),
                ))
                .or_default() += 1;
        }
    }
    w.tiers = tiers.into_values().collect();
    w.client_error_rate = rate(w.client_errors, w.requests);
    w.upstream_error_rate = rate(w.upstream_errors, w.requests);
    w.failover_success_rate = rate(w.failovers_saved, w.failovers);
    let mut chains: Vec<Chain> = chains.into_values().collect();
    chains.sort_by(|a, b| b.count.cmp(&a.count).then(a.chain.cmp(&b.chain)));
    w.exhaustion_chains = chains;
    let mut models: Vec<ModelMiss> = models
        .into_iter()
        .map(|(model, count)| ModelMiss { model, count })
        .collect();
    models.sort_by(|a, b| b.count.cmp(&a.count).then(a.model.cmp(&b.model)));
    w.model_not_found = models;
    w.accounts = accounts
        .into_iter()
        .map(|(account, (attempts, groups))| {
            let mut failures: Vec<FailureGroup> = groups
                .into_iter()
                .map(|((class, status, message, rule), count)| FailureGroup {
                    class: class.as_str().into(),
                    status,
                    message,
                    count,
                    rule,
                })
                .collect();
            failures.sort_by(|a, b| b.count.cmp(&a.count).then(a.message.cmp(&b.message)));
            AccountFailures {
                account: label(&account),
                attempts,
                failures,
            }
        })
        .collect();
    w
}

/// A failure's message with what varies taken out — the status it starts with, numbers of two
/// digits or more (`#`), and ids (`…`) — so that repeats group together.
pub fn normalise(error: &str, status: Option<u16>) -> String {
    let mut text = error.trim();
    if let Some(s) = status
        && let Some(rest) = text.strip_prefix(&s.to_string())
    {
        text = rest.trim_start();
    }
    let mut out: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        let core = word.trim_matches(|c: char| !c.is_alphanumeric());
        let digits = core.chars().filter(char::is_ascii_digit).count();
        let alnum = core.chars().filter(char::is_ascii_alphanumeric).count();
        let w = if digits > 0 && alnum >= 12 {
            word.replacen(core, "…", 1)
        } else {
            collapse_numbers(word)
        };
        out.push(w);
    }
    let mut s = out.join(" ");
    if s.chars().count() > 120 {
        s = s.chars().take(119).collect::<String>() + "…";
    }
    s
}

fn collapse_numbers(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    let chars: Vec<char> = word.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i - start >= 2 {
                out.push('#');
            } else {
                out.extend(&chars[start..i]);
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

fn is_overload(g: &FailureGroup) -> bool {
    matches!(g.status, Some(502..=504 | 520..=529)) || g.message.to_lowercase().contains("overload")
}

/// What the numbers of the widest window suggest.
fn suggest(w: &WindowReport, names: &Names) -> Vec<Suggestion> {
    let mut out = Vec::new();
    let by_label = |label: &str| names.values().find(|(_, l, _)| l == label);
    // An account that carries most of the pool's overload errors.
    let overloads: Vec<(String, u64)> = w
        .accounts
        .iter()
        .map(|a| {
            (
                a.account.clone(),
                a.failures
                    .iter()
                    .filter(|g| is_overload(g))
                    .map(|g| g.count)
                    .sum(),
            )
        })
        .collect();
    let total: u64 = overloads.iter().map(|(_, n)| n).sum();
    if total >= RULE_WORTHY && w.accounts.len() > 1 {
        for (label, n) in &overloads {
            if n * 2 > total {
                let (id, priority) =
                    by_label(label).map_or((label.clone(), 0), |(id, _, p)| (id.clone(), *p));
                out.push(Suggestion {
                    kind: SuggestionKind::LowerPriority,
                    text: format!(
                        "{label} had {n} of the {total} overload errors: lower its priority so \
                         steadier accounts carry the load first (one change at a time, then \
                         compare the next window)"
                    ),
                    action: format!("switchyard account set {id} --priority {}", priority + 1),
                });
            }
        }
    }
    // Frequent messages that no rule judges, of a class a rule's cooldown acts on: a failure
    // the built-in classification judges by its meaning (a quota, a dead login, a model an
    // account lacks, the caller's own error) needs no rule, and one would change nothing.
    let mut frequent: BTreeMap<(Option<u16>, String), (u64, Class)> = BTreeMap::new();
    let cools = |g: &FailureGroup| {
        matches!(
            g.class,
            Class::Transient | Class::RateLimited | Class::EdgeChallenge
        )
    };
    for a in &w.accounts {
        for g in a.failures.iter().filter(|g| g.rule.is_none() && cools(g)) {
            let e = frequent
                .entry((g.status, g.message.clone()))
                .or_insert((0, g.class.clone()));
            e.0 += g.count;
        }
    }
    let mut frequent: Vec<_> = frequent.into_iter().collect();
    frequent.sort_by_key(|f| std::cmp::Reverse(f.1.0));
    for ((status, message), (count, class)) in frequent {
        if count < RULE_WORTHY {
            break;
        }
        // A record's error is "CODE message" when the answer had a code: a rule matches the
        // code on its own and the message on its own.
        let (code, text) = match message.split_once(' ') {
            Some((first, rest)) if is_code(first) => (Some(first), rest),
            _ if is_code(&message) => (Some(message.as_str()), ""),
            _ => (None, message.as_str()),
        };
        let fragment = fragment(text);
        if code.is_none() && fragment.is_none() {
            continue;
        }
        let name = fragment.as_deref().or(code).unwrap_or("frequent failure");
        let mut toml = format!(
            "[[rules]]\n# check the class and the cooldown before adding it\nname = \"{}\"\n",
            name.chars().take(40).collect::<String>().trim_end()
        );
        if let Some(s) = status {
            toml.push_str(&format!("status = [{s}]\n"));
        }
        if let Some(c) = code {
            toml.push_str(&format!("code = \"{c}\"\n"));
        }
        if let Some(f) = &fragment {
            toml.push_str(&format!("message_contains = [\"{f}\"]\n"));
        }
        toml.push_str(&format!("class = \"{class}\"\ncooldown = \"1m\"\n"));
        out.push(Suggestion {
            kind: SuggestionKind::AddRule,
            text: format!(
                "\"{message}\" came {count} times and no rule judges it: a rule to consider"
            ),
            action: toml,
        });
    }
    out
}

/// An error code: `snake_case`, one word.
fn is_code(word: &str) -> bool {
    word.contains('_')
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The longest stretch of a normalised message without placeholders, cut at a word within 60
/// characters, as a rule would match it (lower case).
fn fragment(message: &str) -> Option<String> {
    let best = message
        .split(['…', '#'])
        .map(|s| s.trim_matches(|c: char| !c.is_alphanumeric()))
        .max_by_key(|s| s.len())?
        .to_lowercase()
        .replace(['"', '\\'], "");
    let mut out = String::new();
    for word in best.split_whitespace() {
        if !out.is_empty() && out.len() + 1 + word.len() > 60 {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    let out = out
        .trim_end_matches(|c: char| !c.is_alphanumeric())
        .to_string();
    (out.len() >= 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_lose_what_varies() {
        assert_eq!(
            normalise(
                "503 server_is_overloaded Try again in 20s (ray 8f3a9b2c1d0e4f56)",
                Some(503)
            ),
            "server_is_overloaded Try again in #s (ray …)"
        );
        assert_eq!(normalise("gpt-5.5 is fine", None), "gpt-5.5 is fine");
        assert_eq!(fragment("Try again in #s").as_deref(), Some("try again in"));
        assert_eq!(
            fragment(
                "Our servers are currently overloaded. Please try again later, or much later on."
            )
            .as_deref(),
            Some("our servers are currently overloaded. please try again")
        );
        assert!(is_code("server_is_overloaded") && !is_code("Our"));
    }
}
