//! The fault matrix: each failure class in each phase of an exchange where it can happen, over
//! each client transport (HTTP JSON, HTTP SSE, WebSocket), with one account and with a pool of
//! two. The rows say what the failure is and what it does to the account; the rules in
//! [`expect`] say what the client must see and what the request record must say, the same for
//! every row. Each cell runs on a fresh gateway and simulator and checks:
//!
//! - what the client saw: the status or terminal event, the error code, `Retry-After`;
//! - each account's state and reason afterwards;
//! - the record: its attempts (account, class, phase), outcome, the account that answered and
//!   where the answer that ended it came from (the backend, or the gateway itself);
//! - that a second request with the same session reaches no account the gateway already knows
//!   is bad.
//!
//! `docs/architecture.md` has the table of cells and their expected outcomes.

use std::time::Duration;

use crate::common::gw::{Gw, GwOptions, read_sse};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard::sim::FaultKind;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const MODEL: &str = "gpt-5.5";
const SESSION: &str = "matrix-session";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Json,
    Sse,
    Ws,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// One account.
    One,
    /// Two accounts; the failure happens on the first one tried.
    Pool,
}

/// How a row's failure is made.
#[derive(Debug, Clone)]
enum Make {
    /// A fault queued once on the account tried first.
    Fault(FaultKind),
    /// The backend's origin refuses connections: every account meets it.
    OriginDown,
}

/// What a failure does to the account it happened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Nothing.
    None,
    /// Cooling, for this reason.
    Cools(&'static str),
    /// Needs a new login.
    NeedsReauth,
    /// The model is marked unsupported on it.
    MarksModel,
    /// This key's session avoids it (policy); the account itself is untouched.
    AvoidedBySession,
}

/// After output reached the client, how the stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The backend's own `response.failed`, forwarded (outcome `failed`, or `caller_error`).
    Forwarded,
    /// The gateway's `response.failed` `upstream_stream_error` (outcome `stream_error`).
    Synthetic,
}

/// One failure in one phase.
struct Row {
    name: &'static str,
    /// The failure, per transport; `None` where it has no form.
    make: fn(Transport) -> Option<Make>,
    /// The class recorded on the failed attempt.
    class: &'static str,
    /// The phase recorded on the failed attempt, per transport.
    phase: fn(Transport) -> &'static str,
    effect: Effect,
    /// For failures after the first output: how a streamed answer ends.
    ending: Ending,
    /// The error code the client sees when this failure is the answer (caller errors, and
    /// refusals and endings forwarded as they are).
    code: &'static str,
    /// Carried by a `response.failed` inside a 200 stream (not by an error status).
    in_stream: bool,
}

fn fault(kind: FaultKind) -> Option<Make> {
    Some(Make::Fault(kind))
}

fn failed_event(code: &str) -> Option<Make> {
    fault(FaultKind::FailedEvent { code: code.into() })
}

fn failed_mid_stream(code: &str) -> Option<Make> {
    fault(FaultKind::FailedMidStream {
        code: code.into(),
        after_deltas: 2,
    })
}

fn connect(_: Transport) -> &'static str {
    "connect"
}
fn pre_headers(_: Transport) -> &'static str {
    "pre_headers"
}
fn pre_commit(_: Transport) -> &'static str {
    "pre_commit"
}
fn mid_stream(t: Transport) -> &'static str {
    // A JSON client is shown nothing before the terminal event: for it, the failure is
    // still before the commit.
    if t == Transport::Json {
        "pre_commit"
    } else {
        "mid_stream"
    }
}
/// A status answer: to the HTTP request's headers, or to the WebSocket's handshake.
fn status_answer(t: Transport) -> &'static str {
    if t == Transport::Ws {
        "pre_headers"
    } else {
        "pre_commit"
    }
}

const fn row(
    name: &'static str,
    make: fn(Transport) -> Option<Make>,
    class: &'static str,
    phase: fn(Transport) -> &'static str,
    effect: Effect,
) -> Row {
    Row {
        name,
        make,
        class,
        phase,
        effect,
        ending: Ending::Forwarded,
        code: "",
        in_stream: false,
    }
}

const TRANSIENT: Effect = Effect::Cools("transient");

