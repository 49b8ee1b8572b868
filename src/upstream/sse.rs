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
        match self.next_plain() {
            Plain::Event(ev) => Ok(Some(Piece::Event(ev))),
            // A line of the front block has not ended: reading by lines would find no more.
            Plain::NotWhole if self.buf.len() > self.max_event => {
                Err(EventTooLarge(self.max_event))
            }
            Plain::NotWhole => Ok(None),
            Plain::Other => self.next_by_lines(),
        }
    }

    /// The next whole block, read line by line: any block of any form.
    fn next_by_lines(&mut self) -> Result<Option<Piece>, EventTooLarge> {
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

    /// The block nearly every event comes in, `event: {type}\ndata: {data}\n\n`, when one is
    /// whole at the front: found with two searches, for its two line ends. A front block whose
    /// lines have not all ended is not searched again line by line; anything else (a comment,
    /// a `\r`, spaces around the type, more lines) is left to the line-by-line reading, which
    /// reads this block the same way.
    fn next_plain(&mut self) -> Plain {
        const EVENT: &[u8] = b"event: ";
        const DATA: &[u8] = b"data: ";
        let buf = &self.buf[..];
        if !buf.starts_with(EVENT) {
            return Plain::Other;
        }
        let Some(nl) = memchr::memchr(b'\n', &buf[EVENT.len()..]) else {
            return Plain::NotWhole;
        };
        let kind = EVENT.len()..EVENT.len() + nl;
        let rest = &buf[kind.end + 1..];
        if !rest.starts_with(DATA) {
            return if DATA.starts_with(rest) {
                Plain::NotWhole
            } else {
                Plain::Other
            };
        }
        let data_start = kind.end + 1 + DATA.len();
        let Some(nl) = memchr::memchr(b'\n', &buf[data_start..]) else {
            return Plain::NotWhole;
        };
        let data = data_start..data_start + nl;
        let edge = |c: Option<&u8>| c.is_none_or(u8::is_ascii_whitespace);
        match buf.get(data.end + 1) {
            None => return Plain::NotWhole,
            Some(b'\n') => {}
            Some(_) => return Plain::Other,
        }
        if edge(buf[kind.clone()].first())
            || edge(buf[kind.clone()].last())
            || buf[data.clone()].last() == Some(&b'\r')
        {
            return Plain::Other;
        }
        let block = self.buf.split_to(data.end + 2).freeze();
        Plain::Event(Event::of_plain_block(block, kind, data))
    }
}

/// What the quick reading of the front block found.
enum Plain {
    /// A whole plain block, taken.
    Event(Event),
    /// A block (of whatever form) with a line not yet ended.
    NotWhole,
    /// Something else, for the line-by-line reading.
    Other,
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

    /// The plain block's quick reading takes what reading it line by line takes, and leaves
    /// every other form (and a block not yet whole) to that.
    #[test]
    fn the_plain_block_reads_as_its_lines_do() {
        let blocks: [&[u8]; 18] = [
            b"event: response.output_text.delta\ndata: {\"delta\":\"a\"}\n\n",
            b"event: x\ndata: \n\n",
            b"event: x\ndata:  two spaces\n\n",
            b"event: x \ndata: {}\n\n",
            b"event:  x\ndata: {}\n\n",
            b"event: \ndata: {}\n\n",
            b"event: x\r\ndata: {}\r\n\r\n",
            b"event: x\ndata: {}\r\n\n",
            b"event: x\ndata: {}\n\r\n",
            b"event: x\ndata: a\ndata: b\n\n",
            b"event: x\nid: 1\ndata: {}\n\n",
            b"event:x\ndata:{}\n\n",
            b"event: x\n\n",
            // Not whole yet:
            b"event: x\ndata: {}\n",
            b"event: x\ndata: {}",
            b"event: x\nda",
            b"event: x\n",
            b"event: x",
        ];
        let mut taken = Vec::new();
        for block in blocks {
            let mut quick = SseSplitter::new(1 << 20);
            quick.push(block);
            let mut lines = SseSplitter::new(1 << 20);
            lines.push(block);
            let by_lines = lines.next_by_lines().unwrap();
            match quick.next_plain() {
                Plain::Event(ev) => {
                    let Some(Piece::Event(by_lines)) = by_lines else {
                        panic!("{block:?} is an event");
                    };
                    assert_eq!(by_lines, ev, "{block:?}");
                    assert_eq!(ev.framed(), by_lines.framed(), "{block:?}");
                    assert!(ev.framed().is_some(), "{block:?}");
                    assert_eq!((quick.pending(), lines.pending()), (0, 0));
                    taken.push("event");
                }
                Plain::NotWhole => {
                    assert_eq!(by_lines, None, "{block:?} is not whole either way");
                    assert_eq!(quick.pending(), block.len(), "{block:?} untouched");
                    taken.push("not whole");
                }
                Plain::Other => {
                    assert!(by_lines.is_some(), "{block:?} is whole");
                    assert_eq!(quick.pending(), block.len(), "{block:?} untouched");
                    taken.push("other");
                }
            }
        }
        let mut want = vec!["event"; 3];
        want.extend(["other"; 10]);
        want.extend(["not whole"; 5]);
        assert_eq!(taken, want);
    }

    /// An unended plain block is refused at the limit as any other block is.
    #[test]
    fn an_endless_plain_event_is_refused() {
        let mut s = SseSplitter::new(16);
        s.push(b"event: x\ndata: 0123456789012345678901234567890");
        assert_eq!(s.next_piece(), Err(EventTooLarge(16)));
        // Within it, the block waits for the rest.
        let mut s = SseSplitter::new(64);
        s.push(b"event: x\ndata: 0123");
        assert_eq!(s.next_piece(), Ok(None));
        s.push(b"4\n\n");
        assert!(matches!(s.next_piece(), Ok(Some(Piece::Event(_)))));
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut s = SseSplitter::new(16);
        s.push(b"data: 0123456789012345678901234567890");
        assert_eq!(s.next_piece(), Err(EventTooLarge(16)));
    }
}
