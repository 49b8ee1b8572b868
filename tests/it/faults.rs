//! Every simulated fault through the gateway: what the client receives, where the request
//! went, and the account state afterwards.

use std::time::Duration;

use crate::common;
use crate::common::gw::{Gw, body, body_plain};
use serde_json::{Value, json};
use switchyard::sim::FaultKind;

/// Injects `kind` once on the first account in rotation, sends one streamed turn, and checks
/// it completed on the second account. Returns the first account's admin view.
async fn fails_over(gw: &Gw, kind: FaultKind) -> Value {
    let order = gw.rr_order();
    gw.fault(&order[0], kind.clone(), Some(1));
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200, "{kind:?}: {}", sse.body);
    assert_eq!(
        sse.count("response.created"),
        1,
        "{kind:?}: {:?}",
        sse.kinds()
    );
    assert_eq!(
        sse.last().0,
        "response.completed",
        "{kind:?}: {:?}",
        sse.kinds()
    );
    assert!(
        sse.text().contains(&order[1]),
        "{kind:?}: served by {}",
        sse.text()
    );
    gw.account(&order[0]).await
}

#[tokio::test]
async fn burst_429_fails_over_and_cools_briefly_honouring_retry_after() {
    let gw = Gw::start(2).await;
    let a = fails_over(
        &gw,
        FaultKind::Burst429 {
            retry_after_secs: 20,
        },
    )
    .await;
    assert_eq!(
        (a["state"].as_str(), a["reason"].as_str()),
        (Some("cooling"), Some("rate_limited"))
    );
    let left = a["cooldown_remaining_s"].as_u64().unwrap();
    assert!((15..=20).contains(&left), "Retry-After honoured: {left}");
}

#[tokio::test]
async fn server_errors_fail_over_and_start_the_transient_ladder() {
    for status in [500, 503] {
        let gw = Gw::start(2).await;
        let a = fails_over(&gw, FaultKind::ServerError { status }).await;
        assert_eq!(
            (a["state"].as_str(), a["reason"].as_str()),
            (Some("cooling"), Some("transient"))
        );
        assert!(a["cooldown_remaining_s"].as_u64().unwrap() <= 30);
        assert_eq!(a["level"], 1);
    }
}

#[tokio::test]
async fn cloudflare_challenge_fails_over_and_soft_avoids() {
    let gw = Gw::start(2).await;
    let a = fails_over(&gw, FaultKind::Cloudflare403).await;
    assert_eq!(
        (a["state"].as_str(), a["reason"].as_str()),
        (Some("cooling"), Some("edge_challenge"))
    );
    assert!(a["cooldown_remaining_s"].as_u64().unwrap() <= 10);
}

#[tokio::test]
async fn deactivated_account_needs_reauth_and_is_never_tried_again() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(&order[0], FaultKind::AccountDeactivated, None);
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    let a = gw.account(&order[0]).await;
    assert_eq!(a["state"], "needs_reauth");
    for _ in 0..3 {
        gw.stream(&body("gpt-5.5", "again", true), &[]).await;
    }
    assert_eq!(gw.served(&order[0]), 1);
}

#[tokio::test]
async fn reset_before_headers_fails_over() {
    let gw = Gw::start(2).await;
    let a = fails_over(&gw, FaultKind::ResetBeforeHeaders).await;
    assert_eq!(a["reason"], "transient");
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["attempts"][0]["class"], "transient");
    assert!(rec["attempts"][0]["status"].is_null());
}

#[tokio::test]
async fn slow_headers_beyond_the_header_timeout_fail_over() {
    let gw = Gw::start_with(2, |c| {
        c.upstream.header_timeout = Duration::from_millis(300)
    })
    .await;
    let a = fails_over(&gw, FaultKind::SlowHeaders { ms: 3000 }).await;
    assert_eq!(a["reason"], "transient");
    assert_eq!(
        gw.requests(1).await[0]["attempts"][0]["phase"],
        "pre_headers"
    );
}

