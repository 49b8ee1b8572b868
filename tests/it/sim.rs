//! The simulated Codex backend over real sockets: event sequences, auth and refresh, the
//! prompt cache, every fault kind, recording, the control API and auth files the gateway can
//! import.

use std::time::{Duration, Instant};

use crate::common::gw::until;
use crate::common::sim::{
    START_MS, access, answer, client, refresh, start, start_manual, tokens, types,
};
use crate::common::sse::{SseReader, parse_sse_strict};
use reqwest::{Client, Response};
use serde_json::{Value, json};
use switchyard::sim::{Fault, FaultKind, Profile, Sim, SimHandle, SimOptions};

fn turn(text: &str, key: &str, stream: bool) -> Value {
    json!({
        "model": "gpt-5.5",
        "instructions": "You are a helpful assistant.",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": stream,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": key,
    })
}

async fn post_as(c: &Client, h: &SimHandle, id: &str, token: &str, body: &Value) -> Response {
    c.post(format!("{}/responses", h.base_url()))
        .bearer_auth(token)
        .header("ChatGPT-Account-ID", id)
        .header(
            "session-id",
            body["prompt_cache_key"].as_str().unwrap_or(""),
        )
        .header("originator", "codex_exec")
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn post(c: &Client, h: &SimHandle, id: &str, body: &Value) -> Response {
    post_as(c, h, id, &access(h, id), body).await
}

fn header<'a>(r: &'a Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or_else(|| panic!("no {name} header"))
}

#[tokio::test]
async fn streamed_turn_follows_the_codex_event_sequence() {
    let h = start(2).await;
    let c = client();
    let r = post(&c, &h, "sim-acct-2", &turn("hi", "sess-1", true)).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    assert_eq!(header(&r, "x-codex-primary-window-minutes"), "300");
    assert_eq!(header(&r, "x-codex-secondary-window-minutes"), "10080");
    assert_eq!(header(&r, "x-codex-plan-type"), "pro");
    for h in [
        "x-codex-primary-used-percent",
        "x-codex-primary-reset-at",
        "x-codex-primary-reset-after-seconds",
        "x-codex-secondary-used-percent",
        "x-codex-secondary-reset-at",
        "x-codex-secondary-reset-after-seconds",
    ] {
        header(&r, h).parse::<f64>().unwrap();
    }
    let turn_state = header(&r, "x-codex-turn-state").to_string();
    let events = parse_sse_strict(&r.text().await.unwrap());
    let t = types(&events);
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
    ];
    let summary_deltas = t
        .iter()
        .filter(|x| **x == "response.reasoning_summary_text.delta")
        .count();
    let text_deltas = t
        .iter()
        .filter(|x| **x == "response.output_text.delta")
        .count();
    assert!(summary_deltas >= 2 && text_deltas >= 2, "{t:?}");
    expected.extend(std::iter::repeat_n(
        "response.reasoning_summary_text.delta",
        summary_deltas,
    ));
    expected.extend([
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
    ]);
    expected.extend(std::iter::repeat_n(
        "response.output_text.delta",
        text_deltas,
    ));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(t, expected);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64);
    }
    let created = &events[0]["response"];
    assert!(created["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(created["object"], "response");
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["model"], "gpt-5.5");
    assert_eq!(created["output"], json!([]));
    assert_eq!(events[2]["item"]["type"], "reasoning");
    assert_eq!(events[2]["item"]["summary"], json!([]));
    let reasoning_done = &events[summary_deltas + 6]["item"];
    assert!(reasoning_done["encrypted_content"].as_str().unwrap().len() > 10);
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert!(text.starts_with("Hello from sim-acct-2."), "{text}");
    let done = events.last().unwrap();
    assert_eq!(done["response"]["status"], "completed");
    assert_eq!(done["response"]["output"][1]["content"][0]["text"], text);
    let u = &done["response"]["usage"];
    let input = u["input_tokens"].as_u64().unwrap();
    let output = u["output_tokens"].as_u64().unwrap();
    assert!(input >= 1 && output >= 1);
    assert_eq!(u["input_tokens_details"]["cached_tokens"], 0);
    assert!(
        u["output_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert_eq!(u["total_tokens"].as_u64().unwrap(), input + output);

    // The turn state is stable per (account, session) and differs across sessions.
    let again = post(&c, &h, "sim-acct-2", &turn("hi", "sess-1", true)).await;
    assert_eq!(header(&again, "x-codex-turn-state"), turn_state);
    let other = post(&c, &h, "sim-acct-2", &turn("hi", "sess-2", true)).await;
    assert_ne!(header(&other, "x-codex-turn-state"), turn_state);
}

#[tokio::test]
async fn non_streamed_request_returns_the_final_response_as_json() {
    let h = start(1).await;
    let r = post(&client(), &h, "sim-acct-1", &turn("hi", "k", false)).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("application/json"));
    header(&r, "x-codex-turn-state");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["type"], "reasoning");
    assert_eq!(v["output"][1]["type"], "message");
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn run_prompt_gets_an_exec_command_call_and_its_output_gets_a_message() {
    let h = start(1).await;
    let c = client();
    let mut body = turn("please run: ls -la \"my dir\"\nthanks", "k", true);
    body["tools"] = json!([{"type": "function", "name": "exec_command", "parameters": {}}]);
    let events = parse_sse_strict(
        &post(&c, &h, "sim-acct-1", &body)
            .await
            .text()
            .await
            .unwrap(),
    );
    let added = events
        .iter()
        .find(|e| e["type"] == "response.output_item.added" && e["output_index"] == 1)
        .unwrap();
    assert_eq!(added["item"]["type"], "function_call");
    assert_eq!(added["item"]["name"], "exec_command");
    assert_eq!(added["item"]["arguments"], "");
    let args: String = events
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert!(
        events
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.delta")
            .count()
            > 1
    );
    let call = &events.last().unwrap()["response"]["output"][1];
    assert_eq!(call["arguments"], args);
    let parsed: Value = serde_json::from_str(&args).unwrap();
    assert_eq!(parsed, json!({"cmd": "ls -la \"my dir\""}));
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let call_id = call["call_id"].as_str().unwrap().to_string();
    assert!(call_id.starts_with("call_"));
    assert!(!types(&events).contains(&"response.output_text.delta"));

    // Without the tool on offer, the same prompt gets a message.
    let plain = turn("please run: ls", "k", false);
    let v: Value = post(&c, &h, "sim-acct-1", &plain)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["output"][1]["type"], "message");

    // The follow-up carrying the output gets a message about it.
    body["input"].as_array_mut().unwrap().extend([
        call.clone(),
        json!({"type": "function_call_output", "call_id": call_id,
            "output": "total 0\n-rw-r--r-- 1 u u 0 notes.txt"}),
    ]);
    let events = parse_sse_strict(
        &post(&c, &h, "sim-acct-1", &body)
            .await
            .text()
            .await
            .unwrap(),
    );
    let msg = &events.last().unwrap()["response"]["output"][1];
    assert_eq!(msg["type"], "message");
    assert_eq!(
        msg["content"][0]["text"],
        "The command printed: total 0\n-rw-r--r-- 1 u u 0 notes.txt"
    );
}

