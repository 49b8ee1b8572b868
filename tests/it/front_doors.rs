//! The other front doors inherit the Responses path's guarantees: a request the key refuses
//! touches no account and is answered in the door's own shape; a served one counts once in
//! the key's usage, under the pool model that served it (a refusal by the key's policy counts
//! as a request with an error, as on `/v1/responses`).

use crate::common::gw::Gw;
use serde_json::{Value, json};

fn served_total(gw: &Gw) -> usize {
    gw.ids.keys().map(|a| gw.served(a)).sum()
}

async fn post(gw: &Gw, key: &str, path: &str, body: Value) -> (u16, Value) {
    let r = gw
        .http
        .post(gw.url(path))
        .header("x-api-key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn claude(c: &mut switchyard::config::Config) {
    c.front_doors
        .anthropic
        .models
        .insert("claude-*".into(), "gpt-5.4-mini".into());
}

#[tokio::test]
async fn a_refused_request_touches_no_account_and_a_served_one_counts_once() {
    let gw = Gw::start_with(2, claude).await;
    let (_, key) = gw.make_key("team", json!({"models": ["gpt-5.5"]})).await;
    let chat = json!({"model": "gpt-5.4-mini", "messages": [{"role": "user", "content": "hi"}]});
    let (status, v) = post(&gw, &key, "/v1/chat/completions", chat).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "model_not_allowed");
    // The Messages door maps claude-* to a model the key may not use: refused in its shape.
    let msg = json!({"model": "claude-haiku", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let (status, v) = post(&gw, &key, "/v1/messages", msg).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "permission_error", "{v}");
    let (status, v) = post(
        &gw,
        &key,
        "/v1/images/generations",
        json!({"model": "gpt-image-1", "prompt": "a cat", "n": 3}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(served_total(&gw), 0, "no account was asked");

    // Served: one record and one request in the key's usage, under the pool model.
    let chat = json!({"model": "gpt-5.5", "messages": [{"role": "user", "content": "hi"}]});
    let (status, v) = post(&gw, &key, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(served_total(&gw), 1);
    let usage: Value = gw
        .http
        .get(gw.url("/v1/usage"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The two policy refusals count as requests with errors (as on /v1/responses); the
    // served one once; the images refusal never reached the dispatcher.
    let today = &usage["usage"]["today"];
    assert_eq!(today["requests"], 3, "{usage}");
    assert_eq!(today["errors"], 2, "{usage}");
    assert!(today["output_tokens"].as_u64().unwrap() > 0);
    let recs = gw.requests(10).await;
    let served: Vec<_> = recs.iter().filter(|r| r["outcome"] == "success").collect();
    assert_eq!(served.len(), 1);
    assert_eq!(served[0]["path"], "/v1/chat/completions");
    assert_eq!(served[0]["model"], "gpt-5.5");
}

#[tokio::test]
async fn the_model_list_names_what_each_front_door_offers() {
    let gw = Gw::start_with(1, |c| {
        c.front_doors
            .anthropic
            .models
            .insert("claude-sonnet-4-5".into(), "gpt-5.5".into());
    })
    .await;
    let list: Value = gw
        .http
        .get(gw.url("/v1/models"))
        .bearer_auth(&gw.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let data = list["data"].as_array().unwrap();
    let find = |id: &str| data.iter().find(|m| m["id"] == id).cloned();
    let pool = find("gpt-5.5").unwrap();
    assert!(pool["front_doors"].to_string().contains("chat_completions"));
    let claude = find("claude-sonnet-4-5").unwrap();
    assert_eq!(claude["front_doors"], json!(["messages"]));
    assert_eq!(claude["serves"], "gpt-5.5");
    assert_eq!(
        find("gpt-image-1").unwrap()["front_doors"],
        json!(["images"])
    );
}

#[tokio::test]
async fn a_body_larger_than_the_cap_is_refused_in_each_doors_shape_before_any_account() {
    let gw = Gw::start_with(1, |c| c.server.max_body_bytes = 4096).await;
    let big = "x".repeat(10_000);
    let (status, v) = post(
        &gw,
        &gw.key,
        "/v1/chat/completions",
        json!({"model": "gpt-5.5", "messages": [{"role": "user", "content": big}]}),
    )
    .await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let (status, v) = post(
        &gw,
        &gw.key,
        "/v1/messages",
        json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": big}]}),
    )
    .await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "request_too_large", "{v}");
    let (status, _) = post(
        &gw,
        &gw.key,
        "/v1/images/generations",
        json!({"prompt": big}),
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(served_total(&gw), 0);
}
