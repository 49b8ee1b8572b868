//! Scriptable failures (protocol §F) and the exact answers the real backend gives for them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What goes wrong, for one request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// 429 `usage_limit_reached` (+ `x-codex-active-limit`); the primary window shows 100 %
    /// used until it resets in `resets_in_seconds`.
    Quota { resets_in_seconds: u64 },
    /// 429 `rate_limit_exceeded` with `Retry-After`.
    Burst429 { retry_after_secs: u64 },
    /// 503 `server_is_overloaded`, or a generic `server_error` for any other status.
    ServerError { status: u16 },
    /// The same answer after a pause of `ms` (a gateway in front of the backend timing out).
    SlowServerError { status: u16, ms: u64 },
    /// 403 HTML challenge page from the Cloudflare edge (`cf-mitigated: challenge`).
    Cloudflare403,
    /// 401 `token_expired`, whatever the token.
    TokenExpired,
    /// 401 `account_deactivated`; the account stays deactivated.
    AccountDeactivated,
    /// 400 "The '<model>' model is not supported when using Codex with a ChatGPT account."
    ModelUnsupported,
    /// 400 `context_length_exceeded`.
    ContextLength,
    /// 400 `cyber_policy`: the prompt was flagged for possible cybersecurity risk (codex-protocol
    /// §J4; over WebSocket, an error frame with status 400). Its in-stream form is
    /// `FailedEvent { code: "cyber_policy" }`.
    CyberPolicy,
    /// 400 "Unsupported parameter: '<param>' is not supported with this model." (the platform
    /// API's shape, whose words contain both "model" and "not supported").
    UnsupportedParameter { param: String },
    /// 200 SSE: `response.created`, `response.in_progress`, then `response.failed` with `code`.
    FailedEvent { code: String },
    /// A normal stream that ends with `response.failed` with `code` after `after_deltas`
    /// deltas (a failure after output reached the client; over WebSocket the socket stays
    /// open).
    FailedMidStream { code: String, after_deltas: u32 },
    /// The connection is closed without any response.
    ResetBeforeHeaders,
    /// A normal stream cut (connection reset, no terminal event) after `after_deltas` deltas.
    ResetMidStream { after_deltas: u32 },
    /// A normal stream that goes silent after `after_deltas` deltas, until the client leaves.
    HangMidStream { after_deltas: u32 },
    /// Headers, `response.created` and `response.in_progress` at once, then a pause of `ms`
    /// before the first delta.
    SlowFirstToken { ms: u64 },
    /// A pause of `ms` before the response headers.
    SlowHeaders { ms: u64 },
    /// A normal answer paced with a pause of `ms` between deltas (a long answer).
    SlowDeltas { ms: u64 },
    /// An answer whose message is `kib` KiB of text, in 4 KiB deltas (larger than a socket's
    /// buffers can hide); a compaction's encrypted content of `kib` KiB.
    LongAnswer { kib: u32 },
    /// The token endpoint answers `status` to this account's refresh.
    RefreshFails { status: u16 },
    /// The token endpoint's edge answers this account's refresh with a Cloudflare challenge
    /// page (403, `cf-mitigated: challenge`, HTML).
    RefreshChallenge,
    /// The token endpoint answers this account's refresh with `status` and an OAuth error
    /// `{"error": code, "error_description": …}` (a code the gateway need not know).
    RefreshError { status: u16, code: String },
    /// The WebSocket upgrade is answered 426 Upgrade Required (Codex then uses HTTP at once).
    WsRefuse426,
    /// The upgrade is answered with this status (429: a burst rate limit; else a server error).
    WsHandshakeError { status: u16 },
    /// A pause of `ms` before the WebSocket upgrade's 101.
    WsSlowHandshake { ms: u64 },
    /// A normal turn over WebSocket, then a close frame (1011) after `after_deltas` deltas,
    /// without a terminal event.
    WsCloseMidTurn { after_deltas: u32 },
    /// A WebSocket error frame with this status and `error.code`, then the server closes.
    WsErrorFrame { status: u16, code: String },
    /// An error answer with this status and `error.code` (over WebSocket, an error frame):
    /// `{"error": {"type": …, "code": code, "message": …}}` with `fields` merged into the
    /// error object (`type`, `message`, `resets_in_seconds`, `limit_window_minutes`, …). For
    /// the codes a newer Codex knows (`slow_down`, `bio_policy`, `flex_unavailable`, the
    /// organization limits) and any other.
    Error {
        status: u16,
        code: String,
        #[serde(default)]
        fields: serde_json::Map<String, Value>,
    },
    /// A normal stream that ends with `response.incomplete` for `reason` (`content_filter`,
    /// `max_output_tokens`) instead of `response.completed`.
    Incomplete { reason: String },
    /// A reset-credit consume that is carried out, but answered only after `ms` (a client that
    /// gives up sooner never learns that it spent the credit).
    SlowConsume { ms: u64 },
    /// A reset-credit consume answered with this status, nothing spent.
    ConsumeFails { status: u16 },
}

