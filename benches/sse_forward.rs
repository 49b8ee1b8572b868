#![allow(clippy::expect_used, clippy::unwrap_used)]
//! Forwarding cost per event after the commit, on a realistic event mix:
//! - SSE: splitting the upstream byte stream into events (type and data as slices), fed in
//!   network-sized chunks, and framing each read's events as SSE again for the client;
//! - WebSocket relay: an upstream text frame read as an event (its type scanned) and its data
//!   handed on as the downstream frame's text — the path a WebSocket turn takes.
//!
//! Prints ns per event. DESIGN §11 budget: < 2 µs per SSE event.
//!
//! `cargo bench --bench sse_forward`

use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use switchyard::api::responses::sse;
use switchyard::dispatch::stream::is_precommit;
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
    let data = stream(events);
    for chunk in [512usize, 4096, 16384] {
        for framed in [false, true] {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let start = Instant::now();
                let mut splitter = SseSplitter::new(16 << 20);
                let mut seen = 0usize;
                let mut forwarded = 0usize;
                let mut batch = Vec::new();
                for c in data.chunks(chunk) {
                    splitter.push(c);
                    while let Ok(Some(Piece::Event(ev))) = splitter.next_piece() {
                        if !is_precommit(ev.kind()) || ev.is_terminal() {
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
}
