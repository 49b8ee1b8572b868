//! What the pool knows about spending reset credits: which accounts a credit could bring back,
//! and an account whose windows a spent credit reset.

use super::Fleet;
use super::health::{Class, Effective, State};

/// An account a reset credit could bring back: cooling on quota, with credits (or none known
/// yet: a usage poll tells).
#[derive(Debug, Clone, PartialEq)]
pub struct CreditCandidate {
    pub id: String,
    /// When its quota cooldown ends on its own (unix ms).
    pub cooling_until_ms: u64,
    /// The count the last usage poll read; `None` before one did.
    pub credits: Option<u64>,
    /// Its soonest-expiring credit (unix seconds), from the list endpoint.
    pub soonest_expiry: Option<u64>,
}

impl Fleet {
    /// The enabled accounts cooling on quota that are not known to hold no credit, the one a
    /// credit serves best first: the soonest-expiring credit (so none lapses while another is
    /// spent), then the longest cooldown left (what the credit buys).
    pub fn credit_candidates(&self) -> Vec<CreditCandidate> {
        let now = self.clock.now_ms();
        let inner = self.read();
        let mut out: Vec<CreditCandidate> = inner
            .accounts
            .values()
            .filter(|e| e.record.enabled && e.health.reason == Some(Class::Quota))
            .filter_map(|e| match e.health.effective(now) {
                Effective::Cooling { until_ms } => {
                    let q = e.quota.as_ref();
                    let credits = q.and_then(|q| q.reset_credits);
                    (credits != Some(0)).then(|| CreditCandidate {
                        id: e.record.id.clone(),
                        cooling_until_ms: until_ms,
                        credits,
                        soonest_expiry: q.and_then(|q| q.credit_expires_at),
                    })
                }
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| {
            let expiry = |c: &CreditCandidate| c.soonest_expiry.unwrap_or(u64::MAX);
            expiry(a)
                .cmp(&expiry(b))
                .then(b.cooling_until_ms.cmp(&a.cooling_until_ms))
                .then(a.id.cmp(&b.id))
        });
        out
    }

    /// Records what the list endpoint said of an account's credits: how many, and when the
    /// soonest expires.
    pub fn set_credits(&self, id: &str, count: u64, soonest_expiry: Option<u64>) {
        if let Some(mut e) = self.write().accounts.get_mut(id) {
            let q = e.quota.get_or_insert_with(Default::default);
            q.reset_credits = Some(count);
            q.credit_expires_at = soonest_expiry;
        }
    }

    /// A spent credit reset the account's windows: its quota cooldown ends now and the
    /// requests waiting for it get its slots. Any other cooldown stays. True when it ended one.
    pub fn quota_reset(&self, id: &str) -> bool {
        let health = {
            let mut inner = self.write();
            let Some(mut e) = inner.accounts.get_mut(id) else {
                return false;
            };
            if e.health.state == State::NeedsReauth || e.health.reason != Some(Class::Quota) {
                return false;
            }
            e.health.clear();
            e.health.clone()
        };
        tracing::info!(account = %id, "quota cooldown ended by a reset credit");
        self.persist_health(id, &health);
        self.hand_off(id);
        true
    }
}
