//! Server-sent events, incrementally: split a byte stream into whole events without copying
//! more than needed. Each event's type and data are slices of the bytes received; only an
//! event whose data spans several `data:` lines is joined into new bytes.

use std::ops::Range;

use bytes::{Buf, Bytes, BytesMut};

use super::event::{Event, is_terminal_type};

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
    buf: Held,
    max_event: usize,
    /// The head (`event: {type}\ndata: `) of the plain block moved last, kept from one read to
    /// the next (see [`SseSplitter::take_plain_run`]); empty when none is kept.
    head: Head,
}

/// Room for a block's head: the types a stream is made of fit (the longest Codex sends is
/// under 50 bytes); a longer one is read in full every time.
const HEAD_ROOM: usize = 64;

#[derive(Debug)]
struct Head {
    bytes: [u8; HEAD_ROOM],
    len: usize,
}

impl Head {
    fn get(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    fn keep(&mut self, head: &[u8]) {
        if let Some(room) = self.bytes.get_mut(..head.len()) {
            room.copy_from_slice(head);
            self.len = head.len();
        }
    }
}

/// What was received and not yet taken. A read that comes while nothing is left over from the
/// ones before is held as it came, and its blocks are taken from it without a copy (a read of
/// the body is a slice of the connection's buffer); the bytes of a block that spans reads are
/// gathered into a buffer of the splitter's own, which the reads after it are added to until
/// all it holds is taken.
#[derive(Debug)]
enum Held {
    Read(Bytes),
    Own(BytesMut),
}

impl Held {
    fn bytes(&self) -> &[u8] {
        match self {
            Held::Read(b) => b,
            Held::Own(m) => m,
        }
    }

    fn push(&mut self, chunk: Bytes) {
        match self {
            _ if self.bytes().is_empty() => *self = Held::Read(chunk),
            _ => self.push_slice(&chunk),
        }
    }

    fn push_slice(&mut self, chunk: &[u8]) {
        match self {
            Held::Own(m) => m.extend_from_slice(chunk),
            Held::Read(b) => {
                let mut m = BytesMut::with_capacity(b.len() + chunk.len());
                m.extend_from_slice(b);
                m.extend_from_slice(chunk);
                *self = Held::Own(m);
            }
        }
    }