fn cached(v: &Value) -> u64 {
    v["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn prompt_cache_hits_only_for_a_repeated_session_on_the_same_account() {
    let h = start(2).await;
    let c = client();
    let first: Value = post(&c, &h, "sim-acct-1", &turn("hello", "sess-a", false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(cached(&first), 0);
    let second: Value = post(&c, &h, "sim-acct-1", &turn("hello again", "sess-a", false))
        .await
        .json()
        .await
        .unwrap();
    assert!(cached(&second) > 0);
    assert!(cached(&second) <= second["usage"]["input_tokens"].as_u64().unwrap());
    // Same session on another account: that account's cache is cold.
    let moved: Value = post(&c, &h, "sim-acct-2", &turn("hello again", "sess-a", false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(cached(&moved), 0);
    let other: Value = post(&c, &h, "sim-acct-1", &turn("hello", "sess-b", false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(cached(&other), 0);
    // The session-id header is the key when the body has none.
    let mut body = turn("x", "", false);
    body.as_object_mut().unwrap().remove("prompt_cache_key");
    let send = |c: &Client| {
        c.post(format!("{}/responses", h.base_url()))
            .bearer_auth(tokens(&h, "sim-acct-2").0)
            .header("ChatGPT-Account-ID", "sim-acct-2")
            .header("session-id", "hdr-session")
            .json(&body)
            .send()
    };
    let v: Value = send(&c).await.unwrap().json().await.unwrap();
    assert_eq!(cached(&v), 0);
    let v: Value = send(&c).await.unwrap().json().await.unwrap();
    assert!(cached(&v) > 0);
}

#[tokio::test]
async fn foreign_or_missing_credentials_are_token_invalidated() {
    let h = start(2).await;
    let c = client();
    let body = turn("hi", "k", true);
    let (acct2_token, _, _) = tokens(&h, "sim-acct-2");
    for r in [
        post_as(&c, &h, "sim-acct-1", "not-a-token", &body).await,
        post_as(&c, &h, "sim-acct-1", &acct2_token, &body).await,
        post_as(&c, &h, "sim-acct-9", &acct2_token, &body).await,
        c.post(format!("{}/responses", h.base_url()))
            .header("ChatGPT-Account-ID", "sim-acct-1")
            .json(&body)
            .send()
            .await
            .unwrap(),
    ] {
        let (s, v) = answer(r).await;
        assert_eq!(s, 401);
        assert_eq!(v["error"]["code"], "token_invalidated");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], Value::Null);
    }
    assert!(h.sim.requests("sim-acct-1").iter().all(|r| r.status == 401));
}

#[tokio::test]
async fn expired_token_then_refresh_rotates_all_tokens_and_the_old_refresh_is_reused() {
    let (h, clock) = start_manual(2).await;
    let c = client();
    let body = turn("hi", "k", false);
    let (access, rt, id_token) = tokens(&h, "sim-acct-1");
    assert_eq!(post(&c, &h, "sim-acct-1", &body).await.status(), 200);

    // Expiry by the sim clock.
    clock.advance(Duration::from_secs(3600));
    let r = post_as(&c, &h, "sim-acct-1", &access, &body).await;
    header(&r, "x-codex-primary-used-percent");
    let (s, v) = answer(r).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("token_expired"))
    );

    // Refresh, form-encoded like Codex's older clients.
    let r = c
        .post(h.oauth_token_url())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "client_id=app_EMoamEEZ73f0CkXaXp7hrann&grant_type=refresh_token&refresh_token={rt}"
        ))
        .send()
        .await
        .unwrap();
    let (s, v) = answer(r).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["token_type"], "Bearer");
    assert_eq!(v["expires_in"], 3600);
    let new_access = v["access_token"].as_str().unwrap();
    assert_ne!(new_access, access);
    assert_ne!(v["refresh_token"].as_str().unwrap(), rt);
    assert_ne!(v["id_token"].as_str().unwrap(), id_token);
    let claims = switchyard::fleet::auth_file::decode_claims(new_access).unwrap();
    assert_eq!(claims.exp, Some(START_MS / 1000 + 3600 + 3600));
    assert_eq!(claims.chatgpt_account_id.as_deref(), Some("sim-acct-1"));
    assert_eq!(h.sim.refresh_count("sim-acct-1"), 1);
    assert_eq!(tokens(&h, "sim-acct-1").0, new_access);
    assert_eq!(
        post_as(&c, &h, "sim-acct-1", new_access, &body)
            .await
            .status(),
        200
    );

    let (s, v) = refresh(&c, &h, &rt).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("refresh_token_reused"))
    );
    let (s, v) = refresh(&c, &h, "rt_made_up").await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("refresh_token_invalidated"))
    );
    assert_eq!(h.sim.refresh_count("sim-acct-1"), 1);

    // Wrong client or grant: 400.
    let current_rt = tokens(&h, "sim-acct-1").1;
    for body in [
        json!({"client_id": "someone-else", "grant_type": "refresh_token", "refresh_token": current_rt}),
        json!({"client_id": "app_EMoamEEZ73f0CkXaXp7hrann", "grant_type": "password", "refresh_token": current_rt}),
    ] {
        let r = c
            .post(h.oauth_token_url())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
    }

    // expire_access_token expires the current token at once; refresh with JSON works too.
    h.sim.expire_access_token("sim-acct-2");
    let (s, v) = answer(post(&c, &h, "sim-acct-2", &body).await).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("token_expired"))
    );
    let (s, v) = refresh(&c, &h, &tokens(&h, "sim-acct-2").1).await;
    assert_eq!(s, 200);
    let a2 = v["access_token"].as_str().unwrap();
    assert_eq!(post_as(&c, &h, "sim-acct-2", a2, &body).await.status(), 200);
}

