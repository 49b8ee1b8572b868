//! The simulated backend's Responses WebSocket over real sockets: the handshake's checks,
//! turns and continuations on one socket, connection-local `previous_response_id`, errors as
//! frames, the WebSocket faults and the socket counters.

use std::time::{Duration, Instant};

use crate::common::sim::{access, client, start, types};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::sim::{Fault, FaultKind, SimHandle};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{self, HeaderMap};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

const BETA: &str = "responses_websockets=2026-02-06";
const ACCT: &str = "sim-acct-1";
/// A safety net against a hung test, never a synchronisation.
const PATIENCE: Duration = Duration::from_secs(10);

/// The handshake Codex sends, with what is left out as asked.
fn handshake(h: &SimHandle, id: &str, token: Option<&str>, beta: bool) -> http::Request<()> {
    let mut req = h.ws_url().into_client_request().unwrap();
    let headers = req.headers_mut();
    if let Some(t) = token {
        headers.insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    headers.insert("chatgpt-account-id", id.parse().unwrap());
    if beta {
        headers.insert("openai-beta", BETA.parse().unwrap());
    }
    headers.insert("session-id", "sess-ws".parse().unwrap());
    headers.insert("originator", "codex_exec".parse().unwrap());
    req
}

async fn connect(h: &SimHandle, id: &str) -> (Ws, HeaderMap) {
    let req = handshake(h, id, Some(&access(h, id)), true);
    let (ws, resp) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(resp.status(), 101);
    (ws, resp.headers().clone())
}

/// A handshake that must be refused: its status and headers.
async fn refused(req: http::Request<()>) -> (u16, HeaderMap) {
    match tokio_tungstenite::connect_async(req).await {
        Err(WsError::Http(resp)) => (resp.status().as_u16(), resp.headers().clone()),
        Err(e) => panic!("handshake failed otherwise: {e}"),
        Ok((_, resp)) => panic!("handshake accepted: {}", resp.status()),
    }
}

/// The same refused handshake over plain HTTP, for its JSON body.
async fn refusal_body(req: http::Request<()>) -> (u16, Value) {
    let c = client();
    let url = req.uri().to_string().replacen("ws://", "http://", 1);
    let mut r = c.get(url);
    for (name, value) in req.headers() {
        r = r.header(name.as_str(), value.to_str().unwrap());
    }
    let resp = r.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

fn create(text: &str) -> Value {
    json!({
        "type": "response.create",
        "model": "gpt-5.5",
        "instructions": "You are a helpful assistant.",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "sess-ws",
    })
}

fn continuation(previous: &str, input: Value) -> Value {
    let mut v = create("");
    v["previous_response_id"] = json!(previous);
    v["input"] = input;
    v
}

async fn send(ws: &mut Ws, frame: &Value) {
    ws.send(Message::text(frame.to_string())).await.unwrap();
}

/// The next message, whatever it is (`None`: the stream ended).
async fn next_msg(ws: &mut Ws) -> Option<Result<Message, WsError>> {
    loop {
        let msg = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("no frame in time");
        match msg {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => return other,
        }
    }
}

async fn next_json(ws: &mut Ws) -> Value {
    match next_msg(ws).await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

fn is_terminal(v: &Value) -> bool {
    matches!(
        v["type"].as_str(),
        Some("response.completed" | "response.failed" | "response.incomplete" | "error")
    )
}

/// Frames up to and including the turn's terminal event (or error frame).
async fn turn_frames(ws: &mut Ws) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let v = next_json(ws).await;
        let done = is_terminal(&v);
        out.push(v);
        if done {
            return out;
        }
    }
}

fn deltas(frames: &[Value]) -> usize {
    types(frames)
        .iter()
        .filter(|t| t.ends_with(".delta"))
        .count()
}

/// The close frame that must come next, then the end of the stream.
async fn expect_close(ws: &mut Ws) -> CloseCode {
    let code = match next_msg(ws).await {
        Some(Ok(Message::Close(Some(f)))) => f.code,
        other => panic!("expected a close frame, got {other:?}"),
    };
    loop {
        match next_msg(ws).await {
            None | Some(Err(WsError::ConnectionClosed)) => return code,
            Some(Ok(Message::Close(_))) => {}
            other => panic!("expected the end after close, got {other:?}"),
        }
    }
}

async fn wait_open(h: &SimHandle, id: &str, n: u32) {
    tokio::time::timeout(PATIENCE, h.sim.wait_ws_open(id, n))
        .await
        .unwrap_or_else(|_| panic!("{id} never had {n} open sockets"));
}

#[tokio::test]
async fn handshake_needs_auth_and_the_beta_header() {
    let h = start(1).await;
    let token = access(&h, ACCT);

    let (status, headers) = refused(handshake(&h, ACCT, None, true)).await;
    assert_eq!(status, 401);
    assert!(headers.get("x-codex-primary-used-percent").is_none());
    let (status, body) = refusal_body(handshake(&h, ACCT, None, true)).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "token_invalidated");

    let (status, _) = refused(handshake(&h, ACCT, Some(&token), false)).await;
    assert_eq!(status, 400);
    let (status, body) = refusal_body(handshake(&h, ACCT, Some(&token), false)).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");

    h.sim.expire_access_token(ACCT);
    let (status, headers) = refused(handshake(&h, ACCT, Some(&token), true)).await;
    assert_eq!(status, 401);
    assert!(headers.get("x-codex-primary-used-percent").is_some());
    let (_, body) = refusal_body(handshake(&h, ACCT, Some(&token), true)).await;
    assert_eq!(body["error"]["code"], "token_expired");

    h.sim.set_deactivated(ACCT, true);
    let (_, body) = refusal_body(handshake(&h, ACCT, Some(&token), true)).await;
    assert_eq!(body["error"]["code"], "account_deactivated");

    assert_eq!(h.sim.ws_connections(ACCT), 0);
    let recorded: Vec<(String, u16)> = h
        .sim
        .requests(ACCT)
        .into_iter()
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(recorded.len(), 7);
    assert!(recorded.iter().all(|(m, s)| m == "GET" && *s != 101));
}

