//! The console feed on the admin socket: a snapshot first, then updates as requests finish and
//! accounts change state.

use crate::common;
use crate::common::gw::{Gw, body_plain};
use futures_util::StreamExt;
use switchyard::sim::FaultKind;
use switchyard_admin::wire::{FeedBody, FeedMessage, PROTOCOL_VERSION};
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
        saw_request |= u.requests.iter().any(|r| {
            r.attempts
                .first()
                .is_some_and(|a| a.class.as_str() == "quota")
        });
        saw_cooling |= u.accounts.iter().any(|a| {
            a.chatgpt_account_id == order[0]
                && a.state.as_str() == "cooling"
                && a.reason.as_ref().map(|r| r.as_str()) == Some("quota")
        });
    }
}

/// A console that stops reading is dropped once its queue is full, while requests keep being
/// served and a console that reads keeps its feed; the dropped one reconnects to a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_console_is_dropped_while_requests_and_other_consoles_go_on() {
    // Many accounts make every update large, so the stalled socket's buffers fill quickly.
    let gw = Gw::start(60).await;
    let mut live = subscribe(&gw).await;
    assert!(matches!(next(&mut live).await.body, FeedBody::Snapshot(_)));
    // Subscribes and then never reads.
    let stalled = subscribe(&gw).await;

    let mut served = 0;
    let mut updates = 0;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled console was never dropped ({served} requests, {updates} updates)"
        );
        // Requests go on, every one of them served...
        let sse = gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
        assert_eq!(sse.last().0, "response.completed");
        served += 1;
        // ...and the live console keeps receiving updates, in order.
        let m = next(&mut live).await;
        assert_eq!(m.seq, updates + 1, "no gap in the live console's feed");
        updates += 1;
        let FeedBody::Update(u) = m.body else {
            panic!("the live console got a second snapshot")
        };
        if u.dropped_subscribers == 1 {
            break;
        }
    }
    assert!(served > 0);

    // The stalled console, once it reads, finds the end of its feed: a close saying it fell
    // behind, after no more than what its queue and the socket held.
    let mut stalled = stalled;
    let mut held = 0;
    let close = loop {
        match stalled.next().await {
            Some(Ok(Message::Text(_))) => held += 1,
            Some(Ok(Message::Close(c))) => break c,
            Some(Ok(_)) => {}
            other => panic!("the stalled feed ended without a close: {other:?}"),
        }
    };
    let close = close.expect("a close frame with a reason");
    assert_eq!(u16::from(close.code), 1013, "{close:?}");
    assert!(close.reason.contains("fell behind"), "{close:?}");
    assert!(held > 0);

    // It reconnects to a fresh snapshot.
    let mut again = subscribe(&gw).await;
    let m = next(&mut again).await;
    let FeedBody::Snapshot(snap) = m.body else {
        panic!("a reconnection starts with a snapshot")
    };
    assert_eq!(snap.accounts.len(), 60);
    assert_eq!(snap.dropped_subscribers, 1);
}

/// A console that leaves, a request served while nobody watches, then a console that comes
/// back: its snapshot has the request from while it was away, and its updates bring the next
/// one without repeating the first.
#[tokio::test]
async fn a_console_that_comes_back_sees_what_happened_meanwhile_once() {
    let gw = Gw::start(1).await;
    let newest = || async { gw.requests(1).await.first().map(|r| r["id"].clone()) };
    let mut first = subscribe(&gw).await;
    assert!(matches!(next(&mut first).await.body, FeedBody::Snapshot(_)));
    drop(first);

    let before = newest().await;
    gw.stream(&body_plain("gpt-5.5", "while away", true), &[])
        .await;
    common::gw::until("the request is recorded", || async {
        newest().await != before
    })
    .await;
    let away = newest().await.unwrap();

    let mut back = subscribe(&gw).await;
    let FeedBody::Snapshot(snap) = next(&mut back).await.body else {
        panic!("first message is not a snapshot")
    };
    assert!(
        snap.requests.iter().any(|r| away == r.id.as_str()),
        "the snapshot lacks {away}"
    );

    gw.stream(&body_plain("gpt-5.5", "after", true), &[]).await;
    common::gw::until("the request is recorded", || async {
        newest().await.as_ref() != Some(&away)
    })
    .await;
    let after = newest().await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no update brought {after}"
        );
        let FeedBody::Update(u) = next(&mut back).await.body else {
            panic!("a second snapshot")
        };
        assert!(
            !u.requests.iter().any(|r| away == r.id.as_str()),
            "an update repeated {away}, which the snapshot had"
        );
        if u.requests.iter().any(|r| after == r.id.as_str()) {
            break;
        }
    }
}
