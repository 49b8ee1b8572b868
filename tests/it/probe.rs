//! Probe before bind: an account not known to be healthy — new, imported again, logged in
//! again, or back from a cooldown over 30 minutes — is proved in the background (its usage,
//! then one minimal request) before it takes requests. Until then it shows `probing`, requests
//! wait for the verdict instead of being its probe, and a failed probe is classified like any
//! failure.

use std::sync::Arc;
use std::time::Duration;

use crate::common::gw::{Gw, GwOptions, body_plain, until};
use axum::http::Method;
use serde_json::Value;
use switchyard::base::clock::{Clock, ManualClock};
use switchyard::sim::{FaultKind, RecordedRequest};

/// What the backend got for an account, in order: `(method path, the first input text)`.
fn seen(gw: &Gw, account: &str) -> Vec<(String, String)> {
    gw.sim
        .sim
        .all_requests()
        .into_iter()
        .filter(|r| r.account_id.as_deref() == Some(account))
        .map(|r: RecordedRequest| {
            let text = r.body["input"][0]["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string();
            (format!("{} {}", r.method, r.path), text)
        })
        .collect()
}

const USAGE: &str = "GET /backend-api/wham/usage";
/// Workspace routing, asked before an account's first use.
const ROUTING: &str = "GET /backend-api/wham/accounts/check";
const RESPONSES: &str = "POST /backend-api/codex/responses";

fn manual() -> ManualClock {
    ManualClock::new(switchyard::base::clock::SystemClock.now_ms())
}

async fn probe(gw: &Gw, account: &str) -> Value {
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{}/probe", gw.ids[account]),
        None,
    )
    .await
}

