//! The edge: domain values converted to the admin API's and the console's wire shapes
//! (`switchyard-tui::wire`). Times become RFC 3339, enums their names, numbers are rounded for
//! display — here, and nowhere else. The CLI prints what it gets from here (directly, or from
//! the daemon's API), so both paths look the same.

use std::collections::{BTreeMap, HashMap};

use switchyard_admin::wire;

use crate::base::clock;
use crate::fleet::affinity::Decision;
use crate::fleet::health::AccountState;
use crate::fleet::settings::AccountChange;
use crate::fleet::{AccountView, Imported};
use crate::keys::CreatedKey;
use crate::keys::policy::{Policy, PolicyPatch};
use crate::store::records::{ClientKeyRecord, UsageBucketRow};
use crate::telemetry::records::RequestRecord;
use crate::telemetry::windows::Window;

pub fn account(a: &AccountView) -> wire::Account {
    let rfc = |s: Option<u64>| s.map(clock::rfc3339);
    wire::Account {
        id: a.id.clone(),
        label: a.label.clone(),
        email: a.email.clone(),
        plan: a.plan.clone(),
        chatgpt_account_id: a.chatgpt_account_id.clone(),
        enabled: a.enabled,
        state: a.state.as_str().into(),
        created_at: clock::rfc3339(a.created_at),
        reason: a.reason.map(|c| c.as_str().into()),
        detail: a.reauth.map(|r| r.advice_for(&a.id, a.access_token_only)),
        cooldown_until: rfc(a.cooldown_until_ms.map(|ms| ms.div_ceil(1000))),
        cooldown_remaining_s: a
            .cooldown_until_ms
            .map(|until| until.saturating_sub(a.at_ms).div_ceil(1000)),
        level: a.level,
        last_error: a.last_error.clone(),
        in_flight: a.in_flight,
        limit: a.limit.floor() as u32,
        limit_exact: (a.limit * 100.0).round() / 100.0,
        max_concurrency: a.max_concurrency,
        priority: a.priority,
        waiting: a.waiting,
        oldest_wait_ms: a.oldest_wait_ms,
        draining: a.draining,
        unsupported_models: a.unsupported_models.clone(),
        quota: a.quota.as_ref().map(|q| wire::Quota {
            primary_used_percent: q.primary_used_percent,
            primary_reset_at: rfc(q.primary_reset_at),
            secondary_used_percent: q.secondary_used_percent,
            secondary_reset_at: rfc(q.secondary_reset_at),
            plan: q.plan.clone(),
            observed_at: Some(clock::rfc3339(q.observed_ms / 1000)),
            reset_credits: q.reset_credits,
            reset_credit_expires_at: rfc(q.credit_expires_at),
        }),
        proxy: a.proxy.clone(),
        login: if a.access_token_only {
            wire::Login::AccessToken
        } else {
            wire::Login::Chatgpt
        },
        token_expires_at: a.token_expires_at.map(clock::rfc3339),
        origin: a.origin.clone(),
        routing_error: a.routing_error.clone(),
        error_rates: Vec::new(),
    }
}

/// The pool's error rates of each window.
pub fn pool_rates(windows: &[Window]) -> Vec<wire::ErrorRates> {
    windows
        .iter()
        .map(|w| wire::ErrorRates {
            window_minutes: w.minutes,
            requests: w.pool.requests,
            attempts: w.pool.attempts,
            client_error_rate: w.pool.client_rate(),
            upstream_error_rate: w.pool.upstream_rate_per_request(),
        })
        .collect()
}

/// Accounts with their error rates of each window.
pub fn accounts_with_rates(list: &[AccountView], windows: &[Window]) -> Vec<wire::Account> {
    list.iter()
        .map(|a| {
            let mut w = account(a);
            w.error_rates = windows
                .iter()
                .map(|win| {
                    let t = win
                        .accounts
                        .get(&a.chatgpt_account_id)
                        .copied()
                        .unwrap_or_default();
                    wire::ErrorRates {
                        window_minutes: win.minutes,
                        requests: t.requests,
                        attempts: t.attempts,
                        client_error_rate: t.client_rate(),
                        upstream_error_rate: t.upstream_rate_per_attempt(),
                    }
                })
                .collect();
            w
        })
        .collect()
}

pub fn accounts(list: &[AccountView]) -> Vec<wire::Account> {
    list.iter().map(account).collect()
}

/// Accounts per state, by the state's name.
pub fn by_state(counts: BTreeMap<AccountState, usize>) -> BTreeMap<String, usize> {
    counts
        .into_iter()
        .map(|(state, n)| (state.as_str().to_string(), n))
        .collect()
}

pub fn imported(i: &Imported) -> wire::ImportedAccount {
    wire::ImportedAccount {
        account: account(&i.account),
        created: i.created,
        unchanged: i.unchanged.clone(),
    }
}

pub fn key(k: &ClientKeyRecord) -> wire::Key {
    wire::Key {
        id: k.id.clone(),
        name: k.name.clone(),
        prefix: k.prefix.clone(),
        enabled: k.enabled,
        created_at: clock::rfc3339(k.created_at),
        revoked_at: k.revoked_at.map(clock::rfc3339),
        policy: key_policy(&Policy::from_row(&k.policy)),
    }
}