#[tokio::test]
async fn a_stream_that_goes_silent_after_commit_gets_a_failed_event_at_the_idle_timeout() {
    let gw = Gw::start_with(2, |c| {
        c.upstream.stream_idle_timeout = Duration::from_millis(500)
    })
    .await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::HangMidStream { after_deltas: 2 },
        Some(1),
    );
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    let (kind, last) = sse.last();
    assert_eq!(kind, "response.failed");
    assert_eq!(last["response"]["error"]["code"], "upstream_stream_error");
    assert_eq!(gw.account(&order[0]).await["reason"], "transient");
    assert_eq!(gw.served(&order[1]), 0);
}

/// The idle timeout is a limit on each silence, not on the stream: an answer whose events keep
/// coming outlasts it many times over (the one timer of the stream's waits is moved on, not
/// let fire).
#[tokio::test]
async fn a_stream_whose_events_keep_coming_outlasts_the_idle_timeout() {
    let gw = Gw::start_with(2, |c| {
        c.upstream.stream_idle_timeout = Duration::from_millis(250)
    })
    .await;
    let order = gw.rr_order();
    gw.fault(&order[0], FaultKind::SlowDeltas { ms: 100 }, Some(1));
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{}", sse.body);
    // A pause before each delta but the first: the answer lasted this many idle timeouts.
    let pauses = sse.count("response.output_text.delta").saturating_sub(1);
    assert!(pauses * 100 >= 3 * 250, "{pauses} pauses of 100 ms");
    assert_eq!(gw.served(&order[1]), 0, "no failover");
}

#[tokio::test]
async fn a_silent_stream_before_commit_fails_over_invisibly() {
    let gw = Gw::start_with(2, |c| {
        c.upstream.stream_idle_timeout = Duration::from_millis(500)
    })
    .await;
    let a = fails_over(&gw, FaultKind::HangMidStream { after_deltas: 0 }).await;
    assert_eq!(a["reason"], "transient");
}

#[tokio::test]
async fn a_slow_first_token_gets_keepalive_comments_and_then_the_stream() {
    let gw = Gw::start_with(1, |c| c.server.keepalive_after = Duration::from_millis(100)).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::SlowFirstToken { ms: 1500 }, Some(1));
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200);
    assert!(
        sse.comments >= 1,
        "keep-alive comments while waiting: {}",
        sse.body
    );
    assert_eq!(sse.count("response.created"), 1);
    assert_eq!(sse.last().0, "response.completed");
}

/// An account whose headers come after `slow_ms`, with the keep-alive and header timeouts
/// `configure` sets: the client gets keep-alive comments on a 200, then `response.failed`
/// with the code a JSON client would get.
async fn fails_after_keepalives(configure: fn(&mut switchyard::config::Config), slow_ms: u64) {
    let gw = Gw::start_with(1, configure).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::SlowHeaders { ms: slow_ms }, Some(1));
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200);
    assert!(sse.comments >= 1, "keep-alive comments: {}", sse.body);
    let (kind, last) = sse.last();
    assert_eq!(kind, "response.failed");
    assert_eq!(last["response"]["error"]["code"], "no_available_account");
}

#[tokio::test]
async fn after_keepalive_headers_a_final_failure_arrives_as_a_failed_event_with_the_same_code() {
    let configure = |c: &mut switchyard::config::Config| {
        c.server.keepalive_after = Duration::from_millis(100);
        c.upstream.header_timeout = Duration::from_millis(800);
    };
    fails_after_keepalives(configure, 3000).await;
}

/// The same with both waits long enough (a second or more) to be kept in the serving
/// thread's own list of timeouts instead of tokio's timer: the keep-alive head still goes out,
/// and the header timeout still ends the wait.
#[tokio::test]
async fn coarse_timeouts_still_send_keepalives_and_end_a_wait_for_headers() {
    let configure = |c: &mut switchyard::config::Config| {
        c.server.keepalive_after = switchyard::base::deadline::COARSE_FROM;
        c.upstream.header_timeout = Duration::from_secs(2);
    };
    fails_after_keepalives(configure, 60_000).await;
}

