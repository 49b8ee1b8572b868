//! `POST /v1/images/generations` and `/v1/images/edits`: an image made by the Responses
//! `image_generation` tool on a pool model, answered as the Images API does, `b64_json`.
//!
//! What maps: `prompt`; `size` (`1024x1024`, `1024x1536`, `1536x1024`, `auto`); `quality`
//! (`low`, `medium`, `high`, `auto`; `standard` is `medium`, `hd` is `high`);
//! `output_format`, `background`; for edits, the `image` files (multipart) as input images and
//! `mask` as the tool's mask. The image model asked for (`gpt-image-1`, …) goes through
//! `[front_doors.images] models`; unmapped, the tool runs on the probe model. Refused
//! clearly: `n` other than 1, `response_format = "url"`, other sizes, `stream`.

use std::sync::Arc;

use crate::dispatch::frames::Frames;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Map, Value, json};

use super::Ended;
use crate::api::AppState;
use crate::api::error::ApiError;
use crate::api::responses::{self, Conn, Turn, error_response};
use crate::dispatch::ErrorReply;

const SIZES: [&str; 4] = ["1024x1024", "1024x1536", "1536x1024", "auto"];

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(code, message)
}

/// The fields of an images request, from JSON or a multipart form.
#[derive(Debug, Default)]
pub struct ImageAsk {
    pub prompt: String,
    pub model: Option<String>,
    pub fields: Map<String, Value>,
    /// Data URLs of the images to edit, and of the mask.
    pub images: Vec<String>,
    pub mask: Option<String>,
}

/// The tool and input of an image request, checked: `(tool, input)`.
pub fn tool_of(ask: &ImageAsk) -> Result<Value, ApiError> {
    if ask.prompt.trim().is_empty() {
        return Err(bad(
            "missing_required_parameter",
            "Missing required parameter: 'prompt'.",
        ));
    }
    let f = &ask.fields;
    let text = |k: &str| {
        f.get(k).and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
    };
    if let Some(n) = text("n")
        && n != "1"
    {
        return Err(bad(
            "unsupported_value",
            "Only n = 1 is supported: one image per request.",
        ));
    }
    if text("response_format").is_some_and(|r| r != "b64_json") {
        return Err(bad(
            "unsupported_value",
            "Only response_format = \"b64_json\" is supported: the pool keeps no image URLs.",
        ));
    }
    if f.get("stream").and_then(Value::as_bool) == Some(true)
        || text("stream").as_deref() == Some("true")
    {
        return Err(bad(
            "unsupported_value",
            "Streamed images are not supported.",
        ));
    }
    let mut tool = json!({"type": "image_generation"});
    if let Some(size) = text("size") {
        if !SIZES.contains(&size.as_str()) {
            return Err(bad(
                "unsupported_value",
                format!(
                    "size {size} is not supported; use one of {}",
                    SIZES.join(", ")
                ),
            ));
        }
        tool["size"] = json!(size);
    }
    if let Some(q) = text("quality") {
        let q = match q.as_str() {
            "standard" => "medium".to_string(),
            "hd" => "high".to_string(),
            "low" | "medium" | "high" | "auto" => q,
            other => {
                return Err(bad(
                    "unsupported_value",
                    format!("quality {other} is not supported"),
                ));
            }
        };
        tool["quality"] = json!(q);
    }
    for k in [
        "output_format",
        "background",
        "output_compression",
        "moderation",
    ] {
        if let Some(v) = f.get(k) {
            tool[k] = v.clone();
        }
    }
    if let Some(m) = &ask.mask {
        tool["input_image_mask"] = json!({"image_url": m});
    }
    Ok(tool)
}

/// The Responses request that makes the image on `host` (a pool model).
pub fn translate(ask: &ImageAsk, host: &str) -> Result<Value, ApiError> {
    let tool = tool_of(ask)?;
    let mut content = vec![json!({"type": "input_text", "text": ask.prompt})];
    content.extend(
        ask.images
            .iter()
            .map(|url| json!({"type": "input_image", "image_url": url})),
    );
    Ok(json!({
        "model": host,
        "instructions": "Make the image the user asks for with the image_generation tool.",
        "input": [{"type": "message", "role": "user", "content": content}],
        "tools": [tool],
        "tool_choice": {"type": "image_generation"},
        "store": false,
        "stream": true,
    }))
}

