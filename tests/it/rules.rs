//! Operators' rules (`[[rules]]`): each field and action over HTTP (JSON and SSE) and the
//! WebSocket, their order, and a bad rule refused by `config check`.

use crate::common::gw::{Gw, body_plain};
use crate::common::{cli, stderr};
use axum::http::Method;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::config::Config;
use switchyard::sim::FaultKind;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn with_rules(c: &mut Config, toml_text: &str) {
    #[derive(serde::Deserialize)]
    struct Rules {
        rules: Vec<switchyard::fleet::rules::Rule>,
    }
    c.rules = toml::from_str::<Rules>(toml_text).unwrap().rules;
}

#[derive(Clone, Copy, Debug)]
enum Via {
    Json,
    Sse,
    Ws,
}

const ALL: [Via; 3] = [Via::Json, Via::Sse, Via::Ws];

/// One request over `via` without a session; returns (HTTP status or the error frame's,
/// the last event or the JSON answer).
async fn ask(gw: &Gw, via: Via, session: Option<&str>, model: &str) -> (u16, Value) {
    let mut b = match via {
        Via::Json => body_plain(model, "q", false),
        _ => body_plain(model, "q", true),
    };
    if let Some(s) = session {
        b["prompt_cache_key"] = json!(s);
    }
    match via {
        Via::Json => gw.json(&b).await,
        Via::Sse => {
            let sse = gw.stream(&b, &[]).await;
            let last = sse.events.last().map(|(_, v)| v.clone());
            (sse.status, last.unwrap_or_else(|| sse.json_body()))
        }
        Via::Ws => {
            let mut req = format!("ws://{}/v1/responses", gw.addr)
                .into_client_request()
                .unwrap();
            req.headers_mut()
                .insert("authorization", gw.auth().parse().unwrap());
            let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
            let mut frame = json!({"type": "response.create", "model": model, "store": false,
                "input": b["input"].clone()});
            if let Some(s) = session {
                frame["prompt_cache_key"] = json!(s);
            }
            ws.send(Message::Text(frame.to_string().into()))
                .await
                .unwrap();
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Text(t) = m {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    match v["type"].as_str() {
                        Some("response.completed" | "response.failed") => return (200, v),
                        Some("error") => return (v["status"].as_u64().unwrap_or(0) as u16, v),
                        _ => {}
                    }
                }
            }
            panic!("the socket closed before the turn ended")
        }
    }
}

fn completed(answer: &(u16, Value)) -> bool {
    answer.0 == 200
        && (answer.1["type"] == "response.completed" || answer.1["status"] == "completed")
}

/// Turns the backend served for an account (a WebSocket's handshake is not one).
fn turns(gw: &Gw, account: &str) -> usize {
    gw.sim
        .sim
        .requests(account)
        .iter()
        .filter(|r| r.method != "GET")
        .count()
}

fn first(gw: &Gw) -> (String, String) {
    let order = gw.rr_order();
    (order[0].clone(), order[1].clone())
}

