//! Notifications: each event reaches a local webhook once per incident, signed, retried while
//! the receiver is down, and never on a request's path.

use std::time::Duration;

use crate::common::gw::{Gw, body_plain, until};
use axum::http::Method;
use serde_json::Value;
use switchyard::config::Config;
use switchyard::dispatch::credits::Auto;
use switchyard::notify::deliver::hmac_sha256_hex;
use switchyard::notify::{NotifyTarget, TargetKind};
use switchyard::sim::SinkDelivery;
use switchyard::store::secrets::Secret;

const SECRET: &str = "hook-secret-for-tests";

fn hooked(c: &mut Config) {
    c.credits.auto = Auto::WhenDry;
    c.notify = vec![NotifyTarget {
        url: Some("{sim}/sink/hook".into()),
        secret: Some(Secret::new(SECRET)),
        backoff: Duration::from_millis(20),
        ..NotifyTarget::new(TargetKind::Webhook)
    }];
}

/// The delivered (200) webhook bodies of one event kind.
fn delivered(gw: &Gw, event: &str) -> Vec<(SinkDelivery, Value)> {
    gw.sim
        .sim
        .sink()
        .into_iter()
        .filter(|d| d.status == 200)
        .map(|d| {
            let v: Value = serde_json::from_str(&d.body).unwrap();
            (d, v)
        })
        .filter(|(_, v)| v["event"] == event)
        .collect()
}

async fn until_delivered(gw: &Gw, event: &str, n: usize) {
    until(&format!("{n} {event} notification(s)"), || {
        std::future::ready(delivered(gw, event).len() >= n)
    })
    .await;
}

