//! The connection state machine against a stand-in daemon on loopback: a daemon of another
//! protocol version is refused with a clear message; a feed that ends is retried after the
//! first backoff step, and the next connection starts from a fresh snapshot.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use futures_util::SinkExt;
use switchyard_admin::wire::{FeedBody, PROTOCOL_VERSION};
use switchyard_admin::{AdminClient, Target};
use switchyard_tui::conn::{self, BACKOFF_BASE, ConnEvent};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// A stand-in feed that sends `messages` on each connection, then closes it.
async fn daemon(messages: Vec<String>) -> (String, mpsc::Receiver<Option<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (seen_tx, seen_rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = seen_tx.clone();
            let auth = std::sync::Arc::new(std::sync::Mutex::new(None));
            let auth2 = auth.clone();
            let mut ws = tokio_tungstenite::accept_hdr_async(
                stream,
                move |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
                    *auth2.lock().unwrap() = req
                        .headers()
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_string());
                    Ok(resp)
                },
            )
            .await
            .unwrap();
            let header = auth.lock().unwrap().clone();
            seen.send(header).await.unwrap();
            for m in &messages {
                ws.send(Message::text(m.clone())).await.unwrap();
            }
            let _ = ws.close(None).await;
        }
    });
    (addr, seen_rx)
}

fn snapshot(protocol: u32) -> String {
    serde_json::json!({
        "protocol": protocol, "dropped": 0, "seq": 0, "kind": "snapshot",
        "status": {"version": "7.0.0", "protocol": protocol, "pid": 1, "uptime_s": 5,
                   "listen": "127.0.0.1:1", "accounts": 0, "in_flight": 0, "waiting": 0},
        "accounts": [], "requests": []
    })
    .to_string()
}

async fn next(rx: &mut mpsc::Receiver<ConnEvent>) -> ConnEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event within 10 s")
        .expect("the connection task runs")
}

#[tokio::test]
async fn another_protocol_version_is_refused_by_name() {
    let (addr, mut seen) = daemon(vec![snapshot(PROTOCOL_VERSION + 1)]).await;
    let client = AdminClient::new(Target::from_url(&format!("http://{addr}"), "tok").unwrap());
    let (tx, mut rx) = mpsc::channel(16);
    let task = tokio::spawn(conn::run(client, tx));
    assert_eq!(next(&mut rx).await, ConnEvent::Connecting);
    let ConnEvent::Refused(msg) = next(&mut rx).await else {
        panic!("refused");
    };
    assert_eq!(
        msg,
        format!(
            "daemon is version 7.0.0 (protocol {}), console expects protocol {PROTOCOL_VERSION}: \
             run the console of the daemon's version",
            PROTOCOL_VERSION + 1
        )
    );
    // The admin token went along, and the console gave up instead of retrying.
    assert_eq!(seen.recv().await.unwrap().as_deref(), Some("Bearer tok"));
    task.await.unwrap();
    assert!(rx.recv().await.is_none());
}

#[tokio::test]
async fn an_ended_feed_is_retried_from_a_fresh_snapshot() {
    let (addr, _seen) = daemon(vec![snapshot(PROTOCOL_VERSION)]).await;
    let client = AdminClient::new(Target::from_url(&addr, "t").unwrap());
    let (tx, mut rx) = mpsc::channel(16);
    tokio::spawn(conn::run(client, tx));
    for round in 0..2 {
        assert_eq!(next(&mut rx).await, ConnEvent::Connecting, "round {round}");
        assert_eq!(next(&mut rx).await, ConnEvent::Connected);
        let ConnEvent::Message(m) = next(&mut rx).await else {
            panic!("the snapshot");
        };
        assert!(matches!(m.body, FeedBody::Snapshot(_)));
        let ConnEvent::Reconnecting { delay, reason } = next(&mut rx).await else {
            panic!("reconnecting");
        };
        // Each connection worked, so the backoff starts over each time.
        assert_eq!(delay, BACKOFF_BASE, "{reason}");
    }
}

#[tokio::test]
async fn no_daemon_backs_off_exponentially() {
    // A port nothing listens on: bind, note it, close.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    };
    let client = AdminClient::new(Target::from_url(&addr, "t").unwrap());
    let (tx, mut rx) = mpsc::channel(16);
    tokio::spawn(conn::run(client, tx));
    let mut delays = Vec::new();
    while delays.len() < 2 {
        if let ConnEvent::Reconnecting { delay, reason } = next(&mut rx).await {
            assert!(reason.contains("cannot reach the daemon"), "{reason}");
            delays.push(delay);
        }
    }
    assert_eq!(delays, vec![BACKOFF_BASE, BACKOFF_BASE * 2]);
}