#[tokio::test]
async fn refresh_fails_fault_fails_the_token_endpoint_n_times() {
    let h = start(1).await;
    let c = client();
    h.sim.push_fault(
        "sim-acct-1",
        Fault::times(FaultKind::RefreshFails { status: 503 }, 2),
    );
    let rt = tokens(&h, "sim-acct-1").1;
    // The fault is not consumed by /responses.
    assert_eq!(
        post(&c, &h, "sim-acct-1", &turn("hi", "k", false))
            .await
            .status(),
        200
    );
    assert_eq!(refresh(&c, &h, &rt).await.0, 503);
    assert_eq!(refresh(&c, &h, &rt).await.0, 503);
    assert_eq!(refresh(&c, &h, &rt).await.0, 200);
    assert_eq!(h.sim.refresh_count("sim-acct-1"), 1);
}

async fn fault_answer(kind: FaultKind) -> (Response, SimHandle) {
    let h = start(1).await;
    h.sim.push_fault("sim-acct-1", Fault::once(kind));
    let r = post(&client(), &h, "sim-acct-1", &turn("hi", "k", true)).await;
    (r, h)
}

#[tokio::test]
async fn quota_fault_is_a_429_usage_limit_and_fills_the_primary_window() {
    let (r, h) = fault_answer(FaultKind::Quota {
        resets_in_seconds: 2700,
    })
    .await;
    assert_eq!(header(&r, "x-codex-active-limit"), "codex");
    assert_eq!(header(&r, "x-codex-primary-used-percent"), "100");
    let (s, v) = answer(r).await;
    assert_eq!(s, 429);
    let e = &v["error"];
    assert_eq!(e["type"], "usage_limit_reached");
    assert_eq!(e["message"], "The usage limit has been reached");
    assert_eq!(e["plan_type"], "plus");
    assert_eq!(e["resets_in_seconds"], 2700);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(e["resets_at"].as_u64().unwrap().abs_diff(now + 2700) <= 5);
    assert_eq!(h.sim.usage("sim-acct-1").unwrap().0, 100.0);
    // The fault is spent, the window is not: it refuses every turn until it resets.
    let c = client();
    let r = post(&c, &h, "sim-acct-1", &turn("hi", "k", true)).await;
    assert_eq!(r.status(), 429);
    let (_, v) = answer(r).await;
    assert_eq!(v["error"]["type"], "usage_limit_reached");
    assert!(h.sim.set_usage("sim-acct-1", 0.0, 0.0));
    let r = post(&c, &h, "sim-acct-1", &turn("hi", "k", true)).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn quota_window_resets_when_the_sim_clock_passes_it() {
    let (h, clock) = start_manual(1).await;
    h.sim.push_fault(
        "sim-acct-1",
        Fault::once(FaultKind::Quota {
            resets_in_seconds: 600,
        }),
    );
    let c = client();
    assert_eq!(
        post(&c, &h, "sim-acct-1", &turn("hi", "k", false))
            .await
            .status(),
        429
    );
    let usage = |c: Client| {
        c.get(h.usage_url())
            .bearer_auth(tokens(&h, "sim-acct-1").0)
            .header("ChatGPT-Account-ID", "sim-acct-1")
            .send()
    };
    let v: Value = usage(c.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(v["rate_limit"]["primary_window"]["used_percent"], 100.0);
    assert_eq!(
        v["rate_limit"]["primary_window"]["reset_after_seconds"],
        600
    );
    assert_eq!(v["rate_limit"]["limit_reached"], true);
    clock.advance(Duration::from_secs(601));
    let v: Value = usage(c).await.unwrap().json().await.unwrap();
    assert_eq!(v["rate_limit"]["primary_window"]["used_percent"], 0.0);
}

#[tokio::test]
async fn burst_server_and_request_error_faults_answer_like_the_backend() {
    let (r, _h) = fault_answer(FaultKind::Burst429 {
        retry_after_secs: 7,
    })
    .await;
    assert_eq!(header(&r, "retry-after"), "7");
    let (s, v) = answer(r).await;
    assert_eq!(s, 429);
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("try again in 7s")
    );

    let (r, _h) = fault_answer(FaultKind::ServerError { status: 503 }).await;
    header(&r, "x-codex-primary-used-percent");
    let (s, v) = answer(r).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (503, Some("server_is_overloaded"))
    );
    let (r, _h) = fault_answer(FaultKind::ServerError { status: 500 }).await;
    assert_eq!(r.status(), 500);

    let (r, _h) = fault_answer(FaultKind::TokenExpired).await;
    let (s, v) = answer(r).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("token_expired"))
    );

    let (r, _h) = fault_answer(FaultKind::ModelUnsupported).await;
    let (s, v) = answer(r).await;
    assert_eq!(s, 400);
    assert_eq!(
        v["detail"],
        "The 'gpt-5.5' model is not supported when using Codex with a ChatGPT account."
    );

    let (r, _h) = fault_answer(FaultKind::ContextLength).await;
    let (s, v) = answer(r).await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "input");
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn cloudflare_fault_is_an_html_challenge_from_the_edge() {
    let (r, _h) = fault_answer(FaultKind::Cloudflare403).await;
    assert_eq!(r.status(), 403);
    assert_eq!(header(&r, "cf-mitigated"), "challenge");
    header(&r, "cf-ray");
    assert!(header(&r, "content-type").starts_with("text/html"));
    assert!(r.headers().get("x-codex-primary-used-percent").is_none());
    let html = r.text().await.unwrap();
    assert!(html.contains("Just a moment...") && html.contains("challenge-platform"));
}

