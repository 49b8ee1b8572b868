//! `POST /v1/messages` (and `/v1/messages/count_tokens`): the Anthropic Messages API on the
//! pool. A request is translated onto the Responses request the pool serves; its answer comes
//! back as one `message`, or as the Anthropic event sequence (`message_start`, `ping`,
//! `content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`). Errors are in
//! the Anthropic shape (`{"type":"error","error":{"type","message"}}`), exhaustion and a busy
//! pool as `rate_limit_error` (429, with `retry-after`) or `overloaded_error` (529).
//!
//! What maps: `system` (text or blocks) to `instructions`; `text`, `image` (base64 or URL),
//! `tool_use` and `tool_result` blocks to input messages, function calls and their outputs;
//! `tools` to functions (`input_schema` as parameters); `tool_choice` (`auto`, `any`, `tool`,
//! `none`); `thinking` to a reasoning effort by its budget (under 4,096 tokens low, under
//! 16,384 medium, else high) with the reasoning summary answered as `thinking` blocks;
//! `metadata.user_id` to the session (else a hash of the system text and first user turn).
//! Model names go through `[front_doors.anthropic] models` (globs), then its `default`.
//! `max_tokens`, `temperature`, `top_p`, `top_k` and `stop_sequences` are accepted and not
//! sent (the backend behind ChatGPT accounts refuses them).

use std::collections::HashMap;
use std::sync::Arc;

use crate::dispatch::frames::Frames;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::Ended;
use crate::api::AppState;
use crate::api::responses::{self, Admitted, Conn, Turn};
use crate::dispatch::{ErrorReply, Frame};

const DEFAULT_INSTRUCTIONS: &str = "You are a helpful assistant.";

/// An error in the Anthropic shape.
pub fn error(status: u16, kind: &str, message: impl Into<String>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    (
        status,
        axum::Json(json!({"type": "error", "error": {"type": kind, "message": message.into()}})),
    )
        .into_response()
}

/// The Anthropic error type of an HTTP status (and the status it is answered with: a busy or
/// dry pool that is not about quota is `overloaded_error`, 529).
fn kind_of(status: u16) -> (u16, &'static str) {
    match status {
        400 | 422 => (400, "invalid_request_error"),
        401 => (401, "authentication_error"),
        403 => (403, "permission_error"),
        404 => (404, "not_found_error"),
        413 => (413, "request_too_large"),
        429 => (429, "rate_limit_error"),
        502..=504 | 529 => (529, "overloaded_error"),
        _ => (500, "api_error"),
    }
}

/// The same answer in the Anthropic shape: its status mapped, its message kept, `retry-after`
/// kept.
async fn reshaped(resp: Response) -> Response {
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or("the request failed")
        .to_string();
    let (status, kind) = kind_of(parts.status.as_u16());
    let mut out = error(status, kind, message);
    if let Some(r) = parts.headers.get(header::RETRY_AFTER) {
        out.headers_mut().insert(header::RETRY_AFTER, r.clone());
    }
    out
}

fn reply_response(reply: ErrorReply) -> Response {
    let (status, kind) = kind_of(reply.status);
    let mut out = error(status, kind, reply.message);
    for (k, v) in reply.headers {
        if k == header::RETRY_AFTER {
            out.headers_mut().insert(k, v);
        }
    }
    out
}

fn bad(message: impl Into<String>) -> Response {
    error(400, "invalid_request_error", message)
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        _ => Vec::new(),
    }
}

/// The reasoning effort a thinking budget asks for.
fn effort(thinking: &Value) -> Option<&'static str> {
    if thinking["type"] != "enabled" {
        return None;
    }
    Some(match thinking["budget_tokens"].as_u64().unwrap_or(0) {
        0..4096 => "low",
        4096..16384 => "medium",
        _ => "high",
    })
}

