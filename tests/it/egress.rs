//! Per-account egress proxies: an account's HTTP, SSE and WebSocket traffic, its token refresh
//! and its usage polls go through its proxy (a CONNECT proxy, a SOCKS5 proxy, on loopback)
//! while other accounts go straight; a dead proxy is a transient failure that fails over.

use std::sync::OnceLock;

use crate::common::gw::{Gw, body};
use crate::common::proxies::{Proxy, dead_proxy};
use crate::common::{cli, cli_stdin, stderr, stdout, write_auth};
use axum::http::Method;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::config::Config;
use switchyard::sim::RecordedRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const A: &str = "sim-acct-1";
const B: &str = "sim-acct-2";

async fn set_proxy(gw: &Gw, account: &str, proxy: Value) -> Value {
    gw.admin_call(
        Method::PUT,
        &format!("/api/admin/accounts/{}", gw.ids[account]),
        Some(json!({ "proxy": proxy })),
    )
    .await
}

async fn set_enabled(gw: &Gw, account: &str, on: bool) {
    let what = if on { "enable" } else { "disable" };
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{}/{what}", gw.ids[account]),
        None,
    )
    .await;
}

/// One WebSocket turn through the gateway; returns its last event.
async fn ws_turn(gw: &Gw) -> Value {
    let mut req = format!("ws://{}/v1/responses", gw.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", gw.auth().parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let frame = json!({
        "type": "response.create",
        "model": "gpt-5.5",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "store": false,
        "stream": true,
    });
    ws.send(Message::Text(frame.to_string().into()))
        .await
        .unwrap();
    while let Some(Ok(msg)) = ws.next().await {
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            let kind = v["type"].as_str().unwrap_or("").to_string();
            if matches!(
                kind.as_str(),
                "response.completed" | "response.failed" | "error"
            ) {
                return v;
            }
        }
    }
    panic!("the socket closed before the turn ended");
}

/// What the backend received for an account: responses (HTTP and WebSocket) and usage polls.
fn backend_requests(gw: &Gw, account: &str) -> Vec<RecordedRequest> {
    gw.sim
        .sim
        .all_requests()
        .into_iter()
        .filter(|r| r.account_id.as_deref() == Some(account))
        .collect()
}

fn token_requests(gw: &Gw) -> Vec<RecordedRequest> {
    gw.sim
        .sim
        .all_requests()
        .into_iter()
        .filter(|r| r.path == "/oauth/token")
        .collect()
}

