//! Request bodies as their worst senders send them: one that trickles, one that announces a
//! terabyte, one that holds its key's only slot, and hundreds that trickle at once from one
//! limited key. A body is bounded in time and rate, judged on its head before it is read, and
//! a connection reading one is closed to make room before any that serves a request.

use std::time::Duration;

use crate::common::gw::{Gw, body_plain, until};
use crate::common::{SIGNAL_DEADLINE, read_head};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A head announcing `len` bytes of body on `/v1/responses`, with `key`.
fn head(gw: &Gw, key: &str, len: u64) -> Vec<u8> {
    format!(
        "POST /v1/responses HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {len}\r\n\r\n",
        gw.addr
    )
    .into_bytes()
}

/// A connection that sends `head`, then one byte of body every `every` until the gateway
/// closes it or the task is dropped.
fn trickle(gw: &Gw, key: &str, len: u64, every: Duration) -> tokio::task::JoinHandle<TcpStream> {
    let (addr, head) = (gw.addr, head(gw, key, len));
    tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // Closed to make room before its head went out, possibly: that is the point.
        if s.write_all(&head).await.is_err() || s.write_all(b"{").await.is_err() {
            return s;
        }
        loop {
            tokio::time::sleep(every).await;
            if s.write_all(b" ").await.is_err() {
                return s;
            }
        }
    })
}

/// The whole answer on a connection the gateway closes after it: (status, head, body).
async fn answer_then_close(s: &mut TcpStream) -> (u16, String, String) {
    let read = async {
        let head = read_head(s).await;
        let mut rest = Vec::new();
        // Until the gateway closes the connection (a reset after the answer counts as closed).
        let _ = s.read_to_end(&mut rest).await;
        (head, rest)
    };
    let (head, rest) = tokio::time::timeout(SIGNAL_DEADLINE, read)
        .await
        .expect("the connection was not closed after the answer");
    let status = head[9..12].parse().unwrap();
    (status, head, String::from_utf8_lossy(&rest).into_owned())
}

/// An answer's JSON error, from a body that may be chunked or not.
fn error_of(body: &str) -> Value {
    let start = body
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in {body:?}"));
    let end = body.rfind('}').unwrap();
    serde_json::from_str(&body[start..=end]).unwrap()
}

#[tokio::test]
async fn a_body_that_trickles_is_cut_with_408_and_the_connection_closed() {
    let gw = Gw::start_with(1, |c| {
        c.server.body_timeout = Duration::from_secs(4);
        c.server.body_min_rate = 1000;
    })
    .await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(&head(&gw, &gw.key, 100_000)).await.unwrap();
    let (mut reader, mut writer) = s.into_split();
    let writing = tokio::spawn(async move {
        while writer.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = Vec::new();
    tokio::time::timeout(SIGNAL_DEADLINE, reader.read_to_end(&mut buf))
        .await
        .expect("the gateway never answered the trickling body")
        .ok();
    writing.abort();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.to_lowercase().contains("connection: close"), "{text}");
    let e = error_of(&text);
    assert_eq!(e["error"]["code"], "request_timeout", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("slower than 1000 bytes a second"),
        "{e}"
    );
}

/// A body that starts (in the same write as its head, or after it) and never ends: 408 at
/// the deadline, and the connection closed.
async fn a_stalled_body_is_cut_at_its_deadline(with_head: bool) {
    let gw = Gw::start_with(1, |c| {
        c.server.body_timeout = Duration::from_secs(1);
        c.server.body_min_rate = 0;
    })
    .await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    let start = b"{\"model\":";
    let mut first = head(&gw, &gw.key, 50);
    if with_head {
        first.extend_from_slice(start);
        s.write_all(&first).await.unwrap();
    } else {
        s.write_all(&first).await.unwrap();
        s.write_all(start).await.unwrap();
    }
    let (status, head, body) = answer_then_close(&mut s).await;
    assert_eq!(status, 408, "{head}{body}");
    let e = error_of(&body);
    assert_eq!(e["error"]["code"], "request_timeout");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("did not arrive within 1s"),
        "{e}"
    );
}

