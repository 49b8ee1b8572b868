//! `/sim/*`: the control API (JSON) that scripts and the demo use to steer the simulator
//! over HTTP. Same operations as the [`Sim`] methods.
//!
//! `POST /sim/accounts/{id}/revoke-family` `{"refresh_token": …}` ends that one refresh
//! family (404 if the token is none of the account's).

use hyper::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::server::{Outcome, SimRequest, json};
use super::{Fault, Sim};

fn not_found(what: &str) -> Outcome {
    json(
        404,
        &json!({"error": {"code": "not_found", "message": format!("unknown {what}")}}),
    )
    .into()
}

fn bad_request(message: String) -> Outcome {
    json(
        400,
        &json!({"error": {"code": "invalid_request", "message": message}}),
    )
    .into()
}

fn ok(v: Value) -> Outcome {
    json(200, &v).into()
}

fn method_not_allowed() -> Outcome {
    json(
        405,
        &json!({"error": {"code": "method_not_allowed", "message": "method not allowed"}}),
    )
    .into()
}

fn parse<T: for<'de> Deserialize<'de>>(req: &SimRequest) -> Result<T, String> {
    serde_json::from_slice(&req.body).map_err(|e| format!("bad JSON body: {e}"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageBody {
    primary_used_percent: f64,
    secondary_used_percent: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelsBody {
    models: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeactivatedBody {
    deactivated: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RevokeFamilyBody {
    refresh_token: String,
}

pub(crate) fn handle(sim: &Sim, req: &SimRequest) -> Outcome {
    let segments: Vec<&str> = req
        .path
        .trim_start_matches("/sim")
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let m = &req.method;
    match segments.as_slice() {
        ["accounts"] if m == Method::GET => ok(sim.accounts_snapshot()),
        ["requests"] if m == Method::GET => ok(json!({"requests": sim.all_requests()})),
        ["faults"] if m == Method::DELETE => {
            sim.clear_all_faults();
            ok(json!({"cleared": true}))
        }
        ["accounts", id, rest @ ..] => account_route(sim, req, id, rest),
        ["accounts"] | ["requests"] | ["faults"] => method_not_allowed(),
        _ => not_found("path"),
    }
}

fn account_route(sim: &Sim, req: &SimRequest, id: &str, rest: &[&str]) -> Outcome {
    if !sim.account_ids().iter().any(|a| a == id) {
        return not_found(&format!("account {id}"));
    }
    let m = &req.method;
    match rest {
        [] if m == Method::GET => ok(sim.account_snapshot(id).unwrap_or(Value::Null)),
        ["auth"] if m == Method::GET => ok(sim.auth_json(id).unwrap_or(Value::Null)),
        ["faults"] if m == Method::POST => match parse::<Fault>(req) {
            Ok(f) => {
                sim.push_fault(id, f);
                ok(json!({"faults": sim.faults(id)}))
            }
            Err(e) => bad_request(e),
        },
        ["faults"] if m == Method::GET => ok(json!({"faults": sim.faults(id)})),
        ["faults"] if m == Method::DELETE => {
            sim.clear_faults(id);
            ok(json!({"faults": []}))
        }
        ["expire-token"] if m == Method::POST => {
            sim.expire_access_token(id);
            ok(json!({"expired": true}))
        }
        ["revoke-tokens"] if m == Method::POST => {
            sim.revoke_tokens(id);
            ok(sim.auth_json(id).unwrap_or(Value::Null))
        }
        ["revoke-family"] if m == Method::POST => match parse::<RevokeFamilyBody>(req) {
            Ok(b) if sim.revoke_family(id, &b.refresh_token) => ok(json!({"revoked": true})),
            Ok(_) => not_found(&format!("refresh token of {id}")),
            Err(e) => bad_request(e),
        },
        ["usage"] if m == Method::PUT => match parse::<UsageBody>(req) {
            Ok(u) => {
                sim.set_usage(id, u.primary_used_percent, u.secondary_used_percent);
                ok(sim.account_snapshot(id).unwrap_or(Value::Null))
            }
            Err(e) => bad_request(e),
        },
        ["models"] if m == Method::PUT => match parse::<ModelsBody>(req) {
            Ok(b) => {
                sim.set_supported_models(id, b.models);
                ok(sim.account_snapshot(id).unwrap_or(Value::Null))
            }
            Err(e) => bad_request(e),
        },
        ["deactivated"] if m == Method::PUT => match parse::<DeactivatedBody>(req) {
            Ok(b) => {
                sim.set_deactivated(id, b.deactivated);
                ok(sim.account_snapshot(id).unwrap_or(Value::Null))
            }
            Err(e) => bad_request(e),
        },
        ["requests"] if m == Method::GET => ok(json!({"requests": sim.requests(id)})),
        []
        | ["auth"]
        | ["faults"]
        | ["expire-token"]
        | ["revoke-tokens"]
        | ["revoke-family"]
        | ["usage"]
        | ["models"]
        | ["deactivated"]
        | ["requests"] => method_not_allowed(),
        _ => not_found("path"),
    }
}
