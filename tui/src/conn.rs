//! The console's connection to the daemon's feed: a visible state machine (connecting,
//! connected, reconnecting in N s, refused) with a capped exponential backoff.

use std::time::Duration;

use futures_util::StreamExt;
use switchyard_admin::AdminClient;
use switchyard_admin::wire::{FeedMessage, PROTOCOL_VERSION};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// First retry delay.
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// No retry waits longer than this.
pub const BACKOFF_CAP: Duration = Duration::from_secs(8);

/// Retry delays: doubling from [`BACKOFF_BASE`], never above [`BACKOFF_CAP`].
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The delay before the next attempt, counting one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let shift = self.failures.min(16);
        self.failures = self.failures.saturating_add(1);
        BACKOFF_BASE.saturating_mul(1 << shift).min(BACKOFF_CAP)
    }

    /// A connection worked: start again from the base delay.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// What the connection task tells the console.
#[derive(Debug, Clone, PartialEq)]
pub enum ConnEvent {
    Connecting,
    /// The feed's first message arrived and its protocol matches.
    Connected,
    /// The connection failed or ended; the next attempt starts after `delay`.
    Reconnecting {
        delay: Duration,
        reason: String,
    },
    /// The daemon speaks another protocol: the console stops trying.
    Refused(String),
    Message(Box<FeedMessage>),
}

/// Why a connection ended.
enum Ended {
    Retry(String),
    Refuse(String),
}

/// Checks the protocol of a feed message before decoding it as this console's model, so a
/// daemon of another version gets a clear message instead of a decoding error.
pub fn decode(text: &str) -> Result<FeedMessage, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("feed message is not JSON: {e}"))?;
    let protocol = value.get("protocol").and_then(serde_json::Value::as_u64);
    if protocol != Some(u64::from(PROTOCOL_VERSION)) {
        let version = value
            .pointer("/status/version")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("unknown");
        let protocol = protocol.map_or("none".to_string(), |p| p.to_string());
        return Err(format!(
            "daemon is version {version} (protocol {protocol}), console expects protocol \
             {PROTOCOL_VERSION}: run the console of the daemon's version"
        ));
    }
    serde_json::from_value(value).map_err(|e| format!("cannot read the feed: {e}"))
}

/// Keeps the console connected until `events` closes or the daemon is refused.
pub async fn run(client: AdminClient, events: mpsc::Sender<ConnEvent>) {
    let mut backoff = Backoff::default();
    loop {
        if events.send(ConnEvent::Connecting).await.is_err() {
            return;
        }
        let reason = match once(&client, &events, &mut backoff).await {
            Ended::Refuse(msg) => {
                let _ = events.send(ConnEvent::Refused(msg)).await;
                return;
            }
            Ended::Retry(reason) => reason,
        };
        if events.is_closed() {
            return;
        }
        let delay = backoff.next_delay();
        let event = ConnEvent::Reconnecting { delay, reason };
        if events.send(event).await.is_err() {
            return;
        }
        tokio::time::sleep(delay).await;
    }
}

/// One connection, from the handshake to its end.
async fn once(
    client: &AdminClient,
    events: &mpsc::Sender<ConnEvent>,
    backoff: &mut Backoff,
) -> Ended {
    let mut socket = match client.feed().await {
        Ok(s) => s,
        Err(e) => return Ended::Retry(e.to_string()),
    };
    let mut first = true;
    while let Some(frame) = socket.next().await {
        let text = match frame {
            Ok(Message::Text(t)) => t,
            Ok(Message::Close(c)) => {
                let why = c.map_or_else(|| "closed".to_string(), |c| c.reason.to_string());
                return Ended::Retry(format!("the daemon closed the feed: {why}"));
            }
            Ok(_) => continue,
            Err(e) => return Ended::Retry(format!("feed lost: {e}")),
        };
        let msg = match decode(&text) {
            Ok(m) => m,
            Err(e) if first => return Ended::Refuse(e),
            Err(e) => return Ended::Retry(e),
        };
        if first {
            first = false;
            backoff.reset();
            if events.send(ConnEvent::Connected).await.is_err() {
                return Ended::Retry("console closed".into());
            }
        }
        if events
            .send(ConnEvent::Message(Box::new(msg)))
            .await
            .is_err()
        {
            return Ended::Retry("console closed".into());
        }
    }
    Ended::Retry("the feed ended".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_stays_at_the_cap() {
        let mut b = Backoff::default();
        let delays: Vec<Duration> = (0..40).map(|_| b.next_delay()).collect();
        assert_eq!(delays[0], BACKOFF_BASE);
        assert_eq!(delays[1], BACKOFF_BASE * 2);
        assert_eq!(delays[2], BACKOFF_BASE * 4);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]), "never shrinks");
        assert!(
            delays.iter().all(|d| *d <= BACKOFF_CAP),
            "capped: {delays:?}"
        );
        assert_eq!(delays[39], BACKOFF_CAP);
        b.reset();
        assert_eq!(b.next_delay(), BACKOFF_BASE);
    }

    #[test]
    fn another_protocol_is_refused_with_both_versions_named() {
        let text =
            r#"{"protocol":99,"dropped":0,"seq":0,"kind":"snapshot","status":{"version":"9.9.9"}}"#;
        let err = decode(text).unwrap_err();
        assert!(
            err.contains("daemon is version 9.9.9 (protocol 99)"),
            "{err}"
        );
        assert!(err.contains(&format!("console expects protocol {PROTOCOL_VERSION}")));
        let none = decode(r#"{"hello":1}"#).unwrap_err();
        assert!(none.contains("protocol none"), "{none}");
    }
}
