//! The simulated backend on its own, for the simulator's tests: one started on the real clock
//! or on a manual one, a client for it, its accounts' tokens, and the refresh Codex sends.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use reqwest::{Client, Response, StatusCode, redirect};
use serde_json::{Value, json};
use switchyard::base::clock::{ManualClock, SharedClock};
use switchyard::sim::{Sim, SimHandle, SimOptions};

/// Where a manual clock starts (2026-01-01T00:00:00Z).
pub const START_MS: u64 = 1_767_225_600_000;

/// The OAuth client id Codex sends.
pub const CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";

/// A client for the simulator. Redirects are not followed: a 302 of `/oauth/authorize` is
/// the answer under test.
pub fn client() -> Client {
    // reqwest is built without a default TLS provider; plain http needs none, but building a
    // client does.
    switchyard::upstream::install_crypto_provider();
    Client::builder()
        .no_proxy()
        .redirect(redirect::Policy::none())
        .build()
        .unwrap()
}

/// A simulator with `accounts` accounts on the real clock.
pub async fn start(accounts: u32) -> SimHandle {
    Sim::start(SimOptions {
        accounts,
        ..SimOptions::default()
    })
    .await
    .unwrap()
}

/// A simulator whose clock starts at [`START_MS`] and moves only when the test moves it.
pub async fn start_manual(accounts: u32) -> (SimHandle, ManualClock) {
    let clock = ManualClock::new(START_MS);
    let shared: SharedClock = std::sync::Arc::new(clock.clone());
    let h = Sim::start(SimOptions {
        accounts,
        clock: shared,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    (h, clock)
}

/// The account's current (access, refresh, id) tokens.
pub fn tokens(h: &SimHandle, id: &str) -> (String, String, String) {
    let v = h.sim.auth_json(id).unwrap();
    let t = &v["tokens"];
    (
        t["access_token"].as_str().unwrap().to_string(),
        t["refresh_token"].as_str().unwrap().to_string(),
        t["id_token"].as_str().unwrap().to_string(),
    )
}

/// The account's current access token.
pub fn access(h: &SimHandle, id: &str) -> String {
    tokens(h, id).0
}

/// An answer's status and JSON body.
pub async fn answer(r: Response) -> (StatusCode, Value) {
    let s = r.status();
    (s, r.json().await.unwrap())
}

/// `grant_type=refresh_token` as Codex sends it.
pub async fn refresh(c: &Client, h: &SimHandle, rt: &str) -> (StatusCode, Value) {
    let r = c
        .post(h.oauth_token_url())
        .json(
            &json!({"client_id": CLIENT_ID, "grant_type": "refresh_token",
            "refresh_token": rt, "scope": "openid profile email"}),
        )
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// The `type` of each event or frame.
pub fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}