/// A fault queued on an account. Faults are consumed in FIFO order by the requests they apply
/// to: `RefreshFails`, `RefreshChallenge` and `RefreshError` by `/oauth/token`; `WsRefuse426` and `WsSlowHandshake` by WebSocket
/// upgrades; `WsCloseMidTurn` and `WsErrorFrame` by `response.create` frames; every other kind
/// by `/responses*` requests and `response.create` frames alike.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    #[serde(flatten)]
    pub kind: FaultKind,
    /// How many requests it applies to; `None` = until cleared.
    #[serde(default)]
    pub times: Option<u32>,
}

impl Fault {
    /// Applies to the next matching request only.
    pub fn once(kind: FaultKind) -> Self {
        Self::times(kind, 1)
    }

    /// Applies to the next `n` matching requests.
    pub fn times(kind: FaultKind, n: u32) -> Self {
        Self {
            kind,
            times: Some(n),
        }
    }

    /// Applies until cleared.
    pub fn always(kind: FaultKind) -> Self {
        Self { kind, times: None }
    }
}

/// The kinds of request a fault can apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `POST /responses*` over HTTP.
    Responses,
    /// The WebSocket upgrade of `/responses`.
    WsHandshake,
    /// One `response.create` frame on a WebSocket.
    WsTurn,
    /// `POST /oauth/token`.
    Refresh,
    /// `POST wham/rate-limit-reset-credits/consume`.
    Consume,
}

impl FaultKind {
    pub(crate) fn applies_to(&self, endpoint: Endpoint) -> bool {
        match self {
            FaultKind::RefreshFails { .. }
            | FaultKind::RefreshChallenge
            | FaultKind::RefreshError { .. } => endpoint == Endpoint::Refresh,
            FaultKind::WsRefuse426
            | FaultKind::WsSlowHandshake { .. }
            | FaultKind::WsHandshakeError { .. } => endpoint == Endpoint::WsHandshake,
            FaultKind::WsCloseMidTurn { .. } | FaultKind::WsErrorFrame { .. } => {
                endpoint == Endpoint::WsTurn
            }
            FaultKind::SlowConsume { .. } | FaultKind::ConsumeFails { .. } => {
                endpoint == Endpoint::Consume
            }
            _ => matches!(endpoint, Endpoint::Responses | Endpoint::WsTurn),
        }
    }
}

/// How a fault shapes an otherwise normal answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StreamShape {
    pub headers_delay: Option<Duration>,
    pub first_delta_delay: Option<Duration>,
    /// Overrides the profile's pause between deltas.
    pub delta_pause: Option<Duration>,
    pub cut: Option<Cut>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    Reset {
        after_deltas: u32,
    },
    Hang {
        after_deltas: u32,
    },
    /// WebSocket only: a close frame (1011) instead of the rest of the turn.
    Close {
        after_deltas: u32,
    },
}

impl Cut {
    pub fn after_deltas(self) -> u32 {
        match self {
            Cut::Reset { after_deltas }
            | Cut::Hang { after_deltas }
            | Cut::Close { after_deltas } => after_deltas,
        }
    }
}

/// An error answer: status, extra headers, content type and body.
#[derive(Debug, Clone)]
pub(crate) struct ErrorAnswer {
    /// A pause before it is sent.
    pub delay: Option<Duration>,
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub content_type: &'static str,
    pub body: String,
    /// False for answers from the Cloudflare edge, which never reached the backend.
    pub from_backend: bool,
}

impl ErrorAnswer {
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            delay: None,
            status,
            headers: Vec::new(),
            content_type: "application/json",
            body: body.to_string(),
            from_backend: true,
        }
    }

    /// The same answer after a pause.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    fn with_header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }
}

