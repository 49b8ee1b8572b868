//! The Responses WebSocket ingress, against the simulator (turns bridged over HTTP/SSE).

use crate::common;
use crate::common::SIGNAL_DEADLINE;
use crate::common::gw::{Gw, until};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::sim::FaultKind;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(gw: &Gw, key: Option<&str>) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    if let Some(k) = key {
        req.headers_mut()
            .insert("authorization", format!("Bearer {k}").parse().unwrap());
    }
    req.headers_mut()
        .insert("session-id", "ws-session".parse().unwrap());
    tokio_tungstenite::connect_async(req)
        .await
        .map(|(ws, _)| ws)
}

fn create(extra: Value) -> Message {
    let mut v = json!({
        "type": "response.create",
        "model": "gpt-5.5",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        "store": false,
        "stream": true,
    });
    for (k, val) in extra.as_object().unwrap() {
        v[k] = val.clone();
    }
    Message::Text(v.to_string().into())
}

/// Reads frames until a terminal event or an error frame.
async fn turn(ws: &mut Ws) -> Vec<Value> {
    let mut events = Vec::new();
    while let Some(msg) = ws.next().await {
        match msg.unwrap() {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                let kind = v["type"].as_str().unwrap_or("").to_string();
                events.push(v);
                if matches!(
                    kind.as_str(),
                    "response.completed" | "response.failed" | "response.incomplete" | "error"
                ) {
                    break;
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    events
}

#[tokio::test]
async fn the_handshake_needs_a_client_key() {
    let gw = Gw::start(1).await;
    match connect(&gw, None).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 401),
        other => panic!("expected 401, got {other:?}"),
    }
    assert!(connect(&gw, Some(&gw.key)).await.is_ok());
}

#[tokio::test]
async fn ws_turns_share_one_upstream_socket_and_fail_over_before_commit() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        None,
    );
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({}))).await.unwrap();
    let first = turn(&mut ws).await;
    assert_eq!(
        first.last().unwrap()["type"],
        "response.completed",
        "{first:?}"
    );
    assert_eq!(
        first
            .iter()
            .filter(|e| e["type"] == "response.created")
            .count(),
        1
    );
    let id = first.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A continuation on the socket that produced the response: sent as it came (the socket
    // holds the history).
    ws.send(create(json!({"previous_response_id": id, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]}]})))
        .await
        .unwrap();
    let second = turn(&mut ws).await;
    assert_eq!(
        second.last().unwrap()["type"],
        "response.completed",
        "{second:?}"
    );
    let sent = gw.sim.sim.requests(&order[1]);
    let last = &sent.last().unwrap().body;
    assert_eq!(last["previous_response_id"], id.as_str());
    assert_eq!(last["input"].as_array().unwrap().len(), 1);
    let recs = gw.requests(2).await;
    assert!(recs.iter().all(|r| r["ws"] == true), "{recs:?}");
    assert_eq!(recs[1]["attempts"][0]["class"], "quota");
    // Both turns used one upstream socket on the serving account.
    assert_eq!(
        (recs[1]["transport"].as_str(), recs[0]["transport"].as_str()),
        (Some("ws_connected"), Some("ws_reused"))
    );
    assert!(recs[1]["ws_connect_ms"].is_u64());
    assert_eq!(gw.sim.sim.ws_connections(&order[1]), 1);
}

#[tokio::test]
async fn warmup_and_continuation_stay_on_one_account() {
    let gw = Gw::start(2).await;
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({"generate": false}))).await.unwrap();
    let warm = turn(&mut ws).await;
    assert_eq!(warm.last().unwrap()["type"], "response.completed");
    let id = response_id(&warm);
    let real = continue_with_empty_input(&mut ws, &id).await;
    assert_eq!(
        real.last().unwrap()["type"],
        "response.completed",
        "{real:?}"
    );
    // Both went to one account, on one upstream socket: the warm-up as sent, the continuation
    // as sent (the socket holds the warm-up's state).
    let recs = gw.requests(2).await;
    assert_eq!(recs[0]["account"], recs[1]["account"]);
    let a = recs[0]["account"].as_str().unwrap().to_string();
    assert_eq!(gw.sim.sim.ws_connections(&a), 1);
    let frames: Vec<_> = gw
        .sim
        .sim
        .requests(&a)
        .into_iter()
        .filter(|r| r.method == "WS")
        .collect();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].body["generate"], false);
    assert_eq!(frames[1].body["previous_response_id"], id.as_str());
    assert_eq!(frames[1].body["input"], json!([]));
    assert_eq!(
        (recs[1]["transport"].as_str(), recs[0]["transport"].as_str()),
        (Some("ws_connected"), Some("ws_reused"))
    );
}