#[tokio::test]
async fn each_event_reaches_the_webhook_once_per_incident_signed_and_retried() {
    let gw = Gw::start_with(2, hooked).await;
    let order = gw.rr_order();
    let (a, b) = (order[0].clone(), order[1].clone());

    // The pool runs dry: two requests refused, one message; the receiver is down for its first
    // two tries.
    gw.sim.sim.fail_sink(2);
    for id in [&a, &b] {
        assert!(gw.sim.sim.set_usage(id, 100.0, 30.0));
    }
    for _ in 0..2 {
        let sse = gw.stream(&body_plain("gpt-5.5", "dry", true), &[]).await;
        assert_eq!(sse.status, 429, "{}", sse.body);
    }
    until_delivered(&gw, "pool_exhausted", 1).await;
    let (hook, body) = delivered(&gw, "pool_exhausted").remove(0);
    assert_eq!(body["model"], "gpt-5.5");
    assert!(
        body["message"].as_str().unwrap().contains("gpt-5.5"),
        "{body}"
    );
    assert!(
        switchyard::base::clock::parse_rfc3339_ms(body["at"].as_str().unwrap()).is_some(),
        "{body}"
    );
    assert_eq!(
        hook.headers["x-switchyard-signature"],
        format!(
            "sha256={}",
            hmac_sha256_hex(SECRET.as_bytes(), hook.body.as_bytes())
        )
    );
    let refused = gw.sim.sim.sink().iter().filter(|d| d.status == 503).count();
    assert_eq!(refused, 2, "retried while the receiver was down");

    // A credit brings it back: the spend and the recovery, each told once.
    gw.sim
        .sim
        .grant_credits(&b, 1, Duration::from_secs(86_400))
        .unwrap();
    // Its usage poll shows the credit (the poller would at its interval).
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{}/probe", gw.ids[&b]),
        None,
    )
    .await;
    let sse = gw.stream(&body_plain("gpt-5.5", "back", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{}", sse.body);
    until_delivered(&gw, "credit_spent", 1).await;
    until_delivered(&gw, "pool_recovered", 1).await;
    let (_, spent) = delivered(&gw, "credit_spent").remove(0);
    assert_eq!(spent["account"], gw.account(&b).await["email"], "{spent}");
    assert_eq!(spent["outcome"], "reset");

    // A dead login: told once, and when it is back.
    assert!(gw.sim.sim.set_usage(&a, 0.0, 0.0));
    assert!(gw.sim.sim.revoke_tokens(&a));
    let _ = gw
        .admin()
        .await
        .account_action(&gw.ids[&a], switchyard_admin::wire::AccountAction::Refresh)
        .await;
    assert_eq!(gw.account(&a).await["state"], "needs_reauth");
    until_delivered(&gw, "account_needs_login", 1).await;
    let (_, dead) = delivered(&gw, "account_needs_login").remove(0);
    assert_eq!(dead["account"], gw.account(&a).await["email"]);
    let auth = gw.sim.sim.fresh_login(&a).unwrap();
    gw.admin_call(Method::POST, "/api/admin/accounts", Some(auth))
        .await;
    until_delivered(&gw, "account_recovered", 1).await;

    // A deactivated account.
    assert!(gw.sim.sim.set_deactivated(&b, true));
    for _ in 0..2 {
        let _ = gw.stream(&body_plain("gpt-5.5", "who", true), &[]).await;
    }
    until(&format!("{b} deactivated"), || {
        let gw = &gw;
        let b = b.clone();
        async move { gw.account(&b).await["state"] == "needs_reauth" }
    })
    .await;
    until_delivered(&gw, "account_deactivated", 1).await;

    // Nothing told twice.
    for event in [
        "pool_exhausted",
        "pool_recovered",
        "credit_spent",
        "account_needs_login",
        "account_recovered",
        "account_deactivated",
    ] {
        assert_eq!(delivered(&gw, event).len(), 1, "{event}");
    }
    assert!(
        gw.metrics_text()
            .await
            .contains("switchyard_notifications_total{target=\"webhook-1\",outcome=\"delivered\"}")
    );
}

/// A listener that takes connections and never answers (set by the one test that uses it).
static HANGING: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn hanging(c: &mut Config) {
    c.notify = vec![NotifyTarget {
        url: HANGING.get().cloned(),
        attempts: 1,
        ..NotifyTarget::new(TargetKind::Webhook)
    }];
}

#[tokio::test]
async fn a_receiver_that_never_answers_holds_up_no_request() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    HANGING.set(url).unwrap();
    let gw = Gw::start_with(2, hanging).await;
    for id in gw.rr_order() {
        assert!(gw.sim.sim.set_usage(&id, 100.0, 30.0));
    }
    let sse = gw.stream(&body_plain("gpt-5.5", "dry", true), &[]).await;
    assert_eq!(sse.status, 429);
    // The message is on its way and will not be answered.
    let (conn, _) = listener.accept().await.unwrap();
    for id in gw.rr_order() {
        assert!(gw.sim.sim.set_usage(&id, 0.0, 0.0));
    }
    gw.clear_cooldown_all().await;
    // Requests go on while the delivery hangs.
    for i in 0..3 {
        let sse = gw
            .stream(&body_plain("gpt-5.5", &format!("on {i}"), true), &[])
            .await;
        assert_eq!(sse.last().0, "response.completed");
    }
    assert!(
        !gw.metrics_text()
            .await
            .contains("switchyard_notifications_total{target=\"webhook-1\""),
        "the delivery has not ended"
    );
    drop(conn);
}

