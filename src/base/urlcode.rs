//! Percent-encoding of URL parts and form values, and its decoding: one definition for the
//! admin client's path segments, the login URLs, a proxy's credentials and the simulator.

/// Percent-encodes every byte but RFC 3986's unreserved ones (`A-Z a-z 0-9 - . _ ~`), so the
/// result is safe as a path segment, a query value, userinfo or a form value.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes, and `+` as a space when `form` (`application/x-www-form-urlencoded`);
/// `None` for a broken escape or bytes that are not UTF-8.
pub(crate) fn decode(s: &str, form: bool) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' if form => out.push(b' '),
            b'%' => {
                let hi = char::from(bytes.next()?).to_digit(16)?;
                let lo = char::from(bytes.next()?).to_digit(16)?;
                out.push(u8::try_from(hi * 16 + lo).ok()?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::{decode, encode};

    #[test]
    fn decoding_reverses_encoding() {
        for s in ["a b/c?d=e&f", "ünïcode", "100%", "p@ss:w+rd", ""] {
            assert_eq!(decode(&encode(s), false).as_deref(), Some(s));
            assert_eq!(decode(&encode(s), true).as_deref(), Some(s));
        }
        assert_eq!(encode("a b/c=d&é~"), "a%20b%2Fc%3Dd%26%C3%A9~");
    }

    #[test]
    fn plus_is_a_space_only_in_forms() {
        assert_eq!(decode("a+b%2Fc%3d", true).as_deref(), Some("a b/c="));
        assert_eq!(decode("a+b", false).as_deref(), Some("a+b"));
    }

    #[test]
    fn broken_escapes_and_bad_utf8_are_refused() {
        assert_eq!(decode("%zz", true), None);
        assert_eq!(decode("%4", false), None);
        assert_eq!(decode("%FF", false), None);
    }
}
