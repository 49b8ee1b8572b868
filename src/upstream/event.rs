//! One event of a Responses stream, whichever transport carried it: its type and its JSON
//! data, both slices of the bytes received (an SSE block's `event:`/`data:` lines, or a
//! WebSocket text frame), never re-encoded on the way. The HTTP edge frames it as SSE (or
//! writes the SSE block it came in, when that block is already in the edge's form) and the
//! WebSocket edge as a text frame, each once.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};

use crate::base::json_scan::Scan;

/// Terminal events: the stream's answer is complete (or failed) after one of these.
pub fn is_terminal(kind: &str) -> bool {
    is_terminal_type(kind.as_bytes())
}

/// The same on the type's bytes (text that is not UTF-8 is none of them).
pub(super) fn is_terminal_type(kind: &[u8]) -> bool {
    matches!(
        kind,
        b"response.completed" | b"response.failed" | b"response.incomplete" | b"error"
    )
}

#[derive(Debug, Clone)]
pub struct Event {
    /// The bytes its type and data are ranges of: the SSE block it came in, the WebSocket
    /// frame, or the two joined for an event made here. One buffer, so that an event costs
    /// one reference to what was received, not three.
    bytes: Bytes,
    /// Its type (UTF-8) within `bytes`.
    kind: Range<u32>,
    /// Its JSON data within `bytes`, as received.
    data: Range<u32>,
    /// `bytes` is exactly what the edge would write for it (`event: {kind}`, `data: {data}`,
    /// a blank line).
    framed: bool,
}

/// Two events are equal when their types and data are, however they arrived.
impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        self.kind_bytes() == other.kind_bytes() && self.data_slice() == other.data_slice()
    }
}

impl Eq for Event {}

/// A range as stored: events are far below 4 GiB (the splitter's limit is the event size).
fn narrow(r: Range<usize>) -> Range<u32> {
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    n(r.start)..n(r.end)
}

fn wide(r: &Range<u32>) -> Range<usize> {
    r.start as usize..r.end as usize
}

impl Event {
    /// An event of a known type, its type and data given apart (joined into one buffer).
    pub fn new(kind: Bytes, data: Bytes) -> Event {
        let mut bytes = Vec::with_capacity(kind.len() + data.len());
        bytes.extend_from_slice(&kind);
        bytes.extend_from_slice(&data);
        Event {
            kind: narrow(0..kind.len()),
            data: narrow(kind.len()..bytes.len()),
            bytes: Bytes::from(bytes),
            framed: false,
        }
    }

    /// The event of an SSE `block` whose type and data are the given ranges of it: the block
    /// is kept to be written out as it is when it is already in the edge's own form.
    pub fn of_block(block: Bytes, kind: Range<usize>, data: Range<usize>) -> Event {
        const EVENT: &[u8] = b"event: ";
        const DATA: &[u8] = b"\ndata: ";
        let framed = kind.start == EVENT.len()
            && block.starts_with(EVENT)
            && data.start == kind.end + DATA.len()
            && block.get(kind.end..data.start) == Some(DATA)
            && block.len() == data.end + 2
            && block.ends_with(b"\n\n")
            && !kind.is_empty()
            && block[kind.clone()].is_ascii();
        Event {
            bytes: block,
            kind: narrow(kind),
            data: narrow(data),
            framed,
        }
    }

    /// The event of a block the splitter found to be `event: {kind}\ndata: {data}\n\n`
    /// exactly: in the edge's own form when its type is ASCII (the checks [`Event::of_block`]
    /// makes, the rest already made).
    pub(super) fn of_plain_block(block: Bytes, kind: Range<usize>, data: Range<usize>) -> Event {
        debug_assert!(
            block.starts_with(b"event: ")
                && block.get(kind.end..data.start) == Some(b"\ndata: ")
                && block.len() == data.end + 2
                && block.ends_with(b"\n\n")
        );
        let framed = !kind.is_empty() && block[kind.clone()].is_ascii();
        Event {
            bytes: block,
            kind: narrow(kind),
            data: narrow(data),
            framed,
        }
    }

    /// Appends its SSE block to `out`: as it came when it arrived in this form, else an
    /// `event:` line with its type (when it has one), then its data, one `data:` line per
    /// line of it, and a blank line.
    pub fn write_sse(&self, out: &mut BytesMut) {
        if let Some(block) = self.framed() {
            out.extend_from_slice(block);
            return;
        }
        let kind = self.kind();
        if !kind.is_empty() {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(kind.as_bytes());
            out.extend_from_slice(b"\n");
        }
        let data = self.data();
        if memchr::memchr(b'\n', data).is_none() {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(data);
            out.extend_from_slice(b"\n");
        } else {
            for line in data.split(|b| *b == b'\n') {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(line);
                out.extend_from_slice(b"\n");
            }
        }
        out.extend_from_slice(b"\n");
    }