/// The rows: every failure class in every phase where it can happen.
const ROWS: &[Row] = &[
    // Connect: the origin cannot be reached (for every account alike).
    row(
        "origin_refuses_connections",
        |_| Some(Make::OriginDown),
        "transient",
        connect,
        TRANSIENT,
    ),
    // Before the response headers (for the WebSocket, before the 101).
    row(
        "reset_before_headers",
        |t| match t {
            Transport::Ws => fault(FaultKind::WsHandshakeError { status: 502 }),
            _ => fault(FaultKind::ResetBeforeHeaders),
        },
        "transient",
        pre_headers,
        TRANSIENT,
    ),
    row(
        "no_headers_in_time",
        |t| match t {
            // A slow handshake is not the account's failure: the turn goes over HTTP.
            Transport::Ws => None,
            _ => fault(FaultKind::SlowHeaders { ms: 10_000 }),
        },
        "transient",
        pre_headers,
        TRANSIENT,
    ),
    // Answered with an error status (for the WebSocket: the turn's error frame, or the
    // handshake's status where the edge answers).
    row(
        "quota_429",
        |_| {
            fault(FaultKind::Quota {
                resets_in_seconds: 3600,
            })
        },
        "quota",
        pre_commit,
        Effect::Cools("quota"),
    ),
    row(
        "burst_429",
        |_| {
            fault(FaultKind::Burst429 {
                retry_after_secs: 30,
            })
        },
        "rate_limited",
        pre_commit,
        Effect::Cools("rate_limited"),
    ),
    row(
        "token_expired_401",
        |_| fault(FaultKind::TokenExpired),
        "auth_expired",
        pre_commit,
        Effect::None,
    ),
    row(
        "account_deactivated_401",
        |_| fault(FaultKind::AccountDeactivated),
        "auth_dead",
        pre_commit,
        Effect::NeedsReauth,
    ),
    row(
        "cloudflare_challenge_403",
        |t| match t {
            Transport::Ws => fault(FaultKind::WsHandshakeError { status: 403 }),
            _ => fault(FaultKind::Cloudflare403),
        },
        "edge_challenge",
        status_answer,
        Effect::Cools("edge_challenge"),
    ),
    row(
        "server_error_503",
        |_| fault(FaultKind::ServerError { status: 503 }),
        "transient",
        pre_commit,
        TRANSIENT,
    ),
    row(
        "model_unsupported_400",
        |_| fault(FaultKind::ModelUnsupported),
        "model_unsupported",
        pre_commit,
        Effect::MarksModel,
    ),
    Row {
        code: "cyber_policy",
        ..row(
            "cyber_policy_400",
            |_| fault(FaultKind::CyberPolicy),
            "policy",
            pre_commit,
            Effect::AvoidedBySession,
        )
    },
    Row {
        code: "context_length_exceeded",
        ..row(
            "context_length_400",
            |_| fault(FaultKind::ContextLength),
            "caller",
            pre_commit,
            Effect::None,
        )
    },
    Row {
        code: "unsupported_parameter",
        ..row(
            "unsupported_parameter_400",
            |_| {
                fault(FaultKind::UnsupportedParameter {
                    param: "temperature".into(),
                })
            },
            "caller",
            pre_commit,
            Effect::None,
        )
    },
    // Inside the 200, before the first output.
    row(
        "reset_after_headers",
        |_| fault(FaultKind::ResetMidStream { after_deltas: 0 }),
        "transient",
        pre_commit,
        TRANSIENT,
    ),
    row(
        "silent_after_headers",
        |_| fault(FaultKind::HangMidStream { after_deltas: 0 }),
        "transient",
        pre_commit,
        TRANSIENT,
    ),
    row(
        "quota_event",
        |_| failed_event("usage_limit_reached"),
        "quota",
        pre_commit,
        Effect::Cools("quota"),
    ),
    row(
        "rate_limit_event",
        |_| failed_event("rate_limit_exceeded"),
        "rate_limited",
        pre_commit,
        Effect::Cools("rate_limited"),
    ),
    row(
        "overloaded_event",
        |_| failed_event("server_is_overloaded"),
        "transient",
        pre_commit,
        TRANSIENT,
    ),
    row(
        // Once per prompt, an unexplained failure may cool the account it happened on.
        "unknown_code_event",
        |_| failed_event("mystery_failure"),
        "transient",
        pre_commit,
        TRANSIENT,
    ),
    Row {
        code: "cyber_policy",
        ..row(
            "cyber_policy_event",
            |_| failed_event("cyber_policy"),
            "policy",
            pre_commit,
            Effect::AvoidedBySession,
        )
    },
    Row {
        code: "context_length_exceeded",
        in_stream: true,
        ..row(
            "context_length_event",
            |_| failed_event("context_length_exceeded"),
            "caller",
            pre_commit,
            Effect::None,
        )
    },
    // After the first output.
    Row {
        code: "usage_limit_reached",
        ..row(
            "quota_after_output",
            |_| failed_mid_stream("usage_limit_reached"),
            "quota",
            mid_stream,
            Effect::Cools("quota"),
        )
    },
    Row {
        code: "rate_limit_exceeded",
        ..row(
            "rate_limit_after_output",
            |_| failed_mid_stream("rate_limit_exceeded"),
            "rate_limited",
            mid_stream,
            Effect::Cools("rate_limited"),
        )
    },
    Row {
        code: "server_is_overloaded",
        ..row(
            "overloaded_after_output",
            |_| failed_mid_stream("server_is_overloaded"),
            "transient",
            mid_stream,
            TRANSIENT,
        )
    },
    Row {
        code: "mystery_failure",
        ..row(
            "unknown_code_after_output",
            |_| failed_mid_stream("mystery_failure"),
            "transient",
            mid_stream,
            TRANSIENT,
        )
    },
    Row {
        code: "cyber_policy",
        ..row(
            "cyber_policy_after_output",
            |_| failed_mid_stream("cyber_policy"),
            "policy",
            mid_stream,
            Effect::AvoidedBySession,
        )
    },
    Row {
        code: "context_length_exceeded",
        ..row(
            "context_length_after_output",
            |_| failed_mid_stream("context_length_exceeded"),
            "caller",
            mid_stream,
            Effect::None,
        )
    },
    Row {
        ending: Ending::Synthetic,
        code: "upstream_stream_error",
        ..row(
            "reset_after_output",
            |_| fault(FaultKind::ResetMidStream { after_deltas: 2 }),
            "transient",
            mid_stream,
            TRANSIENT,
        )
    },
    Row {
        ending: Ending::Synthetic,
        code: "upstream_stream_error",
        ..row(
            "silent_after_output",
            |_| fault(FaultKind::HangMidStream { after_deltas: 2 }),
            "transient",
            mid_stream,
            TRANSIENT,
        )
    },
    Row {
        ending: Ending::Synthetic,
        code: "upstream_stream_error",
        ..row(
            "websocket_closed_after_output",
            |t| match t {
                Transport::Ws => fault(FaultKind::WsCloseMidTurn { after_deltas: 2 }),
                _ => None,
            },
            "transient",
            mid_stream,
            TRANSIENT,
        )
    },
];

