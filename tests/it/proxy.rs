//! The proxy core over HTTP/SSE, against the simulated backend: what the client receives,
//! where each request went, and the account state afterwards.

use crate::common::gw::{Gw, body, until};
use serde_json::{Value, json};
use switchyard::sim::FaultKind;

#[tokio::test]
async fn a_streamed_turn_goes_through_with_the_account_identity() {
    let gw = Gw::start(2).await;
    let sse = gw
        .stream(
            &body("gpt-5.5", "hello", true),
            &[("session-id", "s-1"), ("originator", "codex_exec")],
        )
        .await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.headers["content-type"], "text/event-stream");
    assert_eq!(sse.count("response.created"), 1);
    assert_eq!(sse.last().0, "response.completed");
    let first = &gw.rr_order()[0];
    let got = gw.sim.sim.requests(first);
    assert_eq!(got.len(), 1, "the first account in rotation served it");
    let req = &got[0];
    assert_eq!(req.headers["chatgpt-account-id"], first.as_str());
    assert!(
        req.headers["authorization"].starts_with("Bearer ey"),
        "the account's token, not the client key"
    );
    assert_eq!(req.headers["session-id"], "s-1");
    assert_eq!(req.headers["originator"], "codex_exec");
    assert_eq!(req.headers["x-codex-installation-id"].len(), 36);
    assert_eq!(
        req.body["an_unknown_field"],
        json!({"kept": true}),
        "unknown fields pass through"
    );
    assert_eq!(req.body["stream"], true);

    let records = gw.requests(10).await;
    assert_eq!(records[0]["outcome"], "success");
    assert_eq!(records[0]["account"], first.as_str());
    assert_eq!(records[0]["attempts"][0]["class"], "success");
    assert!(records[0]["usage"]["input_tokens"].as_u64().unwrap() > 0);
}

/// The events reach the client in the backend's own framing, each once and in order: those
/// after the commit pass as the blocks they came in, the terminal event after them.
#[tokio::test]
async fn a_streamed_answer_reaches_the_client_in_the_backends_framing() {
    let gw = Gw::start(1).await;
    let sse = gw.stream(&body("gpt-5.5", "hello there", true), &[]).await;
    assert_eq!(sse.status, 200);
    assert!(sse.body.ends_with("\n\n"), "{:?}", sse.body);
    let blocks: Vec<&str> = sse.body.trim_end_matches("\n\n").split("\n\n").collect();
    assert_eq!(
        blocks.len(),
        sse.events.len(),
        "no comments, one block per event"
    );
    assert!(
        sse.count("response.output_text.delta") >= 2,
        "{:?}",
        sse.body
    );
    for (block, (kind, data)) in blocks.iter().zip(&sse.events) {
        let (event_line, data_line) = block.split_once('\n').expect("two lines");
        assert_eq!(event_line, format!("event: {kind}"));
        let sent: Value = serde_json::from_str(data_line.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(&sent, data);
        assert_eq!(sent["type"], kind.as_str());
    }
    assert_eq!(sse.events[0].0, "response.created");
    assert_eq!(sse.count("response.completed"), 1);
    assert_eq!(sse.last().0, "response.completed");
}

#[tokio::test]
async fn a_json_request_gets_the_final_response() {
    let gw = Gw::start(1).await;
    let (status, v) = gw.json(&body("gpt-5.5", "hello", false)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert!(
        v["output"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["type"] == "message")
    );
}

#[tokio::test]
async fn quota_429_fails_over_and_cools_until_reset() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    let (a, b) = (&order[0], &order[1]);
    gw.fault(
        a,
        FaultKind::Quota {
            resets_in_seconds: 3600,
        },
        None,
    );
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.last().0, "response.completed");
    assert_eq!(gw.served(a), 1);
    assert_eq!(gw.served(b), 1);
    let acct = gw.account(a).await;
    assert_eq!(acct["state"], "cooling");
    assert_eq!(acct["reason"], "quota");
    let left = acct["cooldown_remaining_s"].as_u64().unwrap();
    assert!(
        (3500..=3600).contains(&left),
        "cools until the reset: {left}"
    );
    // The next requests never touch the cooling account.
    for _ in 0..3 {
        gw.stream(&body("gpt-5.5", "again", true), &[]).await;
    }
    assert_eq!(gw.served(a), 1);
    let rec = &gw.requests(10).await[3];
    assert_eq!(rec["attempts"][0]["class"], "quota");
    assert_eq!(rec["attempts"][0]["status"], 429);
    assert_eq!(rec["attempts"][1]["class"], "success");
}