    /// The first `n` bytes, taken.
    fn take(&mut self, n: usize) -> Bytes {
        match self {
            Held::Read(b) => b.split_to(n),
            Held::Own(m) => m.split_to(n).freeze(),
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            Held::Read(b) => b.advance(n),
            Held::Own(m) => m.advance(n),
        }
    }
}

impl SseSplitter {
    pub fn new(max_event: usize) -> Self {
        Self {
            buf: Held::Own(BytesMut::new()),
            max_event,
            head: Head {
                bytes: [0; HEAD_ROOM],
                len: 0,
            },
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.push_slice(chunk);
    }

    /// The same for a read's own bytes, kept as they came while nothing is left over from
    /// the reads before.
    pub fn push_bytes(&mut self, chunk: Bytes) {
        self.buf.push(chunk);
    }

    /// Bytes held that do not yet form a whole event.
    pub fn pending(&self) -> usize {
        self.buf.bytes().len()
    }

    /// The next whole block, read in one pass over its bytes (newlines found with `memchr`):
    /// its type and data are slices of what was received.
    pub fn next_piece(&mut self) -> Result<Option<Piece>, EventTooLarge> {
        match self.next_plain() {
            Plain::Event(ev) => Ok(Some(Piece::Event(ev))),
            // A line of the front block has not ended: reading by lines would find no more.
            Plain::NotWhole if self.pending() > self.max_event => {
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
            let held = self.buf.bytes();
            let end = loop {
                let Some(nl) = memchr::memchr(b'\n', &held[pos..]) else {
                    if held.len() > self.max_event {
                        return Err(EventTooLarge(self.max_event));
                    }
                    return Ok(None);
                };
                let next = pos + nl + 1;
                let mut line = pos..pos + nl;
                if line.end > line.start && held[line.end - 1] == b'\r' {
                    line.end -= 1;
                }
                if line.is_empty() {
                    break next;
                }
                lines += 1;
                let l = &held[line.clone()];
                if l.starts_with(b"data:") {
                    let value = line.start + value_of(l, 4)..line.end;
                    match (&data, &mut joined) {
                        (None, _) => data = Some(value),
                        (Some(first), None) => {
                            let mut j = BytesMut::with_capacity(first.len() + 1 + value.len());
                            j.extend_from_slice(&held[first.clone()]);
                            j.extend_from_slice(b"\n");
                            j.extend_from_slice(&held[value]);
                            joined = Some(j);
                        }
                        (Some(_), Some(j)) => {
                            j.extend_from_slice(b"\n");
                            j.extend_from_slice(&held[value]);
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
            let raw = self.buf.take(end);
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
    /// whole at the front: taken as it came (see [`plain_block`]). A front block whose lines
    /// have not all ended is not searched again line by line; anything else is left to the
    /// line-by-line reading, which reads this block the same way.
    fn next_plain(&mut self) -> Plain {
        match plain_block(self.buf.bytes()) {
            Scan::Block { kind, data } => {
                let block = self.buf.take(data.end + 2);
                Plain::Event(Event::of_plain_block(block, kind, data))
            }
            Scan::NotWhole => Plain::NotWhole,
            Scan::Other => Plain::Other,
        }
    }

    /// Moves the whole plain blocks at the front into `out` as they came, up to the first
    /// block of another form, a terminal event's or one whose type is not plain ASCII (those
    /// are left for [`SseSplitter::next_piece`]). Each moved block is already in the form an
    /// SSE edge writes, so none is made into an [`Event`]. Returns how many were moved.
    pub fn take_plain_run(&mut self, out: &mut BytesMut) -> usize {
        let (mut pos, mut n) = (0, 0);
        let held = self.buf.bytes();
        loop {
            let rest = &held[pos..];
            // A block that begins with the head of the block moved last (in this read or an
            // earlier one) is of the same type, already found plain and not terminal: only
            // its data line is left to find. A stream is mostly deltas of one type.
            let head = self.head.get();
            let data = if !head.is_empty() && rest.starts_with(head) {
                match plain_data(rest, head.len()) {
                    Data::Line(data) => data,
                    Data::NotWhole | Data::Other => break,
                }
            } else {
                let Scan::Block { kind, data } = plain_block(rest) else {
                    break;
                };
                let kind = &rest[kind];
                if !kind.is_ascii() || is_terminal_type(kind) {
                    break;
                }
                self.head.keep(&rest[..data.start]);
                data
            };
            pos += data.end + 2;
            n += 1;
        }
        if pos > 0 {
            // Room for the rest of what was received too (the terminal event, likely).
            out.reserve(held.len());
            out.extend_from_slice(&held[..pos]);
            self.buf.advance(pos);
        }
        n
    }
}

/// What the front of a buffer holds, read as the plain block `event: {type}\ndata: {data}\n\n`
/// (found with two searches, for its two line ends): its type's and data's ranges when it is
/// one, whole. A type with spaces at its edges, a `\r`, or any other line is not plain.
fn plain_block(buf: &[u8]) -> Scan {
    const EVENT: &[u8] = b"event: ";
    const DATA: &[u8] = b"data: ";
    if !buf.starts_with(EVENT) {
        return Scan::Other;
    }
    let Some(nl) = memchr::memchr(b'\n', &buf[EVENT.len()..]) else {
        return Scan::NotWhole;
    };
    let kind = EVENT.len()..EVENT.len() + nl;
    let rest = &buf[kind.end + 1..];
    if !rest.starts_with(DATA) {
        return if DATA.starts_with(rest) {
            Scan::NotWhole
        } else {
            Scan::Other
        };
    }
    let data = match plain_data(buf, kind.end + 1 + DATA.len()) {
        Data::Line(data) => data,
        Data::NotWhole => return Scan::NotWhole,
        Data::Other => return Scan::Other,
    };
    let edge = |c: Option<&u8>| c.is_none_or(u8::is_ascii_whitespace);
    if edge(buf[kind.clone()].first()) || edge(buf[kind.clone()].last()) {
        return Scan::Other;
    }
    Scan::Block { kind, data }
}

/// The data line of a plain block whose data begins at `start`: its range when the line and
/// the blank line after it have ended and it has no `\r` at its end.
fn plain_data(buf: &[u8], start: usize) -> Data {
    let Some(nl) = memchr::memchr(b'\n', &buf[start..]) else {
        return Data::NotWhole;
    };
    let data = start..start + nl;
    match buf.get(data.end + 1) {
        None => Data::NotWhole,
        Some(b'\n') if buf[data.clone()].last() != Some(&b'\r') => Data::Line(data),
        Some(_) => Data::Other,
    }
}

/// A reading of a plain block's data line by [`plain_data`].
enum Data {
    Line(Range<usize>),
    NotWhole,
    Other,
}

/// A reading of the front of a buffer by [`plain_block`].
enum Scan {
    /// A whole plain block: its type's and data's ranges (the block ends two bytes after
    /// the data).
    Block {
        kind: Range<usize>,
        data: Range<usize>,
    },
    /// A block (of whatever form) with a line not yet ended.
    NotWhole,
    /// Something else.
    Other,
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

    /// The plain blocks after the commit pass as they came, up to one that needs a look: one
    /// of another form, a comment, a terminal event, a type that is not ASCII, or a block
    /// not yet whole.
    #[test]
    fn a_plain_run_stops_where_a_block_needs_a_look() {
        let plain = |kind: &str, data: &str| format!("event: {kind}\ndata: {data}\n\n");
        let (a, b) = (plain("a", "{\"n\":1}"), plain("b", "{\"n\":2}"));
        let c = "data: {\"type\":\"c\"}\n\n".to_string();
        let d = plain("d", "{}");
        let e = plain("\u{e9}t\u{e9}", "{}");
        let done = plain("response.completed", "{\"type\":\"response.completed\"}");
        let stream = format!("{a}{b}{c}{d}: keep-alive\n\n{e}{d}{done}event: x\nda");
        let mut s = SseSplitter::new(1 << 20);
        s.push(stream.as_bytes());
        let mut out = BytesMut::new();
        let kind = |p: Option<Piece>| match p {
            Some(Piece::Event(e)) => e.kind().to_string(),
            Some(Piece::Comment) => ":".into(),
            None => "none".into(),
        };
        assert_eq!(s.take_plain_run(&mut out), 2);
        assert_eq!(&out[..], format!("{a}{b}").as_bytes(), "moved as they came");
        assert_eq!(
            s.take_plain_run(&mut out),
            0,
            "a data-only block needs a look"
        );
        assert_eq!(kind(s.next_piece().unwrap()), "c");
        assert_eq!(s.take_plain_run(&mut out), 1);
        assert_eq!(kind(s.next_piece().unwrap()), ":");
        assert_eq!(s.take_plain_run(&mut out), 0, "a type that is not ASCII");
        assert_eq!(kind(s.next_piece().unwrap()), "\u{e9}t\u{e9}");
        assert_eq!(s.take_plain_run(&mut out), 1);
        assert_eq!(
            s.take_plain_run(&mut out),
            0,
            "the terminal event is never moved"
        );
        assert_eq!(kind(s.next_piece().unwrap()), "response.completed");
        assert_eq!(s.take_plain_run(&mut out), 0, "a block not yet whole stays");
        assert_eq!(s.pending(), "event: x\nda".len());
        assert_eq!(&out[..], format!("{a}{b}{d}{d}").as_bytes());
    }

    /// A block with the head of the one moved before it (in the same read or an earlier one)
    /// is read for its data line alone, and stops the run where any block would: a `\r` at the
    /// data's end, another line after the data, a line not yet ended. A head that differs in
    /// any byte is read in full.
    #[test]
    fn a_run_of_one_type_stops_where_a_block_of_it_needs_a_look() {
        let delta = |d: &str| format!("event: response.output_text.delta\ndata: {d}\n\n");
        let front = format!("{}{}", delta("{\"n\":1}"), delta("{\"n\":2}"));
        let cases = [
            ("event: response.output_text.delta\ndata: {}\n\n", 3),
            ("event: response.output_text.deltas\ndata: {}\n\n", 3),
            ("event: response.output_text.delta\ndata: {}\r\n\n", 2),
            ("event: response.output_text.delta\ndata: {}\nid: 3\n\n", 2),
            ("event: response.output_text.delta\ndata:{}\n\n", 2),
            ("event: response.output_text.delta\r\ndata: {}\n\n", 2),
            ("event: response.output_text.delta\ndata: {}\n", 2),
            ("event: response.output_text.delta\ndata: {}", 2),
            ("event: response.completed\ndata: {}\n\n", 2),
        ];
        // In one read, and in two: the head moved last is kept from one read to the next.
        for (tail, moved, reads) in cases.iter().flat_map(|&(t, m)| [(t, m, 1), (t, m, 2)]) {
            let mut s = SseSplitter::new(1 << 20);
            let mut out = BytesMut::new();
            if reads == 1 {
                s.push(format!("{front}{tail}").as_bytes());
                assert_eq!(s.take_plain_run(&mut out), moved, "{tail:?}");
            } else {
                s.push(front.as_bytes());
                assert_eq!(s.take_plain_run(&mut out), 2);
                s.push(tail.as_bytes());
                assert_eq!(s.take_plain_run(&mut out), moved - 2, "{tail:?}");
            }
            let (left, gone) = match moved {
                3 => ("", format!("{front}{tail}")),
                _ => (tail, front.clone()),
            };
            assert_eq!(&out[..], gone.as_bytes(), "{tail:?}");
            assert_eq!(s.pending(), left.len(), "{tail:?}");
            // What stays reads as the line-by-line reading reads it.
            let mut lines = SseSplitter::new(1 << 20);
            lines.push(left.as_bytes());
            assert_eq!(s.next_piece(), lines.next_by_lines(), "{tail:?}");
        }
    }

    /// A head longer than the room for it is read in full each time; the one kept before it
    /// stays kept.
    #[test]
    fn a_head_past_the_room_is_read_in_full_every_time() {
        let long = "x".repeat(HEAD_ROOM);
        let block = |kind: &str| format!("event: {kind}\ndata: {{}}\n\n");
        let stream = [block("a"), block(&long), block(&long), block("a")].concat();
        let mut s = SseSplitter::new(1 << 20);
        s.push(stream.as_bytes());
        let mut out = BytesMut::new();
        assert_eq!(s.take_plain_run(&mut out), 4);
        assert_eq!(&out[..], stream.as_bytes());
        assert_eq!(s.head.get(), b"event: a\ndata: ");
    }

    /// However the bytes are cut, runs and single events together give back the stream in
    /// order, each event once, and the terminal event always on its own.
    #[test]
    fn runs_and_pieces_give_back_the_stream_however_it_is_cut() {
        let mut stream = Vec::new();
        for i in 0..12 {
            stream.extend_from_slice(
                format!("event: response.output_text.delta\ndata: {{\"delta\":\"{i}\"}}\n\n")
                    .as_bytes(),
            );
            if i % 5 == 4 {
                stream.extend_from_slice(b"data: {\"type\":\"plain.data\"}\n\n");
            }
        }
        stream.extend_from_slice(
            b"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n",
        );
        // A block without an `event:` line is written with one, its type from its data.
        let expected = String::from_utf8(stream.clone()).unwrap().replace(
            "\n\ndata: {\"type\":\"plain.data\"}",
            "\n\nevent: plain.data\ndata: {\"type\":\"plain.data\"}",
        );
        for chunk_size in [1, 2, 3, 7, 19, 64, stream.len()] {
            let mut s = SseSplitter::new(1 << 20);
            let mut out = BytesMut::new();
            let (mut moved, mut single, mut terminal) = (0, 0, 0);
            for chunk in stream.chunks(chunk_size) {
                s.push(chunk);
                loop {
                    moved += s.take_plain_run(&mut out);
                    match s.next_piece().unwrap() {
                        Some(Piece::Event(e)) => {
                            single += 1;
                            terminal += usize::from(e.is_terminal());
                            e.write_sse(&mut out);
                        }
                        Some(Piece::Comment) => panic!("no comment was sent"),
                        None => break,
                    }
                }
            }
            assert_eq!(
                &out[..],
                expected.as_bytes(),
                "cut every {chunk_size} bytes"
            );
            assert_eq!(moved + single, 15, "cut every {chunk_size} bytes");
            assert_eq!(terminal, 1);
            assert_eq!(s.pending(), 0);
        }
    }

    /// Reads given as they came read as the same reads copied, however the stream is cut:
    /// the same runs, the same events, the same bytes left over, the same refusal of an event
    /// past the limit. An event whole in a read that came with nothing left over before it is
    /// a slice of that read.
    #[test]
    fn reads_taken_as_they_came_read_as_reads_copied() {
        let mut stream = Vec::new();
        for i in 0..6 {
            stream.extend_from_slice(
                format!("event: response.output_text.delta\ndata: {{\"delta\":\"{i}\"}}\n\n")
                    .as_bytes(),
            );
        }
        stream.extend_from_slice(b": keep-alive\n\ndata: {\"type\":\"a\"}\r\n\r\n");
        stream.extend_from_slice(b"event: b\ndata: 1\ndata: 2\n\n");
        stream.extend_from_slice(b"event: response.completed\ndata: {\"id\":1}\n\n");
        // What each way gives, read by read: blocks moved, bytes out, pieces, bytes left.
        type Log = Vec<(usize, Vec<u8>, Vec<Piece>, usize)>;
        let read = |cuts: &[usize], as_they_came: bool, max: usize| -> Result<Log, EventTooLarge> {
            let mut s = SseSplitter::new(max);
            let mut log = Vec::new();
            let mut from = 0;
            for &to in cuts.iter().chain([&stream.len()]) {
                let chunk = Bytes::copy_from_slice(&stream[from..to]);
                from = to;
                if as_they_came {
                    s.push_bytes(chunk);
                } else {
                    s.push(&chunk);
                }
                let mut out = BytesMut::new();
                let moved = s.take_plain_run(&mut out);
                let mut pieces = Vec::new();
                while let Some(p) = s.next_piece()? {
                    pieces.push(p);
                }
                log.push((moved, out.to_vec(), pieces, s.pending()));
            }
            Ok(log)
        };
        let n = stream.len();
        for a in 0..=n {
            for b in (a..=n).step_by(7) {
                let cuts = [a, b];
                for max in [1 << 20, 40] {
                    assert_eq!(
                        read(&cuts, true, max),
                        read(&cuts, false, max),
                        "{cuts:?} {max}"
                    );
                }
            }
        }
        // Taken from the read itself: no copy.
        let chunk = Bytes::copy_from_slice(&stream);
        let mut s = SseSplitter::new(1 << 20);
        s.push_bytes(chunk.clone());
        s.take_plain_run(&mut BytesMut::new());
        assert_eq!(s.next_piece(), Ok(Some(Piece::Comment)));
        let Ok(Some(Piece::Event(ev))) = s.next_piece() else {
            panic!("an event after the comment");
        };
        assert!(chunk.as_ptr_range().contains(&ev.data().as_ptr()));
    }
}