/// What the client must see.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    /// A complete answer.
    Completed,
    /// An error before anything was shown: status, code, and whether `Retry-After` comes with
    /// it (HTTP only).
    Error {
        status: u16,
        code: String,
        retry_after: bool,
    },
    /// Output, then `response.failed` with this code.
    EndedWith(String),
}

/// What a cell must produce.
#[derive(Debug)]
struct Expected {
    seen: Seen,
    outcome: &'static str,
    /// (account index, class, phase) per attempt, in order.
    attempts: Vec<(usize, &'static str, Option<&'static str>)>,
    /// The account that answered (its index), if any.
    served_by: Option<usize>,
    /// Per account: its state and reason afterwards.
    states: Vec<(&'static str, Option<&'static str>)>,
    /// Whose the answer that ended it is: `upstream` (the backend's, forwarded) or
    /// `synthetic` (made by the gateway).
    terminal: &'static str,
}

/// The rules every row follows.
fn expect(row: &Row, transport: Transport, scope: Scope, make: &Make) -> Expected {
    let accounts = match scope {
        Scope::One => 1,
        Scope::Pool => 2,
    };
    let phase = (row.phase)(transport);
    let every_account = matches!(make, Make::OriginDown);
    // Output reached a streaming client: nothing can be replayed.
    let committed = phase == "mid_stream";
    let after = |e: Effect| match e {
        Effect::Cools(reason) => ("cooling", Some(reason)),
        Effect::NeedsReauth => ("needs_reauth", Some("auth_dead")),
        Effect::None | Effect::MarksModel | Effect::AvoidedBySession => ("ready", None),
    };
    let mut states = vec![("ready", None); accounts];
    states[0] = after(row.effect);
    let failed = (0, row.class, Some(phase));

    if row.class == "auth_expired" {
        // One refresh, then the same account again.
        return Expected {
            seen: Seen::Completed,
            outcome: "success",
            attempts: vec![failed, (0, "success", None)],
            served_by: Some(0),
            states,
            terminal: "upstream",
        };
    }
    if row.class == "caller" {
        // The caller's own error goes back as the backend gave it: a status as a status, a
        // `response.failed` in a stream as that event (a JSON client gets it as a 400).
        let seen = if committed || (row.in_stream && transport != Transport::Json) {
            Seen::EndedWith(row.code.into())
        } else {
            Seen::Error {
                status: 400,
                code: row.code.into(),
                retry_after: false,
            }
        };
        return Expected {
            seen,
            outcome: "caller_error",
            attempts: vec![failed],
            served_by: Some(0),
            states,
            terminal: "upstream",
        };
    }
    if committed {
        let (outcome, terminal) = match row.ending {
            Ending::Forwarded => ("failed", "upstream"),
            Ending::Synthetic => ("stream_error", "synthetic"),
        };
        return Expected {
            seen: Seen::EndedWith(row.code.into()),
            outcome,
            attempts: vec![failed],
            served_by: Some(0),
            states,
            terminal,
        };
    }
    if scope == Scope::Pool && !every_account {
        // Invisible failover to the next account.
        return Expected {
            seen: Seen::Completed,
            outcome: "success",
            attempts: vec![failed, (1, "success", None)],
            served_by: Some(1),
            states,
            terminal: "upstream",
        };
    }
    // No account is left.
    let mut attempts = vec![failed];
    if every_account {
        for (i, state) in states.iter_mut().enumerate().skip(1) {
            attempts.push((i, row.class, Some(phase)));
            *state = after(row.effect);
        }
    }
    // The gateway answers for the pool, except a policy refusal: that is the backend's own.
    let (status, code, outcome, terminal) = match row.effect {
        Effect::Cools("quota") => (429, "usage_limit_reached", "quota_exhausted", "synthetic"),
        Effect::MarksModel => (404, "model_not_found", "model_not_found", "synthetic"),
        Effect::AvoidedBySession => (400, row.code, "policy_refused", "upstream"),
        _ => (503, "no_available_account", "no_account", "synthetic"),
    };
    Expected {
        seen: Seen::Error {
            status,
            code: code.into(),
            retry_after: matches!(row.effect, Effect::Cools(_)),
        },
        outcome,
        attempts,
        served_by: None,
        states,
        terminal,
    }
}

