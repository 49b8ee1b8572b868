//! The pool's face upstream, against the simulator: one device id per account wherever Codex
//! puts one, every header but the held ones crossing both ways, compressed bodies, the codes a
//! newer Codex knows, and one upstream socket per client connection.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::gw::{Gw, body};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::sim::{FaultKind, RecordedRequest};
use switchyard::upstream::encoding::samples::{zstd_rle_bomb, zstd_stored};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The client's device id, as Codex makes one.
const CLIENT: &str = "0b6a4c2e-8d1f-4e3a-9c5b-7a2d1e0f3b4c";

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The turn metadata Codex sends, naming the device `id`.
fn turn_metadata(id: &str) -> String {
    json!({"installation_id": id, "context_window_id": "w-1", "request_kind": "turn",
        "sandbox": "seatbelt", "turn_trigger": "user", "model": "gpt-5.5"})
    .to_string()
}

/// A request carrying the device id `id` in every place Codex puts one.
fn identifying(id: &str, stream: bool) -> Value {
    let mut b = body("gpt-5.5", "hello", stream);
    b["client_metadata"] = json!({
        "session_id": "s-1", "thread_id": "t-1", "turn_id": "turn-1",
        "x-codex-window-id": "w-1",
        "x-codex-installation-id": id,
        "x-codex-turn-metadata": turn_metadata(id),
    });
    b
}

fn identifying_headers(id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("x-codex-installation-id", id.to_string()),
        ("x-codex-turn-metadata", turn_metadata(id)),
        ("session-id", "s-1".to_string()),
    ]
}