#[tokio::test]
async fn upgrade_answer_carries_turn_state_and_rate_limits() {
    let h = start(2).await;
    let (_ws, headers) = connect(&h, "sim-acct-2").await;
    let get = |name: &str| headers.get(name).unwrap().to_str().unwrap().to_string();
    assert!(get("x-codex-turn-state").starts_with("ts_"));
    assert_eq!(get("x-codex-primary-window-minutes"), "300");
    assert_eq!(get("x-codex-plan-type"), "pro");
    get("x-codex-primary-used-percent").parse::<f64>().unwrap();
    get("x-models-etag");
    let hs = &h.sim.requests("sim-acct-2")[0];
    assert_eq!((hs.method.as_str(), hs.status), ("GET", 101));
    assert_eq!(hs.headers["openai-beta"], BETA);
}

#[tokio::test]
async fn two_turns_on_one_socket_continue_with_previous_response_id() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;

    send(&mut ws, &create("please run: ls -la")).await;
    let first = turn_frames(&mut ws).await;
    let t = types(&first);
    assert_eq!(
        t[..3],
        [
            "codex.rate_limits",
            "response.created",
            "response.in_progress"
        ]
    );
    assert_eq!(*t.last().unwrap(), "response.completed");
    let limits = &first[0];
    assert_eq!(limits["plan_type"], "plus");
    assert_eq!(limits["rate_limits"]["primary"]["window_minutes"], 300);
    assert!(limits["rate_limits"]["secondary"]["reset_at"].is_u64());
    let done = &first.last().unwrap()["response"];
    let call = &done["output"][1];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "exec_command");
    let first_id = done["id"].as_str().unwrap().to_string();

    // Only the new item: the socket remembers the rest.
    let output =
        json!([{"type": "function_call_output", "call_id": call["call_id"], "output": "total 0"}]);
    send(&mut ws, &continuation(&first_id, output)).await;
    let second = turn_frames(&mut ws).await;
    let done = &second.last().unwrap()["response"];
    assert_eq!(second.last().unwrap()["type"], "response.completed");
    assert_eq!(done["previous_response_id"], first_id.as_str());
    assert_eq!(
        done["output"][1]["content"][0]["text"],
        "The command printed: total 0"
    );
    assert!(
        done["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let recorded = h.sim.requests(ACCT);
    let shape: Vec<(&str, u16)> = recorded
        .iter()
        .map(|r| (r.method.as_str(), r.status))
        .collect();
    assert_eq!(shape, [("GET", 101), ("WS", 200), ("WS", 200)]);
    for r in &recorded[1..] {
        assert_eq!(r.path, "/backend-api/codex/responses");
        assert_eq!(r.headers["openai-beta"], BETA);
        assert_eq!(r.body["type"], "response.create");
    }
    assert_eq!(recorded[2].body["previous_response_id"], first_id.as_str());
    assert_eq!(h.sim.ws_connections(ACCT), 1);
    assert_eq!(h.sim.ws_open(ACCT), 1);
}

#[tokio::test]
async fn warm_up_then_empty_continuation_completes_on_the_same_socket() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    let mut warm = create("hello");
    warm["generate"] = json!(false);
    send(&mut ws, &warm).await;
    let frames = turn_frames(&mut ws).await;
    assert_eq!(
        types(&frames),
        [
            "codex.rate_limits",
            "response.created",
            "response.completed"
        ]
    );
    let done = &frames[2]["response"];
    assert_eq!(done["output"], json!([]));
    assert_eq!(done["usage"]["output_tokens"], 0);
    let warm_id = done["id"].as_str().unwrap().to_string();

    send(&mut ws, &continuation(&warm_id, json!([]))).await;
    let frames = turn_frames(&mut ws).await;
    assert_eq!(frames.last().unwrap()["type"], "response.completed");
    assert!(deltas(&frames) >= 2);
    let text = frames.last().unwrap()["response"]["output"][1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.starts_with("Hello from sim-acct-1"), "{text}");
    assert_eq!(h.sim.ws_connections(ACCT), 1);
}

