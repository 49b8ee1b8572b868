//! Background work on accounts: polling each account's `wham/usage` (jittered) so quota-aware
//! scheduling and the ceiling see fresh numbers, and probing accounts whose quota cooldown has
//! ended (half-open) so they come back without a user's request paying for the check.

use std::collections::HashMap;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use crate::fleet::Origin;
use crate::fleet::health::{AccountState, Blame, Class};
use crate::fleet::refresh::TokenError;
use crate::upstream::failure::Facts;
use crate::upstream::quota::QuotaSnapshot;

/// Why a usage poll failed.
#[derive(Debug)]
pub enum PollError {
    /// No usable token (the refresh failure was already applied to the account).
    Token(TokenError),
    /// The usage endpoint's answer, or the transport's failure.
    Upstream(Facts),
}

impl PollError {
    pub fn summary(&self) -> String {
        match self {
            PollError::Token(TokenError::Failed { why, .. }) => why.clone(),
            PollError::Token(TokenError::Missing) => "the account has no tokens".into(),
            PollError::Upstream(f) => f.summary(),
        }
    }
}

/// How often the poller looks for work.
const TICK: Duration = Duration::from_secs(5);

fn jittered(base: Duration) -> Duration {
    // ±20 %, so accounts added together do not poll together.
    let r = getrandom::u32().unwrap_or(0) % 41;
    base.mul_f64(0.8 + f64::from(r) / 100.0)
}

impl Dispatcher {
    /// Fetches an account's usage and records it.
    pub async fn poll_usage(&self, id: &str) -> Result<QuotaSnapshot, PollError> {
        let identity = self
            .fleet
            .ensure_fresh(id, None, self.upstream.as_ref())
            .await
            .map_err(PollError::Token)?;
        let v = self
            .upstream
            .usage(&identity)
            .await
            .map_err(PollError::Upstream)?;
        let snap = QuotaSnapshot::from_usage(&v, self.fleet.clock().now_ms());
        self.fleet.update_quota(id, snap.clone());
        Ok(snap)
    }

    /// A probe asks for no model and begins now.
    fn origin(&self) -> Origin<'static> {
        Origin {
            model: "",
            started_ms: self.fleet.clock().now_ms(),
        }
    }

    /// Probes a half-open account with a usage call: it holds the account's one probe slot, so
    /// no request probes it at the same time. Returns the class the probe was judged as.
    pub async fn probe(&self, id: &str) -> Option<Class> {
        let lease = self.fleet.try_lease(id, "").ok()?;
        let class = match self.poll_usage(id).await {
            // A window still used up: the quota stays exhausted until it resets.
            Ok(snap) => match snap.exhaustion() {
                Some(facts) => {
                    self.fleet
                        .report_failure(id, &facts, self.origin(), &mut Blame::default())
                }
                None => {
                    self.fleet.report(id, Class::Success, None, "");
                    Class::Success
                }
            },
            Err(PollError::Upstream(facts)) => {
                self.fleet
                    .report_failure(id, &facts, self.origin(), &mut Blame::default())
            }
            Err(PollError::Token(TokenError::Failed { class, .. })) => class,
            Err(PollError::Token(TokenError::Missing)) => return None,
        };
        drop(lease);
        tracing::info!(account = %id, class = class.as_str(), "half-open probe");
        Some(class)
    }

    /// The poller: every account's usage at the configured interval, half-open accounts at once.
    pub fn spawn_usage_poller(&self, stop: CancellationToken) -> JoinHandle<()> {
        let d = self.clone();
        tokio::spawn(async move {
            let mut next: HashMap<String, tokio::time::Instant> = HashMap::new();
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let interval = d.fleet.settings().usage_poll_interval;
                for a in d.fleet.list() {
                    if !a.enabled || a.state == AccountState::NeedsReauth {
                        continue;
                    }
                    // A quota cooldown is judged by the usage document itself; other cooldowns
                    // (5xx, resets, challenges) by the next real request, since the usage
                    // endpoint answering says little about the responses endpoint.
                    if a.state == AccountState::HalfOpen && a.reason == Some(Class::Quota) {
                        d.probe(&a.id).await;
                        continue;
                    }
                    let now = tokio::time::Instant::now();
                    let due = next
                        .entry(a.id.clone())
                        .or_insert_with(|| now + jittered(Duration::from_secs(3)));
                    if now >= *due {
                        *due = now + jittered(interval);
                        if let Err(e) = d.poll_usage(&a.id).await {
                            tracing::debug!(account = %a.id, error = %e.summary(), "usage poll failed");
                        }
                    }
                }
            }
        })
    }
}
