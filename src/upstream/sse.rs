//! Server-sent events, incrementally: split a byte stream into whole events without copying
//! more than needed. Each event's type and data are slices of the bytes received; only an
//! event whose data spans several `data:` lines is joined into new bytes.

use std::ops::Range;

use bytes::BytesMut;

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

    /// The next whole block, read in one pass over its bytes (newlines found with `memchr`):
    /// its type and data are slices of what was received.
    pub fn next_piece(&mut self) -> Result<Option<Piece>, EventTooLarge> {
        loop {
            let mut pos = 0;
            let mut lines = 0;
            let mut kind: Option<Range<usize>> = None;
            let mut data: Option<Range<usize>> = None;
            // Further data lines (rare): joined into new bytes.
            let mut joined: Option<BytesMut> = None;
            let end = loop {
                let Some(nl) = memchr::memchr(b'\n', &self.buf[pos..]) else {
                    if self.buf.len() > self.max_event {
                        return Err(EventTooLarge(self.max_event));
                    }
                    return Ok(None);
                };
                let next = pos + nl + 1;
                let mut line = pos..pos + nl;
                if line.end > line.start && self.buf[line.end - 1] == b'\r' {
                    line.end -= 1;
                }
                if line.is_empty() {
                    break next;
                }
                lines += 1;
                let l = &self.buf[line.clone()];
                if l.starts_with(b"data:") {
                    let value = line.start + value_of(l, 4)..line.end;
                    match (&data, &mut joined) {
                        (None, _) => data = Some(value),
                        (Some(first), None) => {
                            let mut j = BytesMut::with_capacity(first.len() + 1 + value.len());
                            j.extend_from_slice(&self.buf[first.clone()]);
                            j.extend_from_slice(b"\n");
                            j.extend_from_slice(&self.buf[value]);
                            joined = Some(j);
                        }
                        (Some(_), Some(j)) => {
                            j.extend_from_slice(b"\n");
                            j.extend_from_slice(&self.buf[value]);
                        }
                    }
                } else if l.starts_with(b"event:") {
                    let v = &l[value_of(l, 5)..];
                    let lead = v.len() - v.trim_ascii_start().len();
                    let start = line.start + value_of(l, 5) + lead;
                    kind = Some(start..start + v.trim_ascii().len());
                }
                pos = next;
            };
            let raw = self.buf.split_to(end).freeze();
            if lines == 0 {
                continue; // a stray blank line
            }
            if let (None, Some(r), Some(k), 2) = (&joined, &data, &kind, lines) {
                // One `event:` and one `data:` line: the block may go out as it came.
                let (k, r) = (k.clone(), r.clone());
                return Ok(Some(Piece::Event(Event::of_block(raw, k, r))));
            }
            let data = match (joined, data) {
                (Some(j), _) => j.freeze(),
                (None, Some(r)) => raw.slice(r),
                (None, None) => return Ok(Some(Piece::Comment)),
            };
            return Ok(Some(Piece::Event(match kind {
                Some(k) => Event::new(raw.slice(k), data),
                None => Event::from_data(data),
            })));
        }
    }
}

/// Where a field's value starts: after the colon and one optional space.
fn value_of(line: &[u8], field_len: usize) -> usize {
    let start = field_len + 1;
    if line.get(start) == Some(&b' ') {
        start + 1
    } else {
        start
    }
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
                delta.data(),
                br#"{"type":"response.output_text.delta","delta":"hi"}"#
            );
            let Piece::Event(done) = &got[3] else {
                panic!("not an event")
            };
            assert_eq!(done.data(), br#"{"type":"response.completed"}"#);
        }
    }

    #[test]
    fn data_lines_are_joined_and_the_event_line_wins() {
        let got = pieces(b"event: x\ndata: {\"type\":\"y\",\ndata: \"a\":1}\n\n", 5);
        let Piece::Event(e) = &got[0] else {
            panic!("not an event")
        };
        assert_eq!(e.kind(), "x");
        assert_eq!(e.data(), b"{\"type\":\"y\",\n\"a\":1}");
        assert_eq!(e.json().unwrap()["a"], 1);
    }

    #[test]
    fn stray_blank_lines_are_skipped_and_fields_need_no_space() {
        let got = pieces(b"\n\r\nevent:x\ndata:{\"a\":1}\n\n: ping\r\n\r\n", 3);
        assert_eq!(got.len(), 2, "{got:?}");
        let Piece::Event(e) = &got[0] else {
            panic!("not an event")
        };
        assert_eq!((e.kind(), e.data()), ("x", b"{\"a\":1}".as_ref()));
        assert_eq!(got[1], Piece::Comment);
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut s = SseSplitter::new(16);
        s.push(b"data: 0123456789012345678901234567890");
        assert_eq!(s.next_piece(), Err(EventTooLarge(16)));
    }
}