#[tokio::test]
async fn previous_response_id_is_local_to_its_socket() {
    let h = start(1).await;
    let (mut a, _) = connect(&h, ACCT).await;
    let (mut b, _) = connect(&h, ACCT).await;
    assert_eq!((h.sim.ws_connections(ACCT), h.sim.ws_open(ACCT)), (2, 2));

    send(&mut a, &create("hi")).await;
    let frames = turn_frames(&mut a).await;
    let id = frames.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();

    send(&mut b, &continuation(&id, json!([]))).await;
    let err = next_json(&mut b).await;
    assert_eq!(err["type"], "error");
    assert_eq!(err["status"], 400);
    assert_eq!(err["error"]["code"], "previous_response_not_found");
    assert_eq!(err["error"]["param"], "previous_response_id");
    assert_eq!(
        err["error"]["message"],
        format!("Previous response with id '{id}' not found.")
    );
    // The socket survives: Codex resends the full request on it.
    send(&mut b, &create("hi")).await;
    let frames = turn_frames(&mut b).await;
    assert_eq!(frames.last().unwrap()["type"], "response.completed");
    let statuses: Vec<u16> = h
        .sim
        .requests(ACCT)
        .iter()
        .filter(|r| r.method == "WS")
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [200, 400, 200]);

    b.close(None).await.unwrap();
    while next_msg(&mut b).await.is_some() {}
    wait_open(&h, ACCT, 1).await;
    assert_eq!(h.sim.ws_connections(ACCT), 2);
    drop(a);
    wait_open(&h, ACCT, 0).await;
}

#[tokio::test]
async fn quota_fault_is_an_error_frame_then_close() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    h.sim.push_fault(
        ACCT,
        Fault::once(FaultKind::Quota {
            resets_in_seconds: 2700,
        }),
    );
    send(&mut ws, &create("hi")).await;
    let err = next_json(&mut ws).await;
    assert_eq!(err["type"], "error");
    assert_eq!(err["status"], 429);
    assert_eq!(err["error"]["type"], "usage_limit_reached");
    assert_eq!(err["error"]["resets_in_seconds"], 2700);
    assert_eq!(err["headers"]["x-codex-active-limit"], "codex");
    assert_eq!(err["headers"]["x-codex-primary-used-percent"], "100");
    expect_close(&mut ws).await;
    wait_open(&h, ACCT, 0).await;
    let last = h.sim.requests(ACCT).pop().unwrap();
    assert_eq!((last.method.as_str(), last.status), ("WS", 429));
}