#[tokio::test]
async fn a_warm_up_over_http_is_answered_by_the_gateway_and_its_continuation_carries_the_history() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::WsRefuse426, Some(2));
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({"generate": false}))).await.unwrap();
    let warm = turn(&mut ws).await;
    let id = response_id(&warm);
    let real = continue_with_empty_input(&mut ws, &id).await;
    assert_eq!(
        real.last().unwrap()["type"],
        "response.completed",
        "{real:?}"
    );
    let posts: Vec<_> = gw
        .sim
        .sim
        .requests(&a)
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(
        posts.len(),
        1,
        "only the real turn reached the backend, over HTTP"
    );
    assert_eq!(
        posts[0].body["input"][0]["content"][0]["text"], "hello",
        "with the warm-up's input"
    );
    assert!(posts[0].body.get("previous_response_id").is_none());
    // The warm-up's answer was the gateway's own; the real turn's the backend's.
    let recs = gw.requests(2).await;
    assert_eq!(recs[1]["terminal_source"], "synthetic", "{}", recs[1]);
    assert_eq!(recs[0]["terminal_source"], "upstream", "{}", recs[0]);
}

#[tokio::test]
async fn an_unknown_previous_response_is_not_found_and_the_socket_stays_open() {
    let gw = Gw::start(1).await;
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({"previous_response_id": "resp_elsewhere"})))
        .await
        .unwrap();
    let err = turn(&mut ws).await;
    assert_eq!(err.last().unwrap()["type"], "error");
    assert_eq!(
        err.last().unwrap()["error"]["code"],
        "previous_response_not_found"
    );
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
}

#[tokio::test]
async fn past_its_history_bound_a_connection_forgets_its_oldest_response_and_serves_the_newest() {
    let gw = Gw::start(1).await;
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    // About 1 MB of input each (within the model's context window): seventeen of them pass
    // the connection's 16 MiB of history.
    let text = "x".repeat(1_000_000);
    let mut ids = Vec::new();
    for i in 0..17 {
        let input = json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": format!("{i} {text}")}]}]);
        ws.send(create(json!({ "input": input }))).await.unwrap();
        let events = turn(&mut ws).await;
        assert_eq!(events.last().unwrap()["type"], "response.completed");
        ids.push(response_id(&events));
    }
    let not_found = |events: &[Value]| {
        let last = events.last().unwrap();
        last["type"] == "error" && last["error"]["code"] == "previous_response_not_found"
    };
    // The oldest is forgotten: it is answered as an id the connection never produced.
    let oldest = continue_with_empty_input(&mut ws, &ids[0]).await;
    assert!(not_found(&oldest), "{oldest:?}");
    // The newest continues. Its continuation holds the same input (counted once) and a new
    // output: it pushes nothing out, and the next oldest continues too.
    let newest = continue_with_empty_input(&mut ws, &ids[16]).await;
    assert_eq!(newest.last().unwrap()["type"], "response.completed");
    let second = continue_with_empty_input(&mut ws, &ids[1]).await;
    assert_eq!(second.last().unwrap()["type"], "response.completed");
    // One more megabyte of new input: the oldest entries go until what stays fits. The first
    // to go (ids[1]) frees nothing, since its continuation holds the same input: ids[2] goes
    // as well, and ids[3] stays.
    let input = json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": format!("17 {text}")}]}]);
    ws.send(create(json!({ "input": input }))).await.unwrap();
    assert_eq!(
        turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
    for gone in [&ids[1], &ids[2]] {
        let events = continue_with_empty_input(&mut ws, gone).await;
        assert!(not_found(&events), "{events:?}");
    }
    let kept = continue_with_empty_input(&mut ws, &ids[3]).await;
    assert_eq!(kept.last().unwrap()["type"], "response.completed");
}

#[tokio::test]
async fn exhaustion_arrives_as_an_error_frame() {
    let gw = Gw::start(1).await;
    gw.fault(
        &gw.rr_order()[0],
        FaultKind::Quota {
            resets_in_seconds: 600,
        },
        None,
    );
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({}))).await.unwrap();
    let err = turn(&mut ws).await;
    let last = err.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["status"].as_u64()),
        (Some("error"), Some(429))
    );
    assert_eq!(last["error"]["type"], "usage_limit_reached");
}

