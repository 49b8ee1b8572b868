//! The HTTP/1.1 server: hyper directly (not axum), so that a handler can drop a connection
//! without answering and a body can cut a stream with a reset. WebSocket upgrades of
//! `/backend-api/codex/responses` are handed to `ws`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{RecordedRequest, Sim, backend, control, login, oauth, ws};

/// Request bodies above this are refused with 413.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

pub(crate) type SimBody = UnsyncBoxBody<Bytes, io::Error>;

/// One piece of a response body.
#[derive(Debug)]
pub(crate) enum Step {
    Data(Bytes),
    Pause(Duration),
    /// The connection is reset here (the body yields an error).
    Reset,
    /// Nothing more is ever sent.
    Hang,
}

/// What a handler decided.
pub(crate) enum Reply {
    Response(Response<SimBody>),
    /// Drop the connection without answering.
    Reset,
}

pub(crate) struct Outcome {
    pub reply: Reply,
    pub headers_delay: Option<Duration>,
}

impl From<Response<SimBody>> for Outcome {
    fn from(r: Response<SimBody>) -> Self {
        Outcome {
            reply: Reply::Response(r),
            headers_delay: None,
        }
    }
}

/// A request as the handlers see it: fully read, headers lower-cased by hyper.
pub(crate) struct SimRequest {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body as JSON, `Null` if it is not JSON.
    pub json: Value,
    /// The client's address, as this end of the connection sees it.
    pub peer: String,
}

impl SimRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The error that makes hyper close a connection without a response.
#[derive(Debug, thiserror::Error)]
#[error("sim: connection reset on purpose")]
pub(crate) struct Dropped;

