//! The simulator's auth server side of `switchyard account login`, over real sockets: device-code
//! login (protocol §J1) with every poll answer, browser PKCE login (§J2), the
//! `authorization_code` grant, the refresh of the family a login starts, and the controls that
//! play the user, in Rust and over HTTP.

use std::time::Duration;

use crate::common::sim::{CLIENT_ID, START_MS, answer, client, refresh, start_manual};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchyard::fleet::auth_file::decode_claims;
use switchyard::sim::{
    AuthorizeAnswer, DEVICE_REDIRECT_URI, DeviceCodeState, LoginControlError, SimHandle,
};

const CALLBACK: &str = "http://localhost:1455/auth/callback";

/// `POST /api/accounts/deviceauth/usercode` as Codex sends it.
async fn usercode(c: &Client, h: &SimHandle) -> (StatusCode, Value) {
    let r = c
        .post(format!("{}/api/accounts/deviceauth/usercode", h.url()))
        .json(&json!({"client_id": CLIENT_ID}))
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// The `(device_auth_id, user_code)` of a new device code.
async fn new_code(c: &Client, h: &SimHandle) -> (String, String) {
    let (s, v) = usercode(c, h).await;
    assert_eq!(s, 200, "{v}");
    (
        v["device_auth_id"].as_str().unwrap().to_string(),
        v["user_code"].as_str().unwrap().to_string(),
    )
}

async fn poll(c: &Client, h: &SimHandle, id: &str, code: &str) -> (StatusCode, Value) {
    let r = c
        .post(format!("{}/api/accounts/deviceauth/token", h.url()))
        .json(&json!({"device_auth_id": id, "user_code": code}))
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// The `error.code` of a 403 poll answer.
async fn poll_403(c: &Client, h: &SimHandle, id: &str, code: &str) -> String {
    let (s, v) = poll(c, h, id, code).await;
    assert_eq!(s, 403, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    v["error"]["code"].as_str().unwrap().to_string()
}

/// `grant_type=authorization_code`, form-encoded like Codex.
async fn exchange(
    c: &Client,
    h: &SimHandle,
    code: &str,
    redirect_uri: &str,
    verifier: &str,
) -> (StatusCode, Value) {
    let form = [
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", redirect_uri),
        ("client_id", CLIENT_ID),
        ("code_verifier", verifier),
    ];
    let body: Vec<String> = form
        .iter()
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect();
    let r = c
        .post(h.oauth_token_url())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.join("&"))
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// A turn on `/responses` with this access token.
async fn turn_status(c: &Client, h: &SimHandle, account: &str, access: &str) -> u16 {
    c.post(format!("{}/responses", h.base_url()))
        .bearer_auth(access)
        .header("ChatGPT-Account-ID", account)
        .json(&json!({"model": "gpt-5.5", "input": "hi", "stream": false}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

fn s256(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// The claims of a token answer's id_token: (email, account, plan, user).
fn identity(tokens: &Value) -> (String, String, String, String) {
    let c = decode_claims(tokens["id_token"].as_str().unwrap()).unwrap();
    (
        c.email.unwrap(),
        c.chatgpt_account_id.unwrap(),
        c.plan.unwrap(),
        c.chatgpt_user_id.unwrap(),
    )
}

#[tokio::test]
async fn device_login_approved_as_an_account_gives_a_new_family_that_refreshes() {
    let (h, clock) = start_manual(2).await;
    let c = client();

    let (s, v) = usercode(&c, &h).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["interval"], "5", "a string of digits, as Codex parses it");
    assert_eq!(v["expires_at"], "2026-01-01T00:15:00+00:00");
    let id = v["device_auth_id"].as_str().unwrap();
    let code = v["user_code"].as_str().unwrap();
    assert!(id.starts_with("deviceauth_"), "{id}");
    assert!(
        code.len() == 10
            && code.as_bytes()[4] == b'-'
            && code
                .chars()
                .all(|ch| ch == '-' || ch.is_ascii_uppercase() || ch.is_ascii_digit()),
        "{code}"
    );
    let listed = tokio::time::timeout(Duration::from_secs(5), h.sim.wait_device_codes(1))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].device_auth_id.as_str(),
            listed[0].user_code.as_str()
        ),
        (id, code)
    );
    assert_eq!(listed[0].state, DeviceCodeState::Pending);
    assert_eq!(listed[0].expires_at_ms, START_MS + 15 * 60 * 1000);

    assert_eq!(
        poll_403(&c, &h, id, code).await,
        "deviceauth_authorization_pending"
    );
    let approved = h.sim.approve_device_code(code, "sim-acct-2").unwrap();
    assert_eq!(approved.state, DeviceCodeState::Approved);
    assert_eq!(approved.account_id.as_deref(), Some("sim-acct-2"));

    clock.advance(Duration::from_secs(5));
    let (s, grant) = poll(&c, &h, id, code).await;
    assert_eq!(s, 200, "{grant}");
    let auth_code = grant["authorization_code"].as_str().unwrap();
    let verifier = grant["code_verifier"].as_str().unwrap();
    assert_eq!(grant["code_challenge"], s256(verifier));
    assert!(verifier.len() >= 43, "{verifier}");

    let (s, tokens) = exchange(&c, &h, auth_code, DEVICE_REDIRECT_URI, verifier).await;
    assert_eq!(s, 200, "{tokens}");
    assert_eq!(tokens["expires_in"], 3600);
    assert_eq!(
        identity(&tokens),
        (
            "sim2@example.com".into(),
            "sim-acct-2".into(),
            "pro".into(),
            "sim-user-2".into()
        )
    );
    let access = tokens["access_token"].as_str().unwrap();
    let login_rt = tokens["refresh_token"].as_str().unwrap();
    let (old_access, old_rt) = {
        let auth = h.sim.auth_json("sim-acct-2").unwrap();
        let t = &auth["tokens"];
        (
            t["access_token"].as_str().unwrap().to_string(),
            t["refresh_token"].as_str().unwrap().to_string(),
        )
    };
    assert_ne!(login_rt, old_rt, "a login starts a new family");
    assert_eq!(turn_status(&c, &h, "sim-acct-2", access).await, 200);
    // Expiring the auth.json's access token leaves the login's alone.
    assert!(h.sim.expire_access_token("sim-acct-2"));
    assert_eq!(turn_status(&c, &h, "sim-acct-2", &old_access).await, 401);
    assert_eq!(turn_status(&c, &h, "sim-acct-2", access).await, 200);

    // The new family rotates on its own; the auth.json family stays valid next to it.
    let (s, rotated) = refresh(&c, &h, login_rt).await;
    assert_eq!(s, 200, "{rotated}");
    assert_eq!(identity(&rotated).1, "sim-acct-2");
    let rotated_rt = rotated["refresh_token"].as_str().unwrap();
    assert_ne!(rotated_rt, login_rt);
    let (s, v) = refresh(&c, &h, login_rt).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("refresh_token_reused"))
    );
    let (s, v) = refresh(&c, &h, &old_rt).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(h.sim.refresh_count("sim-acct-2"), 2);

    // Revoking the login's family ends its tokens only.
    assert!(h.sim.revoke_family("sim-acct-2", login_rt));
    assert!(!h.sim.revoke_family("sim-acct-1", rotated_rt));
    let (s, v) = refresh(&c, &h, rotated_rt).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("refresh_token_invalidated"))
    );
    let rotated_access = rotated["access_token"].as_str().unwrap();
    assert_eq!(turn_status(&c, &h, "sim-acct-2", rotated_access).await, 401);
    let current = h.sim.auth_json("sim-acct-2").unwrap();
    let (s, v) = refresh(&c, &h, current["tokens"]["refresh_token"].as_str().unwrap()).await;
    assert_eq!(s, 200, "{v}");

    // The login is recorded: what was sent, when, and what it got.
    let recorded: Vec<_> = h
        .sim
        .all_requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/api/accounts/deviceauth/") || r.path == "/oauth/token")
        .collect();
    let seen: Vec<(&str, u16, u64)> = recorded
        .iter()
        .take(4)
        .map(|r| (r.path.as_str(), r.status, r.at_ms))
        .collect();
    assert_eq!(
        seen,
        [
            ("/api/accounts/deviceauth/usercode", 200, START_MS),
            ("/api/accounts/deviceauth/token", 403, START_MS),
            ("/api/accounts/deviceauth/token", 200, START_MS + 5000),
            ("/oauth/token", 200, START_MS + 5000),
        ]
    );
    assert_eq!(recorded[0].body, json!({"client_id": CLIENT_ID}));
    assert_eq!(
        recorded[1].body,
        json!({"device_auth_id": id, "user_code": code})
    );
    assert_eq!(recorded[3].body["grant_type"], "authorization_code");
    assert_eq!(recorded[3].body["code"], auth_code);
    assert_eq!(recorded[3].body["redirect_uri"], DEVICE_REDIRECT_URI);
    assert_eq!(recorded[3].body["code_verifier"], verifier);
}