#[tokio::test]
async fn deactivated_account_stays_deactivated() {
    let (r, h) = fault_answer(FaultKind::AccountDeactivated).await;
    let (s, v) = answer(r).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("account_deactivated"))
    );
    let c = client();
    let (s, v) = answer(post(&c, &h, "sim-acct-1", &turn("hi", "k", true)).await).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("account_deactivated"))
    );
    let (s, v) = refresh(&c, &h, &tokens(&h, "sim-acct-1").1).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("refresh_token_invalidated"))
    );
    h.sim.set_deactivated("sim-acct-1", false);
    assert_eq!(
        post(&c, &h, "sim-acct-1", &turn("hi", "k", true))
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn failed_event_fault_streams_created_in_progress_then_response_failed() {
    let (r, _h) = fault_answer(FaultKind::FailedEvent {
        code: "server_is_overloaded".into(),
    })
    .await;
    assert_eq!(r.status(), 200);
    let events = parse_sse_strict(&r.text().await.unwrap());
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
    let resp = &events[2]["response"];
    assert_eq!(resp["status"], "failed");
    assert_eq!(resp["error"]["code"], "server_is_overloaded");
    assert!(resp["error"]["message"].as_str().unwrap().len() > 5);
}

#[tokio::test]
async fn failed_mid_stream_fault_breaks_off_after_its_deltas_with_response_failed() {
    let (r, _h) = fault_answer(FaultKind::FailedMidStream {
        code: "usage_limit_reached".into(),
        after_deltas: 2,
    })
    .await;
    assert_eq!(r.status(), 200);
    let events = parse_sse_strict(&r.text().await.unwrap());
    let kinds = types(&events);
    let deltas = kinds.iter().filter(|k| k.ends_with(".delta")).count();
    assert_eq!(deltas, 2, "{kinds:?}");
    assert_eq!(kinds.last().unwrap(), &"response.failed", "{kinds:?}");
    let last = events.last().unwrap();
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(last["response"]["error"]["code"], "usage_limit_reached");
    // Sequence numbers stay contiguous.
    for (i, ev) in events.iter().enumerate() {
        assert_eq!(ev["sequence_number"], i, "{ev}");
    }
}

#[tokio::test]
async fn reset_before_headers_is_a_client_error_recorded_as_status_0() {
    let h = start(1).await;
    h.sim
        .push_fault("sim-acct-1", Fault::once(FaultKind::ResetBeforeHeaders));
    let c = client();
    let (access, _, _) = tokens(&h, "sim-acct-1");
    let err = c
        .post(format!("{}/responses", h.base_url()))
        .bearer_auth(&access)
        .header("ChatGPT-Account-ID", "sim-acct-1")
        .json(&turn("hi", "k", true))
        .send()
        .await
        .unwrap_err();
    assert!(!err.is_status(), "{err:?}");
    let recorded = h.sim.requests("sim-acct-1");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].status, 0);
    // The next request is answered.
    assert_eq!(
        post(&c, &h, "sim-acct-1", &turn("hi", "k", true))
            .await
            .status(),
        200
    );
}

#[tokio::test]
async fn reset_mid_stream_cuts_the_connection_after_n_deltas() {
    let (r, _h) = fault_answer(FaultKind::ResetMidStream { after_deltas: 3 }).await;
    assert_eq!(r.status(), 200);
    let mut reader = SseReader::new(r);
    let mut seen = Vec::new();
    let err = loop {
        match reader.next().await {
            Ok(Some(ev)) => seen.push(ev),
            Ok(None) => panic!("stream ended cleanly after {:?}", types(&seen)),
            Err(e) => break e,
        }
    };
    assert!(err.is_body() || err.is_decode(), "{err:?}");
    let t = types(&seen);
    assert_eq!(
        t.iter().filter(|x| x.ends_with(".delta")).count(),
        3,
        "{t:?}"
    );
    assert!(!t.contains(&"response.completed"));
}

