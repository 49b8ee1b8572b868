//! The client edge tried as careless and hostile clients would: a reader that stops reading,
//! connections that never finish a request head or sit idle, more connections than the
//! gateway allows, and a shutdown whose grace period runs out with requests still running.

use std::time::Duration;

use crate::common::gw::{Gw, body_plain, until};
use crate::common::sse::parse_sse;
use crate::common::{SIGNAL_DEADLINE, dechunk, read_head, small_socket, try_read_head};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::sim::FaultKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn post(gw: &Gw, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "POST /v1/responses HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        gw.addr,
        gw.key,
        body.len()
    )
    .into_bytes()
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: gateway\r\n\r\n").into_bytes()
}

/// A whole answer with a `content-length` body: (status, head, body).
async fn exchange(s: &mut TcpStream, request: &[u8]) -> (u16, String, String) {
    try_exchange(s, request)
        .await
        .expect("the connection closed before an answer")
}

/// [`exchange`], or `None` when the gateway closes the connection before a whole head.
async fn try_exchange(s: &mut TcpStream, request: &[u8]) -> Option<(u16, String, String)> {
    s.write_all(request).await.unwrap();
    let head = try_read_head(s).await.ok()?;
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    s.read_exact(&mut body).await.unwrap();
    Some((status, head, String::from_utf8(body).unwrap()))
}

/// The gateway closes this connection: reads reach EOF (or a reset). The wait ends with the
/// close; only a connection still open after [`SIGNAL_DEADLINE`] fails it.
async fn assert_closed(s: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(SIGNAL_DEADLINE, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "{what}: the connection was left open");
}

/// The connection is still open: a `/healthz` on it is answered.
async fn assert_open(s: &mut TcpStream, what: &str) {
    let (status, _, _) = exchange(s, &get("/healthz")).await;
    assert_eq!(status, 200, "{what}");
}

async fn metric(gw: &Gw, line: &str) -> u64 {
    let text = gw.metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix(line))
        .unwrap_or_else(|| panic!("no {line} in metrics"))
        .trim()
        .parse()
        .unwrap()
}

fn one_slot(c: &mut switchyard::config::Config) {
    c.scheduling.max_concurrency = 1;
    c.server.client_write_timeout = Duration::from_millis(300);
}

