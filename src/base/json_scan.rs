//! A cursor over JSON text that reads past values without building them, for the few fields
//! the gateway reads from bodies and events it otherwise forwards as they came (a request's
//! model, an answer's usage). A derived `serde_json` reader spends most of its work on those
//! in its layers (a visitor per value, a seed per key); this reads the bytes directly.
//!
//! It takes the grammar of RFC 8259 as `serde_json` does: the same escapes (a `\u` escape is
//! four hex digits, its code point unchecked where the value is read past), no control
//! characters in strings, no leading zeros, no trailing commas, nothing after the value but
//! whitespace. It reads bytes as `serde_json::from_slice` does: a string's bytes are checked
//! as UTF-8 only where they are taken (a value read, a key of an object read member by member)
//! and not where they are read past, so a body of a few hundred kilobytes is not checked as
//! a whole for the few fields read from its start. Each read gives `None` for what it does
//! not take: bad JSON, and also forms it leaves to a full reader (nesting deeper than
//! [`MAX_DEPTH`], a count that is no plain integer). A caller then reads the text with `serde_json`, which has the last word; a scan
//! that gives a value gives the one `serde_json` would.

use std::borrow::Cow;

/// Nesting deeper than this is left to the full reader (`serde_json` refuses 128 levels).
pub const MAX_DEPTH: usize = 100;

/// A position in JSON text.
pub struct Scan<'a> {
    text: &'a [u8],
    at: usize,
    depth: usize,
}

/// A string as it was written: where it stands in the text, quotes included.
#[derive(Clone, Copy, Debug)]
pub struct Str<'a> {
    text: &'a [u8],
    start: usize,
    end: usize,
    escaped: bool,
    /// Without escapes, every byte below 0x80: UTF-8 without a second look.
    ascii: bool,
}

impl<'a> Str<'a> {
    /// Its value: borrowed from the text when it has no escapes. `None` for bytes that are no
    /// UTF-8 or an escape of no character (a lone surrogate), which a full reader refuses too.
    pub fn text(self) -> Option<Cow<'a, str>> {
        if self.escaped {
            serde_json::from_slice(self.text.get(self.start..self.end)?)
                .ok()
                .map(Cow::Owned)
        } else {
            std::str::from_utf8(self.raw()).ok().map(Cow::Borrowed)
        }
    }

    /// Its bytes as written, between the quotes.
    fn raw(self) -> &'a [u8] {
        self.text
            .get(self.start + 1..self.end - 1)
            .unwrap_or_default()
    }
}

/// The fields of a struct a scan has read, to refuse one given twice as a derived reader does.
#[derive(Default)]
pub struct Seen(u32);

impl Seen {
    /// `None` if field number `field` (below 32) was read before.
    pub fn first(&mut self, field: u32) -> Option<()> {
        let bit = 1 << field;
        let first = self.0 & bit == 0;
        self.0 |= bit;
        first.then_some(())
    }

    /// `slot` set to `value`, read for field number `field`: `None` if that field was read
    /// before or `value` is none.
    pub fn set<T>(&mut self, field: u32, slot: &mut T, value: Option<T>) -> Option<()> {
        self.first(field)?;
        *slot = value?;
        Some(())
    }
}

impl<'a> Scan<'a> {
    /// A scan of `text`, which need not be UTF-8 as a whole (see the module's note).
    pub fn new(text: &'a [u8]) -> Scan<'a> {
        Scan {
            text,
            at: 0,
            depth: 0,
        }
    }

    /// The next byte that is no whitespace, not taken.
    #[inline]
    pub fn peek(&mut self) -> Option<u8> {
        let b = self.text;
        loop {
            let c = *b.get(self.at)?;
            // Whitespace is a space and three bytes below it.
            if c > b' ' || !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(c);
            }
            self.at += 1;
        }
    }

