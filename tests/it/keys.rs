//! Client keys with a policy: each refusal over HTTP and WebSocket, before any account is
//! touched; budgets across a restart; `/v1/usage`; the key commands.

use std::time::Duration;

use crate::common::gw::{Gw, body, read_sse, until};
use axum::http::Method;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::sim::FaultKind;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn post(gw: &Gw, key: &str, body: &Value) -> reqwest::Response {
    gw.http
        .post(gw.url("/v1/responses"))
        .header("authorization", format!("Bearer {key}"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// A JSON request: status, `Retry-After`, body.
async fn ask(gw: &Gw, key: &str, model: &str) -> (u16, Option<u64>, Value) {
    let resp = post(gw, key, &body(model, "hello", false)).await;
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (status, retry, resp.json().await.unwrap_or(Value::Null))
}

/// What `/v1/usage` tells `key` of itself.
async fn key_usage(gw: &Gw, key: &str) -> Value {
    gw.http
        .get(gw.url("/v1/usage"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn served_total(gw: &Gw) -> usize {
    gw.ids.keys().map(|a| gw.served(a)).sum()
}

async fn record(gw: &Gw) -> Value {
    gw.requests(1).await.remove(0)
}

async fn ws_connect(gw: &Gw, key: &str) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    tokio_tungstenite::connect_async(req)
        .await
        .map(|(ws, _)| ws)
}

/// Sends one `response.create` and reads to its terminal frame: a completed response or an
/// error frame.
async fn ws_turn(ws: &mut Ws, model: &str) -> Value {
    let frame = json!({
        "type": "response.create",
        "model": model,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        "store": false,
        "stream": true,
    });
    ws.send(Message::Text(frame.to_string().into()))
        .await
        .unwrap();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("a frame in time")
            .expect("the socket stays open")
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).unwrap();
            if let Some("response.completed" | "response.failed" | "error") = v["type"].as_str() {
                return v;
            }
        }
    }
}

#[tokio::test]
async fn a_model_outside_the_keys_globs_is_refused_before_any_account() {
    let gw = Gw::start(2).await;
    let (_, key) = gw.make_key("team", json!({"models": ["gpt-5.5*"]})).await;
    let (status, _, v) = ask(&gw, &key, "gpt-5.4-mini").await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "model_not_allowed");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("gpt-5.5*"));
    // A streaming client is refused the same way, before any header.
    let sse = post(&gw, &key, &body("gpt-5.4-mini", "hello", true)).await;
    assert_eq!(sse.status().as_u16(), 403);
    assert_eq!(served_total(&gw), 0, "no account was asked");
    let r = record(&gw).await;
    assert_eq!(r["outcome"], "model_not_allowed");
    assert_eq!(r["terminal_source"], "synthetic", "{r}");
    assert_eq!(r["attempts"], json!([]));
    assert_eq!(r["candidate_pool"], json!([]));
    for a in gw.accounts().await {
        assert_eq!(a["state"], "ready");
        assert_eq!(a["in_flight"], 0);
    }
    // A model the globs allow goes through.
    let (status, _, v) = ask(&gw, &key, "gpt-5.5").await;
    assert_eq!(status, 200, "{v}");
}