#[tokio::test]
async fn model_unsupported_on_one_account_fails_over_and_on_all_is_404() {
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
    // The marked account is skipped for that model only.
    gw.stream(&body("gpt-5.5", "again", true), &[]).await;
    assert_eq!(gw.served(&order[0]), 1);
    let r = gw.stream(&body("gpt-5.4", "other model", true), &[]).await;
    assert_eq!(r.last().0, "response.completed");

    gw.sim
        .sim
        .set_supported_models(&order[1], vec!["gpt-5.4".into()]);
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "x", true), &[])
        .await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn failed_event_with_quota_code_inside_200_cools_the_account() {
    let gw = Gw::start(2).await;
    let a = fails_over(
        &gw,
        FaultKind::FailedEvent {
            code: "insufficient_quota".into(),
        },
    )
    .await;
    assert_eq!(a["reason"], "quota");
}

#[tokio::test]
async fn a_dead_refresh_token_puts_the_account_in_needs_reauth_and_fails_over() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    // A password change: every token of the first account is dead.
    gw.sim.sim.revoke_tokens(&order[0]);
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_eq!(gw.account(&order[0]).await["state"], "needs_reauth");
}

/// The backend refuses the first account's access token as expired; its refresh is answered
/// by the token endpoint as the fault says. Returns the first account's admin view after a
/// request that had to move to the second account.
async fn refresh_answered(gw: &Gw, kind: Option<FaultKind>) -> Value {
    let order = gw.rr_order();
    if let Some(kind) = kind {
        gw.fault(&order[0], kind, Some(1));
    }
    assert!(gw.sim.sim.expire_access_token(&order[0]));
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert!(sse.text().contains(&order[1]), "served by {}", sse.text());
    let records = gw.requests(1).await;
    let classes: Vec<&str> = records[0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes[0], "auth_expired", "{classes:?}");
    assert_eq!(classes.last(), Some(&"success"), "{classes:?}");
    gw.account(&order[0]).await
}

#[tokio::test]
async fn a_challenge_page_from_the_token_endpoint_cools_the_account_instead_of_needing_a_login() {
    let gw = Gw::start(2).await;
    let a = refresh_answered(&gw, Some(FaultKind::RefreshChallenge)).await;
    assert_eq!(a["state"], "cooling", "{a}");
    assert_eq!(a["reason"], "edge_challenge", "{a}");
    assert!(a["detail"].is_null(), "{a}");
    let last = a["last_error"].as_str().unwrap();
    assert!(
        last.contains("token refresh") && last.contains("cloudflare challenge"),
        "{last}"
    );
}

#[tokio::test]
async fn an_unknown_400_from_the_token_endpoint_cools_the_account_instead_of_needing_a_login() {
    let gw = Gw::start(2).await;
    let a = refresh_answered(
        &gw,
        Some(FaultKind::RefreshError {
            status: 400,
            code: "unsupported_country_region_territory".into(),
        }),
    )
    .await;
    assert_eq!(a["state"], "cooling", "{a}");
    assert_eq!(a["reason"], "transient", "{a}");
    let last = a["last_error"].as_str().unwrap();
    assert!(
        last.contains("token refresh: 400 unsupported_country_region_territory"),
        "{last}"
    );
}

#[tokio::test]
async fn an_operators_refresh_answered_by_a_challenge_page_cools_the_account() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::RefreshChallenge, Some(1));
    let resp = gw
        .admin()
        .await
        .call::<Value>(
            axum::http::Method::POST,
            &format!("/api/admin/accounts/{a}/refresh"),
            None,
        )
        .await;
    let err = resp.unwrap_err().to_string();
    assert!(err.contains("cloudflare challenge"), "{err}");
    let view = gw.account(&a).await;
    assert_eq!(
        (view["state"].as_str(), view["reason"].as_str()),
        (Some("cooling"), Some("edge_challenge")),
        "{view}"
    );
}

