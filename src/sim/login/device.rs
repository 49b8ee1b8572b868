//! Device-code login (protocol §J1 steps 1 and 3): `POST /api/accounts/deviceauth/usercode`
//! issues a code, `POST /api/accounts/deviceauth/token` is polled until the user (a control)
//! has answered.

use hyper::Method;
use serde_json::{Value, json};

use super::super::Sim;
use super::super::oauth::{CLIENT_ID, params};
use super::super::server::{Outcome, SimRequest, json};
use super::{PollAnswer, error};

fn method_not_allowed() -> Outcome {
    json(405, &json!({"detail": "Method Not Allowed"})).into()
}

/// RFC 3339 with `+00:00`, as the real `expires_at` is written.
fn expires_at(unix_ms: u64) -> String {
    let t = crate::base::clock::rfc3339(unix_ms / 1000);
    match t.strip_suffix('Z') {
        Some(base) => format!("{base}+00:00"),
        None => t,
    }
}

/// `POST /api/accounts/deviceauth/usercode`, `{"client_id": …}`.
pub(crate) fn usercode(sim: &Sim, req: &SimRequest) -> Outcome {
    if req.method != Method::POST {
        return method_not_allowed();
    }
    let client_id = params(req).and_then(|p| {
        p.get("client_id")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    if client_id.as_deref() != Some(CLIENT_ID) {
        return error(400, "invalid_client", "Unknown or missing client_id.");
    }
    let now = sim.now_ms();
    let code = sim.lock().logins.issue_device_code(now, sim.nonce());
    sim.device_code_issued();
    json(
        200,
        &json!({
            "device_auth_id": code.device_auth_id,
            "user_code": code.user_code,
            // A string of digits: Codex parses nothing else.
            "interval": code.interval_secs.to_string(),
            "expires_at": expires_at(code.expires_at_ms),
        }),
    )
    .into()
}

/// `POST /api/accounts/deviceauth/token`, `{"device_auth_id": …, "user_code": …}`.
pub(crate) fn poll(sim: &Sim, req: &SimRequest) -> Outcome {
    if req.method != Method::POST {
        return method_not_allowed();
    }
    let p = params(req).unwrap_or_default();
    let get = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("");
    let (id, user_code) = (get("device_auth_id"), get("user_code"));
    if id.is_empty() || user_code.is_empty() {
        return error(
            400,
            "invalid_request",
            "device_auth_id and user_code are required.",
        );
    }
    let now = sim.now_ms();
    let answer = sim.lock().logins.poll(id, user_code, now);
    match answer {
        None => error(
            404,
            "deviceauth_not_found",
            "Unknown device authorization id or user code.",
        ),
        Some(PollAnswer::SlowDown) => error(
            403,
            "slow_down",
            "Polling too often: wait the interval between polls.",
        ),
        Some(PollAnswer::Pending) => error(
            403,
            "deviceauth_authorization_pending",
            "The user has not yet authorized this device.",
        ),
        Some(PollAnswer::Denied) => error(
            403,
            "access_denied",
            "The user denied the device authorization.",
        ),
        Some(PollAnswer::Expired) => error(
            403,
            "deviceauth_expired",
            "The device authorization code expired.",
        ),
        Some(PollAnswer::Approved(g)) => json(
            200,
            &json!({
                "authorization_code": g.authorization_code,
                "code_challenge": g.code_challenge,
                "code_verifier": g.code_verifier,
            }),
        )
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::expires_at;

    #[test]
    fn expires_at_is_written_with_an_explicit_offset() {
        assert_eq!(expires_at(1_782_607_134_999), "2026-06-28T00:38:54+00:00");
    }
}
