//! `/backend-api/*`: authentication like the real backend, faults, and the answers of
//! `/codex/responses`, `/codex/responses/compact`, `/codex/models` and `/wham/usage`.

use std::time::Duration;

use hyper::{Method, Response};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::Sim;
use super::catalog;
use super::faults::{self, Cut, Endpoint, ErrorAnswer, FaultKind, StreamShape};
use super::profile::scripted_fault;
use super::responses::{self, Plan, TurnSpec};
use super::server::{Outcome, Reply, SimBody, SimRequest, full, json, set_header, steps};
use super::state::{Account, AuthFailure, State};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Responses,
    Compact,
    Models,
    Usage,
}

/// Session headers, in the order the backend derives prompt-cache affinity from them.
const SESSION_HEADERS: [&str; 4] = ["session-id", "session_id", "thread-id", "conversation_id"];

pub(crate) fn handle(sim: &Sim, req: &SimRequest) -> Outcome {
    let route = match req.path.as_str() {
        "/backend-api/codex/responses" => Route::Responses,
        "/backend-api/codex/responses/compact" => Route::Compact,
        "/backend-api/codex/models" => Route::Models,
        "/backend-api/wham/usage" => Route::Usage,
        _ => return json(404, &json!({"detail": "Not Found"})).into(),
    };
    let method = match route {
        Route::Models | Route::Usage => Method::GET,
        Route::Responses | Route::Compact => Method::POST,
    };
    if req.method != method {
        return json(405, &json!({"detail": "Method Not Allowed"})).into();
    }
    let now = sim.now_secs();
    let mut st = sim.lock();
    let ray = cf_ray(sim, &mut st);
    let idx = match authenticate(&st, req, now) {
        Ok(idx) => idx,
        Err((answer, idx)) => {
            let account = idx.and_then(|i| st.accounts.get(i));
            return respond(answer, account, now, &ray).into();
        }
    };
    let id = st.next_id();
    let Some(account) = st.accounts.get_mut(idx) else {
        return json(500, &json!({"detail": "account vanished"})).into();
    };
    account.roll_windows(now);
    match route {
        Route::Models => {
            let (body, etag) = catalog::models(account);
            let mut r = json(200, &body);
            decorate(&mut r, account, now, &ray);
            set_header(&mut r, "x-models-etag", &etag);
            r.into()
        }
        Route::Usage => {
            let mut r = json(200, &catalog::usage(account, now));
            decorate(&mut r, account, now, &ray);
            r.into()
        }
        Route::Responses | Route::Compact => {
            let ctx = Ctx {
                nonce: sim.nonce(),
                now,
                id,
                ray: &ray,
                compact: route == Route::Compact,
            };
            responses_route(account, req, &ctx)
        }
    }
}

struct Ctx<'a> {
    nonce: &'a str,
    now: u64,
    id: u64,
    ray: &'a str,
    compact: bool,
}

/// The account a request authenticates as, or the 401 to answer (with the account, when the
/// token was one of its own, so the answer carries its rate-limit headers).
fn authenticate(
    st: &State,
    req: &SimRequest,
    now: u64,
) -> Result<usize, (ErrorAnswer, Option<usize>)> {
    let token = req
        .header("authorization")
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err((faults::token_invalidated("missing bearer token"), None));
    };
    let idx = match req.header("chatgpt-account-id") {
        Some(id) => st
            .index_of(id)
            .ok_or_else(|| (faults::token_invalidated("unknown account"), None))?,
        None => st
            .owner_of_access(token)
            .ok_or_else(|| (faults::token_invalidated("unknown token"), None))?,
    };
    let account = st
        .accounts
        .get(idx)
        .ok_or_else(|| (faults::token_invalidated("unknown account"), None))?;
    match account.check_access(token, now) {
        Ok(()) => Ok(idx),
        Err(AuthFailure::Invalidated) => Err((
            faults::token_invalidated("not a token of this account"),
            None,
        )),
        Err(AuthFailure::Expired) => Err((faults::token_expired(), Some(idx))),
        Err(AuthFailure::Deactivated) => Err((faults::account_deactivated(), Some(idx))),
    }
}

fn cf_ray(sim: &Sim, st: &mut State) -> String {
    let n = st.next_id();
    let mut h = Sha256::new();
    h.update(sim.nonce().as_bytes());
    h.update(n.to_le_bytes());
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{hex}-SJC")
}

/// Headers every backend answer carries; the rate-limit ones when the account is known.
fn decorate(r: &mut Response<SimBody>, account: &Account, now: u64, ray: &str) {
    for (name, value) in catalog::rate_limit_headers(account, now) {
        set_header(r, name, &value);
    }
    set_header(r, "cf-ray", ray);
}

fn respond(a: ErrorAnswer, account: Option<&Account>, now: u64, ray: &str) -> Response<SimBody> {
    let mut r = full(a.status, a.content_type, a.body);
    match account {
        Some(account) if a.from_backend => decorate(&mut r, account, now, ray),
        _ => set_header(&mut r, "cf-ray", ray),
    }
    if !a.from_backend {
        set_header(&mut r, "server", "cloudflare");
    }
    for (name, value) in &a.headers {
        set_header(&mut r, name, value);
    }
    r
}

/// The HTTP error a failure code becomes when there is no stream to carry `response.failed`.
fn unary_failure(code: &str) -> ErrorAnswer {
    let (status, kind) = match code {
        "context_length_exceeded" => (400, "invalid_request_error"),
        "rate_limit_exceeded" | "insufficient_quota" | "usage_not_included" => {
            (429, "rate_limit_exceeded")
        }
        "server_is_overloaded" | "slow_down" => (503, "service_unavailable_error"),
        _ => (500, "server_error"),
    };
    faults::openai_error(status, kind, code, &faults::failed_message(code))
}

