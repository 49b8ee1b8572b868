#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Forwarding cost per event after the commit, on a realistic event mix:
//! - SSE: splitting the upstream byte stream into events (type and data as slices), fed in
//!   network-sized chunks, and framing each read's events as SSE again for the client; and
//!   the same stream as the gateway forwards it once an answer is committed, its plain blocks
//!   moved a run at a time as they came (`take_plain_run`);
//! - WebSocket relay: an upstream text frame read as an event (its type scanned) and its data
//!   handed on as the downstream frame's text — the path a WebSocket turn takes;
//! - the answer's id, from a `response.created` that echoes the request (its instructions and
//!   tools, as the Responses API's created event does): read only as far as the id, next to
//!   reading past the whole event and to parsing it as a tree;
//! - the answer's usage, from a `response.completed` that echoes the request and carries the
//!   answer: the gateway's peek ([`ResponsePeek`]), next to a tree.
//!
//! Prints ns per event. DESIGN §11 budget: < 2 µs per SSE event.
//!
//! `cargo bench --bench sse_forward`

use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use switchyard::api::responses::sse;
use switchyard::dispatch::stream::{ResponsePeek, is_precommit};
use switchyard::upstream::event::Event;
use switchyard::upstream::sse::{Piece, SseSplitter};

fn stream(events: usize) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"model\":\"gpt-5.5\",\"output\":[]}}\n\n");
    for i in 0..events {
        let ev = format!(
            "event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\"token {i} \",\"sequence_number\":{i}}}\n\n"
        );
        out.extend_from_slice(ev.as_bytes());
    }
    out.extend_from_slice(b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\"}}\n\n");
    out
}

fn main() {
    let events = 100_000;
    // One buffer, read in slices of it, as the connection's reads come.
    let data = Bytes::from(stream(events));
    let slices = |n: usize| -> Vec<Bytes> {
        (0..data.len())
            .step_by(n)
            .map(|at| data.slice(at..(at + n).min(data.len())))
            .collect()
    };
    for chunk in [512usize, 4096, 16384] {
        let reads = slices(chunk);
        for framed in [false, true] {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                let mut splitter = SseSplitter::new(16 << 20);
                let mut seen = 0usize;
                let mut forwarded = 0usize;
                let mut batch = Vec::new();
                for c in &reads {
                    splitter.push_bytes(c.clone());
                    while let Ok(Some(Piece::Event(ev))) = splitter.next_piece() {
                        if !is_precommit(ev.kind_bytes()) || ev.is_terminal() {
                            batch.push(ev);
                        }
                        seen += 1;
                    }
                    if framed {
                        forwarded += sse(&batch).len();
                    } else {
                        forwarded += batch.iter().map(Event::len).sum::<usize>();
                    }
                    batch.clear();
                }
                black_box(forwarded);
                assert_eq!(seen, events + 2);
                best = best.min(start.elapsed().as_nanos() as f64 / seen as f64);
            }
            let what = if framed {
                "split + SSE framing"
            } else {
                "split"
            };
            println!(
                "SSE, chunk {chunk:>5} B, {what:<19}: {best:>7.1} ns/event (best of 5, {events} events)"
            );
        }
    }

    // After the commit: the plain blocks moved as they came, a run at a time, up to the
    // terminal event (which is read as an event).
    // As a stream comes while the answer is made: one event per read.
    let mut per_event = Vec::with_capacity(events + 2);
    let mut at = 0;
    for end in memchr::memmem::find_iter(&data, b"\n\n") {
        per_event.push(data.slice(at..end + 2));
        at = end + 2;
    }
    let reads = |chunk: usize| -> Vec<Bytes> {
        match chunk {
            0 => per_event.clone(),
            n => slices(n),
        }
    };
    // Each read is handed over as the connection's own bytes (a slice of its buffer) and
    // either kept as it came or copied into the splitter's buffer.
    for (chunk, copied) in [0usize, 512, 4096, 16384]
        .into_iter()
        .flat_map(|c| [(c, true), (c, false)])
    {
        let reads = reads(chunk);
        let mut best = f64::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            let mut splitter = SseSplitter::new(16 << 20);
            let (mut moved, mut seen, mut forwarded) = (0usize, 0usize, 0usize);
            let mut out = bytes::BytesMut::new();
            for c in &reads {
                let c = c.clone();
                if copied {
                    splitter.push(&c);
                } else {
                    splitter.push_bytes(c);
                }
                loop {
                    let n = splitter.take_plain_run(&mut out);
                    moved += n;
                    match splitter.next_piece() {
                        Ok(Some(_)) => seen += 1,
                        _ if n > 0 => {}
                        _ => break,
                    }
                }
                forwarded += out.split().freeze().len();
            }
            black_box(forwarded);
            assert_eq!(moved + seen, events + 2);
            best = best.min(start.elapsed().as_nanos() as f64 / (moved + seen) as f64);
        }
        let read = match chunk {
            0 => "an event".to_string(),
            n => format!("{n:>5} B"),
        };
        let what = if copied {
            "runs moved, copied"
        } else {
            "runs moved"
        };
        println!(
            "SSE, read {read:>8}, {what:<19}: {best:>7.1} ns/event (best of 5, {events} events)"
        );
    }

    // WebSocket relay: one frame in, one frame out.
    let frames: Vec<String> = (0..events)
        .map(|i| format!("{{\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\"token {i} \",\"sequence_number\":{i}}}"))
        .collect();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let frames: Vec<Bytes> = frames.iter().map(|f| Bytes::from(f.clone())).collect();
        let start = Instant::now();
        let mut out = 0usize;
        for f in frames {
            let ev = Event::from_data(f);
            black_box(ev.kind());
            let text = ev.data_bytes();
            out += text.len();
            black_box(&text);
        }
        black_box(out);
        best = best.min(start.elapsed().as_nanos() as f64 / events as f64);
    }
    println!("WebSocket relay: {best:>7.1} ns/frame (best of 5, {events} frames)");

    created_id();
    completed_usage();
}

