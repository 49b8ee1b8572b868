//! Scheduling, affinity, slots, queues and quota tracking, against the simulator.

use std::sync::Arc;
use std::time::Duration;

use crate::common::gw::{Gw, GwOptions, body, body_plain, read_sse, until};
use axum::http::Method;

use serde_json::{Value, json};
use switchyard::base::clock::{Clock, ManualClock, SystemClock};
use switchyard::sim::FaultKind;

async fn set(gw: &Gw, settings: Value) -> Value {
    gw.admin_call(Method::PUT, "/api/admin/settings", Some(settings))
        .await
}

#[tokio::test]
async fn round_robin_spreads_evenly() {
    let gw = Gw::start(3).await;
    assert_eq!(
        set(&gw, json!({"strategy": "round_robin"})).await["strategy"],
        "round_robin"
    );
    for i in 0..30 {
        let sse = gw
            .stream(&body_plain("gpt-5.5", &format!("q{i}"), true), &[])
            .await;
        assert_eq!(sse.last().0, "response.completed");
    }
    for a in gw.rr_order() {
        assert_eq!(gw.served(&a), 10, "{a}");
    }
}

#[tokio::test]
async fn quota_aware_prefers_headroom() {
    let gw = Gw::start(3).await;
    let order = gw.rr_order();
    for (a, used) in order.iter().zip([80.0, 10.0, 50.0]) {
        gw.sim.sim.set_usage(a, used, 5.0);
        // The usage probe is how the gateway learns it (the poller does the same, jittered).
        gw.admin_call(
            Method::POST,
            &format!("/api/admin/accounts/{a}/probe"),
            None,
        )
        .await;
    }
    for i in 0..6 {
        gw.stream(&body_plain("gpt-5.5", &format!("q{i}"), true), &[])
            .await;
    }
    assert_eq!(
        gw.served(&order[1]),
        6,
        "all to the account with the most headroom"
    );
    let rec = &gw.requests(1).await[0];
    let pool: Vec<&str> = rec["candidate_pool"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        pool,
        [order[1].as_str(), order[2].as_str(), order[0].as_str()],
        "ordered by headroom"
    );
}

#[tokio::test]
async fn quota_ceiling_skips_an_almost_exhausted_account_while_others_have_room() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    set(
        &gw,
        json!({"strategy": "round_robin", "quota_ceiling_percent": 90}),
    )
    .await;
    gw.sim.sim.set_usage(&order[0], 95.0, 10.0);
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{}/probe", order[0]),
        None,
    )
    .await;
    for i in 0..4 {
        gw.stream(&body_plain("gpt-5.5", &format!("q{i}"), true), &[])
            .await;
    }
    assert_eq!(gw.served(&order[0]), 0);
    let rec = &gw.requests(1).await[0];
    assert!(
        rec["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["account"] == order[0].as_str() && s["reason"] == "quota_ceiling"),
        "{rec}"
    );
}

#[tokio::test]
async fn session_sticks_to_account() {
    let gw = Gw::start(3).await;
    for i in 0..8 {
        let sse = gw
            .stream(
                &body_plain("gpt-5.5", &format!("turn {i}"), true),
                &[("session-id", "sess-a")],
            )
            .await;
        assert_eq!(sse.last().0, "response.completed");
    }
    let served: Vec<usize> = gw.rr_order().iter().map(|a| gw.served(a)).collect();
    assert_eq!(
        served.iter().filter(|n| **n > 0).count(),
        1,
        "one account served the session: {served:?}"
    );
    let recs = gw.requests(8).await;
    assert_eq!(recs.last().unwrap()["affinity"], "new_bind");
    assert!(recs[..7].iter().all(|r| r["affinity"] == "reused"));
    // The prompt cache follows the session.
    assert!(
        recs[0]["cached_tokens"].as_u64().unwrap() > 0,
        "{}",
        recs[0]
    );
}