#[tokio::test]
async fn polling_sooner_than_the_interval_or_after_the_control_is_slow_down() {
    let (h, clock) = start_manual(1).await;
    let c = client();
    let (id, code) = new_code(&c, &h).await;
    assert_eq!(
        poll_403(&c, &h, &id, &code).await,
        "deviceauth_authorization_pending"
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(poll_403(&c, &h, &id, &code).await, "slow_down");
    // The gap counts from the previous poll, the too-early one included.
    clock.advance(Duration::from_secs(4));
    assert_eq!(poll_403(&c, &h, &id, &code).await, "slow_down");
    clock.advance(Duration::from_secs(5));
    assert_eq!(
        poll_403(&c, &h, &id, &code).await,
        "deviceauth_authorization_pending"
    );

    // One slow_down per control call, even at the right pace.
    h.sim.slow_down_device_code(&code).unwrap();
    h.sim.slow_down_device_code(&code).unwrap();
    for expected in ["slow_down", "slow_down", "deviceauth_authorization_pending"] {
        clock.advance(Duration::from_secs(5));
        assert_eq!(poll_403(&c, &h, &id, &code).await, expected);
    }
    assert_eq!(h.sim.device_codes()[0].polls, 7);

    // Interval "0": polls may come back to back.
    h.sim.set_device_interval(0);
    let (s, v) = usercode(&c, &h).await;
    assert_eq!((s.as_u16(), v["interval"].as_str()), (200, Some("0")));
    let (id0, code0) = (
        v["device_auth_id"].as_str().unwrap(),
        v["user_code"].as_str().unwrap(),
    );
    for _ in 0..3 {
        assert_eq!(
            poll_403(&c, &h, id0, code0).await,
            "deviceauth_authorization_pending"
        );
    }
    // The first code keeps the interval it was issued with.
    assert_eq!(poll_403(&c, &h, &id, &code).await, "slow_down");
}

#[tokio::test]
async fn denied_device_code_answers_access_denied_and_cannot_be_approved() {
    let (h, clock) = start_manual(1).await;
    let c = client();
    let (id, code) = new_code(&c, &h).await;
    let denied = h.sim.deny_device_code(&code).unwrap();
    assert_eq!(denied.state, DeviceCodeState::Denied);
    let (s, v) = poll(&c, &h, &id, &code).await;
    assert_eq!(s, 403);
    assert_eq!(
        v,
        json!({"error": {"code": "access_denied",
            "message": "The user denied the device authorization."}})
    );
    assert_eq!(
        h.sim.approve_device_code(&code, "sim-acct-1"),
        Err(LoginControlError::NotPending(DeviceCodeState::Denied))
    );
    // Still denied after its lifetime: only a pending code expires.
    clock.advance(Duration::from_secs(3600));
    assert_eq!(poll_403(&c, &h, &id, &code).await, "access_denied");
}

#[tokio::test]
async fn device_code_expires_after_its_lifetime_or_by_control() {
    let (h, clock) = start_manual(1).await;
    let c = client();
    h.sim.set_device_lifetime(Duration::from_secs(60));
    h.sim.set_device_interval(1);
    let (s, v) = usercode(&c, &h).await;
    assert_eq!(s, 200);
    assert_eq!(v["interval"], "1");
    assert_eq!(v["expires_at"], "2026-01-01T00:01:00+00:00");
    let (id, code) = (
        v["device_auth_id"].as_str().unwrap(),
        v["user_code"].as_str().unwrap(),
    );
    clock.advance(Duration::from_secs(59));
    assert_eq!(
        poll_403(&c, &h, id, code).await,
        "deviceauth_authorization_pending"
    );
    clock.advance(Duration::from_secs(1));
    let (s, v) = poll(&c, &h, id, code).await;
    assert_eq!(s, 403);
    assert_eq!(
        v,
        json!({"error": {"code": "deviceauth_expired",
            "message": "The device authorization code expired."}})
    );
    assert_eq!(h.sim.device_codes()[0].state, DeviceCodeState::Expired);
    assert_eq!(
        h.sim.approve_device_code(code, "sim-acct-1"),
        Err(LoginControlError::NotPending(DeviceCodeState::Expired))
    );

    let (id, code) = new_code(&c, &h).await;
    assert_eq!(
        poll_403(&c, &h, &id, &code).await,
        "deviceauth_authorization_pending"
    );
    h.sim.expire_device_code(&code).unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(poll_403(&c, &h, &id, &code).await, "deviceauth_expired");
}

#[tokio::test]
async fn unknown_device_codes_and_clients_are_refused() {
    let (h, _clock) = start_manual(1).await;
    let c = client();
    let (id, code) = new_code(&c, &h).await;
    for (pair_id, pair_code) in [(id.as_str(), "ZZZZ-ZZZZZ"), ("deviceauth_nope", &code)] {
        let (s, v) = poll(&c, &h, pair_id, pair_code).await;
        assert_eq!(s, 404, "{v}");
        assert!(v["error"]["code"].as_str().is_some());
    }
    for body in [json!({"client_id": "someone-else"}), json!({})] {
        let r = c
            .post(format!("{}/api/accounts/deviceauth/usercode", h.url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        let (s, v) = answer(r).await;
        assert_eq!(
            (s.as_u16(), v["error"]["code"].as_str()),
            (400, Some("invalid_client"))
        );
    }
    assert_eq!(h.sim.device_codes().len(), 1);
    assert_eq!(
        h.sim.approve_device_code(&code, "sim-acct-9"),
        Err(LoginControlError::UnknownAccount("sim-acct-9".into()))
    );
    assert_eq!(
        h.sim.deny_device_code("ZZZZ-ZZZZZ"),
        Err(LoginControlError::UnknownUserCode("ZZZZ-ZZZZZ".into()))
    );
}

/// A device code approved as `account` and polled: (authorization_code, code_verifier).
async fn approved_grant(c: &Client, h: &SimHandle, account: &str) -> (String, String) {
    let (id, code) = new_code(c, h).await;
    h.sim.approve_device_code(&code, account).unwrap();
    let (s, g) = poll(c, h, &id, &code).await;
    assert_eq!(s, 200, "{g}");
    (
        g["authorization_code"].as_str().unwrap().to_string(),
        g["code_verifier"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn wrong_verifier_redirect_or_a_reused_code_is_invalid_grant() {
    let (h, clock) = start_manual(2).await;
    let c = client();
    let (code, verifier) = approved_grant(&c, &h, "sim-acct-1").await;
    let invalid_grant = |(s, v): (StatusCode, Value)| {
        assert_eq!(s, 400, "{v}");
        assert_eq!(v["error"], "invalid_grant");
        v["error_description"].as_str().unwrap().to_string()
    };

    let wrong = "x".repeat(86);
    let d = invalid_grant(exchange(&c, &h, &code, DEVICE_REDIRECT_URI, &wrong).await);
    assert!(d.contains("code_verifier"), "{d}");
    let d = invalid_grant(exchange(&c, &h, &code, CALLBACK, &verifier).await);
    assert!(d.contains("redirect_uri"), "{d}");
    // A failed attempt does not spend the code; the issuer's own callback is accepted.
    let issuer_callback = format!("{}/deviceauth/callback", h.url());
    let (s, v) = exchange(&c, &h, &code, &issuer_callback, &verifier).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(identity(&v).1, "sim-acct-1");
    let d = invalid_grant(exchange(&c, &h, &code, DEVICE_REDIRECT_URI, &verifier).await);
    assert!(d.contains("already been used"), "{d}");
    invalid_grant(exchange(&c, &h, "ac_made_up", DEVICE_REDIRECT_URI, &verifier).await);

    // An authorization code not exchanged in time.
    let (code, verifier) = approved_grant(&c, &h, "sim-acct-2").await;
    clock.advance(Duration::from_secs(600));
    let d = invalid_grant(exchange(&c, &h, &code, DEVICE_REDIRECT_URI, &verifier).await);
    assert!(d.contains("expired"), "{d}");

    // Missing fields are a malformed request; the refresh grant is untouched by all this.
    let r = c
        .post(h.oauth_token_url())
        .json(&json!({"client_id": CLIENT_ID, "grant_type": "authorization_code", "code": code}))
        .send()
        .await
        .unwrap();
    let (s, v) = answer(r).await;
    assert_eq!(
        (s.as_u16(), v["error"].as_str()),
        (400, Some("invalid_request"))
    );
    assert_eq!(h.sim.refresh_count("sim-acct-1"), 0);
}

/// A query parameter; `None` leaves it out.
type Param<'a> = (&'a str, Option<&'a str>);

/// `GET /oauth/authorize` with Codex's parameters, `overrides` replacing or (value `None`)
/// removing some. Returns the 302's `Location` or the error answer.
async fn authorize(
    c: &Client,
    h: &SimHandle,
    challenge: &str,
    overrides: &[Param<'_>],
) -> Result<String, (StatusCode, Value)> {
    let mut params = vec![
        ("response_type", Some("code")),
        ("client_id", Some(CLIENT_ID)),
        ("redirect_uri", Some(CALLBACK)),
        ("scope", Some("openid profile email offline_access")),
        ("code_challenge", Some(challenge)),
        ("code_challenge_method", Some("S256")),
        ("id_token_add_organizations", Some("true")),
        ("codex_cli_simplified_flow", Some("true")),
        ("state", Some("st-4/2+=")),
        ("originator", Some("codex_cli_rs")),
    ];
    for (k, v) in overrides {
        match params.iter_mut().find(|(name, _)| name == k) {
            Some(p) => p.1 = *v,
            None => params.push((k, *v)),
        }
    }
    let query: Vec<String> = params
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
        .collect();
    let r = c
        .get(format!("{}/oauth/authorize?{}", h.url(), query.join("&")))
        .send()
        .await
        .unwrap();
    if r.status() == StatusCode::FOUND {
        return Ok(r.headers()["location"].to_str().unwrap().to_string());
    }
    Err(answer(r).await)
}

/// The query of a redirect `Location`, decoded.
fn redirect_params(location: &str) -> Vec<(String, String)> {
    let (base, query) = location.split_once('?').unwrap();
    assert_eq!(base, CALLBACK);
    query
        .split('&')
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap();
            (decode(k), decode(v))
        })
        .collect()
}

#[tokio::test]
async fn browser_authorize_redirects_with_code_and_state_then_the_code_exchanges() {
    let (h, _clock) = start_manual(2).await;
    let c = client();
    let verifier = URL_SAFE_NO_PAD.encode([7u8; 64]);
    let challenge = s256(&verifier);

    // By default the user logs in as the first account.
    let location = authorize(&c, &h, &challenge, &[]).await.unwrap();
    let params = redirect_params(&location);
    let keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["code", "state"]);
    assert_eq!(params[1].1, "st-4/2+=");
    let code = &params[0].1;
    let d = exchange(&c, &h, code, DEVICE_REDIRECT_URI, &verifier).await;
    assert_eq!(
        (d.0.as_u16(), d.1["error"].as_str()),
        (400, Some("invalid_grant")),
        "the browser code is bound to its own redirect"
    );
    let (s, tokens) = exchange(&c, &h, code, CALLBACK, &verifier).await;
    assert_eq!(s, 200, "{tokens}");
    assert_eq!(
        identity(&tokens),
        (
            "sim1@example.com".into(),
            "sim-acct-1".into(),
            "plus".into(),
            "sim-user-1".into()
        )
    );
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(turn_status(&c, &h, "sim-acct-1", access).await, 200);
    let (s, v) = refresh(&c, &h, tokens["refresh_token"].as_str().unwrap()).await;
    assert_eq!(s, 200, "{v}");

    // As the account the control names, on the other registered port, without state.
    h.sim
        .set_authorize_answer(AuthorizeAnswer::Approve {
            account_id: "sim-acct-2".into(),
        })
        .unwrap();
    let other = "http://localhost:1457/auth/callback";
    let location = authorize(
        &c,
        &h,
        &challenge,
        &[("redirect_uri", Some(other)), ("state", None)],
    )
    .await
    .unwrap();
    let (base, query) = location.split_once('?').unwrap();
    assert_eq!(base, other);
    let code = query.strip_prefix("code=").unwrap();
    assert!(!code.contains('&'), "{location}");
    let (s, tokens) = exchange(&c, &h, code, other, &verifier).await;
    assert_eq!(s, 200, "{tokens}");
    assert_eq!(identity(&tokens).1, "sim-acct-2");

    let recorded = h.sim.all_requests();
    let authorizes: Vec<_> = recorded
        .iter()
        .filter(|r| r.path == "/oauth/authorize")
        .collect();
    assert_eq!(authorizes.len(), 2);
    assert_eq!(authorizes[0].method, "GET");
    assert_eq!(authorizes[0].status, 302);
    assert!(
        authorizes[0]
            .query
            .as_deref()
            .unwrap()
            .contains("code_challenge_method=S256")
    );
}

#[tokio::test]
async fn browser_authorize_denied_redirects_with_access_denied_and_state() {
    let (h, _clock) = start_manual(1).await;
    let c = client();
    let challenge = s256("a-verifier-of-the-client-that-is-long-enough-1234");
    h.sim
        .set_authorize_answer(AuthorizeAnswer::Deny {
            error_description: "missing_codex_entitlement: Codex is not enabled".into(),
        })
        .unwrap();
    let location = authorize(&c, &h, &challenge, &[]).await.unwrap();
    assert_eq!(
        redirect_params(&location),
        [
            ("error".to_string(), "access_denied".to_string()),
            (
                "error_description".to_string(),
                "missing_codex_entitlement: Codex is not enabled".to_string()
            ),
            ("state".to_string(), "st-4/2+=".to_string()),
        ]
    );
    h.sim.set_authorize_answer(AuthorizeAnswer::deny()).unwrap();
    let params = redirect_params(&authorize(&c, &h, &challenge, &[]).await.unwrap());
    assert_eq!(params[0].1, "access_denied");
    assert!(!params[1].1.is_empty());
    assert_eq!(
        h.sim.set_authorize_answer(AuthorizeAnswer::Approve {
            account_id: "sim-acct-7".into()
        }),
        Err(LoginControlError::UnknownAccount("sim-acct-7".into()))
    );
}

#[tokio::test]
async fn browser_authorize_without_s256_or_with_bad_parameters_is_400() {
    let (h, _clock) = start_manual(1).await;
    let c = client();
    let challenge = s256("a-verifier-of-the-client-that-is-long-enough-1234");
    let cases: [(&[Param], &str); 7] = [
        (&[("code_challenge_method", None)], "invalid_request"),
        (
            &[("code_challenge_method", Some("plain"))],
            "invalid_request",
        ),
        (&[("code_challenge", None)], "invalid_request"),
        (&[("code_challenge", Some("too-short"))], "invalid_request"),
        (&[("client_id", Some("someone-else"))], "invalid_client"),
        (&[("response_type", Some("token"))], "invalid_request"),
        (
            &[("redirect_uri", Some("http://localhost:9999/auth/callback"))],
            "invalid_request",
        ),
    ];
    for (overrides, error) in cases {
        let (s, v) = authorize(&c, &h, &challenge, overrides)
            .await
            .expect_err("refused");
        assert_eq!(s, 400, "{overrides:?}: {v}");
        assert_eq!(v["error"], error, "{overrides:?}");
        assert!(v["error_description"].as_str().is_some());
    }
    assert!(h.sim.all_requests().iter().all(|r| r.status == 400));
}

#[tokio::test]
async fn login_controls_work_over_http() {
    let (h, clock) = start_manual(2).await;
    let c = client();
    let sim = |p: &str| format!("{}/sim/login{p}", h.url());
    let send = |r: reqwest::RequestBuilder| async move { answer(r.send().await.unwrap()).await };

    let (s, v) = send(
        c.put(sim("/device-settings"))
            .json(&json!({"interval_secs": 1})),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v, json!({"interval_secs": 1, "lifetime_secs": 900}));
    let (s, v) = send(
        c.put(sim("/device-settings"))
            .json(&json!({"lifetime_secs": 30})),
    )
    .await;
    assert_eq!((s.as_u16(), v["lifetime_secs"].as_u64()), (200, Some(30)));
    let (s, _) = send(
        c.put(sim("/device-settings"))
            .json(&json!({"interval": "1"})),
    )
    .await;
    assert_eq!(s, 400);

    let (id, code) = new_code(&c, &h).await;
    let (_, v) = send(c.get(sim("/device-codes"))).await;
    let listed = &v["device_codes"][0];
    assert_eq!(listed["user_code"], code.as_str());
    assert_eq!(listed["device_auth_id"], id.as_str());
    assert_eq!(listed["state"], "pending");
    assert_eq!(listed["interval_secs"], 1);
    assert_eq!(listed["expires_at_ms"], START_MS + 30_000);

    let (s, v) = send(c.post(sim(&format!("/device-codes/{code}/slow-down")))).await;
    assert_eq!((s.as_u16(), v["state"].as_str()), (200, Some("pending")));
    assert_eq!(poll_403(&c, &h, &id, &code).await, "slow_down");
    let (s, v) = send(
        c.post(sim(&format!("/device-codes/{code}/approve")))
            .json(&json!({"account_id": "sim-acct-2"})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "approved");
    assert_eq!(v["account_id"], "sim-acct-2");
    clock.advance(Duration::from_secs(1));
    assert_eq!(poll(&c, &h, &id, &code).await.0, 200);
    let (s, v) = send(c.post(sim(&format!("/device-codes/{code}/deny")))).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (409, Some("conflict"))
    );
    let (s, v) = send(c.post(sim(&format!("/device-codes/{code}/expire")))).await;
    assert_eq!((s.as_u16(), v["state"].as_str()), (200, Some("expired")));
    let (s, _) = send(c.post(sim("/device-codes/ZZZZ-ZZZZZ/deny"))).await;
    assert_eq!(s, 404);
    let (s, _) = send(c.get(sim(&format!("/device-codes/{code}/deny")))).await;
    assert_eq!(s, 405);

    let (id, code) = new_code(&c, &h).await;
    let (s, v) = send(c.post(sim(&format!("/device-codes/{code}/deny")))).await;
    assert_eq!((s.as_u16(), v["state"].as_str()), (200, Some("denied")));
    assert_eq!(poll_403(&c, &h, &id, &code).await, "access_denied");
    let (s, _) = send(
        c.post(sim(&format!("/device-codes/{code}/approve")))
            .json(&json!({"account_id": "sim-acct-2"})),
    )
    .await;
    assert_eq!(s, 409);

    let (_, v) = send(c.get(sim("/authorize"))).await;
    assert_eq!(v, json!({"answer": "approve", "account_id": "sim-acct-1"}));
    let (s, v) = send(c.put(sim("/authorize")).json(&json!({"answer": "deny"}))).await;
    assert_eq!(s, 200);
    assert_eq!(v["answer"], "deny");
    assert!(v["error_description"].as_str().is_some());
    assert!(matches!(
        h.sim.authorize_answer(),
        AuthorizeAnswer::Deny { .. }
    ));
    let (s, _) = send(
        c.put(sim("/authorize"))
            .json(&json!({"answer": "approve", "account_id": "sim-acct-9"})),
    )
    .await;
    assert_eq!(s, 404);
    let (s, v) = send(
        c.put(sim("/authorize"))
            .json(&json!({"answer": "approve", "account_id": "sim-acct-2"})),
    )
    .await;
    assert_eq!(
        (s.as_u16(), v["account_id"].as_str()),
        (200, Some("sim-acct-2"))
    );

    // Revoking one refresh family over HTTP.
    let old_rt = h.sim.auth_json("sim-acct-1").unwrap()["tokens"]["refresh_token"]
        .as_str()
        .unwrap()
        .to_string();
    let revoke = |account: &str, rt: &str| {
        c.post(format!("{}/sim/accounts/{account}/revoke-family", h.url()))
            .json(&json!({"refresh_token": rt}))
    };
    assert_eq!(send(revoke("sim-acct-2", &old_rt)).await.0, 404);
    let (s, v) = send(revoke("sim-acct-1", &old_rt)).await;
    assert_eq!((s, v), (StatusCode::OK, json!({"revoked": true})));
    let (s, v) = refresh(&c, &h, &old_rt).await;
    assert_eq!(
        (s.as_u16(), v["error"]["code"].as_str()),
        (401, Some("refresh_token_invalidated"))
    );
}