#[tokio::test]
async fn hang_mid_stream_goes_silent_after_n_deltas() {
    let (r, h) = fault_answer(FaultKind::HangMidStream { after_deltas: 2 }).await;
    let mut reader = SseReader::new(r);
    let mut deltas = 0;
    while deltas < 2 {
        let ev = reader.next().await.unwrap().unwrap();
        if ev["type"].as_str().unwrap().ends_with(".delta") {
            deltas += 1;
        }
    }
    let silent = tokio::time::timeout(Duration::from_millis(300), reader.next()).await;
    assert!(silent.is_err(), "data arrived after the hang: {silent:?}");
    assert_eq!(
        (h.sim.http_open("sim-acct-1"), h.sim.http_cut("sim-acct-1")),
        (1, 0)
    );
    drop(reader);
    // The client gave the answer up: it counts as cut.
    until("the hung answer cut", || async {
        h.sim.http_cut("sim-acct-1") == 1
    })
    .await;
    assert_eq!(h.sim.http_open("sim-acct-1"), 0);
    // The simulator still serves others; an answer read to its end is not cut.
    let r = post(&client(), &h, "sim-acct-1", &turn("hi", "k", true)).await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("response.completed"));
    assert_eq!(
        (h.sim.http_open("sim-acct-1"), h.sim.http_cut("sim-acct-1")),
        (0, 1)
    );
    // The control API shows the same.
    let sim: Value = client()
        .get(format!("{}/sim/accounts", h.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let a = &sim["accounts"][0];
    assert_eq!(
        (a["http_open"].as_u64(), a["http_cut"].as_u64()),
        (Some(0), Some(1)),
        "{a}"
    );
}

#[tokio::test]
async fn slow_faults_delay_headers_or_the_first_delta() {
    let (h, _) = (start(1).await, ());
    let c = client();
    h.sim.push_fault(
        "sim-acct-1",
        Fault::once(FaultKind::SlowHeaders { ms: 250 }),
    );
    let t0 = Instant::now();
    let r = post(&c, &h, "sim-acct-1", &turn("hi", "k", true)).await;
    assert!(t0.elapsed() >= Duration::from_millis(250));
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();

    h.sim.push_fault(
        "sim-acct-1",
        Fault::once(FaultKind::SlowFirstToken { ms: 250 }),
    );
    let r = post(&c, &h, "sim-acct-1", &turn("hi", "k", true)).await;
    let mut reader = SseReader::new(r);
    assert_eq!(
        reader.next().await.unwrap().unwrap()["type"],
        "response.created"
    );
    assert_eq!(
        reader.next().await.unwrap().unwrap()["type"],
        "response.in_progress"
    );
    let t0 = Instant::now();
    loop {
        let ev = reader.next().await.unwrap().unwrap();
        if ev["type"].as_str().unwrap().ends_with(".delta") {
            break;
        }
    }
    assert!(t0.elapsed() >= Duration::from_millis(240));
    while reader.next().await.unwrap().is_some() {}
}

#[tokio::test]
async fn faults_queue_fifo_and_times_counts_down() {
    let h = start(1).await;
    let c = client();
    let id = "sim-acct-1";
    h.sim
        .push_fault(id, Fault::times(FaultKind::ServerError { status: 500 }, 2));
    h.sim.push_fault(
        id,
        Fault::once(FaultKind::Burst429 {
            retry_after_secs: 1,
        }),
    );
    let statuses = async |n: usize| {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(
                post(&c, &h, id, &turn("hi", "k", false))
                    .await
                    .status()
                    .as_u16(),
            );
        }
        out
    };
    assert_eq!(statuses(4).await, [500, 500, 429, 200]);
    assert!(h.sim.faults(id).is_empty());
    h.sim
        .push_fault(id, Fault::always(FaultKind::ServerError { status: 503 }));
    assert_eq!(statuses(3).await, [503, 503, 503]);
    h.sim.clear_faults(id);
    assert_eq!(statuses(1).await, [200]);
    h.sim
        .push_fault(id, Fault::always(FaultKind::ServerError { status: 503 }));
    h.sim.clear_all_faults();
    assert_eq!(statuses(1).await, [200]);
}

#[tokio::test]
async fn requests_are_recorded_per_account_with_headers_and_body() {
    let (h, _clock) = start_manual(2).await;
    let c = client();
    let body = turn("hi", "sess-r", true);
    post(&c, &h, "sim-acct-1", &body)
        .await
        .text()
        .await
        .unwrap();
    post(&c, &h, "sim-acct-2", &body)
        .await
        .text()
        .await
        .unwrap();
    c.get(format!("{}/models?client_version=0.169.0", h.base_url()))
        .bearer_auth(tokens(&h, "sim-acct-1").0)
        .header("ChatGPT-Account-ID", "sim-acct-1")
        .send()
        .await
        .unwrap();
    refresh(&c, &h, &tokens(&h, "sim-acct-2").1).await;

    let r1 = h.sim.requests("sim-acct-1");
    assert_eq!(r1.len(), 1, "only /responses* requests");
    let r = &r1[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/backend-api/codex/responses")
    );
    assert_eq!(r.at_ms, START_MS);
    assert_eq!(r.status, 200);
    assert_eq!(r.account_id.as_deref(), Some("sim-acct-1"));
    assert_eq!(r.headers["chatgpt-account-id"], "sim-acct-1");
    assert_eq!(r.headers["session-id"], "sess-r");
    assert_eq!(r.headers["originator"], "codex_exec");
    assert!(r.headers["authorization"].starts_with("Bearer "));
    assert_eq!(r.body, body);
    assert_eq!(h.sim.requests("sim-acct-2").len(), 1);

    let all = h.sim.all_requests();
    let paths: Vec<&str> = all.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/backend-api/codex/responses",
            "/backend-api/codex/responses",
            "/backend-api/codex/models",
            "/oauth/token"
        ]
    );
    assert_eq!(all[2].query.as_deref(), Some("client_version=0.169.0"));
}