async fn stream_with(gw: &Gw, body: &Value, headers: &[(&'static str, String)]) -> u16 {
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    gw.stream(body, &h).await.status
}

async fn json_with(gw: &Gw, body: &Value, headers: &[(&'static str, String)]) -> u16 {
    let mut req = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", gw.auth())
        .json(body);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let _ = resp.bytes().await;
    status
}

async fn connect(gw: &Gw, headers: &[(&'static str, String)]) -> (Ws, reqwest::header::HeaderMap) {
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", gw.auth().parse().unwrap());
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().unwrap());
    }
    let (ws, resp) = tokio_tungstenite::connect_async(req).await.unwrap();
    (ws, resp.headers().clone())
}

/// Sends one `response.create` and reads its frames to the terminal one.
async fn ws_turn(ws: &mut Ws, mut frame: Value) -> Vec<Value> {
    frame["type"] = json!("response.create");
    ws.send(Message::Text(frame.to_string().into()))
        .await
        .unwrap();
    let mut events = Vec::new();
    while let Some(msg) = ws.next().await {
        if let Message::Text(t) = msg.unwrap() {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            let end = matches!(
                v["type"].as_str(),
                Some("response.completed" | "response.failed" | "response.incomplete" | "error")
            );
            events.push(v);
            if end {
                break;
            }
        }
    }
    events
}

fn response_id(events: &[Value]) -> String {
    events.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Every device id a recorded request carries: its header, its body's field, and the turn
/// metadata's, in the header and in the body.
fn ids_of(r: &RecordedRequest) -> Vec<String> {
    let mut ids = Vec::new();
    if let Some(id) = r.headers.get("x-codex-installation-id") {
        ids.push(id.clone());
    }
    let from_meta = |text: &str| -> Option<String> {
        serde_json::from_str::<Value>(text).ok()?["installation_id"]
            .as_str()
            .map(str::to_string)
    };
    if let Some(id) = r
        .headers
        .get("x-codex-turn-metadata")
        .and_then(|t| from_meta(t))
    {
        ids.push(id);
    }
    let meta = &r.body["client_metadata"];
    if let Some(id) = meta["x-codex-installation-id"].as_str() {
        ids.push(id.to_string());
    }
    if let Some(id) = meta["x-codex-turn-metadata"].as_str().and_then(from_meta) {
        ids.push(id);
    }
    ids
}

/// What the backend saw: nothing of the client's device, and per account one id of its own,
/// in every place, different between accounts. Returns the id of each account.
fn assert_one_device_per_account(
    recorded: &[RecordedRequest],
    client: &str,
) -> BTreeMap<String, String> {
    let mut per_account: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in recorded.iter().filter(|r| r.path.ends_with("/responses")) {
        let text = format!("{:?} {}", r.headers, r.body);
        assert!(
            !text.contains(client),
            "the client's id reached the backend: {text}"
        );
        let ids = ids_of(r);
        assert!(!ids.is_empty(), "no device id at all: {text}");
        let account = r.account_id.clone().unwrap_or_default();
        per_account.entry(account).or_default().extend(ids);
    }
    let mut seen = BTreeSet::new();
    per_account
        .into_iter()
        .map(|(account, ids)| {
            assert_eq!(ids.len(), 1, "{account} shows several devices: {ids:?}");
            let id = ids.into_iter().next().unwrap();
            assert!(
                seen.insert(id.clone()),
                "two accounts share the device {id}"
            );
            (account, id)
        })
        .collect()
}

#[tokio::test]
async fn the_clients_device_id_reaches_no_account_over_any_transport() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    let headers = identifying_headers(CLIENT);
    // SSE and JSON, with a failover inside one request, so both accounts are tried.
    gw.fault(&order[0], FaultKind::ServerError { status: 503 }, Some(1));
    assert_eq!(
        stream_with(&gw, &identifying(CLIENT, true), &headers).await,
        200
    );
    assert_eq!(
        json_with(&gw, &identifying(CLIENT, false), &headers).await,
        200
    );
    assert_eq!(
        stream_with(&gw, &identifying(CLIENT, true), &headers).await,
        200
    );
    // WebSocket: a whole request, then a continuation on the same socket.
    let (mut ws, _) = connect(&gw, &headers).await;
    let first = ws_turn(&mut ws, identifying(CLIENT, true)).await;
    assert_eq!(first.last().unwrap()["type"], "response.completed");
    let mut next = identifying(CLIENT, true);
    next["previous_response_id"] = json!(response_id(&first));
    next["input"] = json!([]);
    let second = ws_turn(&mut ws, next).await;
    assert_eq!(second.last().unwrap()["type"], "response.completed");

    let recorded = gw.sim.sim.all_requests();
    let ws_turns = recorded.iter().filter(|r| r.method == "WS").count();
    assert!(
        ws_turns >= 2
            || recorded
                .iter()
                .filter(|r| r.path.ends_with("/responses"))
                .count()
                >= 6
    );
    let ids = assert_one_device_per_account(&recorded, CLIENT);
    assert_eq!(ids.len(), 2, "both accounts were tried: {ids:?}");
    // Each account's id is the one its handshake and its HTTP requests carry alike, and is
    // stable: a second gateway run would give the same (it derives from the account).
    for (account, id) in &ids {
        assert_eq!(id.len(), 36, "{account}: {id}");
    }
}

#[tokio::test]
async fn a_device_id_json_would_escape_is_replaced_all_the_same() {
    let gw = Gw::start(1).await;
    let odd = "the \"laptop\" of ann / #1";
    let body = identifying(odd, true);
    assert_eq!(
        stream_with(&gw, &body, &[("session-id", "s-2".to_string())]).await,
        200
    );
    let (mut ws, _) = connect(&gw, &[]).await;
    let events = ws_turn(&mut ws, identifying(odd, true)).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    let recorded = gw.sim.sim.all_requests();
    for r in &recorded {
        let text = format!("{:?} {}", r.headers, r.body);
        assert!(!text.contains("laptop"), "{text}");
    }
    assert_one_device_per_account(&recorded, "laptop");
}

#[tokio::test]
async fn new_request_headers_reach_the_backend_and_the_clients_own_do_not() {
    let gw = Gw::start(1).await;
    let sent: Vec<(&'static str, String)> = [
        ("x-codex-routing-hint", "model=gpt-5.5;tier=ultrafast"),
        ("x-openai-internal-codex-responses-lite", "1"),
        ("x-codex-guardian", "reviewer"),
        ("x-responsesapi-include-timing-metrics", "true"),
        ("x-openai-product-sku", "codex-cli"),
        ("x-openai-internal-tool-call-id", "call_7"),
        ("x-codex-something-next-year", "yes"),
        ("x-forwarded-for", "203.0.113.9"),
        ("chatgpt-account-id", "the-clients-own-account"),
        ("cookie", "session=client"),
        ("accept-encoding", "zstd,gzip"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_string()))
    .collect();
    let h: Vec<(&str, &str)> = sent.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &h).await;
    assert_eq!(sse.status, 200);
    let (_ws, upgrade) = connect(&gw, &sent).await;
    assert_eq!(
        upgrade["x-codex-websocket-max-message-bytes"], "16777216",
        "the upgrade says the largest message the gateway takes"
    );
    let account = gw.rr_order()[0].clone();
    let recorded = gw.sim.sim.requests(&account);
    let http = recorded.iter().find(|r| r.method == "POST").unwrap();
    for r in [Some(http), recorded.iter().find(|r| r.method != "POST")]
        .into_iter()
        .flatten()
    {
        for (k, v) in &sent[..7] {
            assert_eq!(r.headers.get(*k), Some(v), "{k} on {} {}", r.method, r.path);
        }
        assert!(
            !r.headers.contains_key("x-forwarded-for"),
            "{:?}",
            r.headers
        );
        assert!(!r.headers.contains_key("cookie"), "{:?}", r.headers);
        assert_eq!(r.headers["chatgpt-account-id"], account);
        assert!(
            r.headers
                .get("accept-encoding")
                .is_none_or(|v| !v.contains("zstd")),
            "the gateway decides what it accepts: {:?}",
            r.headers
        );
    }
}

#[tokio::test]
async fn the_backends_answer_headers_reach_the_client_new_ones_too() {
    let gw = Gw::start(1).await;
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.headers["x-reasoning-included"], "true");
    assert!(
        sse.headers["x-codex-sim-request-id"]
            .to_str()
            .unwrap()
            .starts_with("simreq_"),
        "{:?}",
        sse.headers
    );
    assert_eq!(sse.headers["content-type"], "text/event-stream");
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "hello", false), &[])
        .await;
    assert_eq!(resp.headers()["x-reasoning-included"], "true");
    assert!(resp.headers().contains_key("x-codex-sim-request-id"));
}

