//! `POST /v1/chat/completions`: a Chat Completions request translated onto the Responses
//! request the pool serves, and its answer translated back — one JSON `chat.completion`, or
//! `chat.completion.chunk` events ending with `data: [DONE]`.
//!
//! What maps: `system`/`developer` messages to `instructions`; `user` text and image parts
//! to input messages; `assistant` text and `tool_calls` to output messages and function
//! calls; `tool` messages to function-call outputs; `tools` (functions), `tool_choice`,
//! `parallel_tool_calls`, `response_format` (`json_schema`, `json_object`) to `text.format`,
//! `reasoning_effort` to `reasoning.effort`, `user` to the session (else a hash of the
//! conversation's first messages). What is refused: `n` other than 1, tools other than
//! functions, `audio`/`modalities` other than text. `max_completion_tokens` / `max_tokens`
//! are accepted and not sent: the backend behind ChatGPT accounts refuses a length limit.

use std::collections::HashMap;
use std::sync::Arc;

use crate::dispatch::frames::Frames;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::Ended;
use crate::api::AppState;
use crate::api::error::ApiError;
use crate::api::responses::{self, Conn, Turn, error_response};
use crate::dispatch::{ErrorReply, Frame};

/// Instructions when the conversation has no system message (the backend wants some).
const DEFAULT_INSTRUCTIONS: &str = "You are a helpful assistant.";

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(code, message)
}

/// The text of a message's `content`: a string, or the text parts of an array.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A user message's content as Responses input parts.
fn user_parts(content: &Value) -> Result<Vec<Value>, ApiError> {
    match content {
        Value::String(s) => Ok(vec![json!({"type": "input_text", "text": s})]),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p["type"].as_str() {
                Some("text") => Ok(json!({"type": "input_text", "text": p["text"]})),
                Some("image_url") => {
                    let url = p["image_url"]["url"]
                        .as_str()
                        .or_else(|| p["image_url"].as_str())
                        .ok_or_else(|| bad("invalid_value", "an image_url part needs a url"))?;
                    let mut part = json!({"type": "input_image", "image_url": url});
                    if let Some(d) = p["image_url"]["detail"].as_str() {
                        part["detail"] = json!(d);
                    }
                    Ok(part)
                }
                other => Err(bad(
                    "invalid_value",
                    format!(
                        "content part type {} is not supported",
                        other.unwrap_or("(none)")
                    ),
                )),
            })
            .collect(),
        Value::Null => Ok(Vec::new()),
        _ => Err(bad(
            "invalid_type",
            "message content must be a string or an array",
        )),
    }
}

