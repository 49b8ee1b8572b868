//! `POST /v1/responses` (JSON or SSE) and `POST /v1/responses/compact`: authenticate, read and
//! parse the body once, hand the request to the dispatcher, and turn its frames into the HTTP
//! answer — with keep-alive comments when the first event is slow.

use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dispatch::frames::Frames;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use futures_util::stream;
use serde_json::{Map, Value};

use super::AppState;
use super::error::ApiError;
use super::server::ClientConn;
use crate::base::json_scan::{Scan, Seen};
use crate::base::raw_json::RawObject;
use crate::dispatch::{ErrorReply, Frame, Mode, RequestCtx};
use crate::keys::KeyIdentity;
use crate::keys::memory::{Charge, OverBudget};
use crate::upstream::SESSION_HEADERS;
use crate::upstream::event::Event;
use crate::upstream::{headers, identity};

/// Interval of `: keep-alive` comments while an SSE client waits.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(10);

/// Checks the client key (`Authorization: Bearer sk-sy-…`).
pub fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<KeyIdentity, ApiError> {
    // `x-api-key` too: the Anthropic SDKs and Claude Code send the key there.
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    let Some(presented) = presented.filter(|p| !p.is_empty()) else {
        return Err(ApiError::unauthorized(
            "You didn't provide an API key. Pass your Switchyard key as `Authorization: Bearer sk-sy-…`.",
        ));
    };
    state.keys.authenticate(presented).ok_or_else(|| {
        ApiError::unauthorized(
            "Incorrect API key provided. Create one with `switchyard key create NAME`.",
        )
    })
}

/// Reads the body up to the configured cap (413 beyond it), and decodes it as its
/// `Content-Encoding` says (the cap applies to the decoded bytes too). `declared` is the
/// length its head declares ([`declared_length`], read once per request).
///
/// With a `charge`, the key pays for the body in its memory budget as it arrives (and for the
/// decoded body, when it is larger): 429 when the budget has no room for it.
pub async fn read_body(
    state: &AppState,
    (headers, declared): (&HeaderMap, Option<u64>),
    body: Body,
    mut charge: Option<&mut Charge>,
) -> Result<Bytes, ApiError> {
    let raw = read_limited(state, declared, body, true, charge.as_deref_mut()).await?;
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok());
    if encoding.is_none() {
        return Ok(raw);
    }
    let cap = state.max_body_bytes;
    let decoded = crate::upstream::encoding::decode(encoding, raw, cap);
    if let (Ok(decoded), Some(charge)) = (&decoded, charge) {
        charge
            .set(decoded.len())
            .map_err(|e| over_budget(e, "this request body, decoded,"))?;
    }
    decoded.map_err(|e| match e {
        crate::upstream::encoding::DecodeError::TooLarge(_) => too_large(cap),
        crate::upstream::encoding::DecodeError::Unsupported(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            Some("unsupported_content_encoding"),
            e.to_string(),
        ),
        crate::upstream::encoding::DecodeError::Invalid { .. } => {
            ApiError::bad_request("invalid_body", e.to_string())
        }
    })
}

fn too_large(cap: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        Some("request_too_large"),
        format!("the request body exceeds {cap} bytes"),
    )
}

/// `Content-Length`, when the client gave one.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// A body larger than the cap by its own `Content-Length` (`declared`): refused from the head.
fn declared_too_large(state: &AppState, declared: Option<u64>) -> Option<ApiError> {
    let cap = state.max_body_bytes;
    declared
        .is_some_and(|n| n > cap as u64)
        .then(|| too_large(cap))
}

/// A key out of memory budget ([`crate::keys::memory`]).
pub fn over_budget(e: OverBudget, what: &str) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        Some("key_memory_limit_reached"),
        e.message(what),
    )
}

fn body_timeout(message: String) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "invalid_request_error",
        Some("request_timeout"),
        message,
    )
}