/// A key limited to the default tier: a request for `priority` (Codex's Fast mode) is 403
/// before any account is touched, over HTTP and on the WebSocket; one that asks for no tier
/// runs. A key that allows `priority` has it forwarded unchanged.
#[tokio::test]
async fn a_tier_outside_the_keys_list_is_refused_before_any_account() {
    let gw = Gw::start(2).await;
    let (_, key) = gw.make_key("standard", json!({"tiers": ["default"]})).await;
    let mut fast = body("gpt-5.5", "hello", false);
    fast["service_tier"] = json!("priority");
    let resp = post(&gw, &key, &fast).await;
    assert_eq!(resp.status().as_u16(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "tier_not_allowed", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("service tier 'priority' (allowed: default)"),
        "{v}"
    );
    let mut ws = ws_connect(&gw, &key).await.unwrap();
    let mut frame = fast.clone();
    frame["type"] = json!("response.create");
    frame["stream"] = json!(true);
    ws.send(Message::Text(frame.to_string().into()))
        .await
        .unwrap();
    let refused = loop {
        match ws.next().await.unwrap().unwrap() {
            Message::Text(t) => break serde_json::from_str::<Value>(t.as_str()).unwrap(),
            _ => continue,
        }
    };
    assert_eq!(refused["status"], 403, "{refused}");
    assert_eq!(refused["error"]["code"], "tier_not_allowed", "{refused}");
    assert_eq!(served_total(&gw), 0, "no account was asked");
    assert_eq!(record(&gw).await["outcome"], "tier_not_allowed");
    // No tier asked is the default tier.
    assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 200);
    // A key that allows priority: the tier goes to the backend as the client sent it.
    let (_, fast_key) = gw
        .make_key("fast", json!({"tiers": ["default", "priority"]}))
        .await;
    assert_eq!(post(&gw, &fast_key, &fast).await.status().as_u16(), 200);
    let sent: Vec<Value> = gw
        .ids
        .keys()
        .flat_map(|a| gw.sim.sim.requests(a))
        .map(|r| r.body)
        .filter(|b| b["service_tier"] == "priority")
        .collect();
    assert_eq!(sent.len(), 1, "forwarded once, unchanged");
}

#[tokio::test]
async fn over_its_rate_a_key_gets_429_with_retry_after() {
    let gw = Gw::start(2).await;
    let (_, key) = gw.make_key("bot", json!({"rpm": 2})).await;
    assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 200);
    assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 200);
    let (status, retry, v) = ask(&gw, &key, "gpt-5.5").await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "key_rate_limited");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    let retry = retry.expect("Retry-After");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(served_total(&gw), 2);
    // Another key is not limited by this one's rate.
    assert_eq!(ask(&gw, &gw.key, "gpt-5.5").await.0, 200);
}

#[tokio::test]
async fn an_exhausted_budget_is_429_with_its_reset_and_running_streams_finish() {
    let gw = Gw::start(2).await;
    let (_, key) = gw.make_key("small", json!({"tokens_per_5h": 1})).await;
    // Sent at once: the one admitted first holds an estimate while it runs, so the other is
    // refused (or, if it comes after the first ended, finds the budget used). It finishes.
    let (first, second) = (
        body("gpt-5.5", "first", true),
        body("gpt-5.5", "second", true),
    );
    let (a, b) = tokio::join!(post(&gw, &key, &first), post(&gw, &key, &second));
    let mut statuses = Vec::new();
    for resp in [a, b] {
        statuses.push(resp.status().as_u16());
        if resp.status() == 200 {
            let sse = read_sse(resp).await;
            assert_eq!(sse.last().0, "response.completed");
        } else {
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["code"], "key_budget_exhausted", "{v}");
        }
    }
    statuses.sort();
    assert_eq!(statuses, [200, 429]);
    let (status, retry, v) = ask(&gw, &key, "gpt-5.5").await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "key_budget_exhausted");
    let resets = v["error"]["resets_in_seconds"]
        .as_u64()
        .expect("resets_in_seconds");
    // The hour it was used in leaves the 5-hour window between 5 and 6 hours from now.
    assert!((5 * 3600..=6 * 3600).contains(&resets), "{resets}");
    assert_eq!(retry, Some(resets));
    assert_eq!(served_total(&gw), 1);
    // Raised live, the next request runs.
    gw.admin_call(
        Method::PATCH,
        "/api/admin/keys/small",
        Some(json!({"tokens_per_5h": null})),
    )
    .await;
    assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 200);
}

