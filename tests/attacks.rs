//! The gateway tried as a hostile or careless client would: each test reproduces a way it once
//! broke its promise (a caller's mistake taken for an account's or a model's failure, a client
//! that holds resources, a storm of failures) and pins what must happen instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::http::Method;
use common::gw::{Gw, body};
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