/// `{"error":{"message","type","code","param"}}`, the OpenAI error shape.
pub(crate) fn openai_error(status: u16, kind: &str, code: &str, message: &str) -> ErrorAnswer {
    ErrorAnswer::json(
        status,
        json!({"error": {"message": message, "type": kind, "code": code, "param": null}}),
    )
}

pub(crate) fn model_unsupported(model: &str) -> ErrorAnswer {
    ErrorAnswer::json(
        400,
        json!({"detail": format!(
            "The '{model}' model is not supported when using Codex with a ChatGPT account."
        )}),
    )
}

pub(crate) fn context_length() -> ErrorAnswer {
    ErrorAnswer::json(
        400,
        json!({"error": {
            "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
            "param": "input",
        }}),
    )
}

pub(crate) fn cyber_policy() -> ErrorAnswer {
    openai_error(
        400,
        "invalid_request_error",
        "cyber_policy",
        &failed_message("cyber_policy"),
    )
}

/// 400 for a `service_tier` the backend does not know (a raw `fast`).
pub(crate) fn invalid_service_tier(value: &str) -> ErrorAnswer {
    ErrorAnswer::json(
        400,
        json!({"error": {
            "message": format!("Invalid value: '{value}'. Supported values are: 'auto', 'default', 'flex', 'priority' and 'ultrafast'."),
            "type": "invalid_request_error",
            "param": "service_tier",
            "code": "invalid_value",
        }}),
    )
}

pub(crate) fn unsupported_parameter(param: &str) -> ErrorAnswer {
    ErrorAnswer::json(
        400,
        json!({"error": {
            "message": format!("Unsupported parameter: '{param}' is not supported with this model."),
            "type": "invalid_request_error",
            "param": param,
            "code": "unsupported_parameter",
        }}),
    )
}

pub(crate) fn usage_limit(plan: &str, resets_at: u64, resets_in: u64) -> ErrorAnswer {
    ErrorAnswer::json(
        429,
        json!({"error": {
            "type": "usage_limit_reached",
            "message": "The usage limit has been reached",
            "plan_type": plan,
            "resets_at": resets_at,
            "resets_in_seconds": resets_in,
        }}),
    )
    .with_header("x-codex-active-limit", "codex".to_string())
}

pub(crate) fn burst(retry_after: u64) -> ErrorAnswer {
    openai_error(
        429,
        "rate_limit_exceeded",
        "rate_limit_exceeded",
        &format!("Rate limit reached for requests. Please try again in {retry_after}s."),
    )
    .with_header("retry-after", retry_after.to_string())
}

pub(crate) fn server_error(status: u16) -> ErrorAnswer {
    if status == 503 {
        openai_error(
            503,
            "service_unavailable_error",
            "server_is_overloaded",
            "Our servers are currently overloaded. Please try again later.",
        )
    } else {
        let status = if (400..=599).contains(&status) {
            status
        } else {
            500
        };
        openai_error(
            status,
            "server_error",
            "server_error",
            "An error occurred while processing your request. You can retry your request.",
        )
    }
}

pub(crate) fn cloudflare(ray: &str) -> ErrorAnswer {
    let body = format!(
        "<!DOCTYPE html><html lang=\"en-US\"><head><title>Just a moment...</title>\
         <meta http-equiv=\"Content-Type\" content=\"text/html; charset=UTF-8\">\
         <meta name=\"robots\" content=\"noindex,nofollow\"></head><body>\
         <div class=\"main-wrapper\" role=\"main\"><div class=\"main-content\">\
         <noscript><div class=\"h2\">Enable JavaScript and cookies to continue</div></noscript>\
         </div></div><script>(function(){{window._cf_chl_opt={{cRay: '{ray}',cType: 'managed'}};\
         var a=document.createElement('script');a.src='/cdn-cgi/challenge-platform/h/g/orchestrate/chl_page/v1?ray={ray}';\
         document.getElementsByTagName('head')[0].appendChild(a);}}());</script></body></html>"
    );
    ErrorAnswer {
        delay: None,
        status: 403,
        headers: vec![
            ("cf-mitigated", "challenge".to_string()),
            (
                "cache-control",
                "private, max-age=0, no-store, no-cache".to_string(),
            ),
        ],
        content_type: "text/html; charset=UTF-8",
        body,
        from_backend: false,
    }
}