/// The Responses request for a Chat Completions one, and whether the client streams and
/// wants usage in its stream.
pub fn translate(req: &Value) -> Result<(Value, bool, bool), ApiError> {
    let obj = req
        .as_object()
        .ok_or_else(|| bad("invalid_type", "the request body must be a JSON object"))?;
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            bad(
                "missing_required_parameter",
                "Missing required parameter: 'model'.",
            )
        })?;
    if let Some(n) = obj.get("n").filter(|n| !n.is_null())
        && n.as_u64() != Some(1)
    {
        return Err(bad(
            "unsupported_value",
            "Only n = 1 is supported: the pool answers one choice per request.",
        ));
    }
    if let Some(m) = obj.get("modalities").and_then(Value::as_array)
        && m.iter().any(|m| m.as_str() != Some("text"))
    {
        return Err(bad("unsupported_value", "Only text output is supported."));
    }
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            bad(
                "missing_required_parameter",
                "Missing required parameter: 'messages'.",
            )
        })?;
    let mut instructions: Vec<String> = Vec::new();
    let mut input: Vec<Value> = Vec::new();
    for m in messages {
        match m["role"].as_str() {
            Some("system" | "developer") => instructions.push(text_of(&m["content"])),
            Some("user") => input.push(json!({
                "type": "message", "role": "user", "content": user_parts(&m["content"])?,
            })),
            Some("assistant") => {
                let text = text_of(&m["content"]);
                if !text.is_empty() {
                    input.push(json!({
                        "type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}],
                    }));
                }
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    input.push(json!({
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"].as_str().unwrap_or("{}"),
                    }));
                }
            }
            Some("tool") => input.push(json!({
                "type": "function_call_output",
                "call_id": m["tool_call_id"],
                "output": text_of(&m["content"]),
            })),
            other => {
                return Err(bad(
                    "invalid_value",
                    format!(
                        "message role {} is not supported",
                        other.unwrap_or("(none)")
                    ),
                ));
            }
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(model));
    let instructions = instructions.join("\n\n");
    out.insert(
        "instructions".into(),
        json!(if instructions.is_empty() {
            DEFAULT_INSTRUCTIONS.to_string()
        } else {
            instructions
        }),
    );
    out.insert("input".into(), Value::Array(input));
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let tools: Result<Vec<Value>, ApiError> = tools
            .iter()
            .map(|t| match t["type"].as_str() {
                Some("function") => {
                    let f = &t["function"];
                    let mut tool = json!({
                        "type": "function",
                        "name": f["name"],
                        "parameters": if f["parameters"].is_null() { json!({"type": "object", "properties": {}}) } else { f["parameters"].clone() },
                    });
                    if let Some(d) = f["description"].as_str() {
                        tool["description"] = json!(d);
                    }
                    if let Some(s) = f["strict"].as_bool() {
                        tool["strict"] = json!(s);
                    }
                    Ok(tool)
                }
                other => Err(bad(
                    "unsupported_value",
                    format!(
                        "tool type {} is not supported; only functions",
                        other.unwrap_or("(none)")
                    ),
                )),
            })
            .collect();
        out.insert("tools".into(), Value::Array(tools?));
    }
    if let Some(choice) = obj.get("tool_choice") {
        let mapped = match choice {
            Value::String(_) => choice.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                json!({"type": "function", "name": choice["function"]["name"]})
            }
            _ => {
                return Err(bad(
                    "invalid_value",
                    "tool_choice is not one this gateway maps",
                ));
            }
        };
        out.insert("tool_choice".into(), mapped);
    }
    if let Some(p) = obj.get("parallel_tool_calls").filter(|p| p.is_boolean()) {
        out.insert("parallel_tool_calls".into(), p.clone());
    }
    if let Some(f) = obj.get("response_format") {
        let format = match f["type"].as_str() {
            Some("json_schema") => {
                let s = &f["json_schema"];
                let mut format = json!({"type": "json_schema", "name": s["name"].as_str().unwrap_or("response"), "schema": s["schema"]});
                if let Some(strict) = s["strict"].as_bool() {
                    format["strict"] = json!(strict);
                }
                Some(format)
            }
            Some("json_object") => Some(json!({"type": "json_object"})),
            Some("text") | None => None,
            Some(other) => {
                return Err(bad(
                    "unsupported_value",
                    format!("response_format {other} is not supported"),
                ));
            }
        };
        if let Some(format) = format {
            out.insert("text".into(), json!({"format": format}));
        }
    }
    if let Some(effort) = obj.get("reasoning_effort").and_then(Value::as_str) {
        out.insert(
            "reasoning".into(),
            json!({"effort": effort, "summary": "auto"}),
        );
    }
    if let Some(tier) = obj.get("service_tier").and_then(Value::as_str) {
        out.insert("service_tier".into(), json!(tier));
    }
    out.insert("prompt_cache_key".into(), json!(session_of(obj, messages)));
    out.insert("store".into(), json!(false));
    out.insert("stream".into(), json!(true));
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let usage = obj
        .get("stream_options")
        .and_then(|o| o["include_usage"].as_bool())
        .unwrap_or(false);
    Ok((Value::Object(out), stream, usage))
}

/// The session a conversation belongs to: the client's `user`, else a hash of its system text
/// and first user message (the part every turn of one conversation repeats).
fn session_of(obj: &Map<String, Value>, messages: &[Value]) -> String {
    if let Some(u) = obj
        .get("user")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
    {
        return format!("chat-user-{u}");
    }
    let mut h = Sha256::new();
    for m in messages
        .iter()
        .filter(|m| matches!(m["role"].as_str(), Some("system" | "developer")))
        .chain(messages.iter().find(|m| m["role"] == "user"))
    {
        h.update(text_of(&m["content"]).as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    format!(
        "chat-{}",
        d[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// The Chat Completions usage object of a Responses `usage`.
fn usage_of(u: &Value) -> Value {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let (input, output) = (n(&u["input_tokens"]), n(&u["output_tokens"]));
    json!({
        "prompt_tokens": input,
        "completion_tokens": output,
        "total_tokens": input + output,
        "prompt_tokens_details": {"cached_tokens": n(&u["input_tokens_details"]["cached_tokens"])},
        "completion_tokens_details": {"reasoning_tokens": n(&u["output_tokens_details"]["reasoning_tokens"])},
    })
}

/// How a response ended, as a `finish_reason`.
fn finish_reason(response: &Value, tool_calls: bool) -> &'static str {
    if response["status"] == "incomplete" {
        return match response["incomplete_details"]["reason"].as_str() {
            Some("content_filter") => "content_filter",
            _ => "length",
        };
    }
    if tool_calls { "tool_calls" } else { "stop" }
}

/// The `chat.completion` of a finished response.
pub fn completion(response: &Value, model: &str, created: u64) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    for item in response["output"].as_array().into_iter().flatten() {
        match item["type"].as_str() {
            Some("message") => text.push_str(&text_of(&item["content"])),
            Some("function_call") => calls.push(json!({
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            })),
            _ => {}
        }
    }
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) },
        "refusal": null,
    });
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls.clone());
    }
    json!({
        "id": chat_id(response),
        "object": "chat.completion",
        "created": created,
        "model": response["model"].as_str().unwrap_or(model),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(response, !calls.is_empty()),
        }],
        "usage": usage_of(&response["usage"]),
        "service_tier": response["service_tier"],
        "system_fingerprint": null,
    })
}