#[tokio::test]
async fn a_refresh_token_used_by_another_client_needs_a_new_login_and_says_so() {
    let gw = Gw::start(2).await;
    let a = gw.rr_order()[0].clone();
    // The gateway's access token runs out; meanwhile the Codex CLI the login was copied from
    // refreshes first, so the refresh token the gateway holds is spent.
    assert!(gw.sim.sim.expire_access_token(&a));
    let auth = gw.sim.sim.auth_json(&a).unwrap();
    let other_client = reqwest::Client::new()
        .post(gw.sim.oauth_token_url())
        .json(&json!({
            "client_id": "app_EMoamEEZ73f0CkXaXp7hrann",
            "grant_type": "refresh_token",
            "refresh_token": auth["tokens"]["refresh_token"],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(other_client.status(), 200);
    let view = refresh_answered(&gw, None).await;
    assert_eq!(view["state"], "needs_reauth", "{view}");
    assert_eq!(view["reason"], "auth_dead", "{view}");
    let detail = view["detail"].as_str().unwrap();
    assert!(
        detail.contains("refresh token had already been used"),
        "{detail}"
    );
    assert!(
        view["last_error"]
            .as_str()
            .unwrap()
            .contains("refresh_token_reused"),
        "{view}"
    );
    // It takes no more requests.
    let sse = gw.stream(&body("gpt-5.5", "again", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(gw.sim.sim.refresh_count(&a), 1, "only the other client's");
}

#[tokio::test]
async fn a_transient_refresh_failure_keeps_a_still_valid_token() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::RefreshFails { status: 503 }, Some(1));
    let resp = gw
        .admin()
        .await
        .call::<Value>(
            axum::http::Method::POST,
            &format!("/api/admin/accounts/{a}/refresh"),
            None,
        )
        .await;
    assert!(resp.is_err(), "the operator sees the refresh failure");
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(gw.account(&a).await["state"], "ready");
}

#[tokio::test]
async fn operator_can_clear_a_cooldown_and_force_a_refresh() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        Some(1),
    );
    gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    assert_eq!(gw.account(&order[0]).await["state"], "cooling");
    let admin = gw.admin().await;
    let cleared: Value = admin
        .call(
            axum::http::Method::POST,
            &format!("/api/admin/accounts/{}/clear-cooldown", order[0]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(cleared["state"], "ready");
    let before = gw.sim.sim.refresh_count(&order[0]);
    let refreshed: Value = admin
        .call(
            axum::http::Method::POST,
            &format!("/api/admin/accounts/{}/refresh", order[0]),
            None,
        )
        .await
        .unwrap();
    assert_eq!(refreshed["state"], "ready");
    assert_eq!(gw.sim.sim.refresh_count(&order[0]), before + 1);
}

#[tokio::test]
async fn compact_passes_through() {
    let gw = Gw::start(1).await;
    let resp = gw
        .post_raw(
            "/v1/responses/compact",
            &json!({"model": "gpt-5.5", "input": [{"type": "message", "role": "user", "content": "x"}], "instructions": "i"}),
            &[],
        )
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert!(
        v["output"]
            .as_array()
            .is_some_and(|o| o.iter().any(|i| i["type"] == "compaction")),
        "{v}"
    );
    let reqs = gw.sim.sim.requests(&gw.rr_order()[0]);
    assert!(reqs[0].path.ends_with("/responses/compact"));
    let record = &gw.requests(1).await[0];
    assert_eq!(record["terminal_source"], "upstream", "{record}");
}

#[tokio::test]
async fn models_answer_the_openai_and_the_codex_shapes_with_aliases() {
    let gw = Gw::start_with(1, |c| {
        c.models.aliases.insert("my-model".into(), "gpt-5.5".into());
    })
    .await;
    let get = |q: &'static str| {
        let gw = &gw;
        async move {
            gw.http
                .get(gw.url(&format!("/v1/models{q}")))
                .header("authorization", gw.auth())
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let openai = get("").await;
    assert_eq!(openai["object"], "list");
    let ids: Vec<&str> = openai["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"gpt-5.5") && ids.contains(&"my-model"),
        "{ids:?}"
    );
    let codex = get("?client_version=0.169.0").await;
    let slugs: Vec<&str> = codex["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["slug"].as_str().unwrap())
        .collect();
    assert!(slugs.contains(&"my-model"), "{slugs:?}");
    // An alias is resolved before the request goes upstream.
    let sse = gw.stream(&body("my-model", "x", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(
        gw.sim.sim.requests(&gw.rr_order()[0])[0].body["model"],
        "gpt-5.5"
    );
}

#[tokio::test]
async fn turn_state_is_dropped_when_the_account_changes() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    let first = gw
        .post_raw(
            "/v1/responses",
            &body("gpt-5.5", "x", true),
            &[("session-id", "s1")],
        )
        .await;
    let token = first.headers()["x-codex-turn-state"]
        .to_str()
        .unwrap()
        .to_string();
    common::gw::read_sse(first).await;
    // The session stays on its account, which issued the token: it is passed through.
    gw.stream(
        &body("gpt-5.5", "y", true),
        &[("session-id", "s1"), ("x-codex-turn-state", &token)],
    )
    .await;
    let on_first = gw.sim.sim.requests(&order[0]);
    assert_eq!(on_first.len(), 2);
    assert_eq!(on_first[1].headers.get("x-codex-turn-state"), Some(&token));
    // The account goes away: the next turn runs elsewhere, without the foreign token.
    gw.admin()
        .await
        .call::<Value>(
            axum::http::Method::POST,
            &format!("/api/admin/accounts/{}/disable", order[0]),
            None,
        )
        .await
        .unwrap();
    gw.stream(
        &body("gpt-5.5", "z", true),
        &[("session-id", "s1"), ("x-codex-turn-state", &token)],
    )
    .await;
    let on_second = gw.sim.sim.requests(&order[1]);
    assert_eq!(on_second.len(), 1);
    assert!(!on_second[0].headers.contains_key("x-codex-turn-state"));
}

#[tokio::test]
async fn a_cooled_account_half_opens_one_probe_decides_and_a_failure_climbs_the_ladder() {
    use std::sync::Arc;
    use switchyard::base::clock::{Clock, ManualClock};
    let clock = ManualClock::new(switchyard::base::clock::SystemClock.now_ms());
    let gw = Gw::start_opts(common::gw::GwOptions {
        accounts: 2,
        clock: Arc::new(clock.clone()),
        ..Default::default()
    })
    .await;
    let order = gw.rr_order();
    let a = &order[0];
    gw.fault(a, FaultKind::ServerError { status: 500 }, Some(2));
    gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
    assert_eq!(gw.account(a).await["state"], "cooling");
    // 30 s later the first step of the transient ladder is over: half-open.
    clock.advance(Duration::from_secs(31));
    assert_eq!(gw.account(a).await["state"], "half_open");
    // The probe fails (the second queued 500): it re-opens at the next step, 2 minutes.
    let mut probed = false;
    for _ in 0..2 {
        gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
        probed |= gw.served(a) == 2;
    }
    assert!(probed, "the half-open account got one probe");
    let acct = gw.account(a).await;
    assert_eq!(
        (acct["state"].as_str(), acct["level"].as_u64()),
        (Some("cooling"), Some(2))
    );
    assert!(acct["cooldown_remaining_s"].as_u64().unwrap() > 60);
    // After that the probe succeeds: ready, still escalated until a second success.
    clock.advance(Duration::from_secs(121));
    for _ in 0..2 {
        gw.stream(&body_plain("gpt-5.5", "x", true), &[]).await;
    }
    let acct = gw.account(a).await;
    assert_eq!(acct["state"], "ready");
}

#[tokio::test]
async fn with_nothing_usable_the_answer_is_503_with_a_pool_summary() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.sim.sim.revoke_tokens(&order[0]);
    gw.fault(&order[1], FaultKind::ServerError { status: 502 }, Some(1));
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "x", true), &[])
        .await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_available_account");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("2 accounts:")
            && msg.contains("need re-login")
            && msg.contains("cooling (transient"),
        "{msg}"
    );
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["outcome"], "no_account");
    assert_eq!(rec["status"], 503);
}

#[tokio::test]
async fn tokens_close_to_expiry_are_refreshed_before_use() {
    use std::sync::Arc;
    use switchyard::base::clock::{Clock, ManualClock};
    let clock = ManualClock::new(switchyard::base::clock::SystemClock.now_ms());
    let gw = Gw::start_opts(common::gw::GwOptions {
        accounts: 1,
        clock: Arc::new(clock.clone()),
        sim_access_ttl: Duration::from_secs(120),
        ..Default::default()
    })
    .await;
    let a = gw.rr_order()[0].clone();
    // A fresh short-lived token is used as it is...
    gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    assert_eq!(gw.sim.sim.refresh_count(&a), 0);
    // ...until less than half its life is left.
    clock.advance(Duration::from_secs(70));
    let sse = gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(gw.sim.sim.refresh_count(&a), 1, "refreshed proactively");
    assert_eq!(gw.served(&a), 2, "no 401 was needed");
}