/// A multi-agent session on one budget: six requests at once on a budget about one answer
/// long. Each admitted request holds an estimate until it ends, so at most one is admitted
/// beyond the budget; the others are refused before any account is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_requests_at_once_on_a_one_answer_budget_admit_at_most_one_beyond_it() {
    let gw = Gw::start(2).await;
    // What one answer costs here, measured on another key.
    let (_, probe) = gw.make_key("probe", json!({})).await;
    assert_eq!(ask(&gw, &probe, "gpt-5.5").await.0, 200);
    let one: u64 = gw
        .metrics_text()
        .await
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("switchyard_key_tokens_total{key=\"probe\",kind=\"")?;
            let (kind, n) = rest.split_once("\"} ")?;
            matches!(kind, "input" | "output").then(|| n.parse::<u64>().ok())?
        })
        .sum();
    assert!(one > 0);
    let (_, key) = gw
        .make_key("agents", json!({"tokens_per_5h": one + 10}))
        .await;
    let before = served_total(&gw);
    let sent: Vec<_> = (0..6)
        .map(|i| {
            let (http, url, key) = (gw.http.clone(), gw.url("/v1/responses"), key.clone());
            let b = body("gpt-5.5", &format!("agent {i}"), false);
            tokio::spawn(async move {
                let resp = http
                    .post(url)
                    .bearer_auth(key)
                    .json(&b)
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                (status, resp.json::<Value>().await.unwrap_or(Value::Null))
            })
        })
        .collect();
    let mut admitted = 0;
    for s in sent {
        let (status, v) = s.await.unwrap();
        match status {
            200 => admitted += 1,
            429 => assert_eq!(v["error"]["code"], "key_budget_exhausted", "{v}"),
            other => panic!("{other}: {v}"),
        }
    }
    assert!((1..=2).contains(&admitted), "{admitted} admitted");
    assert_eq!(
        served_total(&gw) - before,
        admitted,
        "a refusal touched an account"
    );
    // What the key used: at most one answer beyond its budget.
    let usage = key_usage(&gw, &key).await;
    let used = usage["limits"]["tokens_per_5h"]["used"]
        .as_u64()
        .unwrap_or_else(|| panic!("{usage}"));
    assert!(
        used <= one + 10 + one,
        "{used} used of {}: {usage}",
        one + 10
    );
}

/// `/v1/usage` says what the rate check will do: an rpm set on a key that was already busy
/// starts its minute empty, and the endpoint says 3 remaining while 3 more are admitted.
#[tokio::test]
async fn an_rpm_set_on_a_busy_key_shows_the_requests_it_will_admit() {
    let gw = Gw::start(1).await;
    let (_, key) = gw.make_key("busy", json!({})).await;
    for _ in 0..4 {
        assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 200);
    }
    gw.admin_call(
        Method::PATCH,
        "/api/admin/keys/busy",
        Some(json!({"rpm": 3})),
    )
    .await;
    let usage = || async { key_usage(&gw, &key).await["limits"]["rpm"].clone() };
    let rpm = usage().await;
    assert_eq!(
        (rpm["used"].as_u64(), rpm["remaining"].as_u64()),
        (Some(0), Some(3)),
        "{rpm}"
    );
    for _ in 0..3 {
        assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 200);
    }
    let rpm = usage().await;
    assert_eq!(rpm["remaining"], 0, "{rpm}");
    assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 429);
}

#[tokio::test]
async fn an_expired_key_is_refused_on_http_and_on_the_websocket_handshake() {
    let gw = Gw::start(1).await;
    let (id, key) = gw.make_key("temp", json!({})).await;
    assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 200);
    gw.admin_call(
        Method::PATCH,
        &format!("/api/admin/keys/{id}"),
        Some(json!({"expires_at": "2020-01-01T00:00:00Z"})),
    )
    .await;
    let (status, _, v) = ask(&gw, &key, "gpt-5.5").await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "key_expired");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2020-01-01")
    );
    match ws_connect(&gw, &key).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 401);
            let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default());
            assert!(body.contains("key_expired"), "{body}");
        }
        other => panic!("expected a refused handshake, got {:?}", other.map(|_| ())),
    }
    assert_eq!(served_total(&gw), 1);
}

