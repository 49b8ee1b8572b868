//! Rate-limit reset credits (protocol §K.6, in the shapes of the Codex source's backend client):
//! an account banks credits that clear its spent usage windows. `GET
//! /wham/rate-limit-reset-credits` lists them; `POST /wham/rate-limit-reset-credits/consume`
//! with `{"redeem_request_id", "credit_id"?}` spends one (the soonest to expire unless one is
//! named) and answers `{"code", "windows_reset", "credit"}`, the code in snake case: `reset`,
//! `nothing_to_reset` (no window is spent: nothing is spent), `no_credit`, `already_redeemed`
//! (this redeem id already spent one: the same answer again, nothing more is spent). An account
//! with a single window cannot be reset: the consume fails with a 500, as reported of the real
//! backend.

use serde_json::{Value, json};

use super::state::Account;

/// A banked credit.
#[derive(Debug, Clone)]
pub(crate) struct Credit {
    pub id: String,
    pub redeemed: bool,
    pub granted_at: u64,
    pub expires_at: u64,
}

impl Credit {
    fn available(&self, now: u64) -> bool {
        !self.redeemed && self.expires_at > now
    }

    fn json(&self, now: u64) -> Value {
        let status = if self.redeemed {
            "redeemed"
        } else if self.expires_at <= now {
            "expired"
        } else {
            "available"
        };
        json!({
            "id": self.id,
            "status": status,
            "reset_type": "codex_rate_limits",
            "granted_at": crate::base::clock::rfc3339(self.granted_at),
            "expires_at": crate::base::clock::rfc3339(self.expires_at),
            "title": "Full reset (Weekly + 5 hr)",
            "description": null,
        })
    }
}

/// Credits the account can spend now.
pub(crate) fn available_count(account: &Account, now: u64) -> usize {
    account.credits.iter().filter(|c| c.available(now)).count()
}

/// `GET /wham/rate-limit-reset-credits`.
pub(crate) fn list(account: &Account, now: u64) -> Value {
    let next = account
        .credits
        .iter()
        .filter(|c| c.available(now))
        .map(|c| c.expires_at)
        .min();
    json!({
        "available_count": available_count(account, now),
        "next_expires_at": next.map(crate::base::clock::rfc3339),
        "credits": account.credits.iter().map(|c| c.json(now)).collect::<Vec<_>>(),
    })
}

/// `POST /wham/rate-limit-reset-credits/consume`: the status and body of the answer.
pub(crate) fn consume(account: &mut Account, body: &Value, now: u64) -> (u16, Value) {
    let Some(redeem) = body["redeem_request_id"].as_str().filter(|r| !r.is_empty()) else {
        return (
            400,
            json!({"detail": {"code": "invalid_request", "message": "redeem_request_id is required"}}),
        );
    };
    if let Some(answer) = account.redemptions.get(redeem) {
        let mut again = answer.clone();
        if again["code"] == "reset" {
            again["code"] = json!("already_redeemed");
        }
        return (200, again);
    }
    if account.single_window {
        return (
            500,
            json!({"detail": {"code": "internal_error", "message": "This account's limits cannot be reset."}}),
        );
    }
    let wanted = body["credit_id"].as_str();
    let pick = account
        .credits
        .iter()
        .enumerate()
        .filter(|(_, c)| c.available(now) && wanted.is_none_or(|w| c.id == w))
        .min_by_key(|(_, c)| c.expires_at)
        .map(|(i, _)| i);
    let Some(i) = pick else {
        return (200, json!({"code": "no_credit", "windows_reset": 0}));
    };
    let spent: Vec<bool> = [&account.primary, &account.secondary]
        .iter()
        .map(|w| w.used_percent >= 100.0)
        .collect();
    let windows_reset = spent.iter().filter(|s| **s).count();
    if windows_reset == 0 {
        return (200, json!({"code": "nothing_to_reset", "windows_reset": 0}));
    }
    for w in [&mut account.primary, &mut account.secondary] {
        w.used_percent = 0.0;
        w.reset_at = now + w.len_secs;
    }
    account.script_quota_until = None;
    account.credits[i].redeemed = true;
    let answer = json!({
        "code": "reset",
        "windows_reset": windows_reset,
        "credit": account.credits[i].json(now),
    });
    account
        .redemptions
        .insert(redeem.to_string(), answer.clone());
    (200, answer)
}
