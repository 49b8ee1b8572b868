//! The gateway tried as a hostile or careless client would: each test reproduces a way it once
//! broke its promise (a caller's mistake taken for an account's or a model's failure, a client
//! that holds resources, a storm of failures) and pins what must happen instead.

use crate::common;
use crate::common::gw::{Gw, body, body_plain};
use axum::http::Method;
use serde_json::Value;
use switchyard::sim::FaultKind;

/// Every account is ready, with no model marked.
async fn assert_pool_untouched(gw: &Gw) {
    for a in gw.accounts().await {
        assert_eq!(a["state"], "ready", "{a}");
        assert_eq!(a["unsupported_models"], serde_json::json!([]), "{a}");
    }
}

#[tokio::test]
async fn an_unsupported_parameter_is_the_callers_error_and_marks_no_model() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    for account in &order {
        gw.fault(
            account,
            FaultKind::UnsupportedParameter {
                param: "temperature".into(),
            },
            Some(1),
        );
    }
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "hello", true), &[])
        .await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "unsupported_parameter", "{v}");
    assert_eq!(v["error"]["param"], "temperature", "{v}");
    // Returned as is, from the first account: nothing moved to the second.
    assert_eq!(gw.served(&order[1]), 0);
    assert_pool_untouched(&gw).await;
    let records = gw.requests(1).await;
    assert_eq!(records[0]["outcome"], "caller_error");
    assert_eq!(records[0]["attempts"][0]["class"], "caller");

    // The next caller of the model is served.
    let sse = gw.stream(&body("gpt-5.5", "again", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_pool_untouched(&gw).await;
}

#[tokio::test]
async fn an_unsupported_model_is_marked_visibly_and_cleared_by_clear_cooldown() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.sim
        .sim
        .set_supported_models(&order[0], vec!["gpt-5.4".into()]);
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    let a = gw.account(&order[0]).await;
    assert_eq!(
        a["state"], "ready",
        "a model mark is not an account verdict"
    );
    assert_eq!(
        a["unsupported_models"],
        serde_json::json!(["gpt-5.5"]),
        "{a}"
    );

    let id = a["id"].as_str().unwrap().to_string();
    let cleared: Value = gw
        .admin_call(
            Method::POST,
            &format!("/api/admin/accounts/{id}/clear-cooldown"),
            None,
        )
        .await;
    assert_eq!(
        cleared["unsupported_models"],
        serde_json::json!([]),
        "{cleared}"
    );
    // The account may serve the model again: with the other one disabled, it does.
    gw.sim
        .sim
        .set_supported_models(&order[0], vec!["gpt-5.4".into(), "gpt-5.5".into()]);
    let other = gw.account(&order[1]).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{other}/disable"),
        None,
    )
    .await;
    let before = gw.served(&order[0]);
    let sse = gw.stream(&body("gpt-5.5", "again", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_eq!(gw.served(&order[0]), before + 1);
}

fn skipped(record: &Value) -> Vec<(String, String)> {
    record["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["account"].as_str().unwrap().to_string(),
                s["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn classes(record: &Value) -> Vec<String> {
    record["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["class"].as_str().unwrap().to_string())
        .collect()
}

/// A cyber-policy refusal, in either carrier, on the first account of a session.
async fn refused_once(fault: FaultKind) {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(&order[0], fault.clone(), Some(1));
    let session = [("session-id", "sess-cyber")];
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &session).await;
    assert_eq!(
        sse.last().0,
        "response.completed",
        "{fault:?}: {:?}",
        sse.kinds()
    );
    assert!(sse.text().contains(&order[1]), "{fault:?}: {}", sse.text());
    assert_pool_untouched(&gw).await;
    let record = &gw.requests(1).await[0];
    assert_eq!(classes(record), ["policy", "success"], "{fault:?}");

    // The session's next turn leaves the refusing account out; another session does not.
    gw.stream(&body("gpt-5.5", "next", true), &session).await;
    let record = &gw.requests(1).await[0];
    assert!(
        skipped(record).contains(&(order[0].clone(), "policy_excluded".into())),
        "{fault:?}: {record}"
    );
    gw.stream(&body("gpt-5.5", "other", true), &[("session-id", "sess-2")])
        .await;
    let record = &gw.requests(1).await[0];
    assert!(
        !skipped(record).iter().any(|(_, r)| r == "policy_excluded"),
        "{fault:?}: {record}"
    );
    assert_pool_untouched(&gw).await;
}

#[tokio::test]
async fn a_cyber_policy_400_excludes_the_account_for_the_session_and_cools_nothing() {
    refused_once(FaultKind::CyberPolicy).await;
}

#[tokio::test]
async fn a_cyber_policy_failure_event_excludes_the_account_for_the_session_and_cools_nothing() {
    refused_once(FaultKind::FailedEvent {
        code: "cyber_policy".into(),
    })
    .await;
}

#[tokio::test]
async fn a_policy_exclusion_is_its_keys_alone_not_the_same_session_id_under_another_key() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(&order[0], FaultKind::CyberPolicy, Some(1));
    let session = [("session-id", "sess-shared")];
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &session).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_eq!(classes(&gw.requests(1).await[0]), ["policy", "success"]);
    // Only the refusing account is left.
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{}/disable", order[1]),
        None,
    )
    .await;
    // The refused key's session has no account.
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "again", true), &session)
        .await;
    assert_eq!(resp.status(), 503);
    let record = &gw.requests(1).await[0];
    assert!(
        skipped(record).contains(&(order[0].clone(), "policy_excluded".into())),
        "{record}"
    );
    assert_eq!(gw.served(&order[0]), 1, "not asked again");
    // Another key with the same session id is served by that account.
    let (_, other) = gw.make_key("other", serde_json::json!({})).await;
    let resp = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", format!("Bearer {other}"))
        .header("session-id", "sess-shared")
        .json(&body("gpt-5.5", "mine", true))
        .send()
        .await
        .unwrap();
    let sse = common::gw::read_sse(resp).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert!(sse.text().contains(&order[0]), "{}", sse.text());
    let record = &gw.requests(1).await[0];
    assert_eq!(record["key"], "other", "{record}");
    assert_eq!(record["account"], order[0].as_str(), "{record}");
    assert!(
        !skipped(record).iter().any(|(_, r)| r == "policy_excluded"),
        "{record}"
    );
    let a = gw.account(&order[0]).await;
    assert_eq!(a["state"], "ready", "no cooling for the refusal: {a}");
}