#[tokio::test]
async fn http_faults_become_error_frames_and_request_errors_keep_the_socket() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;

    h.sim
        .push_fault(ACCT, Fault::once(FaultKind::ContextLength));
    send(&mut ws, &create("hi")).await;
    let err = next_json(&mut ws).await;
    assert_eq!(err["status"], 400);
    assert_eq!(err["error"]["code"], "context_length_exceeded");

    let mut bad_model = create("hi");
    bad_model["model"] = json!("gpt-nope");
    send(&mut ws, &bad_model).await;
    let err = next_json(&mut ws).await;
    assert_eq!(err["status"], 400);
    assert_eq!(err["error"]["type"], "invalid_request_error");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'gpt-nope' model is not supported")
    );

    h.sim.push_fault(
        ACCT,
        Fault::once(FaultKind::FailedEvent {
            code: "server_is_overloaded".into(),
        }),
    );
    send(&mut ws, &create("hi")).await;
    let frames = turn_frames(&mut ws).await;
    assert_eq!(
        types(&frames),
        [
            "codex.rate_limits",
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
    assert_eq!(
        frames[3]["response"]["error"]["code"],
        "server_is_overloaded"
    );

    // Still open after all three.
    send(&mut ws, &create("hi")).await;
    assert_eq!(
        turn_frames(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );

    h.sim.push_fault(
        ACCT,
        Fault::once(FaultKind::Burst429 {
            retry_after_secs: 7,
        }),
    );
    send(&mut ws, &create("hi")).await;
    let err = next_json(&mut ws).await;
    assert_eq!(err["status"], 429);
    assert_eq!(err["error"]["code"], "rate_limit_exceeded");
    assert_eq!(err["headers"]["retry-after"], "7");
    expect_close(&mut ws).await;

    let (mut ws, _) = connect(&h, ACCT).await;
    h.sim
        .push_fault(ACCT, Fault::once(FaultKind::ServerError { status: 503 }));
    send(&mut ws, &create("hi")).await;
    let err = next_json(&mut ws).await;
    assert_eq!(err["status"], 503);
    assert_eq!(err["error"]["code"], "server_is_overloaded");
    expect_close(&mut ws).await;
}

#[tokio::test]
async fn expired_token_mid_socket_is_a_401_frame_then_close() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    send(&mut ws, &create("hi")).await;
    turn_frames(&mut ws).await;
    h.sim.expire_access_token(ACCT);
    send(&mut ws, &create("hi")).await;
    let err = next_json(&mut ws).await;
    assert_eq!(err["status"], 401);
    assert_eq!(err["error"]["code"], "token_expired");
    expect_close(&mut ws).await;
}

#[tokio::test]
async fn ws_refuse_426_is_an_http_answer_and_only_for_handshakes() {
    let h = start(1).await;
    h.sim.push_fault(ACCT, Fault::once(FaultKind::WsRefuse426));
    // An HTTP request does not take a handshake fault.
    let c = client();
    let mut body = create("hi");
    body.as_object_mut().unwrap().remove("type");
    let r = c
        .post(format!("{}/responses", h.base_url()))
        .bearer_auth(access(&h, ACCT))
        .header("ChatGPT-Account-ID", ACCT)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    assert_eq!(h.sim.faults(ACCT).len(), 1);

    let req = handshake(&h, ACCT, Some(&access(&h, ACCT)), true);
    let (status, _) = refused(req).await;
    assert_eq!(status, 426);
    assert!(h.sim.faults(ACCT).is_empty());
    assert_eq!(h.sim.ws_connections(ACCT), 0);
    let (_ws, _) = connect(&h, ACCT).await;
    assert_eq!(h.sim.ws_connections(ACCT), 1);
}

#[tokio::test]
async fn ws_slow_handshake_delays_the_101() {
    let h = start(1).await;
    h.sim
        .push_fault(ACCT, Fault::once(FaultKind::WsSlowHandshake { ms: 250 }));
    let t0 = Instant::now();
    let (mut ws, _) = connect(&h, ACCT).await;
    assert!(t0.elapsed() >= Duration::from_millis(250));
    send(&mut ws, &create("hi")).await;
    assert_eq!(
        turn_frames(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
}

#[tokio::test]
async fn ws_close_mid_turn_sends_1011_before_any_terminal_event() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    h.sim.push_fault(
        ACCT,
        Fault::once(FaultKind::WsCloseMidTurn { after_deltas: 2 }),
    );
    send(&mut ws, &create("hi")).await;
    let mut frames = Vec::new();
    let code = loop {
        match next_msg(&mut ws).await {
            Some(Ok(Message::Text(t))) => {
                frames.push(serde_json::from_str::<Value>(t.as_str()).unwrap())
            }
            Some(Ok(Message::Close(Some(f)))) => break f.code,
            other => panic!("expected frames then a close, got {other:?}"),
        }
    };
    assert_eq!(code, CloseCode::Error);
    assert_eq!(deltas(&frames), 2);
    assert!(!frames.iter().any(is_terminal), "{:?}", types(&frames));
    // Reading on answers the close; the server then ends the connection.
    while let Some(Ok(_)) = next_msg(&mut ws).await {}
    wait_open(&h, ACCT, 0).await;
}

#[tokio::test]
async fn ws_error_frame_fault_sends_its_status_and_code_then_closes() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    h.sim.push_fault(
        ACCT,
        Fault::once(FaultKind::WsErrorFrame {
            status: 400,
            code: "websocket_connection_limit_reached".into(),
        }),
    );
    send(&mut ws, &create("hi")).await;
    let err = next_json(&mut ws).await;
    assert_eq!(err["type"], "error");
    assert_eq!(err["status"], 400);
    assert_eq!(err["error"]["code"], "websocket_connection_limit_reached");
    assert!(err["headers"]["x-codex-primary-used-percent"].is_string());
    expect_close(&mut ws).await;
}

#[tokio::test]
async fn reset_mid_stream_drops_the_connection_without_a_close_frame() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    h.sim.push_fault(
        ACCT,
        Fault::once(FaultKind::ResetMidStream { after_deltas: 3 }),
    );
    send(&mut ws, &create("hi")).await;
    let mut frames = Vec::new();
    loop {
        match next_msg(&mut ws).await {
            Some(Ok(Message::Text(t))) => {
                frames.push(serde_json::from_str::<Value>(t.as_str()).unwrap())
            }
            None | Some(Err(_)) => break,
            other => panic!("expected frames then a dropped connection, got {other:?}"),
        }
    }
    assert_eq!(deltas(&frames), 3);
    assert!(!frames.iter().any(is_terminal));
    wait_open(&h, ACCT, 0).await;
    assert_eq!(h.sim.requests(ACCT).pop().unwrap().status, 200);
}