#[tokio::test]
async fn draining_account_keeps_its_sessions_and_takes_no_new_ones() {
    let gw = Gw::start(2).await;
    let bound = [("session-id", "sess-drain")];
    let sse = gw.stream(&body_plain("gpt-5.5", "hi", true), &bound).await;
    assert_eq!(sse.last().0, "response.completed");
    let owner = gw.requests(1).await[0]["account"]
        .as_str()
        .unwrap()
        .to_string();
    let id = gw.ids[&owner].clone();
    let a = gw
        .admin_call(
            Method::POST,
            &format!("/api/admin/accounts/{id}/drain"),
            None,
        )
        .await;
    assert_eq!(a["draining"], true, "{a}");
    let before = gw.served(&owner);
    // The bound session stays; every new session goes elsewhere, with the reason recorded.
    for i in 0..4 {
        let sse = gw
            .stream(&body_plain("gpt-5.5", "again", true), &bound)
            .await;
        assert_eq!(sse.last().0, "response.completed");
        let fresh = format!("fresh-{i}");
        let sse = gw
            .stream(
                &body_plain("gpt-5.5", "new", true),
                &[("session-id", &fresh)],
            )
            .await;
        assert_eq!(sse.last().0, "response.completed");
        let rec = &gw.requests(1).await[0];
        assert_ne!(rec["account"], owner.as_str(), "{rec}");
        assert!(
            rec["skipped"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["account"] == owner.as_str() && s["reason"] == "draining"),
            "{rec}"
        );
    }
    assert_eq!(
        gw.served(&owner),
        before + 4,
        "only the bound session's turns"
    );
    let a = gw
        .admin_call(
            Method::POST,
            &format!("/api/admin/accounts/{id}/undrain"),
            None,
        )
        .await;
    assert_eq!(a["draining"], false, "{a}");
}

#[tokio::test]
async fn session_rebinds_when_account_cools_and_records_reason() {
    let gw = Gw::start(2).await;
    let s = [("session-id", "sess-b")];
    gw.stream(&body_plain("gpt-5.5", "one", true), &s).await;
    let bound = gw
        .rr_order()
        .into_iter()
        .find(|a| gw.served(a) == 1)
        .unwrap();
    gw.fault(
        &bound,
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        None,
    );
    let sse = gw.stream(&body_plain("gpt-5.5", "two", true), &s).await;
    assert_eq!(sse.last().0, "response.completed");
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["affinity"], "rebound(quota)", "{rec}");
    assert_eq!(gw.account(&bound).await["state"], "cooling");
    // The next turn finds its old account cooling and stays on the new one.
    gw.stream(&body_plain("gpt-5.5", "three", true), &s).await;
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["affinity"], "reused");
    assert_ne!(rec["account"], bound.as_str());
    // A new session that had been bound to a cooling account says so.
    gw.clear_cooldown_all().await;
    gw.stream(
        &body_plain("gpt-5.5", "x", true),
        &[("session-id", "sess-c")],
    )
    .await;
    let c_account = gw.requests(1).await[0]["account"]
        .as_str()
        .unwrap()
        .to_string();
    gw.fault(
        &c_account,
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        Some(1),
    );
    gw.stream(
        &body_plain("gpt-5.5", "y", true),
        &[("session-id", "sess-d")],
    )
    .await; // may hit it
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{c_account}/disable"),
        None,
    )
    .await;
    gw.stream(
        &body_plain("gpt-5.5", "z", true),
        &[("session-id", "sess-c")],
    )
    .await;
    assert_eq!(gw.requests(1).await[0]["affinity"], "rebound(disabled)");
}