/// The Images API answer of a finished response.
pub fn answer(response: &Value, created: u64) -> Option<Value> {
    let images: Vec<&Value> = response["output"]
        .as_array()?
        .iter()
        .filter(|i| i["type"] == "image_generation_call" && i["result"].is_string())
        .collect();
    let first = images.first()?;
    let u = &response["usage"];
    Some(json!({
        "created": created,
        "data": images.iter().map(|i| json!({"b64_json": i["result"], "revised_prompt": i["revised_prompt"]})).collect::<Vec<_>>(),
        "size": first["size"],
        "quality": first["quality"],
        "output_format": first["output_format"],
        "background": first["background"],
        "usage": {
            "input_tokens": u["input_tokens"],
            "output_tokens": u["output_tokens"],
            "total_tokens": u["total_tokens"],
            "input_tokens_details": {"text_tokens": u["input_tokens"], "image_tokens": 0},
        },
    }))
}

/// One part of a form: its name, content type and bytes.
pub type Part = (String, Option<String>, Vec<u8>);

/// The parts of a `multipart/form-data` body.
pub fn multipart(content_type: &str, body: &[u8]) -> Result<Vec<Part>, ApiError> {
    let boundary = content_type
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))
        .map(|b| b.trim_matches('"').to_string())
        .ok_or_else(|| bad("invalid_request", "a multipart body needs its boundary"))?;
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
    let mut parts = Vec::new();
    let mut rest = body;
    // Up to and past the first delimiter.
    let Some(start) = find(rest, d) else {
        return Err(bad("invalid_request", "the multipart body has no parts"));
    };
    rest = &rest[start + d.len()..];
    loop {
        if rest.starts_with(b"--") {
            break;
        }
        rest = rest.strip_prefix(b"\r\n").unwrap_or(rest);
        let Some(head_end) = find(rest, b"\r\n\r\n") else {
            return Err(bad(
                "invalid_request",
                "a multipart part has no end of headers",
            ));
        };
        let head = String::from_utf8_lossy(&rest[..head_end]).into_owned();
        rest = &rest[head_end + 4..];
        let Some(end) = find(rest, d) else {
            return Err(bad("invalid_request", "a multipart part is not closed"));
        };
        let data = rest[..end]
            .strip_suffix(b"\r\n")
            .unwrap_or(&rest[..end])
            .to_vec();
        rest = &rest[end + d.len()..];
        let mut name = None;
        let mut ctype = None;
        for line in head.lines() {
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("content-disposition:") {
                name = line
                    .split(';')
                    .find_map(|p| p.trim().strip_prefix("name="))
                    .map(|n| n.trim_matches('"').to_string());
            } else if lower.starts_with("content-type:") {
                ctype = line.split_once(':').map(|(_, v)| v.trim().to_string());
            }
        }
        if let Some(name) = name {
            parts.push((name, ctype, data));
        }
    }
    Ok(parts)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

fn data_url(ctype: Option<&str>, bytes: &[u8]) -> String {
    format!(
        "data:{};base64,{}",
        ctype.unwrap_or("image/png"),
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The ask of an edit's form.
fn edit_ask(content_type: &str, body: &[u8]) -> Result<ImageAsk, ApiError> {
    let mut ask = ImageAsk::default();
    for (name, ctype, data) in multipart(content_type, body)? {
        match name.as_str() {
            "image" | "image[]" => ask.images.push(data_url(ctype.as_deref(), &data)),
            "mask" => ask.mask = Some(data_url(ctype.as_deref(), &data)),
            "prompt" => ask.prompt = String::from_utf8_lossy(&data).into_owned(),
            "model" => ask.model = Some(String::from_utf8_lossy(&data).into_owned()),
            other => {
                ask.fields.insert(
                    other.to_string(),
                    json!(String::from_utf8_lossy(&data).into_owned()),
                );
            }
        }
    }
    if ask.images.is_empty() {
        return Err(bad(
            "missing_required_parameter",
            "Missing required parameter: 'image'.",
        ));
    }
    Ok(ask)
}

fn generation_ask(body: &[u8]) -> Result<ImageAsk, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad("invalid_json", format!("the body is not JSON: {e}")))?;
    let Value::Object(mut fields) = v else {
        return Err(bad(
            "invalid_type",
            "the request body must be a JSON object",
        ));
    };
    let prompt = fields
        .remove("prompt")
        .and_then(|p| p.as_str().map(str::to_string))
        .unwrap_or_default();
    let model = fields
        .remove("model")
        .and_then(|m| m.as_str().map(str::to_string));
    Ok(ImageAsk {
        prompt,
        model,
        fields,
        ..ImageAsk::default()
    })
}

