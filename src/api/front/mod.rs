//! Front doors other than the Responses API, each a translation onto the Responses request the
//! pool serves (so each inherits key policy, budgets, scheduling, affinity, failover and the
//! request record): Chat Completions, Anthropic Messages and Images. What they share is here:
//! handing a translated request to the pool, waiting for its terminal event, and streaming
//! its events re-encoded.

pub mod chat;
pub mod images;
pub mod messages;

use crate::dispatch::frames::Frames;
use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::responses::{self, Admitted, Turn};
use crate::dispatch::{ErrorReply, Frame};
use crate::upstream::event::Event;

/// Hands a translated (Responses) request to the pool, its context built as `/v1/responses`
/// builds one and named by the door's `path`; its frames come on the channel.
pub fn dispatch(
    state: &AppState,
    admitted: Admitted,
    headers: &HeaderMap,
    translated: &Value,
    path: &'static str,
) -> Result<Frames, ApiError> {
    let bytes = Bytes::from(translated.to_string());
    let obj = responses::parse_object(&bytes)?;
    let mut ctx = responses::request_ctx(
        state,
        &admitted.key,
        headers,
        obj,
        Turn::Http,
        admitted.received,
    )?;
    ctx.path = path;
    Ok(admitted.dispatch(state, ctx))
}

/// An event's JSON.
pub fn parsed(e: &Event) -> Value {
    serde_json::from_slice(e.data()).unwrap_or(Value::Null)
}

/// How a request the door answers in one piece ended.
pub enum Ended {
    /// Its terminal event (`response.completed`, `.incomplete` or `.failed`): kind and JSON.
    Terminal(String, Value),
    /// The error that came instead of an answer.
    Error(Box<ErrorReply>),
    /// The channel closed without either.
    Nothing,
}

/// Waits for the request's end.
pub async fn terminal(mut rx: Frames) -> Ended {
    while let Some(frame) = rx.recv().await {
        match frame {
            Frame::Error(reply) => return Ended::Error(reply),
            Frame::Events(events) => {
                if let Some(e) = events.iter().find(|e| {
                    matches!(
                        e.kind(),
                        "response.completed" | "response.incomplete" | "response.failed"
                    )
                }) {
                    return Ended::Terminal(e.kind().to_string(), parsed(e));
                }
            }
            // No SSE frames: the doors do not ask for them (`RequestCtx::sse_out`).
            Frame::Head { .. } | Frame::Body(_) | Frame::KeepAlive | Frame::Sse(_) => {}
        }
    }
    Ended::Nothing
}

/// Streams a request's answer re-encoded: waits for its head (an error instead of one is
/// answered by `refused`, a channel closed first by `nothing`), then sends what `encode` makes
/// of each frame — bytes (empty: nothing to send) and whether the stream is done.
pub async fn event_stream<E>(
    mut rx: Frames,
    refused: impl FnOnce(ErrorReply) -> Response,
    nothing: impl FnOnce() -> Response,
    encode: E,
) -> Response
where
    E: FnMut(Frame) -> (Bytes, bool) + Send + 'static,
{
    loop {
        match rx.recv().await {
            Some(Frame::Head { .. }) => break,
            Some(Frame::Error(reply)) => return refused(*reply),
            Some(_) => {}
            None => return nothing(),
        }
    }
    let body = futures_util::stream::unfold(
        (rx, encode, false),
        |(mut rx, mut encode, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let (bytes, done) = encode(rx.recv().await?);
                if bytes.is_empty() && !done {
                    continue;
                }
                return Some((
                    Ok::<Bytes, std::convert::Infallible>(bytes),
                    (rx, encode, done),
                ));
            }
        },
    );
    responses::sse_response(Body::from_stream(body))
}