/// Timeouts short enough for a silent stream or a slow answer to be judged within a test.
fn short_timeouts(c: &mut switchyard::config::Config) {
    c.upstream.header_timeout = Duration::from_secs(2);
    c.upstream.stream_idle_timeout = Duration::from_secs(2);
}

/// What the client saw, whatever the transport.
#[derive(Debug)]
struct Answer {
    seen: Seen,
    /// Event types, for the report.
    kinds: Vec<String>,
    /// Output events (deltas) before the end.
    deltas: usize,
}

fn request_body(stream: bool) -> Value {
    json!({
        "model": MODEL,
        "instructions": "You are a test.",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        "store": false,
        "stream": stream,
    })
}

fn ended(events: &[(String, Value)]) -> Answer {
    let kinds: Vec<String> = events.iter().map(|(k, _)| k.clone()).collect();
    let deltas = kinds.iter().filter(|k| k.ends_with(".delta")).count();
    let seen = match events.last() {
        Some((k, _)) if k == "response.completed" => Seen::Completed,
        Some((k, v)) if k == "response.failed" => Seen::EndedWith(
            v["response"]["error"]["code"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        ),
        Some((k, v)) if k == "error" => Seen::Error {
            status: u16::try_from(v["status"].as_u64().unwrap_or(0)).unwrap(),
            code: v["error"]["code"].as_str().unwrap_or("").to_string(),
            retry_after: false,
        },
        _ => Seen::EndedWith(String::new()),
    };
    Answer {
        seen,
        kinds,
        deltas,
    }
}

async fn ask(gw: &Gw, transport: Transport) -> Answer {
    match transport {
        Transport::Json | Transport::Sse => {
            let stream = transport == Transport::Sse;
            let resp = gw
                .post_raw(
                    "/v1/responses",
                    &request_body(stream),
                    &[("session-id", SESSION)],
                )
                .await;
            let status = resp.status().as_u16();
            let retry_after = resp.headers().contains_key("retry-after");
            if status != 200 {
                let v: Value = resp.json().await.unwrap_or(Value::Null);
                return Answer {
                    seen: Seen::Error {
                        status,
                        code: v["error"]["code"].as_str().unwrap_or("").to_string(),
                        retry_after,
                    },
                    kinds: Vec::new(),
                    deltas: 0,
                };
            }
            if stream {
                ended(&read_sse(resp).await.events)
            } else {
                let v: Value = resp.json().await.unwrap();
                let seen = if v["status"] == "completed" {
                    Seen::Completed
                } else {
                    Seen::EndedWith(format!("{v}"))
                };
                Answer {
                    seen,
                    kinds: Vec::new(),
                    deltas: 0,
                }
            }
        }
        Transport::Ws => {
            let mut req = format!("ws://{}/v1/responses", gw.addr)
                .into_client_request()
                .unwrap();
            let h = req.headers_mut();
            h.insert("authorization", gw.auth().parse().unwrap());
            h.insert("session-id", SESSION.parse().unwrap());
            let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
            let mut create = request_body(true);
            create["type"] = json!("response.create");
            ws.send(Message::Text(create.to_string().into()))
                .await
                .unwrap();
            let mut events = Vec::new();
            while let Some(Ok(msg)) = ws.next().await {
                let Message::Text(t) = msg else {
                    if matches!(msg, Message::Close(_)) {
                        break;
                    }
                    continue;
                };
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                let kind = v["type"].as_str().unwrap_or("").to_string();
                let end = matches!(
                    kind.as_str(),
                    "response.completed" | "response.failed" | "response.incomplete" | "error"
                );
                events.push((kind, v));
                if end {
                    break;
                }
            }
            let _ = ws.close(None).await;
            ended(&events)
        }
    }
}

/// Runs one cell and returns what did not hold.
async fn cell(row: &Row, transport: Transport, scope: Scope) -> Vec<String> {
    let Some(make) = (row.make)(transport) else {
        return Vec::new();
    };
    let gw = Gw::start_opts(GwOptions {
        accounts: match scope {
            Scope::One => 1,
            Scope::Pool => 2,
        },
        configure: short_timeouts,
        origin_down: matches!(make, Make::OriginDown),
        ..GwOptions::default()
    })
    .await;
    let order = gw.rr_order();
    if let Make::Fault(kind) = &make {
        gw.fault(&order[0], kind.clone(), Some(1));
    }
    let want = expect(row, transport, scope, &make);
    let mut wrong = Vec::new();
    let mut check = |what: &str, ok: bool, detail: String| {
        if !ok {
            wrong.push(format!("{what}: {detail}"));
        }
    };

    let answer = ask(&gw, transport).await;
    let seen_ok = match (&want.seen, &answer.seen) {
        // Over a WebSocket an error is a frame: no headers, so no Retry-After.
        (
            Seen::Error { status, code, .. },
            Seen::Error {
                status: s, code: c, ..
            },
        ) if transport == Transport::Ws => status == s && code == c,
        (a, b) => a == b,
    };
    check(
        "client saw",
        seen_ok,
        format!(
            "want {:?}, got {:?} ({:?})",
            want.seen, answer.seen, answer.kinds
        ),
    );
    if (row.phase)(transport) == "mid_stream" {
        check(
            "output before the end",
            answer.deltas > 0,
            format!("{:?}", answer.kinds),
        );
    }

    let record = gw.requests(1).await.remove(0);
    check(
        "outcome",
        record["outcome"] == want.outcome,
        format!("want {}, record {record}", want.outcome),
    );
    let attempts: Vec<(String, String, Option<String>)> = record["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["account"].as_str().unwrap().to_string(),
                a["class"].as_str().unwrap().to_string(),
                a["phase"].as_str().map(str::to_string),
            )
        })
        .collect();
    let want_attempts: Vec<(String, String, Option<String>)> = want
        .attempts
        .iter()
        .map(|(i, class, phase)| {
            (
                order[*i].clone(),
                (*class).to_string(),
                phase.map(str::to_string),
            )
        })
        .collect();
    check(
        "attempts",
        attempts == want_attempts,
        format!("want {want_attempts:?}, got {attempts:?}"),
    );
    check(
        "terminal source",
        record["terminal_source"] == want.terminal,
        format!("want {}, record {record}", want.terminal),
    );
    let served = record["account"].as_str().map(str::to_string);
    check(
        "answered by",
        served == want.served_by.map(|i| order[i].clone()),
        format!("want {:?}, record {record}", want.served_by),
    );

    // The backend agrees: an account with no attempt on record was not asked.
    for (i, account) in order.iter().enumerate() {
        if !want.attempts.iter().any(|(a, _, _)| *a == i) {
            check(
                &format!("account {i} not asked"),
                gw.served(account) == 0,
                format!("the simulator got {} requests", gw.served(account)),
            );
        }
    }

    for (i, (state, reason)) in want.states.iter().enumerate() {
        let a = gw.account(&order[i]).await;
        check(
            &format!("account {i} state"),
            a["state"] == *state && a["reason"].as_str() == *reason,
            format!(
                "want {state} {reason:?}, got {} {}",
                a["state"], a["reason"]
            ),
        );
        let marked = a["unsupported_models"] == json!([MODEL]);
        check(
            &format!("account {i} models"),
            marked == (i == 0 && row.effect == Effect::MarksModel),
            format!("{}", a["unsupported_models"]),
        );
    }

    // The next request of the session: an account known to be bad is not asked again.
    let known_bad: Vec<usize> = want
        .states
        .iter()
        .enumerate()
        .filter(|(i, (state, _))| {
            *state != "ready"
                || (*i == 0 && matches!(row.effect, Effect::MarksModel | Effect::AvoidedBySession))
        })
        .map(|(i, _)| i)
        .collect();
    let before: Vec<usize> = order.iter().map(|a| gw.served(a)).collect();
    let _ = ask(&gw, Transport::Sse).await;
    let next = gw.requests(1).await.remove(0);
    for i in known_bad {
        let tried = next["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["account"] == order[i].as_str());
        check(
            &format!("account {i} left alone"),
            !tried && gw.served(&order[i]) == before[i],
            format!("the next request went to it: {next}"),
        );
    }
    wrong
}

