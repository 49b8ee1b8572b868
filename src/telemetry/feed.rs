//! The console feed: a snapshot for each new subscriber, then updates at most 10 times a
//! second. Each subscriber has a bounded queue fed with `try_send`: the producer never waits,
//! and a subscriber that falls behind is disconnected (it reconnects to a fresh snapshot) and
//! counted. Each subscriber gets the request records after those its snapshot held, once each.
//! While nobody subscribes, the producer does not tick: it waits for the first subscriber
//! ([`FeedHub::first_subscriber`]), so an idle daemon stays asleep.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use switchyard_admin::wire::{self, FeedBody, FeedMessage};
use tokio::sync::mpsc;

/// Messages a subscriber may have queued before it counts as too slow.
pub const QUEUE: usize = 64;
/// The update rate's floor: at most 10 updates a second.
pub const TICK: Duration = Duration::from_millis(100);

struct Subscriber {
    tx: mpsc::Sender<FeedMessage>,
    seq: u64,
    /// How many request records it has been sent (its snapshot's and its updates').
    seen: u64,
}

/// The subscribers of the feed.
#[derive(Default)]
pub struct FeedHub {
    subscribers: Mutex<Vec<Subscriber>>,
    /// Told when a subscriber arrives.
    arrived: tokio::sync::Notify,
    dropped: AtomicU64,
    closed: std::sync::atomic::AtomicBool,
}

impl FeedHub {
    /// A new subscription whose first message is `snapshot`, which holds the request records
    /// up to the log's `seen`th: its updates bring those after it.
    pub fn subscribe(&self, snapshot: wire::Feed, seen: u64) -> mpsc::Receiver<FeedMessage> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let first = FeedMessage {
            protocol: wire::PROTOCOL_VERSION,
            dropped: 0,
            seq: 0,
            body: FeedBody::Snapshot(snapshot),
        };
        let mut subs = self.lock();
        if !self.is_closed() && tx.try_send(first).is_ok() {
            subs.push(Subscriber { tx, seq: 1, seen });
            self.arrived.notify_one();
        }
        rx
    }

    /// Ends every subscription (the daemon is stopping): each subscriber's queue closes after
    /// what it holds, and new subscriptions end at once.
    pub fn close(&self) {
        let mut subs = self.lock();
        self.closed.store(true, Ordering::SeqCst);
        subs.clear();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Subscriber>> {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribers(&self) -> usize {
        self.lock().len()
    }

    /// Waits until someone subscribes.
    pub async fn first_subscriber(&self) {
        while self.subscribers() == 0 {
            self.arrived.notified().await;
        }
    }

    /// The fewest request records any subscriber has been sent: an update needs the records
    /// after it. `None` without subscribers.
    pub fn oldest_seen(&self) -> Option<u64> {
        self.lock().iter().map(|s| s.seen).min()
    }

    /// Subscribers disconnected for falling behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Offers an update to every subscriber without waiting; one whose queue is full is
    /// disconnected. `update.requests` holds the log's records after [`FeedHub::oldest_seen`]
    /// up to its `total`th, newest first: each subscriber gets those it has not been sent.
    pub fn publish(&self, update: &wire::Feed, total: u64) {
        let mut subs = self.lock();
        subs.retain_mut(|s| {
            let unseen = usize::try_from(total.saturating_sub(s.seen)).unwrap_or(usize::MAX);
            let mut update = update.clone();
            update.requests.truncate(unseen);
            s.seen = s.seen.max(total);
            let msg = FeedMessage {
                protocol: wire::PROTOCOL_VERSION,
                dropped: 0,
                seq: s.seq,
                body: FeedBody::Update(update),
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
        hub.publish(&feed(), 0);
        hub.publish(&feed(), 0);
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
            hub.publish(&feed(), 0); // returns at once, whatever the subscribers do
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

    /// An update holding request records `newest` down to `oldest` (ids `req_N`), newest first.
    fn update(newest: u64, oldest: u64) -> wire::Feed {
        let mut f = feed();
        f.requests = (oldest..=newest)
            .rev()
            .map(|n| {
                serde_json::from_value(serde_json::json!({
                    "id": format!("req_{n}"), "started_at": "", "key": "k", "model": "m",
                    "stream": true, "outcome": "success", "status": 200, "account": null,
                    "attempts": [], "ttft_ms": null, "duration_ms": 1, "usage": null,
                }))
                .unwrap()
            })
            .collect();
        f
    }

    fn ids(m: FeedMessage) -> Vec<String> {
        let FeedBody::Update(u) = m.body else {
            panic!("not an update")
        };
        u.requests.into_iter().map(|r| r.id).collect()
    }

    #[tokio::test]
    async fn each_subscriber_gets_the_records_after_its_snapshot_once() {
        let hub = FeedHub::default();
        let mut early = hub.subscribe(feed(), 2);
        let mut late = hub.subscribe(feed(), 4);
        assert_eq!(hub.oldest_seen(), Some(2));
        hub.publish(&update(5, 3), 5);
        assert_eq!(hub.oldest_seen(), Some(5));
        // A subscriber whose snapshot is newer than what a publish read loses nothing by it.
        let mut newest = hub.subscribe(feed(), 6);
        hub.publish(&update(5, 6), 5);
        hub.publish(&update(7, 6), 7);
        for rx in [&mut early, &mut late, &mut newest] {
            assert!(matches!(
                rx.recv().await.unwrap().body,
                FeedBody::Snapshot(_)
            ));
        }
        assert_eq!(
            ids(early.recv().await.unwrap()),
            ["req_5", "req_4", "req_3"]
        );
        assert_eq!(ids(late.recv().await.unwrap()), ["req_5"]);
        assert!(ids(newest.recv().await.unwrap()).is_empty());
        assert_eq!(ids(early.recv().await.unwrap()), Vec::<String>::new());
        assert_eq!(ids(newest.recv().await.unwrap()), ["req_7"]);
        assert_eq!(ids(early.recv().await.unwrap()), ["req_7", "req_6"]);
    }

    #[tokio::test]
    async fn the_producer_waits_for_a_subscriber() {
        use futures_util::FutureExt;
        let hub = FeedHub::default();
        let mut wait = Box::pin(hub.first_subscriber());
        assert!(
            wait.as_mut().now_or_never().is_none(),
            "nobody subscribed yet"
        );
        let _a = hub.subscribe(feed(), 7);
        wait.await;
        drop(_a);
        hub.publish(&feed(), 7);
        assert_eq!(hub.subscribers(), 0, "the one who left is gone");
        assert_eq!(hub.oldest_seen(), None);
        let mut wait = Box::pin(hub.first_subscriber());
        assert!(
            wait.as_mut().now_or_never().is_none(),
            "nobody is subscribed"
        );
    }
}
