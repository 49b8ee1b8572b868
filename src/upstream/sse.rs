//! Server-sent events, incrementally: split a byte stream into whole events without copying
//! more than needed, and read each event's `type` by scanning (no JSON parse). The raw bytes of
//! an event are forwarded unchanged.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

/// One whole event, as received (including its terminating blank line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub raw: Bytes,
    /// The event's type: the `event:` line, else the `type` field of its data; empty for a
    /// comment-only block.
    pub kind: String,
}

impl SseEvent {
    /// The event's data (the `data:` lines joined), for the few events whose content matters.
    pub fn data(&self) -> String {
        let text = String::from_utf8_lossy(&self.raw);
        let mut out = String::new();
        for line in text.lines() {
            if let Some(d) = line.strip_prefix("data:") {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        out
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.data()).ok()
    }

    /// Builds an event in `event:`/`data:` framing.
    pub fn build(kind: &str, data: &Value) -> SseEvent {
        SseEvent {
            raw: Bytes::from(format!("event: {kind}\ndata: {data}\n\n")),
            kind: kind.to_string(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("an upstream event exceeded {0} bytes")]
pub struct EventTooLarge(pub usize);

/// Accumulates chunks and yields whole events.
#[derive(Debug)]
pub struct SseSplitter {
    buf: BytesMut,
    max_event: usize,
}

impl SseSplitter {
    pub fn new(max_event: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            max_event,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes held that do not yet form a whole event.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    pub fn next_event(&mut self) -> Result<Option<SseEvent>, EventTooLarge> {
        let Some(end) = event_end(&self.buf) else {
            if self.buf.len() > self.max_event {
                return Err(EventTooLarge(self.max_event));
            }
            return Ok(None);
        };
        let raw = self.buf.split_to(end).freeze();
        let kind = event_kind(&raw);
        Ok(Some(SseEvent { raw, kind }))
    }
}

/// Index just past the first blank line (`\n\n` or `\r\n\r\n`).
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some(i + 2);
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

fn event_kind(raw: &[u8]) -> String {
    let mut data_start = None;
    let mut pos = 0;
    for line in raw.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(v) = line.strip_prefix(b"event:") {
            return String::from_utf8_lossy(v.trim_ascii()).into_owned();
        }
        if data_start.is_none() && line.starts_with(b"data:") {
            data_start = Some(pos);
        }
        pos += line.len() + 1;
    }
    data_start
        .and_then(|start| json_type(&raw[start..]))
        .unwrap_or_default()
}

/// The value of the first `"type"` key, by scanning.
pub fn json_type(data: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"\"type\"";
    let at = data.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &data[at..];
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|b| *b == b'"')?;
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_arbitrary_chunk_boundaries() {
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\"}\n\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n: keep-alive\n\ndata: {\"type\":\"response.completed\"}\r\n\r\n";
        for chunk_size in [1, 2, 3, 7, 64, stream.len()] {
            let mut s = SseSplitter::new(1 << 20);
            let mut kinds = Vec::new();
            let mut raw = Vec::new();
            for chunk in stream.chunks(chunk_size) {
                s.push(chunk);
                while let Some(ev) = s.next_event().unwrap() {
                    kinds.push(ev.kind.clone());
                    raw.extend_from_slice(&ev.raw);
                }
            }
            assert_eq!(
                kinds,
                [
                    "response.created",
                    "response.output_text.delta",
                    "",
                    "response.completed"
                ]
            );
            assert_eq!(raw, stream, "bytes forwarded unchanged");
            assert_eq!(s.pending(), 0);
        }
    }

    #[test]
    fn data_and_json_of_an_event() {
        let mut s = SseSplitter::new(1024);
        s.push(b"event: x\ndata: {\"type\":\"x\",\n data: \"a\":1}\n\n");
        let ev = s.next_event().unwrap().unwrap();
        assert_eq!(ev.kind, "x");
        let built = SseEvent::build(
            "response.failed",
            &serde_json::json!({"type": "response.failed"}),
        );
        assert_eq!(built.json().unwrap()["type"], "response.failed");
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut s = SseSplitter::new(16);
        s.push(b"data: 0123456789012345678901234567890");
        assert_eq!(s.next_event(), Err(EventTooLarge(16)));
    }

    #[test]
    fn json_type_scans_the_first_type_key() {
        assert_eq!(
            json_type(br#"data: {"type" : "a.b","item":{"type":"c"}}"#).as_deref(),
            Some("a.b")
        );
        assert_eq!(json_type(b"data: {}"), None);
    }
}