#[tokio::test]
async fn a_zstd_body_is_served_and_a_zstd_bomb_is_refused_before_any_account() {
    let gw = Gw::start(1).await;
    let plain = serde_json::to_vec(&body("gpt-5.5", "compressed", true)).unwrap();
    let resp = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", gw.auth())
        .header("content-type", "application/json")
        .header("content-encoding", "zstd")
        .body(zstd_stored(&plain))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("response.completed"), "{text}");
    let account = gw.rr_order()[0].clone();
    let got = gw.sim.sim.requests(&account);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body["input"][0]["content"][0]["text"], "compressed");
    assert!(!got[0].headers.contains_key("content-encoding"));

    let bomb = zstd_rle_bomb(1 << 30);
    assert!(bomb.len() < 64 * 1024);
    let resp = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", gw.auth())
        .header("content-encoding", "zstd")
        .body(bomb)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_too_large");
    assert_eq!(
        gw.sim.sim.requests(&account).len(),
        1,
        "no account saw the bomb"
    );

    let resp = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", gw.auth())
        .header("content-encoding", "br")
        .body(plain)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
}

/// One request with `fault` on the first account of two: the account's state afterwards, the
/// status the client got, and how many requests the second account served.
async fn after(fault: FaultKind) -> (Value, u16, Value, usize) {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(&order[0], fault, Some(1));
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "hello", false), &[])
        .await;
    let status = resp.status().as_u16();
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    let account = gw.account(&order[0]).await;
    (account, status, v, gw.served(&order[1]))
}

fn error(status: u16, code: &str, fields: Value) -> FaultKind {
    FaultKind::Error {
        status,
        code: code.into(),
        fields: fields.as_object().cloned().unwrap_or_default(),
    }
}

#[tokio::test]
async fn slow_down_is_a_rate_limit_that_fails_over() {
    let (account, status, _, second) = after(error(503, "slow_down", json!({}))).await;
    assert_eq!(status, 200);
    assert_eq!(second, 1);
    assert_eq!(account["state"], "cooling");
    assert_eq!(account["reason"], "rate_limited");
}

/// Like `cyber_policy`: the refusing account is left out for the session, not cooled, and the
/// prompt goes on to the next.
#[tokio::test]
async fn bio_policy_is_a_policy_refusal_that_cools_no_account() {
    let (account, status, _, second) = after(error(400, "bio_policy", json!({}))).await;
    assert_eq!(status, 200);
    assert_eq!(second, 1);
    assert_eq!(account["state"], "ready");
}

#[tokio::test]
async fn organization_limits_are_quota_and_fail_over() {
    for code in [
        "organization_usage_limit_exceeded",
        "organization_spend_limit_exceeded",
    ] {
        let (account, status, _, second) =
            after(error(429, code, json!({"resets_in_seconds": 1800}))).await;
        assert_eq!(status, 200, "{code}");
        assert_eq!(second, 1, "{code}");
        assert_eq!(account["state"], "cooling", "{code}");
        assert_eq!(account["reason"], "quota", "{code}");
        let left = account["cooldown_remaining_s"].as_u64().unwrap();
        assert!((1700..=1800).contains(&left), "{code}: {left}");
    }
}

#[tokio::test]
async fn flex_unavailable_is_told_to_the_client_and_blames_no_account() {
    let (account, status, v, second) = after(error(503, "flex_unavailable", json!({}))).await;
    assert_eq!(status, 503);
    assert_eq!(v["error"]["code"], "flex_unavailable");
    assert_eq!(second, 0);
    assert_eq!(account["state"], "ready");
}

