//! `POST /oauth/token`: the refresh grant of protocol §G, with rotating refresh tokens, and
//! the `authorization_code` grant of the logins (§J1 step 4, in `login`).

use hyper::Method;
use serde_json::{Map, Value, json};

use super::Sim;
use super::faults::{Endpoint, FaultKind};
use super::server::{Outcome, SimRequest, json};
use super::state::RefreshLookup;
use crate::base::urlcode;

/// Codex CLI's OAuth client id.
pub const CLIENT_ID: &str = "app_EMoamEEZ73f0CkXaXp7hrann";

fn error(status: u16, code: &str, message: &str) -> Outcome {
    json(
        status,
        &json!({"error": {"code": code, "message": message}}),
    )
    .into()
}

/// `GET /api/accounts/v1/user-auth-credential/whoami` with an access token as the bearer: the
/// account it belongs to, as Codex validates a workspace's access token.
pub(crate) fn whoami(sim: &Sim, req: &SimRequest) -> Outcome {
    if req.method != Method::GET {
        return json(405, &json!({"detail": "Method Not Allowed"})).into();
    }
    let Some(token) = super::backend::bearer(req) else {
        return error(401, "missing_authorization", "Missing bearer token.");
    };
    let now = sim.now_secs();
    let st = sim.lock();
    let Some(account) = st.accounts.iter().find(|a| a.owns_access(token)) else {
        return error(401, "invalid_token", "The access token is not valid.");
    };
    if let Err(failure) = account.check_access(token, now) {
        return match failure {
            super::state::AuthFailure::Expired => {
                error(401, "token_expired", "The access token has expired.")
            }
            _ => error(
                401,
                "token_invalidated",
                "The access token is no longer valid.",
            ),
        };
    }
    let spec = &account.spec;
    json(
        200,
        &json!({
            "email": spec.email,
            "chatgpt_user_id": spec.chatgpt_user_id,
            "chatgpt_account_id": spec.chatgpt_account_id,
            "chatgpt_plan_type": spec.plan,
            "chatgpt_account_is_fedramp": false,
        }),
    )
    .into()
}

pub(crate) fn handle(sim: &Sim, req: &SimRequest) -> Outcome {
    if req.method != Method::POST {
        return json(405, &json!({"detail": "Method Not Allowed"})).into();
    }
    let params = match params(req) {
        Some(p) => p,
        None => {
            return error(
                400,
                "invalid_request",
                "The body must be JSON or form-encoded.",
            );
        }
    };
    let get = |k: &str| params.get(k).and_then(Value::as_str).unwrap_or("");
    if get("client_id") != CLIENT_ID {
        return error(400, "invalid_client", "Unknown or missing client_id.");
    }
    match get("grant_type") {
        "refresh_token" => {}
        "authorization_code" => return super::login::exchange(sim, req, &params),
        _ => {
            return error(
                400,
                "unsupported_grant_type",
                "Only grant_type=refresh_token or authorization_code is supported here.",
            );
        }
    }
    let token = get("refresh_token");
    if token.is_empty() {
        return error(400, "invalid_request", "refresh_token is required.");
    }
    let now = sim.now_secs();
    let ttl = sim.ttl_secs();
    let nonce = sim.nonce().to_string();
    let mut st = sim.lock();
    match st.lookup_refresh(token) {
        RefreshLookup::Invalidated => error(
            401,
            "refresh_token_invalidated",
            "Your refresh token has been invalidated. Please try signing in again.",
        ),
        RefreshLookup::Reused(_) => error(
            401,
            "refresh_token_reused",
            "Your refresh token has already been used to generate a new access token. \
             Please try signing in again.",
        ),
        RefreshLookup::Current(idx, family) => {
            let Some(account) = st.accounts.get_mut(idx) else {
                return error(500, "server_error", "account vanished");
            };
            match account.take_fault(Endpoint::Refresh) {
                Some(FaultKind::RefreshFails { status }) => {
                    let code = match status {
                        400 => "invalid_grant",
                        401 => "refresh_token_expired",
                        429 => "rate_limit_exceeded",
                        _ => "temporarily_unavailable",
                    };
                    return error(status, code, "The token endpoint failed (simulated).");
                }
                Some(FaultKind::RefreshChallenge) => {
                    return super::backend::respond(
                        super::faults::cloudflare(&nonce),
                        None,
                        now,
                        &nonce,
                    )
                    .into();
                }
                Some(FaultKind::RefreshError { status, code }) => {
                    return json(
                        status,
                        &json!({"error": code, "error_description": "The token endpoint refused the request (simulated)."}),
                    )
                    .into();
                }
                _ => {}
            }
            if account.deactivated {
                return error(
                    401,
                    "refresh_token_invalidated",
                    "The account behind this refresh token has been deactivated.",
                );
            }
            json(200, &account.rotate(family, now, ttl, &nonce)).into()
        }
    }
}

/// The parameters of a JSON or form-encoded body.
pub(crate) fn params(req: &SimRequest) -> Option<Map<String, Value>> {
    if let Value::Object(m) = &req.json {
        return Some(m.clone());
    }
    let text = std::str::from_utf8(&req.body).ok()?;
    let mut m = Map::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(
            urlcode::decode(k, true)?,
            Value::String(urlcode::decode(v, true)?),
        );
    }
    Some(m)
}
