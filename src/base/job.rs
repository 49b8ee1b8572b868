//! Periodic background work in one shape: a named job, a period, and the stop token that ends
//! it. A job's work runs to its end once begun; the stop token is looked at between rounds.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// The rounds of one job: a tick every period until the stop token is cancelled.
#[derive(Debug)]
pub struct Ticker {
    interval: Interval,
    stop: CancellationToken,
}

impl Ticker {
    /// Ticks every `period`, the first at once. A round that overruns delays the next tick
    /// instead of bunching the missed ones together.
    pub fn new(period: Duration, stop: CancellationToken) -> Ticker {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ticker { interval, stop }
    }

    /// The same, with the first tick `delay` from now.
    pub fn first_after(delay: Duration, period: Duration, stop: CancellationToken) -> Ticker {
        let mut interval = tokio::time::interval_at(Instant::now() + delay, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ticker { interval, stop }
    }

    /// Ticks that fall behind are skipped (for work that only shows the newest state).
    pub fn skip_missed(mut self) -> Ticker {
        self.interval
            .set_missed_tick_behavior(MissedTickBehavior::Skip);
        self
    }

    /// Waits for the next tick; `false` once the job is to stop.
    pub async fn tick(&mut self) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = self.interval.tick() => true,
        }
    }

    /// Waits for the next tick or for `wake`, whichever comes first; `false` once the job is
    /// to stop.
    pub async fn tick_or(&mut self, wake: impl Future<Output = ()>) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = self.interval.tick() => true,
            () = wake => true,
        }
    }

    /// Waits for `until` without ticking, then starts the period afresh; `false` if the job
    /// is to stop first.
    pub async fn pause_until(&mut self, until: impl Future<Output = ()>) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            () = until => {
                self.interval.reset();
                true
            }
        }
    }
}

/// Spawns the job `name`: `round` at every tick of `ticker`, until its stop token is
/// cancelled.
pub fn spawn<F, Fut>(name: &'static str, mut ticker: Ticker, mut round: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        while ticker.tick().await {
            round().await;
        }
        tracing::debug!(job = name, "background job stopped");
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_job_runs_once_a_period_and_ends_with_its_stop_token() {
        let stop = CancellationToken::new();
        let rounds = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&rounds);
        let job = spawn(
            "count",
            Ticker::new(Duration::from_secs(10), stop.clone()),
            move || {
                let counted = Arc::clone(&counted);
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            },
        );
        // The first round at once, then one per period.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 3);
        stop.cancel();
        job.await.unwrap();
        assert_eq!(rounds.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_first_tick_waits_a_period_and_a_pause_restarts_it() {
        let stop = CancellationToken::new();
        let mut t = Ticker::first_after(
            Duration::from_secs(60),
            Duration::from_secs(60),
            stop.clone(),
        );
        let start = Instant::now();
        assert!(t.tick().await);
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        // Paused for 100 s: the next tick is a whole period after the pause, not at once.
        assert!(
            t.pause_until(tokio::time::sleep(Duration::from_secs(100)))
                .await
        );
        let resumed = Instant::now();
        assert!(t.tick().await);
        assert_eq!(resumed.elapsed(), Duration::from_secs(60));
        // A wake comes before the tick.
        let woke = Instant::now();
        assert!(t.tick_or(std::future::ready(())).await);
        assert_eq!(woke.elapsed(), Duration::ZERO);
        stop.cancel();
        assert!(!t.tick().await);
        assert!(!t.pause_until(std::future::pending()).await);
    }
}