#[tokio::test]
async fn when_every_account_refuses_the_client_gets_the_refusal_and_no_account_cools() {
    let gw = Gw::start(2).await;
    for a in gw.rr_order() {
        gw.fault(&a, FaultKind::CyberPolicy, Some(1));
    }
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "hello", true), &[])
        .await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "cyber_policy", "{v}");
    assert_pool_untouched(&gw).await;
    let record = &gw.requests(1).await[0];
    assert_eq!(classes(record), ["policy", "policy"]);
    assert_eq!(record["outcome"], "policy_refused");
}

#[tokio::test]
async fn a_content_policy_refusal_is_the_callers_and_moves_nowhere() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::FailedEvent {
            code: "invalid_prompt".into(),
        },
        Some(1),
    );
    let (status, v) = gw.json(&body("gpt-5.5", "hello", false)).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_prompt", "{v}");
    assert_eq!(gw.served(&order[1]), 0);
    assert_pool_untouched(&gw).await;
}

#[tokio::test]
async fn one_prompt_cools_at_most_one_account_for_an_unknown_failure() {
    let gw = Gw::start(3).await;
    for a in gw.rr_order() {
        gw.fault(
            &a,
            FaultKind::FailedEvent {
                code: "mystery_error".into(),
            },
            Some(1),
        );
    }
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "hello", true), &[])
        .await;
    assert_eq!(resp.status(), 503);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_available_account", "{v}");
    let states: Vec<String> = gw
        .accounts()
        .await
        .iter()
        .map(|a| a["state"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        states.iter().filter(|s| *s == "cooling").count(),
        1,
        "{states:?}"
    );
    let record = &gw.requests(1).await[0];
    assert_eq!(classes(record), ["transient", "transient", "transient"]);
}