#[tokio::test]
async fn models_and_usage_need_auth_and_follow_the_account() {
    let h = start(2).await;
    let c = client();
    let get = |path: String, id: &'static str, token: String| {
        c.get(path)
            .bearer_auth(token)
            .header("ChatGPT-Account-ID", id)
            .send()
    };
    let models_url = format!("{}/models?client_version=0.169.0", h.base_url());
    let r = get(models_url.clone(), "sim-acct-1", "bad".into())
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = get(models_url.clone(), "sim-acct-1", tokens(&h, "sim-acct-1").0)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let etag = header(&r, "x-models-etag").to_string();
    let v: Value = r.json().await.unwrap();
    let slugs: Vec<&str> = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["slug"].as_str().unwrap())
        .collect();
    assert_eq!(
        slugs,
        [
            "gpt-6.1-sol",
            "gpt-5.5",
            "gpt-5.4",
            "gpt-5.4-mini",
            "gpt-5.3-codex"
        ]
    );
    let m = &v["models"][0];
    assert_eq!(m["visibility"], "list");
    assert_eq!(m["supported_in_api"], true);
    assert_eq!(m["default_reasoning_level"], "medium");
    assert!(m["supported_reasoning_levels"][0]["effort"].is_string());
    assert!(m["context_window"].as_u64().unwrap() > 100_000);

    h.sim
        .set_supported_models("sim-acct-1", vec!["gpt-5.4-mini".into()]);
    let r = get(models_url, "sim-acct-1", tokens(&h, "sim-acct-1").0)
        .await
        .unwrap();
    assert_ne!(header(&r, "x-models-etag"), etag);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["models"].as_array().unwrap().len(), 1);
    let (s, v) = answer(post(&c, &h, "sim-acct-1", &turn("hi", "k", true)).await).await;
    assert_eq!(s, 400);
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("'gpt-5.5' model is not supported")
    );

    h.sim.set_usage("sim-acct-2", 42.5, 7.0);
    let r = get(h.usage_url(), "sim-acct-2", tokens(&h, "sim-acct-2").0)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["plan_type"], "pro");
    let p = &v["rate_limit"]["primary_window"];
    assert_eq!(p["used_percent"], 42.5);
    assert_eq!(p["limit_window_seconds"], 18000);
    assert!(p["reset_at"].as_u64().unwrap() > 0);
    assert_eq!(
        v["rate_limit"]["secondary_window"]["limit_window_seconds"],
        604800
    );
    assert_eq!(v["rate_limit"]["secondary_window"]["used_percent"], 7.0);
    assert_eq!(v["credits"]["has_credits"], false);
    let r = post(&c, &h, "sim-acct-2", &turn("hi", "k", true)).await;
    assert_eq!(header(&r, "x-codex-primary-used-percent"), "42.5");
}

#[tokio::test]
async fn compaction_unary_and_streamed() {
    let h = start(1).await;
    let c = client();
    let r = c
        .post(format!("{}/responses/compact", h.base_url()))
        .bearer_auth(tokens(&h, "sim-acct-1").0)
        .header("ChatGPT-Account-ID", "sim-acct-1")
        .json(&turn("long history", "k", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["output"][0]["type"], "compaction");
    assert!(v["output"][0]["encrypted_content"].is_string());

    let mut body = turn("long history", "k", true);
    body["input"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "compaction_trigger"}));
    let events = parse_sse_strict(
        &post(&c, &h, "sim-acct-1", &body)
            .await
            .text()
            .await
            .unwrap(),
    );
    let done = &events.last().unwrap()["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"].as_array().unwrap().len(), 1);
    assert_eq!(done["output"][0]["type"], "compaction");
}

