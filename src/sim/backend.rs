//! `/backend-api/*`: authentication like the real backend, faults, and the answers of
//! `/codex/responses`, `/codex/responses/compact`, `/codex/models` and `/wham/usage`.

use std::time::Duration;

use hyper::{Method, Response};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Sim;
use super::catalog;
use super::faults::{self, Cut, Endpoint, ErrorAnswer, FaultKind, StreamShape};
use super::profile::scripted_fault;
use super::responses::{self, Plan, TurnSpec};
use super::server::{OpenBody, Outcome, Reply, SimBody, SimRequest, full, json, set_header, steps};
use super::state::{Account, AuthFailure, Routing, State};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Responses,
    Compact,
    Models,
    Usage,
    /// `wham/accounts/check`: workspace routing.
    AccountsCheck,
    /// `wham/rate-limit-reset-credits` and its `/consume`.
    ResetCredits,
    ConsumeCredit,
}

/// Session headers, in the order the backend derives prompt-cache affinity from them.
pub(crate) const SESSION_HEADERS: [&str; 4] =
    ["session-id", "session_id", "thread-id", "conversation_id"];

pub(crate) fn handle(sim: &Sim, req: &SimRequest) -> Outcome {
    let route = match req.path.as_str() {
        "/backend-api/codex/responses" => Route::Responses,
        "/backend-api/codex/responses/compact" => Route::Compact,
        "/backend-api/codex/models" => Route::Models,
        "/backend-api/wham/usage" => Route::Usage,
        "/backend-api/wham/accounts/check" => Route::AccountsCheck,
        "/backend-api/wham/rate-limit-reset-credits" => Route::ResetCredits,
        "/backend-api/wham/rate-limit-reset-credits/consume" => Route::ConsumeCredit,
        _ => return json(404, &json!({"detail": "Not Found"})).into(),
    };
    let method = match route {
        Route::Models | Route::Usage | Route::AccountsCheck | Route::ResetCredits => Method::GET,
        Route::Responses | Route::Compact | Route::ConsumeCredit => Method::POST,
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
        Route::ResetCredits => {
            let mut r = json(200, &super::credits::list(account, now));
            decorate(&mut r, account, now, &ray);
            r.into()
        }
        Route::ConsumeCredit => {
            let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            let mut delay = None;
            let (status, answer) = match account.take_fault(faults::Endpoint::Consume) {
                Some(FaultKind::ConsumeFails { status }) => (
                    status,
                    json!({"detail": {"code": "internal_error", "message": "simulated consume failure"}}),
                ),
                Some(FaultKind::SlowConsume { ms }) => {
                    delay = Some(Duration::from_millis(ms));
                    super::credits::consume(account, &body, now)
                }
                _ => super::credits::consume(account, &body, now),
            };
            let mut r = json(status, &answer);
            decorate(&mut r, account, now, &ray);
            Outcome {
                reply: Reply::Response(r),
                headers_delay: delay,
            }
        }
        Route::AccountsCheck => match &account.routing {
            Routing::Refuse { status } => json(
                *status,
                &json!({"detail": {"code": "accounts_check_failed", "message": "simulated refusal"}}),
            )
            .into(),
            routing => {
                let (origin, constraint) = match routing {
                    Routing::Workspace { origin, constraint } => {
                        (json!(origin), constraint.as_str())
                    }
                    _ => (Value::Null, "NO_CONSTRAINT"),
                };
                let id = account.id().to_string();
                json(
                    200,
                    &json!({
                        "accounts": [{"id": id, "plan_type": account.spec.plan,
                            "workspace_backend_origin": origin,
                            "account_routing_override": constraint}],
                        "account_ordering": [id],
                        "default_account_id": id,
                    }),
                )
                .into()
            }
        },
        Route::Responses | Route::Compact => {
            let ctx = Ctx {
                nonce: sim.nonce(),
                now,
                id,
                ray: &ray,
            };
            responses_route(sim, account, req, &ctx, route == Route::Compact)
        }
    }
}

/// What a turn needs from the simulator besides its account.
pub(crate) struct Ctx<'a> {
    pub nonce: &'a str,
    pub now: u64,
    /// Unique per turn: the suffix of its response and item ids.
    pub id: u64,
    pub ray: &'a str,
}

