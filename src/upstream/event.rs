//! One event of a Responses stream, whichever transport carried it: its type and its JSON
//! data, both slices of the bytes received (an SSE block's `event:`/`data:` lines, or a
//! WebSocket text frame), never re-encoded on the way. The HTTP edge frames it as SSE and the
//! WebSocket edge as a text frame, each once.

use bytes::Bytes;
use serde_json::{Value, json};

/// Terminal events: the stream's answer is complete (or failed) after one of these.
pub fn is_terminal(kind: &str) -> bool {
    is_terminal_type(kind.as_bytes())
}

/// The same on the type's bytes (text that is not UTF-8 is none of them).
fn is_terminal_type(kind: &[u8]) -> bool {
    matches!(
        kind,
        b"response.completed" | b"response.failed" | b"response.incomplete" | b"error"
    )
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's type (UTF-8).
    kind: Bytes,
    /// Its JSON data, as received.
    data: Bytes,
}

impl Event {
    /// An event of a known type.
    pub fn new(kind: Bytes, data: Bytes) -> Event {
        Event { kind, data }
    }

    /// An event whose type is read from its data's first `"type"` key (a WebSocket frame, or
    /// an SSE block without an `event:` line).
    pub fn from_data(data: Bytes) -> Event {
        let kind = json_type_range(&data)
            .map(|r| data.slice(r))
            .unwrap_or_default();
        Event { kind, data }
    }

    /// A `response.failed` the gateway writes itself (the upstream stream broke, or the
    /// request failed after keep-alive headers went out).
    pub fn failed(response_id: Option<&str>, code: &str, message: &str) -> Event {
        let data = json!({
            "type": "response.failed",
            "response": {
                "id": response_id,
                "object": "response",
                "status": "failed",
                "error": {"code": code, "message": message},
            },
        });
        Event {
            kind: Bytes::from_static(b"response.failed"),
            data: Bytes::from(data.to_string()),
        }
    }

    /// An event built from a JSON value (events the gateway answers itself).
    pub fn from_value(v: &Value) -> Event {
        Event::from_data(Bytes::from(v.to_string()))
    }

    /// The event's type; empty when it has none.
    pub fn kind(&self) -> &str {
        std::str::from_utf8(&self.kind).unwrap_or_default()
    }

    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// The data, parsed (only for the few events whose content the gateway reads).
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.data).ok()
    }

    /// Asked of every event: compared as bytes, with no UTF-8 check.
    pub fn is_terminal(&self) -> bool {
        is_terminal_type(&self.kind)
    }

    /// Bytes it carries (for buffer limits).
    pub fn len(&self) -> usize {
        self.kind.len() + self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Where the value of the first `"type"` key is, by scanning (no JSON parse).
pub fn json_type_range(data: &[u8]) -> Option<std::ops::Range<usize>> {
    const KEY: &[u8] = b"\"type\"";
    let at = data.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &data[at..];
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[colon] != b':' {
        return None;
    }
    let after = &rest[colon + 1..];
    let quote = after.iter().position(|b| !b.is_ascii_whitespace())?;
    if after[quote] != b'"' {
        return None;
    }
    let start = at + colon + 1 + quote + 1;
    let len = data[start..].iter().position(|b| *b == b'"')?;
    Some(start..start + len)
}

/// The value of the first `"type"` key, by scanning.
pub fn json_type(data: &[u8]) -> Option<&str> {
    json_type_range(data).and_then(|r| std::str::from_utf8(&data[r]).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_type_is_scanned_from_the_first_type_key() {
        assert_eq!(
            json_type(br#"{"type" : "a.b","item":{"type":"c"}}"#),
            Some("a.b")
        );
        assert_eq!(json_type(b"{}"), None);
        assert_eq!(json_type(br#"{"type": 3}"#), None);
        let ev = Event::from_data(Bytes::from_static(
            br#"{"type":"response.output_text.delta","delta":"hi"}"#,
        ));
        assert_eq!(ev.kind(), "response.output_text.delta");
        assert!(!ev.is_terminal());
    }

    #[test]
    fn a_synthetic_failure_is_a_terminal_response_failed() {
        let ev = Event::failed(Some("resp_1"), "upstream_stream_error", "cut");
        assert_eq!(ev.kind(), "response.failed");
        assert!(ev.is_terminal());
        let v = ev.json().unwrap();
        assert_eq!(v["response"]["error"]["code"], "upstream_stream_error");
        assert_eq!(v["response"]["id"], "resp_1");
    }
}
