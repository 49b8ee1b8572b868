//! Server-sent events, incrementally: split a byte stream into whole events without copying
//! more than needed. Each event's type and data are slices of the bytes received; only an
//! event whose data spans several `data:` lines is joined into new bytes.

use bytes::{Bytes, BytesMut};

use super::event::Event;

/// One whole SSE block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Event(Event),
    /// A block without data (a `: keep-alive` comment).
    Comment,
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

    pub fn next_piece(&mut self) -> Result<Option<Piece>, EventTooLarge> {
        let Some(end) = block_end(&self.buf) else {
            if self.buf.len() > self.max_event {
                return Err(EventTooLarge(self.max_event));
            }
            return Ok(None);
        };
        let raw = self.buf.split_to(end).freeze();
        Ok(Some(parse_block(&raw)))
    }
}

/// Index just past the first blank line (`\n\n` or `\r\n\r\n`).
fn block_end(buf: &[u8]) -> Option<usize> {
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

/// A field's value: what follows the colon, without one leading space.
fn value_of(line: &[u8], field_len: usize) -> usize {
    let start = field_len + 1;
    if line.get(start) == Some(&b' ') {
        start + 1
    } else {
        start
    }
}

fn parse_block(raw: &Bytes) -> Piece {
    let mut kind: Option<Bytes> = None;
    let mut data: Vec<Bytes> = Vec::new();
    let mut pos = 0;
    for line in raw.split(|b| *b == b'\n') {
        let len = line.len();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.starts_with(b"event:") {
            let v = &line[value_of(line, 5)..];
            let lead = v.len() - v.trim_ascii_start().len();
            let start = pos + value_of(line, 5) + lead;
            kind = Some(raw.slice(start..start + v.trim_ascii().len()));
        } else if line.starts_with(b"data:") {
            let start = pos + value_of(line, 4);
            data.push(raw.slice(start..pos + line.len()));
        }
        pos += len + 1;
    }
    let data = match data.len() {
        0 => return Piece::Comment,
        1 => data.pop().unwrap_or_default(),
        _ => {
            let mut joined = BytesMut::new();
            for (i, d) in data.iter().enumerate() {
                if i > 0 {
                    joined.extend_from_slice(b"\n");
                }
                joined.extend_from_slice(d);
            }
            joined.freeze()
        }
    };
    Piece::Event(match kind {
        Some(k) => Event::new(k, data),
        None => Event::from_data(data),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(stream: &[u8], chunk_size: usize) -> Vec<Piece> {
        let mut s = SseSplitter::new(1 << 20);
        let mut out = Vec::new();
        for chunk in stream.chunks(chunk_size) {
            s.push(chunk);
            while let Some(p) = s.next_piece().unwrap() {
                out.push(p);
            }
        }
        assert_eq!(s.pending(), 0);
        out
    }

    #[test]
    fn splits_events_across_arbitrary_chunk_boundaries() {
        let stream = b"event: response.created\ndata: {\"type\":\"response.created\"}\n\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n: keep-alive\n\ndata: {\"type\":\"response.completed\"}\r\n\r\n";
        for chunk_size in [1, 2, 3, 7, 64, stream.len()] {
            let got = pieces(stream, chunk_size);
            let kinds: Vec<&str> = got
                .iter()
                .map(|p| match p {
                    Piece::Event(e) => e.kind(),
                    Piece::Comment => ":",
                })
                .collect();
            assert_eq!(
                kinds,
                [
                    "response.created",
                    "response.output_text.delta",
                    ":",
                    "response.completed"
                ]
            );
            let Piece::Event(delta) = &got[1] else {
                panic!("not an event")
            };
            assert_eq!(
                delta.data().as_ref(),
                br#"{"type":"response.output_text.delta","delta":"hi"}"#
            );
            let Piece::Event(done) = &got[3] else {
                panic!("not an event")
            };
            assert_eq!(done.data().as_ref(), br#"{"type":"response.completed"}"#);
        }
    }

    #[test]
    fn data_lines_are_joined_and_the_event_line_wins() {
        let got = pieces(b"event: x\ndata: {\"type\":\"y\",\ndata: \"a\":1}\n\n", 5);
        let Piece::Event(e) = &got[0] else {
            panic!("not an event")
        };
        assert_eq!(e.kind(), "x");
        assert_eq!(e.data().as_ref(), b"{\"type\":\"y\",\n\"a\":1}");
        assert_eq!(e.json().unwrap()["a"], 1);
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut s = SseSplitter::new(16);
        s.push(b"data: 0123456789012345678901234567890");
        assert_eq!(s.next_piece(), Err(EventTooLarge(16)));
    }
}