#[tokio::test]
async fn oversized_and_binary_frames_close_cleanly() {
    let gw = Gw::start(1).await;
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(Message::Binary(vec![1, 2, 3].into()))
        .await
        .unwrap();
    let close = loop {
        match ws.next().await {
            Some(Ok(Message::Close(c))) => break c,
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(u16::from(close.unwrap().code), 1003);

    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    let big = "x".repeat(17 * 1024 * 1024);
    let _ = ws.send(Message::Text(big.into())).await;
    let code = loop {
        match ws.next().await {
            Some(Ok(Message::Close(c))) => break c.map(|c| u16::from(c.code)),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => break None,
        }
    };
    assert_eq!(code, Some(1009));
    // The gateway is unharmed.
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
}

fn response_id(events: &[Value]) -> String {
    events.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Sends a continuation of `id` with no new input (what Codex sends after a warm-up).
async fn continue_with_empty_input(ws: &mut Ws, id: &str) -> Vec<Value> {
    ws.send(create(json!({"previous_response_id": id, "input": []})))
        .await
        .unwrap();
    turn(ws).await
}

async fn one_turn(gw: &Gw) -> (Vec<Value>, Value) {
    let mut ws = connect(gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({}))).await.unwrap();
    let events = turn(&mut ws).await;
    let rec = gw.requests(1).await.remove(0);
    (events, rec)
}

#[tokio::test]
async fn ws_falls_back_to_http_bridge_when_refused() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::WsRefuse426, Some(1));
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    assert_eq!(rec["transport"], "http_ws_failed");
    assert!(
        gw.sim.sim.requests(&a).iter().any(|r| r.method == "POST"),
        "the turn went over HTTP"
    );
}

#[tokio::test]
async fn a_slow_handshake_bridges_the_turn_over_http() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::WsSlowHandshake { ms: 2000 }, Some(1));
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    assert_eq!(rec["transport"], "http_ws_budget_exhausted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_that_misses_the_budget_keeps_going_and_serves_the_sessions_next_turn() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::WsSlowHandshake { ms: 1200 }, Some(1));
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    assert_eq!(rec["transport"], "http_ws_budget_exhausted");
    common::gw::until("the late socket to join the pool", || async {
        gw.metrics_text()
            .await
            .contains("switchyard_ws_pool_idle 1\n")
    })
    .await;
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    assert_eq!(rec["transport"], "ws_reused", "{rec}");
}

#[tokio::test]
async fn ws_close_mid_turn_after_commit_marks_account() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::WsCloseMidTurn { after_deltas: 2 },
        Some(1),
    );
    let (events, rec) = one_turn(&gw).await;
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.failed", "{events:?}");
    assert_eq!(last["response"]["error"]["code"], "upstream_stream_error");
    assert_eq!(rec["outcome"], "stream_error");
    let acct = gw.account(&order[0]).await;
    assert_eq!(
        (acct["state"].as_str(), acct["reason"].as_str()),
        (Some("cooling"), Some("transient"))
    );
    assert_eq!(gw.served(&order[1]), 0, "no replay after commit");
}

/// A client that closes its socket in the middle of a turn: the turn ends as its client's
/// leaving, its record is kept, and the account is neither marked nor left holding the slot.
#[tokio::test]
async fn a_client_that_leaves_mid_turn_is_recorded_and_frees_its_slot() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::HangMidStream { after_deltas: 1 }, Some(1));
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({}))).await.unwrap();
    loop {
        let Message::Text(t) = ws.next().await.unwrap().unwrap() else {
            continue;
        };
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        if v["type"].as_str().unwrap_or("").ends_with(".delta") {
            break;
        }
    }
    drop(ws);
    gw.recorded_as_client_cancelled(&a).await;
}