pub(crate) fn full(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<SimBody> {
    let mut r = Response::new(
        Full::new(body.into())
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

pub(crate) fn json(status: u16, v: &Value) -> Response<SimBody> {
    full(status, "application/json", v.to_string())
}

/// Counts an answer's body as open until it is dropped, and as cut when that happens before
/// its last step was played (its connection ended: the client went away).
pub(crate) struct OpenBody {
    sim: Sim,
    account: String,
    played: bool,
}

impl OpenBody {
    /// Counts a body of `account` as open (call with the state locked, through `account`).
    pub(crate) fn new(sim: &Sim, account: &mut super::state::Account) -> OpenBody {
        account.http_open += 1;
        OpenBody {
            sim: sim.clone(),
            account: account.id().to_string(),
            played: false,
        }
    }
}

impl Drop for OpenBody {
    fn drop(&mut self) {
        self.sim.http_closed(&self.account, !self.played);
    }
}

/// A body that plays `steps` in order; each data step is flushed on its own. `open` counts it
/// while it lives.
pub(crate) fn steps(
    status: u16,
    content_type: &str,
    steps: Vec<Step>,
    open: Option<OpenBody>,
) -> Response<SimBody> {
    let state = (steps.into_iter(), open);
    let stream = futures_util::stream::unfold(state, |(mut it, mut open)| async move {
        loop {
            let Some(step) = it.next() else {
                if let Some(o) = open.as_mut() {
                    o.played = true;
                }
                return None;
            };
            match step {
                Step::Data(b) => {
                    // Yielding once makes hyper flush what it has before the next event, so a
                    // client sees events one by one (and the bytes before a reset arrive).
                    tokio::task::yield_now().await;
                    return Some((Ok(Frame::data(b)), (it, open)));
                }
                Step::Pause(d) => tokio::time::sleep(d).await,
                Step::Reset => {
                    // Cut on purpose: played as planned.
                    if let Some(o) = open.as_mut() {
                        o.played = true;
                    }
                    tokio::task::yield_now().await;
                    let e = io::Error::new(io::ErrorKind::ConnectionReset, "sim: stream cut");
                    return Some((Err(e), (it, open)));
                }
                Step::Hang => std::future::pending::<()>().await,
            }
        }
    });
    let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

pub(crate) fn set_header(r: &mut Response<SimBody>, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        r.headers_mut().insert(name, v);
    }
}

/// Accepts connections until `shutdown` is cancelled; open connections end with it.
pub(crate) async fn serve(sim: Sim, listener: TcpListener, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, peer.to_string()),
            Err(e) => {
                // Out of file descriptors and the like: back off a little instead of spinning.
                tracing::warn!(error = %e, "sim: accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let sim = sim.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let stop = shutdown.clone();
            let svc = service_fn(move |req| handle(sim.clone(), stop.clone(), peer.clone(), req));
            let conn = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            tokio::select! {
                _ = conn => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}

async fn handle(
    sim: Sim,
    shutdown: CancellationToken,
    peer: String,
    mut req: Request<Incoming>,
) -> Result<Response<SimBody>, Dropped> {
    let at_ms = sim.now_ms();
    let upgrade = ws::wants_upgrade(req.method(), req.uri().path(), req.headers())
        .then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return Ok(json(
                    413,
                    &serde_json::json!({"detail": "Request body too large"}),
                ));
            }
            // The client went away while sending.
            return Err(Dropped);
        }
    };
    // Codex compresses request bodies under ChatGPT auth: the backend reads zstd and gzip.
    let body = match parts
        .headers
        .get(hyper::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    {
        None => body,
        Some(encoding) => {
            match crate::upstream::encoding::decode(Some(encoding), body, MAX_BODY_BYTES) {
                Ok(decoded) => decoded,
                Err(e) => {
                    return Ok(json(400, &serde_json::json!({"detail": e.to_string()})));
                }
            }
        }
    };
    let req = SimRequest {
        json: serde_json::from_slice(&body).unwrap_or(Value::Null),
        method: parts.method,
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers: parts.headers,
        body,
        peer,
    };
    let recorded = req.path.starts_with("/backend-api/")
        || matches!(req.path.as_str(), "/oauth/token" | "/oauth/authorize")
        || req.path.starts_with("/api/accounts/");
    let outcome = if let Some(on_upgrade) = upgrade {
        ws::handshake(&sim, &req, on_upgrade, &shutdown)
    } else if req.path == "/sim" || req.path.starts_with("/sim/") {
        control::handle(&sim, &req)
    } else if req.path == "/oauth/token" {
        oauth::handle(&sim, &req)
    } else if req.path == "/oauth/authorize" {
        login::authorize(&sim, &req)
    } else if req.path == WHOAMI {
        oauth::whoami(&sim, &req)
    } else if req.path == "/api/accounts/deviceauth/usercode" {
        login::usercode(&sim, &req)
    } else if req.path == "/api/accounts/deviceauth/token" {
        login::poll(&sim, &req)
    } else if req.path.starts_with("/backend-api/") {
        backend::handle(&sim, &req)
    } else if req.path.starts_with("/sink/") {
        super::sink::handle(&sim, &req)
    } else {
        json(404, &serde_json::json!({"detail": "Not Found"})).into()
    };
    if recorded {
        let status = match &outcome.reply {
            Reply::Response(r) => r.status().as_u16(),
            Reply::Reset => 0,
        };
        sim.record(record_of(req, at_ms, status));
    }
    if let Some(d) = outcome.headers_delay {
        tokio::time::sleep(d).await;
    }
    match outcome.reply {
        Reply::Response(r) => Ok(r),
        Reply::Reset => Err(Dropped),
    }
}

/// Where an access token is validated.
const WHOAMI: &str = "/api/accounts/v1/user-auth-credential/whoami";

fn record_of(req: SimRequest, at_ms: u64, status: u16) -> RecordedRequest {
    let headers = recorded_headers(&req.headers);
    let form = headers
        .get("content-type")
        .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    let body = match (&req.json, form) {
        (Value::Null, true) => oauth::params(&req).map_or(Value::Null, Value::Object),
        _ => req.json,
    };
    RecordedRequest {
        at_ms,
        method: req.method.to_string(),
        account_id: headers.get("chatgpt-account-id").cloned(),
        path: req.path,
        query: req.query,
        headers,
        body,
        status,
        peer: req.peer,
    }
}

/// Headers as a [`RecordedRequest`] keeps them: lower-case names, repeats joined with ", ".
pub(crate) fn recorded_headers(map: &HeaderMap) -> BTreeMap<String, String> {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in map {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    headers
}
