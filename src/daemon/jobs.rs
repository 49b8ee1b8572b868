//! The daemon's periodic work, each a job on [`crate::base::job`]: proactive token refresh,
//! record and usage pruning, the usage flusher, affinity snapshots, the usage poller, the
//! console feed, the sweepers of the TTL maps and of idle upstream sockets, and the systemd
//! watchdog. Every job ends when shutdown begins (the stop token); what it leaves unwritten
//! the shutdown writes.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::reload::LiveConfig;
use super::systemd::{self, Notifier};
use crate::api::AppState;
use crate::base::job::{self, Ticker};

/// How often session affinity is written to the store (and at shutdown).
pub const AFFINITY_SNAPSHOT_EVERY: Duration = Duration::from_secs(60);
/// How often accounts are checked for tokens about to expire.
const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// How often old request records and usage buckets are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// How often the notifier looks at the pool.
const NOTIFY_WATCH_EVERY: Duration = Duration::from_secs(2);
/// How often the TTL maps drop what expired.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Starts every job; they stop when `stop` is cancelled.
pub fn spawn_all(
    state: &Arc<AppState>,
    live: &Arc<LiveConfig>,
    notifier: &Notifier,
    stop: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let refresher = {
        let d = state.dispatcher.clone();
        job::spawn(
            "refresh",
            Ticker::new(REFRESH_EVERY, stop.clone()),
            move || {
                let d = d.clone();
                async move {
                    for id in d.fleet.due_for_refresh() {
                        if let Err(e) = d.fleet.ensure_fresh(&id, None, d.upstream.as_ref()).await {
                            tracing::warn!(account = %id, error = ?e, "proactive refresh failed");
                        }
                    }
                }
            },
        )
    };
    let pruner = {
        let (state, live) = (Arc::clone(state), Arc::clone(live));
        job::spawn("prune", Ticker::new(PRUNE_EVERY, stop.clone()), move || {
            // Read at every round: a reload may change them.
            let storage = live.current().storage.clone();
            state.dispatcher.log.prune(storage.request_retention_days);
            state.dispatcher.usage.prune(storage.usage_retention_days);
            std::future::ready(())
        })
    };
    let snapshots = {
        let (fleet, store) = (state.fleet.clone(), state.store.clone());
        job::spawn(
            "affinity snapshot",
            Ticker::first_after(
                AFFINITY_SNAPSHOT_EVERY,
                AFFINITY_SNAPSHOT_EVERY,
                stop.clone(),
            ),
            move || {
                let (fleet, store) = (fleet.clone(), store.clone());
                async move {
                    if let Err(e) = fleet.affinity.save(&store).await {
                        tracing::warn!(error = %e, "cannot save affinity");
                    }
                }
            },
        )
    };
    let watch = {
        let d = state.dispatcher.clone();
        let mut seen = crate::notify::watch::Watch::default();
        job::spawn(
            "notify watch",
            Ticker::new(NOTIFY_WATCH_EVERY, stop.clone()),
            move || {
                if d.notifier().enabled() {
                    seen.look(&d.fleet, d.notifier());
                }
                std::future::ready(())
            },
        )
    };
    let mut tasks = vec![
        watch,
        refresher,
        pruner,
        state.dispatcher.usage.spawn_flusher(stop.clone()),
        snapshots,
        state.dispatcher.spawn_usage_poller(stop.clone()),
        feed(state, stop.clone()),
    ];
    if let Some(every) = systemd::watchdog_interval() {
        let (store, notifier) = (state.store.clone(), notifier.clone());
        tasks.push(job::spawn(
            "watchdog",
            Ticker::new(every, stop.clone()),
            move || {
                // Only a gateway whose store answers is alive.
                if store.ping().is_ok() {
                    notifier.notify_or_log("WATCHDOG=1");
                }
                std::future::ready(())
            },
        ));
    }
    tasks.extend(state.fleet.spawn_sweepers(SWEEP_EVERY, stop.clone()));
    tasks.extend(state.dispatcher.spawn_sweepers(SWEEP_EVERY, stop));
    tasks
}

/// The console feed: an update every tick while a console watches, nothing (no tick) while
/// none does.
fn feed(state: &Arc<AppState>, stop: CancellationToken) -> JoinHandle<()> {
    let state = Arc::clone(state);
    tokio::spawn(async move {
        let mut ticker = Ticker::new(crate::telemetry::feed::TICK, stop).skip_missed();
        loop {
            if state.feed.subscribers() == 0
                && !ticker.pause_until(state.feed.first_subscriber()).await
            {
                break;
            }
            if !ticker.tick().await {
                break;
            }
            let Some(seen) = state.feed.oldest_seen() else {
                continue;
            };
            let (requests, total) = state
                .dispatcher
                .log
                .newer_than(seen, crate::telemetry::records::RING);
            state.feed.publish(&state.feed_state(&requests), total);
        }
    })
}
