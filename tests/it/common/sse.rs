//! Server-sent events as the tests read them, from the gateway and from the simulator: one
//! parser of event blocks, read leniently for the gateway's answers (comments counted, an
//! event named by its data's `type` when it has no `event:` line) and strictly for the
//! simulator's, whose every block is one named event.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

/// One block of a stream (the lines up to a blank line).
struct Block {
    /// The `event:` line's name.
    event: Option<String>,
    /// The `data:` lines, joined.
    data: String,
    /// Lines starting with `:`.
    comments: usize,
}

fn blocks(body: &str) -> Vec<Block> {
    body.replace("\r\n", "\n")
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut b = Block {
                event: None,
                data: String::new(),
                comments: 0,
            };
            for line in block.lines() {
                if let Some(k) = line.strip_prefix("event:") {
                    b.event = Some(k.trim().to_string());
                } else if let Some(d) = line.strip_prefix("data:") {
                    b.data.push_str(d.trim_start());
                } else if line.starts_with(':') {
                    b.comments += 1;
                }
            }
            b
        })
        .collect()
}

/// `(type, data)` of each event that has data (its `event:` name, else its data's `type`;
/// data that is not JSON reads as `Null`), and the number of comment lines.
pub fn parse_sse(body: &str) -> (Vec<(String, Value)>, usize) {
    let mut events = Vec::new();
    let mut comments = 0;
    for b in blocks(body) {
        comments += b.comments;
        if b.data.is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&b.data).unwrap_or(Value::Null);
        let kind = b
            .event
            .unwrap_or_else(|| v["type"].as_str().unwrap_or("").to_string());
        events.push((kind, v));
    }
    (events, comments)
}

/// The events of a stream in which every block is one event: an `event:` line and JSON data
/// whose `type` is that name (as the simulator writes them, like the backend).
pub fn parse_sse_strict(body: &str) -> Vec<Value> {
    blocks(body)
        .into_iter()
        .map(|b| {
            let event = b
                .event
                .unwrap_or_else(|| panic!("a block without an event line: {}", b.data));
            assert!(!b.data.is_empty(), "event {event} has no data line");
            let v: Value = serde_json::from_str(&b.data).unwrap();
            assert_eq!(v["type"], event, "event line and data type agree");
            v
        })
        .collect()
}

/// Reads the events of a strict stream one by one as they arrive.
pub struct SseReader {
    resp: reqwest::Response,
    buf: String,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> SseReader {
        SseReader {
            resp,
            buf: String::new(),
        }
    }

    /// The next event; `None` once the stream has ended cleanly.
    pub async fn next(&mut self) -> Result<Option<Value>, reqwest::Error> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                return Ok(parse_sse_strict(&block).into_iter().next());
            }
            match self.resp.chunk().await? {
                Some(bytes) => self.buf.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => return Ok(None),
            }
        }
    }
}