#[tokio::test]
async fn a_usage_limit_without_a_reset_time_lasts_at_most_its_window() {
    let fault = error(
        429,
        "usage_limit_reached",
        json!({"type": "usage_limit_reached", "limit_window_minutes": 15}),
    );
    let (account, status, _, second) = after(fault).await;
    assert_eq!((status, second), (200, 1));
    assert_eq!(account["reason"], "quota");
    let left = account["cooldown_remaining_s"].as_u64().unwrap();
    assert!((800..=900).contains(&left), "{left}");
}

#[tokio::test]
async fn a_content_filter_incomplete_is_answered_as_it_is_and_blames_no_account() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::Incomplete {
            reason: "content_filter".into(),
        },
        Some(1),
    );
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200);
    let (kind, last) = sse.last();
    assert_eq!(kind, "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "content_filter"
    );
    assert_eq!(gw.served(&order[1]), 0);
    assert_eq!(gw.account(&order[0]).await["state"], "ready");
    assert_eq!(gw.requests(1).await[0]["outcome"], "incomplete");
}

#[tokio::test]
async fn a_retry_after_inside_a_websocket_error_frame_is_honoured() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::Burst429 {
            retry_after_secs: 40,
        },
        Some(1),
    );
    let (mut ws, _) = connect(&gw, &[("session-id", "s-r".to_string())]).await;
    let events = ws_turn(&mut ws, body("gpt-5.5", "hello", true)).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    let account = gw.account(&order[0]).await;
    assert_eq!(account["reason"], "rate_limited");
    let left = account["cooldown_remaining_s"].as_u64().unwrap();
    assert!(
        left >= 39,
        "the frame's retry-after, not the ladder's 5 s: {left}"
    );
}

/// Codex compacts over a second WebSocket connection of the same session: the first
/// connection's chain must survive it.
#[tokio::test]
async fn a_compaction_on_a_second_connection_leaves_the_first_ones_chain_intact() {
    let gw = Gw::start(1).await;
    let session = [("session-id", "codex-thread-1".to_string())];
    let (mut a, _) = connect(&gw, &session).await;
    let t1 = ws_turn(&mut a, body("gpt-5.5", "first", true)).await;
    let mut next = body("gpt-5.5", "second", true);
    next["previous_response_id"] = json!(response_id(&t1));
    next["input"] = json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]}]);
    let t2 = ws_turn(&mut a, next).await;
    assert_eq!(t2.last().unwrap()["type"], "response.completed");
    // The compaction: a whole request on a second connection of the session.
    let (mut b, _) = connect(&gw, &session).await;
    let mut compact = body("gpt-5.5", "compact", true);
    compact["input"] = json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}, {"type": "compaction_trigger"}]);
    let c = ws_turn(&mut b, compact).await;
    assert_eq!(c.last().unwrap()["type"], "response.completed");
    drop(b);
    // The first connection goes on from its own last response.
    let mut third = body("gpt-5.5", "third", true);
    third["previous_response_id"] = json!(response_id(&t2));
    third["input"] = json!([]);
    let t3 = ws_turn(&mut a, third).await;
    assert_eq!(t3.last().unwrap()["type"], "response.completed", "{t3:?}");
    let records = gw.requests(10).await;
    assert_eq!(records.len(), 4);
    for r in &records {
        assert_ne!(r["outcome"], "previous_response_not_found", "{r}");
        assert_eq!(r["outcome"], "success", "{r}");
    }
    // The backend never had to refuse a continuation.
    let account = gw.rr_order()[0].clone();
    assert!(
        gw.sim
            .sim
            .requests(&account)
            .iter()
            .all(|r| r.status != 400),
        "{:?}",
        gw.sim.sim.requests(&account)
    );
}