pub(crate) fn token_expired() -> ErrorAnswer {
    openai_error(
        401,
        "invalid_request_error",
        "token_expired",
        "Provided authentication token is expired. Please try signing in again.",
    )
}

pub(crate) fn token_invalidated(why: &str) -> ErrorAnswer {
    openai_error(
        401,
        "invalid_request_error",
        "token_invalidated",
        &format!(
            "Your authentication token has been invalidated ({why}). Please try signing in again."
        ),
    )
}

pub(crate) fn account_deactivated() -> ErrorAnswer {
    openai_error(
        401,
        "invalid_request_error",
        "account_deactivated",
        "Your OpenAI account has been deactivated, please check your email for more information.",
    )
}

/// The 400 a WebSocket upgrade without `OpenAI-Beta: responses_websockets=…` gets.
pub(crate) fn missing_beta(want: &str) -> ErrorAnswer {
    openai_error(
        400,
        "invalid_request_error",
        "invalid_beta_header",
        &format!("WebSocket connections to /responses require the 'OpenAI-Beta: {want}' header."),
    )
}

/// The 426 of `WsRefuse426`: this endpoint does not speak WebSocket (use HTTP).
pub(crate) fn upgrade_required() -> ErrorAnswer {
    openai_error(
        426,
        "invalid_request_error",
        "upgrade_required",
        "Responses over WebSocket are not available; use HTTP.",
    )
}

/// A malformed upgrade request (no `Sec-WebSocket-Key`, or a version other than 13).
pub(crate) fn bad_upgrade() -> ErrorAnswer {
    ErrorAnswer::json(400, json!({"detail": "Invalid WebSocket upgrade request."}))
}

/// A WebSocket frame that is not a JSON `response.create`.
pub(crate) fn bad_frame(message: &str) -> ErrorAnswer {
    openai_error(400, "invalid_request_error", "invalid_request", message)
}

/// `previous_response_id` names a response this socket did not produce (`store:false`).
pub(crate) fn previous_response_not_found(id: &str) -> ErrorAnswer {
    ErrorAnswer::json(
        400,
        json!({"error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "message": format!("Previous response with id '{id}' not found."),
            "param": "previous_response_id",
        }}),
    )
}

/// The answer of [`FaultKind::Error`].
pub(crate) fn error(
    status: u16,
    code: &str,
    fields: &serde_json::Map<String, Value>,
) -> ErrorAnswer {
    let mut error = json!({
        "type": if status == 429 { "rate_limit_error" } else if status >= 500 { "server_error" } else { "invalid_request_error" },
        "code": code,
        "message": format!("simulated {code}"),
    });
    for (k, v) in fields {
        error[k] = v.clone();
    }
    ErrorAnswer::json(status, json!({"error": error}))
}

/// The error object of `WsErrorFrame`.
pub(crate) fn ws_error(status: u16, code: &str) -> ErrorAnswer {
    let kind = match status {
        429 => "rate_limit_exceeded",
        503 => "service_unavailable_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    let message = if code == "websocket_connection_limit_reached" {
        "Responses websocket connection limit reached (60 minutes). Create a new websocket \
         connection to continue."
            .to_string()
    } else {
        failed_message(code)
    };
    openai_error(status, kind, code, &message)
}

/// The message a `response.failed` event carries for `code`.
pub(crate) fn failed_message(code: &str) -> String {
    match code {
        "context_length_exceeded" => {
            "Your input exceeds the context window of this model. Please adjust your input and try again.".into()
        }
        "rate_limit_exceeded" => "Rate limit reached for requests. Please try again in 11.054s.".into(),
        "insufficient_quota" => "You exceeded your current quota, please check your plan and billing details.".into(),
        "usage_not_included" => "Your plan does not include Codex usage.".into(),
        "server_is_overloaded" | "slow_down" => {
            "Our servers are currently overloaded. Please try again later.".into()
        }
        "cyber_policy" => "This content was flagged for possible cybersecurity risk. If this \
            seems wrong, try rephrasing your request. To get authorized for security work, join \
            the Trusted Access for Cyber program: https://chatgpt.com/cyber"
            .into(),
        "invalid_prompt" => {
            "Invalid prompt: we've limited access to this content for safety reasons.".into()
        }
        other => format!("An error occurred while processing your request ({other})."),
    }
}
