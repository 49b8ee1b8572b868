//! Spending rate-limit reset credits (protocol §K.6), exactly once.
//!
//! A spend is written to the store (and synced) with a fresh redeem request id before the
//! consume call. The backend treats that id as an idempotency key, so a spend whose answer
//! never came (a timeout, a crash) is settled by asking again with the same id — never by
//! spending another credit: while one is unsettled no new spend starts. Spends run one at a
//! time; a request that found the pool dry while another request's spend ran is served by that
//! spend (the reset counter moved) instead of paying for its own.
//!
//! A credit is only spent on an account cooling on quota whose fresh usage shows a spent
//! window, that has two windows (the backend cannot reset a single-window account) and holds
//! a credit; the credit asked for is the soonest to expire.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Dispatcher;
use crate::base::clock::parse_rfc3339_ms;
use crate::base::duration::text as duration;
use crate::store::records::CreditSpendRecord;

/// `[credits]`: the autopilot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CreditsConfig {
    pub auto: Auto,
    /// A consume unanswered for this long stays unsettled: it is asked again, with the same
    /// redeem id, before any other spend.
    #[serde(with = "duration")]
    pub consume_timeout: Duration,
}

impl Default for CreditsConfig {
    fn default() -> Self {
        Self {
            auto: Auto::Off,
            consume_timeout: Duration::from_secs(20),
        }
    }
}

/// When the autopilot spends a credit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Auto {
    #[default]
    Off,
    /// When a request would otherwise be answered that the pool's quota is spent.
    WhenDry,
    /// When a spent account's credit would expire before its window resets anyway.
    BeforeExpiry,
    Both,
}

impl Auto {
    pub fn when_dry(self) -> bool {
        matches!(self, Auto::WhenDry | Auto::Both)
    }

    pub fn before_expiry(self) -> bool {
        matches!(self, Auto::BeforeExpiry | Auto::Both)
    }
}

/// Why a credit was spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    WhenDry,
    BeforeExpiry,
    Operator,
}

impl Need {
    pub fn as_str(self) -> &'static str {
        match self {
            Need::WhenDry => "when_dry",
            Need::BeforeExpiry => "before_expiry",
            Need::Operator => "operator",
        }
    }
}

pub use crate::telemetry::records::CreditSpend as SpendOutcome;

/// Why no credit was spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoSpend {
    /// Another spend met this need meanwhile.
    Served,
    /// No account qualifies, with why.
    NoCandidate(String),
}

/// The outcome of a spend whose answer is not known yet.
pub const UNSETTLED: &str = "unsettled";

/// The autopilot's state.
pub struct Pilot {
    /// One spend at a time.
    lock: tokio::sync::Mutex<()>,
    /// Spends that reset an account.
    resets: AtomicU64,
    /// Accounts whose consume the backend refused in this run (a single window): never again.
    refused: Mutex<HashSet<String>>,
    /// A spend may be unsettled (true at start, until the store shows none).
    maybe_unsettled: std::sync::atomic::AtomicBool,
}

impl Default for Pilot {
    fn default() -> Self {
        Pilot {
            lock: tokio::sync::Mutex::default(),
            resets: AtomicU64::new(0),
            refused: Mutex::default(),
            maybe_unsettled: std::sync::atomic::AtomicBool::new(true),
        }
    }
}

impl Pilot {
    /// The reset counter, read before a request looks for an account: a later value means a
    /// spend made since may serve it.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::SeqCst)
    }

    fn refused(&self, id: &str) -> bool {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
    }
}

