//! What the console knows: the daemon's latest state from the feed, the requests it has seen,
//! and the figures derived from them. Apart from the panes, which only read it.

pub mod stats;

use std::collections::{BTreeMap, VecDeque};

pub use stats::{AccountStats, AffinityStats, Percentiles, QueueStats, TransportStats};
use switchyard_admin::wire::{
    Account, BreakerState, Feed, FeedBody, FeedMessage, KeyLive, RequestRecord, Status,
};

/// Requests kept for the tail and the windows.
pub const KEEP_REQUESTS: usize = 5000;
/// The window of success rates, time to first token and the other recent figures.
pub const WINDOW_MS: u64 = 5 * 60 * 1000;

/// The connection as the header shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Link {
    #[default]
    Connecting,
    Connected,
    Reconnecting {
        /// Whole seconds until the next attempt.
        in_s: u64,
        reason: String,
    },
    /// The daemon speaks another protocol.
    Refused(String),
}

/// A finished request and when it finished (daemon clock, unix ms).
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub at_ms: u64,
    pub record: RequestRecord,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    pub link: Link,
    /// The daemon's state; `None` until the first snapshot.
    pub status: Option<Status>,
    pub accounts: Vec<Account>,
    /// Newest first.
    pub requests: VecDeque<Finished>,
    pub sessions: BTreeMap<String, usize>,
    pub ws_pool_idle: usize,
    pub ws_pool: BTreeMap<String, usize>,
    pub breaker: BreakerState,
    pub pool_waiting: usize,
    pub pool_oldest_wait_ms: Option<u64>,
    /// The client keys, live, as the last message listed them (every message has them all).
    pub keys: Vec<KeyLive>,
    /// The daemon's clock at its last message (unix ms).
    pub now_ms: u64,
    /// Feed messages the daemon says this subscription missed, over all subscriptions.
    pub dropped_events: u64,
    /// Subscribers the daemon dropped for falling behind.
    pub dropped_subscribers: u64,
    /// Snapshots received: the first, then one per reconnection.
    pub snapshots: u64,
}

impl State {
    /// Takes in one feed message: a snapshot replaces what is known, an update adds to it.
    pub fn apply(&mut self, msg: FeedMessage) {
        self.dropped_events += msg.dropped;
        match msg.body {
            FeedBody::Snapshot(feed) => {
                self.snapshots += 1;
                self.requests.clear();
                self.take(feed);
            }
            FeedBody::Update(feed) => self.take(feed),
        }
    }

    fn take(&mut self, feed: Feed) {
        let now_ms = if feed.now_ms > 0 {
            feed.now_ms
        } else {
            stats::wall_ms()
        };
        self.now_ms = now_ms;
        self.status = Some(feed.status);
        self.accounts = feed.accounts;
        self.sessions = feed.sessions;
        self.ws_pool_idle = feed.ws_pool_idle;
        self.ws_pool = feed.ws_pool;
        self.breaker = feed.breaker;
        self.pool_waiting = feed.pool_waiting;
        self.pool_oldest_wait_ms = feed.pool_oldest_wait_ms;
        self.dropped_subscribers = feed.dropped_subscribers;
        self.keys = feed.keys;
        // Records come newest first; push the oldest first so the newest ends up in front.
        for record in feed.requests.into_iter().rev() {
            let at_ms = stats::finished_ms(&record).unwrap_or(now_ms);
            if self
                .requests
                .iter()
                .take(64)
                .any(|f| f.record.id == record.id)
            {
                continue;
            }
            self.requests.push_front(Finished { at_ms, record });
        }
        self.requests.truncate(KEEP_REQUESTS);
    }

    /// The account with this `chatgpt_account_id`.
    pub fn account(&self, chatgpt_id: &str) -> Option<&Account> {
        self.accounts
            .iter()
            .find(|a| a.chatgpt_account_id == chatgpt_id)
    }

    /// A short name for an account known by its `chatgpt_account_id`: its label.
    pub fn account_name<'a>(&'a self, chatgpt_id: &'a str) -> &'a str {
        self.account(chatgpt_id)
            .map_or(chatgpt_id, |a| a.label.as_str())
    }

    /// The requests that finished within the window.
    pub fn recent(&self) -> impl Iterator<Item = &Finished> {
        let since = self.now_ms.saturating_sub(WINDOW_MS);
        self.requests.iter().filter(move |f| f.at_ms >= since)
    }
}