pub fn key_policy(p: &Policy) -> wire::KeyPolicy {
    wire::KeyPolicy {
        models: p.models.clone(),
        max_concurrency: p.max_concurrency,
        rpm: p.rpm,
        tokens_per_5h: p.tokens_per_5h,
        tokens_per_day: p.tokens_per_day,
        tokens_per_week: p.tokens_per_week,
        expires_at: p.expires_at.map(clock::rfc3339),
        note: p.note.clone(),
        tiers: p.tiers.clone(),
    }
}

/// An account change as the admin API sends it, as the fleet takes it.
pub fn account_change(p: wire::AccountPatch) -> AccountChange {
    AccountChange {
        label: p.label,
        priority: p.priority,
        max_concurrency: p.max_concurrency,
        proxy: p.proxy,
    }
}

/// A policy change as the admin API sends it, as the key ring takes it.
pub fn policy_patch(p: wire::KeyPolicyPatch) -> PolicyPatch {
    PolicyPatch {
        models: p.models,
        tiers: p.tiers,
        max_concurrency: p.max_concurrency,
        rpm: p.rpm,
        tokens_per_5h: p.tokens_per_5h,
        tokens_per_day: p.tokens_per_day,
        tokens_per_week: p.tokens_per_week,
        expires_at: p.expires_at,
        note: p.note,
    }
}

/// The admin API's shape of a bucket; `names` maps key ids to names.
pub fn usage_bucket(r: UsageBucketRow, names: &HashMap<String, String>) -> wire::UsageBucket {
    wire::UsageBucket {
        key: names
            .get(&r.key_id)
            .cloned()
            .unwrap_or_else(|| r.key_id.clone()),
        hour: r.hour,
        key_id: r.key_id,
        model: r.model,
        account: r.account,
        requests: r.requests,
        errors: r.errors,
        input_tokens: r.input_tokens,
        cached_tokens: r.cached_tokens,
        output_tokens: r.output_tokens,
        reasoning_tokens: r.reasoning_tokens,
        duration_ms: r.duration_ms,
    }
}

pub fn exported((a, auth): &(AccountView, serde_json::Value)) -> wire::ExportedAccount {
    wire::ExportedAccount {
        auth: auth.clone(),
        account: account(a),
    }
}

pub fn budget(b: &crate::keys::usage::BudgetState) -> wire::Budget {
    wire::Budget {
        window: b.window.as_str().into(),
        limit: b.limit,
        used: b.used,
        resets_in_s: b.resets_in_s.filter(|_| b.exhausted),
    }
}

pub fn keys(list: &[ClientKeyRecord]) -> Vec<wire::Key> {
    list.iter().map(key).collect()
}

pub fn created_key(k: &CreatedKey) -> wire::CreatedKey {
    wire::CreatedKey {
        info: key(&k.info),
        key: k.key.clone(),
    }
}

pub fn request(r: &RequestRecord) -> wire::RequestRecord {
    wire::RequestRecord {
        id: r.id(),
        started_at: clock::rfc3339_ms(r.started_ms),
        key: r.key_name.clone(),
        model: r.model.clone(),
        stream: r.stream,
        outcome: r.outcome.as_str().into(),
        status: r.status,
        account: r.account.clone(),
        attempts: r
            .attempts
            .iter()
            .map(|a| wire::Attempt {
                account: a.account.clone(),
                class: a.class.as_str().into(),
                status: a.status,
                phase: a.phase.map(|p| p.as_str().into()),
                ms: a.ms,
                error: a.error.clone(),
                rule: a.rule.clone(),
            })
            .collect(),
        ttft_ms: r.ttft_ms,
        duration_ms: r.duration_ms,
        usage: r.usage.map(|u| wire::Usage {
            input_tokens: u.input_tokens,
            cached_tokens: u.cached_tokens,
            output_tokens: u.output_tokens,
            reasoning_tokens: u.reasoning_tokens,
        }),
        path: r.path.to_string(),
        session: r.session.clone(),
        candidate_pool: r.candidate_pool.iter().map(|id| id.to_string()).collect(),
        skipped: r
            .skipped
            .iter()
            .map(|(account, reason)| wire::Skip {
                account: account.clone(),
                reason: reason.as_str().into(),
            })
            .collect(),
        affinity: affinity(&r.affinity),
        queue: r.queue.map(|q| wire::QueueWait {
            queue: q.kind.as_str().into(),
            outcome: q.outcome.as_str().into(),
            wait_ms: q.wait_ms,
        }),
        cached_tokens: r.usage.map(|u| u.cached_tokens),
        transport: r.transport.as_str().into(),
        ws: r.ws,
        ws_connect_ms: r.ws_connect_ms,
        terminal_source: r.terminal_source.map(|t| t.as_str().into()),
        service_tier: r.service_tier.clone(),
        served_tier: r.served_tier.clone(),
        credit_spend: r.credit.as_ref().map(|c| credit_spend(c, None, None)),
    }
}