    /// Room enough for its SSE block in most cases (its bytes and the lines' names).
    pub fn sse_room(&self) -> usize {
        self.len() + 18
    }

    /// The SSE block to write for it, when it arrived as one in the edge's own form.
    pub fn framed(&self) -> Option<&Bytes> {
        self.framed.then_some(&self.bytes)
    }

    /// An event whose type is read from its data's first `"type"` key (a WebSocket frame, or
    /// an SSE block without an `event:` line).
    pub fn from_data(data: Bytes) -> Event {
        let kind = json_type_range(&data).unwrap_or_default();
        Event {
            kind: narrow(kind),
            data: narrow(0..data.len()),
            bytes: data,
            framed: false,
        }
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
        Event::new(
            Bytes::from_static(b"response.failed"),
            Bytes::from(data.to_string()),
        )
    }

    /// An event built from a JSON value (events the gateway answers itself).
    pub fn from_value(v: &Value) -> Event {
        Event::from_data(Bytes::from(v.to_string()))
    }

    /// The event's type; empty when it has none.
    pub fn kind(&self) -> &str {
        std::str::from_utf8(self.kind_bytes()).unwrap_or_default()
    }

    /// Whether its type is `kind` (compared as bytes, with no UTF-8 check).
    pub fn is_kind(&self, kind: &str) -> bool {
        self.kind_bytes() == kind.as_bytes()
    }

    /// Its type as received, with no UTF-8 check.
    pub fn kind_bytes(&self) -> &[u8] {
        &self.bytes[wide(&self.kind)]
    }

    /// Its data, as received.
    pub fn data(&self) -> &[u8] {
        self.data_slice()
    }

    fn data_slice(&self) -> &[u8] {
        &self.bytes[wide(&self.data)]
    }

    /// Its data as shared bytes (for a frame that carries them on).
    pub fn data_bytes(&self) -> Bytes {
        self.bytes.slice(wide(&self.data))
    }

    /// The `response.id` it carries, read only as far as that id (see [`response_id`]).
    pub fn response_id(&self) -> Option<Arc<str>> {
        response_id(self.data())
    }

    /// The data, parsed (only for the few events whose content the gateway reads).
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(self.data()).ok()
    }

    /// Asked of every event: compared as bytes, with no UTF-8 check.
    pub fn is_terminal(&self) -> bool {
        is_terminal_type(self.kind_bytes())
    }

    /// Bytes it carries (for buffer limits).
    pub fn len(&self) -> usize {
        self.kind.len() + self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// The `response.id` of an event, read only as far as that id: the members after it are not
/// read at all (a `response.created` may echo the request's instructions and tools after it).
/// `None` when the event has no `response` object with a text `id` before anything unreadable.
fn response_id(data: &[u8]) -> Option<Arc<str>> {
    plain_response_id(data).or_else(|| read_response_id(data).map(Arc::from))
}

/// The same, read with serde_json: any form.
fn read_response_id(data: &[u8]) -> Option<String> {
    let mut id = None;
    let mut de = serde_json::Deserializer::from_slice(data);
    // Reading stops at the id: the map it is in is left unfinished, which the reader then
    // refuses at once (an error without a message to format). The id is kept either way.
    let _ = serde::de::DeserializeSeed::deserialize(
        IdWithin {
            out: &mut id,
            path: &["response", "id"],
        },
        &mut de,
    );
    id
}

/// The `response.id` of an event found by a scan of its text, stopping at the id. `None` where
/// the scan leaves the event to the full reading (an id that is no text, JSON it does not
/// take before the id), which finds the same id wherever this one does.
fn plain_response_id(data: &[u8]) -> Option<Arc<str>> {
    let mut s = Scan::new(data);
    let mut id = None;
    // Each walk ends (`None`) as soon as it has what it came for.
    let _ = s.members(|s, key| {
        if key != b"response" {
            return s.value();
        }
        let _ = s.members(|s, key| {
            if key != b"id" {
                return s.value();
            }
            id = s.string()?.text().map(|t| Arc::from(&*t));
            None
        });
        None
    });
    id
}

/// Reads a map down `path`, reading past the members before each step and stopping, at the
/// last one, as soon as its value is read (into `out`, when it is text).
struct IdWithin<'a> {
    out: &'a mut Option<String>,
    path: &'static [&'static str],
}