#[tokio::test]
async fn hang_mid_stream_goes_silent_until_the_client_leaves() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    h.sim.push_fault(
        ACCT,
        Fault::once(FaultKind::HangMidStream { after_deltas: 2 }),
    );
    send(&mut ws, &create("hi")).await;
    let mut frames = Vec::new();
    while deltas(&frames) < 2 {
        frames.push(next_json(&mut ws).await);
    }
    let silent = tokio::time::timeout(Duration::from_millis(300), ws.next()).await;
    assert!(silent.is_err(), "data arrived after the hang: {silent:?}");
    // Pings are still answered while the turn hangs.
    ws.send(Message::Ping(b"still there?".to_vec().into()))
        .await
        .unwrap();
    match next_msg_raw(&mut ws).await {
        Some(Ok(Message::Pong(p))) => assert_eq!(&p[..], b"still there?"),
        other => panic!("expected a pong, got {other:?}"),
    }
    drop(ws);
    wait_open(&h, ACCT, 0).await;
}

/// The next message including pings and pongs.
async fn next_msg_raw(ws: &mut Ws) -> Option<Result<Message, WsError>> {
    tokio::time::timeout(PATIENCE, ws.next())
        .await
        .expect("no frame in time")
}

#[tokio::test]
async fn binary_frame_is_closed_with_1003() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    ws.send(Message::binary(b"\x00\x01".to_vec()))
        .await
        .unwrap();
    assert_eq!(expect_close(&mut ws).await, CloseCode::Unsupported);
    wait_open(&h, ACCT, 0).await;
}

#[tokio::test]
async fn a_frame_that_is_not_response_create_is_a_400_frame() {
    let h = start(1).await;
    let (mut ws, _) = connect(&h, ACCT).await;
    ws.send(Message::text("not json")).await.unwrap();
    let err = next_json(&mut ws).await;
    assert_eq!(err["status"], 400);
    assert_eq!(err["error"]["type"], "invalid_request_error");
    send(&mut ws, &create("hi")).await;
    assert_eq!(
        turn_frames(&mut ws).await.last().unwrap()["type"],
        "response.completed"
    );
}

#[tokio::test]
async fn sockets_are_counted_per_account_and_end_with_the_simulator() {
    let h = start(2).await;
    let (mut a1, _) = connect(&h, "sim-acct-1").await;
    let (_a2, _) = connect(&h, "sim-acct-1").await;
    let (_b1, _) = connect(&h, "sim-acct-2").await;
    assert_eq!(h.sim.ws_connections("sim-acct-1"), 2);
    assert_eq!(h.sim.ws_open("sim-acct-1"), 2);
    assert_eq!(h.sim.ws_connections("sim-acct-2"), 1);
    // Turns on one socket do not open others.
    for _ in 0..3 {
        send(&mut a1, &create("hi")).await;
        turn_frames(&mut a1).await;
    }
    assert_eq!(h.sim.ws_connections("sim-acct-1"), 2);
    h.stop();
    wait_open(&h, "sim-acct-1", 0).await;
    wait_open(&h, "sim-acct-2", 0).await;
    assert!(matches!(next_msg(&mut a1).await, None | Some(Err(_))));
}