#[tokio::test]
async fn one_model_is_retrieved_by_its_id() {
    let gw = Gw::start(1).await;
    let get = |path: String| {
        let (http, auth) = (gw.http.clone(), gw.auth());
        async move {
            let r = http
                .get(path)
                .header("authorization", auth)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, v) = get(gw.url("/v1/models/gpt-5.5")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v,
        json!({"id": "gpt-5.5", "object": "model", "created": 0, "owned_by": "openai"})
    );
    let (status, v) = get(gw.url("/v1/models/no-such-model")).await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn an_unknown_websocket_message_type_gets_a_plain_error() {
    let gw = Gw::start(1).await;
    let (mut ws, _) = connect(&gw, &[]).await;
    ws.send(Message::Text(
        json!({"type": "response.steer", "input": []})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let Some(Ok(Message::Text(t))) = ws.next().await else {
        panic!("no answer");
    };
    let v: Value = serde_json::from_str(t.as_str()).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["code"], "unsupported_message");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("`response.steer`"), "{message}");
    assert!(!message.contains("Some("), "{message}");
    // The connection stays usable.
    let events = ws_turn(&mut ws, body("gpt-5.5", "hello", true)).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
}

/// A workspace access token in the pool: validated at import through the daemon, serving
/// with the backend's own token, and when it expires the account needs a new one — said in
/// words — while the request goes on to another account.
#[tokio::test]
async fn a_workspace_access_token_serves_until_the_backend_refuses_it() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    let token = gw
        .sim
        .sim
        .workspace_token(&order[0], std::time::Duration::from_secs(3600))
        .unwrap();
    let admin = gw.admin().await;
    let auth = json!({"tokens": {"access_token": token}});
    let imported = admin
        .import_account(auth.to_string().as_bytes())
        .await
        .unwrap();
    assert_eq!(imported.account.chatgpt_account_id, order[0]);
    assert_eq!(imported.account.login.as_str(), "access_token");
    let refused = admin
        .import_account(
            json!({"tokens": {"access_token": "at-unknown"}})
                .to_string()
                .as_bytes(),
        )
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("refused the access token"),
        "{refused}"
    );
    // The pool now serves that account with the workspace token.
    gw.until_proven(&order[0]).await;
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200);
    let last = gw.sim.sim.requests(&order[0]);
    let served = last.iter().rev().find(|r| r.method == "POST").unwrap();
    assert_eq!(served.headers["authorization"], format!("Bearer {token}"));
    // It expires: the next request fails over, and the account says why.
    gw.sim.sim.expire_access_token(&order[0]);
    for _ in 0..2 {
        let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
        assert_eq!(sse.status, 200);
    }
    let a = gw.account(&order[0]).await;
    assert_eq!(a["state"], "needs_reauth", "{a}");
    assert!(
        a["detail"]
            .as_str()
            .unwrap()
            .contains("the access token expired"),
        "{a}"
    );
}

/// A data-residency workspace's account: discovery sends its requests — HTTP and WebSocket — to
/// its own origin with its override; a discovery the backend refuses is shown on the account.
#[tokio::test]
async fn a_residency_account_is_served_at_its_workspace_origin_with_its_override() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    // The same simulator under another name: which origin a request used shows in its Host.
    let port = gw
        .sim
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let origin = format!("http://localhost:{port}");
    gw.sim.sim.set_routing(&order[0], Some((&origin, "us")));
    gw.sim.sim.refuse_routing(&order[1], 503);
    // A new login of each is routed afresh.
    let admin = gw.admin().await;
    for a in &order {
        let auth = gw.sim.sim.auth_json(a).unwrap();
        admin
            .import_account(auth.to_string().as_bytes())
            .await
            .unwrap();
    }
    crate::common::gw::until("routing discovered", || async {
        let (a, b) = (gw.account(&order[0]).await, gw.account(&order[1]).await);
        a["origin"] == origin.as_str() && b["routing_error"].is_string()
    })
    .await;
    let b = gw.account(&order[1]).await;
    assert!(b["routing_error"].as_str().unwrap().contains("503"), "{b}");
    // Only the residency account serves from here on.
    admin
        .account_action(&order[1], switchyard_admin::wire::AccountAction::Disable)
        .await
        .unwrap();
    gw.until_proven(&order[0]).await;
    assert_eq!(
        gw.stream(&body("gpt-5.5", "hello", true), &[]).await.status,
        200
    );
    let (mut ws, _) = connect(&gw, &[("session-id", "s-res".to_string())]).await;
    let events = ws_turn(&mut ws, body("gpt-5.5", "hello", true)).await;
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    let host = format!("localhost:{port}");
    let turns: Vec<_> = gw
        .sim
        .sim
        .requests(&order[0])
        .into_iter()
        .filter(|r| r.path.ends_with("/responses") && r.method != "WS")
        .collect();
    assert!(turns.iter().any(|r| r.method == "POST") && turns.iter().any(|r| r.method == "GET"));
    for r in turns.iter().rev().take(2) {
        assert_eq!(
            r.headers.get("host"),
            Some(&host),
            "{} {:?}",
            r.method,
            r.headers
        );
        assert_eq!(
            r.headers
                .get("x-openai-account-routing-override")
                .map(String::as_str),
            Some("us"),
            "{:?}",
            r.headers
        );
    }
}