#[tokio::test]
async fn ws_error_frame_before_commit_fails_over_invisibly() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::WsErrorFrame {
            status: 429,
            code: "rate_limit_exceeded".into(),
        },
        Some(1),
    );
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    assert_eq!(events.iter().filter(|e| e["type"] == "error").count(), 0);
    assert_eq!(rec["attempts"][0]["class"], "rate_limited");
    assert_eq!(gw.account(&order[0]).await["reason"], "rate_limited");
}

#[tokio::test]
async fn transport_decisions_show_in_metrics() {
    let gw = Gw::start(1).await;
    one_turn(&gw).await;
    let text = gw.metrics_text().await;
    for needle in [
        "switchyard_transport_decisions_total{transport=\"ws_connected\"} 1",
        "switchyard_ws_connect_seconds_count 1",
        "switchyard_ws_pool_idle 1",
        "switchyard_ws_breaker_open 0",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
}

#[tokio::test]
async fn ws_turn_waits_for_slot() {
    let gw = Gw::start_with(1, |c| c.scheduling.max_concurrency = 1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::SlowFirstToken { ms: 600 }, Some(1));
    let holder = gw.spawn_stream(common::gw::body_plain("gpt-5.5", "slow", true));
    until("the slot to be taken", || async {
        gw.account(&a).await["in_flight"] == 1
    })
    .await;
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    assert_eq!(rec["queue"]["outcome"], "acquired", "{rec}");
    assert!(rec["queue"]["wait_ms"].as_u64().unwrap() > 0);
    assert_eq!(holder.await.unwrap().last().0, "response.completed");
}

#[tokio::test]
async fn ws_handshake_rejection_is_classified_and_fails_over() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    // The first account's handshake is answered 401 account_deactivated.
    assert!(gw.sim.sim.set_deactivated(&order[0], true));
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    assert_eq!(rec["attempts"][0]["class"], "auth_dead", "{rec}");
    assert_eq!(rec["attempts"][0]["status"], 401);
    assert_eq!(rec["attempts"][0]["phase"], "pre_headers");
    assert_eq!(rec["account"], order[1].as_str());
    assert_eq!(rec["transport"], "ws_connected");
    assert_eq!(gw.account(&order[0]).await["state"], "needs_reauth");
}

#[tokio::test]
async fn a_continuation_that_must_move_carries_its_full_history() {
    let gw = Gw::start(2).await;
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({}))).await.unwrap();
    let first = turn(&mut ws).await;
    let id = first.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let a = gw.requests(1).await[0]["account"]
        .as_str()
        .unwrap()
        .to_string();
    gw.admin_call(
        axum::http::Method::POST,
        &format!("/api/admin/accounts/{a}/disable"),
        None,
    )
    .await;
    ws.send(create(json!({"previous_response_id": id, "input": []})))
        .await
        .unwrap();
    let second = turn(&mut ws).await;
    assert_eq!(
        second.last().unwrap()["type"],
        "response.completed",
        "{second:?}"
    );
    let rec = &gw.requests(1).await[0];
    let b = rec["account"].as_str().unwrap().to_string();
    assert_ne!(a, b);
    let sent = gw.sim.sim.requests(&b);
    let body = &sent.iter().rev().find(|r| r.method == "WS").unwrap().body;
    assert!(
        body.get("previous_response_id").is_none(),
        "no reference the new socket cannot resolve"
    );
    assert!(
        body["input"].as_array().unwrap().len() >= 2,
        "the first input and its output: {body}"
    );
}

#[tokio::test]
async fn ws_handshake_429_fails_over() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::WsHandshakeError { status: 429 },
        Some(1),
    );
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    assert_eq!(rec["attempts"][0]["class"], "rate_limited", "{rec}");
    assert_eq!(rec["attempts"][0]["status"], 429);
    assert_eq!(rec["account"], order[1].as_str());
    let a = gw.account(&order[0]).await;
    assert_eq!(
        (a["state"].as_str(), a["reason"].as_str()),
        (Some("cooling"), Some("rate_limited"))
    );
    assert_eq!(a["limit"], 1, "the burst halved the adaptive limit");
}

