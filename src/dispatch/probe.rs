//! Background work on accounts: polling each account's `wham/usage` (jittered) so quota-aware
//! scheduling and the ceiling see fresh numbers, and probing accounts whose quota cooldown has
//! ended (half-open) so they come back without a user's request paying for the check.

use std::collections::HashMap;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use crate::fleet::health::{Class, classify};
use crate::upstream::failure::Facts;
use crate::upstream::quota::QuotaSnapshot;

/// How often the poller looks for work.
const TICK: Duration = Duration::from_secs(5);

fn jittered(base: Duration) -> Duration {
    // ±20 %, so accounts added together do not poll together.
    let r = getrandom::u32().unwrap_or(0) % 41;
    base.mul_f64(0.8 + f64::from(r) / 100.0)
}

impl Dispatcher {
    /// Fetches an account's usage and records it.
    pub async fn poll_usage(&self, id: &str) -> Result<QuotaSnapshot, Facts> {
        let identity = self
            .fleet
            .ensure_fresh(id, None, self.upstream.as_ref())
            .await
            .map_err(|e| {
                Facts::transport(crate::upstream::failure::Phase::Connect, format!("{e:?}"))
            })?;
        let v = self.upstream.usage(&identity).await?;
        let snap = QuotaSnapshot::from_usage(&v, self.fleet.clock().now_ms());
        self.fleet.update_quota(id, snap.clone());
        Ok(snap)
    }

    /// Probes a half-open account with a usage call: it holds the account's one probe slot, so
    /// no request probes it at the same time. Returns the class the probe was judged as.
    pub async fn probe(&self, id: &str) -> Option<Class> {
        let lease = self.fleet.try_lease(id, "").ok()?;
        let class = match self.poll_usage(id).await {
            Ok(snap) => {
                let exhausted = |p: Option<f64>| p.is_some_and(|p| p >= 100.0);
                if exhausted(snap.primary_used_percent) || exhausted(snap.secondary_used_percent) {
                    let resets_at = if exhausted(snap.primary_used_percent) {
                        snap.primary_reset_at
                    } else {
                        snap.secondary_reset_at
                    };
                    let facts = Facts {
                        status: Some(429),
                        error_type: Some("usage_limit_reached".into()),
                        resets_at,
                        message: Some("usage still exhausted at probe".into()),
                        ..Facts::default()
                    };
                    self.fleet.report(id, Class::Quota, Some(&facts), "");
                    Class::Quota
                } else {
                    self.fleet.report(id, Class::Success, None, "");
                    Class::Success
                }
            }
            Err(facts) => {
                let class = classify(&facts);
                self.fleet.report(id, class, Some(&facts), "");
                class
            }
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
                    if !a.enabled || a.state == "needs_reauth" {
                        continue;
                    }
                    // A quota cooldown is judged by the usage document itself; other cooldowns
                    // (5xx, resets, challenges) by the next real request, since the usage
                    // endpoint answering says little about the responses endpoint.
                    if a.state == "half_open" && a.reason.as_deref() == Some("quota") {
                        d.probe(&a.id).await;
                        continue;
                    }
                    let now = tokio::time::Instant::now();
                    let due = next
                        .entry(a.id.clone())
                        .or_insert_with(|| now + jittered(Duration::from_secs(3)));
                    if now >= *due {
                        *due = now + jittered(interval);
                        if let Err(f) = d.poll_usage(&a.id).await {
                            tracing::debug!(account = %a.id, error = %f.summary(), "usage poll failed");
                        }
                    }
                }
            }
        })
    }
}