#[tokio::test]
async fn accounts_with_equal_headroom_take_turns() {
    let gw = Gw::start(3).await;
    for i in 0..9 {
        let sse = gw
            .stream(&body_plain("gpt-5.5", &format!("turn {i}"), true), &[])
            .await;
        assert_eq!(sse.last().0, "response.completed");
    }
    let served: Vec<usize> = gw.rr_order().iter().map(|a| gw.served(a)).collect();
    assert_eq!(
        served,
        [3, 3, 3],
        "nine requests over three idle accounts at 0 %"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_failures_climb_the_ladder_once() {
    let gw = Gw::start_with(1, |c| c.scheduling.max_concurrency = 3).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(
        &a,
        FaultKind::SlowServerError {
            status: 502,
            ms: 300,
        },
        Some(3),
    );
    // Three requests in flight at once on the one account; each ends in a 502.
    let tasks: Vec<_> = (0..3)
        .map(|i| gw.spawn_stream(body_plain("gpt-5.5", &format!("storm {i}"), true)))
        .collect();
    for t in tasks {
        let sse = t.await.unwrap();
        assert_ne!(sse.status, 200, "{}", sse.body);
    }
    assert_eq!(
        gw.served(&a),
        3,
        "all three reached the account before it cooled"
    );
    let view = gw.account(&a).await;
    assert_eq!(view["state"], "cooling", "{view}");
    assert_eq!(view["level"], 1, "one incident, one step: {view}");
    assert!(
        view["cooldown_remaining_s"].as_u64().unwrap() <= 30,
        "the first step of the transient ladder: {view}"
    );
}

#[tokio::test]
async fn a_second_token_refusal_right_after_a_refresh_cools_the_account() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(&order[0], FaultKind::TokenExpired, Some(2));
    let sse = gw.stream(&body_plain("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert!(sse.text().contains(&order[1]));
    assert_eq!(gw.sim.sim.refresh_count(&order[0]), 1);
    let view = gw.account(&order[0]).await;
    assert_eq!(
        (view["state"].as_str(), view["reason"].as_str()),
        (Some("cooling"), Some("auth_expired")),
        "{view}"
    );
    // Later requests do not each refresh it again.
    for i in 0..3 {
        gw.stream(&body_plain("gpt-5.5", &format!("again {i}"), true), &[])
            .await;
    }
    assert_eq!(gw.sim.sim.refresh_count(&order[0]), 1);
}

#[tokio::test]
async fn the_first_output_deadline_does_not_cut_a_long_json_answer() {
    let gw = Gw::start_with(1, |c| {
        c.upstream.first_output_timeout = std::time::Duration::from_millis(300);
    })
    .await;
    let a = gw.rr_order()[0].clone();
    // The first delta comes at once; the whole answer takes well over the deadline.
    gw.fault(&a, FaultKind::SlowDeltas { ms: 60 }, Some(1));
    let (status, v) = gw
        .json(&body_plain("gpt-5.5", "a long answer", false))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(gw.account(&a).await["state"], "ready");
}

/// Three accounts, the first two slow to show anything; `switches` failovers allowed for it.
async fn slow_first_outputs(switches: u32) -> (Gw, Vec<String>) {
    let gw = Gw::start_with(3, if switches == 1 { fot_once } else { fot_twice }).await;
    let order = gw.rr_order();
    for a in &order[..2] {
        gw.fault(a, FaultKind::SlowFirstToken { ms: 5000 }, Some(1));
    }
    (gw, order)
}

fn fot_once(c: &mut switchyard::config::Config) {
    c.upstream.first_output_timeout = std::time::Duration::from_millis(300);
}

fn fot_twice(c: &mut switchyard::config::Config) {
    fot_once(c);
    c.upstream.first_output_switches = 2;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_switches_accounts_for_a_first_output_timeout_at_most_as_configured() {
    // The default: one switch, then the timeout is the answer.
    let (gw, order) = slow_first_outputs(1).await;
    let resp = gw
        .post_raw("/v1/responses", &body_plain("gpt-5.5", "q", true), &[])
        .await;
    assert_eq!(resp.status(), 504);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "first_output_timeout", "{v}");
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["outcome"], "first_output_timeout");
    assert_eq!(classes(rec), ["transient", "transient"], "{rec}");
    assert_eq!(gw.served(&order[2]), 0, "the third account was not tried");

    // Two switches allowed: the third account answers.
    let (gw, order) = slow_first_outputs(2).await;
    let sse = gw.stream(&body_plain("gpt-5.5", "q", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    let rec = &gw.requests(1).await[0];
    assert_eq!(classes(rec), ["transient", "transient", "success"], "{rec}");
    assert_eq!(rec["account"], order[2].as_str());
}

#[tokio::test]
async fn the_request_deadline_bounds_the_whole_failover_walk() {
    let gw = Gw::start_with(2, |c| {
        c.upstream.request_deadline = std::time::Duration::from_millis(800);
    })
    .await;
    // Each account fails slowly: together they would eat the client's whole budget.
    for a in gw.rr_order() {
        gw.fault(
            &a,
            FaultKind::SlowServerError {
                status: 502,
                ms: 600,
            },
            Some(1),
        );
    }
    let resp = gw
        .post_raw("/v1/responses", &body_plain("gpt-5.5", "hello", true), &[])
        .await;
    assert_eq!(resp.status(), 504);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_deadline_exceeded", "{v}");
    let record = &gw.requests(1).await[0];
    assert_eq!(record["outcome"], "deadline_exceeded");
    assert_eq!(record["terminal_source"], "synthetic", "{record}");
    assert_eq!(classes(record), ["transient", "abandoned"], "{record}");
    // Giving up on the second account says nothing about it.
    let order = gw.rr_order();
    let states: Vec<Value> = vec![
        gw.account(&order[0]).await["state"].clone(),
        gw.account(&order[1]).await["state"].clone(),
    ];
    assert_eq!(
        states.iter().filter(|s| **s == "cooling").count(),
        1,
        "{states:?}"
    );
}

#[tokio::test]
async fn a_compact_answer_that_never_ends_fails_within_the_header_timeout() {
    let gw = Gw::start_with(2, |c| {
        c.upstream.header_timeout = std::time::Duration::from_millis(300);
    })
    .await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::HangMidStream { after_deltas: 0 },
        Some(1),
    );
    let resp = gw
        .post_raw(
            "/v1/responses/compact",
            &body_plain("gpt-5.5", "compact me", false),
            &[],
        )
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "response.compaction", "{v}");
    assert_eq!(gw.served(&order[1]), 1, "answered by the second account");
    let record = &gw.requests(1).await[0];
    assert_eq!(classes(record), ["transient", "success"], "{record}");
}

/// More than the 16 MiB a compact answer may have.
const OVER_THE_CAP: FaultKind = FaultKind::LongAnswer { kib: 17 * 1024 };

async fn compact(gw: &Gw) -> reqwest::Response {
    gw.post_raw(
        "/v1/responses/compact",
        &body_plain("gpt-5.5", "compact me", false),
        &[],
    )
    .await
}

#[tokio::test]
async fn a_compact_answer_over_the_cap_fails_over_instead_of_arriving_cut() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(&order[0], OVER_THE_CAP, Some(1));
    let resp = compact(&gw).await;
    assert_eq!(resp.status(), 200);
    // The second account's whole answer, not a part of the first one's.
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "response.compaction", "{v}");
    assert!(v["output"][0]["encrypted_content"].as_str().unwrap().len() < 1024);
    assert_eq!(gw.served(&order[1]), 1, "answered by the second account");
    let record = &gw.requests(1).await[0];
    assert_eq!(classes(record), ["transient", "success"], "{record}");
    let failed = &record["attempts"][0];
    assert_eq!(failed["phase"], "pre_commit", "{record}");
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("exceeds 16777216 bytes"),
        "{record}"
    );
    assert_eq!(record["account"], order[1].as_str());
    assert_eq!(gw.account(&order[0]).await["state"], "cooling");
}