fn chat_id(response: &Value) -> String {
    let id = response["id"].as_str().unwrap_or("");
    format!("chatcmpl-{}", id.strip_prefix("resp_").unwrap_or(id))
}

/// Turns a stream of Responses events into `chat.completion.chunk`s.
pub struct Chunker {
    model: String,
    created: u64,
    id: String,
    include_usage: bool,
    started: bool,
    /// Function-call item id -> its index among the tool calls.
    calls: HashMap<String, usize>,
    pub done: bool,
}

impl Chunker {
    pub fn new(model: &str, created: u64, include_usage: bool) -> Chunker {
        Chunker {
            model: model.to_string(),
            created,
            id: String::new(),
            include_usage,
            started: false,
            calls: HashMap::new(),
            done: false,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    }

    /// The chunks one event makes (as `data:` payloads).
    pub fn event(&mut self, kind: &str, ev: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        if !self.started && kind.starts_with("response.") {
            self.started = true;
            if let Some(r) = ev.get("response") {
                self.id = chat_id(r);
                if let Some(m) = r["model"].as_str() {
                    self.model = m.to_string();
                }
            }
            out.push(self.chunk(json!({"role": "assistant", "content": ""}), None));
        }
        match kind {
            "response.output_text.delta" => {
                out.push(self.chunk(json!({"content": ev["delta"]}), None));
            }
            "response.output_item.added" if ev["item"]["type"] == "function_call" => {
                let index = self.calls.len();
                let item = &ev["item"];
                self.calls
                    .insert(item["id"].as_str().unwrap_or("").to_string(), index);
                out.push(self.chunk(
                    json!({"tool_calls": [{"index": index, "id": item["call_id"], "type": "function",
                        "function": {"name": item["name"], "arguments": ""}}]}),
                    None,
                ));
            }
            "response.function_call_arguments.delta" => {
                let index = ev["item_id"]
                    .as_str()
                    .and_then(|i| self.calls.get(i))
                    .copied()
                    .unwrap_or(0);
                out.push(self.chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": ev["delta"]}}]}),
                    None,
                ));
            }
            "response.completed" | "response.incomplete" => {
                let r = &ev["response"];
                let finish = finish_reason(r, !self.calls.is_empty());
                out.push(self.chunk(json!({}), Some(finish)));
                if self.include_usage {
                    out.push(json!({
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage_of(&r["usage"]),
                    }));
                }
                self.done = true;
            }
            "response.failed" | "error" => {
                let e = if ev["response"]["error"].is_object() {
                    ev["response"]["error"].clone()
                } else {
                    ev["error"].clone()
                };
                out.push(json!({"error": {
                    "message": e["message"].as_str().unwrap_or("the upstream failed"),
                    "type": "server_error",
                    "code": e["code"],
                }}));
                self.done = true;
            }
            _ => {}
        }
        out
    }
}

fn sse_data(values: &[Value]) -> Bytes {
    let mut out = String::new();
    for v in values {
        out.push_str("data: ");
        out.push_str(&v.to_string());
        out.push_str("\n\n");
    }
    Bytes::from(out)
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let admitted = match responses::admit_and_read(&state, conn, &headers, body, Turn::Http).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let request: Value = match serde_json::from_slice(&admitted.bytes) {
        Ok(v) => v,
        Err(e) => {
            return bad("invalid_json", format!("the body is not JSON: {e}")).into_response();
        }
    };
    let (translated, stream, include_usage) = match translate(&request) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let model = translated["model"].as_str().unwrap_or("").to_string();
    let created = state.dispatcher.fleet.clock().now_ms() / 1000;
    let rx = match super::dispatch(
        &state,
        admitted,
        &headers,
        &translated,
        "/v1/chat/completions",
    ) {
        Ok(rx) => rx,
        Err(e) => return e.into_response(),
    };
    if stream {
        stream_answer(rx, Chunker::new(&model, created, include_usage)).await
    } else {
        json_answer(rx, &model, created).await
    }
}