    /// Takes the next byte that is no whitespace if it is `c`.
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.at += 1)
    }

    /// The end of the text: nothing left but whitespace.
    pub fn end(mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// A string.
    pub fn string(&mut self) -> Option<Str<'a>> {
        if self.peek()? != b'"' {
            return None;
        }
        self.string_here::<true>()
    }

    /// The string that starts here, at its quote; with `ASCII`, whether it is ASCII is found
    /// on the way (a string read past need not say).
    fn string_here<const ASCII: bool>(&mut self) -> Option<Str<'a>> {
        let b = self.text;
        let start = self.at;
        // Most strings have no escape: their end is the first stop.
        let (run, ascii) = plain_run::<ASCII>(b.get(start + 1..)?);
        let i = start + 1 + run;
        if *b.get(i)? != b'"' {
            return self.string_with_stops(start, i);
        }
        self.at = i + 1;
        Some(Str {
            text: self.text,
            start,
            end: self.at,
            escaped: false,
            ascii,
        })
    }

    /// The rest of [`Scan::string_here`] for a string with a stop before its end, at `i`: an
    /// escape, or a control character (which ends the scan). Kept out of line, so that the
    /// common case needs few registers.
    #[inline(never)]
    fn string_with_stops(&mut self, start: usize, mut i: usize) -> Option<Str<'a>> {
        let b = self.text;
        let mut escaped = false;
        loop {
            match *b.get(i)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i += match *b.get(i + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
                        b'u' if b.get(i + 2..i + 6)?.iter().all(u8::is_ascii_hexdigit) => 6,
                        _ => return None,
                    };
                }
                // A control character.
                _ => return None,
            }
            i += plain_run::<false>(b.get(i..)?).0;
        }
        self.at = i + 1;
        Some(Str {
            text: self.text,
            start,
            end: self.at,
            escaped,
            // Not asked of a string with escapes: its value is read by `serde_json`.
            ascii: false,
        })
    }

    /// A string's value, or none for `null`.
    pub fn text_or_null(&mut self) -> Option<Option<Cow<'a, str>>> {
        match self.peek()? {
            b'n' => self.null().map(|()| None),
            _ => self.string()?.text().map(Some),
        }
    }

    /// `null`.
    pub fn null(&mut self) -> Option<()> {
        self.literal(b"null")
    }

    /// `true` or `false`, or none for `null`.
    pub fn bool_or_null(&mut self) -> Option<Option<bool>> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|()| Some(true)),
            b'f' => self.literal(b"false").map(|()| Some(false)),
            _ => self.null().map(|()| None),
        }
    }

    /// An integer of digits alone (no sign, fraction or exponent) that fits 64 bits.
    pub fn count(&mut self) -> Option<u64> {
        self.peek()?;
        let b = self.text;
        let digits = b[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let end = self.at + digits;
        if digits == 0
            || (digits > 1 && b[self.at] == b'0')
            || matches!(b.get(end), Some(b'.' | b'e' | b'E'))
        {
            return None;
        }
        let n = b[self.at..end].iter().try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })?;
        self.at = end;
        Some(n)
    }

    /// Reads past one value of any kind.
    pub fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string_here::<false>().map(drop),
            b'{' => self.object(|s, _| s.value()),
            b'[' => self.elements(Scan::value),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.null(),
            _ => self.number(),
        }
    }

    /// An object: `member` is called with each key's value as bytes and must read the value
    /// that follows. A key that is no string (bytes that are no UTF-8, a lone surrogate
    /// escaped) is `None`, as the derived readers of structs refuse it.
    pub fn members(
        &mut self,
        mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>,
    ) -> Option<()> {
        self.object(|s, key| {
            if key.escaped {
                member(s, key.text()?.as_bytes())
            } else {
                let raw = key.raw();
                if !key.ascii {
                    std::str::from_utf8(raw).ok()?;
                }
                member(s, raw)
            }
        })
    }

    /// An object, its keys as written.
    fn object(&mut self, mut member: impl FnMut(&mut Self, Str<'a>) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.enter()?;
        if self.eat(b'}').is_none() {
            loop {
                let key = self.string()?;
                self.eat(b':')?;
                member(self, key)?;
                if self.next_or_end(b'}')? {
                    break;
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// An array: `element` is called for each element and must read it.
    pub fn elements(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        self.enter()?;
        if self.eat(b']').is_none() {
            loop {
                element(self)?;
                if self.next_or_end(b']')? {
                    break;
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// After a member or an element: a comma (`false`) or the closing `end` (`true`), taken.
    fn next_or_end(&mut self, end: u8) -> Option<bool> {
        let c = self.peek()?;
        self.at += 1;
        match c {
            b',' => Some(false),
            c if c == end => Some(true),
            _ => None,
        }
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.text[self.at..]
            .starts_with(word)
            .then(|| self.at += word.len())
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        let b = self.text;
        let digits = |i: usize| {
            b[i.min(b.len())..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count()
        };
        let mut i = self.at + usize::from(b.get(self.at) == Some(&b'-'));
        i += match *b.get(i)? {
            b'0' => 1,
            b'1'..=b'9' => digits(i),
            _ => return None,
        };
        if b.get(i) == Some(&b'.') {
            let n = digits(i + 1);
            if n == 0 {
                return None;
            }
            i += 1 + n;
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1 + usize::from(matches!(b.get(i + 1), Some(b'+' | b'-')));
            let n = digits(i);
            if n == 0 {
                return None;
            }
            i += n;
        }
        self.at = i;
        Some(())
    }
}

/// How many bytes at the start of `b` need no second look in a string (none is a quote, a
/// backslash or a control character), and with `ASCII` whether all of those are ASCII (without,
/// `false`). Eight at a time, then one by one.
#[inline(always)]
fn plain_run<const ASCII: bool>(b: &[u8]) -> (usize, bool) {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let mut n = 0;
    // The bytes of the run or'ed together: a high bit set is a byte that is no ASCII.
    let mut seen = 0;
    while let Some(chunk) = b[n..].first_chunk::<8>() {
        let w = u64::from_le_bytes(*chunk);
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let stop = (w.wrapping_sub(ONES * 0x20) & !w
            | quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash)
            & HIGH;
        if stop != 0 {
            // The bytes before the first stop: the bits below its (high) bit.
            if ASCII {
                seen |= w & ((stop & stop.wrapping_neg()) - 1);
            }
            return (
                n + stop.trailing_zeros() as usize / 8,
                ASCII && seen & HIGH == 0,
            );
        }
        if ASCII {
            seen |= w;
        }
        n += 8;
    }
    for &c in &b[n..] {
        if c < 0x20 || c == b'"' || c == b'\\' {
            break;
        }
        if ASCII {
            seen |= u64::from(c);
        }
        n += 1;
    }
    (n, ASCII && seen & HIGH == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the scan takes `text` as one value, as `serde_json` does.
    fn takes(text: impl AsRef<[u8]>) -> bool {
        let mut s = Scan::new(text.as_ref());
        s.value().is_some() && s.end().is_some()
    }

    fn serde_takes(text: impl AsRef<[u8]>) -> bool {
        serde_json::from_slice::<serde::de::IgnoredAny>(text.as_ref()).is_ok()
    }

    #[test]
    fn takes_what_serde_json_takes() {
        let cases = [
            r#"{"a":[1,-2,3.5,-0.0e+1,1E9,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9y"],"b":{}}"#,
            " [ ] ",
            "0",
            "-0",
            r#""\ud800""#,
            r#"{"é":"ü","k":{"n":[[],[{}]]}}"#,
            "01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "-",
            "+1",
            "[1,]",
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{1:2}"#,
            "[1 2]",
            "tru",
            "nul",
            r#""a"#,
            "\"a\tb\"",
            r#""\x""#,
            r#""\u12g4""#,
            r#""\u12""#,
            "[] []",
            "",
            "   ",
            "{",
            "[",
            "]",
            "{}}",
        ];
        for text in cases {
            assert_eq!(takes(text), serde_takes(text), "{text:?}");
        }
    }

    #[test]
    fn long_strings_are_read_eight_bytes_at_a_time_and_stop_where_they_must() {
        for len in 0..40 {
            for stop in ["\"", "\\n\"", "\u{1}\""] {
                let text = format!("\"{}{stop}", "é".repeat(len));
                assert_eq!(takes(&text), serde_takes(&text), "{text:?}");
            }
        }
    }

    #[test]
    fn any_damage_to_a_body_is_refused_where_serde_json_refuses_it() {
        let body = r#"{"model":"gpt-5.5","instructions":"Be \"brief\".\n","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"h\u00e9llo"}]}],"tools":[],"n":-12.5e-3,"stream":true,"include":[null,false]}"#;
        assert!(takes(body));
        // Every byte deleted, and every byte replaced by each byte of the grammar.
        let bytes = body.as_bytes();
        for i in 0..bytes.len() {
            let mut cut = bytes.to_vec();
            cut.remove(i);
            let mut variants = vec![cut];
            for c in b"{}[]:,\"\\0-.eE+ta\x01 " {
                let mut v = bytes.to_vec();
                v[i] = *c;
                variants.push(v);
            }
            for v in variants {
                assert_eq!(
                    takes(&v),
                    serde_takes(&v),
                    "{}",
                    String::from_utf8_lossy(&v)
                );
            }
        }
    }

    /// A run ends at its first stop, and is ASCII when every byte before that stop is, at any
    /// length and wherever the stop and a byte above 0x7f stand (in or across eight-byte steps).
    #[test]
    fn a_run_says_whether_its_bytes_before_the_stop_are_ascii() {
        for len in 0..20 {
            for stop in [None, Some(b'"'), Some(b'\\'), Some(0x01)] {
                for high in (0..len + 3).map(Some).chain([None]) {
                    let mut b = vec![b'a'; len];
                    if let Some(c) = stop {
                        b.push(c);
                    }
                    b.extend_from_slice(b"zz");
                    if let Some(h) = high.filter(|h| *h < b.len()) {
                        b[h] = 0xe9;
                    }
                    let end = b
                        .iter()
                        .position(|&c| c < 0x20 || c == b'"' || c == b'\\')
                        .unwrap_or(b.len());
                    assert_eq!(
                        plain_run::<true>(&b),
                        (end, b[..end].is_ascii()),
                        "{len} {stop:?} {high:?}"
                    );
                    assert_eq!(plain_run::<false>(&b), (end, false));
                }
            }
        }
    }

    #[test]
    fn nesting_past_the_limit_is_left_to_the_full_reader() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(takes(deep(MAX_DEPTH)));
        assert!(!takes(deep(MAX_DEPTH + 1)));
        assert!(serde_takes(deep(MAX_DEPTH + 1)));
    }

    #[test]
    fn strings_give_their_value_and_counts_only_plain_integers() {
        let mut s = Scan::new(br#"["plain","e\u00e9\n","\ud800"]"#);
        let mut got = Vec::new();
        s.elements(|s| {
            got.push(s.string()?.text());
            Some(())
        })
        .unwrap();
        assert_eq!(got[0], Some(Cow::Borrowed("plain")));
        assert!(matches!(&got[0], Some(Cow::Borrowed(_))));
        assert_eq!(got[1].as_deref(), Some("eé\n"));
        assert_eq!(got[2], None);

        let count = |t: &str| Scan::new(t.as_bytes()).count();
        assert_eq!(count("0"), Some(0));
        assert_eq!(count(" 18446744073709551615"), Some(u64::MAX));
        for t in [
            "18446744073709551616",
            "-1",
            "1.0",
            "1e3",
            "01",
            "\"1\"",
            "",
        ] {
            assert_eq!(count(t), None, "{t}");
        }
    }

    /// Bytes that are no UTF-8 are refused where a value or a key is taken, and read past
    /// elsewhere, as `serde_json::from_slice` reads them into a struct of the fields taken.
    #[test]
    fn bytes_that_are_no_utf8_are_refused_only_where_they_are_taken() {
        #[derive(serde::Deserialize)]
        struct Taken<'a> {
            #[serde(borrow)]
            model: Option<Cow<'a, str>>,
        }
        let scan = |text: &[u8]| {
            let mut model = None;
            let mut s = Scan::new(text);
            s.members(|s, key| match key {
                b"model" => s.string()?.text().map(|t| model = Some(t.into_owned())),
                _ => s.value(),
            })?;
            s.end()?;
            Some(model)
        };
        let serde = |text: &[u8]| {
            serde_json::from_slice::<Taken>(text)
                .ok()
                .map(|t| t.model.map(Cow::into_owned))
        };
        let bad = [0xff_u8, 0xc3];
        let with = |pattern: &str| {
            let mut v = Vec::new();
            for (i, part) in pattern.split('~').enumerate() {
                if i > 0 {
                    v.extend_from_slice(&bad);
                }
                v.extend_from_slice(part.as_bytes());
            }
            v
        };
        let cases = [
            (
                r#"{"input":"a~b","model":"m"}"#,
                Some(Some("m".to_string())),
            ),
            (
                r#"{"input":["~",{"~":1}],"model":"m"}"#,
                Some(Some("m".to_string())),
            ),
            (r#"{"model":"m~"}"#, None),
            (r#"{"model":"m\n~"}"#, None),
            (r#"{"~":1,"model":"m"}"#, None),
            (r#"{"model":"é"}"#, Some(Some("é".to_string()))),
            (r#"{"é":1,"model":"m"}"#, Some(Some("m".to_string()))),
        ];
        for (pattern, want) in cases {
            let text = with(pattern);
            assert_eq!(scan(&text), want, "{pattern}");
            assert_eq!(serde(&text), want, "{pattern}, as serde_json reads it");
            assert_eq!(takes(&text), serde_takes(&text), "{pattern}");
        }
    }
}
