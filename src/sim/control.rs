//! `/sim/*`: the control API (JSON) that scripts and the demo use to steer the simulator
//! over HTTP. Same operations as the [`Sim`] methods.
//!
//! Login controls (the simulated user of `login`), under `/sim/login/`:
//! - `GET device-codes` → `{"device_codes": [DeviceCode…]}`, oldest first;
//! - `POST device-codes/{user_code}/approve` `{"account_id": …}`, `…/deny`, `…/expire`,
//!   `…/slow-down` → the code (404 unknown code or account, 409 not pending);
//! - `GET|PUT device-settings` `{"interval_secs"?: u64, "lifetime_secs"?: u64}` → the settings
//!   for new codes;
//! - `GET|PUT authorize` `{"answer": "approve", "account_id": …}` or `{"answer": "deny",
//!   "error_description"?: …}` → how `/oauth/authorize` answers.
//!
//! And `POST /sim/accounts/{id}/revoke-family` `{"refresh_token": …}` ends that one refresh
//! family (404 if the token is none of the account's).

use hyper::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::server::{Outcome, SimRequest, json};
use super::{AuthorizeAnswer, Fault, LoginControlError, Sim};

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

fn login_error(e: LoginControlError) -> Outcome {
    let (status, code) = match e {
        LoginControlError::UnknownUserCode(_) | LoginControlError::UnknownAccount(_) => {
            (404, "not_found")
        }
        LoginControlError::NotPending(_) => (409, "conflict"),
    };
    json(
        status,
        &json!({"error": {"code": code, "message": e.to_string()}}),
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
struct CreditsBody {
    #[serde(default = "one")]
    count: u32,
    /// Default 30 days, as the real credits.
    #[serde(default = "thirty_days")]
    expires_in_secs: u64,
}

fn one() -> u32 {
    1
}

fn thirty_days() -> u64 {
    30 * 86_400
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SingleWindowBody {
    single_window: bool,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    account_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceSettingsBody {
    interval_secs: Option<u64>,
    lifetime_secs: Option<u64>,
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
        ["sink"] if m == Method::GET => ok(json!({"received": sim.sink()})),
        ["sink", "fail"] if m == Method::POST => {
            let times = req.json["times"].as_u64().unwrap_or(1);
            sim.fail_sink(u32::try_from(times).unwrap_or(u32::MAX));
            ok(json!({"failing": times}))
        }
        ["accounts", id, rest @ ..] => account_route(sim, req, id, rest),
        ["login", rest @ ..] => login_route(sim, req, rest),
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
        ["credits"] if m == Method::POST => match parse::<CreditsBody>(req) {
            Ok(b) => {
                let ids = sim.grant_credits(
                    id,
                    b.count,
                    std::time::Duration::from_secs(b.expires_in_secs),
                );
                ok(json!({"granted": ids, "credits": sim.reset_credits(id)}))
            }
            Err(e) => bad_request(e),
        },
        ["credits"] if m == Method::GET => ok(sim.reset_credits(id).unwrap_or(Value::Null)),
        ["single-window"] if m == Method::PUT => match parse::<SingleWindowBody>(req) {
            Ok(b) => {
                sim.set_single_window(id, b.single_window);
                ok(json!({"single_window": b.single_window}))
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
        | ["credits"]
        | ["single-window"]
        | ["requests"] => method_not_allowed(),
        _ => not_found("path"),
    }
}

fn login_route(sim: &Sim, req: &SimRequest, rest: &[&str]) -> Outcome {
    let m = &req.method;
    let answered = |r: Result<super::DeviceCode, LoginControlError>| match r {
        Ok(code) => ok(json!(code)),
        Err(e) => login_error(e),
    };
    match rest {
        ["device-codes"] if m == Method::GET => ok(json!({"device_codes": sim.device_codes()})),
        ["device-codes", code, "approve"] if m == Method::POST => match parse::<ApproveBody>(req) {
            Ok(b) => answered(sim.approve_device_code(code, &b.account_id)),
            Err(e) => bad_request(e),
        },
        ["device-codes", code, "deny"] if m == Method::POST => answered(sim.deny_device_code(code)),
        ["device-codes", code, "expire"] if m == Method::POST => {
            answered(sim.expire_device_code(code))
        }
        ["device-codes", code, "slow-down"] if m == Method::POST => {
            answered(sim.slow_down_device_code(code))
        }
        ["device-settings"] if m == Method::GET => ok(json!(sim.device_settings())),
        ["device-settings"] if m == Method::PUT => match parse::<DeviceSettingsBody>(req) {
            Ok(b) => {
                if let Some(secs) = b.interval_secs {
                    sim.set_device_interval(secs);
                }
                if let Some(secs) = b.lifetime_secs {
                    sim.set_device_lifetime(std::time::Duration::from_secs(secs));
                }
                ok(json!(sim.device_settings()))
            }
            Err(e) => bad_request(e),
        },
        ["authorize"] if m == Method::GET => ok(json!(sim.authorize_answer())),
        ["authorize"] if m == Method::PUT => match parse::<AuthorizeAnswer>(req) {
            Ok(a) => match sim.set_authorize_answer(a) {
                Ok(()) => ok(json!(sim.authorize_answer())),
                Err(e) => login_error(e),
            },
            Err(e) => bad_request(e),
        },
        ["device-codes"]
        | [
            "device-codes",
            _,
            "approve" | "deny" | "expire" | "slow-down",
        ]
        | ["device-settings"]
        | ["authorize"] => method_not_allowed(),
        _ => not_found("path"),
    }
}