#[tokio::test]
async fn a_body_past_its_deadline_is_cut_with_408() {
    a_stalled_body_is_cut_at_its_deadline(false).await;
}

/// The same when the body's start came in one write with its head (it is there as soon as
/// the head is read).
#[tokio::test]
async fn a_body_begun_with_its_head_then_stalled_is_cut_at_its_deadline() {
    a_stalled_body_is_cut_at_its_deadline(true).await;
}

/// A chunked body sent whole with its head, its last chunk included, is read to its end and
/// answered: nothing of it is waited for.
#[tokio::test]
async fn a_chunked_body_sent_whole_with_its_head_is_answered() {
    let gw = Gw::start(1).await;
    let json = body_plain("gpt-5.5", "all at once", true).to_string();
    let (front, back) = json.split_at(json.len() / 2);
    let mut req = format!(
        "POST /v1/responses HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        gw.addr, gw.key
    );
    for part in [front, back] {
        req.push_str(&format!("{:x}\r\n{part}\r\n", part.len()));
    }
    req.push_str("0\r\n\r\n");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let (status, head, body) = answer_then_close(&mut s).await;
    assert_eq!(status, 200, "{head}{body}");
    assert!(body.contains("response.completed"), "{body}");
}

#[tokio::test]
async fn a_body_announced_over_the_cap_is_refused_from_its_head() {
    let gw = Gw::start(1).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(&head(&gw, &gw.key, 1_000_000_000_000))
        .await
        .unwrap();
    s.write_all(b"{").await.unwrap();
    let (status, head, body) = answer_then_close(&mut s).await;
    assert_eq!(status, 413, "{head}{body}");
    assert!(head.to_lowercase().contains("connection: close"), "{head}");
    assert_eq!(error_of(&body)["error"]["code"], "request_too_large");
}