/// A reset-credit spend, with why and when where known.
pub fn credit_spend(
    c: &crate::telemetry::records::CreditSpend,
    need: Option<&str>,
    at_ms: Option<u64>,
) -> wire::CreditSpend {
    wire::CreditSpend {
        account: c.account.clone(),
        redeem_id: c.redeem_id.clone(),
        outcome: c.outcome.clone(),
        windows_reset: c.windows_reset,
        error: c.error.clone(),
        need: need.map(str::to_string),
        at: at_ms.map(|ms| clock::rfc3339(ms / 1000)),
    }
}

fn affinity(d: &Decision) -> wire::Affinity {
    match d {
        Decision::Reused => wire::Affinity::Reused,
        Decision::NewBind => wire::Affinity::NewBind,
        Decision::Rebound(why) => wire::Affinity::Rebound(why.as_str().into()),
        Decision::None => wire::Affinity::None,
    }
}

pub fn requests(list: &[RequestRecord]) -> Vec<wire::RequestRecord> {
    list.iter().map(request).collect()
}

/// The store's report for `doctor`.
pub fn store_report(
    store: &crate::store::Store,
    scan: crate::store::scan::Scan,
) -> wire::StoreReport {
    wire::StoreReport {
        state_dir: store
            .path()
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        rows: scan.rows,
        quarantined: store
            .quarantined()
            .into_iter()
            .map(|q| wire::QuarantinedRow {
                table: q.table,
                key: q.key,
                error: q.error,
            })
            .collect(),
        without_tokens: scan.without_tokens,
        key_id: store.key_id().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::health::Class;
    use crate::fleet::scheduler::{QueueKind, QueueOutcome, SkipReason};
    use crate::keys::policy::Window;
    use crate::telemetry::records::{Outcome, TerminalSource};
    use crate::upstream::Transport;
    use crate::upstream::failure::Phase;
    use crate::upstream::ws::BreakerState;

    /// Every name the daemon writes is one the admin wire knows, so no reader sees a value of
    /// this very release as unknown.
    #[test]
    fn every_name_the_daemon_writes_is_known_to_the_wire() {
        fn known<W: PartialEq + std::fmt::Debug>(
            names: impl IntoIterator<Item = &'static str>,
            read: impl Fn(&str) -> W,
            is_known: impl Fn(&W) -> bool,
        ) {
            for name in names {
                assert!(is_known(&read(name)), "`{name}` is not known to the wire");
            }
        }
        known(
            AccountState::ALL.iter().map(|v| v.as_str()),
            wire::AccountState::from_name,
            wire::AccountState::is_known,
        );
        known(
            Class::ALL.iter().map(|v| v.as_str()),
            wire::Class::from_name,
            wire::Class::is_known,
        );
        known(
            Phase::ALL.iter().map(|v| v.as_str()),
            wire::Phase::from_name,
            wire::Phase::is_known,
        );
        known(
            Outcome::ALL.iter().map(|v| v.as_str()),
            wire::Outcome::from_name,
            wire::Outcome::is_known,
        );
        known(
            Transport::ALL.iter().map(|v| v.as_str()),
            wire::Transport::from_name,
            wire::Transport::is_known,
        );
        known(
            TerminalSource::ALL.iter().map(|v| v.as_str()),
            wire::TerminalSource::from_name,
            wire::TerminalSource::is_known,
        );
        known(
            SkipReason::ALL.iter().map(|v| v.as_str()),
            wire::SkipReason::from_name,
            wire::SkipReason::is_known,
        );
        known(
            QueueKind::ALL.iter().map(|v| v.as_str()),
            wire::QueueKind::from_name,
            wire::QueueKind::is_known,
        );
        known(
            QueueOutcome::ALL.iter().map(|v| v.as_str()),
            wire::QueueOutcome::from_name,
            wire::QueueOutcome::is_known,
        );
        known(
            BreakerState::ALL.iter().map(|v| v.as_str()),
            wire::BreakerState::from_name,
            wire::BreakerState::is_known,
        );
        known(
            Window::ALL.iter().map(|v| v.as_str()),
            wire::BudgetWindow::from_name,
            wire::BudgetWindow::is_known,
        );
        // And the wire knows no name the daemon does not write.
        assert_eq!(wire::AccountState::KNOWN.len(), AccountState::ALL.len());
        assert_eq!(wire::Class::KNOWN.len(), Class::ALL.len());
        assert_eq!(wire::Outcome::KNOWN.len(), Outcome::ALL.len());
        assert_eq!(wire::Transport::KNOWN.len(), Transport::ALL.len());
        assert_eq!(wire::SkipReason::KNOWN.len(), SkipReason::ALL.len());
        assert_eq!(wire::QueueOutcome::KNOWN.len(), QueueOutcome::ALL.len());
    }

    #[test]
    fn an_affinity_decision_keeps_its_reason_on_the_wire() {
        for d in [
            Decision::Reused,
            Decision::NewBind,
            Decision::None,
            Decision::Rebound(crate::fleet::affinity::Rebound::Failed(Class::Quota)),
        ] {
            assert_eq!(affinity(&d).name(), d.label());
        }
    }
}