#[tokio::test]
async fn a_compact_answer_over_the_cap_on_the_only_account_is_an_error() {
    let gw = Gw::start(1).await;
    let account = gw.rr_order()[0].clone();
    gw.fault(&account, OVER_THE_CAP, Some(1));
    let resp = compact(&gw).await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_available_account", "{v}");
    let record = &gw.requests(1).await[0];
    assert_eq!(record["outcome"], "no_account", "{record}");
    assert_eq!(classes(record), ["transient"], "{record}");
    assert_eq!(record["terminal_source"], "synthetic", "{record}");
    let a = gw.account(&account).await;
    assert_eq!(
        (a["state"].as_str(), a["reason"].as_str()),
        (Some("cooling"), Some("transient"))
    );
}

/// One account cooled by a failure, then half-open on a manual clock.
async fn half_open_single() -> (Gw, String) {
    use std::sync::Arc;
    use switchyard::base::clock::{Clock, ManualClock};
    let clock = ManualClock::new(switchyard::base::clock::SystemClock.now_ms());
    let gw = Gw::start_opts(common::gw::GwOptions {
        accounts: 1,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::ServerError { status: 500 }, Some(1));
    gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
    assert_eq!(gw.account(&a).await["state"], "cooling");
    clock.advance(std::time::Duration::from_secs(31));
    assert_eq!(gw.account(&a).await["state"], "half_open");
    (gw, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_for_a_half_open_probe_and_are_served_at_its_first_output() {
    let (gw, a) = half_open_single().await;
    // The probe's answer is long; its first delta comes at once.
    gw.fault(&a, FaultKind::SlowDeltas { ms: 200 }, Some(1));
    let probe = gw.spawn_stream(body_plain("gpt-5.5", "probe", true));
    common::gw::until("the probe to reach the account", || async {
        gw.served(&a) == 2
    })
    .await;
    let sse = gw
        .stream(&body_plain("gpt-5.5", "meanwhile", true), &[])
        .await;
    assert_eq!(sse.status, 200, "{}", sse.body);
    assert_eq!(sse.last().0, "response.completed");
    assert!(
        !probe.is_finished(),
        "served while the probe's own answer still streams"
    );
    let probe = probe.await.unwrap();
    assert_eq!(probe.last().0, "response.completed");
    assert_eq!(gw.account(&a).await["state"], "ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_probe_answers_its_waiters_at_once_with_retry_after() {
    let (gw, a) = half_open_single().await;
    gw.fault(
        &a,
        FaultKind::SlowServerError {
            status: 502,
            ms: 300,
        },
        Some(1),
    );
    let probe = gw.spawn_stream(body_plain("gpt-5.5", "probe", true));
    common::gw::until("the probe to reach the account", || async {
        gw.served(&a) == 2
    })
    .await;
    let resp = gw
        .post_raw(
            "/v1/responses",
            &body_plain("gpt-5.5", "meanwhile", true),
            &[],
        )
        .await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_available_account", "{v}");
    // The probe's own record may land before or after the waiter's (their connections are
    // served on different threads): the waiter's is the one that queued.
    let records = gw.requests(2).await;
    let record = records
        .iter()
        .find(|r| !r["queue"].is_null())
        .unwrap_or_else(|| panic!("no record of the waiter: {records:?}"));
    assert_eq!(record["queue"]["outcome"], "withdrawn", "{record}");
    assert!(
        record["attempts"].as_array().is_some_and(Vec::is_empty),
        "{record}"
    );
    assert!(probe.await.unwrap().status >= 500);
}