/// The key is admitted on the request's head: a slow body holds the key's only slot while it
/// comes, the key's next request waits in its queue and is refused, another key's is served,
/// and once the body is whole the request runs.
#[tokio::test]
async fn a_slow_body_holds_its_keys_slot_and_no_one_elses() {
    let gw = Gw::start_with(2, |c| {
        c.scheduling.queue_wait = Duration::from_millis(300);
        c.server.body_min_rate = 1;
    })
    .await;
    let (_, one) = gw.make_key("one-slot", json!({"max_concurrency": 1})).await;
    let body = body_plain("gpt-5.5", "hello", true).to_string();
    let mut slow = TcpStream::connect(gw.addr).await.unwrap();
    slow.write_all(&head(&gw, &one, body.len() as u64))
        .await
        .unwrap();
    slow.write_all(&body.as_bytes()[..10]).await.unwrap();
    // Admitted from its head: the key's slot is taken before the body is read whole.
    until("the slow request to hold its key's slot", || async {
        gw.metrics_text()
            .await
            .contains("switchyard_key_in_flight{key=\"one-slot\"} 1")
    })
    .await;
    let refused = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", format!("Bearer {one}"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(
        refused["error"]["code"], "key_concurrency_exceeded",
        "{refused}"
    );
    let other = gw.stream(&body_plain("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(other.last().0, "response.completed");
    slow.write_all(&body.as_bytes()[10..]).await.unwrap();
    let head = read_head(&mut slow).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// Hundreds of slow bodies from one key limited to 1 at a time and 1 a minute, against a small
/// connection cap: the well-behaved client and `/healthz` still get in, by closing the
/// connections that are reading a body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_from_one_key_make_room_for_well_behaved_clients() {
    let gw = Gw::start_with(2, |c| {
        c.server.max_connections = 64;
        c.server.body_min_rate = 1;
    })
    .await;
    let (_, limited) = gw
        .make_key("limited", json!({"max_concurrency": 1, "rpm": 1}))
        .await;
    let slow: Vec<_> = (0..300)
        .map(|_| trickle(&gw, &limited, 1_000_000, Duration::from_millis(500)))
        .collect();
    // Clients that keep no idle connection: one kept would be closed to make room as well.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    // While the slow ones still arrive, every slot may hold a connection that has not sent its
    // head yet (neither idle nor reading a body): a new connection is then refused, as the cap
    // says. A refused look reads as nothing evicted yet.
    let evicted = || async {
        let Ok(resp) = fresh.get(gw.url("/metrics")).send().await else {
            return 0;
        };
        resp.text()
            .await
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("switchyard_client_connections_closed_total{reason=\"evicted\"} ")
            })
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Every slow connection is in before the good client comes.
    until("the slow connections to fill the cap", || async {
        evicted().await >= 300 - 64
    })
    .await;
    let good = fresh
        .post(gw.url("/v1/responses"))
        .header("authorization", gw.auth())
        .json(&body_plain("gpt-5.5", "hello", true))
        .send()
        .await
        .unwrap();
    assert_eq!(good.status(), 200);
    let good = crate::common::gw::read_sse(good).await;
    assert_eq!(good.last().0, "response.completed");
    let health = fresh.get(gw.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert!(evicted().await > 300 - 64);
    for t in slow {
        t.abort();
    }
}

/// `body` padded with spaces to `len` bytes (still one JSON object).
fn padded(body: &Value, len: usize) -> String {
    let mut text = body.to_string();
    assert!(text.len() <= len);
    text.push_str(&" ".repeat(len - text.len()));
    text
}

/// What a key's bodies hold is paid for in its memory budget from the head on: a body that
/// does not fit beside the key's others is refused before it is read, another key is not
/// touched, and the budget comes back when the request is done.
#[tokio::test]
async fn a_keys_bodies_share_its_memory_budget_and_one_that_does_not_fit_is_refused_unread() {
    let gw = Gw::start_with(1, |c| {
        c.server.max_body_bytes = 600_000;
        c.server.key_memory_mib = 1;
        c.server.body_min_rate = 1;
    })
    .await;
    let (_, mem) = gw.make_key("mem", json!({})).await;
    let (_, other) = gw.make_key("other", json!({})).await;
    let body = padded(&body_plain("gpt-5.5", "hello", false), 600_000);
    let held = |n: usize| format!("switchyard_key_memory_bytes{{key=\"mem\"}} {n}\n");
    // One body on its way: the key pays for all of it from the head.
    let mut first = TcpStream::connect(gw.addr).await.unwrap();
    first.write_all(&head(&gw, &mem, 600_000)).await.unwrap();
    first.write_all(&body.as_bytes()[..10]).await.unwrap();
    until("the first body to be paid for", || async {
        gw.metrics_text().await.contains(&held(600_000))
    })
    .await;
    assert!(
        gw.metrics_text()
            .await
            .contains("switchyard_key_memory_limit_bytes 1048576\n")
    );
    // A second does not fit beside it: refused from its head, the connection closed.
    let mut second = TcpStream::connect(gw.addr).await.unwrap();
    second.write_all(&head(&gw, &mem, 600_000)).await.unwrap();
    second.write_all(b"{").await.unwrap();
    let (status, head_text, rest) = answer_then_close(&mut second).await;
    assert_eq!(status, 429, "{head_text}{rest}");
    assert!(head_text.to_lowercase().contains("connection: close"));
    let e = error_of(&rest);
    assert_eq!(e["error"]["code"], "key_memory_limit_reached", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("0.6 MiB of 1.0 MiB"),
        "{e}"
    );
    // Another key has a budget of its own.
    let resp = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", format!("Bearer {other}"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The first body completes and its request runs; when it is done the budget is back.
    first.write_all(&body.as_bytes()[10..]).await.unwrap();
    let answer = read_head(&mut first).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    until("the key's budget to come back", || async {
        gw.metrics_text().await.contains(&held(0))
    })
    .await;
    let resp = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", format!("Bearer {mem}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The refused body touched no account: the three others were served, it was not.
    assert_eq!(gw.served(&gw.rr_order()[0]), 3);
}