pub async fn generations(
    State(state): State<Arc<AppState>>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(state, conn, headers, body, false).await
}

pub async fn edits(
    State(state): State<Arc<AppState>>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(state, conn, headers, body, true).await
}

async fn run(
    state: Arc<AppState>,
    conn: Conn,
    headers: HeaderMap,
    body: Body,
    edit: bool,
) -> Response {
    let admitted = match responses::admit_and_read(&state, conn, &headers, body, Turn::Http).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let ask = if edit {
        let ctype = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        edit_ask(ctype, &admitted.bytes)
    } else {
        generation_ask(&admitted.bytes)
    };
    let ask = match ask {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let config = state.dispatcher.current();
    // The image model asked for, if the map names it; else the map's default, else the probe
    // model.
    let host = ask
        .model
        .as_deref()
        .map(|m| config.images.resolve(m))
        .filter(|h| Some(h.as_str()) != ask.model.as_deref())
        .or_else(|| config.images.default.clone())
        .unwrap_or_else(|| config.probe_model.clone());
    let translated = match translate(&ask, &host) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let path = if edit {
        "/v1/images/edits"
    } else {
        "/v1/images/generations"
    };
    let created = state.dispatcher.fleet.clock().now_ms() / 1000;
    match super::dispatch(&state, admitted, &headers, &translated, path) {
        Ok(rx) => collect(rx, created).await,
        Err(e) => e.into_response(),
    }
}

async fn collect(rx: Frames, created: u64) -> Response {
    match super::terminal(rx).await {
        Ended::Error(reply) => error_response(*reply),
        Ended::Terminal(_, v) => match answer(&v["response"], created) {
            Some(a) => axum::Json(a).into_response(),
            None => {
                let err = &v["response"]["error"];
                error_response(ErrorReply::openai(
                    502,
                    "server_error",
                    err["code"].as_str().unwrap_or("image_generation_failed"),
                    err["message"]
                        .as_str()
                        .unwrap_or("the backend made no image"),
                    Map::new(),
                ))
            }
        },
        Ended::Nothing => ApiError::internal("the request ended without an answer").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_qualities_and_n_are_mapped_or_refused() {
        let ask = |fields: Value| ImageAsk {
            prompt: "a cat".into(),
            fields: fields.as_object().unwrap().clone(),
            ..ImageAsk::default()
        };
        let t = tool_of(&ask(json!({"size": "1024x1536", "quality": "hd"}))).unwrap();
        assert_eq!(
            (t["size"].as_str(), t["quality"].as_str()),
            (Some("1024x1536"), Some("high"))
        );
        assert!(
            tool_of(&ask(json!({"n": 2})))
                .unwrap_err()
                .message
                .contains("n = 1")
        );
        assert!(
            tool_of(&ask(json!({"size": "256x256"})))
                .unwrap_err()
                .message
                .contains("256x256")
        );
        assert!(tool_of(&ask(json!({"response_format": "url"}))).is_err());
        assert!(tool_of(&ImageAsk::default()).is_err());
        let r = translate(&ask(json!({})), "gpt-5.5").unwrap();
        assert_eq!(r["tools"][0]["type"], "image_generation");
        assert_eq!(r["tool_choice"]["type"], "image_generation");
    }

    #[test]
    fn a_multipart_edit_reads_its_files_and_fields() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nadd a hat\r\n--XyZ\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n\x89PNG\r\n--XyZ\r\nContent-Disposition: form-data; name=\"size\"\r\n\r\n1024x1024\r\n--XyZ--\r\n";
        let ask = edit_ask("multipart/form-data; boundary=XyZ", body).unwrap();
        assert_eq!(ask.prompt, "add a hat");
        assert_eq!(ask.images.len(), 1);
        assert!(ask.images[0].starts_with("data:image/png;base64,"));
        assert_eq!(ask.fields["size"], "1024x1024");
        assert!(edit_ask("multipart/form-data", body).is_err());
    }
}