#[tokio::test]
async fn failed_event_inside_200_fails_over_invisibly() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::FailedEvent {
            code: "server_is_overloaded".into(),
        },
        Some(1),
    );
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.count("response.created"), 1, "{:?}", sse.kinds());
    assert_eq!(sse.count("response.failed"), 0);
    assert_eq!(sse.last().0, "response.completed");
    // The one response.created is the serving account's.
    let served_by = &order[1];
    assert!(sse.text().contains(served_by.as_str()), "{}", sse.text());
    assert_eq!(gw.account(&order[0]).await["reason"], "transient");
}

#[tokio::test]
async fn mid_stream_reset_marks_account_transient_and_client_gets_failed_event() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::ResetMidStream { after_deltas: 2 },
        Some(1),
    );
    let sse = gw.stream(&body("gpt-5.5", "hello", true), &[]).await;
    assert_eq!(sse.status, 200);
    assert!(
        sse.count("response.output_text.delta")
            + sse.count("response.reasoning_summary_text.delta")
            >= 1
    );
    let (kind, last) = sse.last();
    assert_eq!(kind, "response.failed");
    assert_eq!(last["response"]["error"]["code"], "upstream_stream_error");
    assert!(
        !sse.broken,
        "the client stream ends cleanly after the failed event"
    );
    assert_eq!(gw.served(&order[1]), 0, "no replay after commit");
    let acct = gw.account(&order[0]).await;
    assert_eq!(
        (acct["state"].as_str(), acct["reason"].as_str()),
        (Some("cooling"), Some("transient"))
    );
    let rec = &gw.requests(1).await[0];
    assert_eq!(rec["outcome"], "stream_error");
    assert_eq!(rec["attempts"][0]["phase"], "mid_stream");
    assert_eq!(rec["attempts"][0]["class"], "transient");
}

#[tokio::test]
async fn context_length_error_passes_through_without_penalty() {
    let gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(&order[0], FaultKind::ContextLength, Some(1));
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "long", true), &[])
        .await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(
        gw.served(&order[1]),
        0,
        "a caller error is not retried elsewhere"
    );
    assert_eq!(gw.account(&order[0]).await["state"], "ready");
}

#[tokio::test]
async fn all_accounts_on_quota_returns_429_with_retry_after() {
    let gw = Gw::start(2).await;
    for (i, a) in gw.rr_order().iter().enumerate() {
        gw.fault(
            a,
            FaultKind::Quota {
                resets_in_seconds: 600 * (i as u64 + 1),
            },
            None,
        );
    }
    let resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "x", true), &[])
        .await;
    assert_eq!(resp.status(), 429);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((590..=600).contains(&retry), "earliest reset: {retry}");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "usage_limit_reached");
    assert!(v["error"]["resets_in_seconds"].as_u64().is_some());
    // Known-bad accounts are not asked again.
    let before: usize = gw.rr_order().iter().map(|a| gw.served(a)).sum();
    let again = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "x", true), &[])
        .await;
    assert_eq!(again.status(), 429);
    let after: usize = gw.rr_order().iter().map(|a| gw.served(a)).sum();
    assert_eq!(before, after, "no fail-open");
}

#[tokio::test]
async fn cooldown_survives_restart() {
    let mut gw = Gw::start(2).await;
    let order = gw.rr_order();
    gw.fault(
        &order[0],
        FaultKind::Quota {
            resets_in_seconds: 5 * 3600,
        },
        None,
    );
    gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    assert_eq!(gw.account(&order[0]).await["state"], "cooling");
    gw.restart().await;
    let acct = gw.account(&order[0]).await;
    assert_eq!(
        (acct["state"].as_str(), acct["reason"].as_str()),
        (Some("cooling"), Some("quota"))
    );
    assert!(acct["cooldown_remaining_s"].as_u64().unwrap() > 4 * 3600);
    let served = gw.served(&order[0]);
    for _ in 0..2 {
        gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    }
    assert_eq!(
        gw.served(&order[0]),
        served,
        "a restart does not forget the cooldown"
    );
}