/// The body's bytes as sent, up to the cap, within `[server] body_timeout` and no slower
/// than `body_min_rate` on average once its first seconds are over
/// ([`super::BodyLimits::grace`]).
/// With `keep` false they are counted and dropped (a refused request's body, read so the
/// answer is not lost to a reset). A `charge` pays for what is kept, ahead of it: the length
/// the head declares before any of it is read, and what arrives beyond that as it arrives.
async fn read_limited(
    state: &AppState,
    declared: Option<u64>,
    mut body: Body,
    keep: bool,
    mut charge: Option<&mut Charge>,
) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let cap = state.max_body_bytes;
    let limits = state.body_limits;
    let start = tokio::time::Instant::now();
    let deadline = start + limits.timeout;
    let reserve = if keep {
        declared.map_or(0, |n| usize::try_from(n).unwrap_or(cap).min(cap))
    } else {
        0
    };
    let mut pay = |total: usize| match charge.as_deref_mut() {
        Some(c) if total > c.bytes() => c
            .set(total)
            .map_err(|e| over_budget(e, "this request body")),
        _ => Ok(()),
    };
    pay(reserve)?;
    let mut buf = BytesMut::with_capacity(reserve);
    let mut received: u64 = 0;
    let judged_from = start + limits.grace();
    // One timer for both limits: it fires at the deadline or at the next check of the rate
    // (the first when the grace is over, then a second after each), whichever comes first.
    let wake = tokio::time::sleep_until(judged_from.min(deadline));
    tokio::pin!(wake);
    // Read on the connection's own task: on its serving thread (`base::cores`) the wake that
    // taking a chunk gives that task is a local one. Arming the timer writes to the runtime's
    // wake-up descriptor, so it is armed only for a body that is not there yet: the usual one
    // comes with its head, and hyper hands it over once its task has run again (`pass`); its
    // end is known from its length.
    let mut passed = false;
    while !hyper::body::Body::is_end_stream(&body) {
        let frame = tokio::select! {
            biased;
            f = body.frame() => f,
            () = pass(), if !passed => {
                passed = true;
                continue;
            }
            () = &mut wake, if passed => {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return Err(body_timeout(format!(
                        "the request body did not arrive within {}",
                        crate::base::duration::human_duration(
                            crate::base::duration::whole_ms(limits.timeout)
                        )
                    )));
                }
                let judged = now.saturating_duration_since(judged_from);
                let due = (limits.min_rate as f64 * judged.as_secs_f64()) as u64;
                if received < due {
                    return Err(body_timeout(format!(
                        "the request body arrived slower than {} bytes a second",
                        limits.min_rate
                    )));
                }
                wake.as_mut().reset((now + Duration::from_secs(1)).min(deadline));
                continue;
            }
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| {
            ApiError::bad_request("invalid_body", format!("cannot read the request body: {e}"))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received += data.len() as u64;
        if received > cap as u64 {
            return Err(too_large(cap));
        }
        if keep {
            pay(buf.len() + data.len())?;
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// Pending once, its task woken at once to look again: on a single-threaded runtime a local
/// wake, with no system call.
fn pass() -> impl std::future::Future<Output = ()> {
    let mut looked = false;
    std::future::poll_fn(move |cx| {
        if looked {
            return std::task::Poll::Ready(());
        }
        looked = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
}

/// Reads a JSON object body once ([`RawObject`]), answering 400 with the parse position when
/// it is not one.
pub fn parse_object(bytes: &[u8]) -> Result<RawObject<'_>, ApiError> {
    RawObject::parse(bytes).map_err(|e| ApiError::bad_request("invalid_json", e.to_string()))
}

pub fn session_key(headers: &HeaderMap, body: &RawObject<'_>) -> Option<String> {
    session_from_headers(headers).or_else(|| body.str("prompt_cache_key").map(Cow::into_owned))
}

/// `client_metadata` alone, as a tree (it is small): what the device-id functions read.
fn metadata_of(obj: &RawObject<'_>) -> Map<String, Value> {
    obj.tree("client_metadata")
        .map(|m| Map::from_iter([("client_metadata".to_string(), m)]))
        .unwrap_or_default()
}

/// Replaces the device ids of `obj`'s `client_metadata` by the placeholder, in place.
pub fn normalise_ids(obj: &mut RawObject<'_>) {
    let mut meta = metadata_of(obj);
    identity::normalise(&mut meta);
    if let Some(m) = meta.get("client_metadata") {
        obj.set("client_metadata", m);
    }
}

/// The device ids of `obj`'s `client_metadata`.
pub fn body_ids(obj: &RawObject<'_>) -> Vec<String> {
    identity::body_ids(&metadata_of(obj))
}

/// The client's connection (absent on the admin socket), to tell a stalled client from one
/// that left.
pub type Conn = Option<axum::Extension<Arc<ClientConn>>>;

pub async fn create(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let conn = request.extensions().get::<Arc<ClientConn>>().cloned();
    create_on(state, conn, request, false).await
}

pub async fn compact(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let conn = request.extensions().get::<Arc<ClientConn>>().cloned();
    create_on(state, conn, request, true).await
}

/// A create (or, `compact`, a compaction) request that came on the client connection `conn`,
/// taken apart into its headers and body (the extractors for them copy them).
pub async fn create_on(
    state: Arc<AppState>,
    conn: Option<Arc<ClientConn>>,
    request: Request,
    compact: bool,
) -> Response {
    let (parts, body) = request.into_parts();
    handle(
        state,
        conn.map(axum::Extension),
        parts.headers,
        body,
        compact,
    )
    .await
}

async fn handle(
    state: Arc<AppState>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
    compact: bool,
) -> Response {
    let kind = if compact { Turn::Compact } else { Turn::Http };
    let admitted = match admit_and_read(&state, conn, &headers, body, kind).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let mut ctx = match request_ctx_from_bytes(
        &state,
        &admitted.key,
        &headers,
        (admitted.bytes.clone(), admitted.session.clone()),
        kind,
        admitted.received,
    ) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    // This edge writes what the backend streamed as it came.
    ctx.sse_out = true;
    let mode = ctx.mode;
    let rx = admitted.dispatch(&state, ctx);
    respond(
        rx,
        mode == Mode::Stream,
        state.dispatcher.current().keepalive_after,
    )
    .await
}

/// A request admitted on its head, with its body read (and paid for in the key's memory).
pub struct Admitted {
    pub key: KeyIdentity,
    pub bytes: Bytes,
    pub received: Instant,
    /// The session its headers name (read once, for the admission).
    pub session: Option<String>,
    permit: Arc<crate::keys::KeyPermit>,
    charge: Charge,
    conn: Option<Arc<ClientConn>>,
}

impl Admitted {
    /// Hands the request to the dispatcher with the admission's slot and memory; reading the
    /// returned frames runs it.
    pub fn dispatch(self, state: &AppState, mut ctx: RequestCtx) -> Frames {
        ctx.key_permit = Some(self.permit);
        ctx.memory = Some(Arc::new(self.charge));
        ctx.stalled = self.conn.map(|c| c.stall_flag());
        state.dispatcher.start(ctx)
    }
}

/// What every `/v1` POST does before its body means anything: the key, a body too large by
/// its own word, the key's policy on the head (holding one of its slots while the body is
/// read), then the body within its limits. `Err` is the answer to give.
pub async fn admit_and_read(
    state: &Arc<AppState>,
    conn: Conn,
    headers: &HeaderMap,
    body: Body,
    kind: Turn,
) -> Result<Admitted, Response> {
    let received = Instant::now();
    let key = authenticate(state, headers).map_err(IntoResponse::into_response)?;
    let declared = declared_length(headers);
    if let Some(e) = declared_too_large(state, declared) {
        return Err(closing(e.into_response()));
    }
    let conn = conn.map(|axum::Extension(c)| c);
    let session = session_from_headers(headers);
    let head = || head_ctx(&key, kind, session.clone(), received);
    let permit = match state
        .dispatcher
        .admit_head(
            (&key.id, received),
            head,
            declared.unwrap_or(0),
            std::future::pending(),
        )
        .await
    {
        Ok(p) => p,
        Err(tail) => {
            let _reading = conn.as_ref().map(ClientConn::reading_body);
            // Read and dropped, so the client sees the answer rather than a reset.
            return Err(
                match read_limited(state, declared, body, false, None).await {
                    Ok(_) => tail_response(tail),
                    Err(e) => closing(e.into_response()),
                },
            );
        }
    };
    let mut charge = state.key_memory.charge(&key.id);
    let bytes = {
        let _reading = conn.as_ref().map(ClientConn::reading_body);
        read_body(state, (headers, declared), body, Some(&mut charge)).await
    };
    let bytes = bytes.map_err(|e| closing(e.into_response()))?;
    Ok(Admitted {
        key,
        bytes,
        received,
        session,
        permit,
        charge,
        conn,
    })
}

/// An answer after which the connection is closed: what is left of the request's body is
/// not read.
fn closing(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// A request as its head describes it, for its admission before the body is read: no model
/// and no body yet, and none of the headers that only an attempt sends upstream.
fn head_ctx(
    key: &KeyIdentity,
    turn: Turn,
    session: Option<String>,
    received: Instant,
) -> RequestCtx {
    let mode = match turn {
        Turn::Compact => Mode::Compact,
        Turn::Http | Turn::WebSocket => Mode::Stream,
    };
    ctx_of(
        key,
        &HeaderMap::new(),
        (String::new(), mode, turn),
        (session, None),
        (Bytes::new(), identity::ClientIds::default()),
        received,
    )
}

/// The answer of a request that ended before it was dispatched (its refusal).
fn tail_response(tail: Vec<Frame>) -> Response {
    match tail.into_iter().next() {
        Some(Frame::Error(reply)) => error_response(*reply),
        _ => ApiError::internal("the request ended without an answer").into_response(),
    }
}

/// Where a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    Http,
    Compact,
    /// A `response.create` on a downstream WebSocket (always streamed).
    WebSocket,
}

/// The fields of a request body the gateway reads, borrowed from it.
#[derive(serde::Deserialize, Debug, PartialEq)]
struct Peek<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    prompt_cache_key: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    previous_response_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    service_tier: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    client_metadata: Option<PeekMetadata<'a>>,
}

/// The device ids of `client_metadata`, borrowed.
#[derive(serde::Deserialize, Debug, PartialEq)]
struct PeekMetadata<'a> {
    #[serde(borrow, default, rename = "x-codex-installation-id")]
    installation_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, rename = "x-codex-turn-metadata")]
    turn_metadata: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> Peek<'a> {
    /// The peek of a body: scanned, or read by `serde_json` where the scan leaves it to a
    /// full reader (`None` when that refuses it too).
    fn of(bytes: &'a [u8]) -> Option<Peek<'a>> {
        Peek::scan(bytes).or_else(|| crate::base::raw_json::from_bytes(bytes).ok())
    }

    /// The same as its derived reader gives, read by a scan of the text; `None` for what the
    /// scan leaves to that reader (a field twice, a field of another type, bad JSON).
    fn scan(text: &'a [u8]) -> Option<Peek<'a>> {
        let mut peek = Peek {
            model: None,
            stream: None,
            prompt_cache_key: None,
            previous_response_id: None,
            service_tier: None,
            client_metadata: None,
        };
        let mut seen = Seen::default();
        let mut s = Scan::new(text);
        s.members(|s, key| match key {
            b"model" => seen.set(0, &mut peek.model, s.text_or_null()),
            b"stream" => seen.set(1, &mut peek.stream, s.bool_or_null()),
            b"prompt_cache_key" => seen.set(2, &mut peek.prompt_cache_key, s.text_or_null()),
            b"previous_response_id" => {
                seen.set(3, &mut peek.previous_response_id, s.text_or_null())
            }
            b"service_tier" => seen.set(4, &mut peek.service_tier, s.text_or_null()),
            b"client_metadata" => {
                let meta = match s.peek()? {
                    b'n' => s.null().map(|()| None),
                    _ => PeekMetadata::scan(s).map(Some),
                };
                seen.set(5, &mut peek.client_metadata, meta)
            }
            _ => s.value(),
        })?;
        s.end()?;
        Some(peek)
    }
}

impl<'a> PeekMetadata<'a> {
    fn scan(s: &mut Scan<'a>) -> Option<PeekMetadata<'a>> {
        let mut meta = PeekMetadata {
            installation_id: None,
            turn_metadata: None,
        };
        let mut seen = Seen::default();
        s.members(|s, key| match key {
            n if n == identity::INSTALLATION_FIELD.as_bytes() => {
                seen.set(0, &mut meta.installation_id, s.text_or_null())
            }
            n if n == identity::TURN_METADATA_FIELD.as_bytes() => {
                seen.set(1, &mut meta.turn_metadata, s.text_or_null())
            }
            _ => s.value(),
        })?;
        Some(meta)
    }
}

impl PeekMetadata<'_> {
    fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.installation_id.iter().map(|i| i.to_string()).collect();
        ids.extend(
            self.turn_metadata
                .as_deref()
                .and_then(identity::turn_metadata_id),
        );
        ids
    }
}

/// The device ids a request's headers carry: `x-codex-installation-id` and the one inside the
/// turn-metadata header.
fn header_ids(h: &HeaderMap) -> Vec<String> {
    // Named once: a name given as text is parsed and checked on every lookup.
    static INSTALLATION: HeaderName = HeaderName::from_static(identity::INSTALLATION_FIELD);
    static TURN_METADATA: HeaderName = HeaderName::from_static(identity::TURN_METADATA_FIELD);
    let [installation, turn_metadata] =
        headers::first_values(h, [&INSTALLATION, &TURN_METADATA]).map(|v| v?.to_str().ok());
    let mut ids: Vec<String> = installation.map(str::to_string).into_iter().collect();
    ids.extend(turn_metadata.and_then(identity::turn_metadata_id));
    ids
}

/// The dispatcher's view of a request from its body as received. When the body needs no change
/// — its model is no alias and it already asks for a stream (what Codex CLI sends) — it goes
/// upstream byte for byte, read once without being built into a tree; otherwise it is parsed,
/// changed and encoded again ([`request_ctx`]). `head_session` is the session its headers
/// name, as the admission read it.
pub fn request_ctx_from_bytes(
    state: &AppState,
    key: &KeyIdentity,
    headers: &HeaderMap,
    (bytes, head_session): (Bytes, Option<String>),
    turn: Turn,
    received: Instant,
) -> Result<RequestCtx, ApiError> {
    if let Some(peek) = Peek::of(&bytes)
        && let Some(model) = peek.model.as_deref().filter(|m| !m.is_empty())
        && !state.dispatcher.current().aliases.contains_key(model)
        && (turn == Turn::Compact || peek.stream == Some(true))
        && let ids = client_ids(
            headers,
            peek.client_metadata.map(|m| m.ids()).unwrap_or_default(),
        )
        && ids.all_searchable()
    {
        let mode = match turn {
            Turn::Compact => Mode::Compact,
            Turn::Http | Turn::WebSocket => Mode::Stream,
        };
        let session = head_session.or_else(|| peek.prompt_cache_key.as_deref().map(str::to_string));
        let previous_response_id = peek
            .previous_response_id
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        let model = model.to_string();
        let mut ctx = ctx_of(
            key,
            headers,
            (model, mode, turn),
            (session, previous_response_id),
            (bytes.clone(), ids),
            received,
        );
        ctx.service_tier = peek.service_tier.map(Cow::into_owned);
        return Ok(ctx);
    }
    request_ctx(state, key, headers, parse_object(&bytes)?, turn, received)
}

/// The device ids of a request, from its headers and its body's `client_metadata`.
fn client_ids(h: &HeaderMap, body: Vec<String>) -> identity::ClientIds {
    let ids = header_ids(h);
    identity::ClientIds::of(ids.iter().chain(&body).map(String::as_str))
}

fn session_from_headers(headers: &HeaderMap) -> Option<String> {
    headers::first_values(headers, SESSION_HEADERS.each_ref())
        .into_iter()
        .find_map(|v| v?.to_str().ok().filter(|v| !v.is_empty()))
        .map(str::to_string)
}

/// Builds the dispatcher's view of a request from its parsed body and headers: the model alias
/// resolved, streaming forced upstream, the session key, the headers passed through.
pub fn request_ctx(
    state: &AppState,
    key: &KeyIdentity,
    headers: &HeaderMap,
    mut obj: RawObject<'_>,
    turn: Turn,
    received: Instant,
) -> Result<RequestCtx, ApiError> {
    let model = obj
        .str("model")
        .filter(|m| !m.is_empty())
        .map(Cow::into_owned)
        .ok_or_else(|| {
            ApiError::bad_request(
                "missing_required_parameter",
                "Missing required parameter: 'model'.",
            )
        })?;
    let upstream_model = state.dispatcher.resolve_model(&model);
    let mode = match turn {
        Turn::Compact => Mode::Compact,
        Turn::WebSocket => Mode::Stream,
        Turn::Http if obj.bool("stream").unwrap_or(false) => Mode::Stream,
        Turn::Http => Mode::Json,
    };
    obj.set("model", &upstream_model);
    if mode != Mode::Compact {
        // The backend streams; a JSON client gets the final response assembled from it.
        obj.set("stream", &true);
    }
    let mut ids = client_ids(headers, body_ids(&obj));
    let normalised = !ids.all_searchable();
    if normalised {
        // Replaced in the body by an id that can be replaced per account in bytes.
        normalise_ids(&mut obj);
        ids = identity::ClientIds::of(
            header_ids(headers)
                .iter()
                .map(String::as_str)
                .filter(|id| identity::searchable(id))
                .chain([identity::PLACEHOLDER]),
        );
    }
    let session = session_key(headers, &obj);
    let previous_response_id = obj
        .str("previous_response_id")
        .filter(|s| !s.is_empty())
        .map(Cow::into_owned);
    let service_tier = obj.str("service_tier").map(Cow::into_owned);
    let body = Bytes::from(obj.encode());
    drop(obj);
    let mut ctx = ctx_of(
        key,
        headers,
        (upstream_model, mode, turn),
        (session, previous_response_id),
        (body, ids),
        received,
    );
    ctx.service_tier = service_tier;
    if normalised {
        normalise_headers(&mut ctx.pass_headers);
    }
    Ok(ctx)
}

/// The context of a request whose upstream body is ready.
fn ctx_of(
    key: &KeyIdentity,
    headers: &HeaderMap,
    (model, mode, turn): (String, Mode, Turn),
    (session, previous_response_id): (Option<String>, Option<String>),
    (body, client_ids): (Bytes, identity::ClientIds),
    received: Instant,
) -> RequestCtx {
    let pass_headers = headers::forwarded(headers);
    RequestCtx {
        key_id: key.id.clone(),
        key_name: key.name.clone(),
        model,
        mode,
        body,
        client_ids,
        pass_headers,
        turn_state: headers
            .get(&crate::upstream::TURN_STATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        session,
        previous_response_id,
        ws: turn == Turn::WebSocket,
        ws_turn: None,
        stalled: None,
        path: match turn {
            Turn::Compact => "/v1/responses/compact",
            Turn::Http | Turn::WebSocket => "/v1/responses",
        },
        received,
        key_permit: None,
        memory: None,
        service_tier: None,
        sse_out: false,
    }
}

/// The turn-metadata header with its device id replaced by the placeholder, for ids that
/// cannot be replaced in bytes.
fn normalise_headers(h: &mut [(HeaderName, HeaderValue)]) {
    for (k, v) in h.iter_mut() {
        if k.as_str() == identity::TURN_METADATA_FIELD
            && let Some(text) = v.to_str().ok().and_then(identity::normalise_turn_metadata)
            && let Ok(new) = HeaderValue::from_str(&text)
        {
            *v = new;
        }
    }
}

/// Turns the dispatcher's frames into the HTTP answer.
async fn respond(mut rx: Frames, sse: bool, keepalive_after: Duration) -> Response {
    let first = if sse {
        match crate::base::deadline::timeout(keepalive_after, rx.recv()).await {
            Ok(f) => f,
            Err(_) => return keepalive_response(rx),
        }
    } else {
        rx.recv().await
    };
    match first {
        Some(Frame::Head { status, headers }) => {
            let mut resp = Response::new(Body::from_stream(data_stream(rx)));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            for (k, v) in headers {
                resp.headers_mut().append(k, v);
            }
            resp
        }
        Some(Frame::Error(reply)) => error_response(*reply),
        Some(other) => match encode(other) {
            Some(b) => (StatusCode::OK, b).into_response(),
            None => ApiError::internal("the request ended without an answer").into_response(),
        },
        None => ApiError::internal("the request ended without an answer").into_response(),
    }
}

/// Frames events as SSE, all in one buffer: an `event:` line with the type, then the data
/// (one `data:` line per line of it).
pub fn sse(events: &[Event]) -> Bytes {
    let len: usize = events.iter().map(Event::sse_room).sum();
    let mut out = BytesMut::with_capacity(len);
    for e in events {
        e.write_sse(&mut out);
    }
    out.freeze()
}

/// The bytes of a frame after the head; `None` for the head itself.
fn encode(frame: Frame) -> Option<Bytes> {
    match frame {
        Frame::Head { .. } => None,
        Frame::Events(events) => Some(sse(&events)),
        Frame::Sse(b) => Some(b),
        Frame::Body(b) => Some(b),
        Frame::KeepAlive => Some(Bytes::from_static(KEEPALIVE)),
        Frame::Error(reply) => Some(sse(&[reply.as_failed_event()])),
    }
}

const KEEPALIVE: &[u8] = b": keep-alive\n\n";

pub fn error_response(reply: ErrorReply) -> Response {
    let mut resp = Response::new(Body::from(reply.body));
    *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Ok(ct) = HeaderValue::from_str(&reply.content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    for (k, v) in reply.headers {
        resp.headers_mut().append(k, v);
    }
    resp
}

/// The body after the head: data frames as they come; the channel closing ends it.
fn data_stream(rx: Frames) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    stream::unfold(rx, |mut rx| async move {
        loop {
            if let Some(b) = encode(rx.recv().await?) {
                return Some((Ok(b), rx));
            }
        }
    })
}

/// 200 headers now, `: keep-alive` comments until the dispatcher commits; a failure then
/// arrives as a `response.failed` event with the same code and message.
fn keepalive_response(rx: Frames) -> Response {
    struct S {
        rx: Frames,
        tick: tokio::time::Interval,
        done: bool,
    }
    let mut tick = tokio::time::interval(KEEPALIVE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let s = S {
        rx,
        tick,
        done: false,
    };
    let body = stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        loop {
            tokio::select! {
                f = s.rx.recv() => match f {
                    Some(frame) => {
                        s.done = matches!(frame, Frame::Error(_));
                        if let Some(b) = encode(frame) {
                            return Some((Ok::<Bytes, Infallible>(b), s));
                        }
                    }
                    None => return None,
                },
                _ = s.tick.tick() => return Some((Ok(Bytes::from_static(KEEPALIVE)), s)),
            }
        }
    });
    sse_response(Body::from_stream(body))
}

/// A `text/event-stream` response of `body`.
pub fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan of a body gives what the derived reader gives, or leaves the body to it.
    #[test]
    fn a_body_scanned_peeks_as_the_derived_reader_reads_it() {
        fn read(t: &str) -> Option<Peek<'_>> {
            serde_json::from_str(t).ok()
        }
        let scanned = [
            r#"{"model":"gpt-5.5","instructions":"x\n","input":[{"type":"message","content":[{"text":"h\u00e9"}]}],"stream":true,"prompt_cache_key":"s1","service_tier":"priority","previous_response_id":null,"client_metadata":{"x-codex-installation-id":"inst","x-codex-turn-metadata":"{\"session_id\":\"a\"}","other":[1]}}"#,
            r#" { "mod\u0065l" : "m\u00e9" , "stream" : false , "client_metadata" : null } "#,
            r#"{"stream":null,"tools":[],"n":-1.5e3,"x":{"model":7}}"#,
            "{}",
        ];
        for t in scanned {
            let got = Peek::scan(t.as_bytes());
            assert!(got.is_some(), "{t}");
            assert_eq!(got, read(t), "{t}");
        }
        // Left to the reader: it may take these (an array) or refuse them.
        let left = [
            r#"{"model":"a","model":"b"}"#,
            r#"{"stream":"yes"}"#,
            r#"{"model":7}"#,
            r#"{"client_metadata":[]}"#,
            r#"{"client_metadata":{"x-codex-installation-id":1}}"#,
            r#"{"client_metadata":{"x-codex-installation-id":"a","x-codex-installation-id":"b"}}"#,
            r#"{"model":"\ud800"}"#,
            r#"["gpt-5.5",true]"#,
            r#"{"model":"a"} x"#,
            r#"{"model":"a""#,
        ];
        for t in left {
            assert_eq!(Peek::scan(t.as_bytes()), None, "{t}");
        }
        assert!(read(left[7]).is_some());
        assert_eq!(Peek::of(left[7].as_bytes()), read(left[7]));
        // Borrowed from the body where written without escapes, as the reader borrows.
        let peek = Peek::scan(scanned[0].as_bytes()).unwrap();
        assert!(matches!(peek.model, Some(Cow::Borrowed("gpt-5.5"))));
    }

    /// A block already in the edge's form goes out as it came; any other is framed from its type
    /// and data, and both come out as the framing of the type and data alone would make them.
    #[test]
    fn events_go_out_framed_as_their_type_and_data_say_whether_or_not_kept_as_received() {
        use crate::upstream::event::Event;
        use crate::upstream::sse::{Piece, SseSplitter};
        let cases: [(&[u8], bool); 12] = [
            (b"event: response.created\ndata: {\"a\":1}\n\n", true),
            (
                b"event: response.output_text.delta\ndata:  {\"d\":\"x\"}\n\n",
                true,
            ),
            (b"event: response.created\r\ndata: {}\r\n\r\n", false),
            (b"event:response.created\ndata:{}\n\n", false),
            (b"event:  response.created\ndata: {}\n\n", false),
            (b"event: response.created \ndata: {}\n\n", false),
            (b"data: {}\nevent: response.created\n\n", false),
            (b"event: response.created\nid: 7\ndata: {}\n\n", false),
            (
                b"event: response.created\ndata: {\"a\":\ndata: 1}\n\n",
                false,
            ),
            (b"data: {\"type\":\"response.created\"}\n\n", false),
            (b"event: r\xc3\xa9ponse\ndata: {}\n\n", false),
            (b"event: \xff\ndata: {}\n\n", false),
        ];
        for (block, kept) in cases {
            let mut split = SseSplitter::new(1 << 20);
            split.push(block);
            let Ok(Some(Piece::Event(ev))) = split.next_piece() else {
                panic!("no event in {:?}", String::from_utf8_lossy(block));
            };
            let shown = String::from_utf8_lossy(block);
            assert_eq!(ev.framed().is_some(), kept, "{shown}");
            let plain = Event::new(
                Bytes::copy_from_slice(ev.kind().as_bytes()),
                ev.data_bytes(),
            );
            if !ev.kind().is_empty() {
                assert_eq!(ev, plain, "{shown}");
            }
            assert!(plain.framed().is_none());
            assert_eq!(sse(std::slice::from_ref(&ev)), sse(&[plain]), "{shown}");
            if kept {
                assert_eq!(&sse(&[ev])[..], block);
            }
        }
    }
}