#[tokio::test]
async fn over_its_concurrency_a_request_waits_in_the_keys_queue_then_gets_429() {
    let gw = Gw::start_with(1, |c| {
        c.scheduling.queue_wait = Duration::from_millis(300);
    })
    .await;
    let (_, key) = gw
        .make_key("one-at-a-time", json!({"max_concurrency": 1}))
        .await;
    let acct = gw.ids.keys().next().unwrap().clone();
    gw.fault(&acct, FaultKind::HangMidStream { after_deltas: 1 }, Some(1));
    // The first holds the key's only slot: it streams, then hangs.
    let first = post(&gw, &key, &body("gpt-5.5", "hang", true)).await;
    assert_eq!(first.status().as_u16(), 200);
    let mut first = first.bytes_stream();
    let chunk = first.next().await.unwrap().unwrap();
    assert!(!chunk.is_empty());
    let (status, retry, v) = ask(&gw, &key, "gpt-5.5").await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "key_concurrency_exceeded");
    assert!(retry.is_some());
    let r = record(&gw).await;
    assert_eq!(r["outcome"], "key_concurrency_exceeded");
    assert_eq!(r["attempts"], json!([]));
    // The account had room: only the key was full.
    assert_eq!(gw.served(&acct), 1);
    // Another key is not held up.
    assert_eq!(ask(&gw, &gw.key, "gpt-5.5").await.0, 200);
    // A WebSocket turn of the full key waits the same, then gets the refusal as an error frame.
    let mut ws = ws_connect(&gw, &key).await.unwrap();
    let refused = ws_turn(&mut ws, "gpt-5.5").await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["status"], 429);
    assert_eq!(refused["error"]["code"], "key_concurrency_exceeded");
    assert_eq!(gw.served(&acct), 2);
    // A request that waits while the slot frees gets it.
    let waiting = {
        let http = gw.http.clone();
        let url = gw.url("/v1/responses");
        let key = key.clone();
        tokio::spawn(async move {
            http.post(url)
                .header("authorization", format!("Bearer {key}"))
                .json(&body("gpt-5.5", "after", false))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    until("the second request waits in the key's queue", || async {
        gw.metrics_text()
            .await
            .contains("switchyard_key_in_flight{key=\"one-at-a-time\"} 1")
            && keys_waiting(&gw, "one-at-a-time").await == 1
    })
    .await;
    drop(first);
    assert_eq!(waiting.await.unwrap(), 200);
    // The socket stayed open: with the slot free, its next turn runs.
    let next = ws_turn(&mut ws, "gpt-5.5").await;
    assert_eq!(next["type"], "response.completed", "{next}");
}

/// Requests waiting in a key's own queue, as the console feed shows it.
async fn keys_waiting(gw: &Gw, name: &str) -> u64 {
    let feed = console_snapshot(gw).await;
    feed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == name)
        .map_or(0, |k| k["waiting"].as_u64().unwrap())
}

/// The first message of the console feed (a snapshot).
async fn console_snapshot(gw: &Gw) -> Value {
    let admin = gw.admin().await;
    let mut feed = admin.feed().await.unwrap();
    match feed.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        other => panic!("not a feed message: {other:?}"),
    }
}

#[tokio::test]
async fn websocket_turns_get_each_refusal_as_an_error_frame_and_the_socket_stays_open() {
    let gw = Gw::start(2).await;
    let (id, key) = gw
        .make_key("ws-team", json!({"models": ["gpt-5.5"], "rpm": 2}))
        .await;
    let mut ws = ws_connect(&gw, &key).await.unwrap();
    let before = served_total(&gw);
    let refused = ws_turn(&mut ws, "gpt-5.4-mini").await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["status"], 403);
    assert_eq!(refused["error"]["code"], "model_not_allowed");
    assert_eq!(
        ws_turn(&mut ws, "gpt-5.5").await["type"],
        "response.completed"
    );
    assert_eq!(
        ws_turn(&mut ws, "gpt-5.5").await["type"],
        "response.completed"
    );
    let served = served_total(&gw);
    let limited = ws_turn(&mut ws, "gpt-5.5").await;
    assert_eq!(limited["status"], 429, "{limited}");
    assert_eq!(limited["error"]["code"], "key_rate_limited");
    // The policy changes live; the same connection goes on.
    gw.admin_call(
        Method::PATCH,
        &format!("/api/admin/keys/{id}"),
        Some(json!({"rpm": null, "tokens_per_day": 1})),
    )
    .await;
    // The two turns that ran used more than the new budget.
    let budget = ws_turn(&mut ws, "gpt-5.5").await;
    assert_eq!(served_total(&gw), served, "refused turns reach no account");
    assert_eq!(budget["status"], 429, "{budget}");
    assert_eq!(budget["error"]["code"], "key_budget_exhausted");
    assert!(budget["error"]["resets_in_seconds"].as_u64().unwrap() > 24 * 3600);
    gw.admin_call(
        Method::PATCH,
        &format!("/api/admin/keys/{id}"),
        Some(json!({"tokens_per_day": null})),
    )
    .await;
    let after = ws_turn(&mut ws, "gpt-5.5").await;
    assert_eq!(after["type"], "response.completed", "{after}");
    gw.admin_call(
        Method::PATCH,
        &format!("/api/admin/keys/{id}"),
        Some(json!({"expires_at": "2020-01-01T00:00:00Z"})),
    )
    .await;
    let served = served_total(&gw);
    let expired = ws_turn(&mut ws, "gpt-5.5").await;
    assert_eq!(expired["status"], 401, "{expired}");
    assert_eq!(expired["error"]["code"], "key_expired");
    // Three turns were served; the refusals reached no account.
    assert_eq!(served_total(&gw), served, "refused turns reach no account");
    // The backend saw one upstream handshake and the three turns that ran.
    assert_eq!(served_total(&gw) - before, 4);
    let refusals = gw.metrics_text().await;
    for code in [
        "model_not_allowed",
        "key_rate_limited",
        "key_budget_exhausted",
        "key_expired",
    ] {
        assert!(
            refusals.contains(&format!(
                "switchyard_key_refusals_total{{key=\"ws-team\",code=\"{code}\"}} 1"
            )),
            "{code}:\n{refusals}"
        );
    }
}