/// The Responses request for a Messages one: `(request, stream, thinking)`.
pub fn translate(req: &Value, model: &str) -> Result<(Value, bool, bool), String> {
    let messages = req["messages"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or("messages: Field required")?;
    let mut input = Vec::new();
    // A `system` message among the messages (Claude Code sends some) joins the instructions.
    let mut more_system: Vec<String> = Vec::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or("");
        if role == "system" {
            more_system.push(text_of(&m["content"]));
            continue;
        }
        let mut parts: Vec<Value> = Vec::new();
        let flush = |parts: &mut Vec<Value>, input: &mut Vec<Value>| {
            if !parts.is_empty() {
                input.push(
                    json!({"type": "message", "role": role, "content": std::mem::take(parts)}),
                );
            }
        };
        for b in blocks(&m["content"]) {
            match (role, b["type"].as_str()) {
                ("user", Some("text")) => {
                    parts.push(json!({"type": "input_text", "text": b["text"]}))
                }
                ("assistant", Some("text")) => {
                    parts.push(json!({"type": "output_text", "text": b["text"]}));
                }
                ("user", Some("image")) => {
                    let s = &b["source"];
                    let url = match s["type"].as_str() {
                        Some("base64") => format!(
                            "data:{};base64,{}",
                            s["media_type"].as_str().unwrap_or("image/png"),
                            s["data"].as_str().unwrap_or("")
                        ),
                        Some("url") => s["url"].as_str().unwrap_or("").to_string(),
                        _ => return Err("image.source: base64 or url".into()),
                    };
                    parts.push(json!({"type": "input_image", "image_url": url}));
                }
                ("user", Some("tool_result")) => {
                    flush(&mut parts, &mut input);
                    let mut output = text_of(&b["content"]);
                    if b["is_error"].as_bool() == Some(true) {
                        output = format!("Error: {output}");
                    }
                    input.push(json!({"type": "function_call_output", "call_id": b["tool_use_id"], "output": output}));
                }
                ("assistant", Some("tool_use")) => {
                    flush(&mut parts, &mut input);
                    input.push(
                        json!({"type": "function_call", "call_id": b["id"], "name": b["name"],
                        "arguments": b["input"].to_string()}),
                    );
                }
                // Earlier thinking is the model's own; the backend keeps its reasoning itself.
                ("assistant", Some("thinking" | "redacted_thinking")) => {}
                (r, t) => {
                    return Err(format!(
                        "messages: a {} block in a {r} message is not supported",
                        t.unwrap_or("(typeless)")
                    ));
                }
            }
        }
        flush(&mut parts, &mut input);
    }
    let system = std::iter::once(text_of(&req["system"]))
        .chain(more_system)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    out.insert(
        "instructions".into(),
        json!(if system.is_empty() {
            DEFAULT_INSTRUCTIONS.to_string()
        } else {
            system.clone()
        }),
    );
    out.insert("input".into(), Value::Array(input));
    if let Some(tools) = req["tools"].as_array() {
        let tools: Vec<Value> = tools
            .iter()
            .filter(|t| t["type"].is_null() || t["type"] == "custom")
            .map(|t| {
                json!({"type": "function", "name": t["name"], "description": t["description"].as_str().unwrap_or(""),
                    "parameters": if t["input_schema"].is_null() { json!({"type": "object", "properties": {}}) } else { t["input_schema"].clone() }})
            })
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = req.get("tool_choice").filter(|c| c.is_object()) {
        let mapped = match choice["type"].as_str() {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "name": choice["name"]}),
            _ => return Err("tool_choice: auto, any, tool or none".into()),
        };
        out.insert("tool_choice".into(), mapped);
        if choice["disable_parallel_tool_use"].as_bool() == Some(true) {
            out.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    let thinking = effort(&req["thinking"]);
    if let Some(e) = thinking {
        out.insert("reasoning".into(), json!({"effort": e, "summary": "auto"}));
    }
    let session = match req["metadata"]["user_id"]
        .as_str()
        .filter(|u| !u.is_empty())
    {
        Some(u) => format!("messages-user-{u}"),
        None => {
            let mut h = Sha256::new();
            h.update(system.as_bytes());
            h.update([0]);
            if let Some(first) = messages.iter().find(|m| m["role"] == "user") {
                h.update(text_of(&first["content"]).as_bytes());
            }
            let d = h.finalize();
            format!(
                "messages-{}",
                d[..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            )
        }
    };
    out.insert("prompt_cache_key".into(), json!(session));
    out.insert("store".into(), json!(false));
    out.insert("stream".into(), json!(true));
    let stream = req["stream"].as_bool().unwrap_or(false);
    Ok((Value::Object(out), stream, thinking.is_some()))
}

fn message_id(response: &Value) -> String {
    let id = response["id"].as_str().unwrap_or("");
    format!("msg_{}", id.strip_prefix("resp_").unwrap_or(id))
}

fn usage_of(u: &Value) -> Value {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let cached = n(&u["input_tokens_details"]["cached_tokens"]);
    json!({
        "input_tokens": n(&u["input_tokens"]).saturating_sub(cached),
        "output_tokens": n(&u["output_tokens"]),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

fn stop_reason(response: &Value, tool_use: bool) -> &'static str {
    if response["status"] == "incomplete" {
        return "max_tokens";
    }
    if tool_use { "tool_use" } else { "end_turn" }
}

/// The `message` of a finished response.
pub fn message(response: &Value, model: &str, thinking: bool) -> Value {
    let mut content = Vec::new();
    for item in response["output"].as_array().into_iter().flatten() {
        match item["type"].as_str() {
            Some("reasoning") if thinking => {
                let text = item["summary"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                content.push(json!({"type": "thinking", "thinking": text, "signature": ""}));
            }
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    if let Some(t) = part["text"].as_str() {
                        content.push(json!({"type": "text", "text": t}));
                    }
                }
            }
            Some("function_call") => {
                let input: Value = item["arguments"]
                    .as_str()
                    .and_then(|a| serde_json::from_str(a).ok())
                    .unwrap_or_else(|| json!({}));
                content.push(json!({"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": input}));
            }
            _ => {}
        }
    }
    let tool_use = content.iter().any(|c| c["type"] == "tool_use");
    json!({
        "id": message_id(response),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(response, tool_use),
        "stop_sequence": null,
        "usage": usage_of(&response["usage"]),
    })
}

/// Turns Responses events into the Anthropic event sequence.
pub struct Sequencer {
    model: String,
    thinking: bool,
    started: bool,
    /// Output item id -> its content block's index.
    blocks: HashMap<String, usize>,
    /// The block open now, if any.
    open: Option<usize>,
    tool_use: bool,
    pub done: bool,
}

impl Sequencer {
    pub fn new(model: &str, thinking: bool) -> Sequencer {
        Sequencer {
            model: model.to_string(),
            thinking,
            started: false,
            blocks: HashMap::new(),
            open: None,
            tool_use: false,
            done: false,
        }
    }

    fn open_block(
        &mut self,
        out: &mut Vec<(&'static str, Value)>,
        item: &str,
        block: Value,
    ) -> usize {
        if let Some(i) = self.open.take() {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
        let index = self.blocks.len();
        self.blocks.insert(item.to_string(), index);
        self.open = Some(index);
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    }

    fn delta(index: usize, delta: Value) -> (&'static str, Value) {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    /// The events one Responses event makes.
    pub fn event(&mut self, kind: &str, ev: &Value) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if !self.started && kind.starts_with("response.") {
            self.started = true;
            let r = &ev["response"];
            out.push((
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": message_id(r), "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            ));
            out.push(("ping", json!({"type": "ping"})));
        }
        let item_id = ev["item_id"]
            .as_str()
            .or_else(|| ev["item"]["id"].as_str())
            .unwrap_or("")
            .to_string();
        match kind {
            "response.reasoning_summary_text.delta" if self.thinking => {
                let index = match self.blocks.get(&item_id) {
                    Some(i) => *i,
                    None => self.open_block(
                        &mut out,
                        &item_id,
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                    ),
                };
                out.push(Self::delta(
                    index,
                    json!({"type": "thinking_delta", "thinking": ev["delta"]}),
                ));
            }
            "response.output_text.delta" => {
                let index = match self.blocks.get(&item_id) {
                    Some(i) => *i,
                    None => {
                        self.open_block(&mut out, &item_id, json!({"type": "text", "text": ""}))
                    }
                };
                out.push(Self::delta(
                    index,
                    json!({"type": "text_delta", "text": ev["delta"]}),
                ));
            }
            "response.output_item.added" if ev["item"]["type"] == "function_call" => {
                self.tool_use = true;
                let item = &ev["item"];
                self.open_block(
                    &mut out,
                    &item_id,
                    json!({"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": {}}),
                );
            }
            "response.function_call_arguments.delta" => {
                if let Some(i) = self.blocks.get(&item_id).copied() {
                    out.push(Self::delta(
                        i,
                        json!({"type": "input_json_delta", "partial_json": ev["delta"]}),
                    ));
                }
            }
            "response.output_item.done" => {
                if let Some(i) = self.blocks.get(&item_id).copied()
                    && self.open == Some(i)
                {
                    if ev["item"]["type"] == "reasoning" {
                        out.push(Self::delta(
                            i,
                            json!({"type": "signature_delta", "signature": ""}),
                        ));
                    }
                    self.open = None;
                    out.push((
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ));
                }
            }
            "response.completed" | "response.incomplete" => {
                if let Some(i) = self.open.take() {
                    out.push((
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ));
                }
                let r = &ev["response"];
                let usage = usage_of(&r["usage"]);
                out.push((
                    "message_delta",
                    json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason(r, self.tool_use), "stop_sequence": null},
                        "usage": usage}),
                ));
                out.push(("message_stop", json!({"type": "message_stop"})));
                self.done = true;
            }
            "response.failed" | "error" => {
                let message = ev["response"]["error"]["message"]
                    .as_str()
                    .or_else(|| ev["error"]["message"].as_str())
                    .unwrap_or("the upstream failed");
                out.push((
                    "error",
                    json!({"type": "error", "error": {"type": "api_error", "message": message}}),
                ));
                self.done = true;
            }
            _ => {}
        }
        out
    }
}

fn sse(events: &[(&str, Value)]) -> Bytes {
    let mut out = String::new();
    for (kind, data) in events {
        out.push_str("event: ");
        out.push_str(kind);
        out.push_str("\ndata: ");
        out.push_str(&data.to_string());
        out.push_str("\n\n");
    }
    Bytes::from(out)
}

/// The admitted request and its body as JSON, or the answer (in the Anthropic shape).
async fn read_request(
    state: &Arc<AppState>,
    conn: Conn,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Admitted, Value), Response> {
    let admitted = match responses::admit_and_read(state, conn, headers, body, Turn::Http).await {
        Ok(a) => a,
        Err(resp) => return Err(reshaped(resp).await),
    };
    match serde_json::from_slice(&admitted.bytes) {
        Ok(v) => Ok((admitted, v)),
        Err(e) => Err(bad(format!("the body is not JSON: {e}"))),
    }
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (admitted, request) = match read_request(&state, conn, &headers, body).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let Some(asked) = request["model"].as_str().filter(|m| !m.is_empty()) else {
        return bad("model: Field required");
    };
    let asked = asked.to_string();
    let pool_model = state.dispatcher.current().anthropic.resolve(&asked);
    let (translated, stream, thinking) = match translate(&request, &pool_model) {
        Ok(t) => t,
        Err(e) => return bad(e),
    };
    let rx = match super::dispatch(&state, admitted, &headers, &translated, "/v1/messages") {
        Ok(rx) => rx,
        Err(e) => return reshaped(e.into_response()).await,
    };
    if stream {
        stream_answer(rx, Sequencer::new(&asked, thinking)).await
    } else {
        json_answer(rx, &asked, thinking).await
    }
}

async fn json_answer(rx: Frames, model: &str, thinking: bool) -> Response {
    match super::terminal(rx).await {
        Ended::Error(reply) => reply_response(*reply),
        Ended::Terminal(kind, v) if kind == "response.failed" => {
            let m = v["response"]["error"]["message"]
                .as_str()
                .unwrap_or("the upstream failed")
                .to_string();
            error(529, "overloaded_error", m)
        }
        Ended::Terminal(_, v) => {
            axum::Json(message(&v["response"], model, thinking)).into_response()
        }
        Ended::Nothing => error(500, "api_error", "the request ended without an answer"),
    }
}

async fn stream_answer(rx: Frames, mut seq: Sequencer) -> Response {
    super::event_stream(
        rx,
        reply_response,
        || error(500, "api_error", "the request ended without an answer"),
        move |frame| match frame {
            Frame::Events(events) => {
                let mut out = Vec::new();
                for e in &events {
                    out.extend(seq.event(e.kind(), &super::parsed(e)));
                }
                (sse(&out), seq.done)
            }
            Frame::KeepAlive => (sse(&[("ping", json!({"type": "ping"}))]), false),
            Frame::Error(reply) => (
                sse(&[(
                    "error",
                    json!({"type": "error", "error": {"type": kind_of(reply.status).1, "message": reply.message}}),
                )]),
                true,
            ),
            // No SSE frames: this door does not ask for them (`RequestCtx::sse_out`).
            Frame::Head { .. } | Frame::Body(_) | Frame::Sse(_) => (Bytes::new(), false),
        },
    )
    .await
}

/// `POST /v1/messages/count_tokens`: an estimate (a token per four bytes of what would be
/// sent), without touching any account.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (_, request) = match read_request(&state, conn, &headers, body).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let model = request["model"].as_str().unwrap_or("");
    match translate(&request, model) {
        Ok((t, _, _)) => {
            let text = format!("{}{}{}", t["instructions"], t["input"], t["tools"]);
            axum::Json(json!({"input_tokens": (text.len() / 4).max(1)})).into_response()
        }
        Err(e) => bad(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_use_round_trip_with_thinking_translates() {
        let req = json!({
            "model": "claude-sonnet-4-5", "max_tokens": 1024,
            "system": [{"type": "text", "text": "Be brief."}],
            "thinking": {"type": "enabled", "budget_tokens": 8000},
            "tools": [{"name": "exec_command", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
            "messages": [
                {"role": "user", "content": "run: echo hi"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "…", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "exec_command", "input": {"cmd": "echo hi"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hi"}]},
            ],
        });
        let (r, stream, thinking) = translate(&req, "gpt-5.5").unwrap();
        assert!(!stream && thinking);
        assert_eq!(r["model"], "gpt-5.5");
        assert_eq!(r["instructions"], "Be brief.");
        assert_eq!(r["reasoning"]["effort"], "medium");
        assert_eq!(r["tool_choice"], "required");
        assert_eq!(r["tools"][0]["parameters"]["type"], "object");
        assert_eq!(r["input"][1]["type"], "function_call");
        assert_eq!(r["input"][1]["arguments"], "{\"cmd\":\"echo hi\"}");
        assert_eq!(r["input"][2]["type"], "function_call_output");
        assert!(translate(&json!({"messages": []}), "m").is_err());
    }

    #[test]
    fn the_event_sequence_is_anthropics() {
        let mut s = Sequencer::new("claude-x", false);
        let kinds =
            |v: Vec<(&'static str, Value)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            kinds(s.event("response.created", &json!({"response": {"id": "resp_1"}}))),
            ["message_start", "ping"]
        );
        assert_eq!(
            kinds(s.event(
                "response.output_text.delta",
                &json!({"item_id": "m1", "delta": "Hi"})
            )),
            ["content_block_start", "content_block_delta"]
        );
        assert_eq!(
            kinds(s.event(
                "response.output_item.done",
                &json!({"item": {"id": "m1", "type": "message"}})
            )),
            ["content_block_stop"]
        );
        let t = s.event(
            "response.output_item.added",
            &json!({"item": {"id": "fc", "type": "function_call", "call_id": "c1", "name": "f"}}),
        );
        assert_eq!(t[0].1["index"], 1);
        assert_eq!(t[0].1["content_block"]["type"], "tool_use");
        let end = s.event("response.completed", &json!({"response": {"status": "completed", "usage": {"input_tokens": 9, "output_tokens": 2}}}));
        assert_eq!(
            kinds(end.clone()),
            ["content_block_stop", "message_delta", "message_stop"]
        );
        assert_eq!(end[1].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(end[1].1["usage"]["output_tokens"], 2);
    }

    #[test]
    fn models_map_by_glob_then_default() {
        let mut m = crate::dispatch::ModelMap::default();
        m.models.insert("claude-sonnet-*".into(), "gpt-5.5".into());
        assert_eq!(m.resolve("claude-sonnet-4-5"), "gpt-5.5");
        assert_eq!(m.resolve("claude-haiku"), "claude-haiku");
        m.default = Some("gpt-5.4".into());
        assert_eq!(m.resolve("claude-haiku"), "gpt-5.4");
    }
}
