//! The console feed on the admin socket: a snapshot first, then updates as requests finish and
//! accounts change state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::gw::{Gw, body_plain};
use futures_util::StreamExt;
use switchyard::sim::FaultKind;
use switchyard_tui::wire::{FeedBody, FeedMessage, PROTOCOL_VERSION};
use tokio_tungstenite::tungstenite::Message;

async fn subscribe(gw: &Gw) -> tokio_tungstenite::WebSocketStream<tokio::net::UnixStream> {
    let stream = tokio::net::UnixStream::connect(&gw.socket).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async("ws://switchyard/api/admin/console", stream)
        .await
        .unwrap();
    ws
}

async fn next(ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::UnixStream>) -> FeedMessage {
    loop {
        match ws.next().await.expect("feed ended").unwrap() {
            Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
            Message::Close(c) => panic!("feed closed: {c:?}"),
            _ => {}
        }
    }
}

#[tokio::test]
async fn snapshot_then_updates_show_requests_and_an_account_going_to_cooling() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    let mut feed = subscribe(&gw).await;
    let first = next(&mut feed).await;
    assert_eq!(first.protocol, PROTOCOL_VERSION);
    let FeedBody::Snapshot(snap) = first.body else {
        panic!("first message is not a snapshot")
    };
    assert_eq!(snap.accounts.len(), 2);
    assert_eq!(snap.status.protocol, PROTOCOL_VERSION);

    gw.fault(
        &order[0],
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        None,
    );
    gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
    let mut saw_request = false;
    let mut saw_cooling = false;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(saw_request && saw_cooling) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no update showed the request and the cooling account"
        );
        let m = next(&mut feed).await;
        let FeedBody::Update(u) = m.body else {
            panic!("a second snapshot")
        };
        assert!(m.seq > 0);
        saw_request |= u
            .requests
            .iter()
            .any(|r| r.attempts.first().is_some_and(|a| a.class == "quota"));
        saw_cooling |= u.accounts.iter().any(|a| {
            a.chatgpt_account_id == order[0]
                && a.state == "cooling"
                && a.reason.as_deref() == Some("quota")
        });
    }
}