fn responses_route(account: &mut Account, req: &SimRequest, ctx: &Ctx<'_>) -> Outcome {
    let now = ctx.now;
    let answer = |a: ErrorAnswer, account: &Account| -> Outcome {
        respond(a, Some(account), now, ctx.ray).into()
    };
    let body = &req.json;
    if !body.is_object() {
        let detail = json!({"detail": "The request body must be a JSON object."});
        return answer(ErrorAnswer::json(400, detail), account);
    }
    let model = body["model"].as_str().unwrap_or("");
    account.served += 1;
    let fault = account
        .take_fault(Endpoint::Responses)
        .or_else(|| scripted_fault(account, now));
    let mut shape = StreamShape::default();
    let mut fail_code = None;
    match fault {
        None => {}
        Some(FaultKind::Quota { resets_in_seconds }) => {
            account.primary.used_percent = 100.0;
            account.primary.reset_at = now + resets_in_seconds;
            let plan = account.spec.plan.clone();
            let a = faults::usage_limit(&plan, now + resets_in_seconds, resets_in_seconds);
            return answer(a, account);
        }
        Some(FaultKind::Burst429 { retry_after_secs }) => {
            return answer(faults::burst(retry_after_secs), account);
        }
        Some(FaultKind::ServerError { status }) => {
            return answer(faults::server_error(status), account);
        }
        Some(FaultKind::Cloudflare403) => return answer(faults::cloudflare(ctx.ray), account),
        Some(FaultKind::TokenExpired) => return answer(faults::token_expired(), account),
        Some(FaultKind::AccountDeactivated) => {
            account.deactivated = true;
            return answer(faults::account_deactivated(), account);
        }
        Some(FaultKind::ModelUnsupported) => {
            return answer(faults::model_unsupported(model), account);
        }
        Some(FaultKind::ContextLength) => return answer(faults::context_length(), account),
        Some(FaultKind::ResetBeforeHeaders) => {
            return Outcome {
                reply: Reply::Reset,
                headers_delay: None,
            };
        }
        Some(FaultKind::FailedEvent { code }) => fail_code = Some(code),
        Some(FaultKind::ResetMidStream { after_deltas }) => {
            shape.cut = Some(Cut::Reset { after_deltas });
        }
        Some(FaultKind::HangMidStream { after_deltas }) => {
            shape.cut = Some(Cut::Hang { after_deltas });
        }
        Some(FaultKind::SlowFirstToken { ms }) => {
            shape.first_delta_delay = Some(Duration::from_millis(ms));
        }
        Some(FaultKind::SlowHeaders { ms }) => {
            shape.headers_delay = Some(Duration::from_millis(ms));
        }
        // Never queued for this endpoint (see `FaultKind::endpoint`).
        Some(FaultKind::RefreshFails { .. }) => {}
    }
    if !account.supported_models.iter().any(|m| m == model) {
        return answer(faults::model_unsupported(model), account);
    }
    let input_tokens = u64::try_from(req.body.len() / 4).unwrap_or(u64::MAX).max(1);
    if input_tokens > catalog::context_window(model) {
        return answer(faults::context_length(), account);
    }
    let session = SESSION_HEADERS.iter().find_map(|h| req.header(h));
    let unary = ctx.compact || !body["stream"].as_bool().unwrap_or(false);
    if unary && let Some(code) = &fail_code {
        return answer(unary_failure(code), account);
    }
    let cache_key = body["prompt_cache_key"].as_str().or(session);
    let cached_tokens = if fail_code.is_some() {
        0
    } else {
        account.cache_lookup(cache_key, input_tokens)
    };
    if fail_code.is_none() && shape.cut.is_none() {
        let (dp, ds) = account.script.drift;
        account.primary.used_percent = drift(account.primary.used_percent, dp);
        account.secondary.used_percent = drift(account.secondary.used_percent, ds);
    }
    let spec = TurnSpec {
        id_suffix: format!("{}{:012x}", ctx.nonce, ctx.id),
        account_id: account.id(),
        request: body,
        model,
        created_at: now,
        input_tokens,
        cached_tokens,
        fail_code,
    };
    let plan = if ctx.compact {
        Plan::Compaction
    } else {
        responses::plan(body, account.id())
    };
    let turn = responses::build(&spec, &plan);
    let mut r = if ctx.compact {
        let mut out = turn.response.clone();
        out["object"] = json!("response.compaction");
        steps(200, "application/json", responses::json_steps(&out, &shape))
    } else if unary {
        let out = &turn.response;
        steps(200, "application/json", responses::json_steps(out, &shape))
    } else {
        let pause = account.script.delta_pause;
        let body = responses::sse_steps(&turn, &shape, pause);
        steps(200, "text/event-stream; charset=utf-8", body)
    };
    decorate(&mut r, account, now, ctx.ray);
    set_header(
        &mut r,
        "x-codex-turn-state",
        &turn_state(ctx.nonce, account.id(), session),
    );
    set_header(&mut r, "openai-model", model);
    if !unary {
        set_header(&mut r, "cache-control", "no-cache");
    }
    Outcome {
        reply: Reply::Response(r),
        headers_delay: shape.headers_delay,
    }
}

fn drift(used: f64, by: f64) -> f64 {
    if used >= 99.0 || by <= 0.0 {
        used
    } else {
        ((used + by).min(99.0) * 100.0).round() / 100.0
    }
}

/// Opaque, stable per (account, session).
fn turn_state(nonce: &str, account: &str, session: Option<&str>) -> String {
    let mut h = Sha256::new();
    for part in [nonce, account, session.unwrap_or("")] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let hex: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("ts_{hex}")
}