#[tokio::test]
async fn previous_response_goes_to_owner_or_not_found() {
    let gw = Gw::start(2).await;
    set(&gw, json!({"strategy": "round_robin"})).await;
    let first = gw.stream(&body_plain("gpt-5.5", "one", true), &[]).await;
    let resp_id = first.events[0].1["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let owner = gw.requests(1).await[0]["account"]
        .as_str()
        .unwrap()
        .to_string();
    for _ in 0..3 {
        let mut b = body_plain("gpt-5.5", "continue", true);
        b["previous_response_id"] = json!(resp_id);
        let sse = gw.stream(&b, &[]).await;
        assert_eq!(sse.last().0, "response.completed");
        assert_eq!(
            gw.requests(1).await[0]["account"],
            owner.as_str(),
            "only the owner serves it"
        );
    }
    let mut unknown = body_plain("gpt-5.5", "continue", true);
    unknown["previous_response_id"] = json!("resp_unknown");
    let r = gw.post_raw("/v1/responses", &unknown, &[]).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "previous_response_not_found");
    // The owner goes away: the continuation cannot be served elsewhere.
    gw.admin_call(
        Method::POST,
        &format!("/api/admin/accounts/{owner}/disable"),
        None,
    )
    .await;
    let mut b = body_plain("gpt-5.5", "continue", true);
    b["previous_response_id"] = json!(resp_id);
    let r = gw.post_raw("/v1/responses", &b, &[]).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "previous_response_not_found"
    );
}

#[tokio::test]
async fn affinity_survives_restart() {
    let mut gw = Gw::start(3).await;
    let mut bound = Vec::new();
    for s in ["s1", "s2", "s3", "s4"] {
        gw.stream(&body_plain("gpt-5.5", "x", true), &[("session-id", s)])
            .await;
        bound.push(
            gw.requests(1).await[0]["account"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    gw.restart().await;
    for (s, account) in ["s1", "s2", "s3", "s4"].iter().zip(&bound) {
        gw.stream(&body_plain("gpt-5.5", "y", true), &[("session-id", s)])
            .await;
        let rec = &gw.requests(1).await[0];
        assert_eq!(rec["account"], account.as_str(), "{s}");
        assert_eq!(rec["affinity"], "reused");
    }
}

#[tokio::test]
async fn burst_429_halves_limit_and_success_regrows_it() {
    let clock = ManualClock::new(SystemClock.now_ms());
    let gw = Gw::start_opts(GwOptions {
        accounts: 1,
        clock: Arc::new(clock.clone()),
        configure: |c| c.scheduling.max_concurrency = 4,
        ..Default::default()
    })
    .await;
    let a = gw.rr_order()[0].clone();
    assert_eq!(gw.account(&a).await["limit"], 4);
    gw.fault(
        &a,
        FaultKind::Burst429 {
            retry_after_secs: 1,
        },
        Some(1),
    );
    let r = gw
        .post_raw("/v1/responses", &body_plain("gpt-5.5", "x", true), &[])
        .await;
    assert_eq!(r.status(), 503);
    assert_eq!(gw.account(&a).await["limit"], 2, "halved");
    clock.advance(Duration::from_secs(6));
    let mut seen = vec![2];
    for i in 0..12 {
        let sse = gw
            .stream(&body_plain("gpt-5.5", &format!("q{i}"), true), &[])
            .await;
        assert_eq!(sse.last().0, "response.completed");
        seen.push(gw.account(&a).await["limit"].as_u64().unwrap());
    }
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "grows monotonically: {seen:?}"
    );
    assert_eq!(*seen.last().unwrap(), 4, "back to the maximum: {seen:?}");
    assert!(seen.contains(&3));
}

#[tokio::test]
async fn full_pool_queues_then_serves() {
    let gw = Gw::start_with(1, |c| c.scheduling.max_concurrency = 1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::SlowFirstToken { ms: 600 }, Some(1));
    let holder = gw.spawn_stream(body_plain("gpt-5.5", "slow", true));
    until("the first request to hold the slot", || async {
        gw.account(&a).await["in_flight"] == 1
    })
    .await;
    let waiter = gw.stream(&body_plain("gpt-5.5", "queued", true), &[]).await;
    assert_eq!(waiter.last().0, "response.completed");
    assert_eq!(holder.await.unwrap().last().0, "response.completed");
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["queue"]["outcome"], "acquired", "{rec}");
    assert_eq!(rec["queue"]["queue"], "pool");
    assert!(rec["queue"]["wait_ms"].as_u64().unwrap() > 0);
    assert!(
        rec["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["reason"] == "full")
    );
    assert_eq!(gw.account(&a).await["in_flight"], 0);
}

#[tokio::test]
async fn queue_timeout_returns_503_with_retry_after() {
    let gw = Gw::start_with(1, |c| {
        c.scheduling.max_concurrency = 1;
        c.scheduling.queue_wait = Duration::from_millis(200);
    })
    .await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::SlowFirstToken { ms: 2000 }, Some(1));
    let holder = gw.spawn_stream(body_plain("gpt-5.5", "slow", true));
    until("the slot to be taken", || async {
        gw.account(&a).await["in_flight"] == 1
    })
    .await;
    let r = gw
        .post_raw("/v1/responses", &body_plain("gpt-5.5", "late", true), &[])
        .await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "pool_busy"
    );
    let rec = &gw.requests(1).await[0];
    assert_eq!(
        (rec["outcome"].as_str(), rec["queue"]["outcome"].as_str()),
        (Some("pool_busy"), Some("timeout"))
    );
    holder.await.unwrap();
}

