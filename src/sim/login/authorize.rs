//! Browser PKCE login (protocol §J2): `GET /oauth/authorize` answered at once by the
//! simulated user, and the `authorization_code` grant of `POST /oauth/token` that both login
//! flows end with (§J1 step 4).

use hyper::Method;
use serde_json::{Map, Value, json};

use super::super::Sim;
use super::super::oauth::CLIENT_ID;
use super::super::server::{Outcome, SimRequest, full, json, set_header};
use super::{AuthorizeAnswer, REDIRECT_URIS, Redirect};
use crate::base::urlcode;

/// `{"error", "error_description"}`, the OAuth shape.
fn oauth_error(status: u16, error: &str, description: &str) -> Outcome {
    json(
        status,
        &json!({"error": error, "error_description": description}),
    )
    .into()
}

/// An S256 challenge: base64url without padding of 32 bytes, i.e. 43 characters.
fn is_s256_challenge(s: &str) -> bool {
    s.len() == 43
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `GET /oauth/authorize?response_type=code&client_id=…&redirect_uri=…&code_challenge=…&
/// code_challenge_method=S256&state=…` (other parameters are ignored): 302 to the redirect
/// with `code` and `state`, or with `error=access_denied`. Bad parameters are a 400 page,
/// since the redirect itself cannot be trusted then.
pub(crate) fn authorize(sim: &Sim, req: &SimRequest) -> Outcome {
    if req.method != Method::GET {
        return json(405, &json!({"detail": "Method Not Allowed"})).into();
    }
    let mut q = Map::new();
    for pair in req.query.as_deref().unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if let (Some(k), Some(v)) = (urlcode::decode(k, true), urlcode::decode(v, true)) {
            q.entry(k).or_insert(Value::String(v));
        }
    }
    let get = |k: &str| q.get(k).and_then(Value::as_str);
    let bad = |d: &str| oauth_error(400, "invalid_request", d);
    if get("client_id") != Some(CLIENT_ID) {
        return oauth_error(400, "invalid_client", "Unknown or missing client_id.");
    }
    if get("response_type") != Some("code") {
        return bad("response_type must be code.");
    }
    let Some(redirect_uri) = get("redirect_uri").filter(|r| REDIRECT_URIS.contains(r)) else {
        return bad("redirect_uri is missing or not registered for this client.");
    };
    if get("code_challenge_method") != Some("S256") {
        return bad("code_challenge_method must be S256.");
    }
    let Some(challenge) = get("code_challenge").filter(|c| is_s256_challenge(c)) else {
        return bad("code_challenge must be a base64url SHA-256 (43 characters).");
    };
    let mut answer = match sim.authorize_answer() {
        AuthorizeAnswer::Approve { account_id } => {
            let now = sim.now_ms();
            let code = sim.lock().logins.issue_code(
                &account_id,
                challenge,
                Redirect::Exact(redirect_uri.to_string()),
                now,
                sim.nonce(),
            );
            vec![("code", code)]
        }
        AuthorizeAnswer::Deny { error_description } => vec![
            ("error", "access_denied".to_string()),
            ("error_description", error_description),
        ],
    };
    if let Some(state) = get("state") {
        answer.push(("state", state.to_string()));
    }
    let query: Vec<String> = answer
        .iter()
        .map(|(k, v)| format!("{k}={}", urlcode::encode(v)))
        .collect();
    let mut r = full(302, "text/html; charset=utf-8", "");
    set_header(
        &mut r,
        "location",
        &format!("{redirect_uri}?{}", query.join("&")),
    );
    r.into()
}

/// The `authorization_code` grant (client id already checked): `code`, `redirect_uri` and
/// `code_verifier` must match the code; success is a new refresh family of its account.
pub(crate) fn exchange(sim: &Sim, req: &SimRequest, params: &Map<String, Value>) -> Outcome {
    let get = |k: &str| params.get(k).and_then(Value::as_str).unwrap_or("");
    let (code, redirect_uri, verifier) = (get("code"), get("redirect_uri"), get("code_verifier"));
    if code.is_empty() || redirect_uri.is_empty() || verifier.is_empty() {
        return oauth_error(
            400,
            "invalid_request",
            "code, redirect_uri and code_verifier are required.",
        );
    }
    let issuer_callback = req
        .header("host")
        .map(|host| format!("http://{host}/deviceauth/callback"));
    let (now_ms, now, ttl) = (sim.now_ms(), sim.now_secs(), sim.ttl_secs());
    let mut st = sim.lock();
    let account_id = match st.logins.redeem(
        code,
        redirect_uri,
        verifier,
        issuer_callback.as_deref(),
        now_ms,
    ) {
        Ok(a) => a,
        Err(e) => return oauth_error(400, "invalid_grant", e.description()),
    };
    match st.account_mut(&account_id) {
        Some(a) => json(200, &a.login(now, ttl, sim.nonce())).into(),
        None => oauth_error(400, "invalid_grant", "The account no longer exists."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_43_character_base64url_challenge_is_s256() {
        assert!(is_s256_challenge(
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        ));
        assert!(!is_s256_challenge(
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw+cM"
        ));
        assert!(!is_s256_challenge("plain-verifier"));
    }
}