#[tokio::test]
async fn notify_test_reaches_each_kind_of_target_and_a_sealed_secret_signs() {
    let sim = crate::common::sim::start(1).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    // The secret sealed with the state directory's key, as the operator would put it.
    let sealed = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || {
            crate::common::cli_stdin(&dir, &["notify", "seal"], format!("{SECRET}\n").as_bytes())
        })
        .await
        .unwrap()
    };
    assert!(
        sealed.status.success(),
        "{}",
        crate::common::stderr(&sealed)
    );
    let sealed = crate::common::stdout(&sealed).trim().to_string();
    assert!(sealed.starts_with("sealed:"), "{sealed}");
    assert!(!sealed.contains(SECRET));
    let base = sim.url();
    let config = tmp.path().join("switchyard.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[notify]]
kind = "webhook"
url = "{base}/sink/hook"
secret = "{sealed}"

[[notify]]
name = "phone"
kind = "ntfy"
url = "{base}/sink/alerts"
token = "tk_abcdefghijklmnop"

[[notify]]
kind = "telegram"
bot_token = "123456:telegram-token-for-tests"
chat_id = "-1001"
api_base = "{base}/sink"
events = ["pool_exhausted"]
"#
        ),
    )
    .unwrap();
    let run = |args: Vec<&'static str>| {
        let (dir, config) = (dir.clone(), config.clone());
        tokio::task::spawn_blocking(move || {
            let mut all = vec!["--config", config.to_str().unwrap()];
            all.extend(args);
            crate::common::cli(&dir, &all)
        })
    };
    // `config check` masks the secrets.
    let checked = run(vec!["config", "check"]).await.unwrap();
    let shown = crate::common::stdout(&checked);
    assert!(
        checked.status.success(),
        "{}",
        crate::common::stderr(&checked)
    );
    assert!(
        !shown.contains("tk_abcdefghijklmnop") && !shown.contains("telegram-token"),
        "{shown}"
    );
    assert!(!shown.contains("sealed:"), "{shown}");

    let out = run(vec!["notify", "test"]).await.unwrap();
    let said = crate::common::stdout(&out);
    assert!(
        out.status.success(),
        "{said}{}",
        crate::common::stderr(&out)
    );
    for line in [
        "webhook-1 (webhook): delivered",
        "phone (ntfy): delivered",
        "telegram-3 (telegram): delivered",
    ] {
        assert!(said.contains(line), "{said}");
    }
    let got = sim.sim.sink();
    let hook = got.iter().find(|d| d.path == "/sink/hook").unwrap();
    assert_eq!(
        hook.headers["x-switchyard-signature"],
        format!(
            "sha256={}",
            hmac_sha256_hex(SECRET.as_bytes(), hook.body.as_bytes())
        )
    );
    assert_eq!(
        serde_json::from_str::<Value>(&hook.body).unwrap()["event"],
        "test"
    );
    let ntfy = got.iter().find(|d| d.path == "/sink/alerts").unwrap();
    assert_eq!(ntfy.headers["authorization"], "Bearer tk_abcdefghijklmnop");
    assert_eq!(ntfy.headers["title"], "Switchyard: test");
    assert!(ntfy.body.contains("A test message"));
    let tg = got
        .iter()
        .find(|d| d.path == "/sink/bot123456:telegram-token-for-tests/sendMessage")
        .unwrap();
    let tg: Value = serde_json::from_str(&tg.body).unwrap();
    assert_eq!(tg["chat_id"], "-1001");

    // One target by name; a receiver that is down fails the command.
    sim.sim.fail_sink(1);
    let out = run(vec!["notify", "test", "phone"]).await.unwrap();
    assert!(!out.status.success());
    assert!(crate::common::stdout(&out).contains("phone (ntfy): not delivered: answered 503"));
    let out = run(vec!["notify", "test", "pager"]).await.unwrap();
    assert!(crate::common::stderr(&out).contains("no notify target \"pager\""));
}

#[tokio::test]
async fn a_target_without_what_it_needs_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("switchyard.toml");
    std::fs::write(
        &config,
        "[[notify]]\nkind = \"telegram\"\nchat_id = \"1\"\n",
    )
    .unwrap();
    let dir = tmp.path().join("state");
    let out = tokio::task::spawn_blocking(move || {
        crate::common::cli(
            &dir,
            &["--config", config.to_str().unwrap(), "config", "check"],
        )
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let err = crate::common::stderr(&out);
    assert!(err.contains("notify") && err.contains("bot_token"), "{err}");
}

#[tokio::test]
async fn low_pool_headroom_reaches_the_webhook_with_its_figure() {
    let gw = Gw::start_with(2, hooked).await;
    for id in gw.rr_order() {
        assert!(gw.sim.sim.set_usage(&id, 96.0, 20.0));
    }
    // Each answer's headers carry the windows: the pool has 4 % left.
    for i in 0..2 {
        let sse = gw
            .stream(&body_plain("gpt-5.5", &format!("near {i}"), true), &[])
            .await;
        assert_eq!(sse.last().0, "response.completed");
    }
    until_delivered(&gw, "pool_headroom_low", 1).await;
    let (_, low) = delivered(&gw, "pool_headroom_low").remove(0);
    assert_eq!(low["headroom_percent"], 4.0, "{low}");
    assert!(low["message"].as_str().unwrap().contains("4%"), "{low}");
    // That it is told once per incident is `notify::tests::low_headroom_is_told_once_…`.
    assert_eq!(delivered(&gw, "pool_headroom_low").len(), 1);
}