/// The operator logs the account in again and imports the new login.
async fn reimport(gw: &Gw, account: &str) -> Value {
    let auth = gw.sim.sim.fresh_login(account).unwrap();
    gw.admin_call(Method::POST, "/api/admin/accounts", Some(auth))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_account_is_proved_before_the_first_request_reaches_it() {
    let gw = Gw::start_opts(GwOptions {
        accounts: 1,
        probe_accounts: true,
        ..Default::default()
    })
    .await;
    let a = gw.rr_order()[0].clone();
    // Sent at once: it waits for the probe if the probe has not passed yet.
    let (status, answer) = gw.json(&body_plain("gpt-5.5", "first", false)).await;
    assert_eq!(status, 200, "{answer}");
    let s = seen(&gw, &a);
    let texts: Vec<(&str, &str)> = s.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    assert_eq!(
        texts,
        [
            (ROUTING, ""),
            (USAGE, ""),
            (RESPONSES, "ping"),
            (RESPONSES, "first")
        ],
        "routing and usage, then the minimal request, then the client's"
    );
    assert_eq!(gw.account(&a).await["state"], "ready");
    // The probe is not a client request: no record of it.
    assert_eq!(gw.requests(10).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_imported_again_is_probing_and_a_failed_probe_cools_it_like_any_failure() {
    let clock = manual();
    let gw = Gw::start_opts(GwOptions {
        accounts: 2,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let a = gw.rr_order()[0].clone();
    let b = gw.rr_order()[1].clone();
    gw.fault(&a, FaultKind::ServerError { status: 503 }, Some(1));
    let imported = reimport(&gw, &a).await;
    assert_eq!(imported["state"], "probing", "{imported}");
    until("the failed probe to cool it", || async {
        gw.account(&a).await["state"] == "cooling"
    })
    .await;
    let v = gw.account(&a).await;
    assert_eq!(v["reason"], "transient", "{v}");
    assert!(v["last_error"].as_str().unwrap().contains("503"), "{v}");
    // Meanwhile requests go to the other account.
    for i in 0..3 {
        let sse = gw
            .stream(&body_plain("gpt-5.5", &format!("q{i}"), true), &[])
            .await;
        assert_eq!(sse.last().0, "response.completed");
    }
    assert!(
        seen(&gw, &a)
            .iter()
            .all(|(_, t)| t.is_empty() || t == "ping"),
        "no client request reached it: {:?}",
        seen(&gw, &a)
    );
    assert!(gw.served(&b) >= 3);
    // Its cooldown over, it is still not known to be healthy: probed again, not half-open
    // (the poller may have proved it already).
    clock.advance(Duration::from_secs(31));
    let state = gw.account(&a).await["state"].clone();
    assert!(state == "probing" || state == "ready", "{state}");
    let proved = probe(&gw, &a).await;
    assert!(
        proved["state"] == "ready" || proved["state"] == "probing",
        "{proved}"
    );
    gw.until_proven(&a).await;
    let pings = seen(&gw, &a).iter().filter(|(_, t)| t == "ping").count();
    assert_eq!(pings, 2, "{:?}", seen(&gw, &a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_back_from_a_long_cooldown_is_proved_and_requests_wait_for_it() {
    let clock = manual();
    let gw = Gw::start_opts(GwOptions {
        accounts: 2,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let a = gw.rr_order()[0].clone();
    let b = gw.rr_order()[1].clone();
    // An hour's Retry-After: a long cooldown.
    gw.fault(
        &a,
        FaultKind::Burst429 {
            retry_after_secs: 3600,
        },
        Some(1),
    );
    let sse = gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(gw.account(&a).await["state"], "cooling");
    // Its proof, whoever starts it, takes a while: long enough to see a request wait for it.
    gw.fault(&a, FaultKind::SlowFirstToken { ms: 1500 }, Some(1));
    clock.advance(Duration::from_secs(3601));
    assert_eq!(gw.account(&a).await["state"], "probing");
    // Only A may serve now; a request waits for its proof rather than being it.
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{}/disable", gw.ids[&b]),
        None,
    )
    .await;
    let waiting = gw.spawn_stream(body_plain("gpt-5.5", "after", true));
    until("the request to wait", || async {
        gw.status().await["waiting"].as_u64() == Some(1)
    })
    .await;
    assert!(!seen(&gw, &a).iter().any(|(_, t)| t == "after"));
    probe(&gw, &a).await;
    let sse = waiting.await.unwrap();
    assert_eq!(sse.last().0, "response.completed", "{}", sse.body);
    let order: Vec<String> = seen(&gw, &a)
        .into_iter()
        .filter(|(p, _)| p == RESPONSES)
        .map(|(_, t)| t)
        .collect();
    assert_eq!(&order[order.len() - 2..], ["ping", "after"], "{order:?}");
    let record = &gw.requests(1).await[0];
    assert_eq!(record["queue"]["outcome"], "acquired", "{record}");
    assert!(
        record["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["account"] == a.as_str() && s["reason"] == "probing"),
        "{record}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_refused_as_a_dead_login_leaves_the_account_needing_one() {
    let gw = Gw::start(2).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::AccountDeactivated, Some(1));
    reimport(&gw, &a).await;
    until("the probe's verdict", || async {
        gw.account(&a).await["state"] == "needs_reauth"
    })
    .await;
    let sse = gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert!(!seen(&gw, &a).iter().any(|(_, t)| t == "x"));
}

/// An account's banked reset credits, from its usage: kept by the pool, shown by `account
/// list` and `/metrics`, and not forgotten when an answer's headers update its windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_polls_reset_credits_are_kept_and_shown() {
    let gw = Gw::start(2).await;
    let a = gw.rr_order()[0].clone();
    gw.sim
        .sim
        .grant_credits(&a, 2, Duration::from_secs(30 * 86_400))
        .unwrap();
    let probed = probe(&gw, &a).await;
    assert_eq!(probed["quota"]["reset_credits"], 2, "{probed}");
    assert!(
        probed["quota"]["reset_credit_expires_at"].is_string(),
        "{probed}"
    );
    let line = format!("switchyard_account_reset_credits{{account=\"{a}\"}} 2\n");
    assert!(gw.metrics_text().await.contains(&line));
    // A request's answer headers update the windows; the count stays.
    let sse = gw.stream(&body_plain("gpt-5.5", "hi", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(gw.account(&a).await["quota"]["reset_credits"], 2);
    let dir = gw.dir.clone();
    let out = tokio::task::spawn_blocking(move || crate::common::cli(&dir, &["account", "list"]))
        .await
        .unwrap();
    let listed = crate::common::stdout(&out);
    assert!(
        listed.contains(&format!(
            "{}: 2 rate-limit reset credits banked (the soonest expires 20",
            gw.ids[&a]
        )),
        "{listed}"
    );
}
