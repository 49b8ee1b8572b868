#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Forwarding cost per event after the commit, on a realistic event mix:
//! - SSE: splitting the upstream byte stream into events and reading each event's type, fed in
//!   network-sized chunks;
//! - WebSocket relay: an upstream text frame framed as an SSE event (its type scanned), split
//!   again and turned back into the downstream frame's text — the path a WebSocket turn takes.
//!
//! Prints ns per event. DESIGN §11 budget: < 2 µs per SSE event.
//!
//! `cargo bench --bench sse_forward`

use std::hint::black_box;
use std::time::Instant;

use switchyard::dispatch::stream::{is_precommit, is_terminal};
use switchyard::upstream::sse::SseSplitter;

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
    let data = stream(events);
    for chunk in [512usize, 4096, 16384] {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            let mut splitter = SseSplitter::new(16 << 20);
            let mut seen = 0usize;
            let mut forwarded = 0usize;
            for c in data.chunks(chunk) {
                splitter.push(c);
                while let Ok(Some(ev)) = splitter.next_event() {
                    if !is_precommit(&ev.kind) || is_terminal(&ev.kind) {
                        forwarded += ev.raw.len();
                    }
                    seen += 1;
                    black_box(&ev);
                }
            }
            black_box(forwarded);
            assert_eq!(seen, events + 2);
            best = best.min(start.elapsed().as_nanos() as f64 / seen as f64);
        }
        println!("SSE, chunk {chunk:>5} B: {best:>7.1} ns/event (best of 5, {events} events)");
    }

    // WebSocket relay: one frame in, one frame out.
    let frames: Vec<String> = (0..events)
        .map(|i| format!("{{\"type\":\"response.output_text.delta\",\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\"token {i} \",\"sequence_number\":{i}}}"))
        .collect();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let mut splitter = SseSplitter::new(16 << 20);
        let mut out = 0usize;
        for f in &frames {
            let kind = switchyard::upstream::sse::json_type(f.as_bytes()).unwrap_or_default();
            let framed = format!("event: {kind}\ndata: {f}\n\n");
            splitter.push(framed.as_bytes());
            while let Ok(Some(ev)) = splitter.next_event() {
                let text = ev.data();
                out += text.len();
                black_box(&text);
            }
        }
        black_box(out);
        best = best.min(start.elapsed().as_nanos() as f64 / events as f64);
    }
    println!("WebSocket relay: {best:>7.1} ns/frame (best of 5, {events} frames)");
}