fn overloaded_is_a_rate_limit(c: &mut Config) {
    with_rules(
        c,
        r#"
[[rules]]
name = "overload is a rate limit"
status = ["500-503"]
message_contains = ["currently OVERLOADED"]
class = "rate_limited"
cooldown = "7m"
"#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_class_and_cooldown_replace_the_builtin_verdict_on_every_transport() {
    for via in ALL {
        let gw = Gw::start_with(2, overloaded_is_a_rate_limit).await;
        let (a, b) = first(&gw);
        gw.fault(&a, FaultKind::ServerError { status: 503 }, Some(1));
        let answer = ask(&gw, via, None, "gpt-5.5").await;
        assert!(completed(&answer), "{via:?}: {answer:?}");
        let acct = gw.account(&a).await;
        assert_eq!(acct["state"], "cooling", "{via:?} {acct}");
        assert_eq!(acct["reason"], "rate_limited", "{via:?} {acct}");
        let left = acct["cooldown_remaining_s"].as_u64().unwrap();
        assert!(
            (400..=420).contains(&left),
            "{via:?}: 7 minutes, not a ladder step: {left}"
        );
        let rec = &gw.requests(1).await[0];
        assert_eq!(
            rec["attempts"][0]["rule"], "overload is a rate limit",
            "{rec}"
        );
        assert_eq!(rec["attempts"][0]["class"], "rate_limited");
        assert_eq!(rec["account"], b.as_str());
        assert!(rec["attempts"][1].get("rule").is_none(), "{rec}");
    }
}

fn pass_503_through(c: &mut Config) {
    with_rules(
        c,
        r#"
[[rules]]
name = "answer overload as it is"
code = "server_is_overloaded"
pass_through = true
"#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_answers_the_client_as_is_without_failover_or_effect() {
    for via in ALL {
        let gw = Gw::start_with(2, pass_503_through).await;
        let (a, b) = first(&gw);
        gw.fault(&a, FaultKind::ServerError { status: 503 }, Some(1));
        let (status, answer) = ask(&gw, via, None, "gpt-5.5").await;
        assert_eq!(status, 503, "{via:?}: {answer}");
        let text = answer.to_string();
        assert!(text.contains("server_is_overloaded"), "{via:?}: {text}");
        assert_eq!(gw.account(&a).await["state"], "ready", "{via:?}");
        assert_eq!(turns(&gw, &b), 0, "{via:?}: no failover");
        let rec = &gw.requests(1).await[0];
        assert_eq!(rec["attempts"].as_array().unwrap().len(), 1, "{rec}");
        assert_eq!(rec["attempts"][0]["rule"], "answer overload as it is");
    }
}

fn overload_avoids_the_session(c: &mut Config) {
    with_rules(
        c,
        r#"
[[rules]]
name = "session sheds overload"
code = "server_is_overloaded"
scope = "session"
cooldown = "10m"
"#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_session_keeps_that_session_away_and_leaves_the_account_alone() {
    for via in ALL {
        let gw = Gw::start_with(2, overload_avoids_the_session).await;
        let (a, b) = first(&gw);
        // The session's first request goes to A (round robin starts there).
        gw.fault(&a, FaultKind::ServerError { status: 503 }, Some(1));
        let answer = ask(&gw, via, Some("s-1"), "gpt-5.5").await;
        assert!(completed(&answer), "{via:?}: {answer:?}");
        assert_eq!(gw.account(&a).await["state"], "ready", "{via:?}");
        // B goes away: the session has nothing left, another session still has A.
        gw.admin_call(
            Method::POST,
            &format!("/api/admin/accounts/{}/disable", gw.ids[&b]),
            None,
        )
        .await;
        let (status, _) = ask(&gw, via, Some("s-1"), "gpt-5.5").await;
        assert_eq!(status, 503, "{via:?}");
        let rec = &gw.requests(1).await[0];
        assert!(
            rec["skipped"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["account"] == a.as_str() && s["reason"] == "policy_excluded"),
            "{via:?} {rec}"
        );
        assert!(
            completed(&ask(&gw, via, Some("s-2"), "gpt-5.5").await),
            "{via:?}"
        );
    }
}

fn overload_is_the_models(c: &mut Config) {
    with_rules(
        c,
        r#"
[[rules]]
name = "no channel for this model"
status = 503
model = "gpt-5.5"
scope = "model"
cooldown = "20m"
"#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_model_avoids_the_account_for_that_model_only() {
    for via in ALL {
        let gw = Gw::start_with(2, overload_is_the_models).await;
        let (a, _) = first(&gw);
        gw.fault(&a, FaultKind::ServerError { status: 503 }, Some(1));
        assert!(completed(&ask(&gw, via, None, "gpt-5.5").await), "{via:?}");
        let acct = gw.account(&a).await;
        assert_eq!(acct["state"], "ready", "{via:?} {acct}");
        assert_eq!(acct["unsupported_models"], json!(["gpt-5.5"]), "{via:?}");
        // Another model still goes to A; this one does not.
        let before = turns(&gw, &a);
        for _ in 0..2 {
            assert!(completed(&ask(&gw, via, None, "gpt-5.4").await), "{via:?}");
        }
        assert_eq!(
            turns(&gw, &a),
            before + 1,
            "{via:?}: round robin gives A one of two"
        );
        for _ in 0..2 {
            assert!(completed(&ask(&gw, via, None, "gpt-5.5").await), "{via:?}");
        }
        assert_eq!(turns(&gw, &a), before + 1, "{via:?}");
    }
}

fn ordered_and_narrow(c: &mut Config) {
    with_rules(
        c,
        r#"
[[rules]]
name = "forbidden over websocket"
status = 403
transport = "websocket"
class = "caller"

[[rules]]
name = "challenges are transient"
header = { "cf-mitigated" = "challenge" }
class = "transient"
cooldown = "2m"

[[rules]]
name = "never reached"
status = 403
class = "auth_dead"

[[rules]]
name = "other models"
model = "gpt-5.4*"
status = 200
class = "auth_dead"
"#,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_go_in_order_each_field_narrows_and_a_success_is_never_matched() {
    let gw = Gw::start_with(2, ordered_and_narrow).await;
    let (a, b) = first(&gw);
    // Over HTTP the first rule (WebSocket only) does not apply; the second does.
    gw.fault(&a, FaultKind::Cloudflare403, Some(1));
    assert!(completed(&ask(&gw, Via::Sse, None, "gpt-5.5").await));
    let acct = gw.account(&a).await;
    assert_eq!(
        (acct["state"].as_str(), acct["reason"].as_str()),
        (Some("cooling"), Some("transient")),
        "{acct}"
    );
    assert!((100..=120).contains(&acct["cooldown_remaining_s"].as_u64().unwrap()));
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["attempts"][0]["rule"], "challenges are transient");
    // Over the WebSocket the first rule applies: the refusal goes back, A stays ready.
    gw.clear_cooldown_all().await;
    let toggle = |acct: String, on: bool| {
        let gw = &gw;
        async move {
            let what = if on { "enable" } else { "disable" };
            gw.admin_call(
                Method::POST,
                &format!("/api/admin/accounts/{}/{what}", gw.ids[&acct]),
                None,
            )
            .await;
        }
    };
    toggle(b.clone(), false).await;
    gw.fault(
        &a,
        FaultKind::WsErrorFrame {
            status: 403,
            code: "forbidden".into(),
        },
        Some(1),
    );
    let (status, frame) = ask(&gw, Via::Ws, None, "gpt-5.5").await;
    assert_eq!(status, 403, "{frame} {}", gw.requests(1).await[0]);
    assert_eq!(gw.account(&a).await["state"], "ready");
    toggle(b.clone(), true).await;
    let rec = &gw.requests(1).await[0];
    assert_eq!(
        rec["attempts"][0]["rule"], "forbidden over websocket",
        "{rec}"
    );
    // A completed answer is never a rule's, even one for its status and model.
    for _ in 0..2 {
        assert!(completed(&ask(&gw, Via::Json, None, "gpt-5.4").await));
    }
    for acct in gw.accounts().await {
        assert_eq!(acct["state"], "ready", "{acct}");
    }
    assert!(
        gw.requests(2)
            .await
            .iter()
            .all(|r| r["attempts"][0].get("rule").is_none())
    );
}

#[test]
fn config_check_names_a_bad_rule_and_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    for (rule, says) in [
        (
            "[[rules]]\nname = \"r\"\nstatus = 429\nclass = \"sucess\"\n",
            "class `sucess`",
        ),
        ("[[rules]]\nname = \"r\"\nstatus = 429\n", "does nothing"),
        (
            "[[rules]]\nname = \"r\"\nstatus = 429\nclass = \"transient\"\n\n[[rules]]\nname = \"r\"\nstatus = 500\nclass = \"transient\"\n",
            "two rules are named `r`",
        ),
        (
            "[[rules]]\nname = \"r\"\nstatsu = 429\n",
            "unknown field `statsu`",
        ),
    ] {
        let cfg = tmp.path().join("bad.toml");
        std::fs::write(
            &cfg,
            format!("[server]\nlisten = \"127.0.0.1:8080\"\n\n{rule}"),
        )
        .unwrap();
        let out = cli(
            tmp.path(),
            &["--config", cfg.to_str().unwrap(), "config", "check"],
        );
        assert!(!out.status.success(), "{rule}");
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("bad.toml:"), "{err}");
        assert!(err.contains(says), "{says}: {err}");
    }
    let good = tmp.path().join("good.toml");
    std::fs::write(
        &good,
        "[[rules]]\nname = \"r\"\nstatus = [429, \"500-599\"]\nmessage_contains = \"busy\"\nclass = \"transient\"\ncooldown = \"1m\"\n",
    )
    .unwrap();
    let out = cli(
        tmp.path(),
        &["--config", good.to_str().unwrap(), "config", "check"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The report tells the whole truth about failures a rule passed through: each is an upstream
/// error of the account that produced it, with the rule's name, and failures the built-in
/// classification already judges get no rule suggested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_counts_passed_through_failures_under_their_account_and_rule() {
    let gw = Gw::start_with(2, pass_503_through).await;
    let (a, b) = first(&gw);
    // Every answer of both accounts a 503 for a while: each is passed through as it is.
    for acct in [&a, &b] {
        gw.fault(acct, FaultKind::ServerError { status: 503 }, Some(2));
    }
    for _ in 0..4 {
        assert_eq!(ask(&gw, Via::Json, None, "gpt-5.5").await.0, 503);
    }
    // A model the accounts lack, often: the built-in judges it (model_unsupported).
    for acct in [&a, &b] {
        gw.fault(acct, FaultKind::ModelUnsupported, Some(3));
    }
    for _ in 0..3 {
        assert_eq!(ask(&gw, Via::Json, None, "gpt-9-test").await.0, 404);
    }
    let dir = gw.dir.clone();
    let out = tokio::task::spawn_blocking(move || cli(&dir, &["report", "--format", "json"]))
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let w = r["windows"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|w| w["minutes"].as_u64())
        .unwrap();
    let passed: Vec<(String, u64)> = w["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|acc| {
            acc["failures"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["rule"] == "answer overload as it is" && f["status"] == 503)
                .map(move |f| {
                    (
                        acc["account"].as_str().unwrap().to_string(),
                        f["count"].as_u64().unwrap(),
                    )
                })
        })
        .collect();
    let total: u64 = passed.iter().map(|(_, n)| n).sum();
    assert_eq!(
        total, 4,
        "every passed-through failure, under its account: {passed:?} {w}"
    );
    assert!(w["upstream_errors"].as_u64().unwrap() >= 4, "{w}");
    assert!(
        r["suggestions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["kind"] != "add_rule"),
        "no rule for what a rule or the built-in already judges: {}",
        r["suggestions"]
    );
}