/// Runs a row in every transport and scope and reports every cell that did not hold.
async fn run_row(name: &str) {
    let row = ROWS.iter().find(|r| r.name == name).unwrap();
    let mut failures = Vec::new();
    let mut cells = 0;
    for transport in [Transport::Json, Transport::Sse, Transport::Ws] {
        for scope in [Scope::One, Scope::Pool] {
            if (row.make)(transport).is_none() {
                continue;
            }
            cells += 1;
            for w in cell(row, transport, scope).await {
                failures.push(format!("{name} × {transport:?} × {scope:?}: {w}"));
            }
        }
    }
    assert!(cells > 0, "{name} has no cell");
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

macro_rules! matrix {
    ($($name:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                run_row(stringify!($name)).await;
            }
        )+

        #[test]
        fn every_row_has_its_test() {
            let tested = [$(stringify!($name)),+];
            for row in ROWS {
                assert!(tested.contains(&row.name), "{} is not run", row.name);
            }
            assert_eq!(tested.len(), ROWS.len());
        }
    };
}

matrix!(
    origin_refuses_connections,
    reset_before_headers,
    no_headers_in_time,
    quota_429,
    burst_429,
    token_expired_401,
    account_deactivated_401,
    cloudflare_challenge_403,
    server_error_503,
    model_unsupported_400,
    cyber_policy_400,
    context_length_400,
    unsupported_parameter_400,
    reset_after_headers,
    silent_after_headers,
    quota_event,
    rate_limit_event,
    overloaded_event,
    unknown_code_event,
    cyber_policy_event,
    context_length_event,
    quota_after_output,
    rate_limit_after_output,
    overloaded_after_output,
    unknown_code_after_output,
    cyber_policy_after_output,
    context_length_after_output,
    reset_after_output,
    silent_after_output,
    websocket_closed_after_output,
);