/// Waits for the terminal event and answers one `chat.completion`.
async fn json_answer(rx: Frames, model: &str, created: u64) -> Response {
    match super::terminal(rx).await {
        Ended::Error(reply) => error_response(*reply),
        Ended::Terminal(kind, v) if kind == "response.failed" => {
            let err = &v["response"]["error"];
            error_response(ErrorReply::openai(
                502,
                "server_error",
                err["code"].as_str().unwrap_or("upstream_failed"),
                err["message"].as_str().unwrap_or("the upstream failed"),
                Map::new(),
            ))
        }
        Ended::Terminal(_, v) => {
            axum::Json(completion(&v["response"], model, created)).into_response()
        }
        Ended::Nothing => ApiError::internal("the request ended without an answer").into_response(),
    }
}

/// Answers `chat.completion.chunk`s as the events come; a failure before anything was sent
/// is an HTTP error.
async fn stream_answer(rx: Frames, mut chunker: Chunker) -> Response {
    const DONE: &[u8] = b"data: [DONE]\n\n";
    super::event_stream(
        rx,
        error_response,
        || ApiError::internal("the request ended without an answer").into_response(),
        move |frame| match frame {
            Frame::Events(events) => {
                let mut values = Vec::new();
                for e in &events {
                    values.extend(chunker.event(e.kind(), &super::parsed(e)));
                }
                let mut b = sse_data(&values).to_vec();
                if chunker.done {
                    b.extend_from_slice(DONE);
                }
                (Bytes::from(b), chunker.done)
            }
            Frame::KeepAlive => (Bytes::from_static(b": keep-alive\n\n"), false),
            Frame::Error(reply) => {
                let v = json!({"error": {"message": reply.message, "type": "server_error", "code": reply.code}});
                let mut b = sse_data(&[v]).to_vec();
                b.extend_from_slice(DONE);
                (Bytes::from(b), true)
            }
            // No SSE frames: this door does not ask for them (`RequestCtx::sse_out`).
            Frame::Head { .. } | Frame::Body(_) | Frame::Sse(_) => (Bytes::new(), false),
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_a_tool_round_trip_translates() {
        let req = json!({
            "model": "gpt-5.5",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "run: echo hi"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "exec_command", "arguments": "{\"cmd\":\"echo hi\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "hi"},
            ],
            "tools": [{"type": "function", "function": {"name": "exec_command", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "exec_command"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": true}},
            "reasoning_effort": "low",
            "max_completion_tokens": 100,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let (r, stream, usage) = translate(&req).unwrap();
        assert!(stream && usage);
        assert_eq!(r["instructions"], "Be brief.");
        assert_eq!(r["input"][0]["content"][1]["type"], "input_image");
        assert_eq!(r["input"][1]["type"], "function_call");
        assert_eq!(r["input"][2]["type"], "function_call_output");
        assert_eq!(r["input"][2]["output"], "hi");
        assert_eq!(r["tools"][0]["name"], "exec_command");
        assert_eq!(r["tool_choice"]["name"], "exec_command");
        assert_eq!(r["text"]["format"]["type"], "json_schema");
        assert_eq!(r["reasoning"]["effort"], "low");
        assert_eq!(r["stream"], true);
        assert!(r.get("max_output_tokens").is_none());
        assert!(r["prompt_cache_key"].as_str().unwrap().starts_with("chat-"));
    }

    #[test]
    fn what_cannot_be_served_is_refused_clearly() {
        let base = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            translate(&b).unwrap_err().message
        };
        assert!(with("n", json!(2)).contains("n = 1"));
        assert!(with("tools", json!([{"type": "web_search"}])).contains("only functions"));
        assert!(
            translate(&json!({"model": "m"}))
                .unwrap_err()
                .message
                .contains("messages")
        );
        assert!(translate(&base).is_ok());
    }

    #[test]
    fn a_stream_becomes_chunks_ending_with_usage() {
        let mut c = Chunker::new("gpt-5.5", 1, true);
        let first = c.event(
            "response.created",
            &json!({"response": {"id": "resp_x", "model": "gpt-5.5"}}),
        );
        assert_eq!(first[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(first[0]["id"], "chatcmpl-x");
        let d = c.event("response.output_text.delta", &json!({"delta": "Hel"}));
        assert_eq!(d[0]["choices"][0]["delta"]["content"], "Hel");
        let t = c.event("response.output_item.added", &json!({"item": {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f"}}));
        assert_eq!(t[0]["choices"][0]["delta"]["tool_calls"][0]["id"], "call_1");
        let a = c.event(
            "response.function_call_arguments.delta",
            &json!({"item_id": "fc_1", "delta": "{}"}),
        );
        assert_eq!(a[0]["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        let end = c.event("response.completed", &json!({"response": {"status": "completed",
            "usage": {"input_tokens": 10, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 4}}}}));
        assert_eq!(end[0]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(end[1]["usage"]["total_tokens"], 13);
        assert_eq!(end[1]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert!(c.done);
    }
}