/// Drives every kind of upstream traffic of account A (B disabled): a JSON answer, an SSE
/// stream, a WebSocket turn, a token refresh and a usage poll.
async fn all_traffic_of_a(gw: &Gw) {
    set_enabled(gw, B, false).await;
    let (status, answer) = gw.json(&body("gpt-5.5", "json", false)).await;
    assert_eq!(status, 200, "{answer}");
    let sse = gw.stream(&body("gpt-5.5", "sse", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_eq!(ws_turn(gw).await["type"], "response.completed");
    assert_eq!(gw.requests(1).await[0]["transport"], "ws_connected");
    let id = &gw.ids[A];
    let refreshed = gw
        .admin_call(
            Method::POST,
            &format!("/api/admin/accounts/{id}/refresh"),
            None,
        )
        .await;
    assert_eq!(refreshed["state"], "ready", "{refreshed}");
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{id}/probe"),
        None,
    )
    .await;
    set_enabled(gw, B, true).await;
}

fn assert_all_carried(gw: &Gw, proxy: &Proxy, tokens_before: usize) {
    let of_a = backend_requests(gw, A);
    let paths: Vec<&str> = of_a.iter().map(|r| r.path.as_str()).collect();
    assert!(
        paths.iter().filter(|p| p.ends_with("/responses")).count() >= 3
            && paths.iter().any(|p| p.ends_with("/wham/usage")),
        "responses over HTTP and WebSocket, and a usage poll: {paths:?}"
    );
    for r in &of_a {
        assert!(
            proxy.carried(&r.peer),
            "{} {} came from {}, not through the proxy",
            r.method,
            r.path,
            r.peer
        );
    }
    let tokens = token_requests(gw);
    assert!(
        tokens.len() > tokens_before,
        "the refresh reached the token endpoint"
    );
    for r in &tokens[tokens_before..] {
        assert!(proxy.carried(&r.peer), "the refresh went straight out");
    }
    assert_eq!(proxy.refused(), 0, "every request was a tunnel");
    let sim = gw.sim.base_url();
    let origin = sim
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    assert!(
        proxy.targets().iter().all(|t| *t == origin),
        "{:?} vs {origin}",
        proxy.targets()
    );
}

#[tokio::test]
async fn an_accounts_traffic_goes_through_its_connect_proxy_while_the_others_go_straight() {
    let gw = Gw::start(2).await;
    let proxy = Proxy::connect(Some(("alice", "s3cret"))).await;
    let a = set_proxy(&gw, A, json!(proxy.url("http"))).await;
    assert_eq!(
        a["proxy"],
        format!("http://alice:***@{}", proxy.addr),
        "the password is never shown"
    );
    let tokens_before = token_requests(&gw).len();
    all_traffic_of_a(&gw).await;
    assert!(proxy.tunnels() >= 2, "HTTP and the WebSocket each tunnel");
    assert_all_carried(&gw, &proxy, tokens_before);

    // B goes straight out, and A again once its proxy is removed.
    set_enabled(&gw, A, false).await;
    let sse = gw.stream(&body("gpt-5.5", "b", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    let of_b = backend_requests(&gw, B);
    assert!(!of_b.is_empty() && of_b.iter().all(|r| !proxy.carried(&r.peer)));
    set_enabled(&gw, A, true).await;
    let cleared = set_proxy(&gw, A, Value::Null).await;
    assert!(cleared.get("proxy").is_none_or(Value::is_null), "{cleared}");
    let tunnels = proxy.tunnels();
    set_enabled(&gw, B, false).await;
    assert_eq!(ws_turn(&gw).await["type"], "response.completed");
    assert_eq!(proxy.tunnels(), tunnels, "no tunnel once the proxy is gone");
}

#[tokio::test]
async fn an_accounts_traffic_goes_through_its_socks5_proxy_with_a_password() {
    let gw = Gw::start(2).await;
    let proxy = Proxy::socks5(Some(("bob", "pw"))).await;
    set_proxy(&gw, A, json!(proxy.url("socks5h"))).await;
    let tokens_before = token_requests(&gw).len();
    all_traffic_of_a(&gw).await;
    assert_all_carried(&gw, &proxy, tokens_before);

    // socks5:// resolves the name here; the proxy still carries everything.
    let local = Proxy::socks5(None).await;
    set_proxy(&gw, A, json!(local.url("socks5"))).await;
    let tokens_before = token_requests(&gw).len();
    let before = backend_requests(&gw, A).len();
    all_traffic_of_a(&gw).await;
    let newer = &backend_requests(&gw, A)[before..];
    assert!(newer.len() >= 4 && newer.iter().all(|r| local.carried(&r.peer)));
    assert!(
        token_requests(&gw)[tokens_before..]
            .iter()
            .all(|r| local.carried(&r.peer))
    );
}

#[tokio::test]
async fn a_dead_proxy_is_a_transient_failure_of_its_account_and_the_request_fails_over() {
    let gw = Gw::start(2).await;
    // Without a session, round robin starts with the first of this order.
    let order = gw.rr_order();
    let (first, other) = (order[0].clone(), order[1].clone());
    set_proxy(&gw, &first, json!(dead_proxy("http"))).await;
    let mut b = body("gpt-5.5", "over", true);
    b.as_object_mut().unwrap().remove("prompt_cache_key");
    let sse = gw.stream(&b, &[]).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.last().0, "response.completed");
    let dead = gw.account(&first).await;
    assert_eq!(dead["state"], "cooling", "{dead}");
    assert_eq!(dead["reason"], "transient", "{dead}");
    assert!(
        dead["last_error"]
            .as_str()
            .unwrap()
            .contains("proxy unreachable"),
        "{dead}"
    );
    let rec = &gw.requests(1).await[0];
    let attempts = rec["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{rec}");
    assert_eq!(attempts[0]["account"], first.as_str());
    assert_eq!(attempts[0]["class"], "transient");
    assert_eq!(attempts[0]["phase"], "connect");
    assert_eq!(rec["account"], other.as_str());
    assert_eq!(gw.served(&first), 0, "nothing reached the backend for it");
}

static GLOBAL_PROXY: OnceLock<String> = OnceLock::new();

fn global_proxy(c: &mut Config) {
    c.upstream.proxy = GLOBAL_PROXY.get().cloned();
}

#[tokio::test]
async fn the_global_proxy_carries_accounts_without_their_own() {
    let global = Proxy::connect(None).await;
    GLOBAL_PROXY.set(global.url("http")).unwrap();
    let gw = Gw::start_with(2, global_proxy).await;
    let own = Proxy::connect(None).await;
    set_proxy(&gw, A, json!(own.url("http"))).await;
    for (off, on) in [(B, A), (A, B)] {
        set_enabled(&gw, off, false).await;
        assert_eq!(ws_turn(&gw).await["type"], "response.completed");
        let sse = gw.stream(&body("gpt-5.5", on, true), &[]).await;
        assert_eq!(sse.last().0, "response.completed");
        set_enabled(&gw, off, true).await;
    }
    let of = |acct: &str| backend_requests(&gw, acct);
    assert!(of(A).iter().all(|r| own.carried(&r.peer)), "A's own proxy");
    assert!(
        of(B).iter().all(|r| global.carried(&r.peer)),
        "B goes out through [upstream] proxy"
    );
    assert!(!of(B).is_empty() && !of(A).is_empty());
}

#[test]
fn account_set_stores_the_proxy_sealed_and_refuses_a_bad_one() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let file = write_auth(tmp.path(), 1, "p");
    let import = cli(
        &state,
        &["account", "import", "--no-refresh", file.to_str().unwrap()],
    );
    assert!(import.status.success(), "{}", stderr(&import));
    let set = cli(
        &state,
        &[
            "account",
            "set",
            "acc-0001",
            "--proxy",
            "socks5h://carol:hunter22@127.0.0.1:1080",
        ],
    );
    assert!(set.status.success(), "{}", stderr(&set));
    assert!(
        stdout(&set).contains("proxy socks5h://carol:***@127.0.0.1:1080"),
        "{}",
        stdout(&set)
    );
    let list = stdout(&cli(&state, &["account", "list"]));
    assert!(
        list.contains("goes out through socks5h://carol:***@127.0.0.1:1080"),
        "{list}"
    );
    for entry in std::fs::read_dir(&state).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(
            !bytes.windows(8).any(|w| w == b"hunter22"),
            "the proxy's password is sealed"
        );
    }
    for bad in ["ftp://x:1", "socks4://127.0.0.1:1080", "http://h:1/path"] {
        let out = cli(&state, &["account", "set", "acc-0001", "--proxy", bad]);
        assert!(!out.status.success(), "{bad}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("invalid value '{bad}' for '--proxy")),
            "{err}"
        );
    }
    // From a file or stdin, off the command line; on it, a password is warned about.
    assert!(stderr(&set).contains("--proxy-file"), "{}", stderr(&set));
    let file = tmp.path().join("proxy.url");
    std::fs::write(&file, "http://dave:sesame99@127.0.0.1:3128\n").unwrap();
    let set_from_file = || {
        cli(
            &state,
            &[
                "account",
                "set",
                "acc-0001",
                "--proxy-file",
                file.to_str().unwrap(),
            ],
        )
    };
    let from_file = set_from_file();
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    assert!(
        stdout(&from_file).contains("proxy http://dave:***@127.0.0.1:3128"),
        "{}",
        stdout(&from_file)
    );
    assert!(
        !stderr(&from_file).contains("warning"),
        "{}",
        stderr(&from_file)
    );
    let from_stdin = cli_stdin(
        &state,
        &["account", "set", "acc-0001", "--proxy-file", "-"],
        b"socks5://erin:open5esame@127.0.0.1:1081\n",
    );
    assert!(from_stdin.status.success(), "{}", stderr(&from_stdin));
    assert!(
        stdout(&from_stdin).contains("proxy socks5://erin:***@127.0.0.1:1081"),
        "{}",
        stdout(&from_stdin)
    );
    std::fs::write(&file, "ftp://x:1\n").unwrap();
    let bad = set_from_file();
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("--proxy-file"), "{}", stderr(&bad));
    std::fs::write(&file, "\n").unwrap();
    let empty = cli(
        &state,
        &[
            "account",
            "set",
            "acc-0001",
            "--proxy-file",
            file.to_str().unwrap(),
        ],
    );
    assert!(stderr(&empty).contains("is empty"), "{}", stderr(&empty));
    let cleared = cli(&state, &["account", "set", "acc-0001", "--proxy", "none"]);
    assert!(cleared.status.success(), "{}", stderr(&cleared));
    assert!(!stdout(&cli(&state, &["account", "list"])).contains("goes out through"));
}