#[tokio::test]
async fn client_leaving_queue_frees_its_place() {
    let gw = Gw::start_with(1, |c| {
        c.scheduling.max_concurrency = 1;
        c.scheduling.queue_max_waiting = 1;
    })
    .await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::SlowFirstToken { ms: 1500 }, Some(1));
    let holder = gw.spawn_stream(body_plain("gpt-5.5", "slow", true));
    until("the slot to be taken", || async {
        gw.account(&a).await["in_flight"] == 1
    })
    .await;
    // A second client queues, then hangs up.
    let leaver = gw.spawn_stream(body_plain("gpt-5.5", "leaver", true));
    until("the second client to wait", || async {
        gw.status().await["waiting"] == 1
    })
    .await;
    leaver.abort();
    until("the queue to empty", || async {
        gw.status().await["waiting"] == 0
    })
    .await;
    // Its place is free: a third client can wait (the queue holds one) and is served.
    let third = gw.stream(&body_plain("gpt-5.5", "third", true), &[]).await;
    assert_eq!(third.last().0, "response.completed");
    holder.await.unwrap();
    let recs = gw.requests(3).await;
    assert!(
        recs.iter().any(|r| r["queue"]["outcome"] == "client_left"),
        "{recs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_slot_leak_after_mixed_load() {
    let gw = Arc::new(
        Gw::start_with(3, |c| {
            c.scheduling.max_concurrency = 2;
            c.upstream.stream_idle_timeout = Duration::from_secs(5);
        })
        .await,
    );
    let order = gw.rr_order();
    // A mix that keeps every account usable (so the load keeps flowing): caller errors before
    // and inside the stream, slow answers that make requests queue, client hang-ups, and
    // plain successes.
    for a in &order {
        for kind in [
            FaultKind::ContextLength,
            FaultKind::SlowFirstToken { ms: 30 },
            FaultKind::FailedEvent {
                code: "context_length_exceeded".into(),
            },
            FaultKind::SlowFirstToken { ms: 30 },
        ] {
            gw.fault(a, kind, Some(25));
        }
    }
    let mut tasks = Vec::new();
    for w in 0..20 {
        let gw = Arc::clone(&gw);
        tasks.push(tokio::spawn(async move {
            for i in 0..50 {
                let b = body_plain("gpt-5.5", &format!("w{w} r{i}"), true);
                let resp = gw.post_raw("/v1/responses", &b, &[]).await;
                if i % 7 == 0 {
                    drop(resp); // the client goes away mid-answer
                } else {
                    read_sse(resp).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    until("every request to finish", || async {
        let s = gw.status().await;
        s["in_flight"] == 0 && s["waiting"] == 0
    })
    .await;
    for a in gw.accounts().await {
        assert_eq!(a["in_flight"], 0, "{a}");
        assert_eq!(a["waiting"], 0, "{a}");
    }
    let total: usize = order.iter().map(|a| gw.served(a)).sum();
    assert!(
        total >= 1000,
        "{total} upstream requests for 1,000 client requests"
    );
    let recs = gw.requests(1000).await;
    let outcomes: std::collections::BTreeSet<&str> = recs
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    for o in ["success", "caller_error", "client_cancelled"] {
        assert!(outcomes.contains(o), "no `{o}` among {outcomes:?}");
    }
    assert!(
        recs.iter().any(|r| r["queue"]["outcome"] == "acquired"),
        "some requests queued"
    );
}

#[tokio::test]
async fn quota_headers_update_account_windows() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.sim.sim.set_usage(&a, 42.0, 7.0);
    gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    let q = &gw.account(&a).await["quota"];
    assert_eq!(q["primary_used_percent"], 42.0);
    assert_eq!(q["secondary_used_percent"], 7.0);
    assert!(q["primary_reset_at"].as_str().unwrap().ends_with('Z'));
    assert!(q["secondary_reset_at"].is_string());
    assert_eq!(q["plan"], "plus");
}

#[tokio::test]
async fn usage_poll_updates_quota() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.sim.sim.set_usage(&a, 63.0, 21.0);
    let view = gw
        .admin_call(
            Method::POST,
            &format!("/api/admin/accounts/{a}/probe"),
            None,
        )
        .await;
    assert_eq!(view["quota"]["primary_used_percent"], 63.0);
    assert_eq!(view["quota"]["secondary_used_percent"], 21.0);
    let usage_calls = gw
        .sim
        .sim
        .all_requests()
        .iter()
        .filter(|r| r.path.ends_with("/wham/usage"))
        .count();
    assert!(usage_calls >= 1);
}

#[tokio::test]
async fn strategy_switch_applies_without_restart() {
    let gw = Gw::start(3).await;
    let order = gw.rr_order();
    gw.admin_call(
        Method::PUT,
        &format!("/api/admin/accounts/{}", order[2]),
        Some(json!({"priority": -5})),
    )
    .await;
    let s = set(&gw, json!({"strategy": "fill_first"})).await;
    assert_eq!(s["strategy"], "fill_first");
    for i in 0..4 {
        gw.stream(&body_plain("gpt-5.5", &format!("q{i}"), true), &[])
            .await;
    }
    assert_eq!(
        gw.served(&order[2]),
        4,
        "the top-priority account takes everything"
    );
    // Priority comes first under every strategy: equal again, round robin spreads.
    gw.admin_call(
        Method::PUT,
        &format!("/api/admin/accounts/{}", order[2]),
        Some(json!({"priority": 0})),
    )
    .await;
    set(&gw, json!({"strategy": "round_robin"})).await;
    for i in 0..6 {
        gw.stream(&body_plain("gpt-5.5", &format!("r{i}"), true), &[])
            .await;
    }
    assert_eq!(gw.served(&order[0]), 2);
    assert_eq!(gw.served(&order[1]), 2);
    assert_eq!(gw.served(&order[2]), 6);
    assert_eq!(gw.status().await["strategy"], "round_robin");
    // Bad settings are refused and change nothing.
    let bad = gw
        .admin()
        .await
        .call::<Value>(
            Method::PUT,
            "/api/admin/settings",
            Some(br#"{"strategy":"random"}"#.to_vec()),
        )
        .await;
    assert!(bad.is_err());
    assert_eq!(gw.status().await["strategy"], "round_robin");
}

#[tokio::test]
async fn metrics_expose_requests_attempts_queues_and_accounts() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(&order[0], FaultKind::ServerError { status: 500 }, Some(1));
    gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
    let text = gw.metrics_text().await;
    for needle in [
        "switchyard_requests_total{outcome=\"success\"} 1",
        "switchyard_attempts_total{class=\"transient\"} 1",
        "switchyard_failovers_total 1",
        "switchyard_account_state{account=",
        "switchyard_account_limit{account=",
        "switchyard_queue_waiting{queue=\"pool\"} 0",
        "switchyard_upstream_headers_seconds_bucket",
        "switchyard_affinity_decisions_total{decision=\"none\"} 1",
        "switchyard_telemetry_dropped_total 0",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
}

/// A lower priority number goes first under every strategy; among equal priorities the strategy
/// decides (round robin rotates again once the priorities are equal).
#[tokio::test]
async fn a_preferred_account_carries_the_load_under_every_strategy() {
    let gw = Gw::start(3).await;
    let accounts: Vec<String> = gw.rr_order();
    let stable = accounts[2].clone();
    let id = gw.ids[&stable].clone();
    let changed = gw
        .admin_call(
            Method::PUT,
            &format!("/api/admin/accounts/{id}"),
            Some(json!({"priority": -1, "label": "stable"})),
        )
        .await;
    assert_eq!(
        (changed["priority"].as_i64(), changed["label"].as_str()),
        (Some(-1), Some("stable"))
    );
    for strategy in ["quota_aware", "round_robin", "least_loaded", "fill_first"] {
        set(&gw, json!({"strategy": strategy})).await;
        let before: Vec<usize> = accounts.iter().map(|a| gw.served(a)).collect();
        for i in 0..4 {
            let sse = gw
                .stream(
                    &body_plain("gpt-5.5", &format!("{strategy} {i}"), true),
                    &[],
                )
                .await;
            assert_eq!(sse.last().0, "response.completed");
        }
        let after: Vec<usize> = accounts.iter().map(|a| gw.served(a)).collect();
        let took: Vec<usize> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(took, [0, 0, 4], "{strategy}");
    }
    // Equal again: round robin spreads.
    gw.admin_call(
        Method::PUT,
        &format!("/api/admin/accounts/{id}"),
        Some(json!({"priority": 0})),
    )
    .await;
    set(&gw, json!({"strategy": "round_robin"})).await;
    let before: Vec<usize> = accounts.iter().map(|a| gw.served(a)).collect();
    for i in 0..6 {
        gw.stream(&body_plain("gpt-5.5", &format!("rr {i}"), true), &[])
            .await;
    }
    let took: Vec<usize> = accounts
        .iter()
        .zip(&before)
        .map(|(a, b)| gw.served(a) - b)
        .collect();
    assert_eq!(took, [2, 2, 2]);
    // A bad label is refused, naming it.
    let bad = gw
        .admin()
        .await
        .call::<Value>(
            Method::PUT,
            &format!("/api/admin/accounts/{id}"),
            Some(json!({"label": ""}).to_string().into_bytes()),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("label"), "{bad}");
}

/// `/metrics` has the gateway's own time per request: one observation per request, each well
/// under its total (the upstream's time is left out).
#[tokio::test]
async fn metrics_show_the_gateways_own_overhead_per_request() {
    let gw = Gw::start(2).await;
    for i in 0..3 {
        let sse = gw
            .stream(&body_plain("gpt-5.5", &format!("o {i}"), true), &[])
            .await;
        assert_eq!(sse.last().0, "response.completed");
    }
    let m = gw.metrics_text().await;
    let value = |name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{m}"))
    };
    assert_eq!(value("switchyard_request_overhead_seconds_count "), 3.0);
    let overhead = value("switchyard_request_overhead_seconds_sum ");
    assert!(overhead >= 0.0);
    let records = gw.requests(3).await;
    let total_ms: u64 = records
        .iter()
        .map(|r| r["duration_ms"].as_u64().unwrap())
        .sum();
    let attempts_ms: u64 = records
        .iter()
        .flat_map(|r| r["attempts"].as_array().unwrap().clone())
        .map(|a| a["ms"].as_u64().unwrap())
        .sum();
    // The overhead is what the attempts do not cover (to the record's millisecond rounding).
    assert!(
        overhead * 1000.0 <= (total_ms.saturating_sub(attempts_ms) + 3) as f64,
        "overhead {overhead}s, totals {total_ms} ms, attempts {attempts_ms} ms"
    );
}