#[tokio::test]
async fn a_client_that_stops_reading_frees_its_slot() {
    let gw = Gw::start_with(1, one_slot).await;
    let account = gw.rr_order()[0].clone();
    // Larger than every buffer between the backend and the client.
    gw.fault(&account, FaultKind::LongAnswer { kib: 8 * 1024 }, Some(1));
    let mut stalled = small_socket(gw.addr).await;
    stalled
        .write_all(&post(&gw, &body_plain("gpt-5.5", "a long answer", true)))
        .await
        .unwrap();
    let head = read_head(&mut stalled).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // It reads nothing more and keeps its socket open. The next caller gets the one slot.
    let sse = gw.stream(&body_plain("gpt-5.5", "next", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_eq!(gw.status().await["in_flight"], 0);
    let records = gw.requests(2).await;
    let cut = &records[1];
    assert_eq!(cut["outcome"], "client_stalled", "{cut}");
    // It got events from the backend, but nothing that ended the answer.
    assert_eq!(cut["terminal_source"], "none", "{cut}");
    assert_eq!(cut["attempts"][0]["class"], "client_stalled", "{cut}");
    // Neutral for the account.
    let a = gw.account(&account).await;
    assert_eq!(a["state"], "ready", "{a}");
    assert_eq!(
        metric(
            &gw,
            "switchyard_client_connections_closed_total{reason=\"stalled\"}"
        )
        .await,
        1
    );
    // The upstream request was given up while its client still held the connection: the
    // backend's long answer stopped being written before its end (the next one was read to
    // its end).
    until("the backend's answer cut", || async {
        gw.sim.sim.http_cut(&account) == 1
    })
    .await;
    assert_eq!(gw.sim.sim.http_open(&account), 0);
    assert_eq!(gw.served(&account), 2);
    drop(stalled);
}

#[tokio::test]
async fn a_websocket_client_that_stops_reading_frees_its_slot_and_its_upstream_socket() {
    let gw = Gw::start_with(1, one_slot).await;
    let account = gw.rr_order()[0].clone();
    gw.fault(&account, FaultKind::LongAnswer { kib: 8 * 1024 }, Some(1));
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", gw.key).parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::client_async(req, small_socket(gw.addr).await)
        .await
        .unwrap();
    let create = json!({
        "type": "response.create",
        "model": "gpt-5.5",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a long answer"}]}],
        "store": false,
        "stream": true,
    });
    ws.send(Message::Text(create.to_string().into()))
        .await
        .unwrap();
    // Its turn holds the one slot before the next caller comes (a frame written is not yet a
    // turn admitted: on a busy machine the next caller could take the slot first).
    until("the turn in flight", || async {
        gw.status().await["in_flight"] == 1
    })
    .await;
    // It reads nothing. The next caller gets the one slot.
    let sse = gw.stream(&body_plain("gpt-5.5", "next", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    let records = gw.requests(2).await;
    let cut = &records[1];
    assert_eq!(cut["outcome"], "client_stalled", "{cut}");
    // It got events from the backend, but nothing that ended the answer.
    assert_eq!(cut["terminal_source"], "none", "{cut}");
    assert_eq!(cut["attempts"][0]["class"], "client_stalled", "{cut}");
    assert_eq!(gw.account(&account).await["state"], "ready");
    // The upstream socket of the cut turn is closed, not pooled.
    until("the upstream socket closed", || async {
        gw.sim.sim.ws_open(&account) == 0
    })
    .await;
    drop(ws);
}

#[tokio::test]
async fn a_connection_without_a_whole_request_head_is_closed() {
    let gw = Gw::start_with(1, |c| {
        c.server.header_read_timeout = Duration::from_millis(200);
    })
    .await;
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    let mut partial = TcpStream::connect(gw.addr).await.unwrap();
    partial
        .write_all(b"POST /v1/responses HTTP/1.1\r\nhost: gateway\r\n")
        .await
        .unwrap();
    assert_closed(&mut silent, "a connection that sent nothing").await;
    assert_closed(&mut partial, "a connection that sent half a head").await;
    assert_eq!(
        metric(
            &gw,
            "switchyard_client_connections_closed_total{reason=\"head_timeout\"}"
        )
        .await,
        2
    );
    // A client that sends its request is served.
    let mut fresh = TcpStream::connect(gw.addr).await.unwrap();
    assert_open(&mut fresh, "a whole request").await;
}

#[tokio::test]
async fn a_first_request_that_outlasts_the_head_timeout_is_not_cut() {
    let gw = Gw::start_with(1, |c| {
        c.server.header_read_timeout = Duration::from_millis(300);
    })
    .await;
    let acct = gw.sim.sim.account_ids().remove(0);
    gw.fault(&acct, FaultKind::SlowDeltas { ms: 150 }, Some(1));
    // One connection, one request whose answer takes several head timeouts to stream.
    let sse = gw
        .stream(&body_plain("gpt-5.5", "a slow answer", true), &[])
        .await;
    assert_eq!(sse.status, 200);
    assert!(!sse.broken, "the stream was cut: {}", sse.body);
    assert_eq!(sse.last().0, "response.completed", "{}", sse.body);
    assert_eq!(
        metric(
            &gw,
            "switchyard_client_connections_closed_total{reason=\"head_timeout\"}"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn a_kept_alive_connection_idle_too_long_is_closed() {
    let gw = Gw::start_with(1, |c| {
        c.server.keepalive_idle_timeout = Duration::from_millis(300);
    })
    .await;
    let mut idle = TcpStream::connect(gw.addr).await.unwrap();
    assert_open(&mut idle, "the first request").await;
    assert_closed(&mut idle, "a kept-alive connection with no request").await;
    assert_eq!(
        metric(
            &gw,
            "switchyard_client_connections_closed_total{reason=\"idle_timeout\"}"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn a_kept_alive_connection_that_trickles_its_next_head_is_closed_as_idle() {
    let gw = Gw::start_with(1, |c| {
        c.server.keepalive_idle_timeout = Duration::from_millis(300);
    })
    .await;
    let mut slow = TcpStream::connect(gw.addr).await.unwrap();
    assert_open(&mut slow, "the first request").await;
    // The next head, a header line at a time, never ended: no request starts, so the
    // connection stays idle however busy its socket is.
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(SIGNAL_DEADLINE, async {
        for n in 0.. {
            let line = format!("x-slow-{n}: 1\r\n");
            if slow.write_all(line.as_bytes()).await.is_err() {
                return;
            }
            let read = tokio::time::timeout(Duration::from_millis(50), slow.read(&mut buf)).await;
            if matches!(read, Ok(Ok(0) | Err(_))) {
                return;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the trickling connection was left open");
    assert_eq!(
        metric(
            &gw,
            "switchyard_client_connections_closed_total{reason=\"idle_timeout\"}"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn beyond_max_connections_the_oldest_idle_one_goes_then_new_ones_are_refused() {
    let gw = Gw::start_with(1, |c| {
        c.server.max_connections = 3;
    })
    .await;
    let account = gw.rr_order()[0].clone();
    // Three idle connections, the first the oldest.
    let mut conns = Vec::new();
    for n in 0..3 {
        let mut c = TcpStream::connect(gw.addr).await.unwrap();
        assert_open(&mut c, &format!("connection {n}")).await;
        conns.push(c);
    }
    // A fourth is served; the oldest idle one is closed to make room.
    let mut fourth = TcpStream::connect(gw.addr).await.unwrap();
    assert_open(&mut fourth, "the fourth connection").await;
    let mut oldest = conns.remove(0);
    assert_closed(&mut oldest, "the oldest idle connection").await;
    // One that never finishes its head takes the place of the next oldest.
    let mut partial = TcpStream::connect(gw.addr).await.unwrap();
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    assert_closed(&mut conns[0], "the next oldest idle connection").await;
    let (_, _, text) = exchange(&mut fourth, &get("/metrics")).await;
    assert!(
        text.contains("switchyard_client_connections_closed_total{reason=\"evicted\"} 2"),
        "{text}"
    );

    // Every connection busy (answers that go silent after their first delta, until their
    // client leaves)...
    gw.fault(&account, FaultKind::HangMidStream { after_deltas: 1 }, None);
    let mut busy = vec![conns.remove(1), fourth];
    for (n, c) in busy.iter_mut().enumerate() {
        c.write_all(&post(
            &gw,
            &body_plain("gpt-5.5", &format!("busy {n}"), true),
        ))
        .await
        .unwrap();
        let head = read_head(c).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    // (the unfinished head was the one idle connection left: it makes room for the third)
    let mut third = TcpStream::connect(gw.addr).await.unwrap();
    third
        .write_all(&post(&gw, &body_plain("gpt-5.5", "busy 2", true)))
        .await
        .unwrap();
    let head = read_head(&mut third).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    busy.push(third);
    assert_closed(&mut partial, "the unfinished head").await;
    // ...a new one is refused, and the admin socket still answers.
    let mut refused = TcpStream::connect(gw.addr).await.unwrap();
    assert_closed(&mut refused, "a connection beyond the limit").await;
    let status = gw.status().await;
    assert_eq!(status["in_flight"], 3, "{status}");

    // One busy client leaves: there is room again.
    drop(busy.pop());
    until("a slot released", || async {
        gw.status().await["in_flight"] == 2
    })
    .await;
    assert_eq!(
        metric(
            &gw,
            "switchyard_client_connections_closed_total{reason=\"refused\"}"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn a_cut_stream_is_told_and_recorded_and_readyz_says_503_while_draining() {
    let mut gw = Gw::start_with(1, |c| {
        c.server.shutdown_grace = Duration::from_millis(300);
    })
    .await;
    let account = gw.rr_order()[0].clone();
    // A healthy answer that goes silent after its first delta, until the gateway leaves it.
    gw.fault(
        &account,
        FaultKind::HangMidStream { after_deltas: 1 },
        Some(1),
    );
    let mut streaming = TcpStream::connect(gw.addr).await.unwrap();
    streaming
        .write_all(&post(&gw, &body_plain("gpt-5.5", "a slow answer", true)))
        .await
        .unwrap();
    let head = read_head(&mut streaming).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Two clients connected before the shutdown, both idle once answered.
    let mut prober = TcpStream::connect(gw.addr).await.unwrap();
    let (status, _, _) = exchange(&mut prober, &get("/readyz")).await;
    assert_eq!(status, 200);
    let mut idle = TcpStream::connect(gw.addr).await.unwrap();
    let (status, _, _) = exchange(&mut idle, &get("/readyz")).await;
    assert_eq!(status, 200);

    gw.begin_shutdown();
    // One asks until the drain has begun: it is told so, or its request was in flight when
    // the drain began and its connection closes after the answer.
    while let Some((200, head, _)) = try_exchange(&mut prober, &get("/readyz")).await {
        if head.to_ascii_lowercase().contains("connection: close") {
            break;
        }
    }
    // While the stream runs, the connected client that was idle is told the gateway is draining.
    let (status, head, body) = exchange(&mut idle, &get("/readyz")).await;
    assert_eq!(status, 503, "{head}{body}");
    assert!(body.contains("draining"), "{body}");

    // The grace period runs out: the stream is cut with a terminal event, not a bare close.
    let mut rest = Vec::new();
    streaming.read_to_end(&mut rest).await.unwrap();
    let (events, _) = parse_sse(&String::from_utf8(dechunk(&rest)).unwrap());
    let (kind, last) = events.last().unwrap();
    assert_eq!(kind, "response.failed", "{events:?}");
    assert_eq!(
        last["response"]["error"]["code"], "server_shutting_down",
        "{last}"
    );
    assert!(
        events.iter().any(|(k, _)| k.ends_with(".delta")),
        "{events:?}"
    );
    gw.shutdown().await;

    // Its record was kept.
    gw.restart().await;
    let records = gw.requests(1).await;
    let cut = &records[0];
    assert_eq!(cut["outcome"], "shutting_down", "{cut}");
    assert_eq!(cut["terminal_source"], "synthetic", "{cut}");
    assert_eq!(cut["attempts"][0]["class"], "abandoned", "{cut}");
    assert_eq!(cut["attempts"][0]["phase"], "mid_stream", "{cut}");
    // Neutral for the account.
    assert_eq!(gw.account(&account).await["state"], "ready");
}

#[tokio::test]
async fn a_cut_websocket_turn_is_told_and_the_connection_closed() {
    let mut gw = Gw::start_with(1, |c| {
        c.server.shutdown_grace = Duration::from_millis(300);
    })
    .await;
    let account = gw.rr_order()[0].clone();
    gw.fault(
        &account,
        FaultKind::HangMidStream { after_deltas: 1 },
        Some(1),
    );
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", gw.key).parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let create = json!({
        "type": "response.create",
        "model": "gpt-5.5",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a slow answer"}]}],
        "store": false,
        "stream": true,
    });
    ws.send(Message::Text(create.to_string().into()))
        .await
        .unwrap();
    let mut events = Vec::new();
    // Up to the first delta, then the shutdown.
    while let Some(Ok(Message::Text(t))) = ws.next().await {
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        let delta = v["type"].as_str().unwrap().ends_with(".delta");
        events.push(v);
        if delta {
            break;
        }
    }
    gw.begin_shutdown();
    let mut close = None;
    let ended = tokio::time::timeout(SIGNAL_DEADLINE, async {
        while let Some(msg) = ws.next().await {
            match msg {
                Ok(Message::Text(t)) => events.push(serde_json::from_str(t.as_str()).unwrap()),
                Ok(Message::Close(frame)) => {
                    close = frame;
                    break;
                }
                Ok(_) => {}
                Err(e) => panic!("the connection broke instead of closing: {e}"),
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the turn was left running: {events:?}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.failed", "{last}");
    assert_eq!(last["response"]["error"]["code"], "server_shutting_down");
    let close = close.expect("a close frame");
    assert_eq!(u16::from(close.code), 1001, "{close:?}");
    gw.shutdown().await;
    gw.restart().await;
    let records = gw.requests(1).await;
    assert_eq!(records[0]["outcome"], "shutting_down", "{}", records[0]);
    assert_eq!(records[0]["terminal_source"], "synthetic", "{}", records[0]);
}

/// A shell's `ulimit -n 1024` under the default `max_connections = 4096`: the cap is derived
/// from the limit, so idle sockets are evicted before the descriptors run out, `/healthz`
/// keeps answering, and `accept` never fails in a loop that fills the log.
#[test]
fn under_a_low_open_file_limit_idle_sockets_are_evicted_before_accept_fails() {
    use crate::common::{Daemon, DaemonOptions};
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(
        &tmp.path().join("state"),
        DaemonOptions {
            open_file_limit: Some(1024),
            ..DaemonOptions::default()
        },
    );
    // 128 descriptors kept, 2 per serving thread (one per core), 2 per connection.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cap = (1024 - 128 - 2 * cores) / 2;
    assert!(
        d.log_text().contains(&format!("\"connection_cap\":{cap}")),
        "the lowered cap is said once:\n{}",
        d.log_text()
    );
    let before = d.get("/healthz").0;
    let idle: Vec<std::net::TcpStream> = (0..1100)
        .map(|_| std::net::TcpStream::connect(d.http).unwrap())
        .collect();
    // Every one of them is accepted (or evicted to make room for the next), and the
    // gateway still answers a new client.
    let after = d.get("/healthz");
    assert_eq!(after.0, before, "{}", after.1);
    let metrics = d.get("/metrics").1;
    let evicted: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("switchyard_client_connections_closed_total{reason=\"evicted\"} ")
        })
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        evicted >= 1100 - cap as u64,
        "evicted {evicted}:\n{metrics}"
    );
    drop(idle);
    let log = d.log_text();
    let failures = log.matches("cannot accept a connection").count();
    assert!(failures <= 1, "{failures} accept warnings:\n{log}");
}