#[tokio::test]
async fn token_expired_refreshes_once_and_retries() {
    let gw = Gw::start(1).await;
    let a = &gw.rr_order()[0];
    assert!(gw.sim.sim.expire_access_token(a));
    let sse = gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_eq!(gw.sim.sim.refresh_count(a), 1);
    assert_eq!(
        gw.served(a),
        2,
        "one 401, then the retry on the same account"
    );
    assert_eq!(gw.account(a).await["state"], "ready");
}

#[tokio::test]
async fn rotated_refresh_token_survives_restart() {
    let mut gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.sim.sim.expire_access_token(&a);
    gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    assert_eq!(gw.sim.sim.refresh_count(&a), 1);
    gw.restart().await;
    // After the restart the stored (rotated) refresh token must be the live one: an old one
    // would be answered `refresh_token_reused` and the account would need a new login.
    gw.sim.sim.expire_access_token(&a);
    let sse = gw.stream(&body("gpt-5.5", "x", true), &[]).await;
    assert_eq!(sse.last().0, "response.completed", "{:?}", sse.kinds());
    assert_eq!(gw.sim.sim.refresh_count(&a), 2);
    assert_eq!(gw.account(&a).await["state"], "ready");
}

#[tokio::test]
async fn client_disconnect_does_not_penalise_account() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::HangMidStream { after_deltas: 1 }, Some(1));
    let mut resp = gw
        .post_raw("/v1/responses", &body("gpt-5.5", "x", true), &[])
        .await;
    assert_eq!(resp.status(), 200);
    // Read until the stream has committed (some output arrived), then hang up.
    let mut seen = String::new();
    while !seen.contains(".delta") {
        let chunk = resp.chunk().await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(resp);
    gw.recorded_as_client_cancelled(&a).await;
}

/// A client that leaves before the answer's head (the upstream still thinking): the request
/// ends as its client's leaving at once, and its record is kept and its slot freed although
/// no one reads its frames any more.
#[tokio::test]
async fn a_client_that_leaves_before_the_head_is_recorded_and_frees_its_slot() {
    let gw = Gw::start(1).await;
    let a = gw.rr_order()[0].clone();
    gw.fault(&a, FaultKind::SlowHeaders { ms: 600_000 }, Some(1));
    let client = gw.spawn_stream(body("gpt-5.5", "x", true));
    until("the upstream to hold the request", || async {
        gw.sim.sim.faults(&a).is_empty() && gw.account(&a).await["in_flight"] == 1
    })
    .await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    gw.recorded_as_client_cancelled(&a).await;
}

#[tokio::test]
async fn bad_keys_bodies_and_sizes_get_openai_errors() {
    let gw = Gw::start_with(1, |c| c.server.max_body_bytes = 4096).await;
    let no_key = gw
        .http
        .post(gw.url("/v1/responses"))
        .json(&body("gpt-5.5", "x", true))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 401);
    let v: serde_json::Value = no_key.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let wrong = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", "Bearer sk-sy-wrong")
        .json(&body("gpt-5.5", "x", true))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let malformed = gw
        .http
        .post(gw.url("/v1/responses"))
        .header("authorization", gw.auth())
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    let v: serde_json::Value = malformed.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("column"),
        "{v}"
    );
    let big = gw
        .post_raw(
            "/v1/responses",
            &body("gpt-5.5", &"x".repeat(10_000), true),
            &[],
        )
        .await;
    assert_eq!(big.status(), 413);
    let no_model = gw
        .post_raw("/v1/responses", &json!({"input": []}), &[])
        .await;
    assert_eq!(no_model.status(), 400);
    assert_eq!(gw.served(&gw.rr_order()[0]), 0);
}