#[tokio::test]
async fn the_usage_endpoint_shows_a_key_its_own_usage_and_limits_only() {
    let gw = Gw::start(2).await;
    let (_, mine) = gw.make_key(
        "mine",
        json!({"tokens_per_day": 1_000_000, "rpm": 100, "max_concurrency": 4, "models": ["gpt-5*"]}),
    )
    .await;
    let (_, theirs) = gw.make_key("theirs", json!({})).await;
    for _ in 0..3 {
        assert_eq!(ask(&gw, &mine, "gpt-5.5").await.0, 200);
    }
    assert_eq!(ask(&gw, &theirs, "gpt-5.5").await.0, 200);
    let records = gw.requests(10).await;
    let my_tokens: u64 = records
        .iter()
        .filter(|r| r["key"] == "mine")
        .map(|r| {
            r["usage"]["input_tokens"].as_u64().unwrap()
                + r["usage"]["output_tokens"].as_u64().unwrap()
        })
        .sum();
    assert!(my_tokens > 0);

    let resp = gw
        .http
        .get(gw.url("/v1/usage"))
        .header("authorization", format!("Bearer {mine}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["key"]["name"], "mine");
    for period in ["today", "last_5h", "last_7d"] {
        assert_eq!(v["usage"][period]["requests"], 3, "{period}: {v}");
        assert_eq!(v["usage"][period]["total_tokens"], my_tokens, "{period}");
    }
    let day = &v["limits"]["tokens_per_day"];
    assert_eq!(day["limit"], 1_000_000);
    assert_eq!(day["used"], my_tokens);
    assert_eq!(day["remaining"], 1_000_000 - my_tokens);
    assert!(day["resets_in_seconds"].as_u64().unwrap() > 23 * 3600);
    assert_eq!(v["limits"]["rpm"]["used"], 3);
    assert_eq!(v["limits"]["rpm"]["remaining"], 97);
    assert!(v["limits"]["rpm"]["resets_in_seconds"].as_u64().unwrap() <= 61);
    assert_eq!(v["limits"]["max_concurrency"]["limit"], 4);
    assert_eq!(v["limits"]["models"], json!(["gpt-5*"]));
    assert_eq!(v["limits"]["tokens_per_5h"], Value::Null);
    // Nothing of other keys or of the accounts behind the gateway.
    assert!(!text.contains("theirs"), "{text}");
    for acct in gw.ids.keys() {
        assert!(!text.contains(acct.as_str()), "{text}");
    }
    for a in gw.accounts().await {
        assert!(!text.contains(a["id"].as_str().unwrap()), "{text}");
    }
    let anon = gw.http.get(gw.url("/v1/usage")).send().await.unwrap();
    assert_eq!(anon.status().as_u16(), 401);
}

/// The value of one series in a `/metrics` exposition (0 when absent).
fn series(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn metrics_count_each_keys_requests_errors_and_tokens() {
    let gw = Gw::start(1).await;
    let account = gw.rr_order()[0].clone();
    let (_, alpha) = gw.make_key("alpha", json!({"models": ["gpt-5.5"]})).await;
    let (_, beta) = gw.make_key("beta", json!({})).await;
    // alpha: two streams and a JSON answer, a refused model, and a caller error.
    for stream in [true, true, false] {
        let resp = post(&gw, &alpha, &body("gpt-5.5", "hello", stream)).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    assert_eq!(ask(&gw, &alpha, "gpt-5.4-mini").await.0, 403);
    gw.fault(&account, FaultKind::ContextLength, Some(1));
    assert_eq!(ask(&gw, &alpha, "gpt-5.5").await.0, 400);
    // beta: one answer, and a stream the backend breaks after output.
    assert_eq!(ask(&gw, &beta, "gpt-5.5").await.0, 200);
    gw.fault(
        &account,
        FaultKind::ResetMidStream { after_deltas: 2 },
        Some(1),
    );
    let broken = read_sse(post(&gw, &beta, &body("gpt-5.5", "hello", true)).await).await;
    assert_eq!(
        broken.last().1["response"]["error"]["code"],
        "upstream_stream_error"
    );

    // The tokens each key used, as its records have them.
    let records = gw.requests(100).await;
    assert_eq!(records.len(), 7);
    let tokens = |key: &str, kind: &str| -> u64 {
        records
            .iter()
            .filter(|r| r["key"] == key)
            .filter_map(|r| r["usage"][kind].as_u64())
            .sum()
    };
    let text = gw.metrics_text().await;
    for (key, requests, errors) in [("alpha", 5, 2), ("beta", 2, 1)] {
        let label = format!("{{key=\"{key}\"}}");
        assert_eq!(
            series(&text, &format!("switchyard_key_requests_total{label}")),
            requests,
            "{key}:\n{text}"
        );
        assert_eq!(
            series(&text, &format!("switchyard_key_errors_total{label}")),
            errors,
            "{key}:\n{text}"
        );
        for (kind, field) in [
            ("input", "input_tokens"),
            ("cached", "cached_tokens"),
            ("output", "output_tokens"),
            ("reasoning", "reasoning_tokens"),
        ] {
            let want = tokens(key, field);
            let got = series(
                &text,
                &format!("switchyard_key_tokens_total{{key=\"{key}\",kind=\"{kind}\"}}"),
            );
            assert_eq!(got, want, "{key} {kind}:\n{text}");
        }
    }
    // The answers carried tokens: three of alpha's, one of beta's.
    assert!(tokens("alpha", "input_tokens") > 0 && tokens("alpha", "output_tokens") > 0);
    assert!(
        tokens("alpha", "cached_tokens") > 0,
        "the same prompt again hits the cache"
    );
    assert!(tokens("beta", "output_tokens") > 0);
    // The gateway's own key sent nothing.
    assert_eq!(
        series(&text, "switchyard_key_requests_total{key=\"test\"}"),
        0
    );
}

#[tokio::test]
async fn budgets_hold_across_a_restart() {
    let mut gw = Gw::start(1).await;
    let (_, key) = gw.make_key("daily", json!({"tokens_per_day": 1})).await;
    assert_eq!(ask(&gw, &key, "gpt-5.5").await.0, 200);
    assert!(ask(&gw, &key, "gpt-5.5").await.1.is_some());
    gw.restart().await;
    let (status, _, v) = ask(&gw, &key, "gpt-5.5").await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "key_budget_exhausted");
    let usage: Value = gw
        .http
        .get(gw.url("/v1/usage"))
        .header("authorization", format!("Bearer {key}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The one that ran, the one refused before the restart and the one after.
    assert_eq!(usage["usage"]["today"]["requests"], 3, "{usage}");
    assert_eq!(usage["usage"]["today"]["errors"], 2, "{usage}");
    assert_eq!(served_total(&gw), 1);
}

#[test]
fn the_key_commands_set_show_change_and_revoke_a_policy_by_name() {
    use crate::common::{assert_one_line_error, cli, stderr, stdout};
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let created = cli(
        &state,
        &[
            "key",
            "create",
            "team",
            "--models",
            "gpt-5*,o4-mini",
            "--max-concurrency",
            "4",
            "--rpm",
            "60",
            "--tokens-per-5h",
            "200k",
            "--tokens-per-day",
            "2M",
            "--expires",
            "2027-01-31",
            "--note",
            "the team's agents",
        ],
    );
    assert!(created.status.success(), "{}", stderr(&created));
    assert!(stdout(&created).trim().starts_with("sk-sy-"));
    let show = cli(&state, &["key", "show", "team", "--json"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let k: Value = serde_json::from_str(&stdout(&show)).unwrap();
    let p = &k["policy"];
    assert_eq!(p["models"], json!(["gpt-5*", "o4-mini"]));
    assert_eq!(p["max_concurrency"], 4);
    assert_eq!(p["rpm"], 60);
    assert_eq!(p["tokens_per_5h"], 200_000);
    assert_eq!(p["tokens_per_day"], 2_000_000);
    assert_eq!(p["tokens_per_week"], Value::Null);
    assert_eq!(p["expires_at"], "2027-01-31T00:00:00Z");
    assert_eq!(p["note"], "the team's agents");

    // `none` and `--clear-…` remove a limit; what is not named stays.
    let updated = cli(
        &state,
        &[
            "key",
            "update",
            "team",
            "--rpm",
            "none",
            "--clear-tokens-per-5h",
            "--tokens-per-week",
            "10M",
        ],
    );
    assert!(updated.status.success(), "{}", stderr(&updated));
    let text = stdout(&updated);
    assert!(text.contains("rpm              none"), "{text}");
    assert!(text.contains("tokens per week  10000000"), "{text}");
    assert!(text.contains("max concurrency  4"), "{text}");
    let list = stdout(&cli(&state, &["key", "list"]));
    assert!(list.contains("4 at once"), "{list}");
    assert!(!list.contains("rpm"), "{list}");

    // Bad values are refused with the flag named.
    let bad = cli(&state, &["key", "update", "team", "--rpm", "0"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("'--rpm <N|none>': `0` is not a positive number"),
        "{}",
        stderr(&bad)
    );
    let bad = cli(&state, &["key", "update", "team", "--expires", "someday"]);
    assert_one_line_error(&bad, &["--expires", "someday"]);
    let nothing = cli(&state, &["key", "update", "team"]);
    assert_one_line_error(&nothing, &["nothing to change"]);

    // The documented rotation: revoked by name, created again under it. Every command that
    // takes the name means the active key; the revoked one keeps the name in history only.
    let id = k["id"].as_str().unwrap();
    assert!(cli(&state, &["key", "revoke", "team"]).status.success());
    let again = cli(&state, &["key", "create", "team"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let listed: Value =
        serde_json::from_str(&stdout(&cli(&state, &["key", "list", "--json"]))).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["name"] == "team")
        .map(|k| k["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{listed}");
    let new_id = *ids.iter().find(|i| **i != id).unwrap();
    let show = cli(&state, &["key", "show", "team", "--json"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let shown: Value = serde_json::from_str(&stdout(&show)).unwrap();
    assert_eq!(shown["id"], new_id, "{shown}");
    let updated = cli(&state, &["key", "update", "team", "--rpm", "5"]);
    assert!(updated.status.success(), "{}", stderr(&updated));
    assert!(stdout(&updated).contains(new_id), "{}", stdout(&updated));
    let usage = cli(&state, &["usage", "--key", "team"]);
    assert!(usage.status.success(), "{}", stderr(&usage));
    // The old key is still there by its id.
    let old = cli(&state, &["key", "show", id, "--json"]);
    let old: Value = serde_json::from_str(&stdout(&old)).unwrap();
    assert_eq!(old["id"], id);
    // A second active key of the name is refused.
    let twin = cli(&state, &["key", "create", "team"]);
    assert_one_line_error(&twin, &["already exists", "team"]);
    // Revoking by the shared name means the active one.
    let revoked = cli(&state, &["key", "revoke", "team"]);
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    assert!(stdout(&revoked).contains(new_id), "{}", stdout(&revoked));
    // Two revoked keys and none active: the name is ambiguous, and the error lists them.
    let ambiguous = cli(&state, &["key", "show", "team"]);
    let mut needles = vec!["more than one key"];
    needles.extend(&ids);
    assert_one_line_error(&ambiguous, &needles);
    let unknown = cli(&state, &["key", "update", "nobody", "--rpm", "5"]);
    assert_one_line_error(&unknown, &["nobody"]);
}

#[test]
fn an_expiry_given_as_a_duration_counts_from_now() {
    use crate::common::{cli, stderr};
    use std::time::{SystemTime, UNIX_EPOCH};
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let expires_at = || {
        let show = cli(&state, &["key", "show", "temp", "--json"]);
        assert!(show.status.success(), "{}", stderr(&show));
        let k: Value = serde_json::from_slice(&show.stdout).unwrap();
        k["policy"]["expires_at"]
            .as_str()
            .map(|t| switchyard::base::clock::parse_rfc3339_ms(t).unwrap() / 1000)
    };

    let before = now();
    let created = cli(&state, &["key", "create", "temp", "--expires", "2h"]);
    assert!(created.status.success(), "{}", stderr(&created));
    let after = now();
    let at = expires_at().unwrap();
    assert!(
        (before + 7200..=after + 7200).contains(&at),
        "{at} not 2 h after {before}..{after}"
    );

    let before = now();
    let updated = cli(&state, &["key", "update", "temp", "--expires", "30m"]);
    assert!(updated.status.success(), "{}", stderr(&updated));
    let after = now();
    let at = expires_at().unwrap();
    assert!(
        (before + 1800..=after + 1800).contains(&at),
        "{at} not 30 min after {before}..{after}"
    );

    // Days count too, and `none` removes the expiry.
    let updated = cli(&state, &["key", "update", "temp", "--expires", "7d"]);
    assert!(updated.status.success(), "{}", stderr(&updated));
    assert!(expires_at().unwrap() >= after + 7 * 86_400);
    let cleared = cli(&state, &["key", "update", "temp", "--expires", "none"]);
    assert!(cleared.status.success(), "{}", stderr(&cleared));
    assert_eq!(expires_at(), None);
}

/// A provisioning script run four times at once: four `key create twin` against the running
/// daemon make one key; the other three say the name is taken.
#[test]
fn four_simultaneous_creates_of_one_name_make_one_active_key() {
    use crate::common::{Daemon, cli, stderr, stdout};
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let _daemon = Daemon::start(&state);
    let runs: Vec<std::thread::JoinHandle<std::process::Output>> = (0..4)
        .map(|_| {
            let state = state.clone();
            std::thread::spawn(move || cli(&state, &["key", "create", "twin"]))
        })
        .collect();
    let outs: Vec<std::process::Output> = runs.into_iter().map(|r| r.join().unwrap()).collect();
    let won = outs.iter().filter(|o| o.status.success()).count();
    assert_eq!(won, 1, "{:?}", outs.iter().map(stderr).collect::<Vec<_>>());
    for lost in outs.iter().filter(|o| !o.status.success()) {
        assert!(
            stderr(lost).contains("an active key named `twin` already exists"),
            "{}",
            stderr(lost)
        );
    }
    let listed: Value =
        serde_json::from_str(&stdout(&cli(&state, &["key", "list", "--json"]))).unwrap();
    let twins = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["name"] == "twin")
        .count();
    assert_eq!(twins, 1, "{listed}");
    // Born expired is refused, with the time it named.
    let late = cli(
        &state,
        &["key", "create", "late", "--expires", "2020-01-01"],
    );
    assert!(!late.status.success());
    assert!(stderr(&late).contains("has passed"), "{}", stderr(&late));
}

/// `--tiers` on the command line: set, shown, refused when it names Fast mode's alias, and
/// cleared.
#[test]
fn the_tiers_of_a_key_are_set_shown_and_cleared_on_the_command_line() {
    use crate::common::{assert_one_line_error, cli, stderr, stdout};
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let created = cli(
        &state,
        &["key", "create", "t", "--tiers", "default,priority"],
    );
    assert!(created.status.success(), "{}", stderr(&created));
    let show = stdout(&cli(&state, &["key", "show", "t"]));
    assert!(
        show.contains("service tiers    default, priority"),
        "{show}"
    );
    let fast = cli(&state, &["key", "update", "t", "--tiers", "fast"]);
    assert_one_line_error(&fast, &["fast", "priority"]);
    let cleared = cli(&state, &["key", "update", "t", "--clear-tiers"]);
    assert!(cleared.status.success(), "{}", stderr(&cleared));
    let show = stdout(&cli(&state, &["key", "show", "t"]));
    assert!(show.contains("service tiers    any"), "{show}");
}