#[tokio::test]
async fn ws_dial_failure_fails_over_same_turn() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::WsHandshakeError { status: 502 },
        Some(1),
    );
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    let text = "the current turn's payload";
    ws.send(create(json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]})))
        .await
        .unwrap();
    let events = turn(&mut ws).await;
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["attempts"][0]["class"], "transient");
    assert_eq!(rec["account"], order[1].as_str());
    let sent = gw.sim.sim.requests(&order[1]);
    let frame = sent.iter().rev().find(|r| r.method == "WS").unwrap();
    assert_eq!(
        frame.body["input"][0]["content"][0]["text"], text,
        "the same turn went to the other account"
    );
}

#[tokio::test]
async fn breaker_opens_after_degraded_openings_and_half_opens() {
    use std::sync::Arc;
    use switchyard::base::clock::{Clock, ManualClock, SystemClock};
    let clock = ManualClock::new(SystemClock.now_ms());
    let gw = Gw::start_opts(common::gw::GwOptions {
        accounts: 1,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::WsRefuse426, Some(4));
    for _ in 0..3 {
        assert_eq!(one_turn(&gw).await.1["transport"], "http_ws_failed");
    }
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    assert_eq!(rec["transport"], "http_breaker_open");
    // After 30 s one probe goes through; it fails (the fourth 426) and the breaker re-opens.
    clock.advance(std::time::Duration::from_secs(31));
    assert_eq!(one_turn(&gw).await.1["transport"], "http_ws_failed");
    assert_eq!(one_turn(&gw).await.1["transport"], "http_breaker_open");
    // The next probe succeeds and closes it.
    clock.advance(std::time::Duration::from_secs(31));
    assert_eq!(one_turn(&gw).await.1["transport"], "ws_connected");
    let next = one_turn(&gw).await.1;
    assert!(
        next["transport"].as_str().unwrap().starts_with("ws_"),
        "{next}"
    );
}

#[tokio::test]
async fn ws_budget_resets_after_completed_turn() {
    // Each turn has its own failover budget: failovers spent by earlier turns of the connection
    // do not leave later turns without one.
    let gw = Gw::start(4).await;
    let order = gw.rr_order();
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    for round in 0..3 {
        // Whatever account the session is on now fails this turn before the commit.
        let bound = gw
            .requests(1)
            .await
            .first()
            .and_then(|r| r["account"].as_str().map(str::to_string))
            .unwrap_or_else(|| order[0].clone());
        gw.fault(
            &bound,
            FaultKind::WsErrorFrame {
                status: 500,
                code: "server_error".into(),
            },
            Some(1),
        );
        ws.send(create(json!({}))).await.unwrap();
        let events = turn(&mut ws).await;
        assert_eq!(
            events.last().unwrap()["type"],
            "response.completed",
            "round {round}: {events:?}"
        );
        let rec = &gw.requests(1).await[0];
        if round > 0 {
            assert_eq!(
                rec["attempts"][0]["class"], "transient",
                "round {round}: {rec}"
            );
            assert_eq!(rec["attempts"].as_array().unwrap().len(), 2);
        }
    }
}

#[tokio::test]
async fn the_current_turns_model_picks_the_accounts() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.sim
        .sim
        .set_supported_models(&order[0], vec!["gpt-5.5".into()]);
    gw.sim
        .sim
        .set_supported_models(&order[1], vec!["gpt-5.5".into(), "gpt-5.4".into()]);
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({}))).await.unwrap();
    assert_eq!(
        turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
    ws.send(create(json!({"model": "gpt-5.4"}))).await.unwrap();
    assert_eq!(
        turn(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["model"], "gpt-5.4");
    assert_eq!(rec["account"], order[1].as_str());
}

/// A connection without any session header (what `client.responses.connect()` opens).
async fn connect_without_session(gw: &Gw) -> Ws {
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", gw.key).parse().unwrap(),
    );
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

async fn idle_sockets(gw: &Gw) -> u64 {
    let text = gw.metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix("switchyard_ws_pool_idle "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn turns_of_a_connection_without_a_session_keep_their_account_and_socket() {
    let gw = Gw::start(2).await;
    let mut ws = connect_without_session(&gw).await;
    ws.send(create(json!({"prompt_cache_key": null})))
        .await
        .unwrap();
    let first = turn(&mut ws).await;
    assert_eq!(first.last().unwrap()["type"], "response.completed");
    let id = response_id(&first);
    for i in 0..3 {
        ws.send(create(json!({"previous_response_id": id, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": format!("more {i}")}]}]})))
            .await
            .unwrap();
        let next = turn(&mut ws).await;
        assert_eq!(
            next.last().unwrap()["type"],
            "response.completed",
            "{next:?}"
        );
    }
    let records = gw.requests(4).await;
    let accounts: Vec<&str> = records
        .iter()
        .map(|r| r["account"].as_str().unwrap())
        .collect();
    assert!(accounts.iter().all(|a| *a == accounts[0]), "{accounts:?}");
    let transports: Vec<&str> = records
        .iter()
        .rev()
        .map(|r| r["transport"].as_str().unwrap())
        .collect();
    assert_eq!(
        transports,
        ["ws_connected", "ws_reused", "ws_reused", "ws_reused"],
        "one upstream socket for the connection"
    );
}

#[tokio::test]
async fn a_rejected_handshake_is_recorded_as_rejected() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::WsHandshakeError { status: 429 }, Some(1));
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(events.last().unwrap()["type"], "error", "{events:?}");
    assert_eq!(rec["transport"], "ws_rejected", "{rec}");
}

#[tokio::test]
async fn a_half_open_breaker_is_settled_by_a_rejected_handshake() {
    use std::sync::Arc;
    use switchyard::base::clock::{Clock, ManualClock, SystemClock};
    let clock = ManualClock::new(SystemClock.now_ms());
    let gw = Gw::start_opts(common::gw::GwOptions {
        accounts: 2,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let order = gw.rr_order();
    for a in &order {
        gw.fault(a, FaultKind::WsRefuse426, Some(3));
    }
    for _ in 0..3 {
        assert_eq!(one_turn(&gw).await.1["transport"], "http_ws_failed");
    }
    assert_eq!(one_turn(&gw).await.1["transport"], "http_breaker_open");
    for a in &order {
        gw.sim.sim.clear_faults(a);
    }
    // Half-open: the probe's handshake is refused (429) by the session's account.
    clock.advance(std::time::Duration::from_secs(31));
    let bound = gw.requests(1).await[0]["account"]
        .as_str()
        .unwrap()
        .to_string();
    gw.fault(&bound, FaultKind::WsHandshakeError { status: 429 }, Some(1));
    let (events, rec) = one_turn(&gw).await;
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    assert_eq!(rec["attempts"][0]["class"], "rate_limited", "{rec}");
    // The origin answered: the breaker closed, and the other account dialled its own socket.
    assert_eq!(rec["transport"], "ws_connected", "{rec}");
    assert!(
        gw.metrics_text()
            .await
            .contains("switchyard_ws_breaker_open 0")
    );
}

/// Twelve sessions leave an idle upstream socket each on the first account (the second is
/// disabled meanwhile): at most eight stay. Returns the accounts in round-robin order.
async fn eight_idle_sockets_on_the_first_account(gw: &Gw) -> Vec<String> {
    let order = gw.rr_order();
    gw.admin_call(
        axum::http::Method::POST,
        &format!("/api/admin/accounts/{}/disable", order[1]),
        None,
    )
    .await;
    for i in 0..12 {
        let mut req = format!("ws://{}/v1/responses", gw.addr)
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {}", gw.key).parse().unwrap(),
        );
        req.headers_mut()
            .insert("session-id", format!("sess-{i}").parse().unwrap());
        let mut ws = tokio_tungstenite::connect_async(req).await.unwrap().0;
        ws.send(create(json!({}))).await.unwrap();
        assert_eq!(
            turn(&mut ws).await.last().unwrap()["type"],
            "response.completed"
        );
    }
    assert_eq!(idle_sockets(gw).await, 8, "at most eight per account");
    gw.admin_call(
        axum::http::Method::POST,
        &format!("/api/admin/accounts/{}/enable", order[1]),
        None,
    )
    .await;
    order
}

/// A request of a session bound to the first account: it fails there and the second answers.
async fn fail_over_from_the_first(gw: &Gw) {
    let sse = gw
        .stream(
            &common::gw::body("gpt-5.5", "x", true),
            &[("session-id", "sess-0")],
        )
        .await;
    assert_eq!(sse.last().0, "response.completed");
}

#[tokio::test]
async fn idle_upstream_sockets_are_bounded_per_account_and_evicted_when_it_cools() {
    let gw = Gw::start(2).await;
    let order = eight_idle_sockets_on_the_first_account(&gw).await;
    gw.fault(
        &order[0],
        FaultKind::Burst429 {
            retry_after_secs: 30,
        },
        Some(1),
    );
    fail_over_from_the_first(&gw).await;
    assert_eq!(gw.account(&order[0]).await["state"], "cooling");
    assert_eq!(idle_sockets(&gw).await, 0);
}

#[tokio::test]
async fn idle_upstream_sockets_are_evicted_when_the_backend_says_the_login_is_dead() {
    let gw = Gw::start(2).await;
    let order = eight_idle_sockets_on_the_first_account(&gw).await;
    gw.fault(&order[0], FaultKind::AccountDeactivated, Some(1));
    fail_over_from_the_first(&gw).await;
    assert_eq!(gw.account(&order[0]).await["state"], "needs_reauth");
    assert_eq!(idle_sockets(&gw).await, 0);
    // Closed, not only forgotten.
    until("the backend sees the sockets closed", || async {
        gw.sim.sim.ws_open(&order[0]) == 0
    })
    .await;
}

#[tokio::test]
async fn idle_upstream_sockets_are_evicted_when_a_refresh_finds_the_login_dead() {
    let gw = Gw::start(2).await;
    let order = eight_idle_sockets_on_the_first_account(&gw).await;
    // The access token is refused as expired, and the refresh it calls for is refused as a
    // token another client used.
    assert!(gw.sim.sim.expire_access_token(&order[0]));
    gw.fault(
        &order[0],
        FaultKind::RefreshError {
            status: 401,
            code: "refresh_token_reused".into(),
        },
        Some(1),
    );
    fail_over_from_the_first(&gw).await;
    let a = gw.account(&order[0]).await;
    assert_eq!(a["state"], "needs_reauth", "{a}");
    assert_eq!(idle_sockets(&gw).await, 0);
    until("the backend sees the sockets closed", || async {
        gw.sim.sim.ws_open(&order[0]) == 0
    })
    .await;
}

#[tokio::test]
async fn idle_upstream_sockets_are_dropped_after_their_idle_life() {
    use std::sync::Arc;
    use switchyard::base::clock::{Clock, ManualClock, SystemClock};
    let clock = ManualClock::new(SystemClock.now_ms());
    let gw = Gw::start_opts(common::gw::GwOptions {
        accounts: 1,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    one_turn(&gw).await;
    assert_eq!(idle_sockets(&gw).await, 1);
    clock.advance(std::time::Duration::from_secs(301));
    // Another session's socket goes into the pool; the stale one is swept on the way.
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", gw.key).parse().unwrap(),
    );
    req.headers_mut()
        .insert("session-id", "another".parse().unwrap());
    let mut ws = tokio_tungstenite::connect_async(req).await.unwrap().0;
    ws.send(create(json!({}))).await.unwrap();
    turn(&mut ws).await;
    assert_eq!(idle_sockets(&gw).await, 1);
}

/// A client may send its next request the moment it has read `response.completed` — before
/// the turn has ended on the gateway's side — or even send two at once: none is lost, they
/// run in order.
#[tokio::test]
async fn a_request_sent_while_a_turn_runs_is_answered_after_it() {
    let gw = Gw::start(1).await;
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({"input": "first"}))).await.unwrap();
    ws.send(create(json!({"input": "second"}))).await.unwrap();
    // Each wait ends with its turn's last frame; a turn that never comes (a dropped request
    // leaves the socket open and silent) fails the test at the deadline instead of hanging it.
    let first = tokio::time::timeout(SIGNAL_DEADLINE, turn(&mut ws))
        .await
        .expect("the first turn");
    let second = tokio::time::timeout(SIGNAL_DEADLINE, turn(&mut ws))
        .await
        .expect("the second turn is answered, not dropped");
    assert_eq!(first.last().unwrap()["type"], "response.completed");
    assert_eq!(second.last().unwrap()["type"], "response.completed");
    assert_ne!(response_id(&first), response_id(&second));
    assert_eq!(gw.requests(10).await.len(), 2);
}

fn short_ws_timers(c: &mut switchyard::config::Config) {
    c.server.ws_first_message_timeout = std::time::Duration::from_millis(300);
    c.server.ws_idle_timeout = std::time::Duration::from_millis(300);
}

/// Pings the gateway every 50 ms until it closes the socket: the close frame it sent.
/// A gateway that took pings for activity would never close; that is a failure, not a hang.
async fn ping_until_closed(ws: &mut Ws) -> (u16, String) {
    let pinging = async {
        loop {
            tokio::select! {
                msg = ws.next() => match msg {
                    Some(Ok(Message::Close(Some(f)))) => {
                        return (u16::from(f.code), f.reason.to_string());
                    }
                    Some(Ok(Message::Close(None))) | None | Some(Err(_)) => {
                        return (0, "closed without a close frame".to_string());
                    }
                    Some(Ok(_)) => {}
                },
                _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {
                    if ws.send(Message::Ping(b"still here".to_vec().into())).await.is_err() {
                        return (0, "closed without a close frame".to_string());
                    }
                }
            }
        }
    };
    tokio::time::timeout(SIGNAL_DEADLINE, pinging)
        .await
        .expect("pings kept the socket open")
}

#[tokio::test]
async fn pings_do_not_keep_a_socket_without_requests_open() {
    let gw = Gw::start_with(1, short_ws_timers).await;
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    assert_eq!(
        ping_until_closed(&mut ws).await,
        (1000, "no request received".to_string())
    );
    // After a turn, pings do not reset the idle timer either.
    let mut ws = connect(&gw, Some(&gw.key)).await.unwrap();
    ws.send(create(json!({}))).await.unwrap();
    let events = turn(&mut ws).await;
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    assert_eq!(ping_until_closed(&mut ws).await, (1000, "idle".to_string()));
}

/// A `response.create` whose input is `bytes` long or so, of small messages.
fn create_of_size(bytes: usize) -> Message {
    let item = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x".repeat(200)}]});
    let n = bytes / item.to_string().len();
    create(json!({"input": vec![item; n]}))
}

/// A key's WebSocket connections share its memory budget with its bodies: a frame that does
/// not fit beside another connection's history is refused with an error frame (the socket
/// stays open), and fits once that connection has closed.
#[tokio::test]
async fn a_frame_past_its_keys_memory_budget_is_refused_and_fits_once_another_socket_closes() {
    let gw = Gw::start_with(1, |c| {
        c.server.max_body_bytes = 100_000;
        c.server.key_memory_mib = 1;
    })
    .await;
    let held = |n: &str| format!("switchyard_key_memory_bytes{{key=\"test\"}} {n}");
    let mut a = connect(&gw, Some(&gw.key)).await.unwrap();
    a.send(create_of_size(300_000)).await.unwrap();
    assert_eq!(
        turn(&mut a).await.last().unwrap()["type"],
        "response.completed"
    );
    // What `a` keeps for its continuations is the key's to pay.
    let metrics = gw.metrics_text().await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&held("")))
        .unwrap_or_else(|| panic!("{metrics}"));
    let kept: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((300_000..400_000).contains(&kept), "{line}");
    // A frame of 400 KB on another socket: it and its body do not fit beside that.
    let mut b = connect(&gw, Some(&gw.key)).await.unwrap();
    b.send(create_of_size(400_000)).await.unwrap();
    let refused = turn(&mut b).await;
    let e = refused.last().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(429)),
        "{e}"
    );
    assert_eq!(e["error"]["code"], "key_memory_limit_reached", "{e}");
    // Another key is not touched by it.
    let (_, other) = gw.make_key("other", json!({})).await;
    let mut c = connect(&gw, Some(&other)).await.unwrap();
    c.send(create_of_size(400_000)).await.unwrap();
    assert_eq!(
        turn(&mut c).await.last().unwrap()["type"],
        "response.completed"
    );
    // `a` closes and gives its share back; the same frame on `b` (still open) now runs.
    a.close(None).await.unwrap();
    until("the closed socket's history to be given back", || async {
        gw.metrics_text()
            .await
            .contains(&format!("{}\n", held("0")))
    })
    .await;
    b.send(create_of_size(400_000)).await.unwrap();
    assert_eq!(
        turn(&mut b).await.last().unwrap()["type"],
        "response.completed"
    );
}
