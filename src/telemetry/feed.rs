//! The console feed: a snapshot for each new subscriber, then updates at most 10 times a
//! second. Each subscriber has a bounded queue fed with `try_send`: the producer never waits,
//! and a subscriber that falls behind is disconnected (it reconnects to a fresh snapshot) and
//! counted. While nobody subscribes, the producer does not tick: it waits for the first
//! subscriber ([`FeedHub::first_subscriber`]), so an idle daemon stays asleep.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use switchyard_tui::wire::{self, FeedBody, FeedMessage};
use tokio::sync::mpsc;

/// Messages a subscriber may have queued before it counts as too slow.
pub const QUEUE: usize = 64;
/// The update rate's floor: at most 10 updates a second.
pub const TICK: Duration = Duration::from_millis(100);

struct Subscriber {
    tx: mpsc::Sender<FeedMessage>,
    seq: u64,
}

#[derive(Default)]
struct Subscribers {
    list: Vec<Subscriber>,
    /// The request log's total when the earliest snapshot taken since the list was last empty
    /// was read: the first update sends the records after it.
    joined_at: Option<u64>,
}

/// The subscribers of the feed.
#[derive(Default)]
pub struct FeedHub {
    subscribers: Mutex<Subscribers>,
    /// Told when a subscriber arrives.
    arrived: tokio::sync::Notify,
    dropped: AtomicU64,
    closed: std::sync::atomic::AtomicBool,
}

impl FeedHub {
    /// A new subscription whose first message is `snapshot`, built from the request log when
    /// it had `log_total` records (read before the snapshot: a record may then come twice, but
    /// none goes missing).
    pub fn subscribe(&self, snapshot: wire::Feed, log_total: u64) -> mpsc::Receiver<FeedMessage> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let first = FeedMessage {
            protocol: wire::PROTOCOL_VERSION,
            dropped: 0,
            seq: 0,
            body: FeedBody::Snapshot(snapshot),
        };
        let mut subs = self.lock();
        if !self.is_closed() && tx.try_send(first).is_ok() {
            subs.list.push(Subscriber { tx, seq: 1 });
            subs.joined_at.get_or_insert(log_total);
            self.arrived.notify_one();
        }
        rx
    }

    /// Ends every subscription (the daemon is stopping): each subscriber's queue closes after
    /// what it holds, and new subscriptions end at once.
    pub fn close(&self) {
        let mut subs = self.lock();
        self.closed.store(true, Ordering::SeqCst);
        subs.list.clear();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Subscribers> {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribers(&self) -> usize {
        self.lock().list.len()
    }

    /// Waits until someone subscribes; returns the request log's total from before the
    /// earliest snapshot taken since then, for the first update to start after.
    pub async fn first_subscriber(&self) -> Option<u64> {
        loop {
            {
                let mut subs = self.lock();
                if !subs.list.is_empty() {
                    return subs.joined_at.take();
                }
                // Left by subscribers who have gone.
                subs.joined_at = None;
            }
            self.arrived.notified().await;
        }
    }

    /// Subscribers disconnected for falling behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Offers an update to every subscriber without waiting; one whose queue is full is
    /// disconnected.
    pub fn publish(&self, update: &wire::Feed) {
        let mut subs = self.lock();
        subs.joined_at = None;
        subs.list.retain_mut(|s| {
            let msg = FeedMessage {
                protocol: wire::PROTOCOL_VERSION,
                dropped: 0,
                seq: s.seq,
                body: FeedBody::Update(update.clone()),
            };
            s.seq += 1;
            match s.tx.try_send(msg) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("console subscriber fell behind; disconnected");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed() -> wire::Feed {
        wire::Feed {
            status: wire::Status {
                version: "0".into(),
                protocol: wire::PROTOCOL_VERSION,
                pid: 1,
                uptime_s: 0,
                listen: String::new(),
                accounts: 0,
                accounts_by_state: Default::default(),
                in_flight: 0,
                waiting: 0,
                strategy: String::new(),
                error_rates: Vec::new(),
            },
            accounts: Vec::new(),
            requests: Vec::new(),
            sessions: Default::default(),
            ws_pool_idle: 0,
            ws_pool: Default::default(),
            pool_waiting: 0,
            pool_oldest_wait_ms: None,
            now_ms: 0,
            breaker: "closed".into(),
            dropped_subscribers: 0,
            keys: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_snapshot_comes_first_then_updates_in_order() {
        let hub = FeedHub::default();
        let mut rx = hub.subscribe(feed(), 0);
        hub.publish(&feed());
        hub.publish(&feed());
        let m0 = rx.recv().await.unwrap();
        assert!(matches!(m0.body, FeedBody::Snapshot(_)));
        assert_eq!(m0.protocol, wire::PROTOCOL_VERSION);
        let (m1, m2) = (rx.recv().await.unwrap(), rx.recv().await.unwrap());
        assert!(matches!(m1.body, FeedBody::Update(_)));
        assert_eq!((m1.seq, m2.seq), (1, 2));
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_dropped_without_the_producer_waiting() {
        let hub = FeedHub::default();
        let _slow = hub.subscribe(feed(), 0); // never read
        let mut fast = hub.subscribe(feed(), 0);
        for _ in 0..QUEUE * 3 {
            hub.publish(&feed()); // returns at once, whatever the subscribers do
            while fast.try_recv().is_ok() {}
        }
        assert_eq!(hub.dropped(), 1);
        assert_eq!(hub.subscribers(), 1, "the fast one stays");
    }

    #[tokio::test]
    async fn closing_ends_every_subscription() {
        let hub = FeedHub::default();
        let mut rx = hub.subscribe(feed(), 0);
        hub.close();
        assert!(matches!(
            rx.recv().await.unwrap().body,
            FeedBody::Snapshot(_)
        ));
        assert!(rx.recv().await.is_none(), "ended after what it held");
        let mut late = hub.subscribe(feed(), 0);
        assert!(
            late.recv().await.is_none(),
            "a subscription after close ends at once"
        );
        assert_eq!(hub.dropped(), 0, "not counted as falling behind");
    }

    /// The producer's wait for a subscriber, checked to be still waiting.
    fn waiting(hub: &FeedHub) -> std::pin::Pin<Box<impl Future<Output = Option<u64>> + '_>> {
        use futures_util::FutureExt;
        let mut wait = Box::pin(hub.first_subscriber());
        assert!(
            wait.as_mut().now_or_never().is_none(),
            "nobody is subscribed"
        );
        wait
    }

    #[tokio::test]
    async fn the_producer_waits_for_a_subscriber_and_starts_after_its_snapshot() {
        let hub = FeedHub::default();
        let wait = waiting(&hub);
        let _a = hub.subscribe(feed(), 7);
        let _b = hub.subscribe(feed(), 9);
        assert_eq!(wait.await, Some(7), "the earliest snapshot's total");

        // A subscriber who came and went while updates ran leaves nothing behind.
        let gone = hub.subscribe(feed(), 11);
        drop((_a, _b, gone));
        hub.publish(&feed());
        assert_eq!(hub.subscribers(), 0);
        let wait = waiting(&hub);
        let _c = hub.subscribe(feed(), 20);
        assert_eq!(wait.await, Some(20));
    }
}