/// The token of `Authorization: Bearer …`, if any.
pub(crate) fn bearer(req: &SimRequest) -> Option<&str> {
    req.header("authorization")
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The account a request authenticates as, or the 401 to answer (with the account, when the
/// token was one of its own, so the answer carries its rate-limit headers).
pub(crate) fn authenticate(
    st: &State,
    req: &SimRequest,
    now: u64,
) -> Result<usize, (ErrorAnswer, Option<usize>)> {
    let Some(token) = bearer(req) else {
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

pub(crate) fn cf_ray(sim: &Sim, st: &mut State) -> String {
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
pub(crate) fn decorate(r: &mut Response<SimBody>, account: &Account, now: u64, ray: &str) {
    for (name, value) in catalog::rate_limit_headers(account, now) {
        set_header(r, name, &value);
    }
    set_header(r, "cf-ray", ray);
}

pub(crate) fn respond(
    a: ErrorAnswer,
    account: Option<&Account>,
    now: u64,
    ray: &str,
) -> Response<SimBody> {
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

/// A `/responses` request, whichever transport carried it.
pub(crate) struct TurnRequest<'a> {
    /// The request body; over WebSocket, the frame merged onto the context its
    /// `previous_response_id` names.
    pub body: &'a Value,
    /// Bytes the input-token estimate is based on.
    pub size: usize,
    pub session: Option<&'a str>,
    /// Where faults are taken from: `Responses` (HTTP) or `WsTurn`.
    pub endpoint: Endpoint,
    /// One JSON answer (`stream:false`, `/compact`): a failure is an HTTP error, not an event.
    pub unary: bool,
    pub compact: bool,
    /// False for a WebSocket warm-up.
    pub generate: bool,
    pub previous_response_id: Option<&'a str>,
}

/// What a turn comes to, before any transport renders it.
pub(crate) enum Decision {
    /// An error instead of a turn. `keeps_socket`: over WebSocket, the error frame leaves
    /// the socket open (the request was at fault, not the account or the backend).
    Refuse {
        answer: ErrorAnswer,
        keeps_socket: bool,
    },
    /// The connection is dropped without an answer.
    Reset,
    Serve(Served),
}

pub(crate) struct Served {
    pub turn: responses::Turn,
    pub shape: StreamShape,
    /// The profile's pacing between deltas.
    pub delta_pause: Option<Duration>,
}

fn refuse(answer: ErrorAnswer) -> Decision {
    Decision::Refuse {
        answer,
        keeps_socket: false,
    }
}

/// A request error (bad model, too long): over WebSocket the socket survives it.
fn reject(answer: ErrorAnswer) -> Decision {
    Decision::Refuse {
        answer,
        keeps_socket: true,
    }
}

/// The one owner of what a turn does: counts it, applies the next fault (queued, else
/// scripted), checks model and context, consults the prompt cache, moves usage, and builds
/// its events.
pub(crate) fn decide(account: &mut Account, req: &TurnRequest<'_>, ctx: &Ctx<'_>) -> Decision {
    let now = ctx.now;
    let body = req.body;
    let model = body["model"].as_str().unwrap_or("");
    account.served += 1;
    let fault = account
        .take_fault(req.endpoint)
        .or_else(|| scripted_fault(account, now));
    let mut shape = StreamShape::default();
    let mut fail_code = None;
    let mut fail_after = None;
    let mut answer_bytes = None;
    let mut incomplete = None;
    match fault {
        // A spent window refuses every turn until it resets (or a credit resets it).
        None => {
            let spent = [
                (&account.primary, true),
                (&account.secondary, !account.single_window),
            ]
            .into_iter()
            .filter(|(w, counts)| *counts && w.used_percent >= 100.0)
            .map(|(w, _)| w.reset_at)
            .max();
            if let Some(reset_at) = spent {
                let plan = account.spec.plan.clone();
                let resets_in = reset_at.saturating_sub(now).max(1);
                return refuse(faults::usage_limit(&plan, now + resets_in, resets_in));
            }
        }
        Some(FaultKind::Quota { resets_in_seconds }) => {
            account.primary.used_percent = 100.0;
            account.primary.reset_at = now + resets_in_seconds;
            let plan = account.spec.plan.clone();
            return refuse(faults::usage_limit(
                &plan,
                now + resets_in_seconds,
                resets_in_seconds,
            ));
        }
        Some(FaultKind::Burst429 { retry_after_secs }) => {
            return refuse(faults::burst(retry_after_secs));
        }
        Some(FaultKind::ServerError { status }) => return refuse(faults::server_error(status)),
        Some(FaultKind::SlowServerError { status, ms }) => {
            return refuse(faults::server_error(status).after(Duration::from_millis(ms)));
        }
        Some(FaultKind::Cloudflare403) => return refuse(faults::cloudflare(ctx.ray)),
        Some(FaultKind::TokenExpired) => return refuse(faults::token_expired()),
        Some(FaultKind::AccountDeactivated) => {
            account.deactivated = true;
            return refuse(faults::account_deactivated());
        }
        Some(FaultKind::ModelUnsupported) => return reject(faults::model_unsupported(model)),
        Some(FaultKind::ContextLength) => return reject(faults::context_length()),
        Some(FaultKind::CyberPolicy) => return reject(faults::cyber_policy()),
        Some(FaultKind::UnsupportedParameter { param }) => {
            return reject(faults::unsupported_parameter(&param));
        }
        Some(FaultKind::ResetBeforeHeaders) => return Decision::Reset,
        Some(FaultKind::WsErrorFrame { status, code }) => {
            return refuse(faults::ws_error(status, &code));
        }
        Some(FaultKind::Error {
            status,
            code,
            fields,
        }) => {
            let answer = faults::error(status, &code, &fields);
            // A request's own error leaves a WebSocket open; a limit or a server error not.
            return if status == 429 || status >= 500 {
                refuse(answer)
            } else {
                reject(answer)
            };
        }
        Some(FaultKind::Incomplete { reason }) => incomplete = Some(reason),
        Some(FaultKind::FailedEvent { code }) => fail_code = Some(code),
        Some(FaultKind::FailedMidStream { code, after_deltas }) => {
            fail_code = Some(code);
            fail_after = Some(after_deltas);
        }
        Some(FaultKind::ResetMidStream { after_deltas }) => {
            shape.cut = Some(Cut::Reset { after_deltas });
        }
        Some(FaultKind::HangMidStream { after_deltas }) => {
            shape.cut = Some(Cut::Hang { after_deltas });
        }
        Some(FaultKind::WsCloseMidTurn { after_deltas }) => {
            shape.cut = Some(Cut::Close { after_deltas });
        }
        Some(FaultKind::SlowFirstToken { ms }) => {
            shape.first_delta_delay = Some(Duration::from_millis(ms));
        }
        Some(FaultKind::SlowHeaders { ms }) => {
            shape.headers_delay = Some(Duration::from_millis(ms));
        }
        Some(FaultKind::SlowDeltas { ms }) => {
            shape.delta_pause = Some(Duration::from_millis(ms));
        }
        Some(FaultKind::LongAnswer { kib }) => {
            answer_bytes = Some(usize::try_from(kib).unwrap_or(0) * 1024);
        }
        // Never taken for a turn (see `FaultKind::applies_to`).
        Some(
            FaultKind::RefreshFails { .. }
            | FaultKind::RefreshChallenge
            | FaultKind::RefreshError { .. }
            | FaultKind::WsRefuse426
            | FaultKind::WsHandshakeError { .. }
            | FaultKind::WsSlowHandshake { .. }
            | FaultKind::SlowConsume { .. }
            | FaultKind::ConsumeFails { .. },
        ) => {}
    }
    if !account.supported_models.iter().any(|m| m == model) {
        return reject(faults::model_unsupported(model));
    }
    // Tier routing: a raw `fast` is refused (Codex sends Fast mode as `priority`); priority
    // runs only where the account has it (else the default tier, which the answer says) and
    // costs twice the quota.
    let asked_tier = body["service_tier"].as_str();
    if asked_tier == Some("fast") {
        return reject(faults::invalid_service_tier("fast"));
    }
    let served_tier = match asked_tier {
        Some("priority") if !account.priority_tier => "default",
        Some(t) => t,
        None => "auto",
    }
    .to_string();
    let input_tokens = u64::try_from(req.size / 4).unwrap_or(u64::MAX).max(1);
    if input_tokens > catalog::context_window(model) {
        return reject(faults::context_length());
    }
    if req.unary
        && let Some(code) = &fail_code
    {
        return refuse(unary_failure(code));
    }
    let cache_key = body["prompt_cache_key"].as_str().or(req.session);
    let cached_tokens = if fail_code.is_some() {
        0
    } else {
        account.cache_lookup(cache_key, input_tokens)
    };
    if fail_code.is_none() && shape.cut.is_none() && req.generate {
        let (mut dp, mut ds) = account.script.drift;
        if served_tier == "priority" {
            (dp, ds) = (dp * 2.0, ds * 2.0);
        }
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
        fail_after,
        generate: req.generate,
        previous_response_id: req.previous_response_id.map(str::to_string),
        answer_bytes,
        incomplete,
        service_tier: served_tier,
    };
    let plan = if req.compact {
        Plan::Compaction
    } else {
        responses::plan(body, account.id())
    };
    Decision::Serve(Served {
        turn: responses::build(&spec, &plan),
        delta_pause: shape.delta_pause.or(account.script.delta_pause),
        shape,
    })
}

fn responses_route(
    sim: &Sim,
    account: &mut Account,
    req: &SimRequest,
    ctx: &Ctx<'_>,
    compact: bool,
) -> Outcome {
    let now = ctx.now;
    let answer = |a: ErrorAnswer, account: &Account| -> Outcome {
        let delay = a.delay;
        Outcome {
            headers_delay: delay,
            ..respond(a, Some(account), now, ctx.ray).into()
        }
    };
    let body = &req.json;
    if !body.is_object() {
        let detail = json!({"detail": "The request body must be a JSON object."});
        return answer(ErrorAnswer::json(400, detail), account);
    }
    let model = body["model"].as_str().unwrap_or("");
    let session = SESSION_HEADERS.iter().find_map(|h| req.header(h));
    let unary = compact || !body["stream"].as_bool().unwrap_or(false);
    let turn_req = TurnRequest {
        body,
        size: req.body.len(),
        session,
        endpoint: Endpoint::Responses,
        unary,
        compact,
        generate: true,
        previous_response_id: None,
    };
    let served = match decide(account, &turn_req, ctx) {
        Decision::Refuse { answer: a, .. } => return answer(a, account),
        Decision::Reset => {
            return Outcome {
                reply: Reply::Reset,
                headers_delay: None,
            };
        }
        Decision::Serve(served) => served,
    };
    let Served {
        turn,
        shape,
        delta_pause,
    } = served;
    let open = Some(OpenBody::new(sim, account));
    let mut r = if compact {
        let mut out = turn.response.clone();
        out["object"] = json!("response.compaction");
        let body = responses::json_steps(&out, &shape);
        steps(200, "application/json", body, open)
    } else if unary {
        let out = &turn.response;
        steps(
            200,
            "application/json",
            responses::json_steps(out, &shape),
            open,
        )
    } else {
        let body = responses::sse_steps(&turn, &shape, delta_pause);
        steps(200, "text/event-stream; charset=utf-8", body, open)
    };
    decorate(&mut r, account, now, ctx.ray);
    set_header(
        &mut r,
        "x-codex-turn-state",
        &turn_state(ctx.nonce, account.id(), session),
    );
    set_header(&mut r, "openai-model", model);
    // Whether reasoning items are in the answer (Codex reads it), and a header no client
    // knows, as the backend adds new ones: both must reach the client.
    let reasoning = body["include"]
        .as_array()
        .is_some_and(|i| i.iter().any(|v| v == "reasoning.encrypted_content"));
    set_header(
        &mut r,
        "x-reasoning-included",
        if reasoning { "true" } else { "false" },
    );
    set_header(
        &mut r,
        "x-codex-sim-request-id",
        &format!("simreq_{:x}", ctx.id),
    );
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
pub(crate) fn turn_state(nonce: &str, account: &str, session: Option<&str>) -> String {
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