/// A fresh redeem request id (UUID-shaped).
fn redeem_id() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b = t.to_le_bytes();
    });
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A consume answer's outcome in snake case: the backend's `code` (the app server's camelCase
/// names, `outcome` in its shape, read the same).
fn outcome_code(v: &Value) -> String {
    let raw = v["code"]
        .as_str()
        .or_else(|| v["outcome"].as_str())
        .unwrap_or("unknown");
    let mut out = String::with_capacity(raw.len() + 4);
    for c in raw.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The soonest-expiring available credit of a list answer, and how many are available.
fn soonest(list: &Value) -> (u64, Option<(String, u64)>) {
    let credits = list["credits"].as_array().map_or(&[][..], Vec::as_slice);
    let available: Vec<(String, u64)> = credits
        .iter()
        .filter(|c| c["status"].as_str().is_none_or(|s| s == "available"))
        .filter_map(|c| {
            let id = c["id"].as_str()?.to_string();
            let expires = c["expires_at"]
                .as_str()
                .and_then(parse_rfc3339_ms)
                .map(|ms| ms / 1000)
                .or_else(|| c["expires_at"].as_u64())
                .unwrap_or(u64::MAX);
            Some((id, expires))
        })
        .collect();
    let count = list["available_count"]
        .as_u64()
        .unwrap_or(available.len() as u64);
    (count, available.into_iter().min_by_key(|(_, e)| *e))
}

impl Dispatcher {
    /// Reads an account's credits from the list endpoint into the pool (count and soonest
    /// expiry), returning the soonest credit's id.
    pub async fn list_credits(&self, id: &str) -> Result<Option<String>, String> {
        let identity = self
            .fleet
            .ensure_fresh(id, None, self.upstream.as_ref())
            .await
            .map_err(|e| e.summary())?;
        let list = self
            .upstream
            .reset_credits(&identity)
            .await
            .map_err(|f| f.summary())?;
        let (count, first) = soonest(&list);
        self.fleet
            .set_credits(id, count, first.as_ref().map(|(_, e)| *e));
        Ok(first.map(|(c, _)| c))
    }

    /// The pool is dry for a request: spends one credit on the account it serves best, unless
    /// a spend made since `seen` (the reset counter when the request looked) serves it already.
    pub async fn spend_when_dry(&self, seen: u64, request: u64) -> Result<SpendOutcome, NoSpend> {
        let _one = self.credits.lock.lock().await;
        if self.credits.resets() != seen {
            return Err(NoSpend::Served);
        }
        match self.settle_unsettled().await {
            Some(Err(e)) => return Err(e),
            Some(Ok(o)) if o.reset() || o.outcome == UNSETTLED => return Ok(o),
            _ => {}
        }
        let mut why = Vec::new();
        for c in self.fleet.credit_candidates() {
            match self.eligible(&c.id).await {
                Ok(credit) => {
                    return Ok(self
                        .spend_on(&c.id, credit, Need::WhenDry, Some(request))
                        .await);
                }
                Err(reason) => why.push(format!("{}: {reason}", c.id)),
            }
        }
        Err(NoSpend::NoCandidate(if why.is_empty() {
            "no account cooling on quota holds a reset credit".into()
        } else {
            why.join("; ")
        }))
    }

    /// Spends a credit on one account (the operator's `account reset-window`), refused when
    /// its window is not spent, it has one window, or no credit.
    pub async fn spend_on_account(&self, id: &str) -> Result<SpendOutcome, String> {
        let _one = self.credits.lock.lock().await;
        if let Some(Ok(unsettled)) = self.settle_unsettled().await
            && unsettled.outcome == UNSETTLED
        {
            return Err(format!(
                "an earlier spend on {} is not settled yet ({}): it is asked again before any other",
                unsettled.account,
                unsettled.error.as_deref().unwrap_or("no answer")
            ));
        }
        let credit = self.eligible(id).await?;
        Ok(self.spend_on(id, credit, Need::Operator, None).await)
    }

    /// Spends the credits that would lapse unused: an account whose window is spent and
    /// whose soonest credit expires before that window resets.
    pub async fn spend_before_expiry(&self) -> Vec<SpendOutcome> {
        let _one = self.credits.lock.lock().await;
        let mut out = Vec::new();
        match self.settle_unsettled().await {
            Some(Err(_)) => return out,
            Some(Ok(o)) if o.outcome == UNSETTLED => return vec![o],
            Some(Ok(o)) => out.push(o),
            None => {}
        }
        for c in self.fleet.credit_candidates() {
            let Some(expiry_s) = c.soonest_expiry else {
                continue;
            };
            if expiry_s.saturating_mul(1000) >= c.cooling_until_ms {
                continue;
            }
            if let Ok(credit) = self.eligible(&c.id).await {
                out.push(self.spend_on(&c.id, credit, Need::BeforeExpiry, None).await);
            }
        }
        out
    }

    /// Whether a credit may be spent on the account now, by its fresh usage: the credit to
    /// ask for (the soonest to expire, when the list answers), or why not.
    async fn eligible(&self, id: &str) -> Result<Option<String>, String> {
        if self.credits.refused(id) {
            return Err("the backend refused to reset it".into());
        }
        let snap = self.poll_usage(id).await.map_err(|e| e.summary())?;
        if snap.single_window() {
            return Err("it has a single usage window, which a credit cannot reset".into());
        }
        if snap.exhaustion().is_none() {
            return Err("its usage windows are not spent".into());
        }
        if snap.reset_credits == Some(0) {
            return Err("it holds no reset credit".into());
        }
        match self.list_credits(id).await {
            Ok(Some(credit)) => Ok(Some(credit)),
            Ok(None) => Err("it holds no reset credit".into()),
            // The backend spends the soonest-expiring credit when none is named.
            Err(e) => {
                tracing::warn!(account = %id, error = %e, "reset credits not listed");
                Ok(None)
            }
        }
    }

    /// Settles a spend left without an answer (at start, after a crash), unless one runs.
    pub async fn settle_spends(&self) -> Option<SpendOutcome> {
        if !self.credits.maybe_unsettled.load(Ordering::SeqCst) {
            return None;
        }
        let _one = self.credits.lock.try_lock().ok()?;
        self.settle_unsettled().await?.ok()
    }

    /// Settles a spend left without an answer (by a timeout or a crash), asking again with its
    /// redeem id. `None` when there is none; else how it ended (`unsettled` again when it
    /// still has no answer: then no other spend may start).
    async fn settle_unsettled(&self) -> Option<Result<SpendOutcome, NoSpend>> {
        if !self.credits.maybe_unsettled.load(Ordering::SeqCst) {
            return None;
        }
        let store = self.fleet.store();
        let pending = match store.load_credit_spends() {
            Ok(rows) => rows.into_iter().find(|(_, r)| r.outcome.is_none()),
            Err(e) => {
                return Some(Err(NoSpend::NoCandidate(format!(
                    "the spends cannot be read: {e}"
                ))));
            }
        };
        let Some((redeem, record)) = pending else {
            self.credits.maybe_unsettled.store(false, Ordering::SeqCst);
            return None;
        };
        tracing::info!(account = %record.account, redeem = %redeem, "settling an unanswered reset-credit spend");
        Some(Ok(self.consume(&redeem, record).await))
    }

    /// Records a new spend, then asks for it.
    async fn spend_on(
        &self,
        id: &str,
        credit: Option<String>,
        need: Need,
        request: Option<u64>,
    ) -> SpendOutcome {
        let redeem = redeem_id();
        self.credits.maybe_unsettled.store(true, Ordering::SeqCst);
        let record = CreditSpendRecord {
            account: id.to_string(),
            credit_id: credit,
            need: need.as_str().into(),
            request,
            started_ms: self.fleet.clock().now_ms(),
            outcome: None,
            windows_reset: 0,
            finished_ms: None,
            error: None,
        };
        if let Err(e) = self.fleet.store().put_credit_spend(&redeem, &record).await {
            // Unrecorded, it could not be settled after a crash: not asked at all.
            return SpendOutcome {
                account: id.to_string(),
                redeem_id: redeem,
                outcome: "failed".into(),
                windows_reset: 0,
                error: Some(format!("the spend could not be recorded first: {e}")),
            };
        }
        self.consume(&redeem, record).await
    }

    /// The consume call of a recorded spend, and what follows from its answer.
    async fn consume(&self, redeem: &str, mut record: CreditSpendRecord) -> SpendOutcome {
        let id = record.account.clone();
        let timeout = self.current().credits.consume_timeout;
        let answer = match self
            .fleet
            .ensure_fresh(&id, None, self.upstream.as_ref())
            .await
        {
            Err(e) => Err((false, e.summary())),
            Ok(identity) => {
                let call =
                    self.upstream
                        .consume_credit(&identity, redeem, record.credit_id.as_deref());
                match tokio::time::timeout(timeout, call).await {
                    Err(_) => Err((false, format!("no answer within {timeout:?}"))),
                    // A transport failure may have reached the backend: unsettled.
                    Ok(Err(f)) if f.status.is_none() => Err((false, f.summary())),
                    Ok(Err(f)) => Err((true, f.summary())),
                    Ok(Ok(v)) => Ok(v),
                }
            }
        };
        let now = self.fleet.clock().now_ms();
        match answer {
            Ok(v) => {
                record.outcome = Some(outcome_code(&v));
                record.windows_reset = v["windows_reset"]
                    .as_u64()
                    .or_else(|| v["windowsReset"].as_u64())
                    .unwrap_or(0);
                record.finished_ms = Some(now);
                record.error = None;
            }
            // The backend answered with an error: nothing was spent.
            Err((true, why)) => {
                record.outcome = Some("failed".into());
                record.finished_ms = Some(now);
                record.error = Some(why);
                self.credits
                    .refused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.clone());
            }
            Err((false, why)) => record.error = Some(why),
        }
        if let Err(e) = self.fleet.store().put_credit_spend(redeem, &record).await {
            tracing::error!(error = %e, redeem, "cannot record a reset-credit spend's outcome");
        }
        let out = SpendOutcome {
            // Named as request records name accounts.
            account: self
                .fleet
                .chatgpt_account_id(&id)
                .unwrap_or_else(|| id.clone()),
            redeem_id: redeem.to_string(),
            outcome: record.outcome.clone().unwrap_or_else(|| UNSETTLED.into()),
            windows_reset: record.windows_reset,
            error: record.error.clone(),
        };
        match out.outcome.as_str() {
            "reset" | "already_redeemed" => {
                self.credits.resets.fetch_add(1, Ordering::SeqCst);
                // The fresh windows (and the count left), then the account is back.
                if let Err(e) = self.poll_usage(&id).await {
                    tracing::warn!(account = %id, error = %e.summary(), "usage after a reset credit");
                }
                let _ = self.list_credits(&id).await;
                self.fleet.quota_reset(&id);
            }
            "no_credit" => self.fleet.set_credits(&id, 0, None),
            _ => {}
        }
        if out.reset() {
            let who = self
                .fleet
                .get(&id)
                .and_then(|a| a.email)
                .unwrap_or_else(|| id.clone());
            let left = self
                .fleet
                .get(&id)
                .and_then(|a| a.quota)
                .and_then(|q| q.reset_credits);
            let mut event = crate::notify::Event::new(
                crate::notify::EventKind::CreditSpent,
                now,
                format!(
                    "A rate-limit reset credit was spent on {who} ({}): {} window{} reset.",
                    record.need,
                    out.windows_reset,
                    if out.windows_reset == 1 { "" } else { "s" }
                ),
            )
            .account(who)
            .detail("outcome", out.outcome.clone())
            .detail("need", record.need.clone())
            .detail("redeem_id", redeem.to_string());
            if let Some(n) = left {
                event = event.detail("credits_left", n);
            }
            self.notifier().emit(event);
        }
        self.metrics.credit_spend(&out.outcome);
        tracing::info!(
            account = %id,
            redeem = %redeem,
            need = %record.need,
            outcome = %out.outcome,
            windows_reset = out.windows_reset,
            error = out.error.as_deref().unwrap_or(""),
            "reset credit spend"
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_soonest_available_credit_is_picked() {
        let list = json!({"available_count": 2, "credits": [
            {"id": "a", "status": "available", "expires_at": "2027-01-10T00:00:00Z"},
            {"id": "b", "status": "redeemed", "expires_at": "2026-12-01T00:00:00Z"},
            {"id": "c", "status": "available", "expires_at": "2026-12-20T00:00:00Z"},
        ]});
        let (count, first) = soonest(&list);
        assert_eq!(count, 2);
        let (id, expires) = first.unwrap();
        assert_eq!(id, "c");
        assert_eq!(
            expires,
            parse_rfc3339_ms("2026-12-20T00:00:00Z").unwrap() / 1000
        );
        assert_eq!(soonest(&json!({"credits": []})), (0, None));
    }

    #[test]
    fn consume_codes_read_in_either_case() {
        assert_eq!(
            outcome_code(&json!({"code": "nothing_to_reset"})),
            "nothing_to_reset"
        );
        assert_eq!(
            outcome_code(&json!({"code": "alreadyRedeemed"})),
            "already_redeemed"
        );
        assert_eq!(outcome_code(&json!({"outcome": "noCredit"})), "no_credit");
        assert_eq!(outcome_code(&json!({})), "unknown");
    }

    #[test]
    fn redeem_ids_are_fresh_and_uuid_shaped() {
        let (a, b) = (redeem_id(), redeem_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.as_bytes()[14], b'4');
    }

    #[test]
    fn the_autopilot_modes_parse_by_name() {
        let c: CreditsConfig = toml::from_str("auto = \"both\"").unwrap();
        assert!(c.auto.when_dry() && c.auto.before_expiry());
        let c: CreditsConfig = toml::from_str("").unwrap();
        assert_eq!(c.auto, Auto::Off);
        assert!(toml::from_str::<CreditsConfig>("auto = \"always\"").is_err());
    }
}