impl<'de> serde::de::DeserializeSeed<'de> for IdWithin<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for IdWithin<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((name, rest)) = self.path.split_first() else {
            return Ok(());
        };
        while let Some(hit) = map.next_key_seed(KeyIs(name))? {
            if !hit {
                map.next_value::<serde::de::IgnoredAny>()?;
            } else if rest.is_empty() {
                // Whatever it is, reading stops here: an id that is no text is none.
                *self.out = map.next_value::<Option<String>>().ok().flatten();
                return Ok(());
            } else {
                return map.next_value_seed(IdWithin {
                    out: self.out,
                    path: rest,
                });
            }
        }
        Ok(())
    }
}

/// Whether a map's key is `.0`, read without keeping it.
struct KeyIs<'a>(&'a str);

impl<'de> serde::de::DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeyIs<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
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

    /// The created event's id is read up to itself: what follows it is not read, and an id
    /// anywhere but in the `response` object is not the answer's.
    #[test]
    fn a_response_id_is_read_only_as_far_as_the_id() {
        let id = |data: &str| Event::from_data(Bytes::from(data.to_string())).response_id();
        let created = r#"{"type":"response.created","response":{"object":"response","id":"resp_7","instructions":"x"}}"#;
        assert_eq!(id(created), Some("resp_7".into()));
        // Past the id, the rest is never read: not even bytes that are no JSON.
        assert_eq!(
            id(r#"{"type":"response.created","response":{"id":"resp_7","tools":[{"#),
            Some("resp_7".into())
        );
        assert_eq!(
            id(r#"{"response":{"id":"resp_\u0037"}}"#),
            Some("resp_7".into())
        );
        for none in [
            r#"{"type":"response.created","id":"resp_top","response":{"status":"in_progress"}}"#,
            r#"{"item":{"id":"msg_1"},"response":{"model":"gpt-5.5"}}"#,
            r#"{"response":{"id":7}}"#,
            r#"{"response":"resp_7"}"#,
            r#"{"response":{"status":"in_progress","#,
            "[]",
            "",
        ] {
            assert_eq!(id(none), None, "{none}");
        }
        // It reads what the parsed event says wherever the event is whole.
        let ev = Event::from_data(Bytes::from(created));
        assert_eq!(
            id(created),
            ev.json()
                .and_then(|v| v["response"]["id"].as_str().map(Arc::from))
        );
    }

    /// The scan of the plain form finds what the full reading finds, or leaves it to it: on
    /// every prefix of events in various forms, and on the forms it does not read.
    #[test]
    fn the_plain_scan_of_an_id_agrees_with_the_full_reading() {
        let full = |data: &[u8]| read_response_id(data).map(Arc::<str>::from);
        let events = [
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response"}}"#,
            r#"{ "type" : "response.created" , "n":-12,"ok":true,"no":false,"x":null, "response" : { "object":"response", "id" : "resp_2" } }"#,
            r#"{"type":"response.created","response":{"id":"resp_\u0033"}}"#,
            r#"{"type":"response.created","v":1.5,"response":{"id":"resp_4"}}"#,
            r#"{"type":"response.created","v":01,"response":{"id":"resp_5"}}"#,
            r#"{"type":"response.created","v":[1],"response":{"id":"resp_6"}}"#,
            r#"{"type":"r\u00e9","response":{"id":"resp_7"}}"#,
            "{\"type\":\"r\u{e9}\",\"response\":{\"id\":\"resp_8\"}}",
            r#"{"type":"response.created","response":{"id":7}}"#,
            r#"{"type":"response.created","response":{"id":null}}"#,
            r#"{"type":"response.created","response":{"status":"x"}}"#,
            r#"{"type":"response.created","response":"resp_9"}"#,
            r#"{"type":"response.created","truth":tru,"response":{"id":"resp_10"}}"#,
            r#"{"type":"response.created","n":-,"response":{"id":"resp_11"}}"#,
        ];
        let mut scanned = 0;
        for ev in events {
            let ev = ev.as_bytes();
            for end in 0..=ev.len() {
                let data = &ev[..end];
                let quick = plain_response_id(data);
                if quick.is_some() {
                    scanned += 1;
                    assert_eq!(quick, full(data), "{}", String::from_utf8_lossy(data));
                }
                assert_eq!(response_id(data), full(data));
            }
        }
        assert!(scanned > 0, "the plain form is scanned");
        assert_eq!(
            plain_response_id(events[0].as_bytes()),
            Some("resp_1".into())
        );
        assert_eq!(
            plain_response_id(events[1].as_bytes()),
            Some("resp_2".into())
        );
        for (i, id) in [(2, "resp_3"), (3, "resp_4"), (5, "resp_6"), (6, "resp_7")] {
            assert_eq!(plain_response_id(events[i].as_bytes()).as_deref(), Some(id));
        }
        for left in [4, 8, 9, 10, 11, 12, 13] {
            let left = events[left];
            assert_eq!(plain_response_id(left.as_bytes()), None, "{left}");
        }
    }

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