#[tokio::test]
async fn control_api_steers_the_simulator_over_http() {
    let h = start(2).await;
    let c = client();
    let sim = |p: &str| format!("{}/sim{p}", h.url());
    let v: Value = c
        .get(sim("/accounts"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let accounts = v["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 2);
    assert_eq!(accounts[0]["id"], "sim-acct-1");
    assert_eq!(accounts[0]["email"], "sim1@example.com");
    assert_eq!(accounts[0]["plan"], "plus");
    assert_eq!(accounts[1]["plan"], "pro");

    let auth: Value = c
        .get(sim("/accounts/sim-acct-1/auth"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(auth, h.sim.auth_json("sim-acct-1").unwrap());

    let r = c
        .post(sim("/accounts/sim-acct-1/faults"))
        .json(&json!({"kind": "quota", "resets_in_seconds": 3600, "times": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        h.sim.faults("sim-acct-1"),
        [Fault::once(FaultKind::Quota {
            resets_in_seconds: 3600
        })]
    );
    let v: Value = c
        .get(sim("/accounts"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["accounts"][0]["faults"][0]["kind"], "quota");
    assert_eq!(
        post(&c, &h, "sim-acct-1", &turn("hi", "k", false))
            .await
            .status(),
        429
    );

    c.post(sim("/accounts/sim-acct-2/faults"))
        .json(&json!({"kind": "cloudflare403"}))
        .send()
        .await
        .unwrap();
    let r = c
        .delete(sim("/accounts/sim-acct-2/faults"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(h.sim.faults("sim-acct-2").is_empty());
    c.post(sim("/accounts/sim-acct-2/faults"))
        .json(&json!({"kind": "reset_mid_stream", "after_deltas": 2}))
        .send()
        .await
        .unwrap();
    c.delete(sim("/faults")).send().await.unwrap();
    assert!(h.sim.faults("sim-acct-2").is_empty());
    let r = c
        .post(sim("/accounts/sim-acct-2/faults"))
        .json(&json!({"kind": "no_such_fault"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    let r = c
        .put(sim("/accounts/sim-acct-2/usage"))
        .json(&json!({"primary_used_percent": 80.0, "secondary_used_percent": 20.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(h.sim.usage("sim-acct-2"), Some((80.0, 20.0)));

    c.post(sim("/accounts/sim-acct-2/expire-token"))
        .send()
        .await
        .unwrap();
    let (s, v) = answer(post(&c, &h, "sim-acct-2", &turn("hi", "k", false)).await).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("token_expired"))
    );

    let v: Value = c
        .get(sim("/accounts/sim-acct-1/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["requests"].as_array().unwrap().len(), 1);
    assert_eq!(v["requests"][0]["status"], 429);
    let v: Value = c
        .get(sim("/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["requests"].as_array().unwrap().len(), 2);

    for (method, path) in [
        (reqwest::Method::GET, "/accounts/sim-acct-9/auth"),
        (reqwest::Method::POST, "/accounts/nope/faults"),
        (reqwest::Method::DELETE, "/accounts/nope/faults"),
    ] {
        let r = c.request(method, sim(path)).send().await.unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("unknown account")
        );
    }
}

#[tokio::test]
async fn written_auth_files_are_importable_by_the_gateway() {
    use std::os::unix::fs::PermissionsExt;
    let h = start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let paths = h.sim.write_auth_files(&dir.path().join("auth")).unwrap();
    assert_eq!(paths.len(), 3);
    for (n, path) in paths.iter().enumerate() {
        let n = n + 1;
        assert_eq!(
            path.file_name().unwrap(),
            format!("sim-acct-{n}.json").as_str()
        );
        let mode = std::fs::metadata(path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let parsed = switchyard::fleet::auth_file::parse(&std::fs::read(path).unwrap(), 0).unwrap();
        assert_eq!(parsed.chatgpt_account_id, format!("sim-acct-{n}"));
        assert_eq!(
            parsed.chatgpt_user_id.as_deref(),
            Some(format!("sim-user-{n}").as_str())
        );
        assert_eq!(
            parsed.email.as_deref(),
            Some(format!("sim{n}@example.com").as_str())
        );
        let plan = if n % 2 == 1 { "plus" } else { "pro" };
        assert_eq!(parsed.plan.as_deref(), Some(plan));
        assert_eq!(
            parsed.secrets.access_token.expose(),
            tokens(&h, &format!("sim-acct-{n}")).0
        );
        assert!(parsed.secrets.access_expires_at.unwrap() > 1_700_000_000);
    }
    // The imported tokens work against the simulator.
    let v: Value = serde_json::from_slice(&std::fs::read(&paths[0]).unwrap()).unwrap();
    let access = v["tokens"]["access_token"].as_str().unwrap();
    let r = post_as(&client(), &h, "sim-acct-1", access, &turn("hi", "k", true)).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn demo_profile_is_a_deterministic_schedule() {
    assert_eq!(Profile::from_name("demo"), Some(Profile::Demo));
    assert_eq!(Profile::from_name("HEALTHY"), Some(Profile::Healthy));
    assert_eq!(Profile::from_name("nope"), None);
    for p in Profile::ALL {
        assert_eq!(Profile::from_name(p.name()), Some(p));
    }
    let h = Sim::start(SimOptions {
        accounts: 4,
        profile: Some(Profile::Demo),
        ..SimOptions::default()
    })
    .await
    .unwrap();
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..7 {
        let r = post(&c, &h, "sim-acct-1", &turn("hi", "k", false)).await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let r = post(&c, &h, "sim-acct-2", &turn("hi", "k", false)).await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 200, 200, 200, 429]);
    // Account 3 drops every 3rd stream mid-way.
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let r = post(&c, &h, "sim-acct-3", &turn("hi", "k", true)).await;
        outcomes.push(r.text().await.is_ok());
    }
    assert_eq!(outcomes, [true, true, false]);
    let r = post(&c, &h, "sim-acct-4", &turn("hi", "k", true)).await;
    assert!(r.text().await.unwrap().contains("response.completed"));
}

#[tokio::test]
async fn stop_closes_the_listener() {
    let h = start(1).await;
    let c = client();
    assert_eq!(
        post(&c, &h, "sim-acct-1", &turn("hi", "k", false))
            .await
            .status(),
        200
    );
    h.stop();
    // Once the accept loop has seen the cancellation, new connections are refused; poll the
    // real signal (a refused connect) rather than sleeping a guessed amount.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = client();
        match fresh.get(format!("{}/sim/accounts", h.url())).send().await {
            Err(e) if e.is_connect() => break,
            _ if Instant::now() > deadline => panic!("still accepting after stop"),
            _ => tokio::task::yield_now().await,
        }
    }
}

/// Codex sends zstd bodies under ChatGPT auth: the simulated backend reads them, and a
/// workspace access token is answered by whoami and accepted as a bearer.
#[tokio::test]
async fn the_backend_reads_a_zstd_body_and_knows_its_workspace_tokens() {
    use switchyard::upstream::encoding::samples::zstd_stored;
    let h = start(1).await;
    let c = client();
    let plain = serde_json::to_vec(&turn("squeezed", "sess-z", true)).unwrap();
    let r = c
        .post(format!("{}/responses", h.base_url()))
        .bearer_auth(access(&h, "sim-acct-1"))
        .header("chatgpt-account-id", "sim-acct-1")
        .header("content-type", "application/json")
        .header("content-encoding", "zstd")
        .body(zstd_stored(&plain))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("response.completed"));
    let got = h.sim.requests("sim-acct-1");
    assert_eq!(
        got.last().unwrap().body["input"][0]["content"][0]["text"],
        "squeezed"
    );

    let token = h
        .sim
        .workspace_token("sim-acct-1", Duration::from_secs(60))
        .unwrap();
    assert!(token.starts_with("at-"));
    let whoami = format!("{}/api/accounts/v1/user-auth-credential/whoami", h.url());
    let (s, v) = answer(c.get(&whoami).bearer_auth(&token).send().await.unwrap()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["chatgpt_account_id"], "sim-acct-1");
    assert_eq!(v["chatgpt_account_is_fedramp"], false);
    let (s, _) = answer(
        c.get(&whoami)
            .bearer_auth("at-nobody")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 401);
    let r = post_as(
        &c,
        &h,
        "sim-acct-1",
        &token,
        &turn("with a token", "sess-t", true),
    )
    .await;
    assert_eq!(r.status(), 200);
    h.sim.expire_access_token("sim-acct-1");
    let (s, v) = answer(c.get(&whoami).bearer_auth(&token).send().await.unwrap()).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("token_expired"))
    );
}

/// Reset credits as the Codex source's backend client speaks them: listed with their expiry,
/// counted in the usage, spent by the soonest to expire on a spent account, once per redeem
/// id, never when nothing is spent, and refused server-side on a single-window account.
#[tokio::test]
async fn reset_credits_are_listed_spent_once_per_redeem_id_and_refused_on_a_single_window() {
    let h = start(2).await;
    let c = client();
    let wham = format!("{}/backend-api/wham", h.url());
    let control = |path: &str| format!("{}/sim/accounts/{path}", h.url());
    let ask = |method: reqwest::Method, path: &str, id: &str, body: Option<Value>| {
        let mut r = c
            .request(method, format!("{wham}/{path}"))
            .bearer_auth(access(&h, id))
            .header("ChatGPT-Account-ID", id);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let resp = r.send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let consume = |id: &'static str, redeem: &str| {
        let body = json!({"redeem_request_id": redeem});
        ask(
            reqwest::Method::POST,
            "rate-limit-reset-credits/consume",
            id,
            Some(body),
        )
    };
    let list = |id: &'static str| ask(reqwest::Method::GET, "rate-limit-reset-credits", id, None);
    let usage_of = |id: &'static str| ask(reqwest::Method::GET, "usage", id, None);
    // Two credits: the later one first, the sooner one second.
    for secs in [2 * 86_400, 86_400] {
        let granted = c
            .post(control("sim-acct-1/credits"))
            .json(&json!({"expires_in_secs": secs}))
            .send()
            .await
            .unwrap();
        assert_eq!(granted.status(), 200);
    }
    let (status, listed) = list("sim-acct-1").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["available_count"], 2);
    let credits = listed["credits"].as_array().unwrap();
    let sooner = credits
        .iter()
        .min_by_key(|c| c["expires_at"].as_str().unwrap().to_string())
        .unwrap()["id"]
        .clone();
    assert!(
        credits
            .iter()
            .all(|c| c["status"] == "available" && c["reset_type"] == "codex_rate_limits")
    );
    let (_, usage) = usage_of("sim-acct-1").await;
    assert_eq!(usage["rate_limit_reset_credits"]["available_count"], 2);
    // Nothing spent: nothing to reset, and no credit goes.
    let (_, nothing) = consume("sim-acct-1", "r-0").await;
    assert_eq!(nothing["code"], "nothing_to_reset", "{nothing}");
    // Spent: the soonest credit resets both windows, once per redeem id.
    h.sim.set_usage("sim-acct-1", 100.0, 100.0);
    let (status, reset) = consume("sim-acct-1", "r-1").await;
    assert_eq!(
        (status, reset["code"].as_str()),
        (200, Some("reset")),
        "{reset}"
    );
    assert_eq!(reset["windows_reset"], 2);
    assert_eq!(reset["credit"]["id"], sooner);
    assert_eq!(h.sim.usage("sim-acct-1"), Some((0.0, 0.0)));
    h.sim.set_usage("sim-acct-1", 100.0, 0.0);
    let (_, again) = consume("sim-acct-1", "r-1").await;
    assert_eq!(again["code"], "already_redeemed", "{again}");
    let (_, listed) = list("sim-acct-1").await;
    assert_eq!(
        listed["available_count"], 1,
        "the repeat spent nothing: {listed}"
    );
    // No credit left on the other account; a single-window account fails server-side.
    let (_, none) = consume("sim-acct-2", "r-2").await;
    assert_eq!(none["code"], "no_credit", "{none}");
    c.put(control("sim-acct-1/single-window"))
        .json(&json!({"single_window": true}))
        .send()
        .await
        .unwrap();
    let (_, usage) = usage_of("sim-acct-1").await;
    assert_eq!(
        usage["rate_limit"]["secondary_window"],
        Value::Null,
        "{usage}"
    );
    let (status, failed) = consume("sim-acct-1", "r-3").await;
    assert_eq!(status, 500, "{failed}");
    let (_, listed) = list("sim-acct-1").await;
    assert_eq!(listed["available_count"], 1, "nothing spent: {listed}");
}