/// A response object that echoes a request of Codex's size (~12 KB of instructions, 30
/// function tools) with `extra` members.
fn echoing_response(status: &str, extra: serde_json::Value) -> serde_json::Value {
    let tools: Vec<serde_json::Value> = (0..30)
        .map(|i| {
            serde_json::json!({"type": "function", "name": format!("tool_{i}"),
                "description": "Runs a command in the workspace and returns its output.",
                "strict": false, "parameters": {"type": "object", "properties": {
                    "command": {"type": "array", "items": {"type": "string"}},
                    "workdir": {"type": "string", "description": "The working directory."},
                    "timeout_ms": {"type": "number"}}, "required": ["command"]}})
        })
        .collect();
    let mut response = serde_json::json!({"id": "resp_0123456789", "object": "response",
        "created_at": 1_767_225_600, "status": status,
        "instructions": "You are a coding agent. ".repeat(500), "model": "gpt-5.5",
        "output": [], "tools": tools, "usage": null});
    if let (Some(r), serde_json::Value::Object(e)) = (response.as_object_mut(), extra) {
        r.extend(e);
    }
    response
}

/// A `response.created` whose response echoes the request, after the id.
fn echoing_created() -> Event {
    let data = serde_json::json!({"type": "response.created", "sequence_number": 0,
        "response": echoing_response("in_progress", serde_json::json!({}))});
    Event::from_data(Bytes::from(data.to_string()))
}

/// A `response.completed` that echoes the request and carries a reasoning item (its encrypted
/// content), a message of ~2 KB and a function call, then the usage.
fn echoing_completed() -> Event {
    let output = serde_json::json!([
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "encrypted_content": "gAAAAAB".repeat(600)},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "annotations": [],
                      "text": "Here is what I changed, and why. ".repeat(60)}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "tool_3",
         "arguments": "{\"command\":[\"cargo\",\"test\"],\"workdir\":\"/src\"}"},
    ]);
    let usage = serde_json::json!({"input_tokens": 18_000,
        "input_tokens_details": {"cached_tokens": 16_000}, "output_tokens": 900,
        "output_tokens_details": {"reasoning_tokens": 400}, "total_tokens": 18_900});
    let data = serde_json::json!({"type": "response.completed", "sequence_number": 60,
        "response": echoing_response("completed",
            serde_json::json!({"output": output, "usage": usage, "service_tier": "default"}))});
    Event::from_data(Bytes::from(data.to_string()))
}

/// The best of five runs of 20,000 calls of `f`, in ns per call; each call must give `want`.
fn best_ns<T: PartialEq + std::fmt::Debug>(want: &T, f: &dyn Fn() -> T) -> f64 {
    let runs = 20_000;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..runs {
            assert_eq!(&black_box(f()), want);
        }
        best = best.min(start.elapsed().as_nanos() as f64 / runs as f64);
    }
    best
}

fn completed_usage() {
    let ev = echoing_completed();
    let time = |f: &dyn Fn() -> Option<u64>| best_ns(&Some(900), f);
    let peek = time(&|| ResponsePeek::of(&ev).usage().map(|u| u.output_tokens));
    let tree = time(&|| {
        ev.json()
            .and_then(|v| v["response"]["usage"]["output_tokens"].as_u64())
    });
    println!(
        "Usage from a {} KB echoing response.completed: the peek (read past, not built) {peek:.0} ns, as a tree {tree:.0} ns ({:.0}x)",
        ev.len() / 1000,
        tree / peek
    );
}

fn created_id() {
    let ev = echoing_created();
    let time = |f: &dyn Fn() -> Option<String>| best_ns(&Some("resp_0123456789".into()), f);
    #[derive(serde::Deserialize)]
    struct Whole {
        response: Inner,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        id: String,
    }
    let upto = best_ns(&Some("resp_0123456789".into()), &|| ev.response_id());
    let past = time(&|| {
        serde_json::from_slice::<Whole>(ev.data())
            .ok()
            .map(|w| w.response.id)
    });
    let tree = time(&|| {
        ev.json()
            .and_then(|v| v["response"]["id"].as_str().map(str::to_string))
    });
    println!(
        "Answer id from a {} KB echoing response.created: up to the id {upto:.0} ns, reading past the whole event {past:.0} ns ({:.0}x), as a tree {tree:.0} ns ({:.0}x)",
        ev.len() / 1000,
        past / upto,
        tree / upto
    );
}
